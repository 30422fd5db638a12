"""rollup_backfill.lo: the earliest sample a writer stored in the marked hour

A rollup run computed a marked hour whole, from its start to the watermark. Late live samples (ingest
running minutes behind, past the rollup lag) are in the hour's last buckets only, yet each minute's
run computed the whole hour again for every series. With `lo` the run starts at the bucket of the
earliest sample marked (NULL: the whole hour, as an hour marked for its first step or for the 1h level).

Revision ID: 0270
Revises: 0260
Create Date: 2026-12-01 20:05:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0270"
down_revision: str | tuple[str, ...] | None = "0260"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.add_column("rollup_backfill", sa.Column("lo", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("rollup_backfill", "lo")
