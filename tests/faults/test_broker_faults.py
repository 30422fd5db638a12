"""The broker restarted and a worker SIGKILLed mid-collection: collection resumes, nothing is stored twice.

Both tests use a private Redis (the broker) and the test PostgreSQL; the worker is the instrumented
`fabricwatch worker` of tests/faults/peers.py, whose event log says which task ids the dispatcher
sent (with the poll slot of each group) and which collections ran and were stored.
"""

from __future__ import annotations

import os
import signal
import time
from collections import Counter
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, text

from service.config import load_settings
from service.worker import configure
from tests.faults.peers import (
    ARISTA,
    COMMUNITY_ENV,
    HOLD_ENV,
    VISIBILITY_ENV,
    CountingWorker,
    PrivateRedis,
    load_inventory,
    snmp_device,
    stored_keys,
)
from tests.snmp_peers import Peer, start_snmpsim

pytestmark = [pytest.mark.slow, pytest.mark.timeout(240)]


@pytest.fixture()
def private_redis(tmp_path: Path) -> Iterator[PrivateRedis]:
    r = PrivateRedis(tmp_path).start()
    yield r
    r.stop()


@pytest.fixture()
def agent() -> Iterator[Peer]:
    peer = start_snmpsim({"arista": ARISTA})
    yield peer
    peer.close()


def _wait(pred, timeout_s: float, worker: CountingWorker, what: str) -> None:  # type: ignore[no-untyped-def]
    deadline = time.monotonic() + timeout_s
    while not pred():
        assert worker.alive(), f"worker died waiting for {what}\n{worker.tail()}"
        assert time.monotonic() < deadline, f"{what}: not in {timeout_s} s\n{worker.tail()}"
        time.sleep(0.2)


def test_redis_restart_collection_resumes_no_slot_or_task_twice(
        db: Engine, db_url: str, private_redis: PrivateRedis, agent: Peer, tmp_path: Path) -> None:
    """Redis (no persistence) stopped for 5 s and started again on the same port.

    A restart loses every queued and unacknowledged message; for periodic collections that is a
    skipped poll, never a duplicate. The checks: every (endpoint, group, slot) was sent at most
    once, every task id ran at most once, every stored poll time belongs to exactly one collection,
    and the worker survived the restart (kombu 5.7.0's exit on it is fixed in service/redis_transport.py,
    tested deterministically in test_redis_transport.py).
    """
    queue = f"faults-redis-{os.getpid()}"
    names = ["rd-leaf-1", "rd-leaf-2"]
    load_inventory(db_url, [snmp_device(n, agent.port, queue, counters_s=2, others_s=6) for n in names])
    opts = {"database_url": db_url, "redis_url": private_redis.url, "queues": f"fabricwatch,{queue}",
            "extra_env": {COMMUNITY_ENV: "arista"}}
    worker = CountingWorker(tmp_path, **opts).start()  # type: ignore[arg-type]
    try:
        _wait(lambda: len(worker.events().of("stored")) >= 4, 60, worker, "first collections")
        private_redis.stop()
        down_at = time.time()
        time.sleep(5)
        private_redis.start()
        up_at = time.time()
        deadline = time.monotonic() + 20
        while worker.alive() and time.monotonic() < deadline:
            time.sleep(0.5)  # give the reconnect a chance to fail
        assert worker.alive(), f"the worker exited on the broker restart:\n{worker.tail(20_000)}"
        _wait(lambda: {e["ep"] for e in worker.events().of("stored") if e["started_ms"] > up_at * 1000} >= {1, 2}
              and len([e for e in worker.events().of("stored") if e["started_ms"] > up_at * 1000]) >= 6,
              90, worker, "collections after the broker restart")
    finally:
        rc = worker.stop()
    ev = worker.events()
    sent = ev.of("sent")
    slots = Counter((e["ep"], g, s) for e in sent for g, s in e["slots"].items())
    assert all(s is not None for _, _, s in slots), "slot not seen by the instrumentation"
    assert max(slots.values()) == 1, [k for k, n in slots.items() if n > 1]
    ran = Counter(e["task"] for e in ev.of("collected"))
    assert max(ran.values()) == 1, [k for k, n in ran.items() if n > 1]
    assert set(ran) <= {e["task"] for e in sent}
    stored = set(stored_keys(db_url, names))
    polls = Counter((names[e["ep"] - 1], e["started_ms"]) for e in ev.of("collected"))
    assert max(polls.values()) == 1
    # every stored row is one a collection produced (samples carry the times the agent answered)
    produced = [{tuple(k) for k in e["samples"]} for e in ev.of("collected")]
    assert stored <= set().union(*produced)
    polls_stored = [keys for keys in produced if keys & stored]
    with db.connect() as conn:
        dup = conn.execute(text("SELECT count(*) - count(DISTINCT (series_id, ts)) FROM samples")).scalar()
    assert dup == 0
    starts = sorted(e["started_ms"] for e in ev.of("collected"))
    gap_s = max(b - a for a, b in zip(starts, starts[1:], strict=False)) / 1000
    lost = len(sent) - len(ran)
    print(f"\nredis down {up_at - down_at:.1f} s; tasks sent {len(sent)}, ran "
          f"{len(ran)} (each once; {lost} sent but never run: queued when the broker went away, or expired), "
          f"slots sent {len(slots)} (each once), polls stored {len(polls_stored)}; longest gap between collections "
          f"{gap_s:.1f} s; worker exit {rc}")


def _send_collection(db: Engine, db_url: str, redis_url: str, queue: str) -> str:
    """One collection of the test's only endpoint, sent as the dispatcher would; its task id."""
    with db.connect() as conn:
        ep = conn.execute(text("SELECT id FROM endpoints")).scalar_one()
    client = configure(Celery("fw-faults-client"), load_settings(database_url=db_url, redis_url=redis_url))
    return client.send_task("fabricwatch.collect_target", args=[ep, ["counters", "optics", "state"]],
                            queue=queue).id


def _ran_again_once(db: Engine, db_url: str, worker: CountingWorker, task_id: str) -> tuple[int, int, int]:
    """The killed run and exactly one re-run of task_id in the event log; only the re-run's rows stored,
    once. (killed poll ms, re-run poll ms, rows stored)."""
    ev = worker.events()
    collected = ev.of("collected")
    assert [e["task"] for e in collected] == [task_id, task_id], collected  # killed run, then exactly one re-run
    assert [e["task"] for e in ev.of("stored")] == [task_id]
    killed_ms, rerun_ms = collected[0]["started_ms"], collected[1]["started_ms"]
    stored = set(stored_keys(db_url, ["kill-leaf-1"]))
    # each run's samples carry the times the agent answered it, so the two runs' keys never meet
    killed_keys, rerun_keys = ({tuple(k) for k in e["samples"]} for e in collected)
    assert killed_keys and not stored & killed_keys, "rows of the killed, uncommitted run are visible"
    assert stored <= rerun_keys and len(stored) == ev.of("stored")[0]["written"]
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) - count(DISTINCT (series_id, ts)) FROM samples")).scalar() == 0
    return killed_ms, rerun_ms, len(stored)


def test_worker_sigkilled_mid_collection_task_runs_again_without_duplicates(
        db: Engine, db_url: str, private_redis: PrivateRedis, agent: Peer, tmp_path: Path) -> None:
    """The whole worker SIGKILLed (its process group: main process and pool, as on a host or container
    crash) while a collection's rows are written but not committed; a second worker re-runs the task.

    Nothing of the first worker is left to reject the message, so redelivery comes from the Redis
    visibility timeout (acks_late: the message was never acknowledged), set to 4 s here instead of 3600 s.
    """
    queue = f"faults-kill-{os.getpid()}"
    load_inventory(db_url, [snmp_device("kill-leaf-1", agent.port, queue, counters_s=3600, others_s=3600)])
    common = {COMMUNITY_ENV: "arista", VISIBILITY_ENV: "4"}
    first = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues=queue, beat=False,
                           concurrency=1, extra_env={**common, HOLD_ENV: "120"}, name="first")
    second = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues=queue, beat=False,
                            concurrency=1, extra_env=common, name="second")
    first.start()
    try:
        task_id = _send_collection(db, db_url, private_redis.url, queue)
        _wait(lambda: first.events().of("holding"), 60, first, "the first worker holding its transaction")
        held = first.events().of("holding")[0]
        first.kill()
        killed_at = time.time()
        # kombu scans for unacknowledged messages past their visibility timeout when a worker starts,
        # then only every few minutes: start the second worker once the 4 s have passed.
        time.sleep(5)
        second.start()
        _wait(lambda: second.events().of("stored"), 90, second, "the re-run of the killed task")
        rerun_after_s = time.time() - killed_at
        time.sleep(6)  # longer than the visibility timeout: a third run would show up now
    finally:
        first.kill()
        second.stop()
    killed_ms, rerun_ms, stored = _ran_again_once(db, db_url, second, task_id)
    with db.connect() as conn:
        status = conn.execute(text("SELECT samples, consecutive_failures FROM target_status")).one()
    print(f"\nkilled with {held['written']} rows written, uncommitted (poll {killed_ms}); task {task_id} re-run "
          f"{rerun_after_s:.1f} s later by the second worker, stored {stored} rows of poll {rerun_ms} once; "
          f"status {tuple(status)}")


def test_pool_process_sigkilled_mid_collection_task_runs_again_without_duplicates(
        db: Engine, db_url: str, private_redis: PrivateRedis, agent: Peer, tmp_path: Path) -> None:
    """Only the pool process holding a collection's uncommitted rows is SIGKILLed (the OOM killer's pick,
    say); the worker's main process lives on.

    It sees its pool process lost, and `task_reject_on_worker_lost` puts the unacknowledged message back
    on the queue: a new pool process of the same worker runs the task again at once, without waiting for
    the visibility timeout (left at its production 3600 s here).
    """
    queue = f"faults-child-{os.getpid()}"
    load_inventory(db_url, [snmp_device("kill-leaf-1", agent.port, queue, counters_s=3600, others_s=3600)])
    worker = CountingWorker(tmp_path, database_url=db_url, redis_url=private_redis.url, queues=queue, beat=False,
                            concurrency=1, extra_env={COMMUNITY_ENV: "arista", HOLD_ENV: "120"})
    worker.start()
    try:
        task_id = _send_collection(db, db_url, private_redis.url, queue)
        _wait(lambda: worker.events().of("holding"), 60, worker, "the pool process holding its transaction")
        held = worker.events().of("holding")[0]
        assert worker.proc is not None and held["pid"] != worker.proc.pid  # a pool process, not the main one
        os.kill(held["pid"], signal.SIGKILL)
        killed_at = time.time()
        _wait(lambda: worker.events().of("stored"), 60, worker, "the re-run of the killed task")
        rerun_after_s = time.time() - killed_at
        time.sleep(3)
        assert worker.alive(), worker.tail()
    finally:
        worker.stop()
    killed_ms, rerun_ms, stored = _ran_again_once(db, db_url, worker, task_id)
    rerun = worker.events().of("stored")[0]
    assert rerun["pid"] != held["pid"]
    print(f"\npool process {held['pid']} killed with {held['written']} rows uncommitted (poll {killed_ms}); the "
          f"worker re-ran task {task_id} {rerun_after_s:.1f} s later in pool process {rerun['pid']}, stored "
          f"{stored} rows of poll {rerun_ms} once")
