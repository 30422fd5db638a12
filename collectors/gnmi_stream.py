"""gNMI streams run by the worker: one supervised Subscribe per target, its state in gnmi_stream_state.

Operators run gNMI as streams (SAMPLE for counters and optics, ON_CHANGE for oper status, so a
flap between two polls is seen), so that is the default for a gNMI endpoint (`mode: stream`).
Every worker runs a StreamSupervisor (a bootstep, service/worker.py). Every SCAN_S it looks at
the stream-mode gNMI endpoints of the queues it consumes and claims the ones nobody holds: a
lease row (`owner`, `lease_until`) in gnmi_stream_state, renewed while the stream runs, so each
target is streamed by one worker and taken over by another when its worker dies.

A claimed target runs `stream_gnmi` (collectors/gnmi.py: discovery, reconnect with backoff,
stall detection) in its own thread; samples are stored every FLUSH_S through the same
`store_collection` a poll uses, so samples, link events and the target's status look the same
whichever way they came. The stream's state (streaming, reconnecting, stalled, fallback-polling)
and its reason go to the row; while a target is not `streaming` under a live lease the
dispatcher polls it with Get (collectors/tasks.py), so a stream that is down is never a gap.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import threading
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.orm import Session

from collectors.base import CollectResult, Target
from service.shards.topology import ShardSettings
from service.telemetry.samples import Sample

log = logging.getLogger(__name__)

LEASE_S = 30.0   # a lease not renewed for this long is free for another worker
SCAN_S = 5.0     # how often the supervisor looks for targets and renews its leases
FLUSH_S = 1.0    # how often a stream's samples are stored

STATES = ("streaming", "reconnecting", "stalled", "fallback-polling")

_CLAIM_SQL = """
INSERT INTO gnmi_stream_state AS g (endpoint_id, owner, lease_until, updated_at)
VALUES (:id, :owner, now() + make_interval(secs => :lease), now())
ON CONFLICT (endpoint_id) DO UPDATE SET owner = EXCLUDED.owner, lease_until = EXCLUDED.lease_until,
  updated_at = now()
WHERE g.owner IS NULL OR g.owner = EXCLUDED.owner OR g.lease_until IS NULL OR g.lease_until < now()
RETURNING endpoint_id
"""


def claim(conn: Connection, endpoint_id: int, owner: str, lease_s: float = LEASE_S) -> bool:
    """Take or renew the stream lease of a target; False when another live worker holds it."""
    return conn.execute(text(_CLAIM_SQL), {"id": endpoint_id, "owner": owner, "lease": lease_s}).first() is not None


def release(conn: Connection, endpoint_id: int, owner: str) -> None:
    conn.execute(text("UPDATE gnmi_stream_state SET owner = NULL, lease_until = NULL, state = NULL, "
                      "reason = 'stream stopped by its worker', since = now(), updated_at = now() "
                      "WHERE endpoint_id = :id AND owner = :owner"), {"id": endpoint_id, "owner": owner})


def set_state(conn: Connection, endpoint_id: int, state: str, reason: str, owner: str | None = None) -> None:
    if state not in STATES:
        raise ValueError(f"unknown stream state {state!r}; known: {', '.join(STATES)}")
    conn.execute(text(
        "INSERT INTO gnmi_stream_state AS g (endpoint_id, state, reason, since, owner, updated_at) "
        "VALUES (:id, :state, :reason, now(), :owner, now()) ON CONFLICT (endpoint_id) DO UPDATE SET "
        "since = CASE WHEN g.state IS DISTINCT FROM EXCLUDED.state THEN now() ELSE g.since END, "
        "state = EXCLUDED.state, reason = EXCLUDED.reason, updated_at = now()"),
        {"id": endpoint_id, "state": state, "reason": reason[:2000], "owner": owner})


def load_discovery(conn: Connection, endpoint_id: int) -> dict[str, Any]:
    row = conn.execute(text("SELECT discovery FROM gnmi_stream_state WHERE endpoint_id = :id"),
                       {"id": endpoint_id}).first()
    return dict(row[0]) if row and row[0] else {}


def save_discovery(conn: Connection, endpoint_id: int, doc: dict[str, Any]) -> None:
    conn.execute(text(
        "INSERT INTO gnmi_stream_state AS g (endpoint_id, discovery, updated_at) "
        "VALUES (:id, CAST(:doc AS jsonb), now()) ON CONFLICT (endpoint_id) DO UPDATE SET "
        "discovery = EXCLUDED.discovery, updated_at = now()"), {"id": endpoint_id, "doc": json.dumps(doc)})


def streaming_now(conn: Connection) -> set[int]:
    """Endpoints a live worker is streaming right now: the dispatcher does not poll these."""
    return {r[0] for r in conn.execute(text(
        "SELECT endpoint_id FROM gnmi_stream_state WHERE state = 'streaming' AND lease_until > now()")).all()}


def stream_mode(config: dict[str, Any]) -> str:
    return str(config.get("mode") or "stream")


class TargetStream:
    """One target's stream: stream_gnmi in a thread, its samples stored every FLUSH_S."""

    def __init__(self, engine: Engine, endpoint_id: int, device_id: int, target: Target, owner: str,
                 *, flush_s: float = FLUSH_S, **stream_kw: Any) -> None:
        self.engine, self.endpoint_id, self.device_id = engine, endpoint_id, device_id
        self.target, self.owner, self.flush_s = target, owner, flush_s
        self.stream_kw = stream_kw
        self.stop_event = threading.Event()
        self._lock = threading.Lock()
        self._samples: list[Sample] = []
        self._warnings: list[str] = []
        self._threads: list[threading.Thread] = []

    # callbacks from stream_gnmi (its thread)
    def _on_samples(self, samples: list[Sample]) -> None:
        with self._lock:
            self._samples.extend(samples)

    def _on_error(self, msg: str) -> None:
        log.info("gnmi stream %s: %s", self.target.name, msg)
        with self._lock:
            if msg not in self._warnings:
                self._warnings = [*self._warnings, msg][-50:]

    def _on_state(self, state: str, reason: str) -> None:
        try:
            with self.engine.begin() as conn:
                set_state(conn, self.endpoint_id, state, reason, self.owner)
        except Exception:  # the database away: the next state change or flush tries again
            log.exception("gnmi stream %s: cannot record state %s", self.target.name, state)

    def _on_discovery(self, doc: dict[str, Any]) -> None:
        try:
            with self.engine.begin() as conn:
                save_discovery(conn, self.endpoint_id, doc)
        except Exception:
            log.exception("gnmi stream %s: cannot record discovery", self.target.name)

    def flush(self) -> int:
        """Store what arrived since the last flush, with the target's status; returns samples stored."""
        from collectors.spool import PendingStore
        from collectors.tasks import store_collection
        from service.config import get_settings
        from service.telemetry.targets import GROUPS

        with self._lock:
            samples, self._samples = self._samples, []
            warnings = list(self._warnings)
        if not samples:
            return 0
        started = min(s.ts_ms for s in samples)
        result = CollectResult(target=self.target.name, samples=samples, warnings=warnings)
        pending = PendingStore(self.endpoint_id, self.device_id, "gnmi", list(GROUPS), started, result)
        try:
            report = store_collection(self.engine, pending, settings=get_settings())
            with self.engine.begin() as conn:
                conn.execute(text("UPDATE gnmi_stream_state SET last_data_at = now(), updated_at = now() "
                                  "WHERE endpoint_id = :id"), {"id": self.endpoint_id})
        except Exception:  # the database away: keep them for the next flush
            log.exception("gnmi stream %s: cannot store %d samples", self.target.name, len(samples))
            with self._lock:
                self._samples = samples + self._samples
            return 0
        return report.written

    def _flusher(self) -> None:
        while not self.stop_event.wait(self.flush_s):
            self.flush()
        self.flush()

    def start(self) -> None:
        from collectors.gnmi import stream_gnmi

        kw = {"on_error": self._on_error, "on_state": self._on_state, "on_discovery": self._on_discovery,
              **self.stream_kw}
        self._threads = [
            threading.Thread(target=stream_gnmi, args=(self.target, self._on_samples, self.stop_event),
                             kwargs=kw, daemon=True, name=f"gnmi-stream-{self.target.name}"),
            threading.Thread(target=self._flusher, daemon=True, name=f"gnmi-flush-{self.target.name}"),
        ]
        for t in self._threads:
            t.start()

    def stop(self, timeout_s: float = 5.0) -> None:
        self.stop_event.set()
        for t in self._threads:
            t.join(timeout_s)

    @property
    def alive(self) -> bool:
        return bool(self._threads) and all(t.is_alive() for t in self._threads)


_ENDPOINTS_SQL = """
SELECT e.id, e.device_id, e.config, d.pod FROM endpoints e JOIN devices d ON d.id = e.device_id
WHERE e.protocol = 'gnmi' ORDER BY e.id
"""


class StreamSupervisor:
    """Claims and runs the streams of the stream-mode gNMI targets on this worker's queues."""

    def __init__(self, engine: Engine, *, queues: set[str] | None = None, shards: ShardSettings | None = None,
                 owner: str | None = None, scan_s: float = SCAN_S, lease_s: float = LEASE_S,
                 **stream_kw: Any) -> None:
        # shards: the deployment's, for the queue rule (collectors/queues.py); None: unsharded
        self.engine, self.queues, self.shards = engine, queues, shards or ShardSettings()
        self.owner = owner or f"{socket.gethostname()}:{os.getpid()}:{id(self):x}"
        self.scan_s, self.lease_s, self.stream_kw = scan_s, lease_s, stream_kw
        self.streams: dict[int, TargetStream] = {}
        self._stop = threading.Event()
        self._thread: threading.Thread | None = None

    def _wanted(self, conn: Connection) -> dict[int, tuple[int, dict[str, Any]]]:
        from collectors.queues import queue_rule

        out = {}
        rule = queue_rule(conn, self.shards)  # the dispatcher's: a stream runs where its polls would
        for ep_id, device_id, config, pod in conn.execute(text(_ENDPOINTS_SQL)).all():
            config = config or {}
            if stream_mode(config) != "stream":
                continue
            if self.queues is not None and rule.queue_for(config, pod) not in self.queues:
                continue
            out[ep_id] = (device_id, config)
        return out

    def _target(self, endpoint_id: int) -> Target | None:
        from service.inventory.secrets import SecretError, target_for
        from service.models import Endpoint

        with Session(self.engine) as session:
            endpoint = session.get(Endpoint, endpoint_id)
            if endpoint is None:
                return None
            try:
                target = target_for(endpoint)
            except SecretError as e:
                with self.engine.begin() as conn:
                    set_state(conn, endpoint_id, "fallback-polling", str(e), self.owner)
                return None
        with self.engine.connect() as conn:
            discovery = load_discovery(conn, endpoint_id)
        return target.model_copy(update={"params": {**target.params, "discovery": discovery}})

    def scan(self) -> None:
        """One round: renew or drop what runs, claim what nobody streams."""
        with self.engine.begin() as conn:
            wanted = self._wanted(conn)
        for ep_id in [e for e in self.streams if e not in wanted or not self.streams[e].alive]:
            self._drop(ep_id)
        for ep_id, (device_id, _config) in wanted.items():
            with self.engine.begin() as conn:
                held = claim(conn, ep_id, self.owner, self.lease_s)
            if not held:
                if ep_id in self.streams:  # another worker took it over (we were too slow to renew)
                    self.streams.pop(ep_id).stop()
                continue
            if ep_id not in self.streams:
                target = self._target(ep_id)
                if target is None:
                    continue
                stream = TargetStream(self.engine, ep_id, device_id, target, self.owner, **self.stream_kw)
                stream.start()
                self.streams[ep_id] = stream

    def _drop(self, ep_id: int) -> None:
        self.streams.pop(ep_id).stop()
        try:
            with self.engine.begin() as conn:
                release(conn, ep_id, self.owner)
        except Exception:
            log.exception("gnmi streams: cannot release endpoint %s", ep_id)

    def _loop(self) -> None:
        while not self._stop.is_set():
            try:
                self.scan()
            except Exception:  # the database away: try again next round; leases run out meanwhile
                log.exception("gnmi stream supervisor: scan failed")
            self._stop.wait(self.scan_s)

    def start(self) -> None:
        self._thread = threading.Thread(target=self._loop, daemon=True, name="gnmi-stream-supervisor")
        self._thread.start()

    def stop(self) -> None:
        self._stop.set()
        if self._thread is not None:
            self._thread.join(self.scan_s + 5)
        for ep_id in list(self.streams):
            self._drop(ep_id)


def describe(row: tuple[Any, ...] | None, config: dict[str, Any]) -> dict[str, Any]:
    """The `stream` object of a gNMI target in /api/v1/targets."""
    mode = stream_mode(config)
    if row is None:
        row = (None,) * 6
    state, reason, since, owner, lease_until, last_data = row
    live = lease_until is not None and lease_until > datetime.now(UTC)
    if mode == "poll":
        shown, why = "polling", "mode: poll in the inventory"
    elif state is None or not live:
        shown = "fallback-polling"
        why = "no worker holds this target's stream (none running, or its lease ran out): polled with Get"
    else:
        shown, why = state, reason
    return {"mode": mode, "state": shown, "reason": why, "since": since, "worker": owner if live else None,
            "last_data_at": last_data}


def main(argv: list[str] | None = None) -> int:
    """`python -m collectors.gnmi_stream --queues a,b`: the stream process a worker starts (service/worker.py).

    A process of its own, so that the worker's prefork pool never forks a process with gRPC threads.
    """
    import argparse
    import signal

    from service.config import get_settings
    from service.db import get_engine

    parser = argparse.ArgumentParser(prog="fabricwatch-gnmi-streams")
    parser.add_argument("--queues", default="", help="comma-separated queues whose gNMI targets to stream")
    args = parser.parse_args(argv)
    logging.basicConfig(level=get_settings().log_level, format="%(asctime)s %(name)s %(levelname)s %(message)s")
    queues = {q for q in args.queues.split(",") if q} or None
    settings = get_settings()
    supervisor = StreamSupervisor(get_engine(settings.database_url or ""), queues=queues, shards=settings.shards)
    done = threading.Event()
    signal.signal(signal.SIGTERM, lambda *_: done.set())
    signal.signal(signal.SIGINT, lambda *_: done.set())
    supervisor.start()
    done.wait()
    supervisor.stop()
    return 0


if __name__ == "__main__":
    raise SystemExit(main())
