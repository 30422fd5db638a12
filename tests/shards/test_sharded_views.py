"""The views that read telemetry or detector state of one device or target, across shards (three real servers,
tests/shards/conftest.py): `GET /devices/{name}` (each port's latest oper status, from the device's shard),
`GET /targets` (the detector's blocked rules, from each device's shard's detector state) and the detector
gauges of `/api/v1/metrics` (one per shard). Each answers as a single server does with the same inventory,
samples and detection cycle; with a shard stopped, its pods are named, never passed off as empty."""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

import pytest
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from service.db import get_engine
from service.migrate import upgrade
from service.pipeline import run_cycle
from service.shards import fleet
from service.shards.detection import run_shard_cycle
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from service.telemetry.samples import Sample
from tests.shards.conftest import Cluster, load_inventory

pytestmark = pytest.mark.timeout(300)

T0_MS = int(datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp() * 1000)
N = 60  # 10 minutes every 10 s
AT_MS = T0_MS + N * 10_000 + 60_000  # the detection cycle's data time
ATTEMPT = datetime(2026, 11, 30, 12, 10, tzinfo=UTC)
# what each target's last collection found: state and counters expected, both arrived
COVERAGE = ('{"expected": ["state", "counters"], "mode": "poll", "groups": {'
            '"state": {"samples": 4, "missing_polls": 0, "reason": null, "at_ms": 1}, '
            '"counters": {"samples": 4, "missing_polls": 0, "reason": null, "at_ms": 1}}}')


def _samples() -> list[Sample]:
    out = []
    for i in range(N):
        t = T0_MS + i * 10_000
        for dev in ("leaf1", "leaf2", "host3", "spine1"):
            out.append(Sample("port_tx_bytes_total", 1e6 * i, t, dev, "eth0"))
            out.append(Sample("port_rx_bytes_total", 1e6 * i, t, dev, "eth0"))
        # the link leaf1:eth1 <-> leaf2:eth1 crosses shards: up at leaf1, down at leaf2
        out += [Sample("port_oper_up", 1.0, t, "leaf1", "eth1"), Sample("port_oper_up", 0.0, t, "leaf2", "eth1"),
                Sample("port_oper_up", 1.0, t, "host3", "eth1"), Sample("port_oper_up", 1.0, t, "spine1",
                                                                                  "eth0")]
    return out


def _prepare(engine: Engine) -> None:
    """The link, an SNMP target per device with its last collection, on a database with load_inventory's."""
    with engine.begin() as conn:
        ports = dict(conn.execute(text("SELECT d.name || ':' || p.name, p.id FROM ports p "
                                       "JOIN devices d ON d.id = p.device_id")).all())
        conn.execute(text("INSERT INTO links (a_port_id, b_port_id, cable_type) VALUES (:a, :b, 'aoc')"),
                     {"a": ports["leaf1:eth1"], "b": ports["leaf2:eth1"]})
        conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, port, config) "
                          "SELECT id, 'snmp', '127.0.0.1', 161, '{}' FROM devices"))
        conn.execute(text("INSERT INTO target_status (endpoint_id, last_attempt, last_success, samples, "
                          "consecutive_failures, coverage) SELECT id, :at, :at, 8, 0, CAST(:cov AS jsonb) "
                          "FROM endpoints"), {"at": ATTEMPT, "cov": COVERAGE})


@dataclass
class Pair:
    cluster: Cluster
    single_url: str  # the same inventory, samples and cycle on one server

    def client(self, sharded: bool) -> TestClient:
        if sharded:
            settings = load_settings(database_url=self.cluster.control_url, auth_required=False,
                                     shards=self.cluster.settings().model_dump())
        else:
            settings = load_settings(database_url=self.single_url, auth_required=False)
        return TestClient(create_app(settings))


@pytest.fixture(scope="module")
def pair(cluster: Cluster) -> Iterator[Pair]:
    _prepare(cluster.engine)
    topology = cluster.topology()
    apply(topology)
    report = ingest_samples(control=cluster.engine, topology=topology, samples=_samples())
    assert report.errors == {} and report.reports["a"].written and report.reports["b"].written
    for shard in ("a", "b"):
        run_shard_cycle(topology, shard, AT_MS)

    single_url = cluster.control.create_database("fw_single")
    upgrade(single_url)
    single = get_engine(single_url)
    load_inventory(single)
    _prepare(single)
    one = Topology.of(single_url, ShardSettings())
    assert ingest_samples(control=single, topology=one, samples=_samples()).errors == {}
    run_cycle(single, AT_MS)
    yield Pair(cluster, single_url)
    single.dispose()


def _device(client: TestClient, name: str) -> Any:
    r = client.get(f"/api/v1/devices/{name}")
    assert r.status_code == 200, r.text
    return r


def _without_times(body: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in body.items() if k != "updated_at"}


def _blocked(client: TestClient) -> tuple[dict[str, Any], Any]:
    r = client.get("/api/v1/targets")
    assert r.status_code == 200, r.text
    return {t["device"]: t["coverage"]["blocked_rules"] for t in r.json()["targets"]}, r


def _detector_gauges(client: TestClient) -> dict[tuple[str, str], float]:
    out = {}
    for fam in text_string_to_metric_families(client.get("/api/v1/metrics").text):
        if fam.name.startswith(("fabricwatch_detection_", "fabricwatch_shard_up")):
            for s in fam.samples:
                out[(s.name, s.labels.get("shard", ""))] = s.value
    return out


def test_a_device_reads_its_ports_oper_status_from_its_shard(pair: Pair) -> None:
    sharded, single = pair.client(sharded=True), pair.client(sharded=False)
    for name in ("leaf1", "leaf2", "host3", "spine1"):
        got, want = _device(sharded, name), _device(single, name)
        assert got.headers[fleet.MISSING_HEADER] == "" and got.json()["missing_pods"] == [], name
        assert _without_times(got.json()) == _without_times(want.json()), name
    oper = {p["name"]: p["oper_up"] for p in _device(sharded, "leaf2").json()["ports"]}
    assert oper == {"eth0": None, "eth1": False}  # from shard b: the control database has no samples
    assert {p["name"]: p["oper_up"] for p in _device(sharded, "host3").json()["ports"]} == {"eth0": None, "eth1": True}


def test_targets_blocked_rules_come_from_each_devices_shard(pair: Pair) -> None:
    got, r = _blocked(pair.client(sharded=True))
    want, _ = _blocked(pair.client(sharded=False))
    assert r.headers[fleet.MISSING_HEADER] == "" and r.json()["missing_pods"] == []
    assert got == want
    assert all(v is not None for v in got.values()) and any(got.values()), got  # each shard's state was read


def test_detector_gauges_per_shard(pair: Pair) -> None:
    got = _detector_gauges(pair.client(sharded=True))
    want = _detector_gauges(pair.client(sharded=False))
    assert want[("fabricwatch_detection_data_timestamp_seconds", "")] == AT_MS / 1000
    for shard in ("a", "b"):
        assert got[("fabricwatch_detection_data_timestamp_seconds", shard)] == AT_MS / 1000
        assert got[("fabricwatch_detection_last_cycle_timestamp_seconds", shard)] > 0
        assert got[("fabricwatch_shard_up", shard)] == 1
    assert ("fabricwatch_detection_data_timestamp_seconds", "") not in got
    # every series the sharded deployment's example rules read is exposed here
    from tests.paths import REPO

    rules = (REPO / "examples/prometheus/fabricwatch-shards.rules.yml").read_text()
    wanted = set(re.findall(r"\b(fabricwatch_[a-z_]+)", rules))
    assert wanted and wanted <= {name for name, _ in got}, wanted


def test_a_stopped_shard_is_named_never_silently_empty(pair: Pair) -> None:
    client = pair.client(sharded=True)
    whole_leaf1 = _device(client, "leaf1").json()
    whole_blocked, _ = _blocked(client)
    pair.cluster.shard_b.stop()
    try:
        leaf2, leaf1 = _device(client, "leaf2"), _device(client, "leaf1")
        blocked, targets = _blocked(client)
        one_target = client.get("/api/v1/targets", params={"device": "leaf1"})
        gauges = _detector_gauges(client)
    finally:
        pair.cluster.shard_b.start()
    # the device of the stopped shard: its inventory, its oper status unknown and its pod named
    assert leaf2.headers[fleet.MISSING_HEADER] == "p2" and leaf2.json()["missing_pods"] == ["p2"]
    assert [p["oper_up"] for p in leaf2.json()["ports"]] == [None, None]
    assert [p["peer"] for p in leaf2.json()["ports"]][1]["device"] == "leaf1"
    # a device of the other shard answers whole
    assert leaf1.headers[fleet.MISSING_HEADER] == "" and leaf1.json() == whole_leaf1
    # targets: the stopped shard's devices have no blocked rules to show, and their pods are named
    assert targets.headers[fleet.MISSING_HEADER] == "p2,p3" and targets.json()["missing_pods"] == ["p2", "p3"]
    assert blocked["leaf2"] is None and blocked["host3"] is None
    assert blocked["leaf1"] == whole_blocked["leaf1"] and blocked["spine1"] == whole_blocked["spine1"]
    assert one_target.json()["missing_pods"] == []  # leaf1's shard answered
    # metrics: shard b is down, its detection gauges absent rather than stale; shard a's are there
    assert gauges[("fabricwatch_shard_up", "b")] == 0 and gauges[("fabricwatch_shard_up", "a")] == 1
    assert ("fabricwatch_detection_data_timestamp_seconds", "b") not in gauges
    assert gauges[("fabricwatch_detection_data_timestamp_seconds", "a")] == AT_MS / 1000


# --- one device or one pod: only its shard is scanned ----------------------------------------------------

def _prepared(conn: Any, sql: str, params: dict[str, Any]) -> str:
    """EXPLAIN VERBOSE of `sql` as a prepared statement under a generic plan: what the plan cache may settle
    on after a session's fifth run of it, the pods known at executor start only."""
    from psycopg import sql as psql

    names = list(dict.fromkeys(re.findall(r"(?<![:\w]):(\w+)", sql)))
    prepared = re.sub(r"(?<![:\w]):(\w+)", lambda m: f"${names.index(m.group(1)) + 1}", sql)
    raw = conn.connection.driver_connection
    args = ", ".join(psql.Literal(params[n]).as_string(raw) for n in names)
    conn.execute(text("SET LOCAL plan_cache_mode = force_generic_plan"))
    conn.exec_driver_sql("PREPARE fw_one AS " + prepared)
    try:
        return "\n".join(r[0] for r in conn.exec_driver_sql(f"EXPLAIN (VERBOSE, COSTS OFF) EXECUTE fw_one({args})"))
    finally:
        conn.exec_driver_sql("DEALLOCATE fw_one")


def _shards_scanned(plan: str) -> set[str]:
    return set(re.findall(r"fleet\.\w+__(\w+)", plan))


def test_one_devices_reads_scan_only_its_shard(pair: Pair) -> None:
    """leaf2 (pod p2, shard b): the plans of every read of one device or one pod name b's partitions alone
    when planned for the pods they name, which read_fleet makes every plan; a generic plan could not prune
    `pod = ANY($1)` at all (why: it scans both)."""
    from service.fleet.service import _FLEET_OPER_SQL as POD_OPER_SQL
    from service.inventory.views import _FLEET_DOM_SQL, _FLEET_OPER_SQL

    control = pair.cluster.engine
    with control.connect() as conn:
        ports = list(conn.execute(text("SELECT p.id FROM ports p JOIN devices d ON d.id = p.device_id "
                                       "WHERE d.name = 'leaf2'")).scalars())
        found = conn.execute(text("SELECT pod, series_id FROM fleet.series WHERE device = 'leaf2'")).all()
        pod_shard = fleet.pod_map(conn)
    which, by_shard = fleet._which(found, pod_shard)
    day = {"lo": datetime(2026, 11, 30, tzinfo=UTC), "hi": datetime(2026, 12, 1, tzinfo=UTC)}
    reads = {
        "/devices/{name}": (_FLEET_OPER_SQL, {"pods": ["p2"], "ports": ports}),
        "/series (its series)": (fleet._FLEET_SERIES_SQL, {
            "pods": ["p2"], "metric": "port_tx_bytes_total", "device": "leaf2", "port": None, "lane": None,
            "priority": None, "gpu": None, "limit": 1000}),
        "/series (its rows)": (fleet.rows_sql(which), by_shard | day),
        "/topology?pod=": (POD_OPER_SQL, {"pods": ["p2"], "metrics": ["port_oper_up"]}),
        "/optics?device=": (_FLEET_DOM_SQL, {"pods": ["p2"], "metrics": ["optic_rx_power_dbm"], "ports": ports}),
    }
    for what, (sql, params) in reads.items():
        with control.begin() as conn:
            custom = "\n".join(conn.execute(text("EXPLAIN (VERBOSE, COSTS OFF) " + sql), params).scalars())
            generic = _prepared(conn, sql, params)
        assert _shards_scanned(custom) == {"b"}, (what, custom)
        assert _shards_scanned(generic) == {"a", "b"}, (what, generic)
    with control.connect() as conn:  # the /series read's one COPY (rows, blocks, chunks)
        plan = fleet.explain_read(conn, found, pod_shard, day["lo"], day["hi"])
    assert _shards_scanned(plan) == {"b"}, plan
    with control.connect() as conn:
        modes, _ = fleet.read_fleet(conn, pair.cluster.topology(), lambda pods, _: conn.execute(
            text("SHOW plan_cache_mode")).scalar_one(), asked={"p2"})
    assert modes == "force_custom_plan"


def test_one_devices_reads_ask_only_its_shard_under_generic_plans(pair: Pair) -> None:
    """The case of docs/benchmarks.md's 39/90/127 ms: a session that ran fleet-wide reads of the same text
    (/series' lookup) may get a generic plan from the plan cache, which asked every shard. Generic plans
    forced for every control session here: with shard a stopped, reads of leaf2 (shard b) must not notice,
    since shard a is never asked."""
    control = pair.cluster.engine
    with control.begin() as conn:
        conn.execute(text("ALTER DATABASE fw_control SET plan_cache_mode = force_generic_plan"))
    control.dispose()  # new sessions take the setting
    client = pair.client(sharded=True)
    day = {"start": "2026-11-30T12:00:00Z", "end": "2026-11-30T12:10:00Z"}
    pair.cluster.shard_a.stop()
    try:
        for _ in range(2):
            r = client.get("/api/v1/series", params={"metric": "port_tx_bytes_total", "device": "leaf2", **day})
            assert r.status_code == 200, r.text
            assert r.json()["missing_pods"] == [] and len(r.json()["series"]) == 1, r.text
            assert _device(client, "leaf2").json()["missing_pods"] == []
            for path, params in (("/api/v1/topology", {"pod": "p2"}), ("/api/v1/optics", {"device": "leaf2"})):
                r = client.get(path, params=params)
                assert r.status_code == 200 and r.json()["missing_pods"] == [], (path, r.text)
        assert "a" not in fleet._DOWN, fleet._DOWN  # no read failed on shard a
    finally:
        pair.cluster.shard_a.start()
        with control.begin() as conn:
            conn.execute(text("ALTER DATABASE fw_control RESET plan_cache_mode"))
        control.dispose()
