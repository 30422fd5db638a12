"""read_samples for a list of series (the /series read: a prepared SELECT of series_samples(), migration 0290)
returns what the whole-store read (a COPY planned for its range) returns for those series: hot rows, import
blocks, compressed chunks and late duplicates, for ranges that cut through each; and one connection's plan,
made once, still sees partitions created and dropped after it."""

from __future__ import annotations

import itertools
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import numpy as np
import psycopg
import pytest
from sqlalchemy import Engine, text

from service.telemetry.compress import run_compression
from service.telemetry.partitions import existing_partitions
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples, query_series
from service.telemetry.store import Samples, copy_bytes, parse_copy_grouped, read_samples
from tests.factories import add_hosts
from tests.telemetry import drop_day_partitions
from tests.telemetry.test_compress import END, T0, _ms, _seed

Row = tuple[int, int, float]


@pytest.fixture(autouse=True)
def _only_our_days(db: Engine) -> None:
    with db.begin() as conn:
        drop_day_partitions(conn)


@pytest.fixture()
def pg(db_url: str) -> Iterator[psycopg.Connection]:
    """One session for every read of a test: its prepared statement and cached plan live as long."""
    with psycopg.connect(db_url.replace("+psycopg", ""), autocommit=True) as conn:
        yield conn


def _rows(got: Samples) -> list[Row]:
    return list(zip(got.sid.tolist(), got.ts_us.tolist(), got.value.tolist(), strict=True))


def _everything(pg: psycopg.Connection) -> list[Row]:
    """The whole store through the other path (every series: a COPY of raw_rows_between and the chunks)."""
    return _rows(read_samples(pg, T0 - timedelta(days=2), END + timedelta(days=2)))


def _check(pg: psycopg.Connection, everything: list[Row], ranges: list[tuple[datetime, datetime]]) -> int:
    compared = 0
    for lo, hi in ranges:  # every series, range by range: what the widest read holds of it
        lo_us, hi_us = int(lo.timestamp() * 1e6), int(hi.timestamp() * 1e6)
        assert _rows(read_samples(pg, lo, hi)) == [r for r in everything if lo_us <= r[1] <= hi_us], (lo, hi)
    for ids in ([1], [2, 4], [1, 2, 3, 4], [4, 3, 1], [99], []):
        for lo, hi in ranges:
            lo_us, hi_us = int(lo.timestamp() * 1e6), int(hi.timestamp() * 1e6)
            want = [r for r in everything if r[0] in ids and lo_us <= r[1] <= hi_us]
            got = read_samples(pg, lo, hi, ids)
            assert _rows(got) == want, (ids, lo, hi)
            assert got.sid.dtype == np.int64 and got.ts_us.dtype == np.int64 and got.value.dtype == np.float64
            compared += len(want)
    return compared


def test_series_reads_match_the_whole_store_read(db: Engine, pg: psycopg.Connection) -> None:
    _seed(db)  # 4 series, a sample a minute from T0 to END + 30 min
    run_compression(db, now=END + timedelta(hours=1), hot_s=3600)  # chunks up to END, rows after
    with db.begin() as conn:  # an import block after the rows (10 s steps), for series 2
        times = [END + timedelta(minutes=40, seconds=10 * i) for i in range(60)]
        conn.execute(text("INSERT INTO sample_blocks VALUES (2, :a, :b, CAST(:ts AS timestamptz[]), "
                          "CAST(:v AS float8[]))"),
                     {"a": times[0], "b": times[-1], "ts": times, "v": [0.5 * i for i in range(60)]})
    everything = _everything(pg)
    dup_t, late_t = T0 + timedelta(hours=29), T0 + timedelta(hours=29, seconds=30)
    stored = next(v for s, t, v in everything if s == 1 and t == _ms(dup_t) * 1000)
    ingest_samples(engine=db, samples=[  # into a compressed hour: a duplicate time (the chunk's wins), a late one
        Sample("port_rx_bytes_total", stored + 12345, _ms(dup_t), "h-000", "eth0"),
        Sample("port_rx_bytes_total", stored + 1, _ms(late_t), "h-000", "eth0")])
    everything = _everything(pg)
    assert (1, _ms(late_t) * 1000, stored + 1) in everything and (1, _ms(dup_t) * 1000, stored) in everything
    # ranges inside one chunk, across chunks, across the chunk/row boundary, into the block, empty, all
    ranges = [(T0 + timedelta(hours=28, minutes=59, seconds=30), T0 + timedelta(hours=29, minutes=1)),
              (T0 + timedelta(hours=3, seconds=1), T0 + timedelta(hours=7, seconds=59)),
              (END - timedelta(minutes=20), END + timedelta(minutes=20)),
              (END + timedelta(minutes=29), END + timedelta(minutes=45, seconds=5)),
              (T0 - timedelta(days=1), T0 - timedelta(hours=1)),
              (T0 - timedelta(days=2), END + timedelta(days=2))]
    assert _check(pg, everything, ranges) > 10_000
    prepared = pg.execute("SELECT statement FROM pg_prepared_statements").fetchall()
    assert any("series_samples" in s for (s,) in prepared)  # planned once for this session, not per read


def test_one_sessions_plan_sees_new_and_dropped_partitions(db: Engine, pg: psycopg.Connection) -> None:
    _seed(db)
    wide = (T0 - timedelta(days=2), END + timedelta(days=3))
    before = read_samples(pg, *wide, [1, 3])  # the session's plan is made here, rows only
    assert len(before) and _rows(before) == [r for r in _everything(pg) if r[0] in (1, 3)]
    # a day not stored before: its partition is created after the plan was made
    later = END + timedelta(days=1, hours=1)
    ingest_samples(engine=db, samples=[Sample("port_rx_bytes_total", 1.0e15, _ms(later), "h-000", "eth1")])
    got = _rows(read_samples(pg, *wide, [1, 3]))
    assert (3, _ms(later) * 1000, 1.0e15) in got and len(got) == len(before) + 1
    # compression creates chunk partitions and empties a row partition; the same session reads them
    run_compression(db, now=END + timedelta(hours=1), hot_s=3600)
    assert _rows(read_samples(pg, *wide, [1, 3])) == got
    # retention drops a day's partitions: the cached plan must not read the dropped table
    with db.begin() as conn:
        for table in ("sample_rows", "sample_chunks"):
            name = existing_partitions(conn, table).get(T0.date())
            if name:
                conn.execute(text(f"DROP TABLE {name}"))
    cut = _ms(T0 + timedelta(days=1)) * 1000
    assert _rows(read_samples(pg, *wide, [1, 3])) == [r for r in got if r[1] >= cut]


def test_series_lookup_every_filter_combination(db: Engine) -> None:
    """The lookup's SQL has a condition per given filter only (service.py, _series_sql): every combination of
    filters, each absent, matching or matching nothing, finds the series a filter in Python finds, in order."""
    add_hosts(db, 2, ports=2)
    t = _ms(END)
    labels: dict[str, list[tuple[str, str | None, int | None, int | None, int | None]]] = {
        "optic_rx_power_dbm": [(d, p, lane, None, None) for d in ("h-000", "h-001") for p in ("eth0", "eth1")
                               for lane in (0, 1, 3)],
        "port_pfc_rx_pause_frames_total": [(d, p, None, prio, None) for d in ("h-000", "h-001")
                                           for p in ("eth0", "eth1") for prio in (3, 4)],
        "gpu_nvlink_crc_errors_total": [(d, None, None, None, g) for d in ("h-000", "h-001") for g in (0, 5)],
    }
    ingest_samples(engine=db, samples=[Sample(m, 1.0, t, d, p, lane=ln, priority=pr, gpu=g)
                                       for m, keys in labels.items() for d, p, ln, pr, g in keys])
    choices = {"device": (None, "h-001", "h-009"), "port": (None, "eth1", "eth7"), "lane": (None, 3, 2),
               "priority": (None, 4, 6), "gpu": (None, 5, 1)}
    names = list(choices)
    checked = 0
    with db.connect() as conn:
        for metric, keys in labels.items():
            for combo in itertools.product(*choices.values()):
                filters = dict(zip(names, combo, strict=True))
                want = sorted((k for k in keys if all(v is None or k[i] == v for i, v in enumerate(combo))),
                              key=lambda k: tuple((x is not None, x if x is not None else 0) for x in k))
                got = query_series(conn=conn, metric=metric, start=END - timedelta(minutes=1), end=END, raw=True,
                                   **filters)
                assert [(r.device, r.port, r.lane, r.priority, r.gpu) for r in got] == want, (metric, filters)
                checked += len(want)
    assert checked == 72  # series found, over all the combinations


def test_a_grouped_copy_that_is_not_three_whole_arrays_is_refused(pg: psycopg.Connection) -> None:
    """The whole-store read's COPY (a row of arrays per 1,024 series) parsed from what the server sends; a row
    with a NULL, arrays of different lengths or another field count is an error that names the row."""
    def copied(query: str) -> bytes:
        with pg.cursor() as cur:
            return bytes(copy_bytes(cur, query, None))

    good = copied("SELECT ARRAY[7, 7, 9], ARRAY['2026-01-01T00:00:10Z', '2026-01-01T00:00:20Z', "
                  "'2026-01-01T00:00:10Z']::timestamptz[], ARRAY[1.5, 2.5, -1]::float8[]")
    got = parse_copy_grouped(good)
    assert got.sid.tolist() == [7, 7, 9] and got.value.tolist() == [1.5, 2.5, -1.0]
    t10 = int(datetime(2026, 1, 1, 0, 0, 10, tzinfo=UTC).timestamp() * 1e6)
    assert got.ts_us.tolist() == [t10, t10 + 10_000_000, t10]
    for query, says in (
            ("SELECT ARRAY[1], NULL::timestamptz[], ARRAY[1.0]::float8[]", "row 0: 3 fields, expected 3 arrays, none"),
            ("SELECT ARRAY[1, 2], ARRAY[now()], ARRAY[1.0, 2.0]::float8[]", "row 0: arrays of 2, 1 and 2 elements"),
            ("SELECT ARRAY[1], ARRAY[now()]", "row 0: 2 fields")):
        with pytest.raises(ValueError, match=says):
            parse_copy_grouped(copied(query))
    with pytest.raises(ValueError, match="not a binary COPY"):
        parse_copy_grouped(b"PGCOPY?" + good[7:])
