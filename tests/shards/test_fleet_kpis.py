"""The KPIs across shards (three real servers, tests/shards/conftest.py) aggregate on the shards: each shard
sends partial aggregates per (group, bucket) and per port (service/kpis/sharded.py), never samples, and the
merged report equals one server's with the same inventory, links and samples, for every scope (groups that
span shards included, compressed chunks included)."""

from __future__ import annotations

import random
import re
from collections.abc import Iterator
from dataclasses import asdict, dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import Engine, text

from service.db import get_engine
from service.kpis import sharded
from service.kpis.service import KpiReport, Scope, fabric_kpis, members
from service.migrate import upgrade
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from service.telemetry.compress import run_compression
from service.telemetry.samples import Sample
from tests.shards.conftest import Cluster, load_inventory

pytestmark = pytest.mark.timeout(300)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
N = 540  # 90 minutes every 10 s: the first hour is compressed into chunks
PORTS = [(d, p) for d in ("leaf1", "leaf2", "host3", "spine1") for p in ("eth0", "eth1")]
# links across the shards (a: leaf1 p1, spine1 no pod; b: leaf2 p2, host3 p3) and one within shard b
LINKS = [("leaf1:eth1", "leaf2:eth1"), ("spine1:eth0", "leaf2:eth0"), ("spine1:eth1", "host3:eth1"),
         ("leaf1:eth0", "host3:eth0")]
RANGE = {"start": T0 + timedelta(minutes=20), "end": T0 + timedelta(minutes=80)}


def _samples() -> list[Sample]:
    """Counters with random rates per port (a reset on one port), PFC on two priorities, ECN, CNP,
    oper status that goes down for a while on some ports (a NaN reading on one), and link-down events."""
    rnd = random.Random(20)
    out: list[Sample] = []
    for k, (dev, port) in enumerate(PORTS):
        tx = pause = ecn = cnp = flaps = 0.0
        prio = [0.0, 0.0]
        offset = (k % 3) * 3_000  # ports polled at different times
        for i in range(N):
            t = T0_MS + offset + i * 10_000
            tx += rnd.uniform(0, 10) * 1.25e9 * 10 / 10  # 0-10 Gbit/s
            if dev == "leaf2" and port == "eth0" and i == 300:
                tx = 0.0  # a counter reset
            pause += rnd.choice((0.0, 0.0, rnd.uniform(0, 2)))
            ecn += rnd.randrange(0, 500)
            cnp += rnd.randrange(0, 50)
            prio = [prio[0] + rnd.randrange(0, 30), prio[1] + rnd.randrange(0, 10)]
            up = 0.0 if (k % 4 == 1 and 100 <= i < 160 + 10 * k) else 1.0
            if up == 0.0 and i == 100:
                flaps += 1
            out += [Sample("port_tx_bytes_total", tx, t, dev, port),
                    Sample("port_pfc_rx_pause_seconds_total", pause, t, dev, port),
                    Sample("port_ecn_marked_packets_total", ecn, t, dev, port),
                    Sample("port_cnp_sent_total", cnp, t, dev, port),
                    Sample("port_oper_up", float("nan") if (k == 2 and i == 250) else up, t, dev, port),
                    Sample("port_link_down_events_total", flaps, t, dev, port)]
            out += [Sample("port_pfc_rx_pause_frames_total", v, t, dev, port, priority=p)
                    for p, v in zip((3, 4), prio, strict=True)]
    return out


def _prepare(engine: Engine) -> None:
    """Speeds and links on a database with load_inventory's devices."""
    with engine.begin() as conn:
        conn.execute(text("UPDATE ports SET speed_gbps = CASE WHEN name = 'eth0' THEN 100 ELSE 400 END, "
                          "rail = CASE WHEN name = 'eth0' THEN 0 ELSE 1 END"))
        ports = dict(conn.execute(text("SELECT d.name || ':' || p.name, p.id FROM ports p "
                                       "JOIN devices d ON d.id = p.device_id")).all())
        for a, b in LINKS:
            conn.execute(text("INSERT INTO links (a_port_id, b_port_id, cable_type) VALUES (:a, :b, 'aoc')"),
                         {"a": ports[a], "b": ports[b]})


def _compress(url: str) -> None:
    run = run_compression(get_engine(url), now=T0 + timedelta(hours=2), hot_s=3600.0)
    assert run.done_until is None or run.done_until <= T0 + timedelta(hours=1)
    with get_engine(url).connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_chunks")).scalar_one() > 0


@dataclass
class Pair:
    cluster: Cluster
    single_url: str


@pytest.fixture(scope="module")
def pair(cluster: Cluster) -> Iterator[Pair]:
    _prepare(cluster.engine)
    topology = cluster.topology()
    apply(topology)
    batch = _samples()
    report = ingest_samples(control=cluster.engine, topology=topology, samples=batch)
    assert report.errors == {} and report.reports["a"].written and report.reports["b"].written
    single_url = cluster.control.create_database("fw_single_kpis")
    upgrade(single_url)
    single = get_engine(single_url)
    load_inventory(single)
    _prepare(single)
    assert ingest_samples(control=single, topology=Topology.of(single_url, ShardSettings()),
                          samples=batch).errors == {}
    for url in (cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard"), single_url):
        _compress(url)
    yield Pair(cluster, single_url)
    single.dispose()


def _kpis(pair: Pair, sharded_: bool, scope: Scope, step_s: float) -> KpiReport:
    url = pair.cluster.control_url if sharded_ else pair.single_url
    with get_engine(url).connect() as conn:
        return fabric_kpis(conn=conn, scope=scope, step_s=step_s, top=3,
                           topology=pair.cluster.topology() if sharded_ else None, **RANGE)


def _approx(x: Any) -> Any:
    """Floats compared to 1e-9 relative: the shards' sums are added in another order."""
    if isinstance(x, float):
        return pytest.approx(x, rel=1e-9, abs=1e-12)
    if isinstance(x, dict):
        return {k: _approx(v) for k, v in x.items()}
    if isinstance(x, list):
        return [_approx(v) for v in x]
    return x


@pytest.mark.parametrize("scope", list(Scope))
def test_kpis_across_shards_equal_one_servers(pair: Pair, scope: Scope) -> None:
    for step in (600.0, 3600.0):
        got, want = _kpis(pair, True, scope, step), _kpis(pair, False, scope, step)
        assert want.utilization and want.congestion and want.availability, scope
        assert got.missing_pods == [] and want.source == got.source == "samples"
        assert got.labels == want.labels
        for kpi in ("utilization", "congestion", "availability"):
            g = [asdict(p) for p in getattr(got, kpi)]
            w = [asdict(p) for p in getattr(want, kpi)]
            assert [(p["group"], p["bucket"]) for p in g] == [(p["group"], p["bucket"]) for p in w], (scope, kpi)
            assert [p["values"] for p in g] == _approx([p["values"] for p in w]), (scope, kpi)
        assert {k: [asdict(p) for p in v] for k, v in got.worst_ports.items()} == \
            _approx({k: [asdict(p) for p in v] for k, v in want.worst_ports.items()}), scope
    # groups that span the shards are in it: a link across them, and the fabric
    if scope is Scope.FABRIC:
        assert {p.group for p in got.utilization} == {"fabric"}


def test_the_p95_of_a_group_spanning_shards_needs_values_of_both(pair: Pair) -> None:
    """The fabric's p95 interpolates between values that lie on different shards here (checked), and still
    equals percentile_cont's on one server."""
    got, want = _kpis(pair, True, Scope.FABRIC, 3600.0), _kpis(pair, False, Scope.FABRIC, 3600.0)
    assert [p.values["utilization_p95"] for p in got.utilization] == \
        _approx([p.values["utilization_p95"] for p in want.utilization])
    assert sharded.p95_of([5.0, 4.0, 3.0], 21) == pytest.approx(4.0)  # 0.95 * 20 = 19: the 2nd largest
    assert sharded.p95_of([5.0, 4.0, 3.0], 22) == pytest.approx(3.95)  # 19.95: the 3rd largest and 0.95 of the way up
    assert sharded.p95_rank(1) == (0.0, 1) and sharded.p95_rank(22) == (pytest.approx(19.95), 3)


def _shard_plan(pair: Pair, shard: str, sql: str, params: dict[str, Any]) -> str:
    url = (pair.cluster.shard_a if shard == "a" else pair.cluster.shard_b).url("fw_shard")
    with get_engine(url).begin() as conn:
        conn.execute(text(f"CREATE TEMP TABLE {sharded.UTIL_TABLE} (grp text NOT NULL, bucket timestamptz "
                          f"NOT NULL, bits float8, cap float8, util float8) ON COMMIT DROP"))
        conn.execute(text(sharded._staged(sharded.util_sql(), 0)), params)
        plan = "\n".join(conn.execute(text("EXPLAIN (ANALYZE, VERBOSE, COSTS OFF, TIMING OFF) " + sql),
                                      params).scalars())
        conn.rollback()
    return plan


def _top_rows(plan: str) -> int:
    return int(re.search(r"rows=(\d+)", plan.splitlines()[0]).group(1))  # type: ignore[union-attr]


def test_what_a_shard_sends_is_aggregates_not_samples(pair: Pair) -> None:
    """Each shard's KPI queries end in an aggregate whose rows are the (group, bucket) pairs, or per port and
    metric, from many times as many intervals read (EXPLAIN ANALYZE VERBOSE on the shard)."""
    with pair.cluster.engine.connect() as conn:
        ports = [m for m in members(conn, Scope.POD) if m.pod in ("p2", "p3")]
    params = sharded.shard_params(["p2", "p3"], ports, step_s=1200.0, max_gap_s=900.0, **RANGE)
    for sql, top_node, most in (
            (sharded.UTIL_PARTS_SQL, "Aggregate", 2 * 3),  # at most groups p2 and p3 x 3 buckets (2 here)
            (sharded.congestion_sql(), "Aggregate", 2 * 3 * 4),  # and 4 metrics (6 here)
            (sharded.availability_sql(), "Aggregate", 2 * 3),  # (2 here)
            (sharded.worst_sql(), "Subquery Scan", 3 * 4)):  # the top 3 ports of each metric (9 here)
        plan = _shard_plan(pair, "b", sharded._staged(sql, 0), params | {"top": 3})  # rows and blocks alone
        lines = plan.splitlines()
        sent = _top_rows(plan)
        assert top_node in lines[0] and 0 < sent <= most, plan
        # what it read below: at least every interval of one metric in the range (b's 4 ports, the 20 minutes
        # of rows at 10 s; 477 and 3,367 rows here), many times what it sends
        assert max(int(n) for n in re.findall(r"rows=(\d+)", plan)) >= 4 * 120 - 4 >= 20 * sent, plan
        assert re.search(r"Scan on public\.(samples_p|sample_blocks)|" + sharded.UTIL_TABLE, plan), plan


def test_the_control_database_reads_no_samples_for_the_kpis(pair: Pair) -> None:
    """Its session opens no postgres_fdw connection: no fleet table is read (before, every sample of the
    range came through fleet.rows, blocks and chunks and was aggregated on the control database)."""
    with pair.cluster.engine.connect() as conn:
        conn.execute(text("SELECT postgres_fdw_disconnect_all()"))  # what this pooled session opened before
        fabric_kpis(conn=conn, scope=Scope.POD, step_s=1200.0, topology=pair.cluster.topology(), **RANGE)
        assert conn.execute(text("SELECT count(*) FROM postgres_fdw_get_connections()")).scalar_one() == 0


def test_kpis_with_a_shard_down_name_its_pods_and_keep_the_others_whole(pair: Pair) -> None:
    whole = _kpis(pair, True, Scope.POD, 3600.0)
    pair.cluster.shard_b.stop()
    try:
        rep = _kpis(pair, True, Scope.POD, 3600.0)
    finally:
        pair.cluster.shard_b.start()
    assert rep.missing_pods == ["p2", "p3"]
    # pod p1's group holds its own ports and the pod-less spine's peers in p1: all on shard a
    assert [asdict(p) for p in rep.utilization if p.group == "p1"] == \
        [asdict(p) for p in whole.utilization if p.group == "p1"]
    assert {p.group for p in rep.utilization} <= {"p1", "p2", "p3"}
