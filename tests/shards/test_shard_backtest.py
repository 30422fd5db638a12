"""`fabricwatch backtest` with shards, on a control database and two telemetry shards (real servers,
tests/shards/conftest.py): each shard's history is replayed as its live cycles run, so a backtest over a fiber fault
on a link between shards gives the very alert changes the live per-shard cycles gave over the same times, each
line naming its shard, and nothing is written; with one shard down, the other is replayed and the down one named."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from collections.abc import Iterator
from dataclasses import dataclass, field
from typing import Any

import pytest
from sqlalchemy import text

from service.shards.detection import run_shard_cycle
from tests.shards.conftest import Cluster
from tests.shards.test_shard_detection import HISTORY_MIN, LINK, MIN, T0_MS, load_scenario

pytestmark = pytest.mark.timeout(900)

FROM_MS, TO_MS = T0_MS + 10 * MIN, T0_MS + HISTORY_MIN * MIN
Change = tuple[str, int, str, str, str]  # shard, at_ms, event, fingerprint, state


@dataclass
class Bed:
    cluster: Cluster
    live: list[Change] = field(default_factory=list)  # the live cycles' alert changes, in order
    causes: dict[str, str] = field(default_factory=dict)  # fingerprint -> cause of its last live finding

    def env(self) -> dict[str, str]:
        shards = self.cluster.settings()
        return {**os.environ, "FABRICWATCH_DATABASE_URL": self.cluster.control_url,
                "FABRICWATCH_SHARDS_URLS": json.dumps(shards.urls), "FABRICWATCH_SHARDS_PODS": json.dumps(shards.pods)}

    def backtest(self, *args: str) -> subprocess.CompletedProcess[str]:
        return subprocess.run([sys.executable, "-m", "service.cli", "backtest", "--from", str(FROM_MS), "--to",
                               str(TO_MS), "--step", "60s", *args], env=self.env(), capture_output=True, text=True,
                              timeout=600)


def _alert_rows(bed: Bed) -> list[Any]:
    with bed.cluster.engine.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT * FROM alerts ORDER BY id"))]


@pytest.fixture(scope="module")
def bed(cluster: Cluster) -> Iterator[Bed]:
    """The scenario's samples on their shards and live cycles of both shards a minute apart, 10 to 75 minutes."""
    load_scenario(cluster)
    topology = cluster.topology()
    bed = Bed(cluster)
    for t in range(FROM_MS, TO_MS + 1, MIN):
        for shard in ("a", "b"):
            o = run_shard_cycle(topology, shard, t).outcome
            bed.causes.update((f.fingerprint, f.cause.value) for f in o.findings)
            bed.live += [(shard, t, c.event, c.fingerprint, c.to_state) for c in o.changes.changes]
    yield bed


def _changes(rows: list[dict[str, Any]]) -> list[Change]:
    return [(r["shard"], r["at_ms"], r["event"], r["fingerprint"], r["state"]) for r in rows if r["type"] == "change"]


def _per_shard(changes: list[Change]) -> dict[str, list[Change]]:
    out: dict[str, list[Change]] = {}
    for c in changes:
        out.setdefault(c[0], []).append(c)
    return out


def test_a_sharded_backtest_gives_the_live_cycles_alert_changes_and_writes_nothing(bed: Bed) -> None:
    before = _alert_rows(bed)
    done = bed.backtest("--json")
    assert done.returncode == 0, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    replayed = _changes(rows)
    # the fiber fault between the shards was alerted on, from both receivers, each by its own shard
    link = {c for c in bed.live if c[2] == "opened" and bed.causes.get(c[3]) == "fiber_damage"}
    assert {(c[0], c[3]) for c in link} == {("a", "optical_degradation/spine-01:Ethernet1/3"),
                                           ("b", "optical_degradation/leaf-p2-01:Ethernet1/3")}, link
    assert {d for d, _ in LINK} == {"spine-01", "leaf-p2-01"}
    # the replay, shard by shard, made the live cycles' changes at the same times
    assert _per_shard(replayed) == _per_shard(bed.live)
    assert all(r["cause"] == "fiber_damage" for r in rows if r["type"] == "change" and r["event"] == "opened"
               and r["fingerprint"] in {c[3] for c in link})
    # a summary per shard that counts its lines
    summaries = {r["shard"]: r for r in rows if r["type"] == "summary"}
    assert set(summaries) == {"a", "b"}
    for shard, s in summaries.items():
        assert s["cycles"] == (TO_MS - FROM_MS) // MIN + 1
        assert s["alerts"]["opened"] == sum(c[2] == "opened" for c in replayed if c[0] == shard) > 0
    assert "shard a:" in done.stderr and "shard b:" in done.stderr
    assert _alert_rows(bed) == before  # the replay's alerts were shadowed

    # --shard replays that one only; the text lines name it
    one = bed.backtest("--shard", "b")
    assert one.returncode == 0, one.stderr[-3000:]
    text_lines = one.stdout.splitlines()
    assert len(text_lines) == len(_per_shard(bed.live)["b"]) and all("\tshard b\t" in x for x in text_lines)
    bad = bed.backtest("--shard", "zz")
    assert bad.returncode == 2 and "unknown shard 'zz'" in " ".join(bad.stderr.split()), bad.stderr[-2000:]


def test_with_one_shard_down_the_other_is_replayed_and_the_down_one_named(bed: Bed) -> None:
    cluster = bed.cluster
    cluster.shard_b.stop()
    try:
        done = bed.backtest("--json")
    finally:
        cluster.shard_b.start()
    assert done.returncode == 1, done.stderr[-3000:]
    rows = [json.loads(line) for line in done.stdout.splitlines()]
    err = " ".join(done.stderr.split())
    assert "shard b: not replayed" in err, err[-3000:]
    assert [r["shard"] for r in rows if r["type"] == "error"] == ["b"]
    assert [r["shard"] for r in rows if r["type"] == "summary"] == ["a"]
    # shard a was replayed, but its far link ends on b were not read: said, not silent
    assert "far link ends on shard b not read" in err, err[-3000:]
    assert {c[0] for c in _changes(rows)} == {"a"}
