"""rollup_backfill: one row per writer's mark (an append-only log), not one per hour

With one row per hour, a writer marking an hour already marked updated that row (to tell a rollup run
computing the hour that it had been marked again), so concurrent writers of late samples queued on it:
in an overloaded ingest soak, where every push came in after the lag, every push updated the same row
(20,640 times in 13 minutes). Now each writer inserts its own rows, which no other writer touches; a
rollup run reads the ids of an hour's marks, computes the hour (its statements see every sample those
writers committed) and deletes exactly those ids: a mark inserted meanwhile stays for the next round.

Revision ID: 0260
Revises: 0250
Create Date: 2026-12-01 20:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0260"
down_revision: str | tuple[str, ...] | None = "0250"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE rollup_backfill DROP CONSTRAINT rollup_backfill_pkey")
    op.execute("ALTER TABLE rollup_backfill RENAME COLUMN seq TO id")
    op.execute("ALTER TABLE rollup_backfill ADD CONSTRAINT rollup_backfill_pkey PRIMARY KEY (id)")
    op.execute("CREATE INDEX rollup_backfill_hour ON rollup_backfill (level, hour)")


def downgrade() -> None:
    op.execute("DROP INDEX rollup_backfill_hour")
    op.execute("ALTER TABLE rollup_backfill DROP CONSTRAINT rollup_backfill_pkey")
    op.execute("DELETE FROM rollup_backfill a USING rollup_backfill b WHERE a.level = b.level AND a.hour = b.hour "
               "AND a.id < b.id")
    op.execute("ALTER TABLE rollup_backfill RENAME COLUMN id TO seq")
    op.execute("ALTER TABLE rollup_backfill ADD CONSTRAINT rollup_backfill_pkey PRIMARY KEY (level, hour)")
