"""Drain endpoints: list, get, approve, reject, done, retry, executions, and the circuit breaker."""

from __future__ import annotations

from typing import Annotated

from fastapi import APIRouter, Query, Response

from service.api.auth import OperateScope, ReadScope
from service.api.deps import EngineDep
from service.api.problems import Problem
from service.drains import execution, service
from service.drains.executors import TemplateError
from service.drains.schemas import BreakerRead, Decision, DrainRead, DrainStatus, ExecutionRead
from service.incidents.service import IncidentError

router = APIRouter(prefix="/api/v1/drains", tags=["drains"])


def _problem(exc: Exception) -> Problem:
    if isinstance(exc, service.DrainNotFound):
        return Problem(404, "Drain recommendation not found", str(exc))
    if isinstance(exc, service.DrainStateError):
        return Problem(409, "Illegal drain decision", str(exc), current=exc.current, allowed_from=exc.allowed_from)
    if isinstance(exc, TemplateError):
        return Problem(500, "Drain executor misconfigured", str(exc))
    return Problem(409, "Drain conflict", str(exc))


@router.get("", summary="Drain recommendations, newest first", response_model=list[DrainRead])
def list_drains(engine: EngineDep, _: ReadScope,
                status: Annotated[list[DrainStatus] | None, Query()] = None,
                incident_id: int | None = None, pod: str | None = None, device: str | None = None,
                limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                offset: Annotated[int, Query(ge=0)] = 0) -> list[DrainRead]:
    with engine.connect() as conn:
        rows = service.list_drains(conn=conn, status=[s.value for s in status] if status else None,
                                   incident_id=incident_id, pod=pod, device=device, limit=limit, offset=offset)
    return [DrainRead.model_validate(r) for r in rows]


@router.get("/breaker", summary="Circuit breaker state")
def get_breaker(engine: EngineDep, _: ReadScope) -> BreakerRead:
    with engine.begin() as conn:
        return service.breaker_state(conn=conn)


@router.post("/breaker/reset", summary="Reset the circuit breaker (attributed)")
def post_breaker_reset(engine: EngineDep, principal: OperateScope, body: Decision | None = None) -> BreakerRead:
    with engine.begin() as conn:
        return service.reset_breaker(conn=conn, actor=principal.name, note=body.note if body else None)


@router.get("/{drain_id}", summary="One drain recommendation with its verdict and commands")
def get_drain(drain_id: int, engine: EngineDep, _: ReadScope) -> DrainRead:
    with engine.connect() as conn:
        try:
            return DrainRead.model_validate(service.get(conn=conn, drain_id=drain_id))
        except service.DrainError as exc:
            raise _problem(exc) from None


def _queued(row: DrainRead, response: Response) -> DrainRead:
    """202 when an execution was queued: a worker runs it after this answer (its id and state in `execution`)."""
    if row.status == DrainStatus.APPROVED and (row.execution or {}).get("state") == "queued":
        response.status_code = 202
        response.headers["Location"] = f"/api/v1/drains/{row.id}/executions"
    return row


@router.post("/{drain_id}/approve", summary="Approve (safety is re-checked now; 409 with the verdict if not safe)",
             responses={202: {"model": DrainRead, "description": "Approved, and its execution queued (an executor is "
                              "configured): `execution` has its id and state; a worker runs it after this answer"}})
def post_approve(drain_id: int, engine: EngineDep, principal: OperateScope, response: Response,
                 body: Decision | None = None) -> DrainRead:
    try:
        with engine.begin() as conn:
            row = service.approve(conn=conn, drain_id=drain_id, actor=principal.name, note=body.note if body else None)
    except (service.DrainError, IncidentError, TemplateError) as exc:
        raise _problem(exc) from None
    if row.status == DrainStatus.BLOCKED:
        # Committed above: the recommendation now carries the verdict that refused it.
        raise Problem(409, "Drain no longer safe", row.verdict.get("summary"), verdict=row.verdict)
    if row.status == DrainStatus.WITHDRAWN:  # committed above: its alert had resolved
        raise Problem(409, "Drain withdrawn", row.decision_note, current=row.status, alert_state=row.alert_state)
    return _queued(DrainRead.model_validate(row), response)


@router.post("/{drain_id}/retry", status_code=202,
             summary="Run a failed or unknown execution again (after checking the target): a new execution")
def post_retry(drain_id: int, engine: EngineDep, principal: OperateScope, body: Decision | None = None) -> DrainRead:
    try:
        with engine.begin() as conn:
            row = service.retry(conn=conn, drain_id=drain_id, actor=principal.name, note=body.note if body else None)
    except (service.DrainError, IncidentError) as exc:
        raise _problem(exc) from None
    return DrainRead.model_validate(row)


@router.get("/{drain_id}/executions", summary="The drain's executions, oldest first: each attempt, its steps and end")
def get_executions(drain_id: int, engine: EngineDep, _: ReadScope) -> list[ExecutionRead]:
    with engine.connect() as conn:
        try:
            service.get(conn=conn, drain_id=drain_id)
        except service.DrainError as exc:
            raise _problem(exc) from None
        return [ExecutionRead.model_validate(r) for r in execution.list_executions(conn=conn, drain_id=drain_id)]


@router.post("/{drain_id}/reject", summary="Reject a pending or blocked recommendation")
def post_reject(drain_id: int, engine: EngineDep, principal: OperateScope, body: Decision | None = None) -> DrainRead:
    try:
        with engine.begin() as conn:
            row = service.reject(conn=conn, drain_id=drain_id, actor=principal.name, note=body.note if body else None)
    except (service.DrainError, IncidentError) as exc:
        raise _problem(exc) from None
    return DrainRead.model_validate(row)


@router.post("/{drain_id}/done", summary="Mark an approved drain as in place (also after a failed or unknown "
             "execution, once checked)")
def post_done(drain_id: int, engine: EngineDep, principal: OperateScope, body: Decision | None = None) -> DrainRead:
    try:
        with engine.begin() as conn:
            row = service.mark_done(conn=conn, drain_id=drain_id, actor=principal.name,
                                    note=body.note if body else None)
    except (service.DrainError, IncidentError) as exc:
        raise _problem(exc) from None
    return DrainRead.model_validate(row)
