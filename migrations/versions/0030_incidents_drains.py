"""incidents, incident timeline, drain recommendations and the drain circuit breaker

Revision ID: 0030
Revises: 0003
Create Date: 2026-12-02 10:00:00

Hand-written. `alert_id` is a plain integer (no foreign key): the alerts table lives on
another migration branch and may not exist when this one runs.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = '0030'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_OPEN = "state IN ('suspect', 'drain_recommended', 'drained', 'in_repair', 'verifying')"


def upgrade() -> None:
    op.create_table(
        'incidents',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('entity_kind', sa.String(16), nullable=False),
        sa.Column('entity', sa.String(600), nullable=False),
        sa.Column('device', sa.String(128), nullable=False),
        sa.Column('port', sa.String(128), nullable=True),
        sa.Column('peer_device', sa.String(128), nullable=True),
        sa.Column('peer_port', sa.String(128), nullable=True),
        sa.Column('link_id', sa.Integer(), sa.ForeignKey('links.id', ondelete='SET NULL'), nullable=True),
        sa.Column('pod', sa.String(128), nullable=True),
        sa.Column('state', sa.String(32), nullable=False),
        sa.Column('cause', sa.String(64), nullable=True),
        sa.Column('part_number', sa.String(128), nullable=True),
        sa.Column('owner', sa.String(128), nullable=True),
        sa.Column('alert_id', sa.Integer(), nullable=True),
        sa.Column('fingerprint', sa.String(600), nullable=True),
        sa.Column('summary', sa.Text(), nullable=True),
        sa.Column('fault_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('opened_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('state_since', sa.DateTime(timezone=True), nullable=False),
        sa.Column('closed_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('repair_action', sa.String(32), nullable=True),
        sa.Column('part_bad', sa.String(8), nullable=True),
        sa.Column('outcome_note', sa.Text(), nullable=True),
        sa.Column('outcome_by', sa.String(128), nullable=True),
        sa.Column('outcome_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("entity_kind IN ('link', 'port', 'host', 'switch')", name='incident_entity_kind'),
        sa.CheckConstraint("state IN ('suspect', 'drain_recommended', 'drained', 'in_repair', 'verifying', "
                           "'returned_to_service', 'closed', 'false_alarm')", name='incident_state'),
        sa.CheckConstraint("repair_action IS NULL OR repair_action IN ('cleaned', 'reseated', 'replaced_module', "
                           "'replaced_cable', 'none')", name='incident_repair_action'),
        sa.CheckConstraint("part_bad IS NULL OR part_bad IN ('yes', 'no', 'unknown')", name='incident_part_bad'),
    )
    # One open incident per entity: the pipeline updates it instead of opening duplicates.
    op.create_index('incidents_open_entity', 'incidents', ['entity'], unique=True,
                    postgresql_where=sa.text(_OPEN))
    op.create_index('incidents_state', 'incidents', ['state'])
    op.create_index('incidents_device', 'incidents', ['device'])

    op.create_table(
        'incident_events',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('incident_id', sa.Integer(), sa.ForeignKey('incidents.id', ondelete='CASCADE'), nullable=False),
        sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
        sa.Column('actor', sa.String(128), nullable=False),
        sa.Column('kind', sa.String(32), nullable=False),
        sa.Column('from_state', sa.String(32), nullable=True),
        sa.Column('to_state', sa.String(32), nullable=True),
        sa.Column('text', sa.Text(), nullable=True),
        sa.Column('data', JSONB(), nullable=False, server_default=sa.text("'{}'::jsonb")),
    )
    op.create_index('incident_events_incident', 'incident_events', ['incident_id', 'id'])

    op.create_table(
        'drain_recommendations',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('incident_id', sa.Integer(), sa.ForeignKey('incidents.id', ondelete='SET NULL'), nullable=True),
        sa.Column('target_kind', sa.String(16), nullable=False),
        sa.Column('target', sa.String(600), nullable=False),
        sa.Column('device', sa.String(128), nullable=False),
        sa.Column('port', sa.String(128), nullable=True),
        sa.Column('peer_device', sa.String(128), nullable=True),
        sa.Column('peer_port', sa.String(128), nullable=True),
        sa.Column('pod', sa.String(128), nullable=True),
        sa.Column('action', sa.String(32), nullable=False),
        sa.Column('status', sa.String(16), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False, server_default=''),
        sa.Column('cause', sa.String(64), nullable=True),
        sa.Column('link_ids', sa.ARRAY(sa.Integer()), nullable=False, server_default='{}'),
        sa.Column('host_ids', sa.ARRAY(sa.Integer()), nullable=False, server_default='{}'),
        sa.Column('verdict', JSONB(), nullable=False),
        sa.Column('commands', JSONB(), nullable=False, server_default=sa.text("'[]'::jsonb")),
        sa.Column('execution', JSONB(), nullable=True),
        sa.Column('created_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('updated_at', sa.DateTime(timezone=True), nullable=False),
        sa.Column('recommended_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('decided_by', sa.String(128), nullable=True),
        sa.Column('decided_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('decision_note', sa.Text(), nullable=True),
        sa.Column('done_by', sa.String(128), nullable=True),
        sa.Column('done_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('released_at', sa.DateTime(timezone=True), nullable=True),
        sa.CheckConstraint("target_kind IN ('link', 'port', 'host', 'switch')", name='drain_target_kind'),
        sa.CheckConstraint("action IN ('shut_ports', 'slurm_drain', 'k8s_drain')", name='drain_action'),
        sa.CheckConstraint("status IN ('blocked', 'pending', 'approved', 'rejected', 'done', 'released', "
                           "'withdrawn')", name='drain_status'),
    )
    op.create_index('drain_recommendations_status', 'drain_recommendations', ['status'])
    op.create_index('drain_recommendations_incident', 'drain_recommendations', ['incident_id'])
    op.create_index('drain_recommendations_recommended_at', 'drain_recommendations', ['recommended_at'])

    op.create_table(
        'drain_breaker',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('tripped', sa.Boolean(), nullable=False, server_default=sa.false()),
        sa.Column('tripped_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('trip_reason', sa.Text(), nullable=True),
        sa.Column('reset_at', sa.DateTime(timezone=True), nullable=True),
        sa.Column('reset_by', sa.String(128), nullable=True),
        sa.Column('reset_note', sa.Text(), nullable=True),
        sa.CheckConstraint('id = 1', name='drain_breaker_single_row'),
    )


def downgrade() -> None:
    op.drop_table('drain_breaker')
    op.drop_table('drain_recommendations')
    op.drop_table('incident_events')
    op.drop_table('incidents')
