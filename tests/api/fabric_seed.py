"""A small simulated fabric in the test database: inventory from the simulator's topology builder,
30 minutes of telemetry from its model (with a dirty connector and a congested host, so optics
margins, PFC/ECN/CNP rates and link health have something to show)."""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine, text

from service.db import session_scope
from service.inventory.service import upsert_inventory
from service.telemetry.service import ingest_samples
from simulator.scenarios import Scenario
from simulator.telemetry import simulate
from simulator.topology import TopologyParams, build_topology

START = 1_767_225_600.0  # 2026-01-01T00:00:00Z: data time, far from the wall clock on purpose
STEP = 60.0
MINUTES = 30
FAULTY_LEAF, FAULTY_PORT = "leaf-p1-r0-01", "Ethernet1/1"
CONGESTED_HOST = "host-p1-00001"


@dataclass(frozen=True)
class Seeded:
    devices: int
    links: int
    samples: int
    end_s: float


def params() -> TopologyParams:
    # 2 pods x 4 hosts x 2 rails: 8 hosts, 4 leaves, 2 spines; enough for every panel and the map.
    return TopologyParams(shape="rail-optimized", hosts=8, pods=2, gpus_per_host=2, nics_per_host=2,
                          hosts_per_leaf=4, spines=2, seed=3)


TABLES_SQL = """
SELECT string_agg(format('%I', c.relname), ', ')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition AND c.relname <> 'alembic_version'
"""


def empty(engine: Engine) -> None:
    """Empty every table (what the `db` fixture does, for module-scoped fixtures)."""
    with engine.begin() as conn:
        tables = conn.execute(text(TABLES_SQL)).scalar()
        if tables:
            conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))


def seed_fabric(engine: Engine, minutes: int = MINUTES) -> Seeded:
    """Empty the database, load the topology and simulated samples; returns counts and the last data time."""
    empty(engine)
    inv = build_topology(params())
    with session_scope(engine) as session:
        upsert_inventory(session=session, inventory=inv)
    scenario = Scenario.model_validate({
        "name": "api-tests", "seed": 3,
        "faults": [
            {"id": "f1", "type": "dirty_connector", "device": FAULTY_LEAF, "port": FAULTY_PORT,
             "lanes": [1], "drop_db": 6.0, "at": "10m"},
            {"id": "f2", "type": "congestion", "device": CONGESTED_HOST, "at": "5m", "duration": "20m",
             "intensity": 2.0},
        ]})
    end = START + minutes * STEP
    n = 0

    def stream():  # type: ignore[no-untyped-def]
        nonlocal n
        for batch in simulate(inv, scenario, start=START, end=end, step=STEP):
            n += len(batch)
            yield from batch

    ingest_samples(engine=engine, samples=stream())
    return Seeded(devices=len(inv.devices), links=len(inv.links), samples=n, end_s=end)


def seed_alerts(engine: Engine, at_ms: int) -> list[int] | None:
    """Open two alerts through the alerts service (a page on the dirty connector, a ticket on the
    congested host); None when the alerts domain has not landed."""
    try:
        from service.alerts.service import apply_findings
        from service.detection.findings import Action, Cause, Evidence, Finding, Severity
    except ImportError:
        return None
    findings = [
        Finding(kind="rx_power_low", scope="lane", device=FAULTY_LEAF, port=FAULTY_PORT, lane=1,
                cause=Cause.CONTAMINATION, severity=Severity.PAGE, action=Action.CLEAN, state="firing", score=6.0,
                at_ms=at_ms, summary="Rx power on lane 1 fell 6 dB in one step: dirty connector",
                peer_device="host-p1-00001", peer_port="eth0", end="local",
                evidence=[Evidence("rx_power_dbm", -7.1, baseline=-1.1, unit="dBm"),
                          Evidence("rx_step_db", -6.0, unit="dB", note="one-step drop")]),
        Finding(kind="congestion", scope="host", device=CONGESTED_HOST, port=None, lane=None,
                cause=Cause.CONGESTION, severity=Severity.TICKET, action=Action.REVIEW_CAPACITY, state="firing",
                score=2.0, at_ms=at_ms, summary="ECN marks and CNPs 8x the pod baseline on both NICs",
                evidence=[Evidence("ecn_marked_per_s", 5200.0, baseline=640.0, unit="1/s")]),
    ]
    with engine.begin() as conn:
        cs = apply_findings(conn=conn, findings=findings, at_ms=at_ms)
    return cs.opened


def seed_drain(engine: Engine, at_s: float) -> int | None:
    """A drain recommendation for the faulty link through the drains service; None when absent."""
    try:
        from datetime import UTC, datetime

        from service.drains.schemas import DrainSettings, Target, TargetKind
        from service.drains.service import recommend
    except ImportError:
        return None
    with engine.begin() as conn:
        row = recommend(conn=conn, target=Target(kind=TargetKind.LINK, device=FAULTY_LEAF, port=FAULTY_PORT),
                        reason="rx power 6 dB low on lane 1", cause="connector_contamination",
                        at=datetime.fromtimestamp(at_s, tz=UTC), settings=DrainSettings())
    return int(row.id)


def make_app(settings: Any) -> FastAPI:
    """The whole application, as served."""
    from service.api.app import create_app

    return create_app(settings)
