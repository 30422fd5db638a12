"""PostgreSQL restarted under continuous ingest: every collected sample and every acknowledged push is stored.

Setup, all on 127.0.0.1: a private embedded PostgreSQL, a private Redis broker, two snmpsim agents
(one per switch) polled every second by an instrumented `fabricwatch worker --beat`, and the real API
(uvicorn) taking Prometheus-text pushes from a client that retries until it gets a 2xx.

Counting: the worker logs every sample key its collector produced (`collected`) and every spool
write; the client records the samples of every push the API acknowledged. After the outage both
sets must be in `samples`, the spool must be empty, and ingestion must have resumed by itself.
Polls that fall inside the outage are not made at all (the dispatcher needs the database to claim
slots): that is a gap in the series, not a loss of collected data, and the test measures it.
"""

from __future__ import annotations

import os
import threading
import time
from collections.abc import Iterator
from dataclasses import dataclass, field
from pathlib import Path

import httpx
import pytest
from sqlalchemy import text

from service.config import load_settings
from service.db import get_engine
from tests.faults.peers import (
    ARISTA,
    COMMUNITY_ENV,
    DELAY_ENV,
    CountingWorker,
    PrivatePostgres,
    PrivateRedis,
    arista_ports,
    load_inventory,
    snmp_device,
    stored_keys,
)
from tests.live_api import live_api
from tests.snmp_peers import Peer, start_snmpsim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]

SWITCHES = ("pg-leaf-1", "pg-leaf-2")
PUSH_HOST = "pg-push-1"
PUSH_PORTS = [f"eth{i}" for i in range(8)]
OUTAGE_S = 7.0


@pytest.fixture()
def private_pg() -> Iterator[PrivatePostgres]:
    pg = PrivatePostgres().start()
    try:
        pg.migrate()
        yield pg
    finally:
        pg.close()


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


@pytest.fixture()
def agents() -> Iterator[list[Peer]]:
    peers = [start_snmpsim({"arista": ARISTA}) for _ in SWITCHES]  # one each: snmpsim is single-threaded
    yield peers
    for p in peers:
        p.close()


@dataclass
class Pusher:
    """Pushes one line per port every 0.2 s with a fresh timestamp; retries a push until it gets a 2xx."""

    base_url: str
    acked: list[int] = field(default_factory=list)  # timestamps of acknowledged pushes
    failures: int = 0
    stop: threading.Event = field(default_factory=threading.Event)

    def body(self, ts_ms: int) -> str:
        return "".join(f'port_rx_bytes_total{{device="{PUSH_HOST}",port="{p}"}} {ts_ms // 10} {ts_ms}\n'
                       for p in PUSH_PORTS)

    def run(self) -> None:
        with httpx.Client(timeout=5.0) as client:
            while not self.stop.is_set():
                ts = int(time.time() * 1000)
                while not self.stop.is_set():
                    try:
                        r = client.post(self.base_url + "/api/v1/import/prometheus", content=self.body(ts))
                        if r.status_code == 200 and r.json()["rejected"] == 0:
                            self.acked.append(ts)
                            break
                    except httpx.HTTPError:
                        pass
                    self.failures += 1
                    time.sleep(0.2)
                time.sleep(0.2)


def _last_success_ms(url: str) -> dict[int, float | None]:
    with get_engine(url).connect() as conn:
        rows = conn.execute(text("SELECT e.id, extract(epoch FROM t.last_success) * 1000 FROM endpoints e "
                                 "LEFT JOIN target_status t ON t.endpoint_id = e.id")).all()
    return {r[0]: r[1] for r in rows}


def test_postgres_restart_loses_no_collected_or_acknowledged_sample(
        private_pg: PrivatePostgres, private_redis: PrivateRedis, agents: list[Peer], tmp_path: Path) -> None:
    queue = f"faults-pg-{os.getpid()}"
    devices = [snmp_device(name, peer.port, queue, counters_s=1, others_s=5)
               for name, peer in zip(SWITCHES, agents, strict=True)]
    devices.append({"name": PUSH_HOST, "kind": "host", "role": "host", "ports": [{"name": p} for p in PUSH_PORTS]})
    load_inventory(private_pg.url, devices)
    # 1.5 s between collecting and storing, longer than the 1 s poll interval: some collection is always
    # in flight, so the outage certainly catches one (the spool path), however the machine is loaded.
    worker = CountingWorker(tmp_path, database_url=private_pg.url, redis_url=private_redis.url,
                            queues=f"fabricwatch,{queue}", extra_env={COMMUNITY_ENV: "arista", DELAY_ENV: "1.5"})
    worker.start()
    settings = load_settings(database_url=private_pg.url, auth_required=False)
    try:
        with live_api(settings) as base_url:
            pusher = Pusher(base_url)
            pushing = threading.Thread(target=pusher.run, daemon=True)
            pushing.start()
            try:
                # Warm up: both switches stored at least three collections.
                deadline = time.monotonic() + 60
                while len([e for e in worker.events().of("stored")]) < 6:
                    assert worker.alive(), worker.tail()
                    assert time.monotonic() < deadline, worker.tail()
                    time.sleep(0.2)
                acked_before = len(pusher.acked)

                stopped_at = time.time()
                private_pg.stop()
                time.sleep(OUTAGE_S)
                private_pg.start()
                restarted_at = time.time()

                # Resumes by itself: every switch stores a collection made after the restart, the spool
                # is drained, and the pusher gets acknowledgements again.
                deadline = time.monotonic() + 60
                while True:
                    last = _last_success_ms(private_pg.url)
                    spool = list(worker.spool_dir.glob("*.json")) if worker.spool_dir.exists() else []
                    fresh = [t for t in pusher.acked if t > restarted_at * 1000]
                    if all(v and v > restarted_at * 1000 for v in last.values()) and not spool and len(fresh) >= 3:
                        break
                    assert worker.alive(), worker.tail()
                    assert time.monotonic() < deadline, f"not resumed: {last}, spool {spool}\n{worker.tail()}"
                    time.sleep(0.25)
            finally:
                pusher.stop.set()
                pushing.join(15)
    finally:
        rc = worker.stop()

    ev = worker.events()
    ports = set(arista_ports())
    # Sensor readings named by sensor, not by an inventory port, are rejected by design (see peers.arista_ports).
    produced = {tuple(k) for e in ev.of("collected") for k in e["samples"] if k[2] is None or k[2] in ports}
    stored = set(stored_keys(private_pg.url, list(SWITCHES)))
    spooled = ev.of("spooled")
    missing = produced - stored
    assert not missing, f"{len(missing)} of {len(produced)} collected samples not stored, e.g. {sorted(missing)[:3]}"
    assert stored == produced  # nothing stored that no collector produced, nothing twice (primary key)
    assert spooled, "the outage caught no collection between collect and store: the spool path was not exercised"
    assert not list(worker.spool_dir.glob("*")), "spool not empty (or a file set aside as .bad)"

    pushed = {(ts, p) for ts in pusher.acked for p in PUSH_PORTS}
    push_stored = {(k[6], k[2]) for k in stored_keys(private_pg.url, [PUSH_HOST])}
    assert pushed <= push_stored, f"{len(pushed - push_stored)} acknowledged push samples missing"
    assert pusher.failures > 0, "the pusher never saw the outage"

    starts = sorted(e["started_ms"] for e in ev.of("collected"))
    gap_s = max(b - a for a, b in zip(starts, starts[1:], strict=False)) / 1000
    print(f"\nPG outage {restarted_at - stopped_at:.1f} s; collections {len(ev.of('collected'))}, "
          f"samples produced {len(produced)} stored {len(stored)}, spooled collections {len(spooled)}; "
          f"pushes acked {len(pusher.acked)} ({acked_before} before the outage), failed attempts "
          f"{pusher.failures}, push samples {len(pushed)} all stored; longest gap between collections "
          f"{gap_s:.1f} s; worker exit {rc}")
    assert gap_s < OUTAGE_S + 10
