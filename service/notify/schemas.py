"""Pydantic schemas for webhook subscriptions and their delivery log. Secrets are write-only."""

from __future__ import annotations

import base64
import re
import string
from datetime import datetime
from typing import Any, Literal
from urllib.parse import urlsplit, urlunsplit

from pydantic import BaseModel, ConfigDict, Field, SecretStr, field_validator, model_validator

from service.json_setting import json_setting

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


_LABEL_NAME = re.compile(r"[a-zA-Z_][a-zA-Z0-9_]*")


class AlertmanagerSettings(BaseModel):
    """How alerts are pushed to Alertmanagers (FABRICWATCH_ALERTMANAGER_<FIELD>, or `alertmanager:` in the
    config file). The targets themselves are configured through /api/v1/alertmanagers; the URL policy is
    the webhooks' (FABRICWATCH_WEBHOOK_ALLOW / _DENY)."""

    model_config = ConfigDict(extra="forbid")

    resend_s: float = Field(default=60.0, gt=0, le=3600,
                            description="a firing alert is sent again this often (Prometheus' resend_delay)")
    ends_after_s: float = Field(default=240.0, gt=0, le=86400,
                                description="endsAt of a firing alert is this far ahead of each send: Alertmanager "
                                "resolves it by itself if fabricwatch stops sending (4 resends, as Prometheus)")
    timeout_s: float = Field(default=10.0, gt=0, le=300, description="per POST")
    batch_size: int = Field(default=256, ge=1, le=10_000, description="alerts per POST")
    backoff_base_s: float = Field(default=2.0, gt=0, description="first retry after a failed POST")
    backoff_max_s: float = Field(default=60.0, gt=0, description="the longest wait between tries")
    poll_s: float = Field(default=5.0, gt=0, le=300, description="how often due alerts are looked for")
    external_labels: dict[str, str] = Field(
        default_factory=dict, description="labels added to every alert, as Prometheus' external_labels (e.g. "
        '{"source": "fabricwatch", "cluster": "gpu-a"}): route on them; they may not replace fabricwatch\'s own')
    runbook_url: str = Field(default="", max_length=2048,
                             description="runbook_url annotation, with {cause}, {kind}, {action} filled in; "
                             "empty: none")

    @field_validator("external_labels", mode="before")
    @classmethod
    def _json(cls, v: Any) -> Any:
        """FABRICWATCH_ALERTMANAGER_EXTERNAL_LABELS is JSON text (the config file gives a mapping)."""
        return json_setting(v, expected="not a JSON object of label names to values")

    @model_validator(mode="after")
    def _check(self) -> AlertmanagerSettings:
        if self.ends_after_s <= self.resend_s:
            raise ValueError(f"ends_after_s ({self.ends_after_s:g}) must be longer than resend_s "
                             f"({self.resend_s:g}), or Alertmanager resolves firing alerts between two sends")
        try:
            names = {n for _, n, _, _ in string.Formatter().parse(self.runbook_url) if n is not None}
        except ValueError as exc:
            raise ValueError(f"runbook_url: {exc}") from None
        own = {"alertname", "device", "port", "lane", "peer_device", "peer_port", "pod", "rail", "severity", "cause",
               "scope"}
        for name, value in self.external_labels.items():
            if not _LABEL_NAME.fullmatch(name) or name.startswith("__"):
                raise ValueError(f"external_labels: {name!r} is not a label name ([a-zA-Z_][a-zA-Z0-9_]*)")
            if name in own:
                raise ValueError(f"external_labels: {name!r} is one of fabricwatch's own labels")
            if not value:
                raise ValueError(f"external_labels: {name!r} has an empty value (Alertmanager drops it)")
        bad = names - {"cause", "kind", "action"}
        if bad:
            raise ValueError(f"runbook_url: unknown placeholder(s) {', '.join(sorted(bad))} "
                             "(known: cause, kind, action)")
        return self


class BasicAuth(Strict):
    username: str = Field(min_length=1, max_length=256, pattern=r"^[^:]*$")
    password: SecretStr = Field(min_length=1, max_length=1024)


class _AlertmanagerAuth(Strict):
    basic_auth: BasicAuth | None = Field(default=None, description="write-only: stored sealed, never returned")
    bearer_token: SecretStr | None = Field(default=None, min_length=1, max_length=4096,
                                           description="write-only: stored sealed, never returned")

    @model_validator(mode="after")
    def _one_auth(self) -> _AlertmanagerAuth:
        if self.basic_auth is not None and self.bearer_token is not None:
            raise ValueError("give basic_auth or bearer_token, not both")
        return self

    def authorization(self) -> tuple[str, str] | None:
        """(auth_kind, the Authorization header's value), or None when neither is given."""
        if self.basic_auth is not None:
            pair = f"{self.basic_auth.username}:{self.basic_auth.password.get_secret_value()}"
            return "basic", "Basic " + base64.b64encode(pair.encode()).decode("ascii")
        if self.bearer_token is not None:
            return "bearer", "Bearer " + self.bearer_token.get_secret_value()
        return None


class AlertmanagerCreate(_AlertmanagerAuth):
    name: str = Field(min_length=1, max_length=128)
    url: str = Field(min_length=8, max_length=2048,
                     description="base URL, e.g. http://alertmanager:9093 (with its route prefix if any)")
    filters: Filters = Field(default_factory=Filters)
    enabled: bool = True


class AlertmanagerUpdate(_AlertmanagerAuth):
    name: str | None = Field(default=None, min_length=1, max_length=128)
    url: str | None = Field(default=None, min_length=8, max_length=2048)
    filters: Filters | None = None
    enabled: bool | None = None
    clear_auth: bool = Field(default=False, description="send no Authorization header any more")


class AlertmanagerRead(BaseModel):
    id: int
    name: str
    url: str
    filters: Filters
    enabled: bool
    auth: Literal["none", "basic", "bearer"] = Field(description="how fabricwatch authenticates (the credential is "
                                                                 "never returned)")
    created_by: str
    created_at: datetime
    updated_at: datetime

    @classmethod
    def from_row(cls, row: dict[str, Any]) -> AlertmanagerRead:
        return cls(id=row["id"], name=row["name"], url=row["url"], filters=Filters(**(row["filters"] or {})),
                   enabled=row["enabled"], auth=row["auth_kind"] or "none", created_by=row["created_by"],
                   created_at=row["created_at"],
                   updated_at=row["updated_at"])


class WebhookStatus(BaseModel):
    id: int
    name: str
    url: str
    format: Format
    enabled: bool
    pending: int = Field(description="messages not yet delivered (in flight and waiting for a retry included)")
    dead: int = Field(description="messages given up after max_attempts")
    delivered: int
    oldest_pending_at: datetime | None
    last_outcome: str | None = Field(description="the latest attempt: delivered | retry | dead")
    last_status_code: int | None
    last_error: str | None
    last_attempt_at: datetime | None


class AlertmanagerStatus(BaseModel):
    id: int
    name: str
    url: str
    enabled: bool
    state: Literal["ok", "failing", "idle", "disabled"] = Field(
        description="ok: the last POST was accepted; failing: it was not (see last_error, retry_at); "
        "idle: nothing sent yet; disabled")
    firing: int = Field(description="alerts it holds (or is to hold) as firing")
    pending: int = Field(description="alerts whose latest change it has not accepted yet")
    oldest_pending_since: datetime | None = Field(description="when the oldest of those became due")
    failures: int = Field(description="failed POSTs in a row")
    retry_at: datetime | None
    last_attempt_at: datetime | None
    last_success_at: datetime | None
    last_status_code: int | None
    last_error: str | None


class NotifyStatus(BaseModel):
    webhooks: list[WebhookStatus]
    alertmanagers: list[AlertmanagerStatus]
