"""The transactional outbox: enqueue in the caller's transaction, deliver at least once.

Enqueue runs inside the transaction that changes the alert, so a notification exists if and only
if the change committed. Delivery claims due rows in a short transaction (`FOR UPDATE SKIP LOCKED`)
and marks them in flight with a lease (`leased_until`), then POSTs them concurrently, outside any
transaction, at most `per_receiver` per subscription across all workers: a receiver that never
answers holds a few of its own rows, never anyone else's. Two workers never send a leased row; a
worker that dies mid-send leaves it pending, and it is sent again (same Idempotency-Key) once the
lease has run out. Rows for one alert and one subscription go out in order: a row is not claimed
while an older one of its alert is pending (in flight included), so a resolve never overtakes its
trigger.
"""

from __future__ import annotations

import email.utils
import json
import logging
import random
import time
from collections import Counter
from concurrent.futures import FIRST_COMPLETED, Future, ThreadPoolExecutor, wait
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any
from urllib.parse import urlsplit

import httpx
from sqlalchemy import Connection, Engine, insert, select, text

from service.notify import NotifySettings, notify_settings
from service.notify.models import OutboxMessage, WebhookDelivery, WebhookSubscription
from service.notify.payloads import render, wants
from service.notify.sealing import Sealer, SealError, reseal_subscriptions
from service.notify.signing import DELIVERY_HEADER, EVENT_HEADER, IDEMPOTENCY_HEADER, sign_headers
from service.notify.urlpolicy import IPAddress, Resolver, UrlPolicy, UrlRefused, check_url, resolve

log = logging.getLogger(__name__)

FILTER_KEYS = ("severity", "kind", "pod", "device")
USER_AGENT = "fabricwatch-webhook/1"


def matches_filters(filters: dict[str, list[str]] | None, alert: dict[str, Any]) -> bool:
    """Every non-empty filter list must contain the alert's value (empty or absent = any)."""
    for key in FILTER_KEYS:
        allowed = (filters or {}).get(key) or []
        if allowed and str(alert.get(key)) not in allowed:
            return False
    return True


def enqueue(conn: Connection, *, msg: dict[str, Any], alert_id: int | None, event_id: int | None,
            subscription_id: int | None = None) -> int:
    """Write one outbox row per interested, enabled subscription (in the caller's transaction)."""
    q = select(WebhookSubscription).where(WebhookSubscription.enabled.is_(True))
    if subscription_id is not None:
        q = select(WebhookSubscription).where(WebhookSubscription.id == subscription_id)
    rows = []
    for sub in conn.execute(q).mappings():
        if subscription_id is None and not (wants(sub["format"], msg["event"], sub["send_resolved"])
                                            and matches_filters(sub["filters"], msg["alert"])):
            continue
        rows.append({"subscription_id": sub["id"], "alert_id": alert_id, "event_id": event_id,
                     "event": msg["event"], "idempotency_key": msg["idempotency_key"], "message": msg})
    if rows:
        # ON CONFLICT: enqueueing the same change twice (a retried caller) adds nothing.
        stmt = text("""INSERT INTO webhook_outbox (subscription_id, alert_id, event_id, event, idempotency_key,
                                                   message)
                       VALUES (:subscription_id, :alert_id, :event_id, :event, :idempotency_key,
                               CAST(:message AS jsonb))
                       ON CONFLICT ON CONSTRAINT outbox_subscription_key DO NOTHING""")
        conn.execute(stmt, [dict(r, message=json.dumps(r["message"])) for r in rows])
    return len(rows)


@dataclass(slots=True)
class Attempt:
    status_code: int | None
    error: str | None
    duration_ms: float
    retry_after_s: float | None = None

    @property
    def ok(self) -> bool:
        return self.error is None and self.status_code is not None and 200 <= self.status_code < 300


def _host(url: str) -> str:
    try:
        return urlsplit(url).hostname or "?"
    except ValueError:
        return "?"


def _scrub(msg: str, url: str) -> str:
    """Error text without the URL's path or query (a Slack webhook URL is itself a secret)."""
    parts = urlsplit(url)
    for secret_part in (url, parts.path, parts.query):
        if secret_part and len(secret_part) > 1:
            msg = msg.replace(secret_part, "/…")
    return msg[:500]


def _retry_after(value: str | None) -> float | None:
    if not value:
        return None
    if value.strip().isdigit():
        return float(value)
    try:
        when = email.utils.parsedate_to_datetime(value)
    except (TypeError, ValueError):
        return None
    return max(0.0, (when - datetime.now(UTC)).total_seconds())


def _post(client: httpx.Client, url: str, addrs: list[IPAddress], body: bytes,
          headers: dict[str, str]) -> tuple[int, str | None, float | None]:
    """POST to an address the policy checked, never to a fresh resolution of the name (DNS rebinding).

    The URL is rewritten to the address; the Host header, TLS SNI and certificate check keep the name.
    The next address is tried only when connecting failed (nothing was sent).
    """
    name_url = httpx.URL(url)
    extensions = {"sni_hostname": name_url.raw_host.decode("ascii")} if name_url.scheme == "https" else {}
    headers = {**headers, "Host": name_url.netloc.decode("ascii")}
    for i, ip in enumerate(addrs):
        try:
            with client.stream("POST", name_url.copy_with(host=str(ip)), content=body, headers=headers,
                               extensions=extensions) as resp:
                # The body is never read: a receiver cannot make us buffer gigabytes.
                return resp.status_code, resp.headers.get("location"), _retry_after(resp.headers.get("retry-after"))
        except httpx.ConnectError:
            if i == len(addrs) - 1:
                raise
    raise AssertionError("check_url returns at least one address")


def send(client: httpx.Client, url: str, body: bytes, headers: dict[str, str], policy: UrlPolicy,
         max_redirects: int, resolver: Resolver = resolve) -> Attempt:
    """POST once, following only 307/308 redirects, each hop checked against the URL policy first."""
    t0 = time.perf_counter()

    def done(status: int | None, error: str | None, retry_after: float | None = None) -> Attempt:
        return Attempt(status, error, round((time.perf_counter() - t0) * 1000, 3), retry_after)

    for hop in range(max_redirects + 1):
        try:
            addrs = check_url(url, policy, resolver)
        except UrlRefused as exc:
            where = f" (redirect hop {hop})" if hop else ""
            return done(None, f"refused{where}: {exc}")
        try:
            status, location, retry_after = _post(client, url, addrs, body, headers)
        except httpx.HTTPError as exc:
            return done(None, _scrub(f"{type(exc).__name__}: {exc}", url))
        if status in (307, 308) and location:
            url = str(httpx.URL(url).join(location))
            continue
        if 300 <= status < 400:
            return done(status, f"redirect {status} not followed (only 307/308 keep the POST body)")
        if 200 <= status < 300:
            return done(status, None)
        return done(status, f"HTTP {status}", retry_after)
    return done(None, f"more than {max_redirects} redirects")


def backoff_s(attempt: int, settings: NotifySettings, retry_after: float | None = None) -> float:
    """Exponential backoff with 0-25 % jitter (so a recovered receiver is not hit by a thundering herd)."""
    delay = min(settings.backoff_max_s, settings.backoff_base_s * 2 ** max(0, attempt - 1))
    delay *= random.uniform(1.0, 1.25)
    if retry_after is not None:
        delay = max(delay, min(retry_after, settings.backoff_max_s))
    return delay


_IN_FLIGHT = text("""SELECT subscription_id, count(*) FROM webhook_outbox
                     WHERE leased_until > clock_timestamp() AND status = 'pending' GROUP BY 1""")
_CANDIDATES = """
SELECT o.id, o.subscription_id
FROM webhook_outbox o JOIN webhook_subscriptions s ON s.id = o.subscription_id
WHERE o.status = 'pending' AND (o.leased_until IS NULL OR o.leased_until <= clock_timestamp()) AND {where}
  AND NOT EXISTS (SELECT 1 FROM webhook_outbox p
                  WHERE p.subscription_id = o.subscription_id AND p.alert_id = o.alert_id
                    AND p.status = 'pending' AND p.id < o.id)
ORDER BY o.next_attempt_at, o.id
LIMIT :scan
FOR UPDATE OF o SKIP LOCKED
"""
_DUE = text(_CANDIDATES.format(where="s.enabled AND o.next_attempt_at <= clock_timestamp() "
                                     "AND o.subscription_id <> ALL(CAST(:full AS int[]))"))
_ONE = text(_CANDIDATES.format(where="o.id = :id"))
# The attempt is counted when the row is claimed: `attempts` is then also the lease's token.
_LEASE = text("""
UPDATE webhook_outbox o SET attempts = o.attempts + 1,
                            leased_until = clock_timestamp() + make_interval(secs => :lease)
FROM webhook_subscriptions s
WHERE s.id = o.subscription_id AND o.id = ANY(CAST(:ids AS bigint[]))
RETURNING o.id, o.subscription_id, o.alert_id, o.event, o.idempotency_key, o.message, o.attempts,
          s.name, s.url, s.format, s.secret, s.routing_key
""")
# A 2xx marks the row delivered even if its lease ran out meanwhile; a failure only updates a row
# this attempt still holds (a newer claim owns the row otherwise).
_DELIVERED = text("""UPDATE webhook_outbox SET status = 'delivered', delivered_at = clock_timestamp(),
                            leased_until = NULL, last_status_code = :code, last_error = NULL
                     WHERE id = :id AND status = 'pending'""")
_FAILED = text("""UPDATE webhook_outbox SET status = :st, leased_until = NULL, last_status_code = :code,
                         last_error = :err, next_attempt_at = clock_timestamp() + make_interval(secs => :d)
                  WHERE id = :id AND status = 'pending' AND attempts = :n""")
POLL_S = 0.2  # while POSTs are in flight, look for newly due rows this often


def _claim(engine: Engine, settings: NotifySettings, n: int) -> list[Any]:
    """Lease up to n due rows, at most `per_receiver` in flight per subscription (all workers counted)."""
    with engine.begin() as conn:
        busy: Counter[int] = Counter({sub: k for sub, k in conn.execute(_IN_FLIGHT)})
        full = [sub for sub, k in busy.items() if k >= settings.per_receiver]
        picked = []
        for row in conn.execute(_DUE, {"full": full, "scan": 4 * n}):
            if len(picked) == n:
                break
            if busy[row.subscription_id] < settings.per_receiver:
                busy[row.subscription_id] += 1
                picked.append(row.id)
        if not picked:
            return []
        return list(conn.execute(_LEASE, {"ids": picked, "lease": settings.lease_s}))


def _attempt(engine: Engine, client: httpx.Client, row: Any, settings: NotifySettings, policy: UrlPolicy,
             sealer: Sealer) -> str:
    """Send one leased row (no transaction open meanwhile), then record the outcome."""
    attempt_no = row.attempts
    try:
        secret = sealer.open(row.secret, subscription=row.name)
        routing_key = sealer.open(row.routing_key, what="routing key", subscription=row.name)
    except SealError as exc:
        result = Attempt(None, str(exc), 0.0)
    else:
        body = render(row.format, row.message, receiver=row.name, routing_key=routing_key,
                      public_url=settings.public_url)
        headers = {"Content-Type": "application/json", "User-Agent": USER_AGENT,
                   IDEMPOTENCY_HEADER: row.idempotency_key, EVENT_HEADER: row.event,
                   DELIVERY_HEADER: f"{row.id}/{attempt_no}", **sign_headers(secret, body)}
        result = send(client, row.url, body, headers, policy, settings.max_redirects)
    with engine.begin() as conn:
        if result.ok:
            outcome = "delivered"
            conn.execute(_DELIVERED, {"code": result.status_code, "id": row.id})
        else:
            outcome = "dead" if attempt_no >= settings.max_attempts else "retry"
            conn.execute(_FAILED, {"st": "dead" if outcome == "dead" else "pending", "code": result.status_code,
                                   "err": result.error, "d": backoff_s(attempt_no, settings, result.retry_after_s),
                                   "id": row.id, "n": attempt_no})
        conn.execute(insert(WebhookDelivery).values(
            outbox_id=row.id, subscription_id=row.subscription_id, attempt=attempt_no, outcome=outcome,
            status_code=result.status_code, error=result.error, duration_ms=result.duration_ms))
    # Host only: the path of a Slack URL is a credential, and the secret never reaches a log.
    log.info("webhook %s message %s attempt %s to %s: %s %s", row.subscription_id, row.id, attempt_no,
             _host(row.url), outcome, result.status_code or result.error)
    return outcome


def _client(settings: NotifySettings) -> httpx.Client:
    # No keep-alive: every POST connects to the address just checked, and a TLS connection made for one
    # name is never reused for another name on the same address.
    return httpx.Client(timeout=settings.timeout_s, follow_redirects=False, trust_env=False,
                        limits=httpx.Limits(max_keepalive_connections=0))


def _seal_plaintext(engine: Engine, sealer: Sealer) -> None:
    """Seal values stored before sealing existed, once a key is configured (lazy migration)."""
    if not sealer.configured:
        return
    with engine.begin() as conn:
        done = reseal_subscriptions(conn, sealer, plaintext_only=True)
    if done.plaintext:
        log.warning("sealed %s plaintext webhook secret(s) or routing key(s) with %s", done.plaintext,
                    sealer.source)


def deliver_due(engine: Engine, *, settings: NotifySettings | None = None, limit: int = 200,
                budget_s: float = 20.0) -> dict[str, int]:
    """Send due outbox rows concurrently until none is due and none in flight, `limit` or `budget_s`."""
    settings = settings or notify_settings()
    policy = UrlPolicy.from_lists(settings.allow, settings.deny)
    sealer = Sealer.from_settings()
    _seal_plaintext(engine, sealer)
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + budget_s
    in_flight: set[Future[str]] = set()
    with _client(settings) as client, ThreadPoolExecutor(settings.concurrency, "webhook") as pool:
        while True:
            while (room := min(settings.concurrency - len(in_flight),
                               limit - counts["attempted"] - len(in_flight))) > 0 and time.monotonic() < deadline:
                rows = _claim(engine, settings, room)
                if not rows:
                    break
                in_flight.update(pool.submit(_attempt, engine, client, row, settings, policy, sealer) for row in rows)
            if not in_flight:
                break
            done, in_flight = wait(in_flight, timeout=POLL_S, return_when=FIRST_COMPLETED)
            for future in done:
                counts["attempted"] += 1
                try:
                    counts[future.result()] += 1
                except Exception:  # a bug, not the receiver: the row is sent again when its lease runs out
                    log.exception("webhook delivery failed")
                    counts["error"] += 1
    return dict(counts)


def deliver_now(engine: Engine, *, outbox_id: int, settings: NotifySettings | None = None) -> str | None:
    """Attempt one row immediately, due or not (test-fire); None if it is in flight or not pending."""
    settings = settings or notify_settings()
    policy = UrlPolicy.from_lists(settings.allow, settings.deny)
    with engine.begin() as conn:
        if conn.execute(_ONE, {"id": outbox_id, "scan": 1}).first() is None:
            return None
        row = conn.execute(_LEASE, {"ids": [outbox_id], "lease": settings.lease_s}).one()
    with _client(settings) as client:
        return _attempt(engine, client, row, settings, policy, Sealer.from_settings())


def outbox_row(conn: Connection, outbox_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(OutboxMessage).where(OutboxMessage.id == outbox_id)).mappings().first()
    return dict(row) if row else None
