"""`fabricwatch serve --workers N`: N API processes on one port, each reaching the configured database."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import psutil
from sqlalchemy import Engine

from tests.live_api import free_tcp_port

FABRICWATCH = str(Path(sys.executable).parent / "fabricwatch")


def test_serve_runs_that_many_api_processes(db: Engine, db_url: str) -> None:
    port = free_tcp_port()
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_AUTH_REQUIRED": "false",
           "FABRICWATCH_LOG_LEVEL": "WARNING"}
    proc = subprocess.Popen([FABRICWATCH, "serve", "--port", str(port), "--no-worker", "--workers", "2"], env=env,
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT, start_new_session=True)
    try:
        deadline = time.monotonic() + 60
        while True:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else ""
            try:
                # A route that reads the database: each process resolved its settings from the environment.
                r = httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", timeout=2)
                if r.status_code == 200:
                    break
            except httpx.HTTPError:
                pass
            assert time.monotonic() < deadline, "the API did not answer"
            time.sleep(0.2)
        assert r.json() == {"items": [], "next_cursor": None}
        # uvicorn's supervisor and its two workers (its multiprocessing helper, when there is one, is not a worker)
        cmdlines = [" ".join(p.cmdline()) for p in psutil.Process(proc.pid).children(recursive=True)]
        workers = [c for c in cmdlines if "multiprocessing.spawn" in c and "resource_tracker" not in c]
        assert len(workers) == 2
        assert sum(httpx.get(f"http://127.0.0.1:{port}/healthz", timeout=2).status_code == 200 for _ in range(20)) == 20
    finally:
        os.killpg(proc.pid, signal.SIGTERM)
        proc.wait(30)


def test_serve_refuses_no_workers(db_url: str) -> None:
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url}
    r = subprocess.run([FABRICWATCH, "serve", "--no-worker", "--workers", "0"], env=env, capture_output=True,
                       text=True, timeout=60)
    assert r.returncode == 2 and "--workers" in r.stdout + r.stderr
