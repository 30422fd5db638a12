"""The Grafana dashboards' SQL on a sharded deployment: every panel that reads telemetry, unchanged and run as
Grafana's read-only role logged in to the control database, answers what one server holding the same
inventory and samples answers (service/shards/grafana.py: `fleet_grafana` first on the role's search_path);
with a shard down, what one server holding the other shards' samples answers, and the dashboards' "Pods
missing" panel names the down shard's pods."""

from __future__ import annotations

import re
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from typing import Any

import pytest
from sqlalchemy import text

from service.db import get_engine
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.telemetry.samples import Sample
from tests.shards.conftest import Cluster
from tests.shards.test_fleet_reads import _TELEMETRY

pytestmark = pytest.mark.timeout(240)

T1 = datetime(2026, 12, 1, 12, 0, tzinfo=UTC)
_SHARD_A_DEVICES = {"leaf1", "spine1"}  # conftest.LAYOUT: p1 and the pod-less on shard a; p2, p3 on b

_PANEL_METRICS = {"port_oper_up": None, "port_tx_bytes_total": None, "port_ecn_marked_packets_total": None,
                  "port_cnp_sent_total": None, "port_fec_uncorrectable_codewords_total": None,
                  "port_pfc_rx_pause_frames_total": 3, "port_pfc_rx_pause_seconds_total": 3,
                  "port_pfc_tx_pause_seconds_total": 3}


def _panel_samples() -> list[Sample]:
    out = []
    ports = [("leaf1", "eth0"), ("leaf1", "eth1"), ("leaf2", "eth0"), ("leaf2", "eth1"), ("host3", "eth0"),
             ("spine1", "eth0")]
    for k, (device, port) in enumerate(ports, start=1):
        for i in range(60):
            t = int(T1.timestamp() * 1000) + i * 30_000
            for metric, prio in _PANEL_METRICS.items():
                value = float((i + k) % 2 if metric == "port_oper_up" else 1000.0 * k * i)
                out.append(Sample(metric, value, t, device, port, priority=prio))
            for lane in (1, 2):
                out += [Sample("optic_rx_power_dbm", -3.0 - k - 0.01 * i - lane, t, device, port, lane=lane),
                        Sample("optic_tx_bias_amperes", 0.006 + 0.0001 * k, t, device, port, lane=lane)]
            out.append(Sample("optic_temperature_celsius", 40.0 + k, t, device, port))
    return out


def _inventory_extras(conn: Any) -> None:
    """Rails, a host link and optics with thresholds, so that every telemetry panel has something to show."""
    conn.execute(text("UPDATE ports SET rail = 1 WHERE name = 'eth0'"))
    ports = dict(conn.execute(text("SELECT d.name || ':' || p.name, p.id FROM ports p "
                                   "JOIN devices d ON d.id = p.device_id")).all())
    conn.execute(text("INSERT INTO links (a_port_id, b_port_id, cable_type) VALUES (:a, :b, 'dac')"),
                 {"a": ports["leaf2:eth0"], "b": ports["host3:eth0"]})
    conn.execute(text("INSERT INTO optics (port_id, lanes, thresholds) SELECT id, 4, "
                      "'{\"rx_power_dbm\": {\"low_warning\": -9.0}}'::jsonb FROM ports"))


def _one_server(cluster: Cluster, name: str) -> str:
    """A database of the control's server holding the inventory on its own, as one server would."""
    from service.migrate import upgrade
    from tests.shards.conftest import load_inventory

    url = cluster.control.create_database(name)
    upgrade(url)
    load_inventory(get_engine(url))
    return url


def _panel_inventory(url: str) -> None:
    with get_engine(url).begin() as conn:
        conn.execute(text("UPDATE ports SET speed_gbps = 100"))
        ports = dict(conn.execute(text("SELECT d.name || ':' || p.name, p.id FROM ports p "
                                       "JOIN devices d ON d.id = p.device_id")).all())
        conn.execute(text("INSERT INTO links (a_port_id, b_port_id, cable_type) VALUES (:a, :b, 'aoc')"),
                     {"a": ports["leaf1:eth1"], "b": ports["leaf2:eth1"]})
        _inventory_extras(conn)


def _ingest_one_server(url: str, samples: list[Sample]) -> None:
    from service.shards.topology import ShardSettings, Topology

    report = ingest_samples(control=get_engine(url), topology=Topology.of(url, ShardSettings()), samples=samples)
    assert report.errors == {} and report.written == len(samples), report


@pytest.fixture(scope="module")
def dashboards(cluster: Cluster) -> Iterator[dict[str, str]]:
    """The same inventory and panel samples on the sharded deployment and on one server (a database of the
    control's server), and Grafana's role able to log in there (as its data source does). `single_a`: one
    server holding only the samples of shard a's devices (leaf1 of p1, pod-less spine1), what the panels
    should show while shard b is down."""
    single, single_a = _one_server(cluster, "fw_single"), _one_server(cluster, "fw_single_a")
    for url in (single, single_a, cluster.control_url):
        _panel_inventory(url)
    apply(cluster.topology())
    report = ingest_samples(control=cluster.engine, topology=cluster.topology(), samples=_panel_samples())
    assert report.errors == {} and report.written == len(_panel_samples()), report
    _ingest_one_server(single, _panel_samples())
    _ingest_one_server(single_a, [s for s in _panel_samples() if s.device in _SHARD_A_DEVICES])
    with cluster.engine.begin() as conn:
        conn.execute(text("ALTER ROLE fabricwatch_grafana LOGIN"))
    yield {"single": single, "single_a": single_a, "sharded": cluster.control_url}
    get_engine(single).dispose()
    get_engine(single_a).dispose()


def _telemetry_panels() -> list[tuple[str, str, str]]:
    import json

    from tests.paths import REPO

    out = []
    for path in sorted((REPO / "dashboards").glob("*.json")):
        for panel in json.loads(path.read_text()).get("panels", []):
            for target in panel.get("targets", []):
                sql = target.get("rawSql") or ""
                if set(re.findall(r"[a-z_]+", sql.lower())) & set(_TELEMETRY):
                    out.append((path.name, panel["title"], sql))
    return out


def _as_grafana(url: str, sql: str) -> list[tuple[Any, ...]]:
    import psycopg
    from sqlalchemy import make_url

    u = make_url(url)
    with psycopg.connect(host=u.host, port=u.port, dbname=u.database, user="fabricwatch_grafana",
                         connect_timeout=5) as conn:  # a login of its own: the role's search_path applies
        conn.execute("SET statement_timeout = '20s'")
        rows = conn.execute(sql).fetchall()
    return sorted((tuple(round(v, 9) if isinstance(v, float) else str(v) if not isinstance(v, int | None)
                         else v for v in r) for r in rows), key=repr)


def test_every_telemetry_panel_answers_across_shards_as_on_one_server(dashboards: dict[str, str]) -> None:
    """Each dashboard panel that reads telemetry, its SQL unchanged and run as Grafana's role: on the sharded
    control database (through `fleet_grafana`, first on the role's search_path there) it answers what one
    server holding the same samples answers."""
    from tests.api.test_dashboards_sql import expand

    # the control database holds no samples: what the panels show there comes from the shards
    assert _as_grafana(dashboards["sharded"], "SELECT count(*) FROM public.sample_rows") == [(0,)]
    assert _as_grafana(dashboards["sharded"], "SHOW search_path") == [("fleet_grafana, public",)]
    variables = {"pod": ["p1", "p2"], "device": ["leaf2"], "port": ["eth1"]}
    shown = []
    for name, title, raw in _telemetry_panels():
        sql = expand(raw, start=T1, end=T1 + timedelta(minutes=30), interval="1m", variables=variables)
        one = _as_grafana(dashboards["single"], sql)
        across = _as_grafana(dashboards["sharded"], sql)
        assert across == one, (name, title)
        if one:
            shown.append(title)
    assert len(shown) == len(_telemetry_panels()), sorted({t for _, t, _ in _telemetry_panels()} - set(shown))


def _nested_plans(url: str, sql: str) -> str:
    """The plans of the statements run inside `sql`'s functions (auto_explain, sent to this client)."""
    import psycopg

    notices: list[str] = []
    with psycopg.connect(url.replace("postgresql+psycopg://", "postgresql://"), autocommit=True) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        for setting in ("LOAD 'auto_explain'", "SET auto_explain.log_min_duration = 0",
                        "SET auto_explain.log_nested_statements = on", "SET auto_explain.log_verbose = on",
                        "SET client_min_messages = log", "SET search_path = fleet_grafana, public"):
            conn.execute(setting)
        conn.execute(sql).fetchall()
    return "\n".join(notices)


def test_grafana_functions_send_the_time_range_to_the_shards(dashboards: dict[str, str]) -> None:
    """samples_between's rows, blocks and 5-minute readings are asked of each shard for the panel's range
    and the live pods (Remote SQL with the bounds as parameters), not read whole; last_samples asks one
    shard for one series."""
    lo, hi = T1.isoformat(), (T1 + timedelta(minutes=30)).isoformat()
    plans = _nested_plans(dashboards["sharded"], f"SELECT count(*) FROM samples_between('{lo}', '{hi}')")
    remote = [line.strip() for line in plans.splitlines() if "Remote SQL" in line and "rollup_marks" not in line]
    assert len(remote) == 6, plans  # rows, blocks, 5-minute readings, on each of two shards
    # before them, once per statement, whether each shard answers (shards_down: a small read of each)
    assert plans.count("Remote SQL: SELECT NULL FROM fw_fleet.rollup_marks") == 2, plans
    # (PL/pgSQL plans the query for the call's values: the bounds arrive as constants, which postgres_fdw sends)
    assert all(">= '2026-12-01 12:00:00+00'" in r and "<= '2026-12-01 12:30:00+00'" in r for r in remote), plans
    # and the pods of the shards that answered (all of them here), by which a down shard is pruned
    assert all("""pod = ANY ('{"",p1,p2,p3}'::text[])""" in r for r in remote), plans
    plans = _nested_plans(dashboards["sharded"], "SELECT * FROM series s, LATERAL last_samples(s.id, 1) x "
                                                 "WHERE s.metric = 'port_oper_up' LIMIT 1")
    inner = [line.strip() for line in plans.splitlines() if "Remote SQL" in line and "fw_fleet.series" not in line
             and "rollup_marks" not in line]
    # one series on its one shard (the other's partitions pruned), the newest rows first
    assert len(inner) == 3 and all("pod = ANY" in r and "series_id = " in r for r in inner), plans
    assert "ORDER BY ts DESC" in inner[0] and plans.count("Foreign Scan on fleet.rows__") == 1, plans


def test_optics_api_across_shards_names_the_pods_of_a_stopped_shard(dashboards: dict[str, str],
                                                                    cluster: Cluster) -> None:
    """`/api/v1/optics` reads each optic's newest DOM from its shard (fleet.latest) as one server reads it,
    and names the pods of a stopped shard."""
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import load_settings
    from service.shards import fleet

    def client(url: str, shards: dict[str, Any]) -> TestClient:
        return TestClient(create_app(load_settings(database_url=url, auth_required=False, shards=shards)))

    def doms(r: Any) -> dict[str, Any]:
        assert r.status_code == 200, r.text
        return {f"{o['device']}:{o['port']}": (o["dom"], o["status"], o["worst_rx_margin"])
                for o in r.json()["items"]}

    sharded = client(dashboards["sharded"], cluster.settings().model_dump())
    one = doms(client(dashboards["single"], {}).get("/api/v1/optics"))
    r = sharded.get("/api/v1/optics")
    assert doms(r) == one and r.json()["missing_pods"] == [] and r.headers[fleet.MISSING_HEADER] == ""
    assert one["leaf2:eth1"][0]["lanes"][0]["rx_power_dbm"]["value"] == pytest.approx(-3.0 - 4 - 0.59 - 1)
    cluster.shard_b.stop()
    try:
        fleet.recheck_now()
        whole_pod = sharded.get("/api/v1/optics", params={"pod": "p1"})
        r = sharded.get("/api/v1/optics")
    finally:
        cluster.shard_b.start()
        fleet.recheck_now()
    assert r.json()["missing_pods"] == ["p2", "p3"] and r.headers[fleet.MISSING_HEADER] == "p2,p3"
    got = doms(r)
    assert got["leaf1:eth0"] == one["leaf1:eth0"] and got["leaf2:eth1"][0]["lanes"] == []
    assert whole_pod.json()["missing_pods"] == [] and doms(whole_pod) == {k: v for k, v in one.items()
                                                                        if k.startswith("leaf1:")}


_VARIABLES = {"pod": ["p1", "p2"], "device": ["leaf2"], "port": ["eth1"]}


def _expanded() -> list[tuple[str, str, str]]:
    from tests.api.test_dashboards_sql import expand

    return [(name, title, expand(raw, start=T1, end=T1 + timedelta(minutes=30), interval="1m",
                                 variables=_VARIABLES)) for name, title, raw in _telemetry_panels()]


def _grafana_notices(url: str, sql: str) -> list[str]:
    """The warnings a statement run as Grafana's role sends back."""
    import psycopg
    from sqlalchemy import make_url

    u = make_url(url)
    notices: list[str] = []
    with psycopg.connect(host=u.host, port=u.port, dbname=u.database, user="fabricwatch_grafana",
                         connect_timeout=5) as conn:
        conn.add_notice_handler(lambda d: notices.append(d.message_primary or ""))
        conn.execute(sql).fetchall()
    return notices


def test_a_stopped_shard_leaves_its_pods_out_of_the_panels_and_names_them(dashboards: dict[str, str],
                                                                          cluster: Cluster) -> None:
    """Shard b (pods p2, p3) stopped: every telemetry panel, run as Grafana's role, still answers, with what
    one server holding only shard a's samples answers (row for row); the missing-pods panel names p2 and
    p3; the dead shard is tried once per statement (one warning, though last_samples runs per series), its
    partitions pruned from the plans; an error other than a connection's still fails the query. Started
    again, every panel answers as one server with all the samples does."""
    import psycopg

    panels = _expanded()
    missing_sql = {sql for _, _, sql in panels if "missing_pods" in sql}
    full = {(n, t): _as_grafana(dashboards["single"], sql) for n, t, sql in panels}
    shard_a = {(n, t): _as_grafana(dashboards["single_a"], sql) for n, t, sql in panels}
    ports_down = next(sql for _, t, sql in panels if t.startswith("Ports down per pod"))
    lo, hi = T1.isoformat(), (T1 + timedelta(minutes=30)).isoformat()
    cluster.shard_b.stop()
    try:
        down = {(n, t): _as_grafana(dashboards["sharded"], sql) for n, t, sql in panels}
        named = _as_grafana(dashboards["sharded"], "SELECT pod, shard, reason FROM missing_pods")
        warned = _grafana_notices(dashboards["sharded"], ports_down)
        plans = _nested_plans(dashboards["sharded"], f"SELECT count(*) FROM samples_between('{lo}', '{hi}')")
        # a real SQL error on the shard that answers is not taken for a missing shard
        with get_engine(cluster.shard_a.url("fw_shard")).begin() as conn:
            conn.execute(text("ALTER VIEW fw_fleet.rows RENAME TO rows_away"))
        try:
            with pytest.raises(psycopg.errors.UndefinedTable, match="fw_fleet.rows"):
                _as_grafana(dashboards["sharded"], f"SELECT count(*) FROM samples_between('{lo}', '{hi}')")
        finally:
            with get_engine(cluster.shard_a.url("fw_shard")).begin() as conn:
                conn.execute(text("ALTER VIEW fw_fleet.rows_away RENAME TO rows"))
    finally:
        cluster.shard_b.start()
    after = {(n, t): _as_grafana(dashboards["sharded"], sql) for n, t, sql in panels}

    sql_of = {(n, t): sql for n, t, sql in panels}
    assert len(missing_sql) == 1 and sum(sql in missing_sql for sql in sql_of.values()) == 4
    for key, rows in down.items():
        if sql_of[key] in missing_sql:  # the "Pods missing" panel of each telemetry dashboard
            assert rows == [("p2, p3", "b")], key
            assert after[key] == full[key] == [("none", "")], key
        else:
            assert rows == shard_a[key], key
            assert after[key] == full[key], key
    # the comparison means something: panels with shard a's rows, and panels that lost shard b's
    assert sum(bool(rows) for rows in down.values()) >= 12, down
    assert sum(down[k] != full[k] for k in down) >= 12, [k for k in down if down[k] == full[k]]
    assert [(p, s) for p, s, _ in named] == [("p2", "b"), ("p3", "b")]
    assert all("could not connect to server" in why and "fw_shard_b" in why for _, _, why in named), named
    assert [w for w in warned if "shard b does not answer" in w and "p2, p3" in w] == warned and len(warned) == 1
    remote = [line for line in plans.splitlines() if "Remote SQL" in line and "rollup_marks" not in line]
    assert len(remote) == 3 and "__b" not in plans and all("pod = ANY ('{" in r for r in remote), plans
    assert _as_grafana(dashboards["sharded"], "SELECT * FROM missing_pods") == []


@pytest.mark.serial
def test_a_shard_that_never_answers_costs_a_panel_one_connect_timeout(dashboards: dict[str, str],
                                                                      cluster: Cluster) -> None:
    """Shard b's server address accepts the TCP connection and never answers (a listening socket nobody
    accepts on): a panel that calls last_samples per series waits once for the foreign server's
    connect_timeout (the topology's, 3 s), not once per series, and names shard b's pods."""
    import socket
    import time

    ports_down = next(sql for _, t, sql in _expanded() if t.startswith("Ports down per pod"))
    timeout_s = cluster.settings().connect_timeout_s
    with socket.socket() as silent:
        silent.bind(("127.0.0.1", 0))
        silent.listen(16)
        with cluster.engine.begin() as conn:
            conn.execute(text(f"ALTER SERVER fw_shard_b OPTIONS (SET port '{silent.getsockname()[1]}')"))
        try:
            t0 = time.monotonic()
            rows = _as_grafana(dashboards["sharded"], ports_down)
            took = time.monotonic() - t0
            named = _as_grafana(dashboards["sharded"], "SELECT pod, shard FROM missing_pods")
        finally:
            with cluster.engine.begin() as conn:
                conn.execute(text(f"ALTER SERVER fw_shard_b OPTIONS (SET port '{cluster.shard_b.port}')"))
    assert timeout_s - 0.5 <= took < 2 * timeout_s, took
    assert rows == _as_grafana(dashboards["single_a"], ports_down) and rows, rows
    assert named == [("p2", "b"), ("p3", "b")]
    assert _as_grafana(dashboards["sharded"], ports_down) == _as_grafana(dashboards["single"], ports_down)
