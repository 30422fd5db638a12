"""Run a Celery worker with beat as a child process, for the one-process modes (serve on the embedded
default, demo). It gets its own process group, so stopping it stops its pool and beat too."""

from __future__ import annotations

import contextlib
import os
import signal
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

STOP_TIMEOUT_S = 45


@contextlib.contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `fabricwatch worker --beat` child (prefork, default concurrency) for the life of the block.

    On exit, SIGTERM to its main process only: Celery's warm shutdown lets running tasks finish and stops
    the pool processes and beat itself (a SIGTERM to the group would kill the pool's tasks midway). Then
    SIGKILL to the group, for anything it left or if it did not stop in time. In time is 45 s: a pool process
    that finished a task just as the shutdown began waits up to 30 s for its result to be read (billiard's
    _ensure_messages_consumed), which the main process, already joining the pool, no longer does.
    """
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "worker", "--beat"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        proc.terminate()
        with contextlib.suppress(subprocess.TimeoutExpired):
            proc.wait(STOP_TIMEOUT_S)
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGKILL)
        proc.wait(5)
