"""Webhook subscriptions (CRUD), the delivery log, and test-fire."""

from __future__ import annotations

import time
import uuid
from typing import Any

from sqlalchemy import Connection, Engine, delete, func, insert, select, update

from service.notify import NotifySettings, notify_settings, payloads
from service.notify.models import OutboxMessage, WebhookDelivery, WebhookSubscription
from service.notify.outbox import deliver_now, enqueue
from service.notify.sealing import SEALED_COLUMNS, Sealer
from service.notify.urlpolicy import UrlPolicy, check_url

subs = WebhookSubscription.__table__


def check_target(url: str, settings: NotifySettings | None = None) -> None:
    """Raise UrlRefused if the URL may not be called under the current allow/deny settings."""
    s = settings or notify_settings()
    check_url(url, UrlPolicy.from_lists(s.allow, s.deny))


def create_subscription(*, conn: Connection, name: str, url: str, format: str, secret: str | None,
                        routing_key: str | None, filters: dict[str, list[str]], send_resolved: bool,
                        enabled: bool, created_by: str, settings: NotifySettings | None = None) -> dict[str, Any]:
    """Raise UrlRefused for a refused URL, SealError for a secret when no secrets key is usable."""
    check_target(url, settings)
    sealer = Sealer.from_settings()
    return dict(conn.execute(insert(subs).values(
        name=name, url=url, format=format, secret=sealer.seal(secret), routing_key=sealer.seal(routing_key),
        filters=filters,
        send_resolved=send_resolved, enabled=enabled, created_by=created_by).returning(subs)).mappings().one())


def get_subscription(*, conn: Connection, subscription_id: int) -> dict[str, Any] | None:
    row = conn.execute(select(subs).where(subs.c.id == subscription_id)).mappings().first()
    return dict(row) if row else None


def list_subscriptions(*, conn: Connection) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(select(subs).order_by(subs.c.id)).mappings()]


def update_subscription(*, conn: Connection, subscription_id: int, values: dict[str, Any],
                        settings: NotifySettings | None = None) -> dict[str, Any] | None:
    if "url" in values:
        check_target(values["url"], settings)
    sealed = [c for c in SEALED_COLUMNS if values.get(c) is not None]
    if sealed:
        sealer = Sealer.from_settings()
        values = {**values, **{c: sealer.seal(values[c]) for c in sealed}}
    row = conn.execute(update(subs).where(subs.c.id == subscription_id)
                       .values(updated_at=func.now(), **values).returning(subs)).mappings().first()
    return dict(row) if row else None


def delete_subscription(*, conn: Connection, subscription_id: int) -> bool:
    return conn.execute(delete(subs).where(subs.c.id == subscription_id)).rowcount > 0


_DELIVERY_COLS = (WebhookDelivery.id, WebhookDelivery.outbox_id, WebhookDelivery.attempt, WebhookDelivery.outcome,
                  WebhookDelivery.status_code, WebhookDelivery.error, WebhookDelivery.duration_ms,
                  WebhookDelivery.at, OutboxMessage.event, OutboxMessage.idempotency_key,
                  OutboxMessage.alert_id, OutboxMessage.status.label("message_status"))


def list_deliveries(*, conn: Connection, subscription_id: int, limit: int = 100,
                    before_id: int | None = None, outbox_id: int | None = None) -> list[dict[str, Any]]:
    """Delivery attempts, newest first (keyset on id)."""
    q = (select(*_DELIVERY_COLS).join(OutboxMessage, OutboxMessage.id == WebhookDelivery.outbox_id)
         .where(WebhookDelivery.subscription_id == subscription_id))
    if before_id is not None:
        q = q.where(WebhookDelivery.id < before_id)
    if outbox_id is not None:
        q = q.where(WebhookDelivery.outbox_id == outbox_id)
    return [dict(r) for r in conn.execute(q.order_by(WebhookDelivery.id.desc()).limit(limit)).mappings()]


def _test_alert() -> dict[str, Any]:
    return {"id": None, "fingerprint": "fabricwatch_test/test-device:test-port", "kind": "fabricwatch_test",
            "scope": "port", "state": "firing", "severity": "info", "cause": "unknown_physical", "action": "none",
            "device": "test-device", "port": "test-port", "summary": "fabricwatch test notification",
            "score": 0.0, "evidence": [], "members": [], "episode": 1}


def test_fire(*, engine: Engine, subscription_id: int, actor: str,
              settings: NotifySettings | None = None) -> tuple[int, str | None]:
    """Queue a test message for one subscription through the real outbox, and attempt it at once."""
    with engine.begin() as conn:
        key = f"fw-test-{uuid.uuid4().hex}"
        at_ms = int(time.time() * 1000)  # a test has no detection cycle: wall time
        msg = payloads.message(event="test", change="test", change_id=None, key=key, at_ms=at_ms, actor=actor,
                               alert=_test_alert())
        enqueue(conn, msg=msg, alert_id=None, event_id=None, subscription_id=subscription_id)
        outbox_id = conn.execute(select(OutboxMessage.id).where(OutboxMessage.idempotency_key == key)).scalar_one()
    return outbox_id, deliver_now(engine, outbox_id=outbox_id, settings=settings)
