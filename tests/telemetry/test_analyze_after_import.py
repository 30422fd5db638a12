"""An import leaves what it wrote analyzed and its BRIN ranges summarized, with autovacuum off for those
tables: the next reader plans over real statistics (issue #22 item 5)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from sqlalchemy import Engine, create_engine, text

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


def test_small_imports_add_up_to_an_analyze_and_leave_no_range_unsummarized(db: Engine, db_url: str) -> None:
    """One poll at a time (a push per poll): each import alone is under the analyze threshold, their sum is
    not, and the partition's new BRIN ranges are summarized as they fill."""
    add_hosts(db, 1, ports=10)
    ms0 = int(T0.timestamp() * 1000)
    # the series exist before (an import writes a new series' samples as blocks, not rows)
    ingest_samples(engine=db, samples=[Sample("port_rx_bytes_total", 0, ms0 - 60_000, "h-000", f"eth{p}")
                                       for p in range(10)])
    day = T0.date()
    with db.begin() as conn:
        ensure_partitions(conn, day, day)
        conn.execute(text(f"ALTER TABLE {partition_name(day)} SET (autovacuum_enabled = false)"))
    one = create_engine(db_url, pool_size=1, max_overflow=0)  # the stats of its one backend are flushed below

    def push(first: int, steps: int) -> float:
        lines = [f'port_rx_bytes_total{{device="h-000",port="eth{p}"}} {i} {ms0 + i * 1000}'
                 for p in range(10) for i in range(first, first + steps)]
        import_prometheus(engine=one, chunks=["\n".join(lines).encode() + b"\n"])
        with one.connect() as conn:
            conn.execute(text("SELECT pg_stat_force_next_flush()"))  # what this backend wrote, counted now
            assert conn.execute(text(
                "SELECT brin_summarize_new_values(i.indexrelid) FROM pg_index i JOIN pg_class c "
                "ON c.oid = i.indexrelid JOIN pg_am a ON a.oid = c.relam "
                "WHERE i.indrelid = CAST(:t AS regclass) AND a.amname = 'brin'"),
                {"t": partition_name(day)}).scalar() == 0
            return conn.execute(text("SELECT reltuples FROM pg_class WHERE relname = :n"),
                                {"n": partition_name(day)}).scalar()

    try:
        assert push(0, 2000) == 20_010  # never analyzed: analyzed now (and the 10 samples before)
        # 600 rows each, under 50 + 10 % of 20,010 alone; the rows of the import that analyzed count towards
        # the next ANALYZE (they commit after it), so the first push analyzes again, then every third
        tuples = [push(2000 + k * 60, 60) for k in range(7)]
        assert tuples == [20_610, 20_610, 20_610, 22_410, 22_410, 22_410, 24_210]
    finally:
        one.dispose()
