"""samples: bulk imports store a series' samples as arrays (`sample_blocks`); `samples` reads both

A row per sample costs one heap tuple and one primary-key entry each: importing 1M samples spent
more time in PostgreSQL than a plain `\\copy` of the same rows takes in all. An import now stores
the samples of the series it creates as one row of arrays per series and day (`sample_blocks`);
polls and pushes keep their row per sample, in `sample_rows` (the day-partitioned table that was
`samples`). `samples` is now a view over both, so every reader sees every sample. Readers of a time
range go through `samples_between(lo, hi)`, which skips the blocks outside it by their bounds, and
readers of a series' newest samples through `last_samples(series, n, before)`, which unnests only
the newest blocks: the view can do neither, as a block's samples are only known after unnesting it.

Revision ID: 0100
Revises: 0090
Create Date: 2026-12-01 01:45:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0100"
down_revision: str | tuple[str, ...] | None = "0090"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None


def upgrade() -> None:
    op.execute("ALTER TABLE samples RENAME TO sample_rows")
    op.execute("""
CREATE TABLE sample_blocks (
  series_id int NOT NULL,
  first_ts timestamptz NOT NULL,
  last_ts timestamptz NOT NULL,
  ts timestamptz[] NOT NULL,
  vals float8[] NOT NULL,
  CONSTRAINT sample_blocks_pkey PRIMARY KEY (series_id, first_ts),
  CONSTRAINT sample_block_shape CHECK (first_ts <= last_ts AND cardinality(ts) = cardinality(vals))
)""")
    op.execute("CREATE INDEX sample_blocks_last_ts ON sample_blocks (last_ts)")  # time ranges, retention
    op.execute("""
CREATE VIEW samples AS
SELECT series_id, ts, value FROM sample_rows
UNION ALL
SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)""")
    # A plain SQL function is inlined by the planner, so the callers' other conditions still reach
    # the tables; both bounds are inclusive and callers add their exact ones.
    op.execute("""
CREATE FUNCTION samples_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi
$$""")
    # A series' blocks never overlap in time (one import writes them, in order) and hold at least one
    # sample before `before` each, so its newest n samples are among its newest n such blocks.
    op.execute("""
CREATE FUNCTION last_samples(sid int, n int, before timestamptz DEFAULT 'infinity')
RETURNS TABLE (ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT x.ts, x.value FROM (
  (SELECT r.ts, r.value FROM sample_rows r WHERE r.series_id = sid AND r.ts < before ORDER BY r.ts DESC LIMIT n)
  UNION ALL
  SELECT u.ts, u.value
  FROM (SELECT b.ts, b.vals FROM sample_blocks b WHERE b.series_id = sid AND b.first_ts < before
        ORDER BY b.first_ts DESC LIMIT n) b
  CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value) WHERE u.ts < before
) x ORDER BY x.ts DESC LIMIT n
$$""")


def downgrade() -> None:
    op.execute("DROP FUNCTION last_samples(int, int, timestamptz)")
    op.execute("DROP FUNCTION samples_between(timestamptz, timestamptz)")
    op.execute("DROP VIEW samples")
    op.execute("INSERT INTO sample_rows (series_id, ts, value) SELECT b.series_id, u.ts, u.value "
               "FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value) ON CONFLICT DO NOTHING")
    op.execute("DROP TABLE sample_blocks")
    op.execute("ALTER TABLE sample_rows RENAME TO samples")
