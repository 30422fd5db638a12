"""Detection per shard (issue 20; docs/architecture.md#shards): each shard's cycle on its own Celery queue.

A shard's cycle detects over the devices of its pods: their samples, the detector state and the cohort models
are on the shard; the inventory (its devices' ports, optics and links, and the far end of each link) comes from
the control database, which the findings and alerts are written to. Two rules keep shards apart:

- A finding belongs to the shard of its device (the end at fault), the shard of the device's pod. A shard's
  cycle keeps only its own findings and is complete for its own alerts only: it ages (and so resolves) open
  alerts of its pods alone (`apply_findings(scope=...)`), never another shard's.
- A link whose far end lives on another shard (a leaf to a spine) is seen whole: the far end's ports are in
  the fabric, and their samples of the cycle's window are read through the control database's fleet tables
  (postgres_fdw foreign partitions; service/shards/fleet.py), one query per far shard. Both shards of such a
  link see both ends, and each keeps the findings of its own end. A far shard that does not answer leaves
  its ends unread for that cycle (named in `far_missing`); the cycle goes on.

Commit order: the control database first (findings and alerts, one transaction), then the shard (detector
state and models). A failure between the two leaves the shard's state where it was, so the next cycle reads
the same samples again: nothing is lost, and no finding is stored without its alert. What can happen is the
reverse of a loss: the same samples evaluated by two cycles, which refreshes the same alerts again.

A backtest replays each shard's history as its live cycles would have run (`replay_shard`): the same fabric,
the far link ends read through the fleet tables per cycle, the shard's own findings only, and its alerts applied
in shadow (temporary) tables on a control database connection, since the alert tables, the pod map and the
devices the alert state machine reads are there; the shard itself is only read.
"""

from __future__ import annotations

import logging
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

import numpy as np
import psycopg
from sqlalchemy import ColumnElement, Connection, Engine, func, text
from sqlalchemy.exc import DBAPIError

from service.alerts.service import alerts as alerts_table
from service.db import get_engine
from service.detection.findings import Finding
from service.detection.service import backtest, detect_in, load_fabric, save_findings, series_entity
from service.detection.state import USED_METRICS, Config, Fabric, FeatureState
from service.pipeline import CycleOutcome, apply_cycle, shadowed_alerts
from service.shards.fleet import read_fleet_samples
from service.shards.setup import FLEET_SCHEMA
from service.shards.topology import NO_POD, Topology
from service.telemetry.coverage import gap_findings

log = logging.getLogger(__name__)


@dataclass(frozen=True)
class Ownership:
    """What one shard's cycle answers for: its devices (name -> id) and the pods of its alerts."""

    shard: str
    devices: dict[str, int]
    pod_shard: dict[str, str]  # every known pod -> its shard (stored map, then the setting)
    device_pod: dict[str, str]  # every device -> its pod ('' for none)
    default: str

    def shard_of_pod(self, pod: str | None) -> str:
        return self.pod_shard.get(pod or NO_POD, self.default)

    def scope(self) -> ColumnElement[bool]:
        """The alerts this shard's cycle is complete for: those of its pods. An alert of a pod no shard lists
        (its device gone from the inventory, say) is the default shard's, as a pod-less device is."""
        pod = func.coalesce(alerts_table.c.pod, NO_POD)
        if self.shard == self.default:
            return pod.not_in(sorted(p for p, s in self.pod_shard.items() if s != self.shard))
        return pod.in_(sorted(p for p, s in self.pod_shard.items() if s == self.shard))


def ownership(conn: Connection, topology: Topology, shard: str) -> Ownership:
    """Read from the control database: the stored pod map (pods it lacks: where the setting puts them)."""
    topology.url(shard)  # UnknownShard for a name the topology does not have
    stored = dict(conn.execute(text("SELECT pod, shard FROM shard_pods")).all())
    pod_shard = {**topology.pod_shard, **stored}
    rows = conn.execute(text("SELECT id, name, coalesce(pod, '') FROM devices")).all()
    own = Ownership(shard, {}, pod_shard, {name: pod for _, name, pod in rows}, topology.default)
    own.devices.update({name: int(i) for i, name, pod in rows if own.shard_of_pod(pod) == shard})
    return own


_FAR_SERIES_SQL = f"""
SELECT pod, series_id, metric, device, port, lane, priority, gpu, counter_bits, saturating
FROM {FLEET_SCHEMA}.series
WHERE pod = ANY(:pods) AND device = ANY(:devices) AND metric = ANY(:metrics)
  AND (port = ANY(:ports) OR gpu IS NOT NULL)
"""


@dataclass
class FarEnds:
    """The far ends of a shard's cross-shard links, read through the fleet tables each cycle (`observe`)."""

    control: Engine
    fabric: Fabric
    own: Ownership
    missing: dict[str, str] = field(default_factory=dict)  # far shard -> why its ends were not read
    read: int = 0  # samples read

    def _far_ports(self) -> dict[str, dict[tuple[str, str], int]]:
        """Per far shard: (device, port) -> port id of the fabric's ports that are not the shard's own."""
        fab = self.fabric
        out: dict[str, dict[tuple[str, str], int]] = {}
        for i, pid in enumerate(fab.port_ids.tolist()):
            dev = fab.dev_names[fab.dev[i]]
            if dev not in self.own.devices:
                far = self.own.shard_of_pod(self.own.device_pod.get(dev))
                out.setdefault(far, {})[(dev, fab.port_names[i])] = int(pid)
        return out

    def observe(self, st: FeatureState, lo_ms: int, hi_ms: int) -> None:
        """Observe the far ends' samples with ts in (lo, hi], one read per far shard (a down one is skipped)."""
        self.missing.clear()
        dpos = {n: i for i, n in enumerate(st.fabric.dev_names)}
        lo, hi = (datetime.fromtimestamp(t / 1000, tz=UTC) for t in (lo_ms, hi_ms))
        for far, ports in sorted(self._far_ports().items()):
            pods = sorted({self.own.device_pod.get(d, NO_POD) for d, _ in ports})
            try:
                with self.control.begin() as conn:  # read_fleet_samples sets a transaction-local option
                    found = conn.execute(text(_FAR_SERIES_SQL), {
                        "pods": pods, "devices": sorted({d for d, _ in ports}), "metrics": list(USED_METRICS),
                        "ports": sorted({p for _, p in ports})}).all()
                    kept, ents = [], []
                    for r in found:
                        pid = ports.get((r.device, r.port)) if r.port is not None else None
                        e = series_entity(st.fabric, dpos, r.metric, r.device, pid, r.lane, r.priority, r.gpu)
                        if e >= 0 and (pid is not None or r.gpu is not None):
                            kept.append(r)
                            ents.append(e)
                    got = read_fleet_samples(conn, kept, {p: far for p in pods}, lo, hi) if kept else None
            except (DBAPIError, psycopg.Error) as exc:
                why = " ".join(str(getattr(exc, "orig", exc) or exc).split())[:300]
                log.warning("shard %s: far link ends on shard %s not read this cycle: %s", self.own.shard, far, why)
                self.missing[far] = why
                continue
            if got is None or not len(got):
                continue
            got = got.take(np.nonzero(got.ts_ms > lo_ms)[0])
            got = got.take(np.argsort(got.ts_us, kind="stable"))  # in time order, as the engine takes them
            ent = np.asarray(ents, np.int64)
            metric = np.asarray([r.metric for r in kept])
            bits = np.asarray([r.counter_bits or 0 for r in kept], np.int16)
            sat = np.asarray([bool(r.saturating) for r in kept])
            batch = {}
            for m in np.unique(metric).tolist():
                idx = np.flatnonzero(metric == m)
                if (bits[idx] > 0).any():
                    st.set_counter_meta(m, ent[idx], bits[idx], sat[idx])
                sel = np.isin(got.sid, idx)
                batch[m] = (ent[got.sid[sel]], got.ts_ms[sel], got.value[sel])
            self.read += st.observe(batch)


@dataclass
class ShardCycle:
    """One shard's cycle: the pipeline's outcome, and the far shards whose link ends it could not read."""

    shard: str
    outcome: CycleOutcome
    far_missing: dict[str, str]
    far_samples: int

    def summary(self) -> dict[str, Any]:
        return {"shard": self.shard, **self.outcome.summary(), "far_missing": self.far_missing,
                "far_samples": self.far_samples}


def run_shard_cycle(topology: Topology, shard: str, at_ms: int, *, name: str = "default",
                    config: Config | None = None) -> ShardCycle:
    """Detect on `shard` at data time `at_ms`, then alert on the control database (module docstring)."""
    control = get_engine(topology.control_url)
    with get_engine(topology.url(shard)).begin() as shard_conn:  # commits last: see the module docstring
        # detect_in's lock taken before the pod map is read: a pod's move switches it, and carries the pod's
        # state, while holding it (service/shards/rebalance.py)
        shard_conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('fabricwatch-detect:' || :n))"), {"n": name})
        with control.connect() as conn:
            own = ownership(conn, topology, shard)
            fabric = load_fabric(conn, sorted(own.devices.values()))
        far = FarEnds(control, fabric, own)
        found = detect_in(shard_conn, at_ms, name=name, config=config, fabric=fabric, more=far.observe, save=False)
        mine = [f for f in found if f.device in own.devices]  # a far end's findings are its own shard's
        with control.begin() as conn:
            save_findings(conn, mine)
            gaps = [g for g in gap_findings(conn, at_ms=at_ms) if g.device in own.devices]
            outcome = apply_cycle(conn, mine + gaps, at_ms, scope=own.scope())
    return ShardCycle(shard, outcome, dict(far.missing), far.read)


def run_all_shards(topology: Topology, at_ms: int, *, name: str = "default",
                   config: Config | None = None) -> tuple[dict[str, ShardCycle], dict[str, str]]:
    """Every shard's cycle in turn, here (`fabricwatch detect`, or a task sent without a shard): one that fails
    (its shard down, or a time not after its last cycle) is named in the second result, and the others run."""
    from service.migrate import one_line

    done: dict[str, ShardCycle] = {}
    failed: dict[str, str] = {}
    for shard in sorted(topology.shards):
        try:
            done[shard] = run_shard_cycle(topology, shard, at_ms, name=name, config=config)
        except (DBAPIError, psycopg.Error, ValueError) as exc:
            failed[shard] = one_line(exc)
            log.error("shard %s: detection cycle failed: %s", shard, failed[shard])
    return done, failed


@dataclass
class ShardReplay:
    """One shard's backtest: its cycles' outcomes, and the far shards whose link ends some cycle could not read."""

    shard: str
    outcomes: list[CycleOutcome] = field(default_factory=list)
    far_missing: dict[str, str] = field(default_factory=dict)  # far shard -> why (the last cycle's reason)
    far_samples: int = 0


def replay_shard(topology: Topology, shard: str, from_ms: int, to_ms: int, step_ms: int, *,
                 config: Config | None = None,
                 on_cycle: Callable[[CycleOutcome], None] | None = None) -> ShardReplay:
    """Backtest one shard (module docstring): the alert changes its live cycles would have made over [from, to],
    changing nothing. Gap findings are live only, as in the unsharded replay."""
    control = get_engine(topology.control_url)
    with control.connect() as conn:
        own = ownership(conn, topology, shard)
        fabric = load_fabric(conn, sorted(own.devices.values()))
    far = FarEnds(control, fabric, own)
    done = ShardReplay(shard)

    def observe(st: FeatureState, lo_ms: int, hi_ms: int) -> None:
        far.observe(st, lo_ms, hi_ms)
        done.far_missing.update(far.missing)

    with control.connect() as conn, shadowed_alerts(conn):

        def cycle(at_ms: int, findings: list[Finding]) -> None:
            mine = [f for f in findings if f.device in own.devices]  # a far end's findings are its own shard's
            with conn.begin():
                outcome = apply_cycle(conn, mine, at_ms, drains=False, scope=own.scope())
            done.outcomes.append(outcome)
            if on_cycle is not None:
                on_cycle(outcome)

        backtest(get_engine(topology.url(shard)), from_ms, to_ms, step_ms, config=config, on_cycle=cycle,
                 fabric=fabric, more=observe)
    done.far_samples = far.read
    return done
