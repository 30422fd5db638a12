"""`sim generate` says how much it will write before writing it, and asks (or wants --yes) above a size."""

from __future__ import annotations

from pathlib import Path

import pytest
from typer.testing import CliRunner

from simulator import cli
from simulator.generate import SizeEstimate, generate

SCENARIO = """\
name: small
seed: 1
topology: {hosts: 2, spines: 2}
start: "2025-01-01T00:00:00Z"
"""


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    return sc


def test_the_estimate_is_close_to_what_is_written(scenario: Path, tmp_path: Path) -> None:
    seen: list[SizeEstimate] = []
    r = generate(scenario, end="20m", out_dir=tmp_path / "o", confirm=lambda e: seen.append(e) or True)
    (e,) = seen
    assert (e.steps, e.samples) == (r.steps, r.samples) == (20, r.samples)
    assert e.text_bytes == pytest.approx(r.metrics_file.stat().st_size, rel=0.05)
    assert 0 < e.gzip_bytes < e.text_bytes / 3


def test_above_the_threshold_it_asks_or_wants_yes(scenario: Path, tmp_path: Path,
                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    runner = CliRunner()
    args = ["generate", "--scenario", str(scenario), "--to", "10m"]
    small = runner.invoke(cli.app, [*args, "--out", str(tmp_path / "small")])
    assert small.exit_code == 0, small.output
    assert small.output.startswith("about ") and " to write: " in small.output and "with --gzip" in small.output

    monkeypatch.setattr(cli, "CONFIRM_ABOVE_BYTES", 1000)  # this run is now "large"
    refused = runner.invoke(cli.app, [*args, "--out", str(tmp_path / "refused")])  # not on a terminal
    assert refused.exit_code == 2 and "pass --yes to write it" in refused.output
    assert not (tmp_path / "refused").exists()

    monkeypatch.setattr(cli, "_interactive", lambda: True)
    declined = runner.invoke(cli.app, [*args, "--out", str(tmp_path / "declined")], input="n\n")
    assert declined.exit_code == 1 and "write it?" in declined.output and "nothing written" in declined.output
    assert not (tmp_path / "declined").exists()
    accepted = runner.invoke(cli.app, [*args, "--out", str(tmp_path / "accepted")], input="y\n")
    assert accepted.exit_code == 0 and (tmp_path / "accepted" / "metrics.prom").stat().st_size > 1000

    monkeypatch.setattr(cli, "_interactive", lambda: False)
    forced = runner.invoke(cli.app, [*args, "--out", str(tmp_path / "forced"), "--yes"])
    assert forced.exit_code == 0 and (tmp_path / "forced" / "metrics.prom").exists()


def test_more_than_the_disk_holds_is_refused_even_with_yes(scenario: Path, tmp_path: Path,
                                                           monkeypatch: pytest.MonkeyPatch) -> None:
    class Usage:
        free = 1000

    monkeypatch.setattr(cli.shutil, "disk_usage", lambda _: Usage())
    res = CliRunner().invoke(cli.app, ["generate", "--scenario", str(scenario), "--to", "10m", "--yes",
                                       "--out", str(tmp_path / "o")])
    assert res.exit_code == 2 and "1.0 kB free" in res.output
    assert not (tmp_path / "o").exists()
