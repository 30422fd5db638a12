"""The worker that `serve` (embedded default) and `demo` run beside the API stops warmly.

Leaving `worker_process` sends SIGTERM to the worker's main process only: Celery's warm shutdown lets
running tasks finish, then stops its pool processes and beat itself. A SIGTERM to the whole process
group would reach the pool processes too and kill whatever they were running.
"""

from __future__ import annotations

import os
import time
from pathlib import Path

import psutil

from service.worker_process import worker_process


def test_leaving_stops_the_worker_warmly_and_leaves_no_process(db_url: str, broker_url: str, tmp_path: Path) -> None:
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_LOG_LEVEL": "INFO"}
    if broker_url.startswith("redis"):
        env["FABRICWATCH_REDIS_URL"] = broker_url
    log = tmp_path / "worker.log"
    with worker_process(env, log) as proc:
        deadline = time.monotonic() + 90
        while "ready." not in log.read_text(errors="replace"):
            assert proc.poll() is None and time.monotonic() < deadline, log.read_text()[-3000:]
            time.sleep(0.2)
        group = [proc.pid, *(c.pid for c in psutil.Process(proc.pid).children(recursive=True))]
        assert len(group) >= 3, group  # main process, pool processes, beat
    text = log.read_text(errors="replace")
    assert proc.returncode == 0, text[-3000:]
    assert "Warm shutdown" in text and "exited with 'signal 15" not in text, text[-3000:]
    assert not [p for p in group if psutil.pid_exists(p) and psutil.Process(p).status() != psutil.STATUS_ZOMBIE]
