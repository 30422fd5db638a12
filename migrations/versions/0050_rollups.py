"""rollups: 5-minute and 1-hour summaries per series, and their watermarks

Revision ID: 0050
Revises: 0003
Create Date: 2026-12-04 09:00:00

Hand-written. Both rollup tables are range-partitioned on `bucket`; partitions are created on
demand by service.telemetry.rollups and dropped after their own retention.
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = '0050'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def _rollup(name: str) -> None:
    op.create_table(
        name,
        sa.Column('series_id', sa.Integer(), nullable=False),
        sa.Column('bucket', _TS, nullable=False),
        sa.Column('n', sa.Integer(), nullable=False),
        sa.Column('min', sa.Float(53), nullable=False),
        sa.Column('max', sa.Float(53), nullable=False),
        sa.Column('avg', sa.Float(53), nullable=False),
        sa.Column('last', sa.Float(53), nullable=False),
        sa.Column('first_ts', _TS, nullable=False),
        sa.Column('last_ts', _TS, nullable=False),
        sa.Column('increase', sa.Float(53), nullable=True),
        sa.Column('covered_s', sa.Float(53), nullable=True),
        sa.PrimaryKeyConstraint('series_id', 'bucket', name=f'{name}_pkey'),
        postgresql_partition_by='RANGE (bucket)',
    )


def upgrade() -> None:
    _rollup('rollup_5m')
    _rollup('rollup_1h')
    op.create_table(
        'rollup_watermarks',
        sa.Column('level', sa.String(8), primary_key=True),
        sa.Column('done_until', _TS, nullable=False),
        sa.Column('updated_at', _TS, server_default=sa.text('now()'), nullable=False),
    )


def downgrade() -> None:
    op.drop_table('rollup_watermarks')
    op.drop_table('rollup_1h')
    op.drop_table('rollup_5m')
