"""The README's "Using it" block runs as written: its database, inventory, import, backtest and detect
commands, read from the README itself, against the real PostgreSQL and a database that does not exist yet."""

from __future__ import annotations

import json
import os
import re
import shlex
import subprocess
import sys
import uuid
from collections.abc import Iterator

import psycopg
import pytest
from sqlalchemy import make_url

from service.db import normalize_url
from tests.paths import REPO

RUN = ("db", "inventory", "import", "backtest", "detect")  # the ones that need no server or worker running


def readme_commands() -> list[list[str]]:
    """The `fabricwatch` commands of the README's "Using it" block, in order, as argument lists."""
    section = (REPO / "README.md").read_text().split("## Using it", 1)[1]
    block = re.search(r"```sh\n(.*?)```", section, re.S)
    assert block, "the Using it section has no sh block"
    lines = block.group(1).replace("\\\n", " ").splitlines()
    return [shlex.split(line, comments=True)[1:] for line in lines if line.startswith("fabricwatch ")]


@pytest.fixture()
def fresh_url(server_url: str) -> Iterator[str]:
    """The URL of a database that does not exist yet; dropped afterwards."""
    name = f"fw_readme_{uuid.uuid4().hex[:10]}"
    url = make_url(normalize_url(server_url))
    yield url.set(database=name).render_as_string(hide_password=False)
    admin = url.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


def _cli(args: list[str], url: str) -> subprocess.CompletedProcess[str]:
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICWATCH_")}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True, cwd=REPO,
                          env={**env, "FABRICWATCH_DATABASE_URL": url}, timeout=300)


def test_the_using_it_block_runs_as_written(fresh_url: str) -> None:
    commands = [c for c in readme_commands() if c[0] in RUN]
    assert [c[0] for c in commands] == ["db", "inventory", "import", "backtest", "detect"], commands
    out = {}
    for args in commands:
        done = _cli(args, fresh_url)
        assert done.returncode == 0, (args, done.stdout[-2000:], done.stderr[-2000:])
        out[args[0]] = done
    assert "created database fw_readme_" in out["db"].stderr
    sample_lines = [line for line in (REPO / "examples/samples.prom").read_text().splitlines()
                    if line and not line.startswith("#")]
    report = json.loads(out["import"].stdout)
    assert report["written"] == report["received"] == len(sample_lines) and report["rejected"] == 0
    # the example's dirty connector, found by the replay; the summary says so
    summary = out["backtest"].stderr
    assert "16 cycles" in summary and "1 opened" in summary and "connector_contamination" in summary
    assert "\talert 1\topened\tfiring" in out["backtest"].stdout
    assert "cycle at 2026-11-30T12:00:00Z:" in out["detect"].stderr

    # the live detector only moves forward, and says so in words
    earlier = _cli(["detect", "--at", "2026-11-30T11:59:00Z"], fresh_url)
    assert earlier.returncode == 2
    assert ("cycle at 2026-11-30T11:59:00Z is not after the last cycle at 2026-11-30T12:00:00Z"
            in " ".join(earlier.stderr.split()))
