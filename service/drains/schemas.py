"""Drain vocabulary, settings, the safety verdict format and the API's pydantic schemas."""

from __future__ import annotations

import json
from datetime import datetime
from enum import StrEnum
from typing import Any, Literal

from pydantic import BaseModel, ConfigDict, Field, field_validator


class TargetKind(StrEnum):
    LINK = "link"
    PORT = "port"
    HOST = "host"
    SWITCH = "switch"


class DrainAction(StrEnum):
    SHUT_PORTS = "shut_ports"      # admin-down both ends of a link (or every linked port of a switch)
    SLURM_DRAIN = "slurm_drain"    # scontrol update ... State=DRAIN: running jobs finish (preferred, F44)
    K8S_DRAIN = "k8s_drain"        # kubectl cordon + drain: evicts pods


class DrainStatus(StrEnum):
    BLOCKED = "blocked"        # verdict not safe; re-evaluated on the next recommend() for the target
    PENDING = "pending"        # safe, waiting for approval
    APPROVED = "approved"      # with an executor: its execution is queued or running (drain_executions)
    REJECTED = "rejected"
    DONE = "done"              # the drain is in place (marked by a person or a successful executor)
    RELEASED = "released"      # the incident returned to service or closed; no longer counts
    WITHDRAWN = "withdrawn"    # the incident closed, or its alert resolved, before a decision
    EXECUTION_FAILED = "execution_failed"     # the executor ran and reported a failure; a person decides
    EXECUTION_UNKNOWN = "execution_unknown"   # it started and never recorded an end; never re-run on its own


# Drains that (may) hold capacity out of service right now: the safety check counts these. A failed or
# unknown execution may have taken part of the target down (a cordon without its drain), so they count.
ACTIVE_STATUSES = (DrainStatus.APPROVED, DrainStatus.DONE, DrainStatus.EXECUTION_FAILED,
                   DrainStatus.EXECUTION_UNKNOWN)
# Approved drains whose execution did not end well: a person marks them done or asks for a retry.
UNSETTLED_STATUSES = (DrainStatus.EXECUTION_FAILED, DrainStatus.EXECUTION_UNKNOWN)
OPEN_STATUSES = (DrainStatus.BLOCKED, DrainStatus.PENDING)


class DrainSettings(BaseModel):
    """Safety limits and execution plugins: `Settings.drain` (FABRICWATCH_DRAIN_<FIELD> or `drain:` in the file)."""

    model_config = ConfigDict(extra="forbid")

    uplink_floor_fraction: float = Field(default=0.75, ge=0, le=1)   # CorrOpt-style share of uplinks to keep
    uplink_floor_min: int = Field(default=0, ge=0)                   # and at least this many
    max_per_pod: int = Field(default=2, ge=1)                        # concurrent active drains per pod
    rail_min_uplinks: int = Field(default=1, ge=0)                   # healthy uplinks a rail keeps in a pod
    breaker_max: int = Field(default=10, ge=1)                       # drains recommended per window ...
    breaker_window_s: float = Field(default=3600.0, gt=0)           # ... before the breaker trips
    down_lookback_s: float = Field(default=900.0, gt=0)             # port_oper_up readings this recent count
    host_action: Literal["slurm_drain", "k8s_drain"] = "slurm_drain"
    executor: Literal["none", "command", "webhook"] = "none"         # OFF by default
    command_shut_port: list[str] | None = None                       # argv template per port; no default
    command_slurm_drain: list[str] = Field(default_factory=lambda: [
        "scontrol", "update", "NodeName={host}", "State=DRAIN", "Reason=fabricwatch: {incident} {cause}"])
    command_k8s_cordon: list[str] = Field(default_factory=lambda: ["kubectl", "cordon", "{node}"])
    command_k8s_drain: list[str] = Field(default_factory=lambda: [
        "kubectl", "drain", "{node}", "--ignore-daemonsets", "--delete-emptydir-data"])
    command_timeout_s: float = Field(default=120.0, gt=0)
    webhook_url: str | None = None
    webhook_secret_env: str | None = None    # name of the env var holding the HMAC key, never the key
    webhook_timeout_s: float = Field(default=10.0, gt=0)
    execute_poll_s: float = Field(default=5.0, gt=0, le=300)        # how often queued executions are picked up

    @field_validator("command_shut_port", "command_slurm_drain", "command_k8s_cordon", "command_k8s_drain",
                     mode="before")
    @classmethod
    def _argv(cls, v: Any) -> Any:
        # Templates are JSON arrays (one element per argument), never a shell string to split.
        if isinstance(v, str):
            v = json.loads(v)
        if v is not None and (not isinstance(v, list) or not v or not all(isinstance(x, str) for x in v)):
            raise ValueError("a command template is a non-empty JSON array of strings")
        return v


def drain_settings() -> DrainSettings:
    """The service's drain settings (service.config: environment over the config file)."""
    from service.config import get_settings

    return get_settings().drain


class Target(BaseModel):
    """What to drain: a link (named by either end), a port, a host or a switch."""

    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    kind: TargetKind
    device: str = Field(min_length=1, max_length=128)
    port: str | None = Field(default=None, max_length=128)


class Check(BaseModel):
    """One evaluated constraint. `numbers` carries the figures the message quotes."""

    constraint: str      # circuit_breaker | pod_concurrency | uplink_floor | rail_host_path | rail_uplinks
    ok: bool
    subject: str
    message: str
    numbers: dict[str, Any] = Field(default_factory=dict)


class Verdict(BaseModel):
    safe: bool
    summary: str
    blocked_by: list[str] = Field(default_factory=list)
    checks: list[Check] = Field(default_factory=list)
    evaluated_at: datetime


class Decision(BaseModel):
    model_config = ConfigDict(extra="forbid", str_strip_whitespace=True)
    note: str | None = Field(default=None, max_length=10_000)


class DrainRead(BaseModel):
    model_config = ConfigDict(from_attributes=True)
    id: int
    incident_id: int | None
    target_kind: str
    target: str
    device: str
    port: str | None
    peer_device: str | None
    peer_port: str | None
    pod: str | None
    action: str
    status: str
    reason: str = Field(description="why it was recommended: the summary of its alert's worst cycle")
    cause: str | None
    alert_id: int | None = Field(default=None, description="the alert whose finding recommended it")
    alert_state: Literal["firing", "acknowledged", "resolved"] | None = Field(
        default=None, description="that alert's state now; null when there is none")
    verdict: dict[str, Any]
    commands: list[Any]
    execution: dict[str, Any] | None
    created_at: datetime
    updated_at: datetime
    recommended_at: datetime | None
    decided_by: str | None
    decided_at: datetime | None
    decision_note: str | None
    done_by: str | None
    done_at: datetime | None
    released_at: datetime | None


class ExecutionState(StrEnum):
    QUEUED = "queued"          # committed with the approval; waits for a worker
    RUNNING = "running"        # claimed: started_at and the worker are recorded, the executor runs
    SUCCEEDED = "succeeded"
    FAILED = "failed"          # ended, and the executor said how (exit status, HTTP status)
    UNKNOWN = "unknown"        # started and never recorded an end (the worker died): never run again
    CANCELLED = "cancelled"    # never started: the drain was no longer approved when a worker came to it


class ExecutionRead(BaseModel):
    """One attempt to carry out an approved drain (a row of the drain-execution outbox)."""

    model_config = ConfigDict(from_attributes=True)
    id: int
    drain_id: int
    seq: int = Field(description="1 for the approval's execution, 2.. for retries an operator asked for")
    idempotency_key: str = Field(description="drain-<drain id>-<seq>; sent to a webhook as Idempotency-Key")
    executor: str
    state: ExecutionState
    requested_by: str
    created_at: datetime
    started_at: datetime | None
    finished_at: datetime | None
    worker: str | None = Field(description="host:pid of the worker that claimed it")
    steps: list[dict[str, Any]] = Field(description="per command: argv, started_at, finished_at, rc, output tails")
    result: dict[str, Any] | None = Field(description="how it ended: ok, rc / HTTP status, error; null while running")


class BreakerRead(BaseModel):
    tripped: bool
    tripped_at: datetime | None
    trip_reason: str | None
    reset_at: datetime | None
    reset_by: str | None
    reset_note: str | None
    window_s: float
    limit: int
    recommended_in_window: int
