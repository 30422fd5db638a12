"""Alertmanager as a destination: fabricwatch pushes its alerts to `POST /api/v2/alerts`, as Prometheus does.

Alertmanager is level-triggered: it wants the current state of every alert, sent again while it fires,
with an `endsAt` a few resends ahead (if the sender stops, the alert resolves by itself), and an `endsAt`
of now once it resolved. So the outbox here (table `alertmanager_outbox`) holds one row per destination and
alert, the state Alertmanager must have, not a queue of messages:

- `mark` writes it in the transaction of the alert change (a `firing` that went out, an acknowledgement,
  a resolve), so it exists if and only if the change committed. Which alerts go out is decided as for the
  webhooks: a trigger once per episode, not while fabricwatch mutes it, and a resolve only after a trigger.
- `deliver` claims due rows per destination with a lease (`FOR UPDATE SKIP LOCKED`; a row in flight is not
  claimed again, so a resolve never overtakes its firing), renders them from the alert as it is now (labels,
  annotations) and POSTs them in batches outside any transaction. A firing row is due again every
  `resend_s`; a delivered resolve never. A failed POST backs the destination off (it is the Alertmanager that
  is down), and everything due goes out once it answers again: nothing is dropped, however long it was away.
- A label set that changed while firing (severity went up, the cause was refined) is a new alert for
  Alertmanager: the old set is resolved in the same POST that fires the new one.

Routing, grouping, inhibition, silences and receivers are then Alertmanager's (docs/alertmanager.md).
"""

from __future__ import annotations

import json
import logging
import random
import time
from collections import Counter
from concurrent.futures import ThreadPoolExecutor
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta
from typing import Any

import httpx
from sqlalchemy import Connection, Engine, text

from service.notify import NotifySettings, notify_settings
from service.notify.outbox import matches_filters
from service.notify.payloads import iso, strongest_evidence
from service.notify.schemas import AlertmanagerSettings
from service.notify.sealing import Sealer, SealError
from service.notify.urlpolicy import UrlPolicy, UrlRefused, check_url

log = logging.getLogger(__name__)

API_PATH = "/api/v2/alerts"
USER_AGENT = "fabricwatch-alertmanager/1"
LABEL_KEYS = ("device", "port", "lane", "peer_device", "peer_port", "pod", "rail", "severity", "cause", "scope")
ERROR_BODY_BYTES = 1024   # of an error answer kept for the status (Alertmanager says what it refused)

# What to do, in a line, per action: the `runbook` annotation (a site's own runbook is runbook_url).
RUNBOOK = {
    "none": "No field action: watch the alert; it resolves by itself when the condition clears.",
    "clean_connectors": "Inspect and clean both connectors of the link (scope, then clean), reseat, re-check rx power.",
    "reseat_module": "Reseat the transceiver at the end at fault; if the errors return, replace it.",
    "replace_local_module": "Replace the transceiver at this end of the link.",
    "replace_peer_module": "Replace the transceiver at the far end of the link (peer_device, peer_port).",
    "replace_cable": "Replace the cable or fiber of the link; clean the connectors of the new one first.",
    "escalate_device": "Several ports of the device are affected: escalate to the device (line card, PSU, firmware).",
    "drain_host": "Drain the host from the scheduler (see the drain link), then fix its NIC or link.",
    "disable_port": "Take the port out of service (see the drain link) until it is repaired.",
    "review_capacity": "Congestion, not a fault: review the traffic placement and capacity of these links.",
    "check_link": "The link is down: check that the far end is up and its port enabled, then the modules and cable.",
}


def am_settings() -> AlertmanagerSettings:
    from service.config import get_settings

    return get_settings().alertmanager


# --- writing the outbox (in the alert change's transaction) ----------------------------------

_UPSERT_FIRING = text("""
INSERT INTO alertmanager_outbox (destination_id, alert_id, status, starts_at_ms)
VALUES (:d, :a, 'firing', :starts)
ON CONFLICT ON CONSTRAINT am_outbox_destination_alert DO UPDATE
SET status = 'firing', starts_at_ms = EXCLUDED.starts_at_ms, ends_at = NULL,
    version = alertmanager_outbox.version + 1, next_attempt_at = clock_timestamp()
""")
_RESOLVE = text("""
UPDATE alertmanager_outbox SET status = 'resolved', ends_at = clock_timestamp(), version = version + 1,
                               next_attempt_at = clock_timestamp()
WHERE alert_id = :a AND status = 'firing'
""")
_TOUCH = text("""
UPDATE alertmanager_outbox SET version = version + 1, next_attempt_at = clock_timestamp()
WHERE alert_id = :a AND status = 'firing'
""")


def mark(conn: Connection, *, event: str, alert: dict[str, Any]) -> int:
    """Record what Alertmanager must now have of this alert; returns the rows written.

    `firing` (a trigger that went out) fires it on every enabled destination whose filters match; an
    acknowledgement sends it again at once (its annotations say who); `resolved` resolves it wherever it
    was fired, on disabled destinations too (they send it when enabled again)."""
    if event == "firing":
        rows = [{"d": d.id, "a": alert["id"], "starts": alert["opened_at_ms"]}
                for d in conn.execute(text("SELECT id, filters FROM alertmanager_destinations WHERE enabled"))
                if matches_filters(d.filters, alert)]
        if rows:
            conn.execute(_UPSERT_FIRING, rows)
        return len(rows)
    if event == "resolved":
        return conn.execute(_RESOLVE, {"a": alert["id"]}).rowcount
    if event == "acknowledged":
        return conn.execute(_TOUCH, {"a": alert["id"]}).rowcount
    return 0


_SEED = text("""
INSERT INTO alertmanager_outbox (destination_id, alert_id, status, starts_at_ms)
SELECT :d, a.id, 'firing', a.opened_at_ms FROM alerts a
WHERE a.state <> 'resolved' AND a.notified
  AND (cardinality(CAST(:severity AS text[])) = 0 OR a.severity = ANY(CAST(:severity AS text[])))
  AND (cardinality(CAST(:kind AS text[])) = 0 OR a.kind = ANY(CAST(:kind AS text[])))
  AND (cardinality(CAST(:pod AS text[])) = 0 OR a.pod = ANY(CAST(:pod AS text[])))
  AND (cardinality(CAST(:device AS text[])) = 0 OR a.device = ANY(CAST(:device AS text[])))
ON CONFLICT ON CONSTRAINT am_outbox_destination_alert DO UPDATE
SET status = 'firing', starts_at_ms = EXCLUDED.starts_at_ms, ends_at = NULL,
    version = alertmanager_outbox.version + 1, next_attempt_at = clock_timestamp()
WHERE alertmanager_outbox.status = 'resolved'
""")


def seed(conn: Connection, destination_id: int, filters: dict[str, list[str]] | None) -> int:
    """A new (or re-enabled) destination gets every alert that fires now and went out, as a new
    Alertmanager gets Prometheus' firing alerts on its next send."""
    f = filters or {}
    return conn.execute(_SEED, {"d": destination_id, **{k: list(f.get(k) or []) for k in
                                                         ("severity", "kind", "pod", "device")}}).rowcount


# --- rendering (pure) ------------------------------------------------------------------------

def labels(alert: dict[str, Any]) -> dict[str, str]:
    """Routing labels: alertname (the kind) and the entity, pod, rail, severity, cause, scope that are known."""
    out = {"alertname": str(alert.get("kind") or "fabricwatch")}
    for k in LABEL_KEYS:
        if alert.get(k) is not None and alert.get(k) != "":
            out[k] = str(alert[k])
    return out


def _link(public_url: str | None, path: str) -> str:
    return f"{public_url.rstrip('/')}{path}" if public_url else path


def annotations(alert: dict[str, Any], *, drain: dict[str, Any] | None, public_url: str | None,
                runbook_url: str = "") -> dict[str, str]:
    """What a person reads: the summary, evidence, what to do (runbook), the drain, and where to look."""
    action = str(alert.get("action") or "none")
    evidence = strongest_evidence(alert)
    out = {
        "summary": str(alert.get("summary") or alert.get("kind") or ""),
        "description": (f"cause {alert.get('cause')}, action {action}"
                        + (f", end at fault: {alert['end']}" if alert.get("end") else "")
                        + f"; episode {alert.get('episode') or 1}"),
        "evidence": json.dumps(evidence, sort_keys=True, separators=(",", ":")),
        "action": action,
        "runbook": RUNBOOK.get(action, RUNBOOK["none"]),
        "fabricwatch_alert": _link(public_url, f"/api/v1/alerts/{alert['id']}"),
        "fabricwatch_fingerprint": str(alert.get("fingerprint") or ""),
    }
    if runbook_url:
        out["runbook_url"] = runbook_url.format(cause=alert.get("cause") or "", kind=alert.get("kind") or "",
                                                action=action)
    if drain is not None:
        out["drain"] = f"drain {drain['id']} ({drain['status']}, {drain['action']})"
        out["drain_url"] = _link(public_url, f"/api/v1/drains/{drain['id']}")
    if alert.get("state") == "acknowledged" and alert.get("acknowledged_by"):
        out["acknowledged_by"] = str(alert["acknowledged_by"])
    return out


def postable(*, lbl: dict[str, str], ann: dict[str, str], starts_ms: int, ends: datetime,
             generator_url: str | None) -> dict[str, Any]:
    """One alert of the POST body. startsAt is never after endsAt (Alertmanager refuses that)."""
    ends_ms = int(ends.timestamp() * 1000)
    out: dict[str, Any] = {"labels": lbl, "annotations": ann, "startsAt": iso(min(starts_ms, ends_ms)),
                           "endsAt": iso(ends_ms)}
    if generator_url:
        out["generatorURL"] = generator_url
    return out


# --- delivery --------------------------------------------------------------------------------

_DESTINATIONS = text("""SELECT id, name, url, failures, credential FROM alertmanager_destinations
                        WHERE enabled AND (retry_at IS NULL OR retry_at <= clock_timestamp()) ORDER BY id""")
_CLAIM = text("""
WITH due AS (
  SELECT id FROM alertmanager_outbox
  WHERE destination_id = :d AND next_attempt_at <= clock_timestamp()
    AND (leased_until IS NULL OR leased_until <= clock_timestamp())
  ORDER BY next_attempt_at, id LIMIT :n FOR UPDATE SKIP LOCKED)
UPDATE alertmanager_outbox o SET claims = o.claims + 1,
                                 leased_until = clock_timestamp() + make_interval(secs => :lease)
FROM due WHERE o.id = due.id
RETURNING o.id, o.alert_id, o.status, o.starts_at_ms, o.ends_at, o.version, o.sent_labels, o.claims
""")
# The alerts as they are now, with the rail of either end of their port and their newest drain.
_ALERTS = text("""
SELECT a.*, rail.rail, dr.id AS drain_id, dr.status AS drain_status, dr.action AS drain_action
FROM alerts a
LEFT JOIN LATERAL (
  SELECT p.rail FROM ports p JOIN devices d ON d.id = p.device_id
  WHERE p.rail IS NOT NULL AND ((d.name = a.device AND p.name = a.port)
                                OR (d.name = a.peer_device AND p.name = a.peer_port))
  ORDER BY (d.name = a.device) DESC LIMIT 1) rail ON true
LEFT JOIN LATERAL (
  SELECT id, status, action FROM drain_recommendations WHERE alert_id = a.id ORDER BY id DESC LIMIT 1) dr ON true
WHERE a.id = ANY(CAST(:ids AS bigint[]))
""")
_SENT = text("""
UPDATE alertmanager_outbox SET sent_version = :v, sent_labels = CAST(:labels AS jsonb), sent_at = clock_timestamp(),
       leased_until = NULL,
       next_attempt_at = CASE WHEN version > :v THEN clock_timestamp()
                              WHEN status = 'firing' THEN clock_timestamp() + make_interval(secs => :resend)
                              ELSE 'infinity' END
WHERE id = :id AND claims = :c
""")
_RELEASE = text("UPDATE alertmanager_outbox SET leased_until = NULL WHERE id = :id AND claims = :c")
_OK = text("""UPDATE alertmanager_destinations SET failures = 0, retry_at = NULL, last_attempt_at = clock_timestamp(),
                     last_success_at = clock_timestamp(), last_status_code = :code, last_error = NULL WHERE id = :d""")
_FAIL = text("""UPDATE alertmanager_destinations SET failures = failures + 1, last_attempt_at = clock_timestamp(),
                       retry_at = clock_timestamp() + make_interval(secs => :wait), last_status_code = :code,
                       last_error = :err WHERE id = :d""")


@dataclass(slots=True)
class Answer:
    status_code: int | None
    error: str | None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


def post(client: httpx.Client, base_url: str, body: bytes, policy: UrlPolicy,
         authorization: str | None = None) -> Answer:
    """POST to the address the URL policy checked (never a second resolution); no redirects followed.
    An error answer's first bytes are kept: Alertmanager says which alert it refused and why."""
    url = base_url.rstrip("/") + API_PATH
    try:
        addrs = check_url(url, policy)
    except UrlRefused as exc:
        return Answer(None, f"refused: {exc}")
    name_url = httpx.URL(url)
    extensions = {"sni_hostname": name_url.raw_host.decode("ascii")} if name_url.scheme == "https" else {}
    headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT, "Host": name_url.netloc.decode("ascii")}
    if authorization:
        headers["Authorization"] = authorization
    for i, ip in enumerate(addrs):
        try:
            with client.stream("POST", name_url.copy_with(host=str(ip)), content=body, headers=headers,
                               extensions=extensions) as resp:
                if 200 <= resp.status_code < 300:
                    return Answer(resp.status_code, None)
                said = b""
                for chunk in resp.iter_bytes():
                    said += chunk
                    if len(said) >= ERROR_BODY_BYTES:
                        break
                text_ = " ".join(said[:ERROR_BODY_BYTES].decode("utf-8", "replace").split())
                return Answer(resp.status_code, f"HTTP {resp.status_code}" + (f": {text_}" if text_ else ""))
        except httpx.ConnectError as exc:
            if i == len(addrs) - 1:
                return Answer(None, f"ConnectError: {exc}"[:500])
        except httpx.HTTPError as exc:
            return Answer(None, f"{type(exc).__name__}: {exc}"[:500])
    raise AssertionError("check_url returns at least one address")


def _backoff_s(failures: int, s: AlertmanagerSettings) -> float:
    """Exponential with 0-25 % jitter, capped: an Alertmanager that is back is tried again soon."""
    return min(s.backoff_max_s, s.backoff_base_s * 2 ** max(0, failures - 1)) * random.uniform(1.0, 1.25)


def _render(rows: list[Any], alerts: dict[int, dict[str, Any]], s: AlertmanagerSettings,
            public_url: str | None) -> tuple[list[dict[str, Any]], dict[int, dict[str, str]]]:
    """The POST body's alerts and, per outbox row, the label set it leaves Alertmanager holding."""
    now = datetime.now(UTC)
    firing_ends = now + timedelta(seconds=s.ends_after_s)
    body: list[dict[str, Any]] = []
    held: dict[int, dict[str, str]] = {}
    for r in rows:
        a = alerts[r.alert_id]
        drain = ({"id": a["drain_id"], "status": a["drain_status"], "action": a["drain_action"]}
                 if a.get("drain_id") is not None else None)
        ann = annotations(a, drain=drain, public_url=public_url, runbook_url=s.runbook_url)
        gen = f"{public_url.rstrip('/')}/api/v1/alerts/{a['id']}" if public_url else None
        new = {**s.external_labels, **labels(a)}
        old = r.sent_labels
        if r.status == "resolved":
            # resolve the identity Alertmanager holds (it never saw a newer label set)
            lbl = old or new
            body.append(postable(lbl=lbl, ann=ann, starts_ms=r.starts_at_ms, ends=min(r.ends_at, now),
                                 generator_url=gen))
            held[r.id] = lbl
            continue
        if old and old != new:
            body.append(postable(lbl=old, ann=ann, starts_ms=r.starts_at_ms, ends=now, generator_url=gen))
        body.append(postable(lbl=new, ann=ann, starts_ms=r.starts_at_ms, ends=firing_ends, generator_url=gen))
        held[r.id] = new
    return body, held


def _deliver_one(engine: Engine, dest: Any, s: AlertmanagerSettings, ns: NotifySettings, policy: UrlPolicy,
                 deadline: float) -> Counter[str]:
    """Send one destination's due rows, batch by batch, until none is due, a POST fails or time is up."""
    counts: Counter[str] = Counter()
    lease_s = 3.0 * s.timeout_s
    try:
        authorization = Sealer.from_settings().open(dest.credential, what="credential", subscription=dest.name,
                                                    owner="Alertmanager destination")
        refused = None
    except SealError as exc:   # nothing is sent without it; the status says why
        authorization, refused = None, Answer(None, str(exc))
    with httpx.Client(timeout=s.timeout_s, follow_redirects=False, trust_env=False,
                      limits=httpx.Limits(max_keepalive_connections=0)) as client:
        while time.monotonic() < deadline:
            with engine.begin() as conn:
                rows = list(conn.execute(_CLAIM, {"d": dest.id, "n": s.batch_size, "lease": lease_s}))
                if not rows:
                    break
                alerts = {r["id"]: dict(r) for r in conn.execute(
                    _ALERTS, {"ids": [r.alert_id for r in rows]}).mappings()}
            body, held = _render(rows, alerts, s, ns.public_url)
            t0 = time.perf_counter()
            answer = refused or post(client, dest.url, json.dumps(body, separators=(",", ":")).encode(), policy,
                                     authorization)
            took_ms = (time.perf_counter() - t0) * 1000
            # One row per statement, each its own transaction: this never holds one row while it waits for
            # another, so it cannot deadlock with a detection cycle that changes several of these alerts.
            with engine.connect() as raw:
                conn = raw.execution_options(isolation_level="AUTOCOMMIT")
                for r in rows:
                    if answer.ok:
                        conn.execute(_SENT, {"v": r.version, "labels": json.dumps(held[r.id]), "resend": s.resend_s,
                                             "id": r.id, "c": r.claims})
                    else:
                        conn.execute(_RELEASE, {"id": r.id, "c": r.claims})
                if answer.ok:
                    conn.execute(_OK, {"d": dest.id, "code": answer.status_code})
                else:
                    conn.execute(_FAIL, {"d": dest.id, "code": answer.status_code, "err": answer.error,
                                         "wait": _backoff_s(dest.failures + 1, s)})
            log.info("alertmanager %s (%s): %s alerts in %.0f ms: %s", dest.name, dest.id, len(body), took_ms,
                     "ok" if answer.ok else answer.error)
            counts["posts"] += 1
            counts["alerts"] += len(body)
            if not answer.ok:
                counts["failed"] += 1
                break
            counts["delivered"] += len(rows)
    return counts


def deliver(engine: Engine, *, settings: AlertmanagerSettings | None = None, notify: NotifySettings | None = None,
            budget_s: float = 20.0) -> dict[str, int]:
    """Send what is due to every enabled destination that is not backing off, one thread per destination
    (a hung Alertmanager delays only itself)."""
    s = settings or am_settings()
    ns = notify or notify_settings()
    policy = UrlPolicy.from_lists(ns.allow, ns.deny)
    with engine.connect() as conn:
        dests = list(conn.execute(_DESTINATIONS))
    total: Counter[str] = Counter()
    if not dests:
        return {}
    deadline = time.monotonic() + budget_s

    def one(dest: Any) -> Counter[str]:
        try:
            return _deliver_one(engine, dest, s, ns, policy, deadline)
        except Exception:  # a bug, not the Alertmanager: its rows are tried again when their lease runs out
            log.exception("alertmanager %s (%s): delivery failed", dest.name, dest.id)
            return Counter(error=1)

    with ThreadPoolExecutor(min(8, len(dests)), "alertmanager") as pool:
        for counts in pool.map(one, dests):
            total.update(counts)
    return dict(total)
