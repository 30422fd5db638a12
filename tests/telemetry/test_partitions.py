"""Daily partitions are created ahead and on demand, and dropped after retention."""

from __future__ import annotations

import threading
from datetime import UTC, date, datetime, timedelta

import psycopg
from sqlalchemy import Engine, text

from service.telemetry.ingest import Ingestor
from service.telemetry.partitions import (
    chunk_partition_name,
    drop_expired,
    ensure_ahead,
    ensure_chunk_partitions,
    ensure_partitions,
    existing_partitions,
    partition_name,
    summarize_new_ranges,
)
from service.telemetry.rollups import L5M, run_level
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.factories import add_hosts
from tests.telemetry import drop_day_partitions


def test_ahead_on_demand_and_retention(db: Engine) -> None:
    today = date(2026, 11, 30)
    with db.begin() as conn:
        drop_day_partitions(conn)
        created = ensure_ahead(conn, today=today, days_ahead=3)
    assert created == [f"samples_p202611{d}" for d in (30,)] + ["samples_p20261201", "samples_p20261202",
                                                                "samples_p20261203"]
    add_hosts(db, 1)
    old_ts = 1_761_955_200_000  # 2025-11-01: far outside, created on demand
    assert ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, old_ts, "h-000", "eth0")]).written == 1
    with db.begin() as conn:
        assert date(2025, 11, 1) in existing_partitions(conn)
        block = ("INSERT INTO sample_blocks VALUES (1, CAST(:t AS timestamptz), "
                 "CAST(:t AS timestamptz) + interval '1 h', "
                 "ARRAY[CAST(:t AS timestamptz), CAST(:t AS timestamptz) + interval '1 h'], ARRAY[1.0, 2.0])")
        conn.execute(text(block), {"t": "2025-11-01T22:00:00Z"})  # ends inside the expired day
        conn.execute(text(block), {"t": "2026-10-31T23:30:00Z"})  # ends after the cutoff: kept
        with conn.connection.cursor() as cur:   # compressed days: the expired one goes, the kept one stays
            ensure_chunk_partitions(cur, [date(2025, 11, 1), today])
        dropped = drop_expired(conn, today=today, retention_days=30)
        assert dropped == ["samples_p20251101", chunk_partition_name(date(2025, 11, 1))]
        assert list(existing_partitions(conn, "sample_chunks")) == [today]
        remaining = existing_partitions(conn)
        assert min(remaining) == today and max(remaining) == today + timedelta(days=3)
        assert conn.execute(text("SELECT count(*) FROM sample_rows")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 2  # the kept block's


def test_brin_ranges_are_summarized_before_the_rollups_read(db: Engine) -> None:
    """A partition's BRIN on ts summarizes filled page ranges by itself (autosummarize, in autovacuum's
    time), and the 5-minute rollup summarizes whatever is still pending before it reads by time, so its
    scan skips the ranges outside the chunk instead of reading everything inserted since a vacuum."""
    day = date(2026, 11, 2)
    name = partition_name(day)
    with db.begin() as conn:
        ensure_partitions(conn, day, day)
        options = conn.execute(text(
            "SELECT c.reloptions FROM pg_index x JOIN pg_class c ON c.oid = x.indexrelid "
            "JOIN pg_am a ON a.oid = c.relam WHERE x.indrelid = CAST(:t AS regclass) AND a.amname = 'brin'"),
            {"t": name}).scalar_one()
    assert options == ["autosummarize=on"]

    add_hosts(db, 1)
    t0 = datetime(2026, 11, 2, tzinfo=UTC)
    ingest_samples(engine=db, samples=[Sample("port_rx_bytes_total", 0, int(t0.timestamp() * 1000), "h-000", "eth0")])

    def fill(hour: int) -> None:  # 60,000 rows of the series in time order: several 128-page ranges
        with db.begin() as conn:
            conn.execute(text(
                f"INSERT INTO {name} (series_id, ts, value) SELECT (SELECT id FROM series), "
                "CAST(:t0 AS timestamptz) + (g + 1) * interval '60 ms', g FROM generate_series(0, 59999) g"),
                {"t0": t0 + timedelta(hours=hour)})

    fill(0)
    with db.begin() as conn:
        assert summarize_new_ranges(conn, day, day) > 0
        assert summarize_new_ranges(conn, day, day) == 0  # nothing left
    fill(1)
    run = run_level(db, L5M, now=datetime(2026, 11, 2, 1, 15, tzinfo=UTC), lag_s=60, max_gap_s=900, max_chunks=4)
    assert run.chunks >= 1 and run.rows > 0
    with db.begin() as conn:
        assert summarize_new_ranges(conn, day, day) == 0  # the rollup summarized the second fill first


def test_concurrent_ingests_of_a_new_day_create_its_partition_once(db: Engine, db_url: str) -> None:
    """Pushes from many connections at once into days without a partition (a day's start, with
    the API's pooled connections): one creates it, the others wait for its lock and then must see
    it. Checking again with to_regclass after the lock saw no table here in hundreds of cases."""
    add_hosts(db, 1)
    url = db_url.replace("postgresql+psycopg://", "postgresql://", 1)
    connections = [psycopg.connect(url) for _ in range(8)]
    errors: list[str] = []

    def push(conn: psycopg.Connection[object], day: int) -> None:
        ts = int(datetime(2024, 3, 1, tzinfo=UTC).timestamp() * 1000) + day * 86_400_000
        try:
            Ingestor(conn).import_exposition([f'port_oper_up{{device="h-000",port="eth0"}} 1 {ts}'.encode()], "t", 0)
            conn.commit()
        except psycopg.Error as exc:
            conn.rollback()
            errors.append(str(exc))

    try:
        for day in range(12):
            pushes = [threading.Thread(target=push, args=(c, day)) for c in connections]
            for t in pushes:
                t.start()
            for t in pushes:
                t.join(30)
    finally:
        for c in connections:
            c.close()
    assert errors == []
    with db.connect() as conn:
        assert len([d for d in existing_partitions(conn) if d.year == 2024]) == 12
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 12  # one per day, the rest repeats
