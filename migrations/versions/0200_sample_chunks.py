"""sample_chunks: samples past the hot window, one compressed chunk per series and span (issue #22)

A row per sample costs about 100 bytes on disk (heap tuple, primary-key entry); an import block
about 12. The compression task (service/telemetry/compress.py) moves samples older than the hot
window (`FABRICWATCH_COMPRESS_AFTER_S`, 1 h) out of `sample_rows` and `sample_blocks` into
`sample_chunks`: one row per series and hour (an import block: per series and day), its samples
encoded by service/telemetry/chunk_codec.py (delta-of-delta times, integer deltas or XORed float
bits, byte-stream-split, zstd). A chunk never spans two UTC days and a series' chunks never overlap.

Partitioned by day on `first_ts` like `sample_rows` on `ts` (`sample_chunks_pYYYYMMDD`), so retention
drops whole days. The chunk's last two samples are kept as plain columns: `last_samples` (SQL, for
the fleet and inventory views and Grafana) reads a silent series' newest readings without decoding.

zstd cannot be decoded in SQL. Service readers go through service/telemetry/store.py: rows and blocks
from `raw_rows_between(lo, hi)` (what `samples_between` was), chunks decoded in Python. For SQL
readers (Grafana's panels), `samples_between(lo, hi)` now gives the rows and blocks and, for the
compressed time (before the chunk watermark), each series' 5-minute rollup `last` reading at its
`last_ts`: a sample every 5 minutes, so a panel's averages, counter rates (lag() over the values) and
trends span the whole range. The `samples` view stays rows and blocks.

`chunk_watermark.done_until`: every hour before it has been compressed (rows written later into
those hours are late rows, merged when their day closes); `compacted_until`: every day before it has
one chunk per series (a day's hourly chunks are merged once the day is wholly compressed).

Revision ID: 0200
Revises: 0190
Create Date: 2026-12-01 16:30:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0200"
down_revision: str | tuple[str, ...] | None = "0190"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

ROLE = "fabricwatch_grafana"

# rows, blocks, then each of the newest 2 chunks' tail samples; one sample per time (a late duplicate
# row of a compressed sample is the same reading)
_LAST_SAMPLES = """
CREATE OR REPLACE FUNCTION last_samples(sid int, n int, before timestamptz DEFAULT 'infinity')
RETURNS TABLE (ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT DISTINCT ON (x.ts) x.ts, x.value FROM (
  (SELECT r.ts, r.value FROM sample_rows r WHERE r.series_id = sid AND r.ts < before ORDER BY r.ts DESC LIMIT n)
  UNION ALL
  SELECT u.ts, u.value
  FROM (SELECT b.ts, b.vals FROM sample_blocks b WHERE b.series_id = sid AND b.first_ts < before
        ORDER BY b.first_ts DESC LIMIT n) b
  CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value) WHERE u.ts < before
  UNION ALL
  SELECT t.ts, t.value
  FROM (SELECT c.last_ts, c.last_value, c.prev_ts, c.prev_value FROM sample_chunks c
        WHERE c.series_id = sid AND c.first_ts < before ORDER BY c.first_ts DESC LIMIT 2) c
  CROSS JOIN LATERAL (VALUES (c.last_ts, c.last_value), (c.prev_ts, c.prev_value)) AS t(ts, value)
  WHERE t.ts < before
) x ORDER BY x.ts DESC LIMIT n
$$"""

_LAST_SAMPLES_0100 = """
CREATE OR REPLACE FUNCTION last_samples(sid int, n int, before timestamptz DEFAULT 'infinity')
RETURNS TABLE (ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT x.ts, x.value FROM (
  (SELECT r.ts, r.value FROM sample_rows r WHERE r.series_id = sid AND r.ts < before ORDER BY r.ts DESC LIMIT n)
  UNION ALL
  SELECT u.ts, u.value
  FROM (SELECT b.ts, b.vals FROM sample_blocks b WHERE b.series_id = sid AND b.first_ts < before
        ORDER BY b.first_ts DESC LIMIT n) b
  CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value) WHERE u.ts < before
) x ORDER BY x.ts DESC LIMIT n
$$"""


_RAW_ROWS_BETWEEN = """
CREATE FUNCTION raw_rows_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi
$$"""

# Inlined like raw_rows_between: the caller's conditions (a series, a metric through a join) reach the tables.
_SAMPLES_BETWEEN = """
CREATE OR REPLACE FUNCTION samples_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi
UNION ALL
SELECT g.series_id, g.last_ts, g.last FROM rollup_5m g
WHERE g.bucket >= lo - interval '5 minutes' AND g.bucket <= hi AND g.last_ts >= lo AND g.last_ts <= hi
  AND g.last_ts < coalesce((SELECT w.done_until FROM chunk_watermark w), '-infinity')
$$"""

_SAMPLES_BETWEEN_0100 = """
CREATE OR REPLACE FUNCTION samples_between(lo timestamptz, hi timestamptz)
RETURNS TABLE (series_id int, ts timestamptz, value float8) LANGUAGE sql STABLE AS $$
SELECT r.series_id, r.ts, r.value FROM sample_rows r WHERE r.ts >= lo AND r.ts <= hi
UNION ALL
SELECT b.series_id, u.ts, u.value FROM sample_blocks b CROSS JOIN LATERAL unnest(b.ts, b.vals) AS u(ts, value)
WHERE b.last_ts >= lo AND b.first_ts <= hi AND u.ts >= lo AND u.ts <= hi
$$"""


def upgrade() -> None:
    op.execute("""
CREATE TABLE sample_chunks (
  series_id int NOT NULL,
  first_ts timestamptz NOT NULL,
  last_ts timestamptz NOT NULL,
  n int NOT NULL,
  last_value float8 NOT NULL,
  prev_ts timestamptz,
  prev_value float8,
  data bytea NOT NULL,
  CONSTRAINT sample_chunks_pkey PRIMARY KEY (series_id, first_ts),
  CONSTRAINT sample_chunk_shape CHECK (first_ts <= last_ts AND n > 0 AND (n = 1) = (prev_ts IS NULL)
    AND date_trunc('day', first_ts AT TIME ZONE 'UTC') = date_trunc('day', last_ts AT TIME ZONE 'UTC'))
) PARTITION BY RANGE (first_ts)""")
    # chunks of one run are written together: time-range reads over all series skip the other hours
    op.execute("CREATE INDEX sample_chunks_first_ts_brin ON sample_chunks USING brin (first_ts) "
               "WITH (autosummarize = on)")
    op.execute("""
CREATE TABLE chunk_watermark (
  id bool PRIMARY KEY DEFAULT true CHECK (id),
  done_until timestamptz NOT NULL,
  compacted_until timestamptz,
  updated_at timestamptz NOT NULL DEFAULT now()
)""")
    # read-only for Grafana like the other sample tables (migration 0150)
    op.execute(f"""
DO $$
BEGIN
  IF EXISTS (SELECT FROM pg_roles WHERE rolname = '{ROLE}') THEN
    GRANT SELECT ON sample_chunks, chunk_watermark TO {ROLE};
  END IF;
END $$""")
    op.execute(_LAST_SAMPLES)
    op.execute(_RAW_ROWS_BETWEEN)
    op.execute(_SAMPLES_BETWEEN)


def downgrade() -> None:
    # The chunks' samples go back to rows first: a downgrade loses nothing.
    from service.telemetry.compress import decompress_all

    decompress_all(op.get_bind())
    op.execute(_SAMPLES_BETWEEN_0100)
    op.execute("DROP FUNCTION raw_rows_between(timestamptz, timestamptz)")
    op.execute(_LAST_SAMPLES_0100)
    op.execute("DROP TABLE chunk_watermark")
    op.execute("DROP TABLE sample_chunks")
