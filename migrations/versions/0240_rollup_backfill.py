"""rollup_backfill: hours whose rollups must be computed again (history written behind the watermark)

An import (`fabricwatch import`, the import API), a late sample and `fabricwatch sim generate --store`
write samples into hours the rollup task has passed, or that it never reads (blocks and chunks before
its first run): the writer marks those hours here in its own transaction, and the rollup task computes
them again, oldest first (service/telemetry/rollups.py). `seq` changes whenever an hour is marked again,
so a run that computed an hour deletes its mark only if nobody marked it meanwhile.
`rollup_watermarks.revised_at`: when rows before a level's watermark were last rewritten (for caches).

Revision ID: 0240
Revises: 0230
Create Date: 2026-12-01 19:20:00
"""

from collections.abc import Sequence

import sqlalchemy as sa
from alembic import op

revision: str = "0240"
down_revision: str | tuple[str, ...] | None = "0230"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("CREATE SEQUENCE rollup_backfill_seq")
    op.create_table(
        "rollup_backfill",
        sa.Column("level", sa.String(8), nullable=False),
        sa.Column("hour", sa.DateTime(timezone=True), nullable=False),
        sa.Column("seq", sa.BigInteger(), server_default=sa.text("nextval('rollup_backfill_seq'::regclass)"),
                  nullable=False),
        sa.Column("marked_at", sa.DateTime(timezone=True), server_default=sa.text("now()"), nullable=False),
        sa.PrimaryKeyConstraint("level", "hour", name="rollup_backfill_pkey"),
    )
    op.add_column("rollup_watermarks", sa.Column("revised_at", sa.DateTime(timezone=True), nullable=True))


def downgrade() -> None:
    op.drop_column("rollup_watermarks", "revised_at")
    op.drop_table("rollup_backfill")
    op.execute("DROP SEQUENCE rollup_backfill_seq")
