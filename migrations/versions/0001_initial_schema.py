"""initial schema

Revision ID: 0001
Revises:
Create Date: 2026-11-30 14:14:25.549711
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0001'
down_revision: str | None = None
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.create_table('devices',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('kind', sa.String(length=16), nullable=False),
    sa.Column('role', sa.String(length=16), nullable=False),
    sa.Column('pod', sa.String(length=128), nullable=True),
    sa.Column('rack', sa.String(length=128), nullable=True),
    sa.Column('vendor', sa.String(length=128), nullable=True),
    sa.Column('model', sa.String(length=128), nullable=True),
    sa.Column('mgmt_address', sa.String(length=256), nullable=True),
    sa.Column('gpus', sa.Integer(), nullable=False),
    sa.Column('updated_at', sa.DateTime(timezone=True), server_default=sa.text('now()'), nullable=False),
    sa.CheckConstraint("kind in ('switch', 'host')", name='device_kind'),
    sa.CheckConstraint("role in ('leaf', 'spine', 'core', 'host')", name='device_role'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_index(op.f('ix_devices_pod'), 'devices', ['pod'], unique=False)
    op.create_index(op.f('ix_devices_role'), 'devices', ['role'], unique=False)
    op.create_table('pods',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('description', sa.String(length=1024), nullable=True),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('name')
    )
    op.create_table('samples',
    sa.Column('series_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('value', sa.Float(precision=53), nullable=False),
    sa.PrimaryKeyConstraint('series_id', 'ts', name='samples_pkey'),
    postgresql_partition_by='RANGE (ts)'
    )
    op.create_table('endpoints',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('protocol', sa.String(length=16), nullable=False),
    sa.Column('address', sa.String(length=256), nullable=False),
    sa.Column('port', sa.Integer(), nullable=True),
    sa.Column('config', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('device_id', 'protocol', name='endpoint_device_protocol')
    )
    op.create_table('ports',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('name', sa.String(length=128), nullable=False),
    sa.Column('speed_gbps', sa.Float(), nullable=True),
    sa.Column('rail', sa.Integer(), nullable=True),
    sa.Column('gpu', sa.Integer(), nullable=True),
    sa.Column('nic', sa.String(length=64), nullable=True),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('device_id', 'name', name='port_device_name')
    )
    op.create_table('link_events',
    sa.Column('id', sa.BigInteger(), nullable=False),
    sa.Column('port_id', sa.Integer(), nullable=False),
    sa.Column('ts', sa.DateTime(timezone=True), nullable=False),
    sa.Column('state', sa.String(length=8), nullable=False),
    sa.Column('source', sa.String(length=32), nullable=False),
    sa.ForeignKeyConstraint(['port_id'], ['ports.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('port_id', 'ts', 'state', name='link_event_once')
    )
    op.create_index('link_events_ts', 'link_events', ['ts'], unique=False)
    op.create_table('links',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('a_port_id', sa.Integer(), nullable=False),
    sa.Column('b_port_id', sa.Integer(), nullable=False),
    sa.Column('cable_type', sa.String(length=16), nullable=False),
    sa.Column('length_m', sa.Float(), nullable=True),
    sa.CheckConstraint('a_port_id <> b_port_id', name='link_distinct_ends'),
    sa.ForeignKeyConstraint(['a_port_id'], ['ports.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['b_port_id'], ['ports.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('a_port_id'),
    sa.UniqueConstraint('b_port_id')
    )
    op.create_table('optics',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('port_id', sa.Integer(), nullable=False),
    sa.Column('vendor', sa.String(length=128), nullable=True),
    sa.Column('part_number', sa.String(length=128), nullable=True),
    sa.Column('serial', sa.String(length=128), nullable=True),
    sa.Column('type', sa.String(length=64), nullable=True),
    sa.Column('form_factor', sa.String(length=32), nullable=True),
    sa.Column('lanes', sa.Integer(), nullable=False),
    sa.Column('thresholds', postgresql.JSONB(astext_type=sa.Text()), nullable=False),
    sa.ForeignKeyConstraint(['port_id'], ['ports.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('port_id')
    )
    op.create_index(op.f('ix_optics_part_number'), 'optics', ['part_number'], unique=False)
    op.create_table('series',
    sa.Column('id', sa.Integer(), nullable=False),
    sa.Column('metric', sa.String(length=96), nullable=False),
    sa.Column('device_id', sa.Integer(), nullable=False),
    sa.Column('port_id', sa.Integer(), nullable=True),
    sa.Column('lane', sa.SmallInteger(), nullable=True),
    sa.Column('priority', sa.SmallInteger(), nullable=True),
    sa.Column('gpu', sa.SmallInteger(), nullable=True),
    sa.Column('counter_bits', sa.SmallInteger(), nullable=True),
    sa.Column('saturating', sa.Boolean(), nullable=False),
    sa.ForeignKeyConstraint(['device_id'], ['devices.id'], ondelete='CASCADE'),
    sa.ForeignKeyConstraint(['port_id'], ['ports.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('id'),
    sa.UniqueConstraint('metric', 'device_id', 'port_id', 'lane', 'priority', 'gpu', name='series_identity', postgresql_nulls_not_distinct=True)
    )
    op.create_index('series_device_metric', 'series', ['device_id', 'metric'], unique=False)
    op.create_table('target_status',
    sa.Column('endpoint_id', sa.Integer(), nullable=False),
    sa.Column('last_attempt', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_success', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_error', sa.Text(), nullable=True),
    sa.Column('last_error_at', sa.DateTime(timezone=True), nullable=True),
    sa.Column('last_warnings', sa.Text(), nullable=True),
    sa.Column('duration_s', sa.Float(), nullable=True),
    sa.Column('samples', sa.Integer(), nullable=False),
    sa.Column('consecutive_failures', sa.Integer(), nullable=False),
    sa.ForeignKeyConstraint(['endpoint_id'], ['endpoints.id'], ondelete='CASCADE'),
    sa.PrimaryKeyConstraint('endpoint_id')
    )


def downgrade() -> None:
    op.drop_table('target_status')
    op.drop_index('series_device_metric', table_name='series')
    op.drop_table('series')
    op.drop_index(op.f('ix_optics_part_number'), table_name='optics')
    op.drop_table('optics')
    op.drop_table('links')
    op.drop_index('link_events_ts', table_name='link_events')
    op.drop_table('link_events')
    op.drop_table('ports')
    op.drop_table('endpoints')
    op.drop_table('samples')
    op.drop_table('pods')
    op.drop_index(op.f('ix_devices_role'), table_name='devices')
    op.drop_index(op.f('ix_devices_pod'), table_name='devices')
    op.drop_table('devices')
