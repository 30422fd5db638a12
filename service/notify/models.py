"""Notification tables: webhook subscriptions, the transactional outbox and the per-attempt delivery log."""

from __future__ import annotations

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
    String,
    Text,
    UniqueConstraint,
    func,
    text,
)
from sqlalchemy.dialects.postgresql import JSONB
from sqlalchemy.orm import Mapped, mapped_column

from service.db import Base

FORMATS = ("generic", "alertmanager", "pagerduty", "slack")
OUTBOX_STATES = ("pending", "delivered", "dead")


class WebhookSubscription(Base):
    """A receiver. `secret` and `routing_key` are write-only: stored sealed (notify/sealing.py), never returned."""

    __tablename__ = "webhook_subscriptions"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    url: Mapped[str] = mapped_column(Text)
    format: Mapped[str] = mapped_column(String(16))
    secret: Mapped[str | None] = mapped_column(Text)
    routing_key: Mapped[str | None] = mapped_column(Text)
    filters: Mapped[dict[str, list[str]]] = mapped_column(JSONB, default=dict)
    send_resolved: Mapped[bool] = mapped_column(Boolean, default=True)
    enabled: Mapped[bool] = mapped_column(Boolean, default=True)
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    __table_args__ = (CheckConstraint("format in ('generic', 'alertmanager', 'pagerduty', 'slack')",
                                      name="webhook_format"),)


class OutboxMessage(Base):
    """One notification for one subscription, written in the transaction of the alert change.

    `message` is a format-neutral snapshot (the change and the alert as it was); the body is
    rendered per format at send time, deterministically, so every retry sends the same bytes.
    """

    __tablename__ = "webhook_outbox"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    subscription_id: Mapped[int] = mapped_column(ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"))
    alert_id: Mapped[int | None] = mapped_column(ForeignKey("alerts.id", ondelete="SET NULL"))
    event_id: Mapped[int | None] = mapped_column(ForeignKey("alert_events.id", ondelete="SET NULL"))
    event: Mapped[str] = mapped_column(String(32))
    idempotency_key: Mapped[str] = mapped_column(String(200))
    message: Mapped[dict[str, Any]] = mapped_column(JSONB)
    status: Mapped[str] = mapped_column(String(16), default="pending")
    attempts: Mapped[int] = mapped_column(Integer, default=0)
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    # Set while a worker sends the row (claimed, POST in flight); a dead worker's lease runs out.
    leased_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    delivered_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    __table_args__ = (
        CheckConstraint("status in ('pending', 'delivered', 'dead')", name="outbox_status"),
        UniqueConstraint("subscription_id", "idempotency_key", name="outbox_subscription_key"),
        Index("webhook_outbox_due", "next_attempt_at", "id", postgresql_where=text("status = 'pending'")),
        Index("webhook_outbox_alert", "subscription_id", "alert_id", "id"),
        Index("webhook_outbox_leased", "subscription_id", postgresql_where=text("leased_until IS NOT NULL")),
    )


class WebhookDelivery(Base):
    """One delivery attempt: what the receiver answered, or why nothing was sent."""

    __tablename__ = "webhook_deliveries"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    outbox_id: Mapped[int] = mapped_column(ForeignKey("webhook_outbox.id", ondelete="CASCADE"))
    subscription_id: Mapped[int] = mapped_column(ForeignKey("webhook_subscriptions.id", ondelete="CASCADE"))
    attempt: Mapped[int] = mapped_column(Integer)
    outcome: Mapped[str] = mapped_column(String(16))  # delivered | retry | dead
    status_code: Mapped[int | None] = mapped_column(Integer)
    error: Mapped[str | None] = mapped_column(Text)
    duration_ms: Mapped[float] = mapped_column(Float)
    at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.clock_timestamp())
    __table_args__ = (Index("webhook_deliveries_subscription", "subscription_id", "id"),
                      Index("webhook_deliveries_outbox", "outbox_id"))


class AlertmanagerDestination(Base):
    """An Alertmanager that fabricwatch pushes its alerts to (POST /api/v2/alerts), as Prometheus does.

    The delivery state is kept here: when the last POST went out, what it got, and when to try again
    after a failure (the backoff is the destination's: it is the Alertmanager that is down, not an alert).
    """

    __tablename__ = "alertmanager_destinations"
    id: Mapped[int] = mapped_column(Integer, primary_key=True)
    name: Mapped[str] = mapped_column(String(128), unique=True)
    url: Mapped[str] = mapped_column(Text)   # base URL (with a route prefix if any); /api/v2/alerts is appended
    filters: Mapped[dict[str, list[str]]] = mapped_column(JSONB, server_default=text("'{}'::jsonb"))
    enabled: Mapped[bool] = mapped_column(Boolean, server_default=text("true"))
    created_by: Mapped[str] = mapped_column(String(128))
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    updated_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    retry_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))   # backoff after a failed POST
    failures: Mapped[int] = mapped_column(Integer, server_default=text("0"))   # failed POSTs in a row
    last_attempt_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_success_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    last_status_code: Mapped[int | None] = mapped_column(Integer)
    last_error: Mapped[str | None] = mapped_column(Text)
    auth_kind: Mapped[str | None] = mapped_column(String(16))    # basic | bearer
    credential: Mapped[str | None] = mapped_column(Text)   # the Authorization header's value, sealed; write-only
    __table_args__ = (CheckConstraint("auth_kind in ('basic', 'bearer')", name="am_auth_kind"),)


class AlertmanagerAlert(Base):
    """The Alertmanager outbox: per destination, the state of one alert that Alertmanager must have.

    Written in the transaction of the alert change (firing, acknowledged, resolved), so it exists if and only if
    the change committed. It holds the state, not the history: a destination that was down gets the current
    state of every alert when it is back (Alertmanager is level-triggered). `version` moves with every change;
    a POST that carried an older version leaves the row due. A firing row is due again every resend interval
    (`next_attempt_at`); a delivered resolve is never due again ('infinity')."""

    __tablename__ = "alertmanager_outbox"
    id: Mapped[int] = mapped_column(BigInteger, primary_key=True)
    destination_id: Mapped[int] = mapped_column(ForeignKey("alertmanager_destinations.id", ondelete="CASCADE"))
    alert_id: Mapped[int] = mapped_column(BigInteger, ForeignKey("alerts.id", ondelete="CASCADE"))
    status: Mapped[str] = mapped_column(String(16))                 # firing | resolved
    starts_at_ms: Mapped[int] = mapped_column(BigInteger)           # the episode's opening (data time)
    ends_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))   # wall time of the resolve
    version: Mapped[int] = mapped_column(Integer, server_default=text("1"))
    sent_version: Mapped[int] = mapped_column(Integer, server_default=text("0"))
    sent_labels: Mapped[dict[str, str] | None] = mapped_column(JSONB)   # the label set Alertmanager holds
    sent_at: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    next_attempt_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    leased_until: Mapped[datetime | None] = mapped_column(DateTime(timezone=True))
    claims: Mapped[int] = mapped_column(Integer, server_default=text("0"))   # the lease's token
    created_at: Mapped[datetime] = mapped_column(DateTime(timezone=True), server_default=func.now())
    __table_args__ = (
        CheckConstraint("status in ('firing', 'resolved')", name="am_outbox_status"),
        UniqueConstraint("destination_id", "alert_id", name="am_outbox_destination_alert"),
        Index("alertmanager_outbox_due", "destination_id", "next_attempt_at"),
        Index("alertmanager_outbox_alert", "alert_id"),
    )
