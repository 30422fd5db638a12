"""`fabricwatch backtest` with shards configured: the control database holds no samples, so a replay of it would
report no alerts whatever happened; the command says so and exits 1 instead of replaying nothing."""

from __future__ import annotations

import json
import os
import subprocess
import sys

import pytest

pytestmark = pytest.mark.timeout(300)


def test_a_sharded_backtest_refuses_to_replay_the_empty_control_database() -> None:
    url = os.environ.get("FABRICWATCH_TEST_DATABASE_URL")
    if not url:
        pytest.skip("FABRICWATCH_TEST_DATABASE_URL is not set")
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": url,
           "FABRICWATCH_SHARDS_URLS": json.dumps({"a": "postgresql://postgres@127.0.0.1:1/none"})}
    done = subprocess.run([sys.executable, "-m", "service.cli", "backtest", "--from", "2026-11-30T11:45:00Z",
                           "--to", "2026-11-30T12:15:00Z"], env=env, capture_output=True, text=True, timeout=240)
    assert done.returncode == 1, (done.stdout[-2000:], done.stderr[-2000:])
    err = " ".join(done.stderr.split())
    assert "does not replay sharded telemetry" in err and "FABRICWATCH_SHARDS_URLS" in err, err
    assert done.stdout == ""
