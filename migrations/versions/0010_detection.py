"""detection: detector state, versioned cohort models, findings; BRIN index on samples(ts)

Revision ID: 0010
Revises: 0003
Create Date: 2026-11-30 14:40:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects import postgresql

revision: str = '0010'
down_revision: str | None = '0003'
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

_TS = sa.DateTime(timezone=True)


def upgrade() -> None:
    op.create_table(
        'detector_state',
        sa.Column('name', sa.String(64), primary_key=True),
        sa.Column('watermark_ms', sa.BigInteger(), nullable=False),
        sa.Column('last_cycle_ms', sa.BigInteger()),
        sa.Column('ports', sa.Integer(), nullable=False),
        sa.Column('saved_at', _TS, server_default=sa.text('now()'), nullable=False),
        sa.Column('blob', sa.LargeBinary(), nullable=False),
    )
    op.create_table(
        'detector_models',
        sa.Column('id', sa.Integer(), primary_key=True),
        sa.Column('cohort', sa.String(400), nullable=False),
        sa.Column('version', sa.Integer(), nullable=False),
        sa.Column('trained_at', _TS, nullable=False),
        sa.Column('threshold', sa.Float(), nullable=False),
        sa.Column('n_rows', sa.Integer(), nullable=False),
        sa.Column('features', postgresql.JSONB(), nullable=False),
        sa.Column('blob', sa.LargeBinary(), nullable=False),
        sa.UniqueConstraint('cohort', 'version', name='detector_model_version'),
    )
    op.create_table(
        'detection_findings',
        sa.Column('id', sa.BigInteger(), primary_key=True),
        sa.Column('at', _TS, nullable=False),
        sa.Column('fingerprint', sa.String(512), nullable=False),
        sa.Column('kind', sa.String(64), nullable=False),
        sa.Column('state', sa.String(16), nullable=False),
        sa.Column('payload', postgresql.JSONB(), nullable=False),
        sa.UniqueConstraint('at', 'fingerprint', name='detection_finding_once'),
    )
    op.create_index('detection_findings_at', 'detection_findings', ['at'])
    # A detection cycle reads samples by time range only; BRIN on the (append-ordered) ts keeps that
    # from scanning whole day partitions. Tiny, and propagates to future partitions.
    op.execute("CREATE INDEX IF NOT EXISTS samples_ts_brin ON samples USING brin (ts)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS samples_ts_brin")
    op.drop_index('detection_findings_at', table_name='detection_findings')
    op.drop_table('detection_findings')
    op.drop_table('detector_models')
    op.drop_table('detector_state')
