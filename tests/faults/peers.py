"""Private servers and an instrumented worker for the fault tests; nothing here touches shared servers.

* `PrivateRedis`: a `redis-server` on a free 127.0.0.1 port, no persistence, that a test may stop and
  start again on the same port (a restart loses every queued message, as a crashed broker would).
* `PrivatePostgres`: the embedded PostgreSQL in a fresh /tmp folder, migrated; `stop()`/`start()`
  restart it on the same socket, so clients reconnect to the same URL.
* `CountingWorker`: `fabricwatch worker` (prefork, its default pool) in a subprocess whose collection path
  writes what it did to a JSON-lines log: each task sent by the dispatcher (with its poll slots), each
  collection (every sample key the collector produced), each store and spool, each with the pid of the
  pool process that did it. The tests compare that log with the database. The instrumentation wraps the
  real functions in the worker's main process before its pool forks, so every pool process has it; it
  changes no behaviour unless a hold is asked for.
"""

from __future__ import annotations

import contextlib
import json
import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import threading
import time
from collections.abc import Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from tests.live_api import free_tcp_port
from tests.paths import REPO

# Environment understood by the instrumented worker (set by CountingWorker).
LOG_ENV = "FW_FAULTS_LOG"  # JSON-lines event log
VISIBILITY_ENV = "FW_FAULTS_VISIBILITY_S"  # Redis visibility timeout (production: 3600 s)
HOLD_ENV = "FW_FAULTS_HOLD_S"  # sleep inside the store transaction, after the rows went in (first store only)
DELAY_ENV = "FW_FAULTS_COLLECT_DELAY_S"  # sleep between collecting and storing


def _wait(pred: Any, timeout_s: float, what: str, step: float = 0.05) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        if pred():
            return
        time.sleep(step)
    raise TimeoutError(f"{what} not reached in {timeout_s} s")


# --------------------------------------------------------------------------------------------- Redis


class PrivateRedis:
    """`redis-server --save "" --appendonly no` on 127.0.0.1; the port survives a restart."""

    def __init__(self, workdir: Path) -> None:
        self.workdir = workdir
        self.port = free_tcp_port()
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"redis://127.0.0.1:{self.port}/0"

    def ping(self) -> bool:
        try:
            with socket.create_connection(("127.0.0.1", self.port), timeout=0.5) as s:
                s.sendall(b"PING\r\n")
                return s.recv(16).startswith(b"+PONG")
        except OSError:
            return False

    def start(self) -> PrivateRedis:
        exe = shutil.which("redis-server")
        if exe is None:
            raise RuntimeError("redis-server not found: install the Debian package redis-server")
        log = (self.workdir / f"redis-{self.port}.log").open("ab")
        self.proc = subprocess.Popen(
            [exe, "--port", str(self.port), "--bind", "127.0.0.1", "--save", "", "--appendonly", "no",
             "--dir", str(self.workdir), "--protected-mode", "yes"],
            stdout=log, stderr=subprocess.STDOUT)
        log.close()
        _wait(self.ping, 10, f"redis on port {self.port}")
        return self

    def stop(self, sig: int = signal.SIGTERM) -> None:
        """Stop our own process only (by its pid), and wait until the port is free."""
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(sig)
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        self.proc = None


# ---------------------------------------------------------------------------------------- PostgreSQL


class PrivatePostgres:
    """The embedded PostgreSQL in its own /tmp folder (pgserver opens every parent folder, so not tmp_path)."""

    def __init__(self) -> None:
        from service.embedded import EmbeddedPostgres

        self.base = Path(tempfile.mkdtemp(prefix="fw-faults-pg-", dir="/tmp"))
        self.pg = EmbeddedPostgres(self.base / "pg", database="fabricwatch")
        self.url = ""

    def start(self) -> PrivatePostgres:
        self.pg.start()
        self.url = self.pg.url
        return self

    def migrate(self) -> None:
        from service.migrate import upgrade

        upgrade(self.url)

    def stop(self) -> None:
        self.pg.stop()

    def close(self) -> None:
        self.pg.stop()
        shutil.rmtree(self.base, ignore_errors=True)


# -------------------------------------------------------------------------------- instrumented worker


@dataclass
class Events:
    """The worker's event log, parsed."""

    rows: list[dict[str, Any]] = field(default_factory=list)

    def of(self, ev: str) -> list[dict[str, Any]]:
        return [r for r in self.rows if r["ev"] == ev]


def read_events(path: Path) -> Events:
    if not path.exists():
        return Events()
    rows = []
    for line in path.read_text().splitlines():
        if line.strip():
            rows.append(json.loads(line))
    return Events(rows)


class CountingWorker:
    """`fabricwatch worker [--beat]` with the instrumentation below, output to a log file."""

    def __init__(self, workdir: Path, *, database_url: str, redis_url: str, queues: str, beat: bool = True,
                 concurrency: int = 4, extra_env: dict[str, str] | None = None, name: str = "worker") -> None:
        self.log_path = workdir / f"{name}.out"
        self.events_path = workdir / "events.jsonl"  # shared by every worker of a test: one timeline
        self.spool_dir = workdir / "spool"
        self.env = {**os.environ, "FABRICWATCH_DATABASE_URL": database_url, "FABRICWATCH_REDIS_URL": redis_url,
                    "FABRICWATCH_LOG_LEVEL": "WARNING", "FABRICWATCH_SPOOL_DIR": str(self.spool_dir),
                    LOG_ENV: str(self.events_path), **(extra_env or {})}
        self.args = ["worker", "-Q", queues, "-c", str(concurrency)] + (["--beat"] if beat else [])
        self.proc: subprocess.Popen[bytes] | None = None

    def start(self) -> CountingWorker:
        code = "import sys, tests.faults.peers as p; p.worker_main(sys.argv[1:])"
        with self.log_path.open("ab") as out:
            # its own process group: the main process, its pool and its beat, to kill at once
            self.proc = subprocess.Popen([sys.executable, "-c", code, *self.args], env=self.env, cwd=REPO,
                                         stdout=out, stderr=subprocess.STDOUT, start_new_session=True)
        return self

    def alive(self) -> bool:
        return self.proc is not None and self.proc.poll() is None

    def events(self) -> Events:
        return read_events(self.events_path)

    def tail(self, n: int = 4000) -> str:
        try:
            return self.log_path.read_text(errors="replace")[-n:]
        except OSError:
            return "(no worker log)"

    def kill(self) -> None:
        """The whole worker dies at once, as on a host or container crash: SIGKILL to its process group."""
        if self.proc is not None:
            with contextlib.suppress(ProcessLookupError):
                os.killpg(self.proc.pid, signal.SIGKILL)
            self.proc.wait(10)

    def stop(self, timeout_s: float = 30.0) -> int | None:
        """Warm shutdown (SIGTERM waits for running tasks); SIGKILL to the group only if it hangs."""
        if self.proc is None:
            return None
        if self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            with contextlib.suppress(subprocess.TimeoutExpired):
                self.proc.wait(timeout_s)
        self.kill()  # nothing of it may outlive the test (a stuck pool process, an orphaned beat)
        return self.proc.returncode


class _EventLog:
    """Append-only JSON lines; one os.write per event on an O_APPEND fd survives SIGKILL of the writer."""

    def __init__(self, path: str) -> None:
        self.fd = os.open(path, os.O_WRONLY | os.O_CREAT | os.O_APPEND, 0o600)
        self.lock = threading.Lock()

    def write(self, **event: Any) -> None:
        data = (json.dumps({"t_ms": int(time.time() * 1000), "pid": os.getpid(), **event}) + "\n").encode()
        with self.lock:
            os.write(self.fd, data)


def _sample_keys(samples: Iterable[Any]) -> list[list[Any]]:
    return [[s.metric, s.device, s.port, s.lane, s.priority, s.gpu, s.ts_ms] for s in samples]


def _current_task_id() -> str | None:
    from celery import current_task

    return current_task.request.id if current_task else None


def instrument() -> None:
    """Wrap the collection path of this process (the worker) so that it reports what it does."""
    import collectors.tasks as tasks
    import service.worker as worker

    log = _EventLog(os.environ[LOG_ENV])
    visibility = os.environ.get(VISIBILITY_ENV)
    hold_s = float(os.environ.get(HOLD_ENV) or 0)
    delay_s = float(os.environ.get(DELAY_ENV) or 0)

    if visibility:
        real_options = worker.transport_options

        def short_visibility(settings: Any) -> dict[str, Any]:
            return {**real_options(settings), "visibility_timeout": float(visibility)}

        worker.transport_options = short_visibility  # type: ignore[assignment]

    # The dispatcher's slot per (endpoint, group), kept per thread: two dispatches may run at once.
    local = threading.local()
    real_slot_of = tasks.slot_of

    def slot_of(endpoint_id: int, group: str, interval: float, now_ms: int) -> int:
        slot = real_slot_of(endpoint_id, group, interval, now_ms)
        if not hasattr(local, "slots"):
            local.slots = {}
        local.slots[(endpoint_id, group)] = slot
        return slot

    tasks.slot_of = slot_of  # type: ignore[assignment]

    class SentLogger:
        """Stands in for `collect_target` in the dispatcher's module namespace; execution is untouched."""

        def __init__(self, task: Any) -> None:
            self.task = task

        def apply_async(self, args: list[Any], **kw: Any) -> Any:
            result = self.task.apply_async(args=args, **kw)
            ep, groups = args
            slots = getattr(local, "slots", {})
            log.write(ev="sent", task=result.id, ep=ep, groups=groups,
                      slots={g: slots.get((ep, g)) for g in groups})
            return result

    tasks.collect_target = SentLogger(tasks.collect_target)  # type: ignore[assignment]

    real_collect = tasks.collect_endpoint

    def collect_endpoint(engine: Any, endpoint_id: int, groups: list[str]) -> Any:
        pending = real_collect(engine, endpoint_id, groups)
        if pending is not None:
            r = pending.result
            log.write(ev="collected", task=_current_task_id(), ep=endpoint_id, groups=groups,
                      started_ms=pending.started_ms, ok=r.ok, error=r.error, samples=_sample_keys(r.samples))
            if delay_s:
                time.sleep(delay_s)  # widens the collected-but-not-stored window an outage must hit
        return pending

    tasks.collect_endpoint = collect_endpoint  # type: ignore[assignment]

    real_store = tasks.store_collection

    def store_collection(engine: Any, pending: Any, *, settings: Any) -> Any:
        try:
            report = real_store(engine, pending, settings=settings)
        except Exception as exc:
            log.write(ev="store_failed", task=_current_task_id(), ep=pending.endpoint_id,
                      started_ms=pending.started_ms, error=f"{type(exc).__name__}: {str(exc)[:200]}")
            raise
        log.write(ev="stored", task=_current_task_id(), ep=pending.endpoint_id, started_ms=pending.started_ms,
                  written=report.written, rejected=report.rejected)
        return report

    tasks.store_collection = store_collection  # type: ignore[assignment]

    real_spool_write = tasks.spool_write

    def spool_write(directory: Path, pending: Any) -> Path:
        path = real_spool_write(directory, pending)
        log.write(ev="spooled", task=_current_task_id(), ep=pending.endpoint_id, started_ms=pending.started_ms,
                  path=str(path))
        return path

    tasks.spool_write = spool_write  # type: ignore[assignment]

    if hold_s:
        real_ingestor = tasks.Ingestor
        held_marker = os.environ[LOG_ENV] + ".held"  # one hold per event log, whichever process stores first

        class HoldingIngestor(real_ingestor):  # type: ignore[misc, valid-type]
            """Rows are in, the transaction is open: the moment a SIGKILL must not leave anything behind."""

            def finish(self) -> Any:
                report = super().finish()
                try:
                    os.close(os.open(held_marker, os.O_CREAT | os.O_EXCL | os.O_WRONLY))
                except FileExistsError:
                    return report  # a re-run: no second hold
                log.write(ev="holding", task=_current_task_id(), written=report.written)
                time.sleep(hold_s)
                return report

        tasks.Ingestor = HoldingIngestor  # type: ignore[misc]


def worker_main(argv: list[str]) -> None:
    """Entry point of the instrumented worker subprocess: `fabricwatch <argv>` after `instrument()`."""
    instrument()
    from service.cli import app

    app(args=argv, prog_name="fabricwatch")


# ------------------------------------------------------------------------------------------ inventory

ARISTA = REPO / "tests/data/snmp/arista_eos_4.20_dcs-7150s-24.snmprec"
COMMUNITY_ENV = "FW_FAULTS_COMMUNITY"  # the workers resolve the community from here


def arista_ports() -> list[str]:
    from collectors.snmp import parse_snmprec

    samples, _ = parse_snmprec(ARISTA.read_text(), device="x", ts_ms=0)
    # Temperature sensors come with their sensor name as `port`; the inventory has no such ports, so
    # those samples are rejected (and reported in the target status) by design.
    return sorted({s.port for s in samples if s.port and s.metric != "device_temperature_celsius"})


def snmp_device(name: str, port: int, queue: str, *, counters_s: float, others_s: float, timeout_s: float = 2.0,
                retries: int = 0, ports: list[str] | None = None) -> dict[str, Any]:
    """An inventory device polled over SNMP v2c at 127.0.0.1:port (snmpsim, or a silent socket)."""
    return {"name": name, "kind": "switch", "role": "leaf",
            "ports": [{"name": p} for p in (ports if ports is not None else arista_ports())],
            "endpoints": [{"protocol": "snmp", "port": port, "version": "2c", "queue": queue,
                           "community": {"env": COMMUNITY_ENV}, "timeout_s": timeout_s, "retries": retries,
                           "intervals": {"counters": counters_s, "optics": others_s, "state": others_s}}]}


def load_inventory(url: str, devices: list[dict[str, Any]]) -> None:
    from sqlalchemy.orm import Session

    from service.db import get_engine
    from service.inventory.schemas import Inventory
    from service.inventory.service import upsert_inventory

    with Session(get_engine(url)) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate({"devices": devices}))
        session.commit()


STORED_KEYS_SQL = """
SELECT s.metric, d.name, p.name, s.lane, s.priority, s.gpu,
       (extract(epoch FROM x.ts) * 1000)::bigint
FROM samples x JOIN series s ON s.id = x.series_id JOIN devices d ON d.id = s.device_id
LEFT JOIN ports p ON p.id = s.port_id
WHERE d.name = ANY(:devices)
"""


def stored_keys(url: str, devices: list[str]) -> list[tuple[Any, ...]]:
    """(metric, device, port, lane, priority, gpu, ts_ms) of every stored sample of these devices."""
    from sqlalchemy import text

    from service.db import get_engine

    with get_engine(url).connect() as conn:
        return [tuple(r) for r in conn.execute(text(STORED_KEYS_SQL), {"devices": devices})]
