"""Detection as plain functions over PostgreSQL: `detect_at` (live) and `backtest` (replay).

Both go through `_advance`: read the samples with ts in (watermark, T - lateness], observe
them in order, run one cycle at T. Live keeps the state (and watermark) in detector_state,
so a cycle reads only what arrived since the previous one; backtest starts a fresh state at
`from` exactly as live does on its first cycle, so the same cycle times give the same findings.
Samples that arrive later than `lateness` after their own timestamp are not seen by live
(they are behind the watermark) but are by a later backtest: that is the one source of
difference, and `lateness_ms` is its knob.
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime

import numpy as np
from sqlalchemy import Connection, Engine, text

from service.detection.engine import Engine as DetectionEngine
from service.detection.findings import Finding
from service.detection.forest import ModelStore
from service.detection.replay import DAY_MS, HistoryReader
from service.detection.state import (
    AXIS,
    NPRIO,
    USED_METRICS,
    Config,
    Fabric,
    FeatureState,
    fec_limit_for,
    thresholds_arrays,
)
from service.detection.store import StateCache, held_states
from service.telemetry import store as sample_store

_FABRIC_SQL = """
SELECT p.id, p.name, d.name, d.role, p.speed_gbps, p.gpu, o.part_number, o.type, o.lanes, o.thresholds,
       COALESCE(la.cable_type, lb.cable_type), COALESCE(la.b_port_id, lb.a_port_id)
FROM ports p JOIN devices d ON d.id = p.device_id
LEFT JOIN optics o ON o.port_id = p.id
LEFT JOIN links la ON la.a_port_id = p.id
LEFT JOIN links lb ON lb.b_port_id = p.id
{where}
ORDER BY p.id
"""
# some devices' ports, and the far end of each of their links
_OF_DEVICES = """WHERE p.device_id = ANY(:devices)
   OR p.id IN (SELECT l.b_port_id FROM links l JOIN ports a ON a.id = l.a_port_id WHERE a.device_id = ANY(:devices)
               UNION ALL
               SELECT l.a_port_id FROM links l JOIN ports b ON b.id = l.b_port_id WHERE b.device_id = ANY(:devices))"""


def load_fabric(conn: Connection, devices: list[int] | None = None) -> Fabric:
    """The inventory as a Fabric (ports ordered by id): all of it, or these devices' ports and the far
    ends of their links (a shard's cycle: service/shards/detection.py)."""
    if devices is None:
        rows = conn.execute(text(_FABRIC_SQL.format(where=""))).all()
    else:
        rows = conn.execute(text(_FABRIC_SQL.format(where=_OF_DEVICES)), {"devices": devices}).all()
    dev_names: list[str] = []
    dev_roles: list[str] = []
    dpos: dict[str, int] = {}
    ids, names, dev, lanes, speed, fec, copper, cohorts, th, peer_ids = [], [], [], [], [], [], [], [], [], []
    gpu_port: dict[tuple[int, int], int] = {}
    for i, (pid, pname, dname, role, spd, gpu, part, otype, olanes, thr, cable, peer) in enumerate(rows):
        if dname not in dpos:
            dpos[dname] = len(dev_names)
            dev_names.append(dname)
            dev_roles.append(role)
        d = dpos[dname]
        ids.append(pid)
        names.append(pname)
        dev.append(d)
        lanes.append(olanes or 1)
        speed.append(spd * 1e9 if spd else np.nan)
        fec.append(fec_limit_for(otype, spd))
        copper.append(cable in ("dac", "aoc"))
        cohorts.append(f"{part or 'none'}|{int(spd) if spd else '?'}G|{role}")
        th.append(thr)
        peer_ids.append(peer)
        if gpu is not None:
            gpu_port[(d, int(gpu))] = i
    index = {p: i for i, p in enumerate(ids)}
    cohort_names = sorted(set(cohorts))
    cpos = {c: i for i, c in enumerate(cohort_names)}
    return Fabric(
        port_ids=np.asarray(ids, np.int64), port_names=names, dev=np.asarray(dev, np.int64), dev_names=dev_names,
        dev_roles=dev_roles, peer=np.asarray([index.get(q, -1) if q is not None else -1 for q in peer_ids], np.int64),
        n_lanes=np.asarray(lanes, np.int64), speed_bps=np.asarray(speed, float),
        cohort=np.asarray([cpos[c] for c in cohorts], np.int64), cohort_names=cohort_names,
        fec_limit=np.asarray(fec, float), copper=np.asarray(copper, bool), th=thresholds_arrays(th),
        gpu_port=gpu_port)


@dataclass
class SeriesIndex:
    """series.id -> (metric code, entity index on that metric's axis), plus counter widths."""

    metric_of: np.ndarray   # (max_id + 1,) int16, -1 = not used by detection
    entity_of: np.ndarray   # (max_id + 1,) int64
    bits: np.ndarray
    sat: np.ndarray
    max_id: int


_SERIES_SQL = """
SELECT s.id, s.metric, s.device_id, d.name, s.port_id, s.lane, s.priority, s.gpu, s.counter_bits, s.saturating
FROM series s JOIN devices d ON d.id = s.device_id WHERE s.metric = ANY(:m) AND s.id > :after ORDER BY s.id
"""


def load_series(conn: Connection, fabric: Fabric, old: SeriesIndex | None = None) -> SeriesIndex:
    after = old.max_id if old is not None else 0
    rows = conn.execute(text(_SERIES_SQL), {"m": list(USED_METRICS), "after": after}).all()
    top = max(after, conn.execute(text("SELECT COALESCE(max(id), 0) FROM series")).scalar_one())
    metric_of = np.full(top + 1, -1, np.int16)
    entity_of = np.full(top + 1, -1, np.int64)
    bits = np.zeros(top + 1, np.int16)
    sat = np.zeros(top + 1, bool)
    if old is not None:
        n = len(old.metric_of)
        metric_of[:n], entity_of[:n], bits[:n], sat[:n] = old.metric_of, old.entity_of, old.bits, old.sat
    code = {m: i for i, m in enumerate(USED_METRICS)}
    dpos = {n: i for i, n in enumerate(fabric.dev_names)}
    for sid, metric, _dev_id, dname, port_id, lane, prio, gpu, cbits, csat in rows:
        e = series_entity(fabric, dpos, metric, dname, port_id, lane, prio, gpu)
        if e < 0:
            continue
        metric_of[sid], entity_of[sid] = code[metric], e
        bits[sid], sat[sid] = cbits or 0, bool(csat)
    return SeriesIndex(metric_of, entity_of, bits, sat, top)


def series_entity(fabric: Fabric, dpos: dict[str, int], metric: str, device: str, port_id: int | None,
                  lane: int | None, prio: int | None, gpu: int | None) -> int:
    """The entity a series of a detection metric feeds on its metric's axis; -1 when the fabric has none.
    `dpos`: device name -> index in fabric.dev_names."""
    axis = AXIS[metric]
    if axis == "port" and gpu is not None:
        p = fabric.gpu_port.get((dpos.get(device, -1), int(gpu)), -1)
    else:
        p = fabric.port_index.get(port_id, -1) if port_id is not None else -1
    if p < 0:
        return -1
    if axis == "lane":
        return int(fabric.lane_index(np.asarray([p]), np.asarray([lane if lane is not None else -1]))[0])
    if axis == "prio":
        return p * NPRIO + int(prio) if prio is not None and 0 <= prio < NPRIO else -1
    return p


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def iso_time(ms: int) -> str:
    """A data time for people: 2026-11-30T12:00:00Z (with milliseconds only when it has some)."""
    return _dt(ms).isoformat(timespec="milliseconds" if ms % 1000 else "seconds").replace("+00:00", "Z")


def read_samples(conn: Connection, fabric: Fabric, sx: SeriesIndex, lo_ms: int, hi_ms: int
                 ) -> tuple[dict[str, tuple[np.ndarray, np.ndarray, np.ndarray]], SeriesIndex]:
    """Samples with ts in (lo, hi] for the metrics detection uses, grouped per metric."""
    # rows, import blocks and compressed chunks, as arrays (service/telemetry/store.py)
    got = sample_store.read_samples(conn, _dt(lo_ms), _dt(hi_ms))
    got = got.take(np.nonzero(got.ts_ms > lo_ms)[0])
    if not len(got):
        return {}, sx
    got = got.take(np.argsort(got.ts_us, kind="stable"))  # in time order, as the engine takes them
    sid, ts, val = got.sid, got.ts_ms, got.value
    if sid.max() > sx.max_id:
        sx = load_series(conn, fabric, sx)
    known = sid <= sx.max_id  # a series created after the index was read: picked up next cycle
    sid, ts, val = sid[known], ts[known], val[known]
    m = sx.metric_of[sid]
    out = {}
    for code in np.unique(m[m >= 0]).tolist():
        sel = m == code
        out[USED_METRICS[code]] = (sx.entity_of[sid[sel]], ts[sel], val[sel])
    return out, sx


def _apply_meta(st: FeatureState, sx: SeriesIndex) -> None:
    """Counter widths and saturation from the series table onto the counter tracks."""
    for code, metric in enumerate(USED_METRICS):
        sel = (sx.metric_of == code) & (sx.bits > 0)
        if sel.any():
            st.set_counter_meta(metric, sx.entity_of[sel], sx.bits[sel], sx.sat[sel])


# Observes samples of (lo, hi] that are not in the cycle's own database (a shard's far link ends, read through
# the control database's fleet tables: service/shards/detection.py).
ObserveMore = Callable[[FeatureState, int, int], None]


def _advance(conn: Connection, eng: DetectionEngine, st: FeatureState, sx: SeriesIndex, at_ms: int,
             reader: HistoryReader | None = None, more: ObserveMore | None = None) -> tuple[list[Finding], SeriesIndex]:
    hi = at_ms - st.cfg.lateness_ms
    lo = st.watermark_ms if st.watermark_ms is not None else hi - st.cfg.initial_lookback_ms
    if hi > lo:
        # live: one query for the new samples; a replay: the next slice of history read in bulk
        batch, sx2 = read_samples(conn, st.fabric, sx, lo, hi) if reader is None else reader.read(lo, hi, sx)
        if sx2 is not sx:
            sx = sx2
            _apply_meta(st, sx)
        st.observe(batch)
        if more is not None:
            more(st, lo, hi)
        st.watermark_ms = hi
    return eng.run_cycle(st, at_ms), sx


def save_findings(conn: Connection, findings: list[Finding]) -> None:
    if not findings:
        return
    conn.execute(text(
        "INSERT INTO detection_findings (at, fingerprint, kind, state, payload) VALUES "
        "(:at, :fp, :k, :s, CAST(:p AS jsonb)) ON CONFLICT ON CONSTRAINT detection_finding_once DO NOTHING"),
        [{"at": _dt(f.at_ms), "fp": f.fingerprint, "k": f.kind, "s": f.state,
          "p": json.dumps(f.to_dict(), default=_json_default)} for f in findings])


def _json_default(o: object) -> object:
    """numpy scalars as JSON numbers (Finding.to_dict has already made non-finite floats None)."""
    if isinstance(o, np.floating):
        v = float(o)
        return v if np.isfinite(v) else None
    if isinstance(o, np.integer):
        return int(o)
    return str(o)


def detect_at(engine: Engine, at_ms: int, *, name: str = "default", config: Config | None = None,
              states: StateCache | None = None) -> list[Finding]:
    """One live cycle at data time `at_ms`: read new samples, observe, evaluate, persist state and models."""
    with engine.begin() as conn:
        return detect_in(conn, at_ms, name=name, config=config, states=states)


def detect_in(conn: Connection, at_ms: int, *, name: str = "default", config: Config | None = None,
              fabric: Fabric | None = None, more: ObserveMore | None = None, save: bool = True,
              states: StateCache | None = None) -> list[Finding]:
    """detect_at in the caller's transaction: the pipeline commits state, findings and alerts together,
    so a cycle that fails after detection keeps nothing and the next one re-reads its samples.
    A shard's cycle (service/shards/detection.py) gives the `fabric` (its part of the control database's
    inventory), observes its far link ends' samples with `more`, and stores the findings itself (`save`
    False: on the control database). The state stays in this process between cycles (`states`, default the
    process's own: store.StateCache) and is read from the database only when another process wrote it since."""
    states = held_states if states is None else states
    conn.execute(text("SELECT pg_advisory_xact_lock(hashtext('fabricwatch-detect:' || :n))"), {"n": name})
    if fabric is None:
        fabric = load_fabric(conn)
    st = states.take(conn, name, fabric, config)
    if st is None:
        st = FeatureState(fabric, config)
    if st.last_cycle_ms is not None and at_ms <= st.last_cycle_ms:
        raise ValueError(f"cycle at {iso_time(at_ms)} is not after the last cycle at {iso_time(st.last_cycle_ms)}")
    sx = states.series(conn, fabric, load_series)
    _apply_meta(st, sx)
    eng = DetectionEngine(states.take_models(conn))
    findings, _ = _advance(conn, eng, st, sx, at_ms, more=more)
    states.save_models(conn, eng.models)
    states.save(conn, name, st)
    if save:
        save_findings(conn, findings)
    return findings


def backtest(engine: Engine, from_ms: int, to_ms: int, step_ms: int, *, config: Config | None = None,
             on_cycle: Callable[[int, list[Finding]], None] | None = None,
             span_ms: int | None = DAY_MS, fabric: Fabric | None = None,
             more: ObserveMore | None = None) -> list[Finding]:
    """Replay stored history: cycles at from, from+step, ..., <= to, from a fresh state and fresh models.

    Writes nothing; returns every cycle's findings in order. The history is read forward `span_ms` at a
    time, each sample once (service/detection/replay.py); None reads each cycle's window with its own
    query, as a live cycle does (the benchmark's anchor). A shard's replay gives its `fabric` and observes its
    far link ends with `more`, as its live cycle does (detect_in; service/shards/detection.py).
    """
    if step_ms <= 0:
        raise ValueError("step must be positive")
    out: list[Finding] = []
    with engine.connect() as conn:
        if fabric is None:
            fabric = load_fabric(conn)
        st = FeatureState(fabric, config)
        sx = load_series(conn, fabric)
        _apply_meta(st, sx)
        eng = DetectionEngine(ModelStore())
        last = from_ms + (to_ms - from_ms) // step_ms * step_ms  # the last cycle's time
        reader = (HistoryReader(conn, fabric, span_ms, last - st.cfg.lateness_ms, read_ahead=engine)
                  if span_ms is not None else None)
        try:
            t = from_ms
            while t <= to_ms:
                findings, sx = _advance(conn, eng, st, sx, t, reader, more)
                out.extend(findings)
                if on_cycle is not None:
                    on_cycle(t, findings)
                t += step_ms
        finally:
            if reader is not None:
                reader.close()
    return out
