"""Drain tables: recommendations (with their safety verdict) and the fleet-wide circuit breaker."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import ARRAY, BigInteger, Boolean, CheckConstraint, DateTime, ForeignKey, Index, Integer, String, Text
from sqlalchemy import text as sql
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class DrainRecommendation(Base):
    __tablename__ = "drain_recommendations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    incident_id: Mapped[int | None] = mapped_column(ForeignKey("incidents.id", ondelete="SET NULL"))
    # the alert whose finding recommended it (the latest one); its resolve withdraws an undecided drain.
    # No foreign key, as incidents.alert_id: an id the alerts table does not hold just shows no alert state
    alert_id: Mapped[int | None] = mapped_column(BigInteger)
    target_kind: Mapped[str] = mapped_column(String(16))     # link | port | host | switch
    target: Mapped[str] = mapped_column(String(600))         # the entity key, as on the incident
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str | None] = mapped_column(String(128))
    peer_device: Mapped[str | None] = mapped_column(String(128))
    peer_port: Mapped[str | None] = mapped_column(String(128))
    pod: Mapped[str | None] = mapped_column(String(128))
    action: Mapped[str] = mapped_column(String(32))          # shut_ports | slurm_drain | k8s_drain
    # blocked -> (re-evaluated) pending -> approved -> done -> released; or rejected / withdrawn (the incident
    # closed, or the alert resolved, before a decision: decided_at / decision_note say when and why); an
    # executed drain may end approved -> execution_failed / execution_unknown until a person decides
    status: Mapped[str] = mapped_column(String(32))
    reason: Mapped[str] = mapped_column(Text, default="")
    cause: Mapped[str | None] = mapped_column(String(64))
    link_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer), default=list)   # links the action takes down
    host_ids: Mapped[list[int]] = mapped_column(ARRAY(Integer), default=list)   # hosts it drains
    verdict: Mapped[dict[str, Any]] = mapped_column(JSONB)
    commands: Mapped[list[Any]] = mapped_column(JSONB, default=list)
    execution: Mapped[dict[str, Any] | None] = mapped_column(JSONB)   # the latest drain_executions row, summed up
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    recommended_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))  # first safe verdict
    decided_by: Mapped[str | None] = mapped_column(String(128))
    decided_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    decision_note: Mapped[str | None] = mapped_column(Text)
    done_by: Mapped[str | None] = mapped_column(String(128))
    done_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    released_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (Index("drain_recommendations_alert", "alert_id"),
                      Index("drain_recommendations_status", "status"),
                      Index("drain_recommendations_incident", "incident_id"),
                      Index("drain_recommendations_recommended_at", "recommended_at"))


class DrainExecution(Base):
    """The drain-execution outbox: one row per attempt, written in the approving transaction, run once by a
    worker outside any transaction (service/drains/execution.py). Never re-run on its own."""

    __tablename__ = "drain_executions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)   # int4: the second key of its advisory lock
    drain_id: Mapped[int] = mapped_column(ForeignKey("drain_recommendations.id", ondelete="CASCADE"))
    seq: Mapped[int] = mapped_column(Integer)
    idempotency_key: Mapped[str] = mapped_column(String(64), unique=True)
    executor: Mapped[str] = mapped_column(String(16))
    state: Mapped[str] = mapped_column(String(16))   # queued -> running -> succeeded / failed / unknown; or cancelled
    request: Mapped[dict[str, Any]] = mapped_column(JSONB)   # the drain as approved: what runs
    requested_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    started_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    finished_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    worker: Mapped[str | None] = mapped_column(String(256))
    steps: Mapped[list[Any]] = mapped_column(JSONB, default=list, server_default="[]")
    result: Mapped[dict[str, Any] | None] = mapped_column(JSONB)
    __table_args__ = (
        CheckConstraint("state in ('queued', 'running', 'succeeded', 'failed', 'unknown', 'cancelled')",
                        name="drain_execution_state"),
        # at most one live execution per drain: a double approval or retry cannot queue a second run
        Index("drain_executions_live", "drain_id", unique=True, postgresql_where=sql("state IN ('queued', 'running')")),
        Index("drain_executions_drain", "drain_id", "seq", unique=True),
        Index("drain_executions_due", "id", postgresql_where=sql("state IN ('queued', 'running')")),
    )


class DrainBreaker(Base):
    """The single-row circuit breaker (id = 1); tripped stays tripped until an attributed reset."""

    __tablename__ = "drain_breaker"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    tripped: Mapped[bool] = mapped_column(Boolean, default=False)
    tripped_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    trip_reason: Mapped[str | None] = mapped_column(Text)
    reset_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    reset_by: Mapped[str | None] = mapped_column(String(128))
    reset_note: Mapped[str | None] = mapped_column(Text)
