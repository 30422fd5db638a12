"""Alertmanager destinations (CRUD) and the delivery status of every receiver (/api/v1/notify)."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Connection, delete, func, insert, select, text, update

from service.notify import NotifySettings
from service.notify.alertmanager import API_PATH, seed
from service.notify.models import AlertmanagerDestination
from service.notify.schemas import display_url
from service.notify.sealing import Sealer
from service.notify.service import check_target

dests = AlertmanagerDestination.__table__


def create_destination(*, conn: Connection, name: str, url: str, filters: dict[str, list[str]], enabled: bool,
                       created_by: str, auth: tuple[str, str] | None = None,
                       settings: NotifySettings | None = None) -> dict[str, Any]:
    """Raise UrlRefused for a URL the webhook policy refuses, SealError for a credential when no secrets key is
    usable. `auth` is (kind, the Authorization header's value), stored sealed. An enabled destination gets
    every alert that fires now at once (seeded in this transaction)."""
    check_target(url.rstrip("/") + API_PATH, settings)
    kind, authorization = auth or (None, None)
    row = dict(conn.execute(insert(dests).values(
        name=name, url=url.rstrip("/"), filters=filters, enabled=enabled, created_by=created_by, auth_kind=kind,
        credential=Sealer.from_settings().seal(authorization)).returning(dests)).mappings().one())
    if enabled:
        seed(conn, row["id"], filters)
    return row


def get_destination(*, conn: Connection, destination_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(dests).where(dests.c.id == destination_id)).mappings().first()
    return dict(row) if row else None


def list_destinations(*, conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(select(dests).order_by(dests.c.id)).mappings()]


def update_destination(*, conn: Connection, destination_id: int, values: dict[str, Any],
                       settings: NotifySettings | None = None) -> dict[str, Any] | None:
    """`values` may set `auth_kind` and `credential` (the Authorization header's value, sealed here; SealError without a
    usable key). Enabling it, or widening its filters, seeds the alerts that fire now and it does not hold
    yet; a new URL is another Alertmanager: it is backed off no longer and gets every firing alert again."""
    if "url" in values:
        check_target(values["url"].rstrip("/") + API_PATH, settings)
        values = {**values, "url": values["url"].rstrip("/"), "retry_at": None, "failures": 0}
    if values.get("credential") is not None:
        values = {**values, "credential": Sealer.from_settings().seal(values["credential"])}
    row = conn.execute(update(dests).where(dests.c.id == destination_id)
                       .values(updated_at=func.now(), **values).returning(dests)).mappings().first()
    if row is None:
        return None
    if "url" in values:
        conn.execute(text("UPDATE alertmanager_outbox SET next_attempt_at = clock_timestamp() "
                          "WHERE destination_id = :d AND status = 'firing'"), {"d": destination_id})
    if row["enabled"]:
        seed(conn, destination_id, row["filters"])
    return dict(row)


def delete_destination(*, conn: Connection, destination_id: int) -> bool:
    """Its outbox goes with it; the alerts it holds resolve there by themselves at their endsAt."""
    return conn.execute(delete(dests).where(dests.c.id == destination_id)).rowcount > 0


_AM_STATUS = text("""
SELECT d.*, coalesce(o.firing, 0) AS firing, coalesce(o.pending, 0) AS pending, o.oldest_pending_since
FROM alertmanager_destinations d
LEFT JOIN (SELECT destination_id, count(*) FILTER (WHERE status = 'firing') AS firing,
                  count(*) FILTER (WHERE sent_version < version) AS pending,
                  min(next_attempt_at) FILTER (WHERE sent_version < version) AS oldest_pending_since
           FROM alertmanager_outbox GROUP BY destination_id) o ON o.destination_id = d.id
ORDER BY d.id
""")
_WEBHOOK_STATUS = text("""
SELECT s.id, s.name, s.url, s.format, s.enabled,
       coalesce(o.pending, 0) AS pending, coalesce(o.dead, 0) AS dead, coalesce(o.delivered, 0) AS delivered,
       o.oldest_pending_at, l.outcome AS last_outcome, l.status_code AS last_status_code, l.error AS last_error,
       l.at AS last_attempt_at
FROM webhook_subscriptions s
LEFT JOIN (SELECT subscription_id, count(*) FILTER (WHERE status = 'pending') AS pending,
                  count(*) FILTER (WHERE status = 'dead') AS dead,
                  count(*) FILTER (WHERE status = 'delivered') AS delivered,
                  min(created_at) FILTER (WHERE status = 'pending') AS oldest_pending_at
           FROM webhook_outbox GROUP BY subscription_id) o ON o.subscription_id = s.id
LEFT JOIN LATERAL (SELECT outcome, status_code, error, at FROM webhook_deliveries
                   WHERE subscription_id = s.id ORDER BY id DESC LIMIT 1) l ON true
ORDER BY s.id
""")


def _am_state(row: dict[str, Any]) -> str:
    if not row["enabled"]:
        return "disabled"
    if row["last_attempt_at"] is None:
        return "idle"
    return "failing" if row["failures"] else "ok"


def notify_status(*, conn: Connection) -> dict[str, list[dict[str, Any]]]:
    """Per webhook subscription and per Alertmanager: what waits, what failed, and the latest answer."""
    hooks = [dict(r, url=display_url(r["url"], r["format"])) for r in conn.execute(_WEBHOOK_STATUS).mappings()]
    ams = [dict(r, state=_am_state(dict(r))) for r in conn.execute(_AM_STATUS).mappings()]
    return {"webhooks": hooks, "alertmanagers": ams}
