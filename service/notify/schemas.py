"""Pydantic schemas for webhook subscriptions and their delivery log. Secrets are write-only."""

from __future__ import annotations

from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, model_validator

Format = Literal["generic", "alertmanager", "pagerduty", "slack"]


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)


class Filters(Strict):
    """Empty or absent = any. An alert must match every non-empty list."""

    severity: list[str] = Field(default_factory=list, max_length=16)
    kind: list[str] = Field(default_factory=list, max_length=256)
    pod: list[str] = Field(default_factory=list, max_length=1024)
    device: list[str] = Field(default_factory=list, max_length=4096)


class WebhookCreate(Strict):
    name: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=8, max_length=2048)
    format: Format = "generic"
    secret: SecretStr | None = Field(default=None, description="HMAC key (write-only, min 16 chars)")
    routing_key: SecretStr | None = Field(default=None, description="PagerDuty integration key (write-only)")
    filters: Filters = Field(default_factory=Filters)
    send_resolved: bool = True
    enabled: bool = True

    @model_validator(mode="after")
    def _check(self) -> WebhookCreate:
        if self.secret is not None and len(self.secret.get_secret_value()) < 16:
            raise ValueError("secret must be at least 16 characters")
        if self.format == "pagerduty" and not self.routing_key:
            raise ValueError("a pagerduty subscription needs routing_key")
        return self


class WebhookUpdate(Strict):
    name: str | None = Field(default=None, min_length=1, max_length=128)
    url: str | None = Field(default=None, min_length=8, max_length=2048)
    format: Format | None = None
    secret: SecretStr | None = None
    routing_key: SecretStr | None = None
    clear_secret: bool = False
    filters: Filters | None = None
    send_resolved: bool | None = None
    enabled: bool | None = None

    @model_validator(mode="after")
    def _check(self) -> WebhookUpdate:
        if self.secret is not None and len(self.secret.get_secret_value()) < 16:
            raise ValueError("secret must be at least 16 characters")
        return self


def display_url(url: str, fmt: str) -> str:
    """The URL as the API shows it: a Slack webhook's path is its credential, so it is masked."""
    parts = urlsplit(url)
    if fmt == "slack" or parts.query:
        path = "/…" if fmt == "slack" else parts.path
        return urlunsplit((parts.scheme, parts.netloc, path, "", ""))
    return url


class WebhookRead(BaseModel):
    id: int
    name: str
    url: str
    format: Format
    has_secret: bool
    has_routing_key: bool
    filters: Filters
    send_resolved: bool
    enabled: bool
    created_by: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> WebhookRead:
        return cls(id=row["id"], name=row["name"], url=display_url(row["url"], row["format"]), format=row["format"],
                   has_secret=bool(row["secret"]), has_routing_key=bool(row["routing_key"]),
                   filters=Filters(**(row["filters"] or {})), send_resolved=row["send_resolved"],
                   enabled=row["enabled"], created_by=row["created_by"], created_at=row["created_at"],
                   updated_at=row["updated_at"])


class DeliveryRead(BaseModel):
    id: int
    outbox_id: int
    attempt: int
    outcome: str = Field(description="delivered | retry | dead")
    status_code: int | None
    error: str | None
    duration_ms: float
    at: datetime
    event: str
    idempotency_key: str
    alert_id: int | None
    message_status: str = Field(description="the outbox row now: pending | delivered | dead")


class DeliveryPage(BaseModel):
    items: list[DeliveryRead]
    next_cursor: str | None


class TestFireResult(BaseModel):
    outbox_id: int
    outcome: str | None
    delivery: DeliveryRead | None
