"""Drain logic: recommend (plan + safety verdict + incident), approve/reject/done, release, the breaker.

Every safety decision runs under one transaction-level advisory lock, so two pipeline workers
(or an approval racing a recommendation) never both pass a floor that only one of them fits.
Nothing here runs an executor: approval queues an execution (service/drains/execution.py) that a
worker runs after the approving transaction has committed, so the lock is held for milliseconds.
Functions take a SQLAlchemy `Connection` inside the caller's transaction; `at` is data time
where the caller has one (the pipeline), else now.
"""

from __future__ import annotations

import logging
from collections import Counter
from datetime import UTC, datetime, timedelta
from typing import Any

from celery.exceptions import SoftTimeLimitExceeded
from sqlalchemy import Connection, Row, insert, select, text, update
from sqlalchemy.exc import DBAPIError

from service.alerts.models import Alert
from service.alerts.service import add_comment
from service.detection.findings import Finding
from service.drains import execution
from service.drains.executors import TemplateError, plan_commands
from service.drains.models import DrainBreaker, DrainRecommendation
from service.drains.planner import Plan, plan_target, safe_word, target_for_finding
from service.drains.safety import FleetState, evaluate
from service.drains.schemas import (
    ACTIVE_STATUSES,
    OPEN_STATUSES,
    UNSETTLED_STATUSES,
    BreakerRead,
    DrainAction,
    DrainSettings,
    DrainStatus,
    Target,
    TargetKind,
    Verdict,
    drain_settings,
)
from service.drains.topology import FabricView, load_graph
from service.incidents import service as incidents
from service.incidents.schemas import State

DRAINS = DrainRecommendation.__table__
BREAKER = DrainBreaker.__table__
ALERTS = Alert.__table__
# What the API reads: each drain with the state of its alert (null when it has none, or it is gone).
_READ = select(DRAINS, ALERTS.c.state.label("alert_state")).select_from(
    DRAINS.outerjoin(ALERTS, ALERTS.c.id == DRAINS.c.alert_id))
_LOCK_KEY = 74_201_300   # pg_advisory_xact_lock key for drain safety decisions
NOTE_ACTOR = "fabricwatch-drains"   # who notes a failed recommendation on its alert's timeline
log = logging.getLogger(__name__)


class DrainError(Exception):
    """Base for drain errors the API turns into problem documents."""


class DrainNotFound(DrainError):
    def __init__(self, drain_id: int) -> None:
        super().__init__(f"drain recommendation {drain_id} does not exist")


class DrainStateError(DrainError):
    def __init__(self, drain_id: int, current: str, attempted: str, allowed_from: list[str],
                 why: str | None = None) -> None:
        super().__init__(f"drain recommendation {drain_id} is '{current}'" + (f" ({why})" if why else "")
                         + f"; cannot {attempted} it (only from: {', '.join(allowed_from)})")
        self.current, self.attempted, self.allowed_from = current, attempted, allowed_from


def _now(at: datetime | None) -> datetime:
    if at is None:
        return datetime.now(UTC)
    return at if at.tzinfo else at.replace(tzinfo=UTC)


def _lock(conn: Connection) -> None:
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})


def get(*, conn: Connection, drain_id: int, lock: bool = False) -> Row[Any]:
    """One drain with its alert's state (`alert_state`)."""
    q = _READ.where(DRAINS.c.id == drain_id)
    row = conn.execute(q.with_for_update(of=DRAINS) if lock else q).first()
    if row is None:
        raise DrainNotFound(drain_id)
    return row


def list_drains(*, conn: Connection, status: list[str] | None = None, incident_id: int | None = None,
                pod: str | None = None, device: str | None = None, limit: int = 100,
                offset: int = 0) -> list[Row[Any]]:
    c = DRAINS.c
    q = _READ
    if status:
        q = q.where(c.status.in_(status))
    if incident_id is not None:
        q = q.where(c.incident_id == incident_id)
    if pod is not None:
        q = q.where(c.pod == pod)
    if device is not None:
        q = q.where((c.device == device) | (c.peer_device == device))
    return list(conn.execute(q.order_by(c.id.desc()).limit(limit).offset(offset)))


# ---------------------------------------------------------------------------- breaker


def _breaker(conn: Connection, lock: bool = False) -> Row[Any]:
    conn.execute(text("INSERT INTO drain_breaker (id, tripped) VALUES (1, false) ON CONFLICT (id) DO NOTHING"))
    q = select(BREAKER).where(BREAKER.c.id == 1)
    return conn.execute(q.with_for_update() if lock else q).one()


def _recommended_in_window(conn: Connection, breaker: Row[Any], s: DrainSettings, at: datetime,
                           exclude: int | None) -> int:
    since = at - timedelta(seconds=s.breaker_window_s)
    if breaker.reset_at is not None and breaker.reset_at > since:
        since = breaker.reset_at  # a reset starts the count afresh
    return conn.execute(text(
        "SELECT count(*) FROM drain_recommendations WHERE recommended_at > :since AND recommended_at <= :at "
        "AND id IS DISTINCT FROM :ex"), {"since": since, "at": at, "ex": exclude}).scalar_one()


def breaker_state(*, conn: Connection, settings: DrainSettings | None = None,
                  at: datetime | None = None) -> BreakerRead:
    s, now = settings or drain_settings(), _now(at)
    b = _breaker(conn)
    return BreakerRead(tripped=b.tripped, tripped_at=b.tripped_at, trip_reason=b.trip_reason, reset_at=b.reset_at,
                       reset_by=b.reset_by, reset_note=b.reset_note, window_s=s.breaker_window_s, limit=s.breaker_max,
                       recommended_in_window=_recommended_in_window(conn, b, s, now, None))


def reset_breaker(*, conn: Connection, actor: str, note: str | None = None, at: datetime | None = None,
                  settings: DrainSettings | None = None) -> BreakerRead:
    """Close the breaker (attributed); drains recommended before the reset no longer count."""
    now = _now(at)
    _lock(conn)
    _breaker(conn, lock=True)
    conn.execute(update(BREAKER).where(BREAKER.c.id == 1).values(tripped=False, reset_at=now, reset_by=actor,
                                                                  reset_note=note))
    return breaker_state(conn=conn, settings=settings, at=now)


# ---------------------------------------------------------------------------- fleet state and verdicts


def fleet_state(*, conn: Connection, view: FabricView, settings: DrainSettings, at: datetime,
                exclude: int | None = None) -> FleetState:
    """What is out now: links down (port_oper_up) or held by active drains, drained hosts, pods, breaker."""
    graph = view.graph(conn)
    st = FleetState(unavailable=view.down_links(conn, at, settings.down_lookback_s), active_by_pod=Counter())
    rows = conn.execute(select(DRAINS.c.id, DRAINS.c.pod, DRAINS.c.link_ids, DRAINS.c.host_ids, DRAINS.c.target_kind,
                               DRAINS.c.device).where(DRAINS.c.status.in_([s.value for s in ACTIVE_STATUSES]))).all()
    for r in rows:
        if r.id == exclude:
            continue
        st.unavailable.update(r.link_ids)
        st.drained_hosts.update(r.host_ids)
        st.active_by_pod[r.pod or ""] += 1
        if r.target_kind == TargetKind.SWITCH and (d := graph.device(r.device)) is not None:
            st.drained_switches.add(d.id)
    b = _breaker(conn)
    st.breaker_tripped, st.breaker_reason = b.tripped, b.trip_reason
    st.recommended_in_window = _recommended_in_window(conn, b, settings, at, exclude)
    return st


def _part_number(conn: Connection, device: str, port: str | None) -> str | None:
    if port is None:
        return None
    return conn.execute(text(
        "SELECT o.part_number FROM optics o JOIN ports p ON p.id = o.port_id JOIN devices d ON d.id = p.device_id "
        "WHERE d.name = :d AND p.name = :p"), {"d": device, "p": port}).scalar()


def _trip(conn: Connection, verdict: Verdict, at: datetime) -> None:
    check = next(c for c in verdict.checks if c.constraint == "circuit_breaker")
    conn.execute(update(BREAKER).where(BREAKER.c.id == 1, BREAKER.c.tripped.is_(False)).values(
        tripped=True, tripped_at=at, trip_reason=check.message))


def recommend(*, conn: Connection, target: Target, reason: str, incident_id: int | None = None,
              cause: str | None = None, action: DrainAction | None = None, at: datetime | None = None,
              settings: DrainSettings | None = None, alert_id: int | None = None, fingerprint: str | None = None,
              summary: str | None = None, actor: str = "fabricwatch", view: FabricView | None = None) -> Row[Any]:
    """Create or update the incident and the drain recommendation for `target`, with a fresh verdict.

    Idempotent per incident and target: a repeated call re-evaluates the open (blocked or
    pending) recommendation instead of adding one, and leaves an active drain alone. `view`: the graph and
    down links, shared by the recommendations of one cycle (the drains, breaker and counts are read each time,
    so each verdict sees the recommendations made before it).
    """
    s, now, view = settings or drain_settings(), _now(at), view or FabricView()
    _lock(conn)
    graph = view.graph(conn)
    plan = plan_target(graph=graph, target=target, settings=s, action=action)
    if incident_id is not None:
        inc = incidents.get(conn=conn, incident_id=incident_id)
    else:
        inc, _ = incidents.open_or_get(
            conn=conn, kind=plan.kind.value, device=plan.device, port=plan.port, peer_device=plan.peer_device,
            peer_port=plan.peer_port, link_id=plan.link_id, pod=plan.effect.pod, cause=cause,
            part_number=_part_number(conn, plan.device, plan.port), alert_id=alert_id, fingerprint=fingerprint,
            summary=summary or reason, at=now, actor=actor)
    entity = incidents.entity_key(plan.kind.value, plan.device, plan.port, plan.peer_device, plan.peer_port)
    existing = conn.execute(select(DRAINS).where(
        DRAINS.c.incident_id == inc.id, DRAINS.c.target == entity, DRAINS.c.action == plan.action.value,
        DRAINS.c.status.in_([x.value for x in (*OPEN_STATUSES, *ACTIVE_STATUSES)])).order_by(DRAINS.c.id.desc())
    ).first()
    if existing is not None and existing.status in ACTIVE_STATUSES:
        return existing   # already approved or in place; nothing to re-decide
    state = fleet_state(conn=conn, view=view, settings=s, at=now, exclude=existing.id if existing else None)
    verdict = evaluate(graph=graph, effect=plan.effect, state=state, settings=s, at=now)
    if "circuit_breaker" in verdict.blocked_by and not state.breaker_tripped:
        _trip(conn, verdict, now)
    cause_word = safe_word(cause or inc.cause, "unknown")
    commands = plan_commands(action=plan.action, settings=s, ports=plan.ports, host=plan.host,
                             incident=f"incident-{inc.id}", cause=cause_word)
    status = DrainStatus.PENDING if verdict.safe else DrainStatus.BLOCKED
    values: dict[str, Any] = {
        "status": status.value, "verdict": verdict.model_dump(mode="json"), "commands": commands,
        "updated_at": now, "reason": reason, "cause": cause or inc.cause, "pod": plan.effect.pod,
        "link_ids": sorted(plan.effect.link_ids), "host_ids": sorted(plan.effect.host_ids)}
    if alert_id is not None:
        values["alert_id"] = alert_id   # the latest alert behind it: its resolve withdraws the drain
    if verdict.safe and (existing is None or existing.recommended_at is None):
        values["recommended_at"] = now   # counted by the breaker from its first safe verdict
    if existing is None:
        drain_id = conn.execute(insert(DRAINS).values(
            incident_id=inc.id, target_kind=plan.kind.value, target=entity, device=plan.device, port=plan.port,
            peer_device=plan.peer_device, peer_port=plan.peer_port, action=plan.action.value, created_at=now,
            **values).returning(DRAINS.c.id)).scalar_one()
    else:
        drain_id = existing.id
        conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(**values))
    changed = existing is None or existing.verdict.get("summary") != verdict.summary
    if verdict.safe and inc.state == State.SUSPECT:
        incidents.transition(conn=conn, incident_id=inc.id, to=State.DRAIN_RECOMMENDED, actor=actor, at=now,
                             note=f"drain {drain_id} ({plan.action}) recommended: {verdict.summary}",
                             data={"drain_id": drain_id})
    elif changed:
        incidents.add_event(conn=conn, incident_id=inc.id, actor=actor, kind="drain_" + status.value, at=now,
                            text_=f"drain {drain_id} ({plan.action}): {verdict.summary}",
                            data={"drain_id": drain_id, "blocked_by": verdict.blocked_by})
    return get(conn=conn, drain_id=drain_id)


def recommend_for_finding(*, conn: Connection, finding: Finding, alert_id: int | None = None,
                          at: datetime | None = None, settings: DrainSettings | None = None,
                          reason: str | None = None, view: FabricView | None = None) -> Row[Any] | None:
    """The pipeline's entry point: a firing Finding -> incident + drain recommendation (or None: no drain).

    `reason` defaults to the finding's summary; the pipeline passes its alert's (the episode's peak), so a
    cycle on the way down does not rewrite why the drain was recommended."""
    if finding.state != "firing":
        return None
    target = target_for_finding(finding)
    if target is None:
        return None
    when = at or datetime.fromtimestamp(finding.at_ms / 1000, tz=UTC)
    return recommend(conn=conn, target=target, reason=reason or finding.summary, cause=finding.cause.value,
                     at=when, settings=settings, alert_id=alert_id, fingerprint=finding.fingerprint,
                     summary=finding.summary, view=view)


def recommend_isolated(*, conn: Connection, finding: Finding, alert_id: int | None, at: datetime,
                       reason: str | None = None, view: FabricView | None = None
                       ) -> tuple[Row[Any] | None, str | None]:
    """recommend_for_finding in a savepoint: a failure rolls back this recommendation alone, never the
    cycle's alerts; it is logged and noted on the alert's timeline. Returns (drain or None, error or None)."""
    try:
        with conn.begin_nested():
            return recommend_for_finding(conn=conn, finding=finding, alert_id=alert_id, at=at, reason=reason,
                                         view=view), None
    except SoftTimeLimitExceeded:
        raise   # the task is being cut off: the whole cycle rolls back, as service/worker.py says
    except Exception as exc:
        error = _brief(exc)
        fresh = _note(conn, alert_id, f"drain recommendation failed: {error}", at) if alert_id is not None else True
        # said once in full (a traceback, unless it is a refusal of ours); then one line per cycle
        log.warning("drain recommendation failed for %s (alert %s): %s", finding.fingerprint, alert_id, error,
                    exc_info=fresh and not isinstance(exc, (DrainError, TemplateError)))
        return None, error


def _brief(exc: Exception) -> str:
    """One line: a database error as PostgreSQL said it (not SQLAlchemy's statement and parameters)."""
    cause = exc.orig if isinstance(exc, DBAPIError) and exc.orig is not None else exc
    first = (str(cause).strip().splitlines() or [""])[0]
    return f"{type(cause).__name__}: {first}"[:500]


def _note(conn: Connection, alert_id: int, comment: str, at: datetime) -> bool:
    """A comment on the alert, unless its last such note says the same (a failure repeats every cycle)."""
    last = conn.execute(text("SELECT comment FROM alert_events WHERE alert_id = :a AND actor = :who "
                             "ORDER BY id DESC LIMIT 1"), {"a": alert_id, "who": NOTE_ACTOR}).scalar()
    if last == comment:
        return False
    add_comment(conn=conn, alert_id=alert_id, actor=NOTE_ACTOR, comment=comment, at_ms=int(at.timestamp() * 1000))
    return True


def _require(row: Row[Any], attempted: str, allowed: tuple[DrainStatus, ...]) -> None:
    if row.status not in allowed:
        why = row.decision_note if row.status == DrainStatus.WITHDRAWN else None
        raise DrainStateError(row.id, row.status, attempted, [a.value for a in allowed], why)


def _advance_incident(conn: Connection, incident_id: int | None, to: State, actor: str, at: datetime,
                      note: str, from_states: tuple[State, ...]) -> None:
    if incident_id is None:
        return
    inc = incidents.get(conn=conn, incident_id=incident_id)
    if inc.state in from_states:
        incidents.transition(conn=conn, incident_id=incident_id, to=to, actor=actor, at=at, note=note)
    else:
        incidents.add_event(conn=conn, incident_id=incident_id, actor=actor, kind="drain", at=at, text_=note)


def approve(*, conn: Connection, drain_id: int, actor: str, note: str | None = None, at: datetime | None = None,
            settings: DrainSettings | None = None) -> Row[Any]:
    """Approve a pending drain after re-checking safety now. If it is no longer safe it becomes
    `blocked` (returned, not raised, so the new verdict is kept); check `status` on the result.

    With an executor configured, the approval also queues an execution (in this transaction); a worker
    runs it once this commits. Nothing runs here."""
    s, now = settings or drain_settings(), _now(at)
    _lock(conn)
    row = get(conn=conn, drain_id=drain_id, lock=True)
    _require(row, "approve", (DrainStatus.PENDING,))
    if row.alert_state == "resolved":   # resolved since the last cycle (by hand): nothing left to drain for
        withdraw_cleared(conn=conn, at=now, actor=actor, drain_ids=[drain_id])
        return get(conn=conn, drain_id=drain_id)
    view = FabricView()
    graph = view.graph(conn)
    plan = plan_target(graph=graph, target=_target_of(row), settings=s, action=DrainAction(row.action))
    state = fleet_state(conn=conn, view=view, settings=s, at=now, exclude=row.id)
    state.recommended_in_window = 0   # the breaker counted this drain when it was recommended
    verdict = evaluate(graph=graph, effect=plan.effect, state=state, settings=s, at=now)
    if not verdict.safe:
        conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(
            status=DrainStatus.BLOCKED.value, verdict=verdict.model_dump(mode="json"), updated_at=now))
        if row.incident_id is not None:
            incidents.add_event(conn=conn, incident_id=row.incident_id, actor=actor, kind="drain_blocked", at=now,
                                text_=f"approval of drain {drain_id} refused: {verdict.summary}")
        return get(conn=conn, drain_id=drain_id)
    conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(
        status=DrainStatus.APPROVED.value, verdict=verdict.model_dump(mode="json"), decided_by=actor,
        decided_at=now, decision_note=note, updated_at=now))
    if row.incident_id is not None:
        incidents.add_event(conn=conn, incident_id=row.incident_id, actor=actor, kind="drain_approved", at=now,
                            text_=note or f"drain {drain_id} approved", data={"drain_id": drain_id})
    if s.executor != "none":
        execution.queue(conn=conn, drain=get(conn=conn, drain_id=drain_id), executor=s.executor, actor=actor,
                        at=now)
    return get(conn=conn, drain_id=drain_id)


def retry(*, conn: Connection, drain_id: int, actor: str, note: str | None = None,
          settings: DrainSettings | None = None) -> Row[Any]:
    """An operator checked a failed or unknown execution and asks for it to run again: a new execution,
    with its own idempotency key. Never done without this call."""
    s, now = settings or drain_settings(), _now(None)
    row = get(conn=conn, drain_id=drain_id, lock=True)
    _require(row, "retry", UNSETTLED_STATUSES)
    if s.executor == "none":
        raise DrainStateError(drain_id, row.status, "retry", [x.value for x in UNSETTLED_STATUSES],
                              "execution is off (FABRICWATCH_DRAIN_EXECUTOR=none): mark it done by hand")
    conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(status=DrainStatus.APPROVED.value,
                                                                       updated_at=now))
    if row.incident_id is not None:
        incidents.add_event(conn=conn, incident_id=row.incident_id, actor=actor, kind="drain_retry", at=now,
                            text_=f"drain {drain_id}: execution asked again" + (f": {note}" if note else ""),
                            data={"drain_id": drain_id})
    execution.queue(conn=conn, drain=get(conn=conn, drain_id=drain_id), executor=s.executor, actor=actor, at=now)
    return get(conn=conn, drain_id=drain_id)


def reject(*, conn: Connection, drain_id: int, actor: str, note: str | None = None,
           at: datetime | None = None) -> Row[Any]:
    now = _now(at)
    row = get(conn=conn, drain_id=drain_id, lock=True)
    _require(row, "reject", (DrainStatus.PENDING, DrainStatus.BLOCKED))
    conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(
        status=DrainStatus.REJECTED.value, decided_by=actor, decided_at=now, decision_note=note, updated_at=now))
    _advance_incident(conn, row.incident_id, State.SUSPECT, actor, now,
                      f"drain {drain_id} rejected" + (f": {note}" if note else ""), (State.DRAIN_RECOMMENDED,))
    return get(conn=conn, drain_id=drain_id)


def mark_done(*, conn: Connection, drain_id: int, actor: str, note: str | None = None,
              at: datetime | None = None) -> Row[Any]:
    """The drain is in place: the incident moves to `drained`. From `approved`, or from a failed or unknown
    execution once a person has checked the target (an execution still queued or running is not waited for)."""
    now = _now(at)
    row = get(conn=conn, drain_id=drain_id, lock=True)
    _require(row, "mark done", (DrainStatus.APPROVED, *UNSETTLED_STATUSES))
    conn.execute(update(DRAINS).where(DRAINS.c.id == drain_id).values(
        status=DrainStatus.DONE.value, done_by=actor, done_at=now, updated_at=now))
    _advance_incident(conn, row.incident_id, State.DRAINED, actor, now,
                      f"drain {drain_id} done" + (f": {note}" if note else ""),
                      (State.SUSPECT, State.DRAIN_RECOMMENDED))
    return get(conn=conn, drain_id=drain_id)


def release_for_incident(*, conn: Connection, incident_id: int, actor: str, at: datetime | None = None,
                         reason: str = "") -> int:
    """The incident ended: active drains stop counting (released), undecided ones are withdrawn."""
    now = _now(at)
    n = conn.execute(update(DRAINS).where(DRAINS.c.incident_id == incident_id,
                                          DRAINS.c.status.in_([x.value for x in ACTIVE_STATUSES])).values(
        status=DrainStatus.RELEASED.value, released_at=now, updated_at=now)).rowcount
    n += conn.execute(update(DRAINS).where(DRAINS.c.incident_id == incident_id,
                                           DRAINS.c.status.in_([x.value for x in OPEN_STATUSES])).values(
        status=DrainStatus.WITHDRAWN.value, decision_note=reason, decided_by=actor, decided_at=now,
        updated_at=now)).rowcount
    return n


def withdraw_cleared(*, conn: Connection, at: datetime | None = None, actor: str = "fabricwatch",
                     drain_ids: list[int] | None = None) -> list[int]:
    """Withdraw undecided (pending or blocked) drains whose alert has resolved; returns their ids.

    The drain keeps its history: `withdrawn`, with when (`decided_at`, data time in the pipeline) and why
    (`decision_note`). Its incident goes back to `suspect` if it was waiting on this drain. If the finding
    fires again, its alert re-opens and a new recommendation is made."""
    now = _now(at)
    q = (select(DRAINS.c.id, DRAINS.c.incident_id, ALERTS.c.id.label("alert"), ALERTS.c.fingerprint,
                ALERTS.c.resolved_at_ms, ALERTS.c.resolved_by)
         .select_from(DRAINS.join(ALERTS, ALERTS.c.id == DRAINS.c.alert_id))
         .where(ALERTS.c.state == "resolved", DRAINS.c.status.in_([x.value for x in OPEN_STATUSES])))
    if drain_ids is not None:
        q = q.where(DRAINS.c.id.in_(drain_ids))
    out = []
    for r in conn.execute(q.order_by(DRAINS.c.id).with_for_update(of=DRAINS)).all():
        when = datetime.fromtimestamp(r.resolved_at_ms / 1000, tz=UTC).isoformat() if r.resolved_at_ms else "?"
        by = "detection: its finding cleared" if r.resolved_by == "detector" else f"by {r.resolved_by}"
        note = f"alert {r.alert} ({r.fingerprint}) resolved at {when} ({by}); nothing left to drain for"
        conn.execute(update(DRAINS).where(DRAINS.c.id == r.id).values(
            status=DrainStatus.WITHDRAWN.value, decided_by=actor, decided_at=now, decision_note=note, updated_at=now))
        _advance_incident(conn, r.incident_id, State.SUSPECT, actor, now, f"drain {r.id} withdrawn: {note}",
                          (State.DRAIN_RECOMMENDED,))
        out.append(int(r.id))
    return out


def _target_of(row: Row[Any]) -> Target:
    kind = TargetKind(row.target_kind)
    return Target(kind=kind, device=row.device, port=row.port if kind in (TargetKind.LINK, TargetKind.PORT) else None)


def plan_for(*, conn: Connection, target: Target, settings: DrainSettings | None = None,
             action: DrainAction | None = None) -> Plan:
    """Resolve a target without recording anything (for previews)."""
    return plan_target(graph=load_graph(conn=conn), target=target, settings=settings or drain_settings(),
                       action=action)
