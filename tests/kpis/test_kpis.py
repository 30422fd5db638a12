"""KPIs on simulated telemetry equal the same figures computed here, in Python, from the stored samples."""

from __future__ import annotations

import math
from collections import defaultdict
from datetime import UTC, datetime

import numpy as np
import pytest
from sqlalchemy import Engine, text

from service.db import session_scope
from service.inventory.service import upsert_inventory
from service.kpis.service import Scope, availability, congestion, fabric_kpis, utilization, worst_ports
from service.telemetry.counters import increase
from service.telemetry.service import ingest_samples
from simulator.scenarios import Scenario
from simulator.telemetry import simulate
from simulator.topology import TopologyParams, build_topology

T0 = 1_767_225_600.0  # 2026-01-01T00:00:00Z
STEP = 60.0
MINUTES = 40
GAP = 900.0
FLAP_LEAF, FLAP_PORT = "leaf-p1-r0-01", "Ethernet1/1"
STORM_HOST = "host-p1-00001"


@pytest.fixture(scope="module")
def fabric(engine: Engine) -> Engine:
    with engine.begin() as conn:
        tables = conn.execute(text(
            "SELECT string_agg(format('%I', c.relname), ', ') FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
            "AND NOT c.relispartition AND c.relname <> 'alembic_version'")).scalar()
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    inv = build_topology(TopologyParams(shape="rail-optimized", hosts=8, pods=2, gpus_per_host=2, nics_per_host=2,
                                        hosts_per_leaf=4, spines=2, seed=3))
    with session_scope(engine) as session:
        upsert_inventory(session=session, inventory=inv)
    sc = Scenario.model_validate({"name": "kpi", "seed": 7, "faults": [
        {"id": "flap", "type": "flap_storm", "device": FLAP_LEAF, "port": FLAP_PORT, "at": "10m", "duration": "3m",
         "flaps_per_10s": 3, "ends": "down"},
        {"id": "storm", "type": "pause_storm", "device": STORM_HOST, "port": "eth0", "at": "15m", "until": "25m"},
        {"id": "cong", "type": "congestion", "device": "host-p2-00005", "at": "5m", "duration": "20m"},
    ]})
    ingest_samples(engine=engine, samples=(s for batch in simulate(inv, sc, start=T0, end=T0 + MINUTES * STEP,
                                                                  step=STEP) for s in batch))
    return engine


# --- the hand computation ----------------------------------------------------------------------

def _members(conn, scope: Scope) -> dict[int, tuple[str | None, float | None, str, str]]:  # type: ignore[no-untyped-def]
    ports = {r.id: r for r in conn.execute(text(
        "SELECT p.id, p.name, p.rail, p.speed_gbps, d.name AS dev, d.role, d.pod FROM ports p "
        "JOIN devices d ON d.id = p.device_id"))}
    peer, link_of = {}, {}
    for lid, a, b in conn.execute(text("SELECT id, a_port_id, b_port_id FROM links")):
        peer[a], peer[b], link_of[a], link_of[b] = b, a, lid, lid
    out = {}
    for pid, p in ports.items():
        q = ports.get(peer.get(pid, -1))
        if scope is Scope.LINK:
            g = f"link:{link_of[pid]}" if pid in link_of else f"{p.dev}:{p.name}"
        elif scope is Scope.LEAF:
            g = p.dev if p.role == "leaf" else (q.dev if q is not None and q.role == "leaf" else None)
        elif scope is Scope.RAIL:
            r = p.rail if p.rail is not None else (q.rail if q is not None else None)
            g = None if r is None else str(r)
        elif scope is Scope.POD:
            g = p.pod or (q.pod if q is not None else None)
        else:
            g = "fabric"
        out[pid] = (g, p.speed_gbps * 1e9 if p.speed_gbps else None, p.dev, p.name)
    return out


def _intervals(conn, metrics: list[str], start: float, end: float):  # type: ignore[no-untyped-def]
    """(metric, port_id, end_ts, dt, increase, value) for every interval ending in (start, end]."""
    rows = conn.execute(text(
        "SELECT s.id, s.metric, s.port_id, s.counter_bits, s.saturating, extract(epoch FROM x.ts)::float8, x.value "
        "FROM samples x JOIN series s ON s.id = x.series_id WHERE s.metric = ANY(:m) AND s.port_id IS NOT NULL "
        "AND x.ts > to_timestamp(:a) AND x.ts <= to_timestamp(:b) ORDER BY s.id, x.ts"),
        {"m": metrics, "a": start - GAP, "b": end}).all()
    by_series = defaultdict(list)
    for r in rows:
        by_series[r[0]].append(r)
    for pts in by_series.values():
        for prev, cur in zip(pts, pts[1:], strict=False):
            dt = cur[5] - prev[5]
            if cur[5] <= start or not 0 < dt <= GAP:
                continue
            yield cur[1], cur[2], cur[5], dt, increase(prev[6], cur[6], bits=cur[3], saturating=cur[4]), cur[6]


def _bucket(ts: float, step: float) -> datetime:
    return datetime.fromtimestamp(math.floor((ts - 0.001) / step) * step, UTC)


def _close(a: float | None, b: float | None) -> bool:
    if a is None or b is None:
        return a is None and b is None
    return math.isclose(a, b, rel_tol=1e-9, abs_tol=1e-12)


RANGES = [(T0 + 5 * STEP, T0 + 35 * STEP, 600.0), (T0, T0 + MINUTES * STEP, 300.0)]


@pytest.mark.parametrize("scope", list(Scope))
def test_utilization_matches_hand_computation(fabric: Engine, scope: Scope) -> None:
    a, b, step = RANGES[0]
    with fabric.connect() as conn:
        members = _members(conn, scope)
        acc: dict = defaultdict(lambda: {"bits": 0.0, "cap": 0.0, "u": []})
        for _, pid, ts, dt, inc, _v in _intervals(conn, ["port_tx_bytes_total"], a, b):
            g, speed, _, _ = members[pid]
            if inc is None or not speed or g is None:
                continue
            x = acc[(g, _bucket(ts, step))]
            x["bits"] += inc * 8
            x["cap"] += dt * speed
            x["u"].append(inc * 8 / (dt * speed))
        got = utilization(conn=conn, scope=scope, start=datetime.fromtimestamp(a, UTC),
                          end=datetime.fromtimestamp(b, UTC), step_s=step)
    assert len(got) == len(acc) > 0
    for p in got:
        want = acc[(p.group, p.bucket)]
        assert _close(p.values["utilization_mean"], want["bits"] / want["cap"])
        assert _close(p.values["utilization_peak"], max(want["u"]))
        assert _close(p.values["utilization_p95"], float(np.percentile(want["u"], 95)))
        assert p.values["intervals"] == len(want["u"])
    assert all(0 <= p.values["utilization_mean"] < 1.5 for p in got)  # a port left down carries nothing


@pytest.mark.parametrize("scope", [Scope.LEAF, Scope.POD, Scope.FABRIC])
def test_congestion_matches_hand_computation(fabric: Engine, scope: Scope) -> None:
    from service.kpis.service import CONGESTION_RATES

    a, b, step = RANGES[1]
    with fabric.connect() as conn:
        members = _members(conn, scope)
        per_port: dict = defaultdict(lambda: [0.0, 0.0])  # (group, bucket, metric, port, ts) -> [dt, sum d]
        for metric, pid, ts, dt, inc, _v in _intervals(conn, list(CONGESTION_RATES), a, b):
            g = members[pid][0]
            if inc is None or g is None:
                continue
            x = per_port[(g, _bucket(ts, step), metric, pid, ts)]
            x[0] = max(x[0], dt)
            x[1] += inc
        agg: dict = defaultdict(lambda: [0.0, 0.0])
        for (g, bk, metric, _pid, _ts), (dt, d) in per_port.items():
            agg[(g, bk, CONGESTION_RATES[metric])][0] += d
            agg[(g, bk, CONGESTION_RATES[metric])][1] += dt
        got = congestion(conn=conn, scope=scope, start=datetime.fromtimestamp(a, UTC),
                         end=datetime.fromtimestamp(b, UTC), step_s=step)
    n = 0
    for p in got:
        for name, v in p.values.items():
            if (p.group, p.bucket, name) in agg:
                d, dt = agg[(p.group, p.bucket, name)]
                assert _close(v, d / dt), (p.group, p.bucket, name)
                n += 1
            else:
                assert v is None
    assert n == len(agg) > 0
    # the pause storm makes its pod's tx pause duty visible
    if scope is Scope.POD:
        storm = max(p.values["pfc_tx_pause_duty"] or 0 for p in got if p.group == "p1")
        calm = max(p.values["pfc_tx_pause_duty"] or 0 for p in got if p.group == "p2")
        assert storm > calm


def test_worst_ports_ranked_and_match(fabric: Engine) -> None:
    a, b = T0, T0 + MINUTES * STEP
    with fabric.connect() as conn:
        members = _members(conn, Scope.FABRIC)
        per: dict = defaultdict(lambda: defaultdict(lambda: [0.0, 0.0]))
        seen: dict = {}
        for _m, pid, ts, dt, inc, _v in _intervals(conn, ["port_pfc_tx_pause_seconds_total"], a, b):
            if inc is None:
                continue
            seen[(pid, ts)] = max(seen.get((pid, ts), 0.0), dt)
            per[pid][ts][1] += inc
        rates = {pid: sum(x[1] for x in d.values()) / sum(seen[(pid, t)] for t in d) for pid, d in per.items()}
        ranked = worst_ports(conn=conn, scope=Scope.FABRIC, start=datetime.fromtimestamp(a, UTC),
                             end=datetime.fromtimestamp(b, UTC), top=5)["pfc_tx_pause_duty"]
    want = sorted(((r, pid) for pid, r in rates.items() if r > 0), key=lambda x: (-x[0], x[1]))[:5]
    assert [(p.device, p.port) for p in ranked] == [members[pid][2:] for _, pid in want]
    assert all(_close(p.value, r) for p, (r, _) in zip(ranked, want, strict=True))
    # the storm spreads from the stuck NIC to its leaf: the worst ports are all in its pod
    assert all("-p1-" in p.device for p in ranked)


@pytest.mark.parametrize("scope", [Scope.LINK, Scope.LEAF])
def test_availability_and_flaps_match(fabric: Engine, scope: Scope) -> None:
    a, b, step = T0, T0 + MINUTES * STEP, 600.0
    with fabric.connect() as conn:
        members = _members(conn, scope)
        up: dict = defaultdict(lambda: [0.0, 0.0])
        flaps: dict = defaultdict(float)
        for metric, pid, ts, dt, inc, v in _intervals(conn, ["port_oper_up", "port_link_down_events_total"], a, b):
            g = members[pid][0]
            if g is None:
                continue
            key = (g, _bucket(ts, step))
            if metric == "port_oper_up" and not math.isnan(v):
                up[key][1] += dt
                up[key][0] += dt if v > 0.5 else 0.0
            elif metric == "port_link_down_events_total" and inc is not None:
                flaps[key] += inc
        got = availability(conn=conn, scope=scope, start=datetime.fromtimestamp(a, UTC),
                           end=datetime.fromtimestamp(b, UTC), step_s=step)
    for p in got:
        key = (p.group, p.bucket)
        assert _close(p.values["availability"], up[key][0] / up[key][1] if up[key][1] else None)
        assert _close(p.values["flaps"], flaps.get(key))
    flapped = [p for p in got if (p.values["flaps"] or 0) > 0]
    assert flapped, "the flap storm shows up"
    assert min(p.values["availability"] for p in flapped) < 1.0


def test_report_and_api(fabric: Engine, db_url: str) -> None:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import Settings

    a, b = datetime.fromtimestamp(T0, UTC), datetime.fromtimestamp(T0 + MINUTES * STEP, UTC)
    with fabric.connect() as conn:
        rep = fabric_kpis(conn=conn, scope=Scope.LINK, start=a, end=b, step_s=600)
    assert rep.source == "samples" and rep.labels and any("<->" in v for v in rep.labels.values())
    client = TestClient(create_app(Settings(database_url=db_url, auth_required=False)))
    r = client.get("/api/v1/kpis", params={"scope": "rail", "start": a.isoformat(), "end": b.isoformat(),
                                           "step": 600})
    assert r.status_code == 200, r.text
    body = r.json()
    assert {p["group"] for p in body["utilization"]} == {"0", "1"}
    assert "-p1-" in body["worst_ports"]["pfc_tx_pause_duty"][0]["device"]
    assert client.get("/api/v1/kpis", params={"scope": "nope"}).status_code == 422
    assert client.get("/api/v1/kpis", params={"start": b.isoformat(), "end": a.isoformat()}).status_code == 422
    assert client.get("/api/v1/kpis", params={"start": "1767225600000", "end": "1767325600000",  # Unix ms
                                              "step": 1}).status_code == 400  # 100000 one-second buckets
