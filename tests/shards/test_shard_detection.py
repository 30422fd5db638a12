"""Detection per shard, on a control database and two telemetry shards (real servers, tests/shards/conftest.py):
each shard's cycle detects over its pods' samples with its state on the shard and alerts on the control
database; a fiber fault on a link between shards is attributed from both ends; a shard's cycle leaves the
other shards' alerts alone; and with one shard down, the other's cycle runs and alerts, on its own Celery queue
of a real worker."""

from __future__ import annotations

import json
import os
import subprocess
import sys
import time
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

import psycopg
import pytest
from celery import Celery
from sqlalchemy import Engine, event, text
from sqlalchemy.exc import OperationalError
from sqlalchemy.orm import Session

from service.alerts.service import apply_findings
from service.config import load_settings
from service.db import get_engine
from service.detection.findings import Action, Cause, Finding, Severity
from service.detection.service import detect_in, load_fabric
from service.detection.state import Config
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.shards.detection import ShardCycle, ownership, run_shard_cycle
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.worker import configure, detect_queue
from simulator.scenarios import Scenario
from simulator.telemetry import frame_samples, make_sim, resolve_inventory, timeline
from tests.shards.conftest import Cluster

pytestmark = pytest.mark.timeout(600)

T0 = 1_735_689_600.0
T0_MS = int(T0 * 1000)
MIN = 60_000
HISTORY_MIN = 75
# Two pods of leaves and hosts and one spine. Pod p1 lives on shard a, p2 on shard b, and the spine (no pod) on
# the default shard, a: every leaf-p2-* uplink is a link between shards. One fiber on such a link is damaged in
# both directions (leaf-p2-01:Ethernet1/3 <-> spine-01:Ethernet1/3), which only both ends' receivers tell apart
# from a dirty connector; and one connector inside pod p1 is dirty.
SPEC = {"seed": 4, "topology": {"shape": "two-tier", "hosts": 4, "pods": 2, "nics_per_host": 2, "gpus_per_host": 2,
                                "hosts_per_leaf": 2, "spines": 1, "optics_mix": {"400G-DR4": 1.0}},
        "faults": [{"type": "damaged_fiber", "device": "leaf-p2-01", "port": "Ethernet1/3", "lanes": [0],
                    "drop_db": 4, "wobble_db": 0, "both_directions": True, "at": "40m"},
                   {"type": "dirty_connector", "device": "host-p1-00001", "port": "eth1", "lanes": [1],
                    "drop_db": 4, "at": "40m"}]}
LINK = {("leaf-p2-01", "Ethernet1/3"), ("spine-01", "Ethernet1/3")}


@dataclass
class Bed:
    cluster: Cluster
    cycles: dict[str, list[ShardCycle]] = field(default_factory=dict)
    blind: list[Finding] = field(default_factory=list)  # shard b's findings without its far link ends
    next_ms: int = T0_MS + (HISTORY_MIN + 1) * MIN  # data time of the next test's cycles

    def times(self, n: int) -> list[int]:
        """n cycle times after every cycle run so far (each test its own, whatever their order)."""
        out = [self.next_ms + i * MIN for i in range(n)]
        self.next_ms += n * MIN
        return out

    def url(self, shard: str) -> str:
        return self.cluster.topology().url(shard)


def _alerts(engine: Engine) -> dict[str, Any]:
    with engine.connect() as conn:
        return {r.fingerprint: r for r in conn.execute(text("SELECT * FROM alerts"))}


def _scalar(url: str, sql: str, **params: Any) -> Any:
    with get_engine(url).connect() as conn:
        return conn.execute(text(sql), params).scalar()


def load_scenario(cluster: Cluster) -> None:
    """The scenario's inventory on the control database (and the shards' copies), its samples on their shards."""
    sc = Scenario.model_validate({"name": "t", **SPEC})
    inv = resolve_inventory(sc.inventory_source())
    with Session(cluster.engine) as s:
        upsert_inventory(session=s, inventory=Inventory.model_validate(inv))
        s.commit()
    topology = cluster.topology()
    apply(topology)
    sim = make_sim(inv, sc, T0)
    samples = []
    for t in timeline(T0, T0 + HISTORY_MIN * 60, 60):
        samples += list(frame_samples(sim, sim.step(t, 60)))
    report = ingest_samples(control=cluster.engine, topology=topology, samples=samples)
    assert report.errors == {} and report.reports["a"].written and report.reports["b"].written


@pytest.fixture(scope="module")
def bed(cluster: Cluster) -> Iterator[Bed]:
    """The scenario's inventory on the control database, its samples on their shards, and a cycle a minute of
    both shards from 10 to 75 minutes (plus shard b's cycles again under another state name, blind to its far
    link ends: what it would have said without them)."""
    load_scenario(cluster)
    topology = cluster.topology()
    bed = Bed(cluster)
    with cluster.engine.connect() as conn:
        own_b = ownership(conn, topology, "b")
        fabric_b = load_fabric(conn, sorted(own_b.devices.values()))
    for t in range(T0_MS + 10 * MIN, T0_MS + HISTORY_MIN * MIN + 1, MIN):
        for shard in ("a", "b"):
            bed.cycles.setdefault(shard, []).append(run_shard_cycle(topology, shard, t))
        with get_engine(bed.url("b")).begin() as conn:
            bed.blind += detect_in(conn, t, name="blind", fabric=fabric_b, save=False)
    yield bed


def _fired(cycles: list[ShardCycle]) -> set[tuple[str, str, str | None, str]]:
    return {(f.kind, f.device, f.port, f.cause.value) for c in cycles for f in c.outcome.findings
            if f.state == "firing"}


def test_each_shard_detects_its_own_pods_and_alerts_on_the_control_database(bed: Bed) -> None:
    a, b = _fired(bed.cycles["a"]), _fired(bed.cycles["b"])
    # the dirty connector in pod p1 is shard a's; nothing of pod p1 comes from shard b, nothing of p2 from a
    assert ("optical_degradation", "host-p1-00001", "eth1", "connector_contamination") in a
    assert not any("-p2-" in d for _, d, _, _ in a) and not any("-p1-" in d for _, d, _, _ in b), (a, b)
    alerts = _alerts(bed.cluster.engine)
    assert "optical_degradation/host-p1-00001:eth1" in alerts
    assert alerts["optical_degradation/host-p1-00001:eth1"].state == "firing"
    # findings and alerts on the control database; detector state and samples on the shards
    control = bed.cluster.control_url
    n_found = sum(len(c.outcome.findings) - sum(f.kind == "telemetry_gap" for f in c.outcome.findings)
                  for cs in bed.cycles.values() for c in cs)
    last = T0_MS + HISTORY_MIN * MIN
    assert _scalar(control, "SELECT count(*) FROM detection_findings WHERE at <= to_timestamp(:t / 1000.0)",
                   t=last) == n_found > 0
    assert _scalar(control, "SELECT count(*) FROM detector_state") == 0
    for shard in ("a", "b"):
        assert _scalar(bed.url(shard), "SELECT last_cycle_ms FROM detector_state WHERE name = 'default'") == last
        assert _scalar(bed.url(shard), "SELECT count(*) FROM detection_findings") == 0
        assert _scalar(bed.url(shard), "SELECT count(*) FROM alerts") == 0


def test_a_fiber_fault_between_shards_is_attributed_from_both_ends(bed: Bed) -> None:
    """Both receivers of the link lost light, which says fiber, not a connector: each shard reads the far end of
    its cross-shard links through the fleet tables, and each receiver's finding is raised by its own shard."""
    # every cycle of both shards read far link ends (the spine's for b; the p2 leaves' uplinks for a)
    assert all(c.far_samples > 0 and c.far_missing == {} for cs in bed.cycles.values() for c in cs)
    alerts = _alerts(bed.cluster.engine)
    on_link = {(r.device, r.port): r for r in alerts.values() if (r.device, r.port) in LINK}
    # one per receiver (an optical finding is the receiving end's), both fiber damage, each naming the far end
    assert set(on_link) == LINK, on_link
    for (dev, port), r in on_link.items():
        assert (r.kind, r.cause, r.state) == ("optical_degradation", "fiber_damage", "firing"), r
        assert {(r.peer_device, r.peer_port)} == LINK - {(dev, port)}
        raised = {c.shard for cs in bed.cycles.values() for c in cs for f in c.outcome.findings
                  if f.fingerprint == r.fingerprint}
        assert raised == {"a" if dev == "spine-01" else "b"}, (dev, raised)
    # without the far end, shard b took the same fault for a dirty connector at its own end
    blind = {(f.device, f.port, f.cause.value) for f in bed.blind if f.state == "firing" and f.kind ==
             "optical_degradation" and (f.device, f.port) in LINK}
    assert blind and {c for *_, c in blind} == {"connector_contamination"}, blind


def _finding(device: str, at_ms: int) -> Finding:
    return Finding(kind="scope_probe", scope="port", device=device, port="eth0", lane=None,
                   cause=Cause.CONGESTION, severity=Severity.TICKET, action=Action.NONE, state="firing",
                   score=1.0, at_ms=at_ms, summary=f"probe on {device}")


def test_a_shards_cycle_never_resolves_another_shards_alert(bed: Bed) -> None:
    """Shard a's cycles do not see pod p2's alert and must not age it; shard b's cycles, which are complete for
    it, resolve it. (Unscoped, apply_findings would have resolved it in shard a's cycles.)"""
    topology = bed.cluster.topology()
    engine = bed.cluster.engine
    t = bed.times(12)
    with engine.begin() as conn:
        # (complete for its own kind only: no other alert ages here; congestion has no hold-down)
        apply_findings(conn=conn, findings=[_finding("host-p2-00003", t[0])], at_ms=t[0], kinds=["scope_probe"])
    fp = "scope_probe/host-p2-00003:eth0"
    for at in t[1:6]:
        run_shard_cycle(topology, "a", at)
    assert _alerts(engine)[fp].state == "firing" and _alerts(engine)[fp].missed_cycles == 0
    for at in t[6:]:
        run_shard_cycle(topology, "b", at)
    assert _alerts(engine)[fp].state == "resolved"
    with engine.connect() as conn:
        actors = conn.execute(text("SELECT at_ms FROM alert_events e JOIN alerts a ON a.id = e.alert_id "
                                   "WHERE a.fingerprint = :f AND e.event = 'resolved'"), {"f": fp}).scalars().all()
    assert len(actors) == 1 and actors[0] in t[6:]


def test_a_failure_between_the_control_commit_and_the_shards_loses_nothing(bed: Bed) -> None:
    """The control database commits findings and alerts first; the shard's connection then dies at its commit.
    The shard keeps its old state, so the next cycle reads the same samples again; every stored finding has
    its alert."""
    topology = bed.cluster.topology()
    url_a = bed.url("a")
    t = bed.times(2)
    state = "SELECT watermark_ms, last_cycle_ms FROM detector_state WHERE name = 'default'"
    with get_engine(url_a).connect() as conn:
        before = tuple(conn.execute(text(state)).one())
    killed: list[int] = []

    def kill(conn: Any) -> None:  # the shard's backend, terminated as its transaction commits
        if not killed:
            killed.append(conn.connection.dbapi_connection.info.backend_pid)
            with psycopg.connect(url_a, autocommit=True) as admin:
                admin.execute("SELECT pg_terminate_backend(%s)", [killed[0]])

    shard_engine = get_engine(url_a)
    event.listen(shard_engine, "commit", kill)
    try:
        with pytest.raises(OperationalError):
            run_shard_cycle(topology, "a", t[0])
    finally:
        event.remove(shard_engine, "commit", kill)
    assert killed
    with get_engine(url_a).connect() as conn:
        assert tuple(conn.execute(text(state)).one()) == before  # the shard kept nothing of the cycle
    with bed.cluster.engine.connect() as conn:
        stored = conn.execute(text("SELECT f.fingerprint, a.last_seen_ms FROM detection_findings f LEFT JOIN alerts a "
                                   "ON a.fingerprint = f.fingerprint WHERE f.at = to_timestamp(:t / 1000.0) "
                                   "AND f.state = 'firing'"), {"t": t[0]}).all()
    assert stored and all(seen == t[0] for _, seen in stored), stored  # each firing finding with its alert
    again = run_shard_cycle(topology, "a", t[1])
    assert again.outcome.findings
    with get_engine(url_a).connect() as conn:
        # read from the old watermark on: the failed cycle's window again, and the new one
        assert tuple(conn.execute(text(state)).one()) == (t[1] - Config().lateness_ms, t[1])


def _gap_target(engine: Engine, device: str) -> None:
    """A target of this device whose last 10 collections failed: the detection cycle raises a telemetry gap."""
    with engine.begin() as conn:
        ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) SELECT id, 'snmp', "
                               "'127.0.0.1', '{}' FROM devices WHERE name = :d RETURNING id"), {"d": device}).scalar()
        conn.execute(text("INSERT INTO target_status (endpoint_id, consecutive_failures, last_error, samples) "
                          "VALUES (:e, 10, 'timeout', 0)"), {"e": ep})


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, worker: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        got = pred()
        if got:
            return got
        assert worker.poll() is None, f"the worker exited waiting for {what}"
        time.sleep(0.2)
    raise AssertionError(f"timed out waiting for {what}")


def test_beat_sends_one_cycle_per_shard_on_its_own_queue(bed: Bed) -> None:
    settings = load_settings(database_url=bed.cluster.control_url, shards=bed.cluster.settings().model_dump())
    beat = configure(Celery("fw-test-beat"), settings).conf.beat_schedule
    entries = {k: v for k, v in beat.items() if v["task"] == "fabricwatch.run_detection"}
    assert {k: (v["kwargs"], v["options"]["queue"]) for k, v in entries.items()} == {
        "run-detection-a": ({"shard": "a"}, "detect.a"), "run-detection-b": ({"shard": "b"}, "detect.b")}
    single = configure(Celery("fw-test-beat-1"), load_settings(database_url=bed.cluster.control_url)).conf
    assert [(k, v.get("kwargs"), v["options"].get("queue")) for k, v in single.beat_schedule.items()
            if v["task"] == "fabricwatch.run_detection"] == [("run-detection", None, None)]


def test_with_one_shard_down_the_other_shards_detection_runs_and_alerts(bed: Bed, broker_url: str) -> None:
    """Shard b stopped: a real worker runs both queues' cycles; shard a's runs and opens its telemetry-gap alert,
    and reports b's far ends unread; shard b's fails alone. Back up, b's next cycle catches up and alerts."""
    cluster, engine = bed.cluster, bed.cluster.engine
    _gap_target(engine, "leaf-p1-01")  # shard a's device
    _gap_target(engine, "leaf-p2-01")  # shard b's
    t = bed.times(4)
    redis = broker_url if broker_url.startswith("redis") else None
    shards = cluster.settings()
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": cluster.control_url,
           "FABRICWATCH_SHARDS_URLS": json.dumps(shards.urls), "FABRICWATCH_SHARDS_PODS": json.dumps(shards.pods)}
    if redis:
        env["FABRICWATCH_REDIS_URL"] = redis
    client = configure(Celery("fw-test-client"), load_settings(database_url=cluster.control_url, redis_url=redis,
                                                               shards=shards.model_dump()))
    cluster.shard_b.stop()
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "service.worker", "worker", "-I", "service.detection.tasks",
         "-Q", f"{detect_queue('a')},{detect_queue('b')}", "-P", "solo", "-c", "1", "--without-gossip",
         "--without-mingle", "--without-heartbeat", "-l", "WARNING"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    try:
        b_before = _scalar(bed.url("a"), "SELECT 1")  # shard a answers
        assert b_before == 1
        for shard in ("b", "a"):  # b first: its failure must not hold a's cycle up
            client.send_task("fabricwatch.run_detection", kwargs={"shard": shard, "at_ms": t[0]},
                             queue=detect_queue(shard), expires=300)
        _wait(lambda: _scalar(bed.url("a"), "SELECT last_cycle_ms FROM detector_state WHERE name = 'default'")
              == t[0], 240, "shard a's cycle", worker)  # a worker starting on a busy machine
        alerts = _alerts(engine)
        assert alerts["telemetry_gap/leaf-p1-01"].state == "firing"
        assert "telemetry_gap/leaf-p2-01" not in alerts  # b's device: only b's own cycle may raise it
        # the cycle run here says what it could not read: the p2 leaves' ends of the spine's links
        direct = run_shard_cycle(cluster.topology(), "a", t[1])
        assert list(direct.far_missing) == ["b"] and "telemetry_gap/leaf-p2-01" not in _alerts(engine)
        # `fabricwatch detect` runs every shard's cycle: a's runs, b's is named, exit 1
        cli = subprocess.run([sys.executable, "-m", "service.cli", "detect", "--at", str(t[2])], env=env,
                             capture_output=True, text=True, timeout=300)
        assert cli.returncode == 1, cli.stderr[-2000:]
        assert "shard a: cycle at" in cli.stderr and "shard b: the cycle failed" in cli.stderr, cli.stderr[-2000:]
        assert _scalar(bed.url("a"), "SELECT last_cycle_ms FROM detector_state WHERE name = 'default'") == t[2]
    finally:
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
        cluster.shard_b.start()
    log = err.decode(errors="replace")
    # b's task failed on its own queue, naming the refused connection
    assert "fabricwatch.run_detection" in log and "Connection refused" in log, log[-3000:]
    # b back: the same command runs b's cycle, and names a's (already run at that time) as failed
    cli = subprocess.run([sys.executable, "-m", "service.cli", "detect", "--at", str(t[2])], env=env,
                         capture_output=True, text=True, timeout=300)
    assert cli.returncode == 1 and "shard b: cycle at" in cli.stderr, cli.stderr[-2000:]
    assert "shard a: the cycle failed: cycle at" in cli.stderr and "is not after" in cli.stderr, cli.stderr[-2000:]
    back = run_shard_cycle(cluster.topology(), "b", t[3])
    assert back.far_missing == {}
    assert _alerts(engine)["telemetry_gap/leaf-p2-01"].state == "firing"
    assert _scalar(bed.url("b"), "SELECT last_cycle_ms FROM detector_state WHERE name = 'default'") == t[3]
