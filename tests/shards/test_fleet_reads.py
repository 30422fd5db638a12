"""Fleet-wide reads on a control database and two telemetry shards (three real servers): the KPIs, the fleet
summary and topology, and long `/series` ranges from the shards' rollups, through the postgres_fdw fleet
tables with the pod and time conditions sent to the shards (asserted on EXPLAIN VERBOSE plans); every such
response names the pods of a stopped shard (header and `missing_pods`); and Grafana's read-only role reads
the fleet tables through its own user mappings."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import text

from service.db import get_engine
from service.kpis.service import Scope, fabric_kpis
from service.shards import fleet
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.telemetry import service as telemetry
from service.telemetry.readcache import ROLLUPS
from service.telemetry.rollups import run_rollups
from service.telemetry.samples import Sample
from tests.shards.conftest import Cluster

pytestmark = pytest.mark.timeout(240)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
N = 180  # 30 minutes every 10 s
GBIT = 1e9 / 8  # bytes per second at 1 Gbit/s
LONG = (0.0, 1e9)  # level_after_s: any range longer than 0 s reads 5-minute rollups


def _samples() -> list[Sample]:
    out = []
    for i in range(N):
        t = T0_MS + i * 10_000
        # 1 and 2 Gbit/s on 100 Gbit/s ports: utilization 0.01 (p1, shard a) and 0.02 (p2, shard b)
        out += [Sample("port_tx_bytes_total", GBIT * 10 * i, t, "leaf1", "eth0"),
                Sample("port_tx_bytes_total", 2 * GBIT * 10 * i, t, "leaf2", "eth0"),
                # the link leaf1:eth1 <-> leaf2:eth1 crosses shards: up at leaf1, down at leaf2
                Sample("port_oper_up", 1.0, t, "leaf1", "eth1"),
                Sample("port_oper_up", 0.0, t, "leaf2", "eth1")]
    return out


@pytest.fixture(scope="module")
def loaded(cluster: Cluster) -> Cluster:
    with cluster.engine.begin() as conn:
        conn.execute(text("UPDATE ports SET speed_gbps = 100"))
        ports = dict(conn.execute(text("SELECT d.name || ':' || p.name, p.id FROM ports p "
                                       "JOIN devices d ON d.id = p.device_id")).all())
        conn.execute(text("INSERT INTO links (a_port_id, b_port_id, cable_type) VALUES (:a, :b, 'aoc')"),
                     {"a": ports["leaf1:eth1"], "b": ports["leaf2:eth1"]})
    apply(cluster.topology())
    report = ingest_samples(control=cluster.engine, topology=cluster.topology(), samples=_samples())
    assert report.errors == {} and report.reports["a"].written == report.reports["b"].written == 2 * N
    for shard in (cluster.shard_a, cluster.shard_b):  # each shard's own rollups, up to T0 + 1 h
        run_rollups(get_engine(shard.url("fw_shard")), now=T0 + timedelta(hours=1), lag_s=0, max_chunks=48)
    return cluster


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    fleet.recheck_now()
    ROLLUPS.clear()  # series ids repeat across the servers: no cached rollup rows of another one
    yield
    fleet.recheck_now()


def _plan(conn: Any, sql: str, params: dict[str, Any]) -> str:
    return "\n".join(conn.execute(text("EXPLAIN (VERBOSE, COSTS OFF) " + sql), params).scalars())


def _remote(plan: str) -> list[str]:
    return [line for line in plan.splitlines() if "Remote SQL" in line]


# --- rollups ---------------------------------------------------------------------------------------------

def _fleet_series(cluster: Cluster, **kw: Any) -> tuple[dict[str, list[Any]], fleet.Reach]:
    with cluster.engine.connect() as conn:
        got, seen = fleet.query_series(conn=conn, topology=cluster.topology(), metric="port_tx_bytes_total",
                                       **kw)
    return {r.device: r.points for r in got}, seen


def _local_series(url: str, device: str, **kw: Any) -> list[Any]:
    ROLLUPS.clear()
    with get_engine(url).connect() as conn:
        got = telemetry.query_series(conn=conn, metric="port_tx_bytes_total", device=device, **kw)
    ROLLUPS.clear()
    return got[0].points


def test_a_long_range_reads_the_shards_rollups_as_one_server_would(loaded: Cluster) -> None:
    window = {"start": T0 - timedelta(minutes=10), "end": T0 + timedelta(hours=2), "step_s": 300.0,
              "level_after_s": LONG}
    got, seen = _fleet_series(loaded, **window)
    assert seen.missing == [] and sorted(got) == ["leaf1", "leaf2"]
    # the same points as each shard's own single-server read of its rollups
    assert got["leaf1"] == _local_series(loaded.shard_a.url("fw_shard"), "leaf1", **window)
    assert got["leaf2"] == _local_series(loaded.shard_b.url("fw_shard"), "leaf2", **window)
    assert [v for _, v in got["leaf2"]] == pytest.approx([2 * GBIT] * 6)
    # and they are the rollup rows: a rollup row changed on shard b shows in the fleet read
    bucket = T0 + timedelta(minutes=10)
    with get_engine(loaded.shard_b.url("fw_shard")).begin() as conn:
        changed = conn.execute(text("UPDATE rollup_5m SET increase = increase * 10 WHERE bucket = :b "
                                    "AND series_id = (SELECT s.id FROM series s JOIN devices d ON d.id = s.device_id "
                                    "WHERE d.name = 'leaf2' AND s.metric = 'port_tx_bytes_total')"),
                               {"b": bucket}).rowcount
    assert changed == 1
    try:
        got, _ = _fleet_series(loaded, **window)
        assert dict(got["leaf2"])[int(bucket.timestamp() * 1000)] == pytest.approx(20 * GBIT)
        assert [v for _, v in got["leaf1"]] == pytest.approx([GBIT] * 6)  # shard a's untouched
    finally:
        with get_engine(loaded.shard_b.url("fw_shard")).begin() as conn:
            conn.execute(text("UPDATE rollup_5m SET increase = increase / 10 WHERE bucket = :b AND increase > 0"),
                         {"b": bucket})


def test_rollups_before_the_earliest_watermark_then_raw_samples(loaded: Cluster) -> None:
    """Shard a's rollups stop earlier than shard b's: both are read from rollups up to a's watermark only,
    and from raw samples after it, so neither shard's series lacks a bucket."""
    a = get_engine(loaded.shard_a.url("fw_shard"))
    with a.begin() as conn:
        conn.execute(text("UPDATE rollup_watermarks SET done_until = :t WHERE level = '5m'"),
                     {"t": T0 + timedelta(minutes=15)})
        conn.execute(text("UPDATE rollup_watermarks SET done_until = :t WHERE level = '1h'"), {"t": T0})
    try:
        with loaded.engine.connect() as conn:
            marks = fleet.fleet_marks(conn, ["", "p1", "p2", "p3"])
        assert marks["5m"].done_until == T0 + timedelta(minutes=15)
        got, _ = _fleet_series(loaded, start=T0, end=T0 + timedelta(minutes=30), step_s=300.0, level_after_s=LONG)
        assert [v for _, v in got["leaf1"]] == pytest.approx([GBIT] * 6)
        assert [v for _, v in got["leaf2"]] == pytest.approx([2 * GBIT] * 6)
    finally:
        run_rollups(a, now=T0 + timedelta(hours=1), lag_s=0, max_chunks=48)


def test_rollup_and_latest_reads_send_pod_and_time_conditions_to_the_shard(loaded: Cluster) -> None:
    with loaded.engine.connect() as conn:
        found = conn.execute(text("SELECT pod, series_id FROM fleet.series WHERE pod = 'p2'")).all()
        which, params = fleet._which(found, fleet.pod_map(conn))
        params |= fleet._keys(found) | {"lo": T0, "hi": T0 + timedelta(hours=1)}
        plan = _plan(conn, fleet.rollup_sql("rollup_5m", which), params)
    assert "fleet.rollup_5m__b" in plan and "rollup_5m__a" not in plan, plan  # shard a pruned
    [remote] = _remote(plan)
    for condition in ("pod = ANY", "series_id = ANY", "bucket >= ", "bucket < "):
        assert condition in remote, plan
    # nothing of the pod, series and time conditions is left to filter on the control side (the join to the
    # series' index is the only condition there)
    assert [x.strip() for x in plan.splitlines() if "Filter:" in x] == [
        "Join Filter: ((t.pod = k.kpod) AND (t.series_id = k.ksid))"], plan
    with loaded.engine.connect() as conn:  # the summary's newest samples: pod and metric go to each shard
        plan = _plan(conn, fleet.latest_sql("AND rn = 1"), {"pods": ["p1", "p2"], "metrics": ["port_oper_up"]})
    remote = _remote(plan)
    assert len(remote) == 2 and plan.count("Async Foreign Scan") == 2, plan
    assert all("pod = ANY" in r and "metric = ANY" in r and "rn = 1" in r for r in remote), plan


# --- KPIs --------------------------------------------------------------------------------------------------

def _kpis(cluster: Cluster, scope: Scope) -> Any:
    with cluster.engine.connect() as conn:
        return fabric_kpis(conn=conn, scope=scope, start=T0, end=T0 + timedelta(minutes=30), step_s=1800,
                           topology=cluster.topology())


def test_kpis_across_shards(loaded: Cluster) -> None:
    rep = _kpis(loaded, Scope.POD)
    assert rep.missing_pods == []
    util = {p.group: p.values for p in rep.utilization}
    assert sorted(util) == ["p1", "p2"]
    assert util["p1"]["utilization_mean"] == pytest.approx(0.01)
    assert util["p2"]["utilization_mean"] == pytest.approx(0.02)
    assert util["p2"]["intervals"] == N - 1
    avail = {p.group: p.values["availability"] for p in rep.availability}
    assert avail == {"p1": pytest.approx(1.0), "p2": pytest.approx(0.0)}
    fabric = _kpis(loaded, Scope.FABRIC)
    assert [p.values["utilization_mean"] for p in fabric.utilization] == [pytest.approx(0.015)]
    assert [p.values["utilization_peak"] for p in fabric.utilization] == [pytest.approx(0.02)]


def test_kpis_with_a_shard_down_name_its_pods(loaded: Cluster) -> None:
    loaded.shard_b.stop()
    try:
        rep = _kpis(loaded, Scope.POD)
    finally:
        loaded.shard_b.start()
    assert rep.missing_pods == ["p2", "p3"]
    assert [p.group for p in rep.utilization] == ["p1"]
    assert rep.utilization[0].values["utilization_mean"] == pytest.approx(0.01)


# --- the API: every fleet-wide response names what it could not see -------------------------------------

def _client(cluster: Cluster) -> TestClient:
    from service.api.app import create_app
    from service.config import load_settings

    return TestClient(create_app(load_settings(database_url=cluster.control_url, auth_required=False,
                                               shards=cluster.settings().model_dump())))


_RANGE = {"start": T0.isoformat(), "end": (T0 + timedelta(minutes=30)).isoformat()}
_FLEET_WIDE = {
    "/api/v1/series": {"metric": "port_tx_bytes_total", **_RANGE},
    "/api/v1/kpis": {"scope": "pod", "step": 1800, **_RANGE},
    "/api/v1/summary": {},
    "/api/v1/topology": {},
}


def _get_all(client: TestClient) -> dict[str, Any]:
    out = {}
    for path, params in _FLEET_WIDE.items():
        r = client.get(path, params=params)
        assert r.status_code == 200, (path, r.text)
        out[path] = r
    return out


def test_every_fleet_wide_response_names_the_pods_of_a_stopped_shard(loaded: Cluster) -> None:
    client = _client(loaded)
    whole = _get_all(client)
    for path, r in whole.items():
        assert r.headers[fleet.MISSING_HEADER] == "" and r.json()["missing_pods"] == [], path
    # the cross-shard link is down at leaf2's end, which only shard b holds
    assert whole["/api/v1/summary"].json()["link_health"] == {"down": 1}
    [edge] = whole["/api/v1/topology"].json()["edges"]
    assert edge["health"] == "down" and "leaf2:eth1 oper down" in edge["reasons"]
    assert len(whole["/api/v1/series"].json()["series"]) == 2
    loaded.shard_b.stop()
    try:
        partial = _get_all(client)
        one_pod = client.get("/api/v1/topology", params={"pod": "p1"})  # a pod of shard a: whole
    finally:
        loaded.shard_b.start()
    for path, r in partial.items():
        assert r.headers[fleet.MISSING_HEADER] == "p2,p3" and r.json()["missing_pods"] == ["p2", "p3"], path
    assert partial["/api/v1/summary"].json()["link_health"] == {"ok": 1}  # leaf1's end alone
    assert [s["labels"]["device"] for s in partial["/api/v1/series"].json()["series"]] == ["leaf1"]
    assert [p["group"] for p in partial["/api/v1/kpis"].json()["utilization"]] == ["p1"]
    assert one_pod.status_code == 200 and one_pod.json()["missing_pods"] == []


# --- Grafana's role ------------------------------------------------------------------------------------------

def test_the_grafana_role_reads_the_fleet_tables(loaded: Cluster) -> None:
    """Migration 0150's read-only role gets SELECT on the fleet parents and a user mapping per shard from
    `apply`: as that role, a query through the fleet tables reaches both shards."""
    with loaded.engine.begin() as conn:
        conn.execute(text("SET LOCAL ROLE fabricwatch_grafana"))
        assert not conn.execute(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar_one()
        per_pod = dict(conn.execute(text("SELECT pod, count(*) FROM fleet.rows GROUP BY pod")).all())
        marks = conn.execute(text("SELECT count(*) FROM fleet.rollup_marks WHERE pod = ANY(ARRAY['p1', 'p2'])"))
        assert marks.scalar_one() == 4
        series = conn.execute(text("SELECT count(*) FROM fleet.series")).scalar_one()
    assert per_pod == {"p1": 2 * N, "p2": 2 * N} and series == 4
    with loaded.engine.begin() as conn:  # SELECT on the fleet tables only: the pod map stays unreadable
        conn.execute(text("SET LOCAL ROLE fabricwatch_grafana"))
        with pytest.raises(Exception, match="permission denied"):
            conn.execute(text("SELECT * FROM shard_pods"))


def test_the_documented_fleet_panel_query_runs_as_grafana(loaded: Cluster) -> None:
    """docs/dashboards.md's example panel over `fleet.latest`, as Grafana's role (`$pod` expanded)."""
    from tests.paths import REPO

    doc = (REPO / "docs/dashboards.md").read_text()
    sql = doc.split("## Sharded deployments", 1)[1].split("```sql\n", 1)[1].split("```", 1)[0]
    with loaded.engine.begin() as conn:
        conn.execute(text("SET LOCAL ROLE fabricwatch_grafana"))
        rows = conn.execute(text(sql.replace("$pod", "'p1', 'p2'"))).all()
    assert [tuple(r) for r in rows] == [("p1", 0, 1), ("p2", 1, 1)]


# --- which dashboard panels read what ------------------------------------------------------------------------

_TELEMETRY = ("series", "samples", "samples_between", "last_samples", "sample_rows", "sample_blocks", "rollup_5m",
              "rollup_1h", "missing_pods")
_OTHER = ("alerts", "alert_events", "drain_recommendations", "drain_breaker", "incidents", "incident_events",
          "nccl_runs", "nccl_results", "nccl_baselines", "target_status", "links", "devices", "ports", "optics")


def test_the_sharded_panel_table_in_the_docs_matches_the_dashboards() -> None:
    """docs/dashboards.md lists every panel with the tables it reads and whether it works when sharded."""
    import json
    import re

    from tests.paths import REPO

    want = set()
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text()).get("panels", []):
            for target in panel.get("targets", []):
                if not target.get("rawSql"):
                    continue
                words = set(re.findall(r"[a-z_]+", target["rawSql"].lower()))
                reads = [t for t in _TELEMETRY + _OTHER if t in words]
                sharded = "shards, through `fleet_grafana`" if set(reads) & set(_TELEMETRY) else "control database"
                want.add((path.name, panel["title"], ", ".join(f"`{t}`" for t in reads), sharded))
    doc = (REPO / "docs/dashboards.md").read_text().split("## Sharded deployments", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip().strip("|").split("|")] for line in doc.splitlines()
            if line.startswith("| `")]
    got = {(f.strip("`"), title, reads, sharded) for f, title, reads, sharded in rows}
    assert got == want

