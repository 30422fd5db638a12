"""Daily partitions of `sample_rows`: created ahead (and on demand), dropped after retention
(with the `sample_blocks` of those days)."""

from __future__ import annotations

import re
from datetime import UTC, date, datetime, timedelta
from typing import Any

import psycopg
from sqlalchemy import Connection, text

_NAME_RE = re.compile(r"^samples_p(\d{8})$")
_LOCK_KEY = 74_201_100  # advisory lock so concurrent ingests don't race on CREATE TABLE


def partition_name(day: date) -> str:
    return f"samples_p{day:%Y%m%d}"


_MISSING_SQL = ("SELECT array(SELECT d FROM unnest(%s::date[]) d "
                "WHERE to_regclass('samples_p' || to_char(d, 'YYYYMMDD')) IS NULL)")


def missing_days(cur: psycopg.Cursor[Any], days: list[date]) -> list[date]:
    """The days among these without a partition: one cheap statement, for ingest's every batch."""
    return cur.execute(_MISSING_SQL, [days]).fetchone()[0]  # type: ignore[index]


_SUMMARIZE_SQL = """
SELECT coalesce(sum(brin_summarize_new_values(x.indexrelid)), 0)::int FROM pg_index x
JOIN pg_inherits i ON i.inhrelid = x.indexrelid
WHERE i.inhparent = 'samples_ts_brin'::regclass
  AND x.indrelid = ANY(ARRAY(SELECT to_regclass(n) FROM unnest(CAST(:names AS text[])) n))"""


def summarize_new_ranges(conn: Connection, first: date, last: date) -> int:
    """Summarize the BRIN ranges on ts not summarized yet in the partitions of [first, last]; the
    number summarized. Autosummarize does this in autovacuum's own time; a reader of the newest
    rows (the rollups) calls this first so that its time-range scan skips what it does not need."""
    names = [partition_name(first + timedelta(days=i)) for i in range((last - first).days + 1)]
    return conn.execute(text(_SUMMARIZE_SQL), {"names": names}).scalar_one()


def existing_partitions(conn: Connection) -> dict[date, str]:
    rows = conn.execute(text(
        "SELECT c.relname FROM pg_inherits i JOIN pg_class c ON c.oid = i.inhrelid "
        "JOIN pg_class p ON p.oid = i.inhparent WHERE p.relname = 'sample_rows'"
    )).scalars()
    out: dict[date, str] = {}
    for name in rows:
        m = _NAME_RE.match(name)
        if m:
            out[datetime.strptime(m.group(1), "%Y%m%d").date()] = name
    return out


def ensure_partitions(conn: Connection, first: date, last: date) -> list[str]:
    """Create the daily partitions covering [first, last]; returns the names created."""
    days = [first + timedelta(days=i) for i in range((last - first).days + 1)]
    missing = [d for d in days if d not in existing_partitions(conn)]
    if not missing:
        return []
    conn.execute(text("SELECT pg_advisory_xact_lock(:k)"), {"k": _LOCK_KEY})
    have = existing_partitions(conn)
    created = []
    for day in missing:
        if day in have:
            continue
        name = partition_name(day)
        lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
        hi = lo + timedelta(days=1)
        conn.execute(text(
            f"CREATE TABLE {name} PARTITION OF sample_rows FOR VALUES FROM ('{lo.isoformat()}') TO ('{hi.isoformat()}')"
        ))
        created.append(name)
    return created


def ensure_ahead(conn: Connection, *, today: date, days_ahead: int) -> list[str]:
    return ensure_partitions(conn, today, today + timedelta(days=days_ahead))


def drop_expired(conn: Connection, *, today: date, retention_days: int) -> list[str]:
    """Drop partitions whose whole day is older than the retention period, and delete the sample
    blocks of those days."""
    cutoff = today - timedelta(days=retention_days)
    dropped = []
    for day, name in sorted(existing_partitions(conn).items()):
        if day < cutoff:
            conn.execute(text(f"DROP TABLE {name}"))
            dropped.append(name)
    conn.execute(text("DELETE FROM sample_blocks WHERE last_ts < :cutoff"),
                 {"cutoff": datetime(cutoff.year, cutoff.month, cutoff.day, tzinfo=UTC)})
    return dropped
