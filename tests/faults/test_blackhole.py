"""20 % of the targets black-holed (silent UDP sockets): the healthy ones keep their schedule.

Five SNMP targets polled every 5 s by a real `fabricwatch worker --beat` (4 threads): four answer
(one snmpsim each), one never does (a bound socket that drops everything) and takes 1.5 s x 2
tries per poll. The poll intervals of the healthy targets are measured from the stored sample
times (one distinct timestamp per collection).
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from tests.faults.peers import ARISTA, COMMUNITY_ENV, CountingWorker, PrivateRedis, load_inventory, snmp_device
from tests.snmp_peers import Peer, silent_udp_socket, start_snmpsim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(180)]

INTERVAL_S = 5.0
RUN_S = 30.0


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


@pytest.fixture()
def agents() -> Iterator[list[Peer]]:
    peers = [start_snmpsim({"arista": ARISTA}) for _ in range(4)]
    yield peers
    for p in peers:
        p.close()


def _poll_times(db: Engine) -> dict[str, list[int]]:
    with db.connect() as conn:
        rows = conn.execute(text(
            "SELECT DISTINCT d.name, (extract(epoch FROM x.ts) * 1000)::bigint FROM samples x "
            "JOIN series s ON s.id = x.series_id JOIN devices d ON d.id = s.device_id "
            "WHERE s.metric = 'port_rx_bytes_total' ORDER BY 1, 2")).all()
    out: dict[str, list[int]] = {}
    for name, ts in rows:
        out.setdefault(name, []).append(ts)
    return out


def test_black_holed_targets_do_not_delay_healthy_ones(
        db: Engine, db_url: str, private_redis: PrivateRedis, agents: list[Peer], tmp_path: Path) -> None:
    queue = f"faults-bh-{os.getpid()}"
    sock, dead_port = silent_udp_socket()
    healthy = [f"bh-leaf-{i}" for i in range(len(agents))]
    devices = [snmp_device(n, p.port, queue, counters_s=INTERVAL_S, others_s=60)
               for n, p in zip(healthy, agents, strict=True)]
    devices.append(snmp_device("bh-dead", dead_port, queue, counters_s=INTERVAL_S, others_s=60, timeout_s=1.5,
                               retries=1, ports=["Ethernet1"]))
    load_inventory(db_url, devices)
    worker = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url,
                            queues=f"fabricwatch,{queue}", extra_env={COMMUNITY_ENV: "arista"}).start()
    try:
        deadline = time.monotonic() + 60
        while len(_poll_times(db)) < len(healthy):
            assert worker.alive() and time.monotonic() < deadline, worker.tail()
            time.sleep(0.5)
        time.sleep(RUN_S)
    finally:
        worker.stop()
        sock.close()
    times = _poll_times(db)
    with db.connect() as conn:
        dead = conn.execute(text("SELECT t.last_success, t.consecutive_failures, t.last_error FROM target_status t "
                                 "JOIN endpoints e ON e.id = t.endpoint_id JOIN devices d ON d.id = e.device_id "
                                 "WHERE d.name = 'bh-dead'")).one()
    assert dead.last_success is None and dead.consecutive_failures >= 3, dead
    report = []
    for name in healthy:
        ts = times[name]
        gaps = [(b - a) / 1000 for a, b in zip(ts, ts[1:], strict=False)]
        med, worst = statistics.median(gaps), max(gaps)
        report.append(f"{name}: {len(ts)} polls, median {med:.2f} s, max {worst:.2f} s")
        assert abs(med - INTERVAL_S) <= 0.5, report
        assert worst <= 2 * INTERVAL_S + 0.5, report  # at most one skipped slot
        assert len(ts) >= 0.75 * RUN_S / INTERVAL_S, report
    print(f"\nblack-holed 1 of 5 ({dead.consecutive_failures} failed polls, {dead.last_error[:60]!r}); "
          + "; ".join(report))
