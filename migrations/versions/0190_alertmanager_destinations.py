"""alertmanager_destinations and alertmanager_outbox: fabricwatch pushes its alerts to Alertmanagers

A destination is an Alertmanager (base URL, filters, enabled) with its delivery state (backoff, last
attempt and answer). The outbox holds, per destination and alert, the state that Alertmanager must have
(firing or resolved, since when, the label set it holds), written in the alert change's transaction and
POSTed to /api/v2/alerts: re-sent while firing, once at resolve (service/notify/alertmanager.py).

Revision ID: 0190
Revises: 0180
Create Date: 2026-12-01 16:10:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0190"
down_revision: str | tuple[str, ...] | None = "0180"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table(
        "alertmanager_destinations",
        sa.Column("id", sa.Integer, primary_key=True),
        sa.Column("name", sa.String(128), nullable=False, unique=True),
        sa.Column("url", sa.Text, nullable=False),
        sa.Column("filters", JSONB, server_default=sa.text("'{}'::jsonb"), nullable=False),
        sa.Column("enabled", sa.Boolean, server_default=sa.text("true"), nullable=False),
        sa.Column("created_by", sa.String(128), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("updated_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("retry_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("failures", sa.Integer, server_default=sa.text("0"), nullable=False),
        sa.Column("last_attempt_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_success_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("last_status_code", sa.Integer, nullable=True),
        sa.Column("last_error", sa.Text, nullable=True),
    )
    op.create_table(
        "alertmanager_outbox",
        sa.Column("id", sa.BigInteger, primary_key=True),
        sa.Column("destination_id", sa.Integer,
                  sa.ForeignKey("alertmanager_destinations.id", ondelete="CASCADE"), nullable=False),
        sa.Column("alert_id", sa.BigInteger, sa.ForeignKey("alerts.id", ondelete="CASCADE"), nullable=False),
        sa.Column("status", sa.String(16), nullable=False),
        sa.Column("starts_at_ms", sa.BigInteger, nullable=False),
        sa.Column("ends_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("version", sa.Integer, server_default=sa.text("1"), nullable=False),
        sa.Column("sent_version", sa.Integer, server_default=sa.text("0"), nullable=False),
        sa.Column("sent_labels", JSONB, nullable=True),
        sa.Column("sent_at", sa.DateTime(timezone=True), nullable=True),
        sa.Column("next_attempt_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.Column("leased_until", sa.DateTime(timezone=True), nullable=True),
        sa.Column("claims", sa.Integer, server_default=sa.text("0"), nullable=False),
        sa.Column("created_at", sa.DateTime(timezone=True), server_default=sa.func.now(), nullable=False),
        sa.CheckConstraint("status in ('firing', 'resolved')", name="am_outbox_status"),
        sa.UniqueConstraint("destination_id", "alert_id", name="am_outbox_destination_alert"),
    )
    op.create_index("alertmanager_outbox_due", "alertmanager_outbox", ["destination_id", "next_attempt_at"])
    op.create_index("alertmanager_outbox_alert", "alertmanager_outbox", ["alert_id"])


def downgrade() -> None:
    op.drop_table("alertmanager_outbox")
    op.drop_table("alertmanager_destinations")
