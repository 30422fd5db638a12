"""Alert lifecycle from detection findings, manual actions, silences and maintenance windows.

- Identity: one alert per fingerprint (kind + entity); a re-opened alert keeps its row and id, and
  every change is an `alert_events` row in data time (the cycle's at_ms) with its actor.
- Hysteresis: only a `firing` finding opens; `holding` keeps an open alert; an open alert resolves
  after `clear_cycles` consecutive cycles without its finding and a data-time hold-down per cause that
  grows with its recent reopens (`hold_down_ms`). A value hovering at the threshold (firing, absent,
  firing, ...) and an intermittent fault therefore stay one alert; a reopen within `REPEAT_INTERVAL_MS`
  of the alert's last trigger is recorded but does not notify again (muted `repeat_interval`).
- Peak: an alert keeps the worst cycle (highest score) of its firing episode: `peak_score`,
  `peak_evidence`, `peak_at_ms`, and that cycle's `summary`; `score`/`evidence` are the last cycle's.
  A clearing cycle ("0 flaps") therefore never rewrites what the alert says happened.
- Grouping (inhibition): a device-level finding with `members` opens one alert that becomes the
  parent of open alerts on those member ports (either end of the link); a child is recorded but
  does not notify while its parent is open.
- Muting: silences (label matchers) and maintenance windows (device or port under repair) mute
  notifications at the cycle's data time; the alert and its history are still recorded. When a
  mute ends and the alert is still firing, it notifies then.
- Notifications are written to the outbox in the caller's transaction. A trigger goes out once per
  episode; acknowledge and resolve go out only if the trigger did (they close what was opened,
  even if a silence started since).
"""

from __future__ import annotations

import base64
import binascii
import json
import time
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, and_, func, insert, or_, select, text, tuple_, update

from service.alerts.matchers import matcher_hits
from service.alerts.models import Alert, AlertEvent, MaintenanceWindow, Silence
from service.detection.findings import Finding
from service.notify import alertmanager, payloads
from service.notify.outbox import enqueue

SEVERITY_RANK = {"info": 0, "ticket": 1, "page": 2}
MATCHER_LABELS = ("kind", "device", "port", "lane", "pod", "severity", "cause", "scope", "peer_device",
                  "peer_port", "fingerprint")
_LOCK_KEY = 0x66776172  # pg advisory lock: one apply_findings cycle at a time
MIN = 60_000
# An absent alert resolves after clear_cycles absent cycles AND this much data time without its finding: an
# intermittent fault (it comes and goes) stays one alert. Per cause (others: 0, clear_cycles alone); the wait
# grows with the alert's reopens in the last REOPEN_MEMORY_MS, like link-flap dampening: + HOLD_STEP_MS *
# (2^reopens - 1), at most HOLD_MAX_MS.
HOLD_DOWN_MS = {"loose_module": 30 * MIN, "post_fec_errors": 15 * MIN, "unknown_physical": 15 * MIN,
                "shared_component": 15 * MIN, "nic_pause_storm": 10 * MIN,
                # optics may be read every 15 min, and a dirty connector or a bent fiber does not heal in minutes
                "connector_contamination": 30 * MIN, "fiber_damage": 30 * MIN, "transmitter_wearout": 30 * MIN}
HOLD_STEP_MS = 5 * MIN
HOLD_MAX_MS = 240 * MIN
REOPEN_MEMORY_MS = 24 * 60 * MIN
# A reopened alert does not notify again within this long of its last trigger (Alertmanager's repeat_interval):
# it is recorded, muted "repeat_interval", and notifies when the interval ends if it still fires.
REPEAT_INTERVAL_MS = 4 * 60 * MIN

alerts = Alert.__table__
events = AlertEvent.__table__


class AlertNotFound(LookupError):
    pass


class AlertStateError(ValueError):
    pass


def clear_cycles_setting() -> int:
    """Absent cycles before auto-resolve (FABRICWATCH_ALERT_CLEAR_CYCLES)."""
    from service.config import get_settings

    return get_settings().alert_clear_cycles


def hold_down_ms(cause: str, reopens: int) -> int:
    """Data time an absent alert of this cause waits before it resolves, after `reopens` recent reopens."""
    extra = HOLD_STEP_MS * ((1 << min(reopens, 8)) - 1)
    return min(HOLD_DOWN_MS.get(cause, 0) + extra, HOLD_MAX_MS)


def _recent_reopens(conn: Connection, ids: list[int], at_ms: int) -> dict[int, int]:
    if not ids:
        return {}
    return dict(conn.execute(text(
        "SELECT alert_id, count(*) FROM alert_events WHERE alert_id = ANY(:ids) AND event = 'reopened' "
        "AND at_ms > :since AND at_ms <= :at GROUP BY alert_id"),
        {"ids": ids, "since": at_ms - REOPEN_MEMORY_MS, "at": at_ms}).all())


def _last_triggers(conn: Connection, ids: list[int], at_ms: int) -> dict[int, int]:
    """Data time of each alert's newest trigger notification (its event carries detail.notified)."""
    if not ids:
        return {}
    return dict(conn.execute(text(
        "SELECT alert_id, max(at_ms) FROM alert_events WHERE alert_id = ANY(:ids) AND detail ? 'notified' "
        "AND at_ms <= :at GROUP BY alert_id"), {"ids": ids, "at": at_ms}).all())


def now_ms() -> int:
    return int(time.time() * 1000)


def ms_to_dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000, tz=UTC)


# --- changes and listeners -------------------------------------------------------------------

@dataclass(slots=True)
class AlertChange:
    alert_id: int
    fingerprint: str
    event: str
    event_id: int
    at_ms: int
    actor: str
    from_state: str | None
    to_state: str | None
    notified: int = 0             # outbox rows written for this change
    muted_by: str | None = None   # why it did not notify, when it could have


@dataclass(slots=True)
class ChangeSet:
    """What one call changed, in order. `notifications` counts outbox rows written."""

    at_ms: int
    changes: list[AlertChange] = field(default_factory=list)

    def ids(self, event: str) -> list[int]:
        return [c.alert_id for c in self.changes if c.event == event]

    @property
    def opened(self) -> list[int]:
        return self.ids("opened")

    @property
    def reopened(self) -> list[int]:
        return self.ids("reopened")

    @property
    def resolved(self) -> list[int]:
        return self.ids("resolved")

    @property
    def notifications(self) -> int:
        return sum(c.notified for c in self.changes)


AlertListener = Callable[[Connection, AlertChange], None]
_listeners: list[AlertListener] = []


def on_alert_change(fn: AlertListener) -> AlertListener:
    """Register `fn(conn, change)`, called for every change inside the same transaction (for incidents)."""
    _listeners.append(fn)
    return fn


# --- small helpers ---------------------------------------------------------------------------

def _record(conn: Connection, cs: ChangeSet | None, row: dict[str, Any], event: str, *, at_ms: int, actor: str,
            from_state: str | None, to_state: str | None, comment: str | None = None,
            detail: dict[str, Any] | None = None) -> AlertChange:
    event_id = conn.execute(insert(events).values(
        alert_id=row["id"], at_ms=at_ms, actor=actor, event=event, from_state=from_state, to_state=to_state,
        comment=comment, detail=detail or {}).returning(events.c.id)).scalar_one()
    change = AlertChange(row["id"], row["fingerprint"], event, event_id, at_ms, actor, from_state, to_state)
    if cs is not None:
        cs.changes.append(change)
    for fn in _listeners:
        fn(conn, change)
    _publish(conn, change)
    return change


def _publish(conn: Connection, change: AlertChange) -> None:
    """Tell live clients (SSE) after commit."""
    from service.events import publish

    publish(conn, "alert", {"id": change.alert_id, "event": change.event, "state": change.to_state})


def _set(conn: Connection, row: dict[str, Any], *, bump: bool = True, **values: Any) -> None:
    """Update the row and our copy; `bump` moves updated_at (not done for mere last-seen refreshes)."""
    row.update(values)
    if bump:
        values["updated_at"] = func.clock_timestamp()
    conn.execute(update(alerts).where(alerts.c.id == row["id"]).values(**values))


def _notify(conn: Connection, row: dict[str, Any], change: AlertChange, event: str,
            comment: str | None = None) -> int:
    msg = payloads.message(event=event, change=change.event, change_id=change.event_id,
                           key=payloads.idempotency_key(row["id"], change.event_id), at_ms=change.at_ms,
                           actor=change.actor, alert=row, comment=comment)
    change.notified = (enqueue(conn, msg=msg, alert_id=row["id"], event_id=change.event_id)
                       + alertmanager.mark(conn, event=event, alert=row))
    return change.notified


def _finding_values(f: Finding, pod: str | None) -> dict[str, Any]:
    return {"kind": f.kind, "scope": f.scope, "device": f.device, "port": f.port, "lane": f.lane,
            "peer_device": f.peer_device, "peer_port": f.peer_port, "pod": pod, "severity": f.severity.value,
            "cause": f.cause.value, "action": f.action.value, "end": f.end, "summary": f.summary,
            "score": float(f.score), "ttt_hours": f.ttt_hours, "evidence": f.to_dict()["evidence"],
            "members": list(f.members), "finding_state": f.state}


def _peak(values: dict[str, Any], at_ms: int) -> dict[str, Any]:
    """The episode's worst cycle so far: its summary, score and evidence, and when it was seen."""
    return {"summary": values["summary"], "peak_score": values["score"], "peak_evidence": values["evidence"],
            "peak_at_ms": at_ms}


def _pick(findings: Iterable[Finding]) -> dict[str, Finding]:
    """One finding per fingerprint and cycle: firing beats holding, then the higher score."""
    best: dict[str, Finding] = {}
    for f in findings:
        cur = best.get(f.fingerprint)
        if cur is None or (f.state == "firing", f.score) > (cur.state == "firing", cur.score):
            best[f.fingerprint] = f
    return best


# --- muting ----------------------------------------------------------------------------------

def _matcher_ok(m: dict[str, Any], labels: dict[str, str]) -> bool:
    return matcher_hits(m, labels.get(m["name"], ""))


def alert_labels(row: dict[str, Any]) -> dict[str, str]:
    """The labels silences match on; a missing label matches as the empty string (as in Alertmanager)."""
    return {k: "" if row.get(k) is None else str(row[k]) for k in MATCHER_LABELS}


@dataclass(slots=True)
class _Mutes:
    silences: list[tuple[int, list[dict[str, Any]]]]
    windows: list[tuple[int, str, str | None]]

    @classmethod
    def load(cls, conn: Connection, at_ms: int) -> _Mutes:
        at = ms_to_dt(at_ms)
        sil = conn.execute(select(Silence.id, Silence.matchers).where(Silence.starts_at <= at, Silence.ends_at > at))
        win = conn.execute(select(MaintenanceWindow.id, MaintenanceWindow.device, MaintenanceWindow.port)
                           .where(MaintenanceWindow.starts_at <= at, MaintenanceWindow.ends_at > at))
        return cls([(r.id, r.matchers) for r in sil], [(r.id, r.device, r.port) for r in win])

    def reason(self, row: dict[str, Any], parent_open: bool) -> str | None:
        for wid, device, port in self.windows:
            for d, p in ((row["device"], row["port"]), (row["peer_device"], row["peer_port"])):
                if d == device and (port is None or p == port):
                    return f"maintenance:{wid}"
        labels = alert_labels(row)
        for sid, matchers in self.silences:
            if all(_matcher_ok(m, labels) for m in matchers):
                return f"silence:{sid}"
        if parent_open:
            return f"inhibited:{row['parent_id']}"
        return None


# --- the detection cycle ---------------------------------------------------------------------

# Kinds whose producer also clears them (a clean NCCL run clears its regression): a detection cycle never
# raises them, so their absence from its findings says nothing and must not age them out.
SELF_CLEARING_KINDS = frozenset({"nccl_regression"})


def apply_findings(*, conn: Connection, findings: list[Finding], at_ms: int, actor: str = "detector",
                   clear_cycles: int | None = None, kinds: Iterable[str] | None = None,
                   scope: ColumnElement[bool] | None = None) -> ChangeSet:
    """Apply one detection cycle's findings (a complete set, or complete for `kinds`) at data time at_ms.

    A complete set (kinds None) ages every open alert it lacks, except SELF_CLEARING_KINDS. `scope`, a
    condition on the alerts table, narrows what the set is complete for: open alerts outside it are left
    alone (a shard's cycle sees its own pods only: service/shards/detection.py)."""
    clear = clear_cycles or clear_cycles_setting()
    kind_set = set(kinds) if kinds is not None else None
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    cs = ChangeSet(at_ms)
    picked = _pick(findings)
    is_open = alerts.c.state != "resolved" if scope is None else and_(alerts.c.state != "resolved", scope)
    rows = conn.execute(select(alerts).where(or_(alerts.c.fingerprint.in_(list(picked)), is_open))
                        .order_by(alerts.c.id).with_for_update()).mappings()
    by_fp: dict[str, dict[str, Any]] = {r["fingerprint"]: dict(r) for r in rows}
    devices = {f.device for f in picked.values()}
    pods = dict(conn.execute(text("SELECT name, pod FROM devices WHERE name = ANY(:n)"),
                             {"n": list(devices)}).all()) if devices else {}
    pending: dict[int, tuple[AlertChange, bool]] = {}   # alert id -> (change to notify, is a fresh open)
    seen: set[str] = set()

    # Device-level (grouping) findings first, so parents exist before their members are looked at.
    for f in sorted(picked.values(), key=lambda f: (not f.members, f.fingerprint)):
        row = by_fp.get(f.fingerprint)
        values = _finding_values(f, pods.get(f.device))
        if row is None or row["state"] == "resolved":
            if f.state != "firing":
                continue  # holding keeps an open alert, it never opens one
            row = _open(conn, cs, row, values, f, at_ms, actor)
            by_fp[f.fingerprint] = row
            pending[row["id"]] = (cs.changes[-1], True)
        else:
            escalated = _refresh(conn, cs, row, values, at_ms, actor)
            if escalated is not None:
                pending[row["id"]] = (escalated, False)
        seen.add(f.fingerprint)

    absent = [row for fp, row in by_fp.items() if fp not in seen and row["state"] != "resolved"
              and (row["kind"] not in SELF_CLEARING_KINDS if kind_set is None else row["kind"] in kind_set)]
    reopens = _recent_reopens(conn, [r["id"] for r in absent if r["missed_cycles"] + 1 >= clear], at_ms)
    for row in absent:
        missed = row["missed_cycles"] + 1
        hold = hold_down_ms(row["cause"], reopens.get(row["id"], 0))
        if missed >= clear and at_ms - row["last_seen_ms"] >= hold:
            _resolve(conn, cs, row, at_ms=at_ms, actor=actor,
                     detail={"auto": True, "absent_cycles": missed, "hold_down_ms": hold})
        else:
            _set(conn, row, bump=False, missed_cycles=missed, finding_state=None)

    by_id = {row["id"]: row for row in by_fp.values()}
    for f in picked.values():
        parent = by_fp.get(f.fingerprint)
        if f.members and parent is not None and parent["state"] != "resolved":
            _group(conn, cs, parent, set(f.members), by_fp.values(), at_ms, actor)

    mutes = _Mutes.load(conn, at_ms)
    # a reopened alert that has not notified this episode waits out the repeat interval of its last trigger
    reopened = [row["id"] for row in by_fp.values()
                if row["state"] == "firing" and not row["notified"] and row["episode"] > 1]
    repeat = {i: t for i, t in _last_triggers(conn, reopened, at_ms).items() if at_ms - t < REPEAT_INTERVAL_MS}
    for row in by_fp.values():
        if row["state"] == "resolved":
            continue
        parent = by_id.get(row["parent_id"]) if row["parent_id"] else None
        reason = mutes.reason(row, parent is not None and parent["state"] != "resolved")
        if reason is None and row["id"] in repeat:
            reason = "repeat_interval"
        change, fresh = pending.get(row["id"], (None, False))
        if reason != row["muted_by"]:
            _set(conn, row, muted_by=reason)
            if fresh and change is not None:
                conn.execute(text("UPDATE alert_events SET detail = detail || CAST(:d AS jsonb) WHERE id = :i"),
                             {"d": json.dumps({"muted_by": reason}), "i": change.event_id})
            else:
                ev = "muted" if reason else "unmuted"
                unmuted = _record(conn, cs, row, ev, at_ms=at_ms, actor=actor, from_state=row["state"],
                                  to_state=row["state"], detail={"muted_by": reason} if reason else {})
                if reason is None and change is None:
                    change = unmuted
        if change is not None and reason is not None:
            change.muted_by = reason
        # One trigger per episode (on open, or when its mute ends), plus one per escalation.
        wants_trigger = (row["state"] == "firing" and reason is None and change is not None
                         and (not row["notified"] or change.event == "severity_changed"))
        if wants_trigger and change is not None:
            _notify(conn, row, change, "firing")
            _set(conn, row, bump=False, notified=True)
            conn.execute(text("UPDATE alert_events SET detail = detail || CAST(:d AS jsonb) WHERE id = :i"),
                         {"d": json.dumps({"notified": change.notified}), "i": change.event_id})
    return cs


def _open(conn: Connection, cs: ChangeSet, old: dict[str, Any] | None, values: dict[str, Any], f: Finding,
          at_ms: int, actor: str) -> dict[str, Any]:
    common = dict(values, state="firing", missed_cycles=0, opened_at_ms=at_ms, last_seen_ms=at_ms,
                  resolved_at_ms=None, resolved_by=None, acknowledged_at_ms=None, acknowledged_by=None,
                  notified=False, muted_by=None, parent_id=None, **_peak(values, at_ms))
    if old is None:
        row = dict(conn.execute(insert(alerts).values(fingerprint=f.fingerprint, first_opened_at_ms=at_ms,
                                                      episode=1, **common).returning(alerts)).mappings().one())
        _record(conn, cs, row, "opened", at_ms=at_ms, actor=actor, from_state=None, to_state="firing",
                detail={"severity": values["severity"], "score": values["score"]})
        return row
    row = old
    _set(conn, row, episode=old["episode"] + 1, **common)
    _record(conn, cs, row, "reopened", at_ms=at_ms, actor=actor, from_state="resolved", to_state="firing",
            detail={"episode": row["episode"], "severity": values["severity"], "score": values["score"]})
    return row


def _refresh(conn: Connection, cs: ChangeSet, row: dict[str, Any], values: dict[str, Any], at_ms: int,
             actor: str) -> AlertChange | None:
    """Keep an open alert current; returns the change to re-notify when severity went up.

    The last cycle's score and evidence are kept as they are; the summary and the peak move only when
    this cycle is worse than any before in the episode, so a clearing cycle never rewrites them."""
    old_sev = row["severity"]
    current = {k: v for k, v in values.items() if k != "summary"}
    if values["score"] > row["peak_score"]:
        current.update(_peak(values, at_ms))
    _set(conn, row, bump=False, missed_cycles=0, last_seen_ms=at_ms, **current)
    if values["severity"] == old_sev:
        return None
    _set(conn, row)  # a severity change is a change: move updated_at
    change = _record(conn, cs, row, "severity_changed", at_ms=at_ms, actor=actor, from_state=row["state"],
                     to_state=row["state"], detail={"from": old_sev, "to": values["severity"]})
    up = SEVERITY_RANK.get(values["severity"], 0) > SEVERITY_RANK.get(old_sev, 0)
    if not (up and row["notified"]):
        return None
    # back up to a severity it already notified at within the repeat interval: recorded, not sent again (a fault
    # whose errors come and go moved page -> ticket -> page every few minutes: a page each time)
    sent = conn.execute(text(
        "SELECT coalesce(detail->>'to', detail->>'severity') FROM alert_events WHERE alert_id = :i "
        "AND detail ? 'notified' AND at_ms > :since AND at_ms <= :at"),
        {"i": row["id"], "since": at_ms - REPEAT_INTERVAL_MS, "at": at_ms}).scalars().all()
    rank = SEVERITY_RANK.get(values["severity"], 0)
    return None if any(SEVERITY_RANK.get(x or "", 0) >= rank for x in sent) else change


def _group(conn: Connection, cs: ChangeSet, parent: dict[str, Any], members: set[str],
           rows: Iterable[dict[str, Any]], at_ms: int, actor: str) -> None:
    for row in rows:
        if row["id"] == parent["id"] or row["state"] == "resolved" or row["parent_id"] == parent["id"]:
            continue
        local = row["device"] == parent["device"] and row["port"] in members
        peer = row["peer_device"] == parent["device"] and row["peer_port"] in members
        if local or peer:
            _set(conn, row, parent_id=parent["id"])
            _record(conn, cs, row, "grouped", at_ms=at_ms, actor=actor, from_state=row["state"],
                    to_state=row["state"], detail={"parent_id": parent["id"], "parent": parent["fingerprint"]})


def _resolve(conn: Connection, cs: ChangeSet | None, row: dict[str, Any], *, at_ms: int, actor: str,
             comment: str | None = None, detail: dict[str, Any] | None = None) -> AlertChange:
    was, notified = row["state"], row["notified"]
    _set(conn, row, state="resolved", resolved_at_ms=at_ms, resolved_by=actor, missed_cycles=0,
         finding_state=None, notified=False, muted_by=None)
    change = _record(conn, cs, row, "resolved", at_ms=at_ms, actor=actor, from_state=was, to_state="resolved",
                     comment=comment, detail=detail)
    if notified:
        _notify(conn, row, change, "resolved", comment)
    return change


# --- manual actions --------------------------------------------------------------------------

def _lock(conn: Connection, alert_id: int) -> dict[str, Any]:
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id).with_for_update()).mappings().first()
    if row is None:
        raise AlertNotFound(f"no alert {alert_id}")
    return dict(row)


def acknowledge(*, conn: Connection, alert_id: int, actor: str, comment: str | None = None,
                at_ms: int | None = None) -> dict[str, Any]:
    """Acknowledge an open alert (idempotent); notifies receivers that got its trigger."""
    row = _lock(conn, alert_id)
    if row["state"] == "resolved":
        raise AlertStateError(f"alert {alert_id} is resolved; it can no longer be acknowledged")
    if row["state"] == "acknowledged":
        return row
    at = at_ms if at_ms is not None else now_ms()
    _set(conn, row, state="acknowledged", acknowledged_at_ms=at, acknowledged_by=actor)
    change = _record(conn, None, row, "acknowledged", at_ms=at, actor=actor, from_state="firing",
                     to_state="acknowledged", comment=comment)
    if row["notified"]:
        _notify(conn, row, change, "acknowledged", comment)
    return row


def resolve(*, conn: Connection, alert_id: int, actor: str, comment: str | None = None,
            at_ms: int | None = None) -> dict[str, Any]:
    """Resolve by hand (idempotent). If detection still fires next cycle, the alert re-opens."""
    row = _lock(conn, alert_id)
    if row["state"] != "resolved":
        _resolve(conn, None, row, at_ms=at_ms if at_ms is not None else now_ms(), actor=actor, comment=comment,
                 detail={"manual": True})
    return row


def add_comment(*, conn: Connection, alert_id: int, actor: str, comment: str,
                at_ms: int | None = None) -> dict[str, Any]:
    row = _lock(conn, alert_id)
    change = _record(conn, None, row, "commented", at_ms=at_ms if at_ms is not None else now_ms(), actor=actor,
                     from_state=row["state"], to_state=row["state"], comment=comment)
    return event_by_id(conn=conn, event_id=change.event_id)


# --- reads -----------------------------------------------------------------------------------

def get_alert(*, conn: Connection, alert_id: int, with_events: bool = False) -> dict[str, Any] | None:
    """One alert as a dict (with its history and grouped children when asked)."""
    row = conn.execute(select(alerts).where(alerts.c.id == alert_id)).mappings().first()
    if row is None:
        return None
    out = dict(row)
    if with_events:
        out["events"] = list_events(conn=conn, alert_id=alert_id)
        out["children"] = list(conn.execute(select(alerts.c.id).where(alerts.c.parent_id == alert_id)
                                            .order_by(alerts.c.id)).scalars())
    return out


def list_events(*, conn: Connection, alert_id: int) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(select(events).where(events.c.alert_id == alert_id)
                                          .order_by(events.c.id)).mappings()]


def event_by_id(*, conn: Connection, event_id: int) -> dict[str, Any]:
    return dict(conn.execute(select(events).where(events.c.id == event_id)).mappings().one())


SORTS = {"created": alerts.c.created_at, "updated": alerts.c.updated_at, "opened": alerts.c.opened_at_ms}


def _encode_cursor(sort: str, value: Any, ident: int) -> str:
    v = value.isoformat() if isinstance(value, datetime) else value
    raw = json.dumps({"s": sort, "v": v, "i": ident}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def _decode_cursor(cursor: str, sort: str) -> tuple[Any, int]:
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        key, value, ident = data["s"], data["v"], int(data["i"])
        if key != sort:
            raise ValueError(f"cursor was made for sort={key!r}, not {sort!r}")
        timestamp = key.lstrip("-+") in ("created", "updated")
        return (datetime.fromisoformat(value) if timestamp else int(value)), ident
    except (binascii.Error, json.JSONDecodeError, KeyError, TypeError, UnicodeDecodeError) as exc:
        raise ValueError("malformed cursor") from exc


def list_alerts(*, conn: Connection, state: list[str] | None = None, severity: list[str] | None = None,
                kind: list[str] | None = None, device: list[str] | None = None, pod: list[str] | None = None,
                cause: list[str] | None = None, sort: str = "-created", limit: int = 100,
                cursor: str | None = None) -> tuple[list[dict[str, Any]], str | None]:
    """A page of alerts and the cursor of the next page (keyset on (sort column, id): stable under inserts)."""
    desc = sort.startswith("-")
    key = sort.lstrip("-+")
    if key not in SORTS:
        raise ValueError(f"sort must be one of {', '.join(sorted(SORTS))}, optionally prefixed with '-'")
    col = SORTS[key]
    q = select(alerts)
    for column, values in ((alerts.c.state, state), (alerts.c.severity, severity), (alerts.c.kind, kind),
                           (alerts.c.device, device), (alerts.c.pod, pod), (alerts.c.cause, cause)):
        if values:
            q = q.where(column.in_(values))
    if cursor:
        value, ident = _decode_cursor(cursor, sort)
        q = q.where(tuple_(col, alerts.c.id) < tuple_(value, ident) if desc
                    else tuple_(col, alerts.c.id) > tuple_(value, ident))
    q = q.order_by(col.desc(), alerts.c.id.desc()) if desc else q.order_by(col.asc(), alerts.c.id.asc())
    rows = [dict(r) for r in conn.execute(q.limit(limit + 1)).mappings()]
    more = len(rows) > limit
    rows = rows[:limit]
    nxt = _encode_cursor(sort, rows[-1][col.key], rows[-1]["id"]) if more and rows else None
    return rows, nxt


# --- silences and maintenance windows --------------------------------------------------------

def create_silence(*, conn: Connection, matchers: list[dict[str, Any]], starts_at: datetime, ends_at: datetime,
                   created_by: str, comment: str = "") -> dict[str, Any]:
    return dict(conn.execute(insert(Silence).values(matchers=matchers, starts_at=starts_at, ends_at=ends_at,
                                                    created_by=created_by, comment=comment)
                             .returning(*Silence.__table__.c)).mappings().one())


def get_silence(*, conn: Connection, silence_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(Silence.__table__).where(Silence.id == silence_id)).mappings().first()
    return dict(row) if row else None


def list_silences(*, conn: Connection, active_at: datetime | None = None) -> list[dict[str, Any]]:
    q = select(Silence.__table__).order_by(Silence.id)
    if active_at is not None:
        q = q.where(and_(Silence.starts_at <= active_at, Silence.ends_at > active_at))
    return [dict(r) for r in conn.execute(q).mappings()]


def update_silence(*, conn: Connection, silence_id: int, **values: Any) -> dict[str, Any] | None:
    values = {k: v for k, v in values.items() if v is not None}
    row = conn.execute(update(Silence).where(Silence.id == silence_id)
                       .values(updated_at=func.now(), **values).returning(*Silence.__table__.c)).mappings().first()
    return dict(row) if row else None


def expire_silence(*, conn: Connection, silence_id: int) -> bool:
    """End a silence now (kept for the record, like Alertmanager's expire)."""
    row = conn.execute(update(Silence).where(Silence.id == silence_id)
                       .values(ends_at=func.greatest(Silence.starts_at + text("interval '1 millisecond'"),
                                                     func.least(Silence.ends_at, func.now())),
                               updated_at=func.now()).returning(Silence.id)).first()
    return row is not None


def create_maintenance(*, conn: Connection, device: str, port: str | None, starts_at: datetime,
                       ends_at: datetime, created_by: str, comment: str = "") -> dict[str, Any]:
    return dict(conn.execute(insert(MaintenanceWindow).values(
        device=device, port=port, starts_at=starts_at, ends_at=ends_at, created_by=created_by, comment=comment)
        .returning(*MaintenanceWindow.__table__.c)).mappings().one())


def get_maintenance(*, conn: Connection, window_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(MaintenanceWindow.__table__).where(MaintenanceWindow.id == window_id)).mappings()
    first = row.first()
    return dict(first) if first else None


def list_maintenance(*, conn: Connection, active_at: datetime | None = None) -> list[dict[str, Any]]:
    q = select(MaintenanceWindow.__table__).order_by(MaintenanceWindow.id)
    if active_at is not None:
        q = q.where(MaintenanceWindow.starts_at <= active_at, MaintenanceWindow.ends_at > active_at)
    return [dict(r) for r in conn.execute(q).mappings()]


def update_maintenance(*, conn: Connection, window_id: int, **values: Any) -> dict[str, Any] | None:
    values = {k: v for k, v in values.items() if v is not None}
    row = conn.execute(update(MaintenanceWindow).where(MaintenanceWindow.id == window_id)
                       .values(updated_at=func.now(), **values)
                       .returning(*MaintenanceWindow.__table__.c)).mappings().first()
    return dict(row) if row else None


def end_maintenance(*, conn: Connection, window_id: int) -> bool:
    row = conn.execute(update(MaintenanceWindow).where(MaintenanceWindow.id == window_id)
                       .values(ends_at=func.greatest(MaintenanceWindow.starts_at + text("interval '1 millisecond'"),
                                                     func.least(MaintenanceWindow.ends_at, func.now())),
                               updated_at=func.now()).returning(MaintenanceWindow.id)).first()
    return row is not None
