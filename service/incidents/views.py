"""Incident endpoints: list, detail with timeline, transitions, notes, owner, outcome, soak preview, precision."""

from __future__ import annotations

from typing import Annotated, Any

from fastapi import APIRouter, Query
from sqlalchemy import Row

from service.api.auth import OperateScope, ReadScope
from service.api.deps import EngineDep
from service.api.params import optional_time, time_query
from service.api.problems import Problem
from service.detection.findings import Cause
from service.incidents import service
from service.incidents.schemas import (
    TRANSITIONS,
    EventRead,
    IncidentDetail,
    IncidentRead,
    NoteAdded,
    NoteCreate,
    OutcomeCreate,
    OwnerUpdate,
    PrecisionRead,
    SoakReport,
    State,
    TransitionCreate,
)

router = APIRouter(prefix="/api/v1/incidents", tags=["incidents"])


def _read(row: Row[Any]) -> IncidentRead:
    out = IncidentRead.model_validate(row)
    out.allowed_transitions = [s.value for s in TRANSITIONS[State(row.state)]]
    return out


def problem_for(exc: service.IncidentError) -> Problem:
    """Incident errors as RFC 9457 problems: 404 unknown, 409 for state conflicts (with the numbers)."""
    if isinstance(exc, service.IncidentNotFound):
        return Problem(404, "Incident not found", str(exc))
    if isinstance(exc, service.IllegalTransition):
        return Problem(409, "Illegal incident transition", str(exc), current=exc.current,
                       attempted=exc.attempted, allowed=exc.allowed)
    if isinstance(exc, service.SoakNotClean):
        return Problem(409, "Verification soak not clean", str(exc), soak=exc.report.model_dump(mode="json"))
    return Problem(409, "Incident conflict", str(exc))


@router.get("", summary="Incidents, newest first", response_model=list[IncidentRead])
def list_incidents(engine: EngineDep, _: ReadScope,
                   state: Annotated[list[State] | None, Query()] = None,
                   open: bool = False, device: str | None = None, cause: Cause | None = None,
                   owner: str | None = None, pod: str | None = None,
                   limit: Annotated[int, Query(ge=1, le=1000)] = 100,
                   offset: Annotated[int, Query(ge=0)] = 0) -> list[IncidentRead]:
    with engine.connect() as conn:
        rows = service.list_incidents(conn=conn, state=[s.value for s in state] if state else None, open_only=open,
                                      device=device, cause=cause.value if cause else None, owner=owner, pod=pod,
                                      limit=limit, offset=offset)
    return [_read(r) for r in rows]


@router.get("/precision", summary="Live precision per cause and per part number, from repair outcomes")
def get_precision(engine: EngineDep, _: ReadScope) -> PrecisionRead:
    with engine.connect() as conn:
        return service.precision(conn=conn)


@router.get("/{incident_id}", summary="One incident with its timeline")
def get_incident(incident_id: int, engine: EngineDep, _: ReadScope) -> IncidentDetail:
    with engine.connect() as conn:
        try:
            row = service.get(conn=conn, incident_id=incident_id)
        except service.IncidentError as exc:
            raise problem_for(exc) from None
        events = service.timeline(conn=conn, incident_id=incident_id)
    detail = IncidentDetail(**_read(row).model_dump())
    detail.timeline = [EventRead.model_validate(e) for e in events]
    return detail


@router.get("/{incident_id}/soak", summary="Preview the verification soak (what returning to service would check)")
def get_soak(incident_id: int, engine: EngineDep, _: ReadScope,
             at: Annotated[str | None, time_query("end of the soak window (default: now)")] = None) -> SoakReport:
    when = optional_time(at, "at")
    with engine.connect() as conn:
        try:
            row = service.get(conn=conn, incident_id=incident_id)
        except service.IncidentError as exc:
            raise problem_for(exc) from None
        return service.verify_soak(conn=conn, incident=row, at=when)


@router.post("/{incident_id}/transitions", summary="Move the incident to another state")
def post_transition(incident_id: int, body: TransitionCreate, engine: EngineDep,
                    principal: OperateScope) -> IncidentRead:
    try:
        with engine.begin() as conn:
            row = service.transition(conn=conn, incident_id=incident_id, to=body.to, actor=principal.name,
                                     note=body.note, at=body.at)
    except service.IncidentError as exc:
        raise problem_for(exc) from None
    return _read(row)


@router.post("/{incident_id}/notes", summary="Add a note to the timeline", status_code=201, response_model=NoteAdded)
def post_note(incident_id: int, body: NoteCreate, engine: EngineDep, principal: OperateScope) -> dict[str, Any]:
    try:
        with engine.begin() as conn:
            service.add_note(conn=conn, incident_id=incident_id, actor=principal.name, text_=body.text)
    except service.IncidentError as exc:
        raise problem_for(exc) from None
    return {"incident_id": incident_id, "added": True}


@router.put("/{incident_id}/owner", summary="Set or clear the owner")
def put_owner(incident_id: int, body: OwnerUpdate, engine: EngineDep, principal: OperateScope) -> IncidentRead:
    try:
        with engine.begin() as conn:
            row = service.set_owner(conn=conn, incident_id=incident_id, actor=principal.name, owner=body.owner)
    except service.IncidentError as exc:
        raise problem_for(exc) from None
    return _read(row)


@router.post("/{incident_id}/outcome", summary="Record the repair outcome (what was done, was the part bad)")
def post_outcome(incident_id: int, body: OutcomeCreate, engine: EngineDep, principal: OperateScope) -> IncidentRead:
    try:
        with engine.begin() as conn:
            row = service.record_outcome(conn=conn, incident_id=incident_id, actor=principal.name,
                                         repair_action=body.repair_action, part_bad=body.part_bad, note=body.note)
    except service.IncidentError as exc:
        raise problem_for(exc) from None
    return _read(row)
