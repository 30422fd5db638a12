"""Alertmanager destinations (admin scope, router `router`) and the notification status (`status_router`)."""

from __future__ import annotations

from typing import Any

from fastapi import APIRouter, Response

from service.api.auth import AdminScope
from service.api.deps import EngineDep
from service.notify import destinations
from service.notify.schemas import (
    AlertmanagerCreate,
    AlertmanagerRead,
    AlertmanagerStatus,
    AlertmanagerUpdate,
    NotifyStatus,
    WebhookStatus,
)
from service.notify.view_errors import DestinationProblems

router = APIRouter(prefix="/api/v1/alertmanagers", tags=["alertmanagers"])
status_router = APIRouter(prefix="/api/v1/notify", tags=["webhooks", "alertmanagers"])


PROBLEMS = DestinationProblems("Alertmanager destination", "Alertmanager target refused")


@router.get("", response_model=list[AlertmanagerRead])
def list_alertmanagers(engine: EngineDep, _: AdminScope) -> list[AlertmanagerRead]:
    with engine.connect() as conn:
        return [AlertmanagerRead.from_row(r) for r in destinations.list_destinations(conn=conn)]


@router.post("", response_model=AlertmanagerRead, status_code=201,
             summary="Add an Alertmanager; it gets every alert that fires now")
def create_alertmanager(body: AlertmanagerCreate, engine: EngineDep, who: AdminScope) -> AlertmanagerRead:
    with PROBLEMS.on_write(), engine.begin() as conn:
        row = destinations.create_destination(conn=conn, name=body.name, url=body.url,
                                              filters=body.filters.model_dump(), enabled=body.enabled,
                                              created_by=who.name, auth=body.authorization())
    return AlertmanagerRead.from_row(row)


@router.get("/{destination_id}", response_model=AlertmanagerRead)
def get_alertmanager(destination_id: int, engine: EngineDep, _: AdminScope) -> AlertmanagerRead:
    with engine.connect() as conn:
        row = destinations.get_destination(conn=conn, destination_id=destination_id)
    if row is None:
        raise PROBLEMS.not_found(destination_id)
    return AlertmanagerRead.from_row(row)


@router.patch("/{destination_id}", response_model=AlertmanagerRead)
def update_alertmanager(destination_id: int, body: AlertmanagerUpdate, engine: EngineDep,
                        _: AdminScope) -> AlertmanagerRead:
    # a field sent as null is left as it is, like a field left out (docs/api.md)
    values: dict[str, Any] = {k: v for k, v in body.model_dump(
        exclude_unset=True, exclude={"basic_auth", "bearer_token", "clear_auth"}).items() if v is not None}
    if (auth := body.authorization()) is not None:
        values["auth_kind"], values["credential"] = auth
    elif body.clear_auth:
        values["auth_kind"] = values["credential"] = None
    with PROBLEMS.on_write(), engine.begin() as conn:
        row = destinations.update_destination(conn=conn, destination_id=destination_id, values=values)
    if row is None:
        raise PROBLEMS.not_found(destination_id)
    return AlertmanagerRead.from_row(row)


@router.delete("/{destination_id}", status_code=204)
def delete_alertmanager(destination_id: int, engine: EngineDep, _: AdminScope) -> Response:
    with engine.begin() as conn:
        if not destinations.delete_destination(conn=conn, destination_id=destination_id):
            raise PROBLEMS.not_found(destination_id)
    return Response(status_code=204)


@status_router.get("", response_model=NotifyStatus,
                   summary="Delivery status of every webhook subscription and Alertmanager")
def notify_status(engine: EngineDep, _: AdminScope) -> NotifyStatus:
    with engine.connect() as conn:
        st = destinations.notify_status(conn=conn)
    return NotifyStatus(webhooks=[WebhookStatus(**r) for r in st["webhooks"]],
                        alertmanagers=[AlertmanagerStatus(**{k: r[k] for k in AlertmanagerStatus.model_fields})
                                       for r in st["alertmanagers"]])
