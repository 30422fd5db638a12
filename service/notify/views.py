"""Webhook endpoints (admin scope): subscriptions CRUD, test-fire and the delivery log (router `router`)."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query, Response

from service.api.auth import AdminScope
from service.api.deps import EngineDep
from service.api.problems import Problem
from service.notify import service
from service.notify.schemas import (
    DeliveryPage,
    DeliveryRead,
    TestFireResult,
    WebhookCreate,
    WebhookRead,
    WebhookUpdate,
)
from service.notify.view_errors import DestinationProblems

router = APIRouter(prefix="/api/v1/webhooks", tags=["webhooks"])


PROBLEMS = DestinationProblems("webhook subscription", "Webhook target refused")


@router.get("", response_model=list[WebhookRead])
def list_webhooks(engine: EngineDep, _: AdminScope) -> list[WebhookRead]:
    with engine.connect() as conn:
        return [WebhookRead.from_row(r) for r in service.list_subscriptions(conn=conn)]


@router.post("", response_model=WebhookRead, status_code=201)
def create_webhook(body: WebhookCreate, engine: EngineDep, who: AdminScope) -> WebhookRead:
    with PROBLEMS.on_write(), engine.begin() as conn:
        row = service.create_subscription(
            conn=conn, name=body.name, url=body.url, format=body.format,
            secret=body.secret.get_secret_value() if body.secret else None,
            routing_key=body.routing_key.get_secret_value() if body.routing_key else None,
            filters=body.filters.model_dump(), send_resolved=body.send_resolved, enabled=body.enabled,
            created_by=who.name)
    return WebhookRead.from_row(row)


@router.get("/{webhook_id}", response_model=WebhookRead)
def get_webhook(webhook_id: int, engine: EngineDep, _: AdminScope) -> WebhookRead:
    with engine.connect() as conn:
        row = service.get_subscription(conn=conn, subscription_id=webhook_id)
    if row is None:
        raise PROBLEMS.not_found(webhook_id)
    return WebhookRead.from_row(row)


@router.patch("/{webhook_id}", response_model=WebhookRead)
def update_webhook(webhook_id: int, body: WebhookUpdate, engine: EngineDep, _: AdminScope) -> WebhookRead:
    values: dict[str, Any] = body.model_dump(exclude_unset=True, exclude={"secret", "routing_key", "clear_secret"})
    if body.secret is not None:
        values["secret"] = body.secret.get_secret_value()
    elif body.clear_secret:
        values["secret"] = None
    if body.routing_key is not None:
        values["routing_key"] = body.routing_key.get_secret_value()
    with PROBLEMS.on_write(), engine.begin() as conn:
        current = service.get_subscription(conn=conn, subscription_id=webhook_id)
        if current is None:
            raise PROBLEMS.not_found(webhook_id)
        fmt = values.get("format", current["format"])
        if fmt == "pagerduty" and not values.get("routing_key", current["routing_key"]):
            raise Problem(422, "Invalid request", "a pagerduty subscription needs routing_key")
        row = service.update_subscription(conn=conn, subscription_id=webhook_id, values=values)
    return WebhookRead.from_row(row)  # type: ignore[arg-type]


@router.delete("/{webhook_id}", status_code=204)
def delete_webhook(webhook_id: int, engine: EngineDep, _: AdminScope) -> Response:
    with engine.begin() as conn:
        if not service.delete_subscription(conn=conn, subscription_id=webhook_id):
            raise PROBLEMS.not_found(webhook_id)
    return Response(status_code=204)


@router.post("/{webhook_id}/test", response_model=TestFireResult, summary="Send a test notification now")
def test_webhook(webhook_id: int, engine: EngineDep, who: AdminScope) -> TestFireResult:
    with engine.connect() as conn:
        if service.get_subscription(conn=conn, subscription_id=webhook_id) is None:
            raise PROBLEMS.not_found(webhook_id)
    outbox_id, outcome = service.test_fire(engine=engine, subscription_id=webhook_id, actor=who.name)
    with engine.connect() as conn:
        rows = service.list_deliveries(conn=conn, subscription_id=webhook_id, limit=1, outbox_id=outbox_id)
    return TestFireResult(outbox_id=outbox_id, outcome=outcome, delivery=DeliveryRead(**rows[0]) if rows else None)


@router.get("/{webhook_id}/deliveries", response_model=DeliveryPage, summary="Delivery attempts, newest first")
def list_deliveries(webhook_id: int, engine: EngineDep, _: AdminScope,
                    limit: Annotated[int, Query(ge=1, le=500)] = 100, cursor: str | None = None) -> DeliveryPage:
    before = None
    if cursor is not None:
        if not cursor.isdigit():
            raise Problem(400, "Bad parameter", "malformed cursor")
        before = int(cursor)
    with engine.connect() as conn:
        if service.get_subscription(conn=conn, subscription_id=webhook_id) is None:
            raise PROBLEMS.not_found(webhook_id)
        rows = service.list_deliveries(conn=conn, subscription_id=webhook_id, limit=limit + 1, before_id=before)
    more = len(rows) > limit
    rows = rows[:limit]
    return DeliveryPage(items=[DeliveryRead(**r) for r in rows], next_cursor=str(rows[-1]["id"]) if more else None)
