"""Incident vocabulary (states, legal transitions, outcomes), settings and the API's pydantic schemas."""

from __future__ import annotations

from datetime import datetime
from enum import StrEnum
from typing import Any

from pydantic import BaseModel, ConfigDict, Field


class State(StrEnum):
    SUSPECT = "suspect"
    DRAIN_RECOMMENDED = "drain_recommended"
    DRAINED = "drained"
    IN_REPAIR = "in_repair"
    VERIFYING = "verifying"
    RETURNED = "returned_to_service"
    CLOSED = "closed"
    FALSE_ALARM = "false_alarm"


OPEN_STATES = (State.SUSPECT, State.DRAIN_RECOMMENDED, State.DRAINED, State.IN_REPAIR, State.VERIFYING)

# The lifecycle. A drained link never skips verification on its way back: from drained,
# in_repair or verifying the only exit to service is verifying -> returned_to_service (soak gate).
TRANSITIONS: dict[State, tuple[State, ...]] = {
    State.SUSPECT: (State.DRAIN_RECOMMENDED, State.DRAINED, State.CLOSED, State.FALSE_ALARM),
    State.DRAIN_RECOMMENDED: (State.DRAINED, State.SUSPECT, State.CLOSED, State.FALSE_ALARM),
    State.DRAINED: (State.IN_REPAIR, State.VERIFYING),
    State.IN_REPAIR: (State.VERIFYING,),
    State.VERIFYING: (State.RETURNED, State.IN_REPAIR),
    State.RETURNED: (State.CLOSED,),
    State.CLOSED: (),
    State.FALSE_ALARM: (),
}


class RepairAction(StrEnum):
    CLEANED = "cleaned"
    RESEATED = "reseated"
    REPLACED_MODULE = "replaced_module"
    REPLACED_CABLE = "replaced_cable"
    NONE = "none"


class PartBad(StrEnum):
    YES = "yes"
    NO = "no"
    UNKNOWN = "unknown"


class IncidentSettings(BaseModel):
    """Verification soak settings: `Settings.soak` (FABRICWATCH_SOAK_<FIELD> or `soak:` in the file)."""

    model_config = ConfigDict(extra="forbid")
    window_s: float = Field(default=3600.0, gt=0)
    rx_power_tolerance_db: float = Field(default=1.0, gt=0)
    baseline_window_s: float = Field(default=86400.0, gt=0)   # pre-fault baseline: this long before fault_at
    min_coverage: float = Field(default=0.9, gt=0, le=1)      # share of the soak window the counters must span


def incident_settings() -> IncidentSettings:
    """The service's soak settings (service.config: environment over the config file)."""
    from service.config import get_settings

    return get_settings().soak


# ---------------------------------------------------------------------------- API schemas


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class TransitionCreate(Strict):
    to: State
    note: str | None = Field(default=None, max_length=10_000)
    at: datetime | None = Field(default=None, description="data time for the soak check; default: now")


class NoteCreate(Strict):
    text: str = Field(min_length=1, max_length=10_000)


class OwnerUpdate(Strict):
    owner: str | None = Field(default=None, max_length=128, description="null clears the owner")


class OutcomeCreate(Strict):
    repair_action: RepairAction
    part_bad: PartBad
    note: str | None = Field(default=None, max_length=10_000)


class EventRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    ts: datetime
    actor: str
    kind: str
    from_state: str | None
    to_state: str | None
    text: str | None
    data: dict[str, Any]


class IncidentRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    entity_kind: str
    entity: str
    device: str
    port: str | None
    peer_device: str | None
    peer_port: str | None
    pod: str | None
    state: str
    allowed_transitions: list[str] = Field(default_factory=list)
    cause: str | None
    part_number: str | None
    owner: str | None
    alert_id: int | None
    fingerprint: str | None
    summary: str | None
    fault_at: datetime
    opened_at: datetime
    updated_at: datetime
    state_since: datetime
    closed_at: datetime | None
    repair_action: str | None
    part_bad: str | None
    outcome_note: str | None
    outcome_by: str | None
    outcome_at: datetime | None


class IncidentDetail(IncidentRead):
    timeline: list[EventRead] = Field(default_factory=list)


class SoakCheck(BaseModel):
    check: str                  # counter | flaps | rx_power | coverage
    ok: bool
    subject: str                # device:port[:lane] or metric
    message: str
    numbers: dict[str, Any] = Field(default_factory=dict)


class SoakReport(BaseModel):
    clean: bool
    window_start: datetime
    window_end: datetime
    summary: str
    checks: list[SoakCheck]


class PrecisionRow(BaseModel):
    key: str | None
    confirmed: int              # part really bad
    refuted: int                # part fine, or the incident was a false alarm
    unknown: int
    precision: float | None     # confirmed / (confirmed + refuted); None with no decided outcome


class PrecisionRead(BaseModel):
    by_cause: list[PrecisionRow]
    by_part_number: list[PrecisionRow]


class NoteAdded(BaseModel):
    incident_id: int
    added: bool
