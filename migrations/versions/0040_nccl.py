"""nccl-tests runs, their per-size results and the baseline per (test, scope)

Revision ID: 0040
Revises: 0003
Create Date: 2026-12-03 09:00:00

Hand-written. `alert_id` is a plain integer (no foreign key): the alerts table lives on
another migration branch and may not exist when this one runs.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = '0040'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'nccl_runs',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('digest', sa.String(64), nullable=False, unique=True),
        sa.Column('test', sa.String(64), nullable=False),
        sa.Column('scope', sa.String(64), nullable=False),
        sa.Column('nodes', sa.Integer(), nullable=False),
        sa.Column('gpus', sa.Integer(), nullable=False),
        sa.Column('hosts', JSONB(), nullable=False, server_default='[]'),
        sa.Column('gpu_model', sa.String(128)),
        sa.Column('job', sa.String(256)),
        sa.Column('nccl_version', sa.String(64)),
        sa.Column('tests_version', sa.String(64)),
        sa.Column('env', JSONB(), nullable=False, server_default='{}'),
        sa.Column('header', JSONB(), nullable=False, server_default='{}'),
        sa.Column('warnings', JSONB(), nullable=False, server_default='[]'),
        sa.Column('avg_busbw', sa.Float()),
        sa.Column('wrong_total', sa.BigInteger(), nullable=False, server_default='0'),
        sa.Column('oob_status', sa.String(16)),
        sa.Column('source', sa.String(512), nullable=False),
        sa.Column('run_at', _TS, nullable=False),
        sa.Column('imported_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('imported_by', sa.String(128), nullable=False),
        sa.Column('verdict', JSONB(), nullable=False, server_default='{}'),
        sa.Column('alert_id', sa.BigInteger()),
        sa.Column('linked_alert_ids', JSONB(), nullable=False, server_default='[]'),
    )
    op.create_index('nccl_runs_test_scope_at', 'nccl_runs', ['test', 'scope', 'run_at'])
    op.create_table(
        'nccl_results',
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('nccl_runs.id', ondelete='CASCADE'), primary_key=True),
        sa.Column('size_bytes', sa.BigInteger(), primary_key=True),
        sa.Column('count', sa.BigInteger(), nullable=False),
        sa.Column('dtype', sa.String(16), nullable=False),
        sa.Column('redop', sa.String(16), nullable=False),
        sa.Column('root', sa.Integer()),
        sa.Column('oop_time_us', sa.Float(), nullable=False),
        sa.Column('oop_algbw', sa.Float(), nullable=False),
        sa.Column('oop_busbw', sa.Float(), nullable=False),
        sa.Column('oop_wrong', sa.BigInteger()),
        sa.Column('ip_time_us', sa.Float(), nullable=False),
        sa.Column('ip_algbw', sa.Float(), nullable=False),
        sa.Column('ip_busbw', sa.Float(), nullable=False),
        sa.Column('ip_wrong', sa.BigInteger()),
    )
    op.create_table(
        'nccl_baselines',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('test', sa.String(64), nullable=False),
        sa.Column('scope', sa.String(64), nullable=False),
        sa.Column('run_id', sa.Integer(), sa.ForeignKey('nccl_runs.id', ondelete='CASCADE'), nullable=False),
        sa.Column('set_at', _TS, nullable=False, server_default=sa.text('now()')),
        sa.Column('set_by', sa.String(128), nullable=False),
        sa.Column('reason', sa.Text(), nullable=False, server_default=''),
        sa.UniqueConstraint('test', 'scope', name='nccl_baseline_test_scope'),
    )


def downgrade() -> None:
    for table in ('nccl_baselines', 'nccl_results', 'nccl_runs'):
        op.drop_table(table)
