"""`fabricwatch backtest --json` and `--out` through the real CLI against the real PostgreSQL: the README's
example data (a dirty connector from 11:52), one JSON object per alert change, then a summary that adds up."""

from __future__ import annotations

import json
from collections import Counter
from pathlib import Path

import pytest

from tests.test_readme import _cli, fresh_url

__all__ = ["fresh_url"]  # the fixture, shared with the README test

WINDOW = ["--from", "2026-11-30T11:45:00Z", "--to", "2026-11-30T12:15:00Z", "--step", "60s"]
FIELDS = {"type", "at_ms", "at", "event", "alert_id", "fingerprint", "state", "kind", "device", "port", "cause",
          "severity", "action", "summary", "evidence"}


@pytest.fixture()
def loaded(fresh_url: str) -> str:
    for args in (["db", "upgrade"], ["inventory", "load", "examples/inventory/small-fabric.yaml"],
                 ["import", "examples/samples.prom"]):
        done = _cli(args, fresh_url)
        assert done.returncode == 0, (args, done.stderr[-2000:])
    return fresh_url


def test_backtest_json_lines_carry_the_changes_and_a_summary_that_matches(loaded: str, tmp_path: Path) -> None:
    out = tmp_path / "replay.jsonl"
    done = _cli(["backtest", *WINDOW, "--json", "--out", str(out)], loaded)
    assert done.returncode == 0, done.stderr[-2000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    changes, summary = rows[:-1], rows[-1]
    assert summary["type"] == "summary" and all(r["type"] == "change" for r in changes)

    # the dirty connector opens once (its samples end at 12:00: no data is no evidence of recovery, so it stays open)
    by_event = {r["event"]: r for r in changes}
    assert [r["event"] for r in changes] == ["opened"]
    for r in changes:
        assert set(r) >= FIELDS, FIELDS - set(r)
    opened = by_event["opened"]
    assert opened["cause"] == "connector_contamination" and opened["state"] == "firing"
    assert opened["device"] and opened["port"] and opened["severity"] in ("ticket", "page") and opened["action"]
    assert opened["at"].startswith("2026-11-30T11:5") and opened["at_ms"] % 60_000 == 0
    assert any(e["feature"] == "onset_ms" and e["value"] <= opened["at_ms"] for e in opened["evidence"]), \
        opened["evidence"]

    # the summary is the lines, counted
    assert summary["cycles"] == 31 and summary["findings"] > 0
    events = Counter(r["event"] for r in changes)
    assert {k: v for k, v in summary["alerts"].items() if v} == dict(events)
    per_cause = Counter((r["cause"], r["event"]) for r in changes)
    for cause, n in summary["by_cause"].items():
        for event in ("opened", "reopened", "severity_changed", "resolved"):
            assert n[event] == per_cause[(cause, event)], (cause, event)

    # --out holds the very same lines; the text output still names alert, event, state and cause
    assert out.read_text() == done.stdout
    text = _cli(["backtest", *WINDOW], loaded)
    assert text.returncode == 0
    assert f"\topened\tfiring\t{opened['fingerprint']}\tconnector_contamination\t{opened['severity']}" in text.stdout
    assert "31 cycles" in text.stderr


def test_backtest_out_in_a_missing_directory_is_refused_before_replaying(loaded: str, tmp_path: Path) -> None:
    target = tmp_path / "nope" / "replay.jsonl"
    done = _cli(["backtest", *WINDOW, "--out", str(target)], loaded)
    assert done.returncode == 2
    said = " ".join(done.stderr.replace("│", " ").split())
    assert "does not exist" in said and "--out" in said, said
    assert not target.parent.exists()
