"""Incident logic: open or find, transition (with the verification soak gate), notes, owner, outcome, precision.

Functions take a SQLAlchemy `Connection` inside the caller's transaction, so the pipeline can
open an incident and its drain recommendation atomically. Times are data time where the
caller has one (`at`), else wall-clock now.
"""

from __future__ import annotations

import statistics
from collections import defaultdict
from collections.abc import Sequence
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

from sqlalchemy import Connection, Row, func, insert, select, text, update

from service.incidents.models import Incident, IncidentEvent
from service.incidents.schemas import (
    OPEN_STATES,
    TRANSITIONS,
    IncidentSettings,
    PartBad,
    PrecisionRead,
    PrecisionRow,
    RepairAction,
    SoakCheck,
    SoakReport,
    State,
    incident_settings,
)
from service.telemetry.counters import increase
from service.telemetry.store import read_samples

INCIDENTS = Incident.__table__
EVENTS = IncidentEvent.__table__
_EPOCH = datetime(1970, 1, 1, tzinfo=UTC)

ERROR_COUNTERS = ("port_fec_uncorrectable_codewords_total", "port_symbol_errors_total", "port_rx_fcs_errors_total")
FLAP_COUNTERS = ("port_link_down_events_total", "port_carrier_changes_total")
RX_POWER = "optic_rx_power_dbm"
_TERMINAL = (State.RETURNED, State.CLOSED, State.FALSE_ALARM)


class IncidentError(Exception):
    """Base for incident errors the API turns into problem documents."""


class IncidentNotFound(IncidentError):
    def __init__(self, incident_id: int) -> None:
        super().__init__(f"incident {incident_id} does not exist")
        self.incident_id = incident_id


class IllegalTransition(IncidentError):
    def __init__(self, incident_id: int, current: str, attempted: str, allowed: Sequence[str]) -> None:
        shown = ", ".join(allowed) if allowed else "none (terminal state)"
        super().__init__(f"incident {incident_id} is '{current}'; cannot go to '{attempted}'; allowed: {shown}")
        self.current, self.attempted, self.allowed = current, attempted, list(allowed)


class SoakNotClean(IncidentError):
    def __init__(self, incident_id: int, report: SoakReport) -> None:
        super().__init__(f"incident {incident_id} cannot return to service: {report.summary}")
        self.report = report


class OutcomeNotAllowed(IncidentError):
    pass


def _now(at: datetime | None) -> datetime:
    if at is None:
        return datetime.now(UTC)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def entity_key(kind: str, device: str, port: str | None = None, peer_device: str | None = None,
               peer_port: str | None = None) -> str:
    """Canonical entity key; a link is the same entity whichever end the finding names."""
    if kind in ("link", "port") and port is not None and peer_device is not None and peer_port is not None:
        a, b = sorted((f"{device}:{port}", f"{peer_device}:{peer_port}"))
        return f"link:{a}|{b}"
    if kind in ("link", "port") and port is not None:
        return f"port:{device}:{port}"
    return f"{kind}:{device}"


def add_event(*, conn: Connection, incident_id: int, actor: str, kind: str, at: datetime | None = None,
              text_: str | None = None, from_state: str | None = None, to_state: str | None = None,
              data: dict[str, Any] | None = None) -> None:
    """Append one attributed, timestamped timeline entry."""
    conn.execute(insert(EVENTS).values(incident_id=incident_id, ts=_now(at), actor=actor, kind=kind, text=text_,
                                       from_state=from_state, to_state=to_state, data=data or {}))


def get(*, conn: Connection, incident_id: int, lock: bool = False) -> Row[Any]:
    """One incident row, or IncidentNotFound."""
    q = select(INCIDENTS).where(INCIDENTS.c.id == incident_id)
    row = conn.execute(q.with_for_update() if lock else q).first()
    if row is None:
        raise IncidentNotFound(incident_id)
    return row


def get_open(*, conn: Connection, entity: str) -> Row[Any] | None:
    return conn.execute(select(INCIDENTS).where(INCIDENTS.c.entity == entity,
                                                INCIDENTS.c.state.in_([s.value for s in OPEN_STATES]))).first()


def open_or_get(*, conn: Connection, kind: str, device: str, port: str | None = None,
                peer_device: str | None = None, peer_port: str | None = None, link_id: int | None = None,
                pod: str | None = None, cause: str | None = None, part_number: str | None = None,
                alert_id: int | None = None, fingerprint: str | None = None, summary: str | None = None,
                at: datetime | None = None, actor: str = "fabricwatch") -> tuple[Row[Any], bool]:
    """The open incident for this entity, created as `suspect` if there is none; returns (row, created)."""
    now = _now(at)
    entity = entity_key(kind, device, port, peer_device, peer_port)
    # ON CONFLICT on the partial unique index: two pipeline workers never open two incidents.
    stmt = text("""
        INSERT INTO incidents (entity_kind, entity, device, port, peer_device, peer_port, link_id, pod, state,
                               cause, part_number, alert_id, fingerprint, summary, fault_at, opened_at,
                               updated_at, state_since)
        VALUES (:kind, :entity, :device, :port, :peer_device, :peer_port, :link_id, :pod, 'suspect', :cause,
                :part_number, :alert_id, :fingerprint, :summary, :now, :now, :now, :now)
        ON CONFLICT (entity) WHERE state IN ('suspect', 'drain_recommended', 'drained', 'in_repair', 'verifying')
        DO NOTHING RETURNING id""")
    new_id = conn.execute(stmt, {"kind": kind, "entity": entity, "device": device, "port": port,
                                 "peer_device": peer_device, "peer_port": peer_port, "link_id": link_id,
                                 "pod": pod, "cause": cause, "part_number": part_number, "alert_id": alert_id,
                                 "fingerprint": fingerprint, "summary": summary, "now": now}).scalar()
    if new_id is not None:
        add_event(conn=conn, incident_id=new_id, actor=actor, kind="created", at=now, to_state=State.SUSPECT,
                  text_=summary, data={"cause": cause, "alert_id": alert_id, "fingerprint": fingerprint})
        return get(conn=conn, incident_id=new_id), True
    row = get_open(conn=conn, entity=entity)
    assert row is not None
    changes: dict[str, Any] = {}
    if alert_id is not None and row.alert_id is None:
        changes["alert_id"] = alert_id
    if cause is not None and row.cause is None:
        changes["cause"] = cause
    if changes:
        conn.execute(update(INCIDENTS).where(INCIDENTS.c.id == row.id).values(updated_at=now, **changes))
        row = get(conn=conn, incident_id=row.id)
    return row, False


def transition(*, conn: Connection, incident_id: int, to: State | str, actor: str, note: str | None = None,
               at: datetime | None = None, settings: IncidentSettings | None = None,
               data: dict[str, Any] | None = None) -> Row[Any]:
    """Move an incident to `to`; IllegalTransition names current/attempted/allowed, SoakNotClean the numbers."""
    to = State(to)
    row = get(conn=conn, incident_id=incident_id, lock=True)
    current = State(row.state)
    allowed = TRANSITIONS[current]
    if to not in allowed:
        raise IllegalTransition(incident_id, current, to, [s.value for s in allowed])
    now = _now(at)
    extra = dict(data or {})
    if to is State.RETURNED:
        report = verify_soak(conn=conn, incident=row, at=now, settings=settings)
        if not report.clean:
            raise SoakNotClean(incident_id, report)
        extra["soak"] = report.model_dump(mode="json")
    values: dict[str, Any] = {"state": to.value, "state_since": now, "updated_at": now}
    if to in _TERMINAL:
        values["closed_at"] = now
    conn.execute(update(INCIDENTS).where(INCIDENTS.c.id == incident_id).values(**values))
    add_event(conn=conn, incident_id=incident_id, actor=actor, kind="transition", at=now, from_state=current,
              to_state=to, text_=note, data=extra)
    if to in _TERMINAL:
        # Lazy import: drains depends on incidents, not the other way round at import time.
        from service.drains.service import release_for_incident

        release_for_incident(conn=conn, incident_id=incident_id, actor=actor, at=now, reason=f"incident {to}")
    return get(conn=conn, incident_id=incident_id)


def add_note(*, conn: Connection, incident_id: int, actor: str, text_: str, at: datetime | None = None) -> None:
    get(conn=conn, incident_id=incident_id)
    add_event(conn=conn, incident_id=incident_id, actor=actor, kind="note", at=at, text_=text_)
    conn.execute(update(INCIDENTS).where(INCIDENTS.c.id == incident_id).values(updated_at=_now(at)))


def set_owner(*, conn: Connection, incident_id: int, actor: str, owner: str | None,
              at: datetime | None = None) -> Row[Any]:
    row = get(conn=conn, incident_id=incident_id, lock=True)
    conn.execute(update(INCIDENTS).where(INCIDENTS.c.id == incident_id).values(owner=owner, updated_at=_now(at)))
    add_event(conn=conn, incident_id=incident_id, actor=actor, kind="owner", at=at,
              text_=f"owner {row.owner or '(none)'} -> {owner or '(none)'}", data={"from": row.owner, "to": owner})
    return get(conn=conn, incident_id=incident_id)


def record_outcome(*, conn: Connection, incident_id: int, actor: str, repair_action: RepairAction | str,
                   part_bad: PartBad | str, note: str | None = None, at: datetime | None = None) -> Row[Any]:
    """Record what the repair did and whether the part was really bad (feeds precision)."""
    repair_action, part_bad = RepairAction(repair_action), PartBad(part_bad)
    row = get(conn=conn, incident_id=incident_id, lock=True)
    if row.state == State.SUSPECT:
        raise OutcomeNotAllowed(f"incident {incident_id} is 'suspect': nothing was drained or repaired yet; "
                                "close it as false_alarm instead")
    now = _now(at)
    conn.execute(update(INCIDENTS).where(INCIDENTS.c.id == incident_id).values(
        repair_action=repair_action.value, part_bad=part_bad.value, outcome_note=note, outcome_by=actor,
        outcome_at=now, updated_at=now))
    add_event(conn=conn, incident_id=incident_id, actor=actor, kind="outcome", at=now, text_=note,
              data={"repair_action": repair_action.value, "part_bad": part_bad.value,
                    "previous": {"repair_action": row.repair_action, "part_bad": row.part_bad}})
    return get(conn=conn, incident_id=incident_id)


def list_incidents(*, conn: Connection, state: Sequence[str] | None = None, open_only: bool = False,
                   device: str | None = None, cause: str | None = None, owner: str | None = None,
                   pod: str | None = None, limit: int = 100, offset: int = 0) -> list[Row[Any]]:
    c = INCIDENTS.c
    conds = []
    if state:
        conds.append(c.state.in_(list(state)))
    if open_only:
        conds.append(c.state.in_([s.value for s in OPEN_STATES]))
    if device:
        conds.append((c.device == device) | (c.peer_device == device))
    for col, val in ((c.cause, cause), (c.owner, owner), (c.pod, pod)):
        if val is not None:
            conds.append(col == val)
    q = select(INCIDENTS).where(*conds).order_by(c.id.desc()).limit(limit).offset(offset)
    return list(conn.execute(q))


def timeline(*, conn: Connection, incident_id: int) -> list[Row[Any]]:
    return list(conn.execute(select(EVENTS).where(EVENTS.c.incident_id == incident_id).order_by(EVENTS.c.id)))


def precision(*, conn: Connection) -> PrecisionRead:
    """Live precision per cause and per part number: confirmed / (confirmed + refuted).

    Confirmed: the outcome says the part was really bad. Refuted: the part was fine, or the
    incident was closed as a false alarm without an outcome. Unknown outcomes are counted apart.
    """
    rows = conn.execute(text("""
        SELECT cause, part_number,
               CASE WHEN part_bad = 'yes' THEN 'confirmed'
                    WHEN part_bad = 'no' OR (part_bad IS NULL AND state = 'false_alarm') THEN 'refuted'
                    ELSE 'unknown' END AS verdict
        FROM incidents WHERE part_bad IS NOT NULL OR state = 'false_alarm'""")).all()

    def table(key_index: int) -> list[PrecisionRow]:
        counts: dict[str | None, dict[str, int]] = defaultdict(lambda: {"confirmed": 0, "refuted": 0, "unknown": 0})
        for r in rows:
            counts[r[key_index]][r.verdict] += 1
        out = []
        for key, n in sorted(counts.items(), key=lambda kv: (kv[0] is None, kv[0] or "")):
            decided = n["confirmed"] + n["refuted"]
            out.append(PrecisionRow(key=key, **n, precision=round(n["confirmed"] / decided, 4) if decided else None))
        return out

    return PrecisionRead(by_cause=table(0), by_part_number=table(1))


# ---------------------------------------------------------------------------- verification soak


@dataclass(frozen=True, slots=True)
class _Port:
    id: int
    device: str
    name: str

    @property
    def label(self) -> str:
        return f"{self.device}:{self.name}"


def incident_ports(*, conn: Connection, incident: Row[Any]) -> list[_Port]:
    """The ports whose counters decide the soak: both link ends, or every linked port of a device."""
    if incident.entity_kind in ("link", "port"):
        pairs = [(incident.device, incident.port)]
        if incident.peer_device and incident.peer_port:
            pairs.append((incident.peer_device, incident.peer_port))
        rows = conn.execute(text("""
            SELECT p.id, d.name, p.name FROM ports p JOIN devices d ON d.id = p.device_id
            WHERE (d.name, p.name) IN (SELECT * FROM unnest(CAST(:devs AS text[]), CAST(:ports AS text[])))
            ORDER BY p.id"""), {"devs": [a for a, _ in pairs], "ports": [b for _, b in pairs]}).all()
    else:
        rows = conn.execute(text("""
            SELECT p.id, d.name, p.name FROM ports p JOIN devices d ON d.id = p.device_id
            WHERE d.name = :dev AND EXISTS (SELECT 1 FROM links k WHERE k.a_port_id = p.id OR k.b_port_id = p.id)
            ORDER BY p.id"""), {"dev": incident.device}).all()
    return [_Port(*r) for r in rows]


def _fetch(conn: Connection, series_ids: list[int], lo: datetime, hi: datetime) -> dict[int, list[tuple[datetime,
                                                                                                         float]]]:
    out: dict[int, list[tuple[datetime, float]]] = defaultdict(list)
    if not series_ids:
        return out
    got = read_samples(conn, lo, hi, series_ids)  # rows, blocks and compressed chunks, by series and time
    for sid, us, value in zip(got.sid.tolist(), got.ts_us.tolist(), got.value.tolist(), strict=True):
        out[sid].append((_EPOCH + timedelta(microseconds=us), value))
    return out


def verify_soak(*, conn: Connection, incident: Row[Any], at: datetime | None = None,
                settings: IncidentSettings | None = None) -> SoakReport:
    """Check the soak window ending at `at`: no error/flap counter increase, data that covers the
    window, and rx power per lane within tolerance of the pre-fault baseline."""
    s = settings or incident_settings()
    end = _now(at)
    window = timedelta(seconds=s.window_s)
    start = end - window
    ports = incident_ports(conn=conn, incident=incident)
    checks: list[SoakCheck] = []
    if not ports:
        checks.append(SoakCheck(check="coverage", ok=False, subject=incident.entity,
                                message=f"no inventory ports found for {incident.entity}"))
    by_id = {p.id: p for p in ports}
    metrics = (*ERROR_COUNTERS, *FLAP_COUNTERS, RX_POWER)
    series = conn.execute(text(
        "SELECT s.id, s.metric, s.port_id, s.lane, s.counter_bits, s.saturating FROM ports p "
        "JOIN series s ON s.device_id = p.device_id AND s.port_id = p.id "  # the identity key's order
        "WHERE p.id = ANY(:ports) AND s.metric = ANY(:metrics) ORDER BY s.port_id, s.metric, s.lane"),
        {"ports": list(by_id), "metrics": list(metrics)}).all()
    counter_ids = [r.id for r in series if r.metric != RX_POWER]
    # One window's worth before the start, to find the reading each increase is measured from.
    data = _fetch(conn, counter_ids, start - window, end)
    span: dict[int, float] = defaultdict(float)
    for r in series:
        if r.metric == RX_POWER:
            continue
        pts = data.get(r.id, [])
        before = [p for p in pts if p[0] <= start]
        inside = [p for p in pts if p[0] > start]
        used = ([before[-1]] if before else []) + inside
        if len(used) < 2:
            continue
        first = max(used[0][0], start)
        span[r.port_id] = max(span[r.port_id], (used[-1][0] - first).total_seconds())
        total, unknown = 0.0, 0
        for (_, v0), (_, v1) in zip(used, used[1:], strict=False):
            inc = increase(v0, v1, bits=r.counter_bits, saturating=r.saturating)
            if inc is None:
                unknown += 1
            else:
                total += inc
        p = by_id[r.port_id]
        flap = r.metric in FLAP_COUNTERS
        ok = total == 0 and unknown == 0
        what = "flaps" if flap else "errors"
        msg = (f"{p.label} {r.metric} +{total:g} in the soak window" if not unknown else
               f"{p.label} {r.metric} +{total:g} with {unknown} unreadable step(s) (saturated counter)")
        checks.append(SoakCheck(check="flaps" if flap else "counter", ok=ok, subject=p.label,
                                message=msg if not ok else f"{p.label} {r.metric}: no {what}",
                                numbers={"metric": r.metric, "increase": total, "unknown_steps": unknown}))
    need = s.min_coverage * s.window_s
    for p in ports:
        got = span.get(p.id, 0.0)
        ok = got >= need
        checks.append(SoakCheck(
            check="coverage", ok=ok, subject=p.label,
            message=(f"{p.label} error counters cover {got / 60:.1f} of {s.window_s / 60:.1f} min, "
                     f"need {need / 60:.1f}"),
            numbers={"covered_s": got, "window_s": s.window_s, "needed_s": need}))
    # Link-state events recorded by collectors count as flaps too.
    downs = conn.execute(text(
        "SELECT port_id, count(*) FROM link_events WHERE port_id = ANY(:ports) AND state = 'down' "
        "AND ts > :lo AND ts <= :hi GROUP BY port_id"), {"ports": list(by_id), "lo": start, "hi": end}).all()
    for pid, n in downs:
        checks.append(SoakCheck(check="flaps", ok=False, subject=by_id[pid].label,
                                message=f"{by_id[pid].label} went down {n} time(s) in the soak window",
                                numbers={"link_down_events": n}))
    checks.extend(_rx_power_checks(conn, incident, series, by_id, start, end, s))
    failed = [c for c in checks if not c.ok]
    summary = ("clean: " + f"{len(checks)} checks passed over {s.window_s:g} s" if not failed
               else "; ".join(c.message for c in failed[:5]) + (f" (+{len(failed) - 5} more)" if len(failed) > 5
                                                                else ""))
    return SoakReport(clean=not failed, window_start=start, window_end=end, summary=summary, checks=checks)


def _rx_power_checks(conn: Connection, incident: Row[Any], series: Sequence[Row[Any]], by_id: dict[int, _Port],
                     start: datetime, end: datetime, s: IncidentSettings) -> list[SoakCheck]:
    rx = [r for r in series if r.metric == RX_POWER]
    if not rx:
        return []
    fault = incident.fault_at
    base_lo = fault - timedelta(seconds=s.baseline_window_s)
    base = _fetch(conn, [r.id for r in rx], base_lo, fault - timedelta(microseconds=1))
    now = _fetch(conn, [r.id for r in rx], start, end)
    out = []
    for r in rx:
        p = by_id[r.port_id]
        subject = f"{p.label}:lane{r.lane}" if r.lane is not None else p.label
        b, c = base.get(r.id), now.get(r.id)
        if not c:
            if b:
                out.append(SoakCheck(check="rx_power", ok=False, subject=subject,
                                     message=f"{subject} has no rx power readings in the soak window"))
            continue
        cur = statistics.median(v for _, v in c)
        if not b:
            out.append(SoakCheck(check="rx_power", ok=True, subject=subject, numbers={"current_dbm": cur},
                                 message=f"{subject} rx {cur:.2f} dBm; no pre-fault baseline to compare"))
            continue
        ref = statistics.median(v for _, v in b)
        delta = cur - ref
        ok = abs(delta) <= s.rx_power_tolerance_db
        out.append(SoakCheck(
            check="rx_power", ok=ok, subject=subject,
            message=(f"{subject} rx {cur:.2f} dBm vs baseline {ref:.2f} dBm ({delta:+.2f} dB, "
                     f"tolerance ±{s.rx_power_tolerance_db:g} dB)"),
            numbers={"current_dbm": round(cur, 3), "baseline_dbm": round(ref, 3), "delta_db": round(delta, 3),
                     "tolerance_db": s.rx_power_tolerance_db}))
    return out


def count_open(*, conn: Connection) -> int:
    return conn.execute(select(func.count()).select_from(INCIDENTS).where(
        INCIDENTS.c.state.in_([s.value for s in OPEN_STATES]))).scalar_one()
