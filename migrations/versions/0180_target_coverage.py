"""target_status.coverage: per target, the metric groups its role expects against what arrived

A JSON record written by every collection (service/telemetry/coverage.py): the groups expected
(state, counters, optics, pfc: by device kind, protocol and the inventory's optics), per group the
samples the latest collection of it brought, how many collections in a row brought none and why,
and the samples refused per reason with a few examples. NULL until the target's first collection
after this migration. /api/v1/targets, /metrics and the telemetry_gap alert read it.

Revision ID: 0180
Revises: 0170
Create Date: 2026-12-06 10:00:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op
from sqlalchemy.dialects.postgresql import JSONB

revision: str = "0180"
down_revision: str | tuple[str, ...] | None = "0170"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("target_status", sa.Column("coverage", JSONB, nullable=True))


def downgrade() -> None:
    op.drop_column("target_status", "coverage")
