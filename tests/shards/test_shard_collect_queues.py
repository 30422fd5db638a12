"""Collections on per-shard Celery queues (issue 20, item 5), on real servers: a control database and two
telemetry shards (tests/shards/conftest.py), a private Redis broker, one snmpsim agent per switch, and two
real `fabricwatch worker`s (prefork, instrumented by tests/faults/peers.py to log what they collect, store and
spool): worker A runs beat and consumes `fabricwatch,collect.a`, worker B consumes `collect.b` alone.

The queue rule itself (collectors/queues.py): an endpoint's own `queue` wins; unsharded the default queue;
sharded `collect.<shard>` of the device's pod from the stored map, which a move changes only at its switch.
"""

from __future__ import annotations

import json
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import text

from collectors.gnmi_stream import StreamSupervisor
from collectors.queues import QueueRule, queue_rule
from service.config import load_settings
from service.shards.setup import apply
from service.shards.topology import ShardSettings
from service.worker import DEFAULT_QUEUE, collect_queue, detect_queue, worker_queues
from tests.faults.peers import (
    ARISTA,
    COMMUNITY_ENV,
    CountingWorker,
    PrivateRedis,
    arista_ports,
    load_inventory,
    snmp_device,
    stored_keys,
)
from tests.shards.conftest import Cluster
from tests.snmp_peers import Peer, start_snmpsim

pytestmark = pytest.mark.timeout(600)

SWITCH_A, SWITCH_B = "cq-leaf-a", "cq-leaf-b"  # pod p1 (shard a), pod p2 (shard b)


def _switch(name: str, pod: str, port: int) -> dict[str, Any]:
    device = snmp_device(name, port, "unused", counters_s=2, others_s=30)
    del device["endpoints"][0]["queue"]  # no queue of its own: the shard's is the default
    return {**device, "pod": pod}


def test_the_queue_rule(cluster: Cluster) -> None:
    apply(cluster.topology())
    with cluster.engine.connect() as conn:  # rolled back at the end: the map changes below are this test's
        unsharded = queue_rule(conn, ShardSettings())
        assert unsharded == QueueRule()
        assert unsharded.queue_for({}, "p2") == DEFAULT_QUEUE
        assert unsharded.queue_for({"queue": "host-gpu-1"}, "p2") == "host-gpu-1"
        rule = queue_rule(conn, cluster.settings())
        assert rule.queue_for({}, "p1") == "collect.a" == collect_queue("a")
        assert rule.queue_for({}, "p2") == rule.queue_for({}, "p3") == "collect.b"
        assert rule.queue_for({}, None) == rule.queue_for({}, "unlisted") == "collect.a"  # the default shard
        assert rule.queue_for({"queue": "pod-2"}, "p2") == "pod-2"  # the endpoint's own still wins
        # the stored map, not the setting: p2 stored on a (as a finished move leaves it) goes to a's queue; a
        # move in progress (move_to set) leaves the queue where `shard` says, as the reads and the spool do
        conn.execute(text("UPDATE shard_pods SET shard = 'a' WHERE pod = 'p2'"))
        conn.execute(text("UPDATE shard_pods SET move_to = 'a' WHERE pod = 'p3'"))
        moved = queue_rule(conn, cluster.settings())
        assert (moved.queue_for({}, "p2"), moved.queue_for({}, "p3")) == ("collect.a", "collect.b")
        conn.rollback()
    with cluster.engine.connect() as conn:
        assert queue_rule(conn, cluster.settings()).queue_for({}, "p2") == "collect.b"


def test_a_gnmi_stream_runs_on_a_worker_of_its_polls_queue(cluster: Cluster) -> None:
    """The stream supervisor of a worker consuming collect.b streams shard b's targets and no other; with an
    explicit queue, the target's own; unsharded, what the default queue's worker would poll."""
    apply(cluster.topology())
    with cluster.engine.connect() as conn:  # rolled back: the module's workers must not see these endpoints
        ids = {name: conn.execute(text(
            "INSERT INTO endpoints (device_id, protocol, address, config) SELECT id, 'gnmi', '127.0.0.1', "
            "CAST(:c AS jsonb) FROM devices WHERE name = :n RETURNING id"),
            {"n": name, "c": json.dumps(config)}).scalar_one()
            for name, config in (("leaf1", {}), ("leaf2", {}), ("host3", {"queue": "gpu-hosts"}),
                                 ("spine1", {"mode": "poll"}))}

        def wanted(queues: set[str], shards: ShardSettings | None) -> set[int]:
            return set(StreamSupervisor(cluster.engine, queues=queues, shards=shards)._wanted(conn))

        assert wanted({"collect.b"}, cluster.settings()) == {ids["leaf2"]}
        assert wanted({"collect.a"}, cluster.settings()) == {ids["leaf1"]}  # spine1 polls: never streamed
        assert wanted({"gpu-hosts"}, cluster.settings()) == {ids["host3"]}
        assert wanted({DEFAULT_QUEUE}, cluster.settings()) == set()
        assert wanted({DEFAULT_QUEUE}, None) == {ids["leaf1"], ids["leaf2"]}
        conn.rollback()


def test_a_worker_without_queues_consumes_every_shards_collections_and_cycles(cluster: Cluster) -> None:
    settings = load_settings(database_url=cluster.control_url, shards=cluster.settings().model_dump())
    assert worker_queues(settings) == [DEFAULT_QUEUE, collect_queue("a"), collect_queue("b"), detect_queue("a"),
                                       detect_queue("b")]
    assert worker_queues(load_settings(database_url=cluster.control_url)) == [DEFAULT_QUEUE]


@dataclass
class Bed:
    cluster: Cluster
    agents: dict[str, Peer]
    redis: PrivateRedis
    endpoints: dict[str, int]  # switch -> endpoint id


@pytest.fixture(scope="module")
def bed(cluster: Cluster, tmp_path_factory: pytest.TempPathFactory) -> Iterator[Bed]:
    agents = {name: start_snmpsim({"arista": ARISTA}) for name in (SWITCH_A, SWITCH_B)}  # one each: single-threaded
    redis = PrivateRedis(tmp_path_factory.mktemp("redis")).start()
    try:
        load_inventory(cluster.control_url, [_switch(SWITCH_A, "p1", agents[SWITCH_A].port),
                                             _switch(SWITCH_B, "p2", agents[SWITCH_B].port)])
        apply(cluster.topology())  # the shards get the new switches' inventory
        with cluster.engine.connect() as conn:
            endpoints = dict(conn.execute(text("SELECT d.name, e.id FROM endpoints e JOIN devices d "
                                               "ON d.id = e.device_id WHERE d.name LIKE 'cq-%'")).all())
        yield Bed(cluster, agents, redis, endpoints)
    finally:
        redis.stop()
        for peer in agents.values():
            peer.close()


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, workers: list[CountingWorker]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        for w in workers:
            assert w.alive(), f"a worker exited waiting for {what}:\n{w.tail()}"
        time.sleep(0.5)
    raise AssertionError(f"timed out waiting for {what}:\n" + "\n".join(w.tail(2000) for w in workers))


def _spooled_files(w: CountingWorker) -> list[Path]:
    return sorted(w.spool_dir.rglob("*.json")) if w.spool_dir.exists() else []


def test_one_shard_down_the_others_collections_land_and_its_own_catch_up(bed: Bed, tmp_path: Path) -> None:
    """Shard b stopped: worker A goes on storing shard a's switch on shard a; worker B collects shard b's
    switch and spools each collection under b's spool. Shard b back: worker B replays its spool, and every
    sample either worker collected is on its switch's shard, none lost, none on the other shard."""
    cluster = bed.cluster
    shards = cluster.settings()
    env = {COMMUNITY_ENV: "arista", "FABRICWATCH_SHARDS_URLS": json.dumps(shards.urls),
           "FABRICWATCH_SHARDS_PODS": json.dumps(shards.pods)}
    (tmp_path / "a").mkdir()
    (tmp_path / "b").mkdir()
    worker_a = CountingWorker(tmp_path / "a", database_url=cluster.control_url, redis_url=bed.redis.url,
                              queues=f"{DEFAULT_QUEUE},{collect_queue('a')}", beat=True, concurrency=1,
                              extra_env=env, name="worker-a")
    worker_b = CountingWorker(tmp_path / "b", database_url=cluster.control_url, redis_url=bed.redis.url,
                              queues=collect_queue("b"), beat=False, concurrency=1, extra_env=env, name="worker-b")
    workers = [worker_a, worker_b]
    ep_a, ep_b = bed.endpoints[SWITCH_A], bed.endpoints[SWITCH_B]

    def stored(w: CountingWorker, ep: int) -> list[dict[str, Any]]:
        return [e for e in w.events().of("stored") if e["ep"] == ep]

    worker_b.start()
    worker_a.start()
    try:
        # each shard's switch stored by its own shard's worker (slow start on a busy machine)
        _wait(lambda: len(stored(worker_a, ep_a)) >= 2 and len(stored(worker_b, ep_b)) >= 2, 240,
              "both switches stored twice", workers)
        cluster.shard_b.stop()
        down_at_ms = int(time.time() * 1000)
        try:
            _wait(lambda: len([e for e in worker_b.events().of("spooled") if e["t_ms"] > down_at_ms]) >= 3
                  and len([e for e in stored(worker_a, ep_a) if e["t_ms"] > down_at_ms]) >= 3, 180,
                  "b's collections spooled and a's stored while b is down", workers)
            assert _spooled_files(worker_b), "nothing waits in worker B's spool"
            assert all(p.parent == worker_b.spool_dir / "shards" / "b" for p in _spooled_files(worker_b))
            assert not _spooled_files(worker_a)  # shard a's writes never waited on shard b
        finally:
            cluster.shard_b.start()
        up_at_ms = int(time.time() * 1000)
        # back: worker B's next task drains its spool, then stores fresh collections again
        _wait(lambda: not _spooled_files(worker_b)
              and any(e["t_ms"] > up_at_ms for e in stored(worker_b, ep_b)), 180, "b's spool replayed", workers)
    finally:
        for w in workers:
            w.stop()

    # each worker collected only its own shard's switch: the dispatcher sent each to its shard's queue
    collected = {name: w.events().of("collected") for name, w in (("a", worker_a), ("b", worker_b))}
    assert {e["ep"] for e in collected["a"]} == {ep_a} and {e["ep"] for e in collected["b"]} == {ep_b}
    spooled = worker_b.events().of("spooled")
    assert spooled and not worker_a.events().of("spooled")
    # nothing lost: every sample collected is on its switch's shard; nothing on the other shard
    a_url, b_url = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    ports = set(arista_ports())
    for switch, events, home, other in ((SWITCH_A, collected["a"], a_url, b_url),
                                        (SWITCH_B, collected["b"], b_url, a_url)):
        # sensor readings named by sensor, not by an inventory port, are refused by design (tests/faults/peers.py)
        produced = {tuple(k) for e in events for k in e["samples"] if k[2] is None or k[2] in ports}
        rows = stored_keys(home, [switch])
        on_home = set(rows)
        assert len(rows) == len(on_home), f"{switch}: a sample stored twice"  # a replay stores nothing again
        missing = produced - on_home
        assert not missing, f"{switch}: {len(missing)} of {len(produced)} collected samples not stored"
        assert on_home == produced  # nothing stored that no collector produced
        assert not stored_keys(other, [switch])
    # the collections spooled while b was down are among those stored (the check above, narrowed to them)
    spooled_starts = {e["started_ms"] for e in spooled}
    replayed = {tuple(k) for e in collected["b"] if e["started_ms"] in spooled_starts for k in e["samples"]
                if k[2] is None or k[2] in ports}
    assert replayed and replayed <= set(stored_keys(b_url, [SWITCH_B]))
    print(f"\nshard b down {(up_at_ms - down_at_ms) / 1000:.1f} s: worker A stored {len(stored(worker_a, ep_a))} "
          f"collections of {SWITCH_A}, worker B spooled {len(spooled)} of {SWITCH_B} and stored "
          f"{len(stored(worker_b, ep_b))} (replays included); samples on b {len(stored_keys(b_url, [SWITCH_B]))}")
