"""Incident tables: the incident itself and its append-only timeline (migration 0030)."""

from __future__ import annotations

from datetime import datetime
from typing import Any

from sqlalchemy import BigInteger, DateTime, ForeignKey, Index, Integer, String, Text, text
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base


class Incident(Base):
    __tablename__ = "incidents"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    entity_kind: Mapped[str] = mapped_column(String(16))          # link | port | host | switch
    entity: Mapped[str] = mapped_column(String(600))              # canonical key, see service.entity_key
    device: Mapped[str] = mapped_column(String(128))
    port: Mapped[str | None] = mapped_column(String(128))
    peer_device: Mapped[str | None] = mapped_column(String(128))
    peer_port: Mapped[str | None] = mapped_column(String(128))
    link_id: Mapped[int | None] = mapped_column(ForeignKey("links.id", ondelete="SET NULL"))
    pod: Mapped[str | None] = mapped_column(String(128))
    state: Mapped[str] = mapped_column(String(32))
    cause: Mapped[str | None] = mapped_column(String(64))
    part_number: Mapped[str | None] = mapped_column(String(128))
    owner: Mapped[str | None] = mapped_column(String(128))
    alert_id: Mapped[int | None] = mapped_column(Integer)         # no FK: alerts live on another branch
    fingerprint: Mapped[str | None] = mapped_column(String(600))
    summary: Mapped[str | None] = mapped_column(Text)
    fault_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))   # data time of the first evidence
    opened_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    state_since: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    closed_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    repair_action: Mapped[str | None] = mapped_column(String(32))
    part_bad: Mapped[str | None] = mapped_column(String(8))
    outcome_note: Mapped[str | None] = mapped_column(Text)
    outcome_by: Mapped[str | None] = mapped_column(String(128))
    outcome_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        # one open incident per entity: the pipeline updates it instead of opening duplicates
        Index("incidents_open_entity", "entity", unique=True,
              postgresql_where=text("state IN ('suspect', 'drain_recommended', 'drained', 'in_repair', 'verifying')")),
        Index("incidents_state", "state"),
        Index("incidents_device", "device"),
    )


class IncidentEvent(Base):
    """One timeline entry: a transition, note, owner change, outcome or drain event; never updated."""

    __tablename__ = "incident_events"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    incident_id: Mapped[int] = mapped_column(ForeignKey("incidents.id", ondelete="CASCADE"))
    ts: Mapped[datetime] = mapped_column(DateTime(timezone=True))
    actor: Mapped[str] = mapped_column(String(128))
    kind: Mapped[str] = mapped_column(String(32))
    from_state: Mapped[str | None] = mapped_column(String(32))
    to_state: Mapped[str | None] = mapped_column(String(32))
    text: Mapped[str | None] = mapped_column(Text)
    data: Mapped[dict[str, Any]] = mapped_column(JSONB, default=dict)
    __table_args__ = (Index("incident_events_incident", "incident_id", "id"),)
