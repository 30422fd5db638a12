"""series_samples(lo, hi, sids): a few series' samples of [lo, hi] as a row of arrays per series, planned once

`/api/v1/series` read its raw samples with `COPY (SELECT ... raw_rows_between ...) TO STDOUT`, and
PostgreSQL planned that query on every request: 0.3-0.7 ms of database CPU for a read that executes in
under 0.1 ms. A prepared statement alone does not help: with the time range and the series as parameters
the generic plan (every day partition, pruned at run time) is estimated at about 5x the custom one, so
`plan_cache_mode = auto` plans afresh every time. This function's query is planned once per session as a
generic plan (`SET plan_cache_mode` on the function); the caller prepares its `SELECT * FROM
series_samples(...)`, which costs nothing to plan. The rows are those of store.py's COPY: one row of
(series_id, ts[], value[], NULL) per series with rows or import-block samples in range, ordered by time,
then (series_id, NULL, NULL, data) per compressed chunk that may hold samples of the range.

Revision ID: 0290
Revises: 0280
Create Date: 2026-12-03 08:00:00
"""

from collections.abc import Sequence

from alembic import op

revision: str = "0290"
down_revision: str | tuple[str, ...] | None = "0280"
branch_labels: str | Sequence[str] | None = None
depends_on: str | Sequence[str] | None = None

# A chunk lies in one UTC day: those holding samples of [lo, hi] start on or after lo's day.
_FUNCTION = """
CREATE FUNCTION series_samples(lo timestamptz, hi timestamptz, sids int[])
RETURNS TABLE (series_id int, ts timestamptz[], value float8[], data bytea)
LANGUAGE plpgsql STABLE SET plan_cache_mode = force_generic_plan AS $$
BEGIN
RETURN QUERY
SELECT r.series_id, array_agg(r.ts ORDER BY r.ts), array_agg(r.value ORDER BY r.ts), NULL::bytea
FROM raw_rows_between(lo, hi) r WHERE r.series_id = ANY(sids) GROUP BY r.series_id
UNION ALL
SELECT k.series_id, NULL, NULL, k.data FROM sample_chunks k
WHERE k.first_ts >= date_trunc('day', lo, 'UTC') AND k.first_ts <= hi AND k.last_ts >= lo
  AND k.series_id = ANY(sids);
END
$$"""


def upgrade() -> None:
    op.execute(_FUNCTION)


def downgrade() -> None:
    op.execute("DROP FUNCTION series_samples(timestamptz, timestamptz, int[])")
