"""samples: the BRIN index on ts summarizes new page ranges as they fill (autosummarize)

BRIN ranges that are not summarized yet are read by every query that uses the index, and
without autosummarize only a VACUUM summarizes them: on an insert-only table that is after
20 % growth, so the newest data, the part rollups and detection read, stayed unsummarized and
each 5-minute rollup read everything inserted since the last vacuum (in a 30-minute soak its
run time grew from 57 to 260 s). A partitioned index cannot change its storage parameters in
place, so it is built again: one sequential read of `samples`; new partitions copy the setting.

Revision ID: 0090
Revises: 0080
Create Date: 2026-11-30 23:20:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0090"
down_revision: str | tuple[str, ...] | None = "0080"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("DROP INDEX IF EXISTS samples_ts_brin")
    op.execute("CREATE INDEX samples_ts_brin ON samples USING brin (ts) WITH (autosummarize = on)")


def downgrade() -> None:
    op.execute("DROP INDEX IF EXISTS samples_ts_brin")
    op.execute("CREATE INDEX samples_ts_brin ON samples USING brin (ts)")
