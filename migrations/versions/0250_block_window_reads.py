"""raw_rows_between and samples_between read only the part of an import block inside the range

An import block holds a series' samples of a UTC day (8,640 at 10 s). The functions unnested every
block overlapping the range and then filtered: a one-minute read (a `fabricwatch detect --at` cycle, the
rollup of an hour) built a day of rows per series to keep a few. A block's times are in order, so
`width_bucket(t, ts)` (a binary search) gives the positions of the range's ends, and only that slice is
unnested. The results are the same rows.

Revision ID: 0250
Revises: 0240
Create Date: 2026-12-01 19:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0250"
down_revision: str | tuple[str, ...] | None = "0240"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A block's ts are strictly increasing: width_bucket(x, ts) is the count of ts <= x, so the slice from
# the last sample at or before lo (or the first) to the last at or before hi holds every sample of
# [lo, hi] and at most one before it, which the filter drops. `ts || '{}'` in a subquery kept apart
# (OFFSET 0) is the array decompressed once: each use of the stored value would decompress it again
# (three uses took twice the time of one, on 10 s day blocks).
_BLOCKS = """SELECT b.series_id, u.ts, u.value FROM sample_blocks b
CROSS JOIN LATERAL (SELECT b.ts || '{}'::timestamptz[] AS t OFFSET 0) d
CROSS JOIN LATERAL (SELECT greatest(width_bucket(lo, d.t), 1) AS i, width_bucket(hi, d.t) AS j) k
CROSS JOIN LATERAL unnest(d.t[k.i:k.j], b.vals[k.i:k.j]) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi"""
_BLOCKS_0200 = """SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi"""

_RAW_ROWS_BETWEEN = """
CREATE OR REPLACE FUNCTION raw_rows_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
{blocks}
$$"""

_SAMPLES_BETWEEN = """
CREATE OR REPLACE FUNCTION samples_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
{blocks}
UNION ALL
SELECT g.series_id, g.last_ts, g.last FROM rollup_5m g
WHERE g.bucket >= lo - interval '5 minutes' AND g.bucket <= hi AND g.last_ts >= lo AND g.last_ts <= hi
  AND g.last_ts < coalesce((SELECT w.done_until FROM chunk_watermark w), '-infinity')
$$"""


def upgrade() -> None:
    op.execute(_RAW_ROWS_BETWEEN.format(blocks=_BLOCKS))
    op.execute(_SAMPLES_BETWEEN.format(blocks=_BLOCKS))


def downgrade() -> None:
    op.execute(_RAW_ROWS_BETWEEN.format(blocks=_BLOCKS_0200))
    op.execute(_SAMPLES_BETWEEN.format(blocks=_BLOCKS_0200))
