"""An import leaves what it wrote analyzed and its BRIN ranges summarized, with autovacuum off for those
tables: the next reader plans over real statistics (issue #22 item 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, text

from service.telemetry.partitions import ensure_partitions, partition_name
from service.telemetry.samples import Sample
from service.telemetry.service import import_prometheus, ingest_samples
from tests.factories import add_hosts

T0 = datetime(2026, 10, 5, 12, tzinfo=UTC)


def test_an_import_analyzes_the_partitions_and_blocks_it_wrote(db: Engine) -> None:
    add_hosts(db, 1)
    ms0 = int(T0.timestamp() * 1000)
    # eth0's counter exists before the import (its samples go in as rows), eth1's is new (blocks)
    ingest_samples(engine=db, samples=[Sample("port_rx_bytes_total", 0, ms0 - 60_000, "h-000", "eth0")])
    days = [T0.date(), (T0 + timedelta(days=1)).date()]
    with db.begin() as conn:
        ensure_partitions(conn, days[0], days[1])
        for name in [partition_name(d) for d in days] + ["sample_blocks"]:
            conn.execute(text(f"ALTER TABLE {name} SET (autovacuum_enabled = false)"))
    lines = [f'port_rx_bytes_total{{device="h-000",port="eth{p}"}} {i * 1000} {ms0 + i * 60_000}'
             for p in (0, 1) for i in range(1, 1500)]  # 25 hours: both days
    report = import_prometheus(engine=db, chunks=["\n".join(lines).encode() + b"\n"])
    assert report.written == 2 * 1499
    try:
        with db.connect() as conn:
            for name in [partition_name(d) for d in days] + ["sample_blocks"]:
                tuples = conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = :n"), {"n": name}).scalar()
                stats = conn.execute(text("SELECT count(*) FROM pg_stats WHERE tablename = :n"), {"n": name}).scalar()
                assert tuples > 0 and stats > 0, name
            # and the BRIN on ts of the rows' partitions has no range left unsummarized
            for d in days:
                assert conn.execute(text(
                    "SELECT brin_summarize_new_values(i.indexrelid) FROM pg_index i JOIN pg_class c "
                    "ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
                    "WHERE i.indrelid = CAST(:t AS regclass) AND a.amname = 'brin'"),
                    {"t": partition_name(d)}).scalar() == 0
    finally:
        with db.begin() as conn:
            conn.execute(text("ALTER TABLE sample_blocks RESET (autovacuum_enabled)"))
