"""A small simulated fabric in the test database: inventory from the simulator's topology builder,
30 minutes of telemetry from its model (with a dirty connector and a congested host, so optics
margins, PFC/ECN/CNP rates and link health have something to show)."""

from __future__ import annotations

import re
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from fastapi import FastAPI
from sqlalchemy import Engine, text

from service.db import session_scope
from service.inventory.service import upsert_inventory
from service.telemetry.service import ingest_samples
from simulator.scenarios import Scenario
from simulator.telemetry import simulate
from simulator.topology import TopologyParams, build_topology
from tests.paths import FIXTURES

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


def seed_alerts(engine: Engine, at_ms: int) -> list[int]:
    """Open two alerts through the alerts service (a page on the dirty connector, a ticket on the
    congested host)."""
    from service.alerts.service import apply_findings
    from service.detection.findings import Action, Cause, Evidence, Finding, Severity
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


def seed_drain(engine: Engine, at_s: float, alert_id: int | None = None) -> int:
    """A drain recommendation for the faulty link (from `alert_id`) through the drains service."""
    from service.drains.schemas import DrainSettings, Target, TargetKind
    from service.drains.service import recommend
    with engine.begin() as conn:
        row = recommend(conn=conn, target=Target(kind=TargetKind.LINK, device=FAULTY_LEAF, port=FAULTY_PORT),
                        reason="rx power 6 dB low on lane 1", cause="connector_contamination",
                        at=datetime.fromtimestamp(at_s, tz=UTC), settings=DrainSettings(), alert_id=alert_id)
    return int(row.id)


def make_app(settings: Any) -> FastAPI:
    """The whole application, as served."""
    from service.api.app import create_app

    return create_app(settings)


# --- NCCL runs -----------------------------------------------------------------------------------

NCCL_DIR = FIXTURES / "nccl"
NCCL_H100 = "issue_nccl-tests_309_all_reduce_2node_16xH100_HGX_mpi_xpmem_warning_interleaved.txt"
NCCL_GB10 = "gb10-training_all_gather_2node_2xGB10_dgx_spark.txt"
NCCL_SLOW_FROM, NCCL_SLOW_FACTOR = 64 << 20, 0.78   # a degraded rail: large messages lose ~22 % busbw
_ROW = re.compile(r"^(\s*)(\d+)(\s+.*)$")


@dataclass(frozen=True)
class NcclSeeded:
    test: str
    scope: str
    baseline_run_id: int
    latest_run_id: int
    other_run_id: int       # a run of another (test, scope): only its own baseline, nothing to compare


def slowed(output: str, *, from_bytes: int = NCCL_SLOW_FROM, factor: float = NCCL_SLOW_FACTOR) -> str:
    """The same nccl-tests output with out-of-place algbw/busbw scaled by `factor` from `from_bytes` up."""
    lines = []
    for line in output.splitlines():
        m = _ROW.match(line)
        cols = line.split()
        if m and len(cols) == 13 and int(m.group(2)) >= from_bytes:
            # columns: size count type redop root | time algbw busbw #wrong | time algbw busbw #wrong
            cols[6], cols[7] = (f"{float(c) * factor:.2f}" for c in cols[6:8])
            line = m.group(1) + "  ".join(cols)
        lines.append(line)
    return "\n".join(lines) + "\n"


def seed_nccl_runs(engine: Engine, end_s: float) -> NcclSeeded:
    """Import real nccl-tests outputs through the NCCL service: the 2-node 16xH100 all_reduce as the
    baseline, the same run with large-message busbw cut as the latest (a regression), and an all_gather
    of another scope."""
    from service.nccl.parser import parse_nccl_tests
    from service.nccl.service import import_run
    h100 = (NCCL_DIR / NCCL_H100).read_text()
    imports = [(NCCL_GB10, (NCCL_DIR / NCCL_GB10).read_text(), START + 60),
               (NCCL_H100, h100, START + 300),
               (NCCL_H100 + " (slowed)", slowed(h100), end_s - 120)]
    ids = []
    with engine.begin() as conn:
        for source, body, at in imports:
            res = import_run(conn=conn, run=parse_nccl_tests(body, source), actor="seed", job="nccl-nightly",
                             run_at=datetime.fromtimestamp(at, tz=UTC))
            ids.append(res.run_id)
        test, scope = conn.execute(text("SELECT test, scope FROM nccl_runs WHERE id = :i"), {"i": ids[1]}).one()
    return NcclSeeded(test, scope, ids[1], ids[2], ids[0])


# --- incident timeline ---------------------------------------------------------------------------


@dataclass(frozen=True)
class Fault:
    """One scripted incident on a link; times in minutes after START (None: not reached yet)."""

    cause: str
    kind: str               # the alert's condition
    device: str
    port: str
    peer_device: str
    peer_port: str
    onset: float
    alert: float
    drained: float
    returned: float | None


# Healthy links only (not the dirty connector's, not the congested host's): returning to service
# runs the real soak check on their counters. Recovery seconds per cause, for the tests:
#   connector_contamination  detect 90/30/60   mitigate 90/390/180   restore 960/1020
#   flap_storm               detect 15/30      mitigate 60/210       restore 945
#   transmitter_wearout      detect 240        mitigate 600          (still drained)
INCIDENT_SCRIPT = (
    Fault("connector_contamination", "rx_power_low", "host-p2-00006", "eth0", "leaf-p2-r0-01", "Ethernet1/2",
          1.0, 2.5, 4.0, 20.0),
    Fault("connector_contamination", "rx_power_low", "host-p1-00003", "eth1", "leaf-p1-r1-01", "Ethernet1/3",
          3.0, 3.5, 10.0, 27.0),
    Fault("connector_contamination", "rx_power_low", "host-p2-00007", "eth1", "leaf-p2-r1-01", "Ethernet1/3",
          12.0, 13.0, 16.0, None),
    Fault("flap_storm", "link_flaps", "leaf-p2-r0-01", "Ethernet1/5", "spine-01", "Ethernet1/3",
          5.0, 5.25, 6.25, 22.0),
    Fault("flap_storm", "link_flaps", "leaf-p1-r1-01", "Ethernet1/6", "spine-02", "Ethernet1/2",
          8.0, 8.5, 12.0, None),
    Fault("transmitter_wearout", "tx_bias_high", "host-p2-00008", "eth1", "leaf-p2-r1-01", "Ethernet1/4",
          2.0, 6.0, 16.0, None),
)
SOAK_S = 300.0   # the scripted returns soak 5 min: the simulated fabric holds only 30 min of data


def seed_incident_timeline(engine: Engine, script: tuple[Fault, ...] = INCIDENT_SCRIPT) -> list[int]:
    """Play each fault through the incidents service (suspect at onset, an alert through the alerts
    service, drained, in repair, verifying, returned after a real soak check)."""
    from service.alerts.service import apply_findings, resolve
    from service.detection.findings import Action, Cause, Finding, Severity
    from service.incidents import service as incidents
    from service.incidents.schemas import IncidentSettings, State

    def at(minute: float) -> datetime:
        return datetime.fromtimestamp(START + minute * STEP, tz=UTC)

    actions = {"connector_contamination": Action.CLEAN, "flap_storm": Action.RESEAT,
               "transmitter_wearout": Action.REPLACE_LOCAL}
    soak = IncidentSettings(window_s=SOAK_S)
    ids = []
    for f in script:
        with engine.begin() as conn:
            pod = conn.execute(text("SELECT pod FROM devices WHERE name = :d"), {"d": f.device}).scalar()
            link = dict(kind="link", device=f.device, port=f.port, peer_device=f.peer_device, peer_port=f.peer_port)
            inc, _ = incidents.open_or_get(conn=conn, pod=pod, cause=f.cause, summary=f"{f.kind} on {f.device}",
                                           at=at(f.onset), actor="detector", **link)
            alert_ms = int(at(f.alert).timestamp() * 1000)
            finding = Finding(kind=f.kind, scope="port", device=f.device, port=f.port, lane=None,
                              cause=Cause(f.cause), severity=Severity.PAGE, action=actions[f.cause],
                              state="firing", score=1.0, at_ms=alert_ms, peer_device=f.peer_device,
                              peer_port=f.peer_port, summary=f"{f.kind.replace('_', ' ')} on {f.device}:{f.port}")
            alert_id = apply_findings(conn=conn, findings=[finding], at_ms=alert_ms, kinds=[]).opened[0]
            incidents.open_or_get(conn=conn, alert_id=alert_id, at=at(f.alert), **link)  # links the alert
            incidents.transition(conn=conn, incident_id=inc.id, to=State.DRAINED, actor="noc", at=at(f.drained))
            if f.returned is not None:
                incidents.transition(conn=conn, incident_id=inc.id, to=State.IN_REPAIR, actor="tech",
                                     at=at(f.drained + 0.5))
                incidents.transition(conn=conn, incident_id=inc.id, to=State.VERIFYING, actor="tech",
                                     at=at(f.returned - SOAK_S / STEP - 0.5))
                incidents.transition(conn=conn, incident_id=inc.id, to=State.RETURNED, actor="noc",
                                     at=at(f.returned), settings=soak)
                resolve(conn=conn, alert_id=alert_id, actor="noc", at_ms=int(at(f.returned).timestamp() * 1000),
                        comment="returned to service")
        ids.append(int(inc.id))
    return ids
