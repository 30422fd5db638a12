"""A control database and two telemetry shards on real servers: the stored pod map, each shard's copy of its
inventory, writes routed to their shard, and a fleet-wide read through postgres_fdw foreign partitions, with
the pod and time conditions sent to the shards and a down shard's pods reported missing."""

from __future__ import annotations

import subprocess
from datetime import UTC, datetime, timedelta
from pathlib import Path

import numpy as np
import pytest
from sqlalchemy import text

from service.db import get_engine
from service.shards import fleet
from service.shards.ingest import ingest_samples
from service.shards.setup import PodMoved, apply, store_pod_map
from service.shards.topology import ShardSettings, ShardsUnavailable, Topology
from service.telemetry.chunk_codec import encode
from service.telemetry.samples import Sample
from tests.shards.conftest import Cluster
from tests.shards.pg_cluster import free_port

pytestmark = pytest.mark.timeout(180)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)


def _scalar(url: str, sql: str) -> object:
    with get_engine(url).connect() as conn:
        return conn.execute(text(sql)).scalar()


@pytest.fixture(scope="module")
def applied(cluster: Cluster) -> Cluster:
    apply(cluster.topology())
    return cluster


def test_apply_stores_the_pod_map_and_copies_each_shard_its_inventory(applied: Cluster) -> None:
    with applied.engine.connect() as conn:
        stored = dict(conn.execute(text("SELECT pod, shard FROM shard_pods")).all())
    assert stored == {"": "a", "p1": "a", "p2": "b", "p3": "b"}
    # (the fixture's devices: a test below loads one more)
    names = ("SELECT string_agg(name, ',' ORDER BY name) FROM devices "
             "WHERE name IN ('leaf1', 'leaf2', 'host3', 'spine1')")
    a = _scalar(applied.shard_a.url("fw_shard"), names)
    b = _scalar(applied.shard_b.url("fw_shard"), names)
    assert (a, b) == ("leaf1,spine1", "host3,leaf2")
    # the same ids as the control database's, so a series' device_id means the same device everywhere
    ids = _scalar(applied.control_url, "SELECT string_agg(id::text, ',' ORDER BY name) FROM devices "
                  "WHERE name IN ('leaf1', 'spine1')")
    assert _scalar(applied.shard_a.url("fw_shard"), "SELECT string_agg(id::text, ',' ORDER BY name) FROM devices "
                   "WHERE name IN ('leaf1', 'spine1')") == ids
    assert _scalar(applied.shard_b.url("fw_shard"), "SELECT count(*) FROM ports p JOIN devices d ON d.id = p.device_id "
                   "WHERE d.name IN ('leaf2', 'host3')") == 4
    # the shards' schema is the control's (one set of migrations)
    head = _scalar(applied.control_url, "SELECT version_num FROM alembic_version")
    assert _scalar(applied.shard_a.url("fw_shard"), "SELECT version_num FROM alembic_version") == head
    apply(applied.topology())  # again: nothing changes, nothing fails
    assert _scalar(applied.control_url, "SELECT count(*) FROM shard_pods WHERE pod IN ('', 'p1', 'p2', 'p3')") == 4


def test_a_pod_moved_by_the_setting_is_refused_naming_it(applied: Cluster) -> None:
    moved = Topology.of(applied.control_url, ShardSettings(urls=applied.settings().urls,
                                                           pods={"a": ["p1", "p2"], "b": ["p3"]}))
    with applied.engine.connect() as conn, pytest.raises(PodMoved) as err:
        store_pod_map(conn, moved)
    assert "p2: b -> a" in str(err.value) and "p1" not in str(err.value)


def test_apply_names_every_unreachable_shard(applied: Cluster) -> None:
    urls = {**applied.settings().urls, "c": f"postgresql://postgres@127.0.0.1:{free_port()}/fw_shard"}
    with pytest.raises(ShardsUnavailable) as err:
        apply(Topology.of(applied.control_url, ShardSettings(urls=urls, pods=applied.settings().pods,
                                                            connect_timeout_s=2)))
    assert list(err.value.errors) == ["c"]


def _samples() -> list[Sample]:
    out = []
    for i in range(6):
        t = T0_MS + i * 10_000
        out += [Sample("port_rx_bytes_total", 1000.0 * i, t, "leaf1", "eth0"),
                Sample("port_rx_bytes_total", 2000.0 * i, t, "leaf2", "eth0"),
                Sample("port_rx_bytes_total", 3000.0 * i, t, "spine1", "eth1"),
                Sample("port_rx_bytes_total", 4000.0 * i, t, "host3", "eth1")]
    return out + [Sample("port_rx_bytes_total", 1.0, T0_MS, "nosuchdevice", "eth0")]


@pytest.fixture(scope="module")
def ingested(applied: Cluster) -> Cluster:
    report = ingest_samples(control=applied.engine, topology=applied.topology(), samples=_samples())
    assert report.errors == {}
    assert report.reports["a"].written == 12 and report.reports["b"].written == 12
    # the unknown device went to the default shard, whose ingest reported it as always
    assert dict(report.reports["a"].unknown_devices) == {"nosuchdevice": 1}
    return applied


def test_writes_go_to_the_shard_of_the_devices_pod(ingested: Cluster) -> None:
    per_device = ("SELECT string_agg(d.name || '=' || n, ',' ORDER BY d.name) FROM (SELECT s.device_id, count(*) n "
                  "FROM sample_rows r JOIN series s ON s.id = r.series_id GROUP BY 1) c "
                  "JOIN devices d ON d.id = c.device_id")
    assert _scalar(ingested.shard_a.url("fw_shard"), per_device) == "leaf1=6,spine1=6"
    assert _scalar(ingested.shard_b.url("fw_shard"), per_device) == "host3=6,leaf2=6"
    assert _scalar(ingested.control_url, "SELECT count(*) FROM sample_rows") == 0


def test_a_collection_stores_its_samples_on_the_shard_and_its_status_on_the_control(ingested: Cluster) -> None:
    from collectors.base import CollectResult
    from collectors.spool import PendingStore
    from collectors.tasks import store_collection
    from service.config import load_settings

    with ingested.engine.begin() as conn:
        dev = conn.execute(text("SELECT id FROM devices WHERE name = 'leaf2'")).scalar_one()
        ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                               "VALUES (:d, 'snmp', '127.0.0.1', '{}') RETURNING id"), {"d": dev}).scalar_one()
    settings = load_settings(database_url=ingested.control_url, shards=ingested.settings().model_dump())
    result = CollectResult(target="leaf2/snmp", samples=[
        Sample("port_tx_bytes_total", 10.0 * i, T0_MS + i * 10_000, "leaf2", "eth1") for i in range(3)])
    report = store_collection(ingested.engine, PendingStore(ep, dev, "snmp", ["counters"], T0_MS, result),
                              settings=settings)
    assert report.written == 3
    tx_rows = ("SELECT count(*) FROM sample_rows r JOIN series s ON s.id = r.series_id "
               "WHERE s.metric = 'port_tx_bytes_total'")
    assert _scalar(ingested.shard_b.url("fw_shard"), tx_rows) == 3
    assert _scalar(ingested.shard_a.url("fw_shard"), tx_rows) == 0
    assert _scalar(ingested.control_url, tx_rows) == 0
    assert _scalar(ingested.control_url, f"SELECT samples FROM target_status WHERE endpoint_id = {ep}") == 3


def test_fleet_series_reads_every_shard_through_the_foreign_tables(ingested: Cluster) -> None:
    with ingested.engine.connect() as conn:
        got, seen = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                       start=T0 - timedelta(minutes=1), end=T0 + timedelta(minutes=5))
    assert seen.missing == [] and seen.down == {}
    by_device = {(r.device, r.port): r for r in got}
    assert sorted(by_device) == [("host3", "eth1"), ("leaf1", "eth0"), ("leaf2", "eth0"), ("spine1", "eth1")]
    # counters as per-second rates: leaf2 grows by 2000 per 10 s on shard b, host3 by 4000
    assert [v for _, v in by_device[("leaf2", "eth0")].points] == [200.0] * 5
    assert [v for _, v in by_device[("host3", "eth1")].points] == [400.0] * 5
    assert by_device[("leaf1", "eth0")].points[0] == (T0_MS + 10_000, 100.0)
    with ingested.engine.connect() as conn:  # one device: only its series
        got, _ = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                    device="host3", start=T0, end=T0 + timedelta(minutes=5), raw=True)
    assert [(r.device, [v for _, v in r.points]) for r in got] == [("host3", [4000.0 * i for i in range(6)])]


def test_fleet_read_includes_compressed_chunks_and_import_blocks(ingested: Cluster) -> None:
    """Older samples live in chunks and blocks on the shard; the fleet read decodes them on the control side."""
    shard_b = ingested.shard_b.url("fw_shard")
    day = T0 - timedelta(days=1)
    ts_us = np.array([int((day + timedelta(seconds=10 * i)).timestamp() * 1e6) for i in range(3)], np.int64)
    with get_engine(shard_b).begin() as conn:
        sid = conn.execute(text("SELECT s.id FROM series s JOIN devices d ON d.id = s.device_id "
                                "WHERE d.name = 'leaf2' AND s.metric = 'port_rx_bytes_total'")).scalar_one()
        conn.execute(text("CREATE TABLE IF NOT EXISTS sample_chunks_p20261129 PARTITION OF sample_chunks "
                          "FOR VALUES FROM ('2026-11-29') TO ('2026-11-30')"))
        conn.execute(text("INSERT INTO sample_chunks (series_id, first_ts, last_ts, n, last_value, prev_ts, "
                          "prev_value, data) VALUES (:s, :f, :l, 3, 20.0, :p, 10.0, :d)"),
                     {"s": sid, "f": day, "l": day + timedelta(seconds=20), "p": day + timedelta(seconds=10),
                      "d": encode(ts_us, np.array([0.0, 10.0, 20.0]))})
        conn.execute(text("INSERT INTO sample_blocks (series_id, first_ts, last_ts, ts, vals) VALUES "
                          "(:s, :f, :l, ARRAY[:f, :l]::timestamptz[], ARRAY[30.0, 40.0])"),
                     {"s": sid, "f": day + timedelta(minutes=1), "l": day + timedelta(minutes=2)})
    with ingested.engine.connect() as conn:
        got, _ = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                    device="leaf2", start=day - timedelta(minutes=1), end=day + timedelta(hours=1),
                                    raw=True)
    assert [v for _, v in got[0].points] == [0.0, 10.0, 20.0, 30.0, 40.0]


def test_pod_and_time_conditions_reach_the_shard(ingested: Cluster) -> None:
    """EXPLAIN of the fleet rows read for pod p2's series: shard a's partition is pruned, and shard b is
    sent the pod, series and time conditions in its Remote SQL (nothing filtered on the control side)."""
    which = "(pod = ANY(CAST(:p0 AS text[])) AND series_id = ANY(CAST(:s0 AS int[])))"
    with ingested.engine.connect() as conn:
        plan = "\n".join(conn.execute(text("EXPLAIN (VERBOSE, COSTS OFF) " + fleet.rows_sql(which)),
                                      {"p0": ["p2"], "s0": [1, 2], "lo": T0, "hi": T0 + timedelta(hours=1)}).scalars())
    assert "fleet.rows__b" in plan and "fleet.rows__a" not in plan, plan
    remote = [line for line in plan.splitlines() if "Remote SQL" in line]
    assert len(remote) == 1, plan
    assert "pod = ANY" in remote[0] and "series_id = ANY" in remote[0], plan
    assert "ts >= " in remote[0] and "ts <= " in remote[0], plan
    assert "Filter:" not in plan, plan  # every condition went to the shard
    both = "(pod = ANY(CAST(:p0 AS text[])) AND series_id = ANY(CAST(:s0 AS int[])))"
    with ingested.engine.connect() as conn:
        plan = "\n".join(conn.execute(text("EXPLAIN (VERBOSE, COSTS OFF) " + fleet.rows_sql(both)),
                                      {"p0": ["p1", "p2"], "s0": [1], "lo": T0, "hi": T0}).scalars())
    assert plan.count("Async Foreign Scan") == 2, plan  # both shards scanned at once
    # the read itself: each shard aggregates its rows into arrays per series (GROUP BY in its Remote SQL)
    with ingested.engine.connect() as conn:
        found = conn.execute(text("SELECT pod, series_id FROM fleet.series WHERE pod = 'p2'")).all()
        plan = fleet.explain_read(conn, found, fleet.pod_map(conn), T0, T0 + timedelta(hours=1))
    assert "Aggregate on (fleet.rows__b" in plan and "rows__a" not in plan, plan
    remote = next(line for line in plan.splitlines() if "Remote SQL" in line and "array_agg" in line)
    assert "GROUP BY" in remote and "ts >= " in remote and "pod = ANY" in remote, plan


@pytest.fixture(autouse=True)
def _no_shard_remembered_down() -> None:
    fleet.recheck_now()


def test_a_down_shard_is_left_out_and_its_pods_named(ingested: Cluster, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(fleet, "RECHECK_S", 3600.0)  # no clock in the test: "found down" lasts until told
    ingested.shard_b.stop()
    try:
        with ingested.engine.connect() as conn:
            got, seen = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                           start=T0, end=T0 + timedelta(minutes=5))
        assert seen.missing == ["p2", "p3"] and list(seen.down) == ["b"]
        assert sorted(r.device for r in got) == ["leaf1", "spine1"]  # shard a's, whole
        with ingested.engine.connect() as conn:  # one device of shard a: whole, nothing of it missing
            got, seen = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                           device="leaf1", start=T0, end=T0 + timedelta(minutes=5))
        assert seen.missing == [] and [r.device for r in got] == ["leaf1"]
        with ingested.engine.connect() as conn:  # one device of shard b: nothing, and its pod named
            got, seen = fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                           device="leaf2", start=T0, end=T0 + timedelta(minutes=5))
        assert seen.missing == ["p2"] and got == []
        # writes for shard a go on; shard b's are refused by name, nothing of them stored
        report = ingest_samples(control=ingested.engine, topology=ingested.topology(), samples=[
            Sample("port_rx_errors_total", 9e3, T0_MS + 60_000, "leaf1", "eth0"),
            Sample("port_rx_errors_total", 9e3, T0_MS + 60_000, "leaf2", "eth0")])
        assert report.reports["a"].written == 1 and list(report.errors) == ["b"]
        # a collection for the down shard raises what run_collection spools on, and records nothing
        from sqlalchemy.exc import OperationalError

        from collectors.base import CollectResult
        from collectors.spool import PendingStore
        from collectors.tasks import store_collection
        from service.config import load_settings

        settings = load_settings(database_url=ingested.control_url, shards=ingested.settings().model_dump())
        with ingested.engine.begin() as conn:
            dev = conn.execute(text("SELECT id FROM devices WHERE name = 'host3'")).scalar_one()
            ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                                   "VALUES (:d, 'snmp', '127.0.0.1', '{}') RETURNING id"), {"d": dev}).scalar_one()
        result = CollectResult(target="host3/snmp", samples=[
            Sample("port_tx_bytes_total", 1.0, T0_MS, "host3", "eth1")])
        with pytest.raises(OperationalError):
            store_collection(ingested.engine, PendingStore(ep, dev, "snmp", ["counters"], T0_MS, result),
                             settings=settings)
        assert _scalar(ingested.control_url, f"SELECT count(*) FROM target_status WHERE endpoint_id = {ep}") == 0
    finally:
        ingested.shard_b.start()

    def read() -> tuple[list, fleet.Reach]:  # type: ignore[type-arg]
        with ingested.engine.connect() as conn:
            return fleet.query_series(conn=conn, topology=ingested.topology(), metric="port_rx_bytes_total",
                                      start=T0, end=T0 + timedelta(minutes=5))

    got, seen = read()  # back, but left out until the recheck: still named, not tried
    assert seen.missing == ["p2", "p3"] and sorted(r.device for r in got) == ["leaf1", "spine1"]
    fleet.recheck_now()
    got, seen = read()
    assert seen.missing == [] and len(got) == 4


def test_series_api_answers_across_shards_with_the_missing_pods_header(ingested: Cluster,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import load_settings

    settings = load_settings(database_url=ingested.control_url, auth_required=False,
                             shards=ingested.settings().model_dump())
    client = TestClient(create_app(settings))
    params = {"metric": "port_rx_bytes_total", "start": T0.isoformat(), "end": (T0 + timedelta(minutes=5)).isoformat()}
    r = client.get("/api/v1/series", params=params)
    assert r.status_code == 200, r.text
    assert r.headers[fleet.MISSING_HEADER] == ""
    assert sorted(s["labels"]["device"] for s in r.json()["series"]) == ["host3", "leaf1", "leaf2", "spine1"]
    ingested.shard_a.stop()
    try:
        r = client.get("/api/v1/series", params=params)
    finally:
        ingested.shard_a.start()
    assert r.status_code == 200, r.text
    assert r.headers[fleet.MISSING_HEADER] == "(no pod),p1"
    assert sorted(s["labels"]["device"] for s in r.json()["series"]) == ["host3", "leaf2"]


def _count(url: str, metric: str) -> object:
    """Samples of the metric stored as rows or as import blocks (an import stores a new series' samples of a
    day as one block when there are enough of them, sharded or not)."""
    return _scalar(url, "SELECT (SELECT count(*) FROM sample_rows r JOIN series s ON s.id = r.series_id "
                        f"WHERE s.metric = '{metric}') + (SELECT coalesce(sum(cardinality(b.ts)), 0) "
                        f"FROM sample_blocks b JOIN series s ON s.id = b.series_id WHERE s.metric = '{metric}')")


def test_import_stores_each_sample_on_its_devices_shard(ingested: Cluster) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import load_settings

    settings = load_settings(database_url=ingested.control_url, auth_required=False,
                             shards=ingested.settings().model_dump())
    client = TestClient(create_app(settings))
    metric = "port_rx_packets_total"
    body = "".join(f'{metric}{{device="{d}",port="eth0"}} {i} {T0_MS + i * 1000}\n'
                   for i in range(3) for d in ("leaf1", "leaf2", "spine1", "nosuchdevice"))
    r = client.post("/api/v1/import/prometheus", content=b"# a comment\n" + body.encode())
    assert r.status_code == 200, r.text
    assert r.json()["written"] == 9 and r.json()["unknown_devices"] == {"nosuchdevice": 3}
    a, b = ingested.shard_a.url("fw_shard"), ingested.shard_b.url("fw_shard")
    assert (_count(a, metric), _count(b, metric), _count(ingested.control_url, metric)) == (6, 3, 0)
    # a malformed line anywhere: nothing stored on any shard
    bad = (f'{metric}{{device="leaf1",port="eth1"}} 1 {T0_MS}\n{metric}{{device="leaf2",port="eth1"}} 1 {T0_MS}\n'
           f'{metric}{{device="leaf2",port="eth1" 2 {T0_MS + 1000}\n')
    r = client.post("/api/v1/import/prometheus", content=bad.encode())
    assert r.status_code == 400 and r.json()["line"] == 3, r.text
    assert (_count(a, metric), _count(b, metric)) == (6, 3)
    # every sample refused: 422 with the reason, nothing stored
    r = client.post("/api/v1/import/prometheus", content=f'{metric}{{device="ghost",port="x"}} 1 {T0_MS}\n'.encode())
    assert r.status_code == 422 and "ghost" in r.json()["detail"], r.text


def _cli(cluster: Cluster, *args: str, **env: str) -> subprocess.CompletedProcess[str]:
    import json
    import os
    import sys

    from tests.paths import REPO

    base = {"FABRICWATCH_DATABASE_URL": cluster.control_url,
            "FABRICWATCH_SHARDS_URLS": json.dumps(cluster.settings().urls),
            "FABRICWATCH_SHARDS_PODS": json.dumps(cluster.settings().pods)}
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **base, **env}, cwd=REPO, timeout=120)


def test_cli_status_and_apply_name_each_shard(applied: Cluster, tmp_path: Path) -> None:
    import json

    done = _cli(applied, "shards", "status")
    assert done.returncode == 0, done.stderr
    lines = dict(line.split("\t", 1) for line in done.stdout.splitlines())
    assert lines["a"].startswith("up\t") and lines["a"].endswith("(no pod), p1")
    assert lines["b"].endswith("p2, p3")
    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/fw_shard"
    urls = json.dumps({**applied.settings().urls, "c": dead})
    done = _cli(applied, "shards", "status", FABRICWATCH_SHARDS_URLS=urls, FABRICWATCH_SHARDS_CONNECT_TIMEOUT_S="2")
    assert done.returncode == 1 and "c\tDOWN (" in done.stdout, done.stdout
    done = _cli(applied, "shards", "apply", FABRICWATCH_SHARDS_URLS=urls, FABRICWATCH_SHARDS_CONNECT_TIMEOUT_S="2")
    assert done.returncode == 1 and "shard 'c' unreachable:" in done.stderr, done.stderr
    assert "shard 'a'" not in done.stderr and "Traceback" not in done.stderr
    # an inventory load reaches the shards: the new device is on its pod's shard at once
    inv = tmp_path / "inv.yaml"
    inv.write_text("version: 1\npods:\n  - name: p3\ndevices:\n  - name: leaf9\n    kind: switch\n    role: leaf\n"
                   "    pod: p3\n    ports:\n      - {name: swp1}\n")
    done = _cli(applied, "inventory", "load", str(inv))
    assert done.returncode == 0, done.stdout + done.stderr
    assert _scalar(applied.shard_b.url("fw_shard"), "SELECT count(*) FROM devices WHERE name = 'leaf9'") == 1
    assert _scalar(applied.shard_a.url("fw_shard"), "SELECT count(*) FROM devices WHERE name = 'leaf9'") == 0


def test_cli_import_stores_each_sample_on_its_devices_shard(applied: Cluster, tmp_path: Path) -> None:
    metric = "port_tx_packets_total"
    prom = tmp_path / "x.prom"
    prom.write_text("".join(f'{metric}{{device="{d}",port="eth1"}} {i} {T0_MS + i * 1000}\n'
                            for i in range(4) for d in ("spine1", "host3")))
    done = _cli(applied, "import", str(prom))
    assert done.returncode == 0, done.stderr
    assert '"written": 8' in done.stdout
    a, b = applied.shard_a.url("fw_shard"), applied.shard_b.url("fw_shard")
    assert (_count(a, metric), _count(b, metric), _count(applied.control_url, metric)) == (4, 4, 0)
    prom.write_text(f'{metric}{{device="spine1",port="eth1"}} 9 {T0_MS + 9000}\n{metric}{{device="host3" 1\n')
    done = _cli(applied, "import", str(prom))
    assert done.returncode == 1 and "x.prom:2: label set is not closed" in done.stderr, done.stderr
    assert "nothing was written" in done.stderr
    assert (_count(a, metric), _count(b, metric)) == (4, 4)
    prom.write_text("# only a comment\n")
    done = _cli(applied, "import", str(prom))
    assert done.returncode == 1 and "no sample lines" in done.stderr, done.stderr


def test_a_down_shards_spool_holds_back_only_its_own_collections(ingested: Cluster, tmp_path: Path) -> None:
    """Collections spooled per shard: while shard b is down, the worker's drain stores shard a's backlog and
    keeps b's; once b is back, b's is stored. Nothing is lost or stored twice."""
    from collectors.base import CollectResult
    from collectors.spool import PendingStore, spool_write
    from collectors.tasks import run_collection
    from service.config import load_settings
    from service.shards.ingest import shard_spool_for

    metric = "port_rx_discards_total"
    settings = load_settings(database_url=ingested.control_url, spool_dir=str(tmp_path),
                             shards=ingested.settings().model_dump())
    pendings = {}
    for device in ("leaf1", "host3"):
        with ingested.engine.begin() as conn:
            dev = conn.execute(text("SELECT id FROM devices WHERE name = :n"), {"n": device}).scalar_one()
            ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                                   "VALUES (:d, 'gnmi', '127.0.0.1', '{}') RETURNING id"), {"d": dev}).scalar_one()
        result = CollectResult(target=f"{device}/gnmi", samples=[
            Sample(metric, float(i), T0_MS + i * 10_000, device, "eth0") for i in range(5)])
        pendings[device] = PendingStore(ep, dev, "gnmi", ["counters"], T0_MS, result)
    a, b = ingested.shard_a.url("fw_shard"), ingested.shard_b.url("fw_shard")
    assert shard_spool_for(tmp_path, ingested.engine, settings, pendings["host3"].device_id) == tmp_path / "shards/b"
    ingested.shard_b.stop()
    try:
        spool_write(tmp_path / "shards/b", pendings["host3"])  # b's backlog first: the oldest
        spool_write(tmp_path / "shards/a", pendings["leaf1"])
        # a task's drain (the endpoint is gone, so it only drains)
        assert run_collection(10**9, ["counters"], settings=settings)["skipped"]
        assert _count(a, metric) == 5 and not list((tmp_path / "shards/a").glob("*.json"))
        assert len(list((tmp_path / "shards/b").glob("*.json"))) == 1
    finally:
        ingested.shard_b.start()
    run_collection(10**9, ["counters"], settings=settings)
    assert _count(b, metric) == 5 and not list((tmp_path / "shards/b").glob("*.json"))
    assert _count(a, metric) == 5


def test_start_up_refresh_skips_a_down_shard_and_names_it(applied: Cluster, monkeypatch: pytest.MonkeyPatch,
                                                          capsys: pytest.CaptureFixture[str]) -> None:
    """What `serve` and `inventory load` run: the shards that answer are brought in line, a down one is
    named with a warning, and start-up goes on."""
    import json

    from service.shards.cli import refresh

    dead = f"postgresql://postgres@127.0.0.1:{free_port()}/fw_shard"
    monkeypatch.setenv("FABRICWATCH_SHARDS_URLS", json.dumps({**applied.settings().urls, "c": dead}))
    monkeypatch.setenv("FABRICWATCH_SHARDS_PODS", json.dumps({**applied.settings().pods, "c": ["p4"]}))
    monkeypatch.setenv("FABRICWATCH_SHARDS_CONNECT_TIMEOUT_S", "2")
    with applied.engine.begin() as conn:
        conn.execute(text("INSERT INTO pods (name) VALUES ('p4')"))
    try:
        refresh(applied.control_url, when="at start-up")
        err = capsys.readouterr().err
        assert "shard 'c' not updated (at start-up), unreachable:" in err and "shard 'a'" not in err
        assert _scalar(applied.control_url, "SELECT shard FROM shard_pods WHERE pod = 'p4'") == "c"
        with applied.engine.connect() as conn:  # reads leave c out and name its pod
            _, seen = fleet.query_series(conn=conn, topology=Topology.of(applied.control_url, ShardSettings(
                urls={**applied.settings().urls, "c": dead}, pods={**applied.settings().pods, "c": ["p4"]},
                connect_timeout_s=2)), metric="port_rx_bytes_total", start=T0, end=T0 + timedelta(minutes=5))
        assert seen.missing == ["p4"] and list(seen.down) == ["c"]
    finally:  # the cluster's own layout again, for the tests after this one
        with applied.engine.begin() as conn:
            conn.execute(text("DELETE FROM shard_pods WHERE pod = 'p4'"))
            conn.execute(text("DELETE FROM pods WHERE name = 'p4'"))
        monkeypatch.undo()
        apply(applied.topology())
