"""alerts, alert history, silences, maintenance windows, webhook subscriptions, outbox and delivery log

Revision ID: 0020
Revises: 0003
Create Date: 2026-11-30 14:30:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0020'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'alerts',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('fingerprint', sa.String(512), nullable=False, unique=True),
        sa.Column('kind', sa.String(128), nullable=False),
        sa.Column('scope', sa.String(16), nullable=False),
        sa.Column('device', sa.String(128), nullable=False),
        sa.Column('port', sa.String(128)),
        sa.Column('lane', sa.SmallInteger()),
        sa.Column('peer_device', sa.String(128)),
        sa.Column('peer_port', sa.String(128)),
        sa.Column('pod', sa.String(128)),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('severity', sa.String(16), nullable=False),
        sa.Column('cause', sa.String(64), nullable=False),
        sa.Column('action', sa.String(64), nullable=False),
        sa.Column('end', sa.String(8)),
        sa.Column('summary', sa.Text(), nullable=False, server_default=''),
        sa.Column('score', sa.Float(), nullable=False, server_default='0'),
        sa.Column('ttt_hours', sa.Float()),
        sa.Column('evidence', postgresql.JSONB(), nullable=False, server_default='[]'),
        sa.Column('members', postgresql.JSONB(), nullable=False, server_default='[]'),
        sa.Column('finding_state', sa.String(16)),
        sa.Column('missed_cycles', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('parent_id', sa.BigInteger(), sa.ForeignKey('alerts.id', ondelete='SET NULL')),
        sa.Column('muted_by', sa.String(128)),
        sa.Column('notified', sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column('episode', sa.Integer(), nullable=False, server_default='1'),
        sa.Column('first_opened_at_ms', sa.BigInteger(), nullable=False),
        sa.Column('opened_at_ms', sa.BigInteger(), nullable=False),
        sa.Column('last_seen_ms', sa.BigInteger(), nullable=False),
        sa.Column('resolved_at_ms', sa.BigInteger()),
        sa.Column('resolved_by', sa.String(128)),
        sa.Column('acknowledged_at_ms', sa.BigInteger()),
        sa.Column('acknowledged_by', sa.String(128)),
        sa.Column('created_at', _TS, nullable=False, server_default=sa.text('clock_timestamp()')),
        sa.Column('updated_at', _TS, nullable=False, server_default=sa.text('clock_timestamp()')),
        sa.CheckConstraint("state in ('firing', 'acknowledged', 'resolved')", name='alert_state'),
    )
    op.create_index('alerts_created_id', 'alerts', ['created_at', 'id'])
    op.create_index('alerts_updated_id', 'alerts', ['updated_at', 'id'])
    op.create_index('alerts_state', 'alerts', ['state'])
    op.create_index('alerts_device', 'alerts', ['device'])
    op.create_index('alerts_parent', 'alerts', ['parent_id'])

    op.create_table(
        'alert_events',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('alert_id', sa.BigInteger(), sa.ForeignKey('alerts.id', ondelete='CASCADE'), nullable=False),
        sa.Column('at_ms', sa.BigInteger(), nullable=False),
        sa.Column('recorded_at', _TS, nullable=False, server_default=sa.text('clock_timestamp()')),
        sa.Column('actor', sa.String(128), nullable=False),
        sa.Column('event', sa.String(32), nullable=False),
        sa.Column('from_state', sa.String(16)),
        sa.Column('to_state', sa.String(16)),
        sa.Column('comment', sa.Text()),
        sa.Column('detail', postgresql.JSONB(), nullable=False, server_default='{}'),
    )
    op.create_index('alert_events_alert_id', 'alert_events', ['alert_id', 'id'])

    op.create_table(
        'silences',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('matchers', postgresql.JSONB(), nullable=False),
        sa.Column('starts_at', _TS, nullable=False),
        sa.Column('ends_at', _TS, nullable=False),
        sa.Column('created_by', sa.String(128), nullable=False),
        sa.Column('comment', sa.Text(), nullable=False, server_default=''),
        sa.Column('created_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('updated_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.CheckConstraint('ends_at > starts_at', name='silence_range'),
    )
    op.create_index('silences_ends_at', 'silences', ['ends_at'])

    op.create_table(
        'maintenance_windows',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('device', sa.String(128), nullable=False),
        sa.Column('port', sa.String(128)),
        sa.Column('starts_at', _TS, nullable=False),
        sa.Column('ends_at', _TS, nullable=False),
        sa.Column('created_by', sa.String(128), nullable=False),
        sa.Column('comment', sa.Text(), nullable=False, server_default=''),
        sa.Column('created_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('updated_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.CheckConstraint('ends_at > starts_at', name='maintenance_range'),
    )
    op.create_index('ix_maintenance_windows_device', 'maintenance_windows', ['device'])

    op.create_table(
        'webhook_subscriptions',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('name', sa.String(128), nullable=False, unique=True),
        sa.Column('url', sa.Text(), nullable=False),
        sa.Column('format', sa.String(16), nullable=False),
        sa.Column('secret', sa.Text()),
        sa.Column('routing_key', sa.Text()),
        sa.Column('filters', postgresql.JSONB(), nullable=False, server_default='{}'),
        sa.Column('send_resolved', sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column('enabled', sa.Boolean(), nullable=False, server_default=sa.true()),
        sa.Column('created_by', sa.String(128), nullable=False),
        sa.Column('created_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('updated_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.CheckConstraint("format in ('generic', 'alertmanager', 'pagerduty', 'slack')", name='webhook_format'),
    )

    op.create_table(
        'webhook_outbox',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('subscription_id', sa.Integer(),
                  sa.ForeignKey('webhook_subscriptions.id', ondelete='CASCADE'), nullable=False),
        sa.Column('alert_id', sa.BigInteger(), sa.ForeignKey('alerts.id', ondelete='SET NULL')),
        sa.Column('event_id', sa.BigInteger(), sa.ForeignKey('alert_events.id', ondelete='SET NULL')),
        sa.Column('event', sa.String(32), nullable=False),
        sa.Column('idempotency_key', sa.String(200), nullable=False),
        sa.Column('message', postgresql.JSONB(), nullable=False),
        sa.Column('status', sa.String(16), nullable=False, server_default='pending'),
        sa.Column('attempts', sa.Integer(), nullable=False, server_default='0'),
        sa.Column('next_attempt_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('last_status_code', sa.Integer()),
        sa.Column('last_error', sa.Text()),
        sa.Column('created_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('delivered_at', _TS),
        sa.CheckConstraint("status in ('pending', 'delivered', 'dead')", name='outbox_status'),
        sa.UniqueConstraint('subscription_id', 'idempotency_key', name='outbox_subscription_key'),
    )
    op.create_index('webhook_outbox_due', 'webhook_outbox', ['next_attempt_at', 'id'],
                    postgresql_where=sa.text("status = 'pending'"))
    op.create_index('webhook_outbox_alert', 'webhook_outbox', ['subscription_id', 'alert_id', 'id'])

    op.create_table(
        'webhook_deliveries',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('outbox_id', sa.BigInteger(), sa.ForeignKey('webhook_outbox.id', ondelete='CASCADE'),
                  nullable=False),
        sa.Column('subscription_id', sa.Integer(),
                  sa.ForeignKey('webhook_subscriptions.id', ondelete='CASCADE'), nullable=False),
        sa.Column('attempt', sa.Integer(), nullable=False),
        sa.Column('outcome', sa.String(16), nullable=False),
        sa.Column('status_code', sa.Integer()),
        sa.Column('error', sa.Text()),
        sa.Column('duration_ms', sa.Float(), nullable=False),
        sa.Column('at', _TS, nullable=False, server_default=sa.text('clock_timestamp()')),
    )
    op.create_index('webhook_deliveries_subscription', 'webhook_deliveries', ['subscription_id', 'id'])
    op.create_index('webhook_deliveries_outbox', 'webhook_deliveries', ['outbox_id'])


def downgrade() -> None:
    for table in ('webhook_deliveries', 'webhook_outbox', 'webhook_subscriptions', 'maintenance_windows',
                  'silences', 'alert_events', 'alerts'):
        op.drop_table(table)
