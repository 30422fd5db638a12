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


@contextlib.contextmanager
def worker_process(env: dict[str, str], log: Path) -> Iterator[subprocess.Popen[bytes]]:
    """A `fabricwatch worker --beat` child (prefork, default concurrency) for the life of the block;
    SIGTERM (then SIGKILL) to its process group on exit."""
    with log.open("ab") as out:
        proc = subprocess.Popen([sys.executable, "-m", "service.cli", "worker", "--beat"],
                                env=env, stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        yield proc
    finally:
        with contextlib.suppress(ProcessLookupError):
            os.killpg(proc.pid, signal.SIGTERM)
        try:
            proc.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(proc.pid, signal.SIGKILL)
            proc.wait(5)
