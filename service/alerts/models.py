"""Alert tables: one row per fingerprint, its timestamped history, silences and maintenance windows."""

from __future__ import annotations

import uuid
from datetime import datetime
from typing import Any

from sqlalchemy import (
    BigInteger,
    Boolean,
    CheckConstraint,
    DateTime,
    Float,
    ForeignKey,
    Index,
    Integer,
    SmallInteger,
    String,
    Text,
    Uuid,
    func,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base

ALERT_STATES = ("firing", "acknowledged", "resolved")


class Alert(Base):
    """An alert: the current state of one fingerprint (kind + entity). Re-opening reuses the row;
    every episode stays in alert_events."""

    __tablename__ = "alerts"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    fingerprint: Mapped[str] = mapped_column(String(512), unique=True)
    kind: Mapped[str] = mapped_column(String(128))
    scope: Mapped[str] = mapped_column(String(16))
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str | None] = mapped_column(String(128))
    lane: Mapped[int | None] = mapped_column(SmallInteger)
    peer_device: Mapped[str | None] = mapped_column(String(128))
    peer_port: Mapped[str | None] = mapped_column(String(128))
    pod: Mapped[str | None] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(16))
    severity: Mapped[str] = mapped_column(String(16))
    cause: Mapped[str] = mapped_column(String(64))
    action: Mapped[str] = mapped_column(String(64))
    end: Mapped[str | None] = mapped_column(String(8))
    summary: Mapped[str] = mapped_column(Text, default="")
    score: Mapped[float] = mapped_column(Float, default=0.0)
    ttt_hours: Mapped[float | None] = mapped_column(Float)
    evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list)   # the last cycle's
    # the worst cycle of this episode (highest score): its evidence, when it was seen; `summary` is its summary
    peak_score: Mapped[float] = mapped_column(Float, default=0.0, server_default="0")
    peak_evidence: Mapped[list[dict[str, Any]]] = mapped_column(JSONB, default=list, server_default="[]")
    peak_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    members: Mapped[list[str]] = mapped_column(JSONB, default=list)
    finding_state: Mapped[str | None] = mapped_column(String(16))   # last cycle's firing/holding; None when absent
    missed_cycles: Mapped[int] = mapped_column(Integer, default=0)
    parent_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="SET NULL"))
    muted_by: Mapped[str | None] = mapped_column(String(128))
    notified: Mapped[bool] = mapped_column(Boolean, default=False)  # this episode's trigger went to the outbox
    episode: Mapped[int] = mapped_column(Integer, default=1)
    first_opened_at_ms: Mapped[int] = mapped_column(BigInteger)
    opened_at_ms: Mapped[int] = mapped_column(BigInteger)
    last_seen_ms: Mapped[int] = mapped_column(BigInteger)
    resolved_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    resolved_by: Mapped[str | None] = mapped_column(String(128))
    acknowledged_at_ms: Mapped[int | None] = mapped_column(BigInteger)
    acknowledged_by: Mapped[str | None] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.clock_timestamp())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.clock_timestamp())
    __table_args__ = (
        CheckConstraint("state in ('firing', 'acknowledged', 'resolved')", name="alert_state"),
        Index("alerts_created_id", "created_at", "id"),
        Index("alerts_updated_id", "updated_at", "id"),
        Index("alerts_state", "state"),
        Index("alerts_device", "device"),
        Index("alerts_parent", "parent_id"),
    )


class AlertsVersion(Base):
    """One row: moved by a trigger (migration 0210) in every transaction that writes alerts, at its commit.
    The alert list's ETag validator (service/alerts/listcache.py); `epoch` is new whenever the row is."""

    __tablename__ = "alerts_version"
    id: Mapped[int] = mapped_column(SmallInteger, primary_key=True)
    epoch: Mapped[uuid.UUID] = mapped_column(Uuid, server_default=func.gen_random_uuid())
    n: Mapped[int] = mapped_column(BigInteger, server_default="0")
    __table_args__ = (CheckConstraint("id = 1", name="alerts_version_one_row"),)


class AlertEvent(Base):
    """One change of an alert, in data time (at_ms) and attributed (actor)."""

    __tablename__ = "alert_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    alert_id: Mapped[int] = mapped_column(ForeignKey("alerts.id", ondelete="CASCADE"))
    at_ms: Mapped[int] = mapped_column(BigInteger)
    recorded_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.clock_timestamp())
    actor: Mapped[str] = mapped_column(String(128))
    event: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(16))
    to_state: Mapped[str | None] = mapped_column(String(16))
    comment: Mapped[str | None] = mapped_column(Text)
    detail: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    __table_args__ = (Index("alert_events_alert_id", "alert_id", "id"),)


class Silence(Base):
    """Mutes notifications for alerts whose labels match every matcher, between starts_at and ends_at."""

    __tablename__ = "silences"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    matchers: Mapped[list[dict[str, Any]]] = mapped_column(JSONB)
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    __table_args__ = (CheckConstraint("ends_at > starts_at", name="silence_range"),
                      Index("silences_ends_at", "ends_at"))


class MaintenanceWindow(Base):
    """A device (or one port) under repair: its alerts are recorded but do not notify."""

    __tablename__ = "maintenance_windows"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    device: Mapped[str] = mapped_column(String(128), index=True)
    port: Mapped[str | None] = mapped_column(String(128))
    starts_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    ends_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    created_by: Mapped[str] = mapped_column(String(128))
    comment: Mapped[str] = mapped_column(Text, default="")
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    __table_args__ = (CheckConstraint("ends_at > starts_at", name="maintenance_range"),)
