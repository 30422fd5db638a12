"""Compression moves samples past the hot window into chunks; every reader still sees every sample;
late and duplicate samples are merged; a run killed with SIGKILL loses and duplicates nothing."""

from __future__ import annotations

import os
import signal
import subprocess
import sys
import time
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from celery import Celery
from sqlalchemy import Engine, text

from service.config import get_settings
from service.db import session_scope
from service.inventory.service import upsert_inventory
from service.kpis.service import Scope, fabric_kpis
from service.telemetry.compress import run_compression
from service.telemetry.partitions import ensure_partitions
from service.telemetry.rollups import L5M, compute_chunk, run_rollups
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples, query_series
from service.telemetry.store import newest_between, read_samples
from service.telemetry.tasks import compress_samples
from service.worker import configure
from simulator.scenarios import Scenario
from simulator.telemetry import simulate
from simulator.topology import TopologyParams, build_topology
from tests.factories import add_hosts
from tests.paths import REPO
from tests.telemetry import drop_day_partitions

T0 = datetime(2026, 11, 2, tzinfo=UTC)
END = T0 + timedelta(hours=36)  # 2026-11-03 12:00


@pytest.fixture(autouse=True)
def _only_our_days(db: Engine) -> None:
    """Compression closes every day before its watermark: other tests' (empty) days would be closed too."""
    with db.begin() as conn:
        drop_day_partitions(conn)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _seed(db: Engine, step_s: int = 60) -> None:
    """Two ports' byte counters and lane-0 rx power, every `step_s` from T0 to 30 minutes after END,
    through ingest."""
    add_hosts(db, 1, ports=2)
    rng = np.random.default_rng(3)
    n = int((END - T0).total_seconds() // step_s) + 30 * 60 // step_s
    samples = []
    for port in ("eth0", "eth1"):
        counter = np.cumsum(rng.integers(0, 10**9, n))
        for i in range(n):
            t = _ms(T0) + i * step_s * 1000
            samples.append(Sample("port_rx_bytes_total", float(counter[i]), t, "h-000", port))
            samples.append(Sample("optic_rx_power_dbm", round(-2 + rng.normal(0, 0.3), 2), t, "h-000", port, lane=0))
    ingest_samples(engine=db, samples=samples)


def _all(db: Engine) -> set[tuple[int, int, float]]:
    with db.connect() as conn:
        got = read_samples(conn, T0 - timedelta(days=1), END + timedelta(days=2))
    out = set(zip(got.sid.tolist(), got.ts_ms.tolist(), got.value.tolist(), strict=True))
    assert len(out) == len(got)  # one sample per (series, time)
    return out


def _count(db: Engine, sql: str) -> int:
    with db.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def test_rows_past_the_hot_window_become_chunks_and_read_the_same(db: Engine) -> None:
    _seed(db)
    before = _all(db)
    with db.connect() as conn:
        series_before = query_series(conn=conn, metric="port_rx_bytes_total", start=T0, end=END, raw=True)
        last_before = conn.execute(text("SELECT ts, value FROM last_samples(1, 2, :t)"), {"t": END}).all()
    rows_before = _count(db, "SELECT pg_total_relation_size('samples_p20261102')")

    run = run_compression(db, now=END + timedelta(hours=1, minutes=5), hot_s=3600)
    assert run.complete and run.done_until == END  # the cutoff: the last whole hour before now - 1 h
    assert run.samples == len([s for s in before if s[1] < _ms(END)]) and run.duplicates == 0
    assert run.days_closed == ["samples_p20261102"]
    # rows before the cutoff are gone, the day partition emptied; the hot hour stays rows
    assert _count(db, f"SELECT count(*) FROM sample_rows WHERE ts < '{END.isoformat()}'") == 0
    assert _count(db, "SELECT count(*) FROM sample_rows") == 4 * 30  # the half hour after END, 4 series
    assert _count(db, "SELECT pg_total_relation_size('samples_p20261102')") < rows_before
    # a whole day before the cutoff is one chunk per series, then one per hour
    assert _count(db, "SELECT count(*) FROM sample_chunks_p20261102") == 4
    assert _count(db, "SELECT count(*) FROM sample_chunks_p20261103") == 4 * 12
    assert _all(db) == before
    with db.connect() as conn:
        assert query_series(conn=conn, metric="port_rx_bytes_total", start=T0, end=END, raw=True) == series_before
        # the fleet and inventory views' SQL reads a silent series' newest readings from the chunk columns
        assert conn.execute(text("SELECT ts, value FROM last_samples(1, 2, :t)"), {"t": END}).all() == last_before
    # statistics and BRIN summaries written by the run itself (autovacuum may be off)
    assert _count(db, "SELECT reltuples FROM pg_class WHERE relname = 'sample_chunks_p20261103'") == 48
    assert run_compression(db, now=END + timedelta(hours=1, minutes=5)).samples == 0  # nothing left to do


def test_late_and_duplicate_samples_into_compressed_hours_are_merged(db: Engine) -> None:
    _seed(db)
    before = _all(db)
    run_compression(db, now=END + timedelta(hours=1), hot_s=3600)
    sid = 1
    dup_t, late_t, old_t = T0 + timedelta(hours=29), T0 + timedelta(hours=29, seconds=30), T0 + timedelta(hours=3,
                                                                                                           seconds=7)
    stored = next(v for s, t, v in before if s == sid and t == _ms(dup_t))
    report = ingest_samples(engine=db, samples=[
        Sample("port_rx_bytes_total", stored + 12345, _ms(dup_t), "h-000", "eth0"),  # same time, another value
        Sample("port_rx_bytes_total", stored + 1, _ms(late_t), "h-000", "eth0"),
        Sample("port_rx_bytes_total", 7.0, _ms(old_t), "h-000", "eth0")])
    assert report.written == 3  # chunks are not checked at ingest: merged later
    expected = before | {(sid, _ms(late_t), stored + 1), (sid, _ms(old_t), 7.0)}
    assert _all(db) == expected  # readers see the late ones at once, and the chunk's reading at dup_t

    # the closed day's late row is merged at the next run; today's once today closes
    run = run_compression(db, now=END + timedelta(hours=1, minutes=10), hot_s=3600)
    assert run.samples == 1 and run.remerged == 24 * 60 and run.days_closed == ["samples_p20261102"]
    assert _count(db, "SELECT count(*) FROM sample_rows WHERE ts < '2026-11-03'") == 0
    assert _count(db, "SELECT count(*) FROM sample_chunks_p20261103") == 4 * 12  # hourly until the day closes
    run = run_compression(db, now=datetime(2026, 11, 4, 1, 5, tzinfo=UTC), hot_s=3600)
    assert run.duplicates == 1 and run.days_closed == ["samples_p20261103"]
    # the closed day's hourly chunks are one per series now (late rows and all)
    assert run.compacted == 4 * 13 and _count(db, "SELECT count(*) FROM sample_chunks_p20261103") == 4  # 00-12:30
    assert _count(db, "SELECT count(*) FROM sample_rows") == 0
    assert _all(db) == expected
    # a series' chunks never overlap in time
    assert _count(db, """SELECT count(*) FROM sample_chunks a JOIN sample_chunks b ON a.series_id = b.series_id
                         AND a.first_ts < b.first_ts AND a.last_ts >= b.first_ts""") == 0


def test_empty_hours_cost_no_batches(db: Engine) -> None:
    """A fresh database's first run starts at its oldest day: the hours before the first sample (and
    gaps) are passed with one look each, not a transaction per series batch."""
    add_hosts(db, 1)
    first = T0 + timedelta(hours=20, minutes=10)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, _ms(first + timedelta(minutes=i)), "h-000", "eth0")
                                       for i in range(30)])
    run = run_compression(db, now=T0 + timedelta(hours=22), hot_s=0, batch_series=1)
    # 22 hours walked up to the cutoff; only the one with rows is moved (a batch per series id range)
    assert run.done_until == T0 + timedelta(hours=22) and run.periods == 22 and run.samples == 30
    assert run.batches == _count(db, "SELECT count(*) FROM series") + 1


def test_import_blocks_become_chunks(db: Engine) -> None:
    add_hosts(db, 1)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, _ms(T0), "h-000", "eth0")])
    with db.begin() as conn:
        conn.execute(text("INSERT INTO sample_blocks VALUES (1, :a, :b, ARRAY[CAST(:a AS timestamptz), "
                          "CAST(:m AS timestamptz), CAST(:b AS timestamptz)], ARRAY[1.0, 0.0, 1.0])"),
                     {"a": T0 + timedelta(hours=1), "m": T0 + timedelta(hours=2), "b": T0 + timedelta(hours=3)})
    before = _all(db)
    run = run_compression(db, now=T0 + timedelta(days=2), hot_s=3600)
    assert run.blocks == 3 and _count(db, "SELECT count(*) FROM sample_blocks") == 0
    assert _all(db) == before and len(before) == 4


def test_a_run_killed_mid_way_loses_and_duplicates_nothing(db: Engine, db_url: str) -> None:
    """SIGKILL a compression run in another process after some batches committed, then run again."""
    add_hosts(db, 5, ports=8)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, _ms(T0), f"h-{i:03d}", f"eth{p}")
                                       for i in range(5) for p in range(8)])
    with db.begin() as conn:
        ensure_partitions(conn, T0.date(), T0.date())
        conn.execute(text("INSERT INTO sample_rows SELECT s.id, CAST(:t0 AS timestamptz) + g * interval '30 s', "
                          "s.id * 1000 + g FROM series s, generate_series(1, 2879) g"), {"t0": T0})
    before = _all(db)
    code = ("import sys; from datetime import datetime; from service.db import get_engine; "
            "from service.telemetry.compress import run_compression; "
            "run_compression(get_engine(sys.argv[1]), now=datetime.fromisoformat(sys.argv[2]), batch_series=24)")
    now = (T0 + timedelta(days=1, hours=2)).isoformat()
    proc = subprocess.Popen([sys.executable, "-c", code, db_url, now], cwd=REPO, env={**os.environ})
    try:
        deadline = time.monotonic() + 60
        while _count(db, "SELECT count(*) FROM sample_chunks") < 5:  # 40 series, one per batch
            assert proc.poll() is None and time.monotonic() < deadline, "the run ended before it could be killed"
            time.sleep(0.02)
        proc.send_signal(signal.SIGKILL)
    finally:
        proc.wait(30)
    assert proc.returncode == -signal.SIGKILL
    half = _count(db, "SELECT count(*) FROM sample_chunks")
    assert 5 <= half < 40 and _all(db) == before  # committed batches are chunks, the rest still rows
    run = run_compression(db, now=datetime.fromisoformat(now), batch_series=24)
    assert run.complete and not run.busy  # the killed run's lock went with its session
    assert _count(db, "SELECT count(*) FROM sample_chunks") == 40
    assert _count(db, "SELECT count(*) FROM sample_rows") == 0
    assert _all(db) == before


def test_kpis_rollups_and_grafana_read_compressed_hours(db: Engine) -> None:
    """The SQL readers: KPIs and a redone 5-minute rollup decode the chunks of their range (the same
    figures as from rows); Grafana's samples_between stands in the 5-minute rollup for compressed time."""
    inv = build_topology(TopologyParams(shape="rail-optimized", hosts=4, pods=1, gpus_per_host=2, nics_per_host=2,
                                        hosts_per_leaf=4, spines=2, seed=3))
    with session_scope(db) as session:
        upsert_inventory(session=session, inventory=inv)
    start = T0.timestamp()
    ingest_samples(engine=db, samples=(s for batch in simulate(inv, Scenario.model_validate({"name": "k", "seed": 7}),
                                                             start=start, end=start + 3600, step=60) for s in batch))
    lo, hi = T0 + timedelta(minutes=5), T0 + timedelta(minutes=55)

    def figures() -> tuple[object, list[tuple[object, ...]]]:
        with db.begin() as conn:
            kpis = fabric_kpis(conn=conn, scope=Scope.LEAF, start=lo, end=hi, step_s=600)
            conn.execute(text("DELETE FROM rollup_5m"))
            compute_chunk(conn, L5M, T0, T0 + timedelta(hours=1), max_gap_s=900)
            rolled = [tuple(r) for r in conn.execute(text("SELECT * FROM rollup_5m ORDER BY series_id, bucket"))]
        return kpis, rolled

    kpis_rows, rolled_rows = figures()
    assert kpis_rows.utilization and len(rolled_rows) > 100
    assert run_compression(db, now=T0 + timedelta(hours=2, minutes=1)).chunks > 0
    assert _count(db, f"SELECT count(*) FROM sample_rows WHERE ts < '{T0 + timedelta(hours=1)}'") == 0
    assert figures() == (kpis_rows, rolled_rows)
    with db.connect() as conn:
        stand_ins = conn.execute(text("SELECT count(*) FROM samples_between(:lo, :hi)"), {"lo": T0, "hi": hi}).scalar()
        in_range = conn.execute(text("SELECT count(*) FROM rollup_5m WHERE last_ts <= :hi"), {"hi": hi}).scalar()
    assert stand_ins == in_range > 0


def test_hours_compressed_before_the_first_rollup_run_are_rolled_up(db: Engine) -> None:
    """Rollups that never ran (disabled, failing, or a store filled faster than its first run): compression
    is not held back by a watermark, so it compresses whole days before rollups start; their first run
    begins at the oldest day still holding rows, so without a mark those compressed days had no rollup."""
    _seed(db)
    with db.connect() as conn:  # what the 5-minute level holds for [T0, END) computed from rows, then undone
        compute_chunk(conn, L5M, T0, END, max_gap_s=900)
        expected = conn.execute(text("SELECT * FROM rollup_5m WHERE bucket < :e ORDER BY 1, 2"), {"e": END}).all()
        conn.rollback()
    assert len(expected) == 4 * 36 * 12
    now = END + timedelta(hours=1, minutes=5)
    assert run_compression(db, now=now, hot_s=3600).days_closed == ["samples_p20261102"]
    for _ in range(10):
        runs = run_rollups(db, now=now, max_chunks=48)
        if not any(r.backfill_left for r in runs):
            break
    with db.connect() as conn:
        got = conn.execute(text("SELECT * FROM rollup_5m WHERE bucket < :e ORDER BY 1, 2"), {"e": END}).all()
    assert got == expected


def test_the_beat_task_compresses_with_the_settings(db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    """`compress_samples` is on beat's schedule at FABRICWATCH_COMPRESS_INTERVAL_S and uses the hot window
    setting: with 0 s, everything before the current hour moves."""
    monkeypatch.setenv("FABRICWATCH_DATABASE_URL", db_url)
    monkeypatch.setenv("FABRICWATCH_COMPRESS_AFTER_S", "0")
    monkeypatch.setenv("FABRICWATCH_COMPRESS_INTERVAL_S", "120")
    app = configure(Celery("t"), get_settings())
    assert app.conf.beat_schedule["compress-samples"] == {"task": "fabricwatch.compress_samples", "schedule": 120.0}
    _seed(db)
    got = compress_samples.apply().get()
    assert got["complete"] and got["samples"] == len(_all(db)) and got["chunks"] > 0
    assert _count(db, "SELECT count(*) FROM sample_rows") == 0


def _newest(db: Engine, lo: datetime, hi: datetime) -> dict[str, tuple[datetime, float]]:
    with db.connect() as conn:
        sids = dict(conn.execute(text("SELECT s.id, p.name FROM series s JOIN ports p ON p.id = s.port_id "
                                      "WHERE s.metric = 'port_oper_up'")).all())
        got = newest_between(conn, lo, hi, list(sids))
    return {sids[sid]: (datetime.fromtimestamp(us / 1e6, UTC), v) for sid, (us, v) in got.items()}


def test_newest_between_reads_hot_rows_and_chunks_alike(db: Engine) -> None:
    """Each series' newest sample in a range (the drains' "down now"), before and after compression."""
    add_hosts(db, 1, ports=3)
    at = T0 + timedelta(hours=10)
    # eth0: up every minute for an hour but down at minute 40; eth1: one reading before the range; eth2: none
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0.0 if i == 40 else 1.0, _ms(at + timedelta(minutes=i)),
                                              "h-000", "eth0") for i in range(60)]
                   + [Sample("port_oper_up", 0.0, _ms(at - timedelta(hours=1)), "h-000", "eth1")])
    hi = at + timedelta(minutes=40)
    expected = {"eth0": (hi, 0.0)}
    assert _newest(db, at, hi) == expected
    assert _newest(db, at, hi + timedelta(seconds=59)) == expected  # the next reading is a minute later
    assert _newest(db, at - timedelta(hours=1), at - timedelta(hours=1)) == {"eth1": (at - timedelta(hours=1), 0.0)}

    run = run_compression(db, now=T0 + timedelta(days=2), hot_s=3600)
    assert run.samples == 61
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_rows")).scalar() == 0
    # a range that ends inside a chunk (its tail is after the range) reads the chunk's samples
    assert _newest(db, at, hi) == expected
    assert _newest(db, at, at + timedelta(hours=2)) == {"eth0": (at + timedelta(minutes=59), 1.0)}

    # a hot reading after the chunk is newer than any of the chunk's
    now = T0 + timedelta(days=2)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0.0, _ms(now), "h-000", "eth0")])
    assert _newest(db, at, now) == {"eth0": (now, 0.0)}
    assert _newest(db, now - timedelta(minutes=15), now) == {"eth0": (now, 0.0)}
