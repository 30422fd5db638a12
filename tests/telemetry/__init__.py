"""Telemetry store tests."""

from sqlalchemy import Connection, text

from service.telemetry.partitions import existing_partitions


def drop_day_partitions(conn: Connection) -> None:
    """Drop every day partition of rows and chunks: the db fixture empties tables but keeps other tests' days,
    and compression and retention act on whole days."""
    for table in ("sample_rows", "sample_chunks"):
        for name in existing_partitions(conn, table).values():
            conn.execute(text(f"DROP TABLE {name}"))
