"""Pydantic schemas for alerts, their history, silences and maintenance windows (Create/Read/Update)."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, computed_field, field_validator, model_validator

from service.alerts.matchers import PatternError, compile_pattern, fullmatch
from service.alerts.service import MATCHER_LABELS

AlertState = Literal["firing", "acknowledged", "resolved"]
MatcherLabel = Literal["kind", "device", "port", "lane", "pod", "severity", "cause", "scope", "peer_device",
                       "peer_port", "fingerprint"]
assert set(MatcherLabel.__args__) == set(MATCHER_LABELS)  # type: ignore[attr-defined]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class AlertRead(BaseModel):
    id: int
    fingerprint: str
    kind: str
    scope: str
    device: str
    port: str | None
    lane: int | None
    peer_device: str | None
    peer_port: str | None
    pod: str | None
    state: AlertState
    severity: str
    cause: str
    action: str
    end: str | None
    summary: str = Field(description="the summary of the episode's worst cycle (peak_at_ms)")
    score: float = Field(description="the last cycle's score")
    ttt_hours: float | None
    evidence: list[dict[str, Any]] = Field(description="the last cycle's evidence")
    peak_score: float = Field(description="the highest score of this firing episode")
    peak_evidence: list[dict[str, Any]] = Field(description="the evidence of the episode's worst cycle")
    peak_at_ms: int | None = Field(description="data time of the episode's worst cycle")
    members: list[str]
    finding_state: str | None = Field(description="last cycle's finding state; null when absent")
    missed_cycles: int
    parent_id: int | None = Field(description="the device-level alert this one is grouped under")
    muted_by: str | None = Field(description="silence:ID, maintenance:ID or inhibited:PARENT_ID")
    notified: bool
    episode: int
    first_opened_at_ms: int
    opened_at_ms: int
    last_seen_ms: int
    resolved_at_ms: int | None
    resolved_by: str | None
    acknowledged_at_ms: int | None
    acknowledged_by: str | None
    created_at: datetime
    updated_at: datetime


class AlertEventRead(BaseModel):
    id: int
    alert_id: int
    at_ms: int = Field(description="data time of the change (the detection cycle, or wall time for people)")
    recorded_at: datetime
    actor: str
    event: str
    from_state: str | None
    to_state: str | None
    comment: str | None
    detail: dict[str, Any]


class AlertDetail(AlertRead):
    events: list[AlertEventRead]
    children: list[int]


class AlertPage(BaseModel):
    items: list[AlertRead]
    next_cursor: str | None = Field(description="pass as ?cursor= for the next page; null on the last page")


class AlertAction(Strict):
    comment: str | None = Field(default=None, max_length=4000)


class CommentCreate(Strict):
    comment: str = Field(min_length=1, max_length=4000)


class Matcher(Strict):
    """Alertmanager-style matcher: `name = value`, `!=`, `=~` (is_regex, anchored), `!~`."""

    name: MatcherLabel
    value: str = Field(max_length=1024)
    is_regex: bool = False
    is_equal: bool = True

    @model_validator(mode="after")
    def _regex_compiles(self) -> Matcher:
        if self.is_regex:
            try:
                compile_pattern(self.value)
            except PatternError as exc:
                raise ValueError(f"matcher {self.name}=~{self.value!r}: {exc}") from None
        return self

    def matches_empty(self) -> bool:
        hit = fullmatch(self.value, "") if self.is_regex else self.value == ""
        return hit if self.is_equal else not hit


def _aware(v: datetime | None) -> datetime | None:
    return v.replace(tzinfo=UTC) if v is not None and v.tzinfo is None else v


class _Range(Strict):
    @field_validator("starts_at", "ends_at", mode="after", check_fields=False)
    @classmethod
    def _tz(cls, v: datetime | None) -> datetime | None:
        return _aware(v)

    @model_validator(mode="after")
    def _ordered(self) -> Any:
        s, e = getattr(self, "starts_at", None), getattr(self, "ends_at", None)
        if s is not None and e is not None and e <= s:
            raise ValueError("ends_at must be after starts_at")
        return self


class SilenceCreate(_Range):
    matchers: list[Matcher] = Field(min_length=1, max_length=32)
    starts_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    ends_at: datetime
    comment: str = Field(min_length=1, max_length=4000, description="why: required, as in Alertmanager")

    @model_validator(mode="after")
    def _not_everything(self) -> SilenceCreate:
        if all(m.matches_empty() for m in self.matchers):
            raise ValueError("at least one matcher must not match the empty string (it would silence everything)")
        return self


class SilenceUpdate(_Range):
    matchers: list[Matcher] | None = Field(default=None, min_length=1, max_length=32)
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    comment: str | None = Field(default=None, min_length=1, max_length=4000)


def _status(starts_at: datetime, ends_at: datetime) -> str:
    now = datetime.now(UTC)
    return "pending" if now < starts_at else "active" if now < ends_at else "expired"


class SilenceRead(BaseModel):
    id: int
    matchers: list[Matcher]
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    updated_at: datetime

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> str:
        return _status(self.starts_at, self.ends_at)


class MaintenanceCreate(_Range):
    device: str = Field(min_length=1, max_length=128)
    port: str | None = Field(default=None, min_length=1, max_length=128, description="null = the whole device")
    starts_at: datetime = Field(default_factory=lambda: datetime.now(UTC))
    ends_at: datetime
    comment: str = Field(default="", max_length=4000)


class MaintenanceUpdate(_Range):
    starts_at: datetime | None = None
    ends_at: datetime | None = None
    comment: str | None = Field(default=None, max_length=4000)


class MaintenanceRead(BaseModel):
    id: int
    device: str
    port: str | None
    starts_at: datetime
    ends_at: datetime
    created_by: str
    comment: str
    created_at: datetime
    updated_at: datetime

    @computed_field  # type: ignore[prop-decorator]
    @property
    def status(self) -> str:
        return _status(self.starts_at, self.ends_at)
