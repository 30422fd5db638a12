"""Black holes: a dead peer delays only itself.

SNMP: five targets polled every 5 s by a real `fabricwatch worker --beat` (4 pool processes): four answer
(one snmpsim each), one never does (a bound socket that drops everything) and takes 1.5 s x 2
tries per poll. The poll intervals of the healthy targets are measured from the stored sample
times (one distinct timestamp per collection).

Webhooks: four healthy receivers and one that accepts connections and never answers (the default
10 s time-out per attempt), delivered by a real worker. The healthy receivers' delivery delay
(outbox row written -> request received) is measured without and then with the dead receiver.
"""

from __future__ import annotations

import os
import statistics
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text

from service.alerts.service import apply_findings
from tests.alerts import STEP, T0, finding
from tests.faults.peers import ARISTA, COMMUNITY_ENV, CountingWorker, PrivateRedis, load_inventory, snmp_device
from tests.notify.test_delivery import subscribe
from tests.receiver import BlackHole, Receiver
from tests.snmp_peers import Peer, silent_udp_socket, start_snmpsim

pytestmark = [pytest.mark.slow, pytest.mark.serial, pytest.mark.timeout(180)]

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


WAVES = 10  # per phase: a detection cycle every second that opens 3 alerts
WAVE_ALERTS = 3
DEAD_TIMEOUT_S = 10.0  # FABRICWATCH_WEBHOOK_TIMEOUT_S's default


def _p99(values: list[float]) -> float:
    ordered = sorted(values)
    return ordered[max(0, -(-99 * len(ordered) // 100) - 1)]


def _open_waves(db: Engine, ports: list[str], phase: int) -> None:
    """WAVES detection cycles a second apart, each opening WAVE_ALERTS more alerts (all earlier ones still firing)."""
    for w in range(WAVES):
        ports += [f"Ethernet{phase}/{w}/{i}" for i in range(WAVE_ALERTS)]
        with db.begin() as conn:
            apply_findings(conn=conn, findings=[finding(port=p) for p in ports], at_ms=T0 + (phase * WAVES + w) * STEP)
        time.sleep(1.0)


def _last_row(db: Engine) -> int:
    with db.connect() as conn:
        return int(conn.execute(text("SELECT coalesce(max(id), 0) FROM webhook_outbox")).scalar_one())


def _delays(db: Engine, receivers: list[Receiver], after_row: int, timeout_s: float = 60.0) -> list[float]:
    """Seconds from each healthy row's commit to its first arrival (rows after `after_row`); waits for all."""
    with db.connect() as conn:
        rows = conn.execute(text("SELECT s.url, o.idempotency_key, extract(epoch FROM o.created_at) "
                                 "FROM webhook_outbox o JOIN webhook_subscriptions s ON s.id = o.subscription_id "
                                 "WHERE o.id > :after"), {"after": after_row}).all()
    by_url = {r.url + "/hook": r for r in receivers}
    want = [(by_url[url], key, float(at)) for url, key, at in rows if url in by_url]
    deadline = time.monotonic() + timeout_s
    while True:
        got = {(id(r), q.headers["idempotency-key"]): q.at for r in receivers for q in reversed(r.bodies())}
        if all((id(r), k) in got for r, k, _ in want) or time.monotonic() > deadline:
            break
        time.sleep(0.2)
    missing = [k for r, k, _ in want if (id(r), k) not in got]
    assert not missing, f"{len(missing)} healthy notifications never arrived"
    return [got[(id(r), k)] - at for r, k, at in want]


def _dead_attempts(db: Engine, timeout_s: float) -> list[str]:
    """The dead receiver's recorded attempt errors, once its first attempt has timed out (10 s after it began)."""
    deadline = time.monotonic() + timeout_s
    while True:
        with db.connect() as conn:
            errors = conn.execute(text("SELECT d.error FROM webhook_deliveries d JOIN webhook_subscriptions s "
                                       "ON s.id = d.subscription_id WHERE s.name = 'dead'")).scalars().all()
        if errors or time.monotonic() > deadline:
            return list(errors)
        time.sleep(0.5)


def test_a_dead_webhook_receiver_does_not_delay_the_healthy_ones(
        db: Engine, db_url: str, private_redis: PrivateRedis, tmp_path: Path) -> None:
    healthy = [Receiver().start() for _ in range(4)]
    hole = BlackHole().start()
    for i, r in enumerate(healthy):
        subscribe(db, r.url + "/hook", name=f"ok-{i}")
    worker = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues="fabricwatch",
                            extra_env={"FABRICWATCH_WEBHOOK_ALLOW": "127.0.0.1/32",
                                       "FABRICWATCH_WEBHOOK_POLL_S": "0.5"}).start()
    ports = ["Ethernet0/warm-up"]
    try:
        with db.begin() as conn:  # measure from when the worker delivers (its start-up is not the point)
            apply_findings(conn=conn, findings=[finding(port=p) for p in ports], at_ms=T0 - STEP)
        _delays(db, healthy, 0, timeout_s=120)
        last = _last_row(db)
        _open_waves(db, ports, 0)
        without = _delays(db, healthy, last)
        subscribe(db, hole.url + "/hook", name="dead")
        last = _last_row(db)
        _open_waves(db, ports, 1)
        with_dead = _delays(db, healthy, last)
        dead = _dead_attempts(db, timeout_s=3 * DEAD_TIMEOUT_S)
    finally:
        hole.stop()  # first: its hung requests end at once, so the worker's warm shutdown is quick
        worker.stop()
        for r in healthy:
            r.stop()
    assert worker.proc is not None and "Traceback" not in worker.tail(100_000), worker.tail()
    p99_without, p99_with = _p99(without), _p99(with_dead)
    report = (f"healthy p99 delivery delay {p99_without:.2f} s without the dead receiver, {p99_with:.2f} s with it "
              f"(max {max(without):.2f} / {max(with_dead):.2f} s, {len(without)} + {len(with_dead)} deliveries); "
              f"dead receiver: {len(dead)} attempts timed out")
    print("\n" + report)
    assert len(with_dead) == len(without) == 4 * WAVES * WAVE_ALERTS
    assert dead and all(e.startswith("ReadTimeout") for e in dead), dead
    assert max(with_dead) < DEAD_TIMEOUT_S / 4, report  # the old code: behind each dead attempt, 10 s
    assert p99_with <= p99_without + 1.0, report  # unchanged, within the noise of a loaded machine
