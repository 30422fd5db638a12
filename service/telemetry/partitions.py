"""Daily partitions of `sample_rows` (created ahead and on demand) and `sample_chunks` (created by
compression), both dropped after retention (with the `sample_blocks` of those days)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import TYPE_CHECKING, Any

import psycopg

if TYPE_CHECKING:  # SQLAlchemy is not imported at run time: `fabricwatch import` runs without it
    from sqlalchemy import Connection

_NAME_RE = re.compile(r"^samples_p(\d{8})$")
_CHUNKS_RE = re.compile(r"^sample_chunks_p(\d{8})$")
_LOCK_KEY = 74_201_100  # advisory lock so concurrent ingests don't race on CREATE TABLE


def partition_name(day: date) -> str:
    return f"samples_p{day:%Y%m%d}"


def chunk_partition_name(day: date) -> str:
    return f"sample_chunks_p{day:%Y%m%d}"


# By a scan of pg_class (its name index), which sees what committed before the statement began;
# to_regclass reads the relation cache, which may not know yet of a table another ingest committed
# while we waited for the creation lock.
_MISSING_SQL = ("SELECT array(SELECT d FROM unnest(%s::date[]) d WHERE NOT EXISTS (SELECT 1 "
                "FROM pg_class c WHERE c.relname = 'samples_p' || to_char(d, 'YYYYMMDD') "
                "AND c.relnamespace = current_schema()::regnamespace))")


def missing_days(cur: psycopg.Cursor[Any], days: list[date]) -> list[date]:
    """The days among these without a partition."""
    return cur.execute(_MISSING_SQL, [days]).fetchone()[0]  # type: ignore[index]


_SUMMARIZE_SQL = """
SELECT coalesce(sum(brin_summarize_new_values(x.indexrelid)), 0)::int FROM pg_index x
JOIN pg_inherits i ON i.inhrelid = x.indexrelid
WHERE i.inhparent = 'samples_ts_brin'::regclass
  AND x.indrelid = ANY(ARRAY(SELECT to_regclass(n) FROM unnest(CAST(%s AS text[])) n))"""


def summarize_new_ranges(conn: Connection, first: date, last: date) -> int:
    """Summarize the BRIN ranges on ts not summarized yet in the partitions of [first, last]; the
    number summarized. Autosummarize does this in autovacuum's own time; a reader of the newest
    rows (the rollups) calls this first so that its time-range scan skips what it does not need."""
    names = [partition_name(first + timedelta(days=i)) for i in range((last - first).days + 1)]
    return conn.exec_driver_sql(_SUMMARIZE_SQL, (names,)).scalar_one()


# Autovacuum's analyze rule: rows changed since the table's last ANALYZE (those committed, as the statistics
# system has counted them, and this import's) past 50 + 10 % of its rows.
_STALE_SQL = """
SELECT c.relname FROM pg_class c
WHERE c.relname = ANY(%(names)s) AND c.relnamespace = current_schema()::regnamespace
  AND (c.reltuples < 0 OR pg_stat_get_mod_since_analyze(c.oid) + %(written)s >= 50 + 0.1 * c.reltuples)"""


def analyze_written(cur: psycopg.Cursor[Any], days: list[date], written: int, *, blocks: bool) -> list[str]:
    """After an import of `written` samples into these days (and `sample_blocks`, if `blocks`): summarize the
    new BRIN ranges of their partitions, and ANALYZE the tables that never had statistics or changed by more
    than autovacuum's analyze threshold since their last ANALYZE (many small imports add up). An import may
    write days of history at once, or one poll at a time; without this the next reader plans over stale
    statistics and scans whole partitions until autovacuum comes by, and never if it is off (a backtest after
    an import read 20x slower; a live cycle's read of its window, the whole day). Returns the tables analyzed."""
    names = [partition_name(d) for d in days] + (["sample_blocks"] if blocks else [])
    stale = [r[0] for r in cur.execute(_STALE_SQL, {"names": names, "written": written})]
    for name in stale:
        cur.execute(f"ANALYZE {name}")
    cur.execute(_SUMMARIZE_SQL, [[partition_name(d) for d in days]])
    return stale


_PARTITIONS_SQL = ("SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
                   "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = %s")


def existing_partitions(conn: Connection, table: str = "sample_rows") -> dict[date, str]:
    """Day -> partition name, of `sample_rows` or `sample_chunks`."""
    pattern = _CHUNKS_RE if table == "sample_chunks" else _NAME_RE
    out: dict[date, str] = {}
    for name in conn.exec_driver_sql(_PARTITIONS_SQL, (table,)).scalars():
        m = pattern.match(name)
        if m:
            out[datetime.strptime(m.group(1), "%Y%m%d").date()] = name
    return out


def ensure_chunk_partitions(cur: psycopg.Cursor[Any], days: list[date]) -> list[str]:
    """Create the `sample_chunks` partitions of these days that do not exist; returns the names created."""
    have = {r[0] for r in cur.execute(
        "SELECT relname FROM pg_class WHERE relname = ANY(%s) AND relnamespace = current_schema()::regnamespace",
        [[chunk_partition_name(d) for d in days]])}
    if len(have) == len(set(days)):
        return []
    cur.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY + 1])
    created = []
    for day in sorted(set(days)):
        name = chunk_partition_name(day)
        if cur.execute("SELECT to_regclass(%s) IS NULL", [name]).fetchone()[0]:  # type: ignore[index]
            lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
            cur.execute(f"CREATE TABLE {name} PARTITION OF sample_chunks FOR VALUES FROM ('{lo.isoformat()}') "
                        f"TO ('{(lo + timedelta(days=1)).isoformat()}')")
            created.append(name)
    return created


def ensure_partitions(conn: Connection, first: date, last: date) -> list[str]:
    """Create the daily partitions covering [first, last]; returns the names created."""
    with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
        return create_partitions(cur, [first + timedelta(days=i) for i in range((last - first).days + 1)])


def create_partitions(cur: psycopg.Cursor[Any], days: list[date]) -> list[str]:
    """Create the partitions of these days that do not exist; returns the names created."""
    if not missing_days(cur, days):
        return []
    cur.execute("SELECT pg_advisory_xact_lock(%s)", [_LOCK_KEY])
    created = []
    for day in missing_days(cur, days):  # again: another ingest may have created them meanwhile
        name = partition_name(day)
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        hi = lo + timedelta(days=1)
        cur.execute(f"CREATE TABLE {name} PARTITION OF sample_rows FOR VALUES FROM ('{lo.isoformat()}') "
                    f"TO ('{hi.isoformat()}')")
        created.append(name)
    return created


def ensure_ahead(conn: Connection, *, today: date, days_ahead: int) -> list[str]:
    return ensure_partitions(conn, today, today + timedelta(days=days_ahead))


def drop_expired(conn: Connection, *, today: date, retention_days: int) -> list[str]:
    """Drop the row and chunk partitions whose whole day is older than the retention period, and
    delete the sample blocks of those days."""
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for table in ("sample_rows", "sample_chunks"):
        for day, name in sorted(existing_partitions(conn, table).items()):
            if day < cutoff:
                conn.exec_driver_sql(f"DROP TABLE {name}")
                dropped.append(name)
    conn.exec_driver_sql("DELETE FROM sample_blocks WHERE last_ts < %s",
                         (datetime(cutoff.year, cutoff.month, cutoff.day, tzinfo=UTC),))
    return dropped
