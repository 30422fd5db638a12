"""Rollups against raw samples: gauges, counters with a reset and a 32-bit wrap, incremental runs,
long-range /series served from rollups, and retention."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from service.telemetry.counters import increase
from service.telemetry.rollups import (
    INCREASE_SQL,
    L1H,
    L5M,
    compute_chunk,
    drop_expired,
    ensure_partitions,
    existing_partitions,
    run_rollups,
)
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples, query_series
from tests.factories import add_hosts

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)  # a Monday, bucket-aligned
T0_MS = int(T0.timestamp() * 1000)
STEP_MS = 10_000
WRAP = 1 << 32


def _counter_values(n: int, rng: random.Random) -> list[float]:
    """A 32-bit counter that wraps once and later resets (a reboot) on a step across an hour boundary."""
    vals, v = [], float(WRAP - 5_000_000_000 // 10)
    for i in range(n):
        # At n // 3 a reset (reboot): far below, not a plausible wrap; before it, one wrap on the way up.
        v = float(rng.randrange(1000)) if i == n // 3 else (v + rng.randrange(1_000_000, 9_000_000)) % WRAP
        vals.append(v)
    return vals


def _ingest(db: Engine, ts_ms: list[int], counter: list[float], gauge: list[float]) -> None:
    samples = []
    for t, c, g in zip(ts_ms, counter, gauge, strict=True):
        samples.append(Sample("port_rx_bytes_total", c, t, "h-000", "eth0", counter_bits=32))
        samples.append(Sample("optic_temperature_celsius", g, t, "h-000", "eth0"))
    ingest_samples(engine=db, samples=samples)


def _expected(ts_ms: list[int], counter: list[float], gauge: list[float], width_s: int
              ) -> tuple[dict[int, tuple[float, float]], dict[int, tuple[float, float, float, float, int]]]:
    """Per bucket: (increase, covered s) from counters.increase, and (min, max, avg, last, n) of the gauge."""
    w = width_s * 1000
    inc: dict[int, tuple[float, float]] = {}
    for i in range(1, len(ts_ms)):
        b = ts_ms[i] - ts_ms[i] % w
        d = increase(counter[i - 1], counter[i], bits=32)
        assert d is not None
        a, c = inc.get(b, (0.0, 0.0))
        inc[b] = (a + d, c + (ts_ms[i] - ts_ms[i - 1]) / 1000)
    g: dict[int, list[float]] = {}
    for t, v in zip(ts_ms, gauge, strict=True):
        g.setdefault(t - t % w, []).append(v)
    return inc, {b: (min(v), max(v), sum(v) / len(v), v[-1], len(v)) for b, v in g.items()}


def _rows(db: Engine, table: str) -> dict[tuple[str, int], tuple]:
    with db.connect() as conn:
        rows = conn.execute(text(
            f"SELECT s.metric, (extract(epoch FROM r.bucket) * 1000)::bigint, r.n, r.min, r.max, r.avg, r.last, "
            f"r.increase, r.covered_s FROM {table} r JOIN series s ON s.id = r.series_id")).all()
    return {(r[0], r[1]): tuple(r[2:]) for r in rows}


def test_increase_sql_is_counters_increase(db: Engine) -> None:
    cases = [(10.0, 15.0, None, False), (10.0, 3.0, None, False), (WRAP - 10.0, 5.0, 32, False),
             (WRAP - 10.0, 5.0, 64, False), (3e9, 1e9, 32, False), (100.0, WRAP - 1.0, 32, True),
             (100.0, 50.0, 32, True), (5.0, 5.0, 32, False), (2.0**64 - 100, 50.0, 64, False),
             (0.0, 2.0**64 - 1, 64, True), (WRAP / 2, 0.0, 32, False)]
    expr = INCREASE_SQL.format(p="p", c="c", b="b", s="s")
    with db.connect() as conn:
        for p, c, b, s in cases:
            got = conn.execute(text(f"SELECT {expr} FROM (SELECT CAST(:p AS float8) p, CAST(:c AS float8) c, "
                                    f"CAST(:b AS smallint) b, CAST(:s AS bool) s) x"),
                               {"p": p, "c": c, "b": b, "s": s}).scalar_one()
            assert got == increase(p, c, bits=b, saturating=s), (p, c, b, s)


def test_rollups_equal_raw_incremental_and_idempotent(db: Engine) -> None:
    add_hosts(db, 1, ports=1)
    rng = random.Random(3)
    n = 3 * 360  # three hours of 10-second samples
    ts = [T0_MS + 5_000 + i * STEP_MS for i in range(n)]  # off the bucket grid: steps straddle boundaries
    counter = _counter_values(n, rng)
    gauge = [round(rng.uniform(30, 70), 2) for _ in range(n)]
    assert any(b < a and a - b > WRAP / 2 for a, b in zip(counter, counter[1:], strict=False))  # a wrap
    _ingest(db, ts[:720], counter[:720], gauge[:720])  # two hours first

    now = T0 + timedelta(hours=2, seconds=30)  # the last bucket closes at 2:00 + lag 60 s: not yet
    runs = run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)
    assert runs[0].done_until == T0 + timedelta(hours=1, minutes=55)
    assert runs[1].done_until == T0 + timedelta(hours=1)
    again = run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)
    assert [r.chunks for r in again] == [0, 0] and [r.rows for r in again] == [0, 0]

    # A later run picks up only the new closed buckets, and recomputing a range changes nothing.
    before = _rows(db, "rollup_5m")
    _ingest(db, ts[720:], counter[720:], gauge[720:])
    end = T0 + timedelta(hours=3, minutes=5)
    later = run_rollups(db, now=end, lag_s=60, max_gap_s=900, max_chunks=100)
    assert later[0].rows == 2 * 13 and later[1].rows == 2 * 2  # 1:55..3:00 for 2 series; hours 1 and 2
    after = _rows(db, "rollup_5m")
    assert {k: v for k, v in after.items() if k in before} == before
    with db.begin() as conn:
        assert compute_chunk(conn, L5M, T0, T0 + timedelta(hours=3), max_gap_s=900) == 0
        assert compute_chunk(conn, L1H, T0, T0 + timedelta(hours=3), max_gap_s=900) == 0

    for level, table in ((L5M, "rollup_5m"), (L1H, "rollup_1h")):
        inc, gau = _expected(ts, counter, gauge, level.bucket_s)
        got = _rows(db, table)
        assert {b for m, b in got if m == "port_rx_bytes_total"} == set(gau)
        for b, (mn, mx, avg, last, cnt) in gau.items():
            g = got[("optic_temperature_celsius", b)]
            assert g[:2] == (cnt, mn) and g[2] == mx and g[3] == pytest.approx(avg) and g[4] == last
            assert g[5] is None and g[6] is None
            c = got[("port_rx_bytes_total", b)]
            if b == T0_MS:  # the first bucket has no step before its first sample
                assert c[5] == pytest.approx(inc[b][0]) and c[6] == pytest.approx(inc[b][1])
            else:
                assert (c[5], c[6]) == pytest.approx(inc[b])

    # /series over a medium range: rates from rollups equal rates from raw over the same buckets.
    with db.connect() as conn:
        from_raw = query_series(conn=conn, metric="port_rx_bytes_total", start=T0, end=end, step_s=300,
                                level_after_s=(1e9, 1e9))[0].points
        from_rollups = query_series(conn=conn, metric="port_rx_bytes_total", start=T0, end=end, step_s=300,
                                    level_after_s=(3600, 1e9))[0].points
        gauge_raw = query_series(conn=conn, metric="optic_temperature_celsius", start=T0, end=end, step_s=3600,
                                 level_after_s=(1e9, 1e9))[0].points
        gauge_1h = query_series(conn=conn, metric="optic_temperature_celsius", start=T0, end=end, step_s=3600,
                                level_after_s=(60, 3600))[0].points
    assert [b for b, _ in from_rollups] == [b for b, _ in from_raw]
    assert [v for _, v in from_rollups] == pytest.approx([v for _, v in from_raw], rel=1e-12)
    assert gauge_1h == [(b, pytest.approx(v)) for b, v in gauge_raw]


def test_thirty_days_served_from_rollups(db: Engine, db_url: str) -> None:
    add_hosts(db, 1, ports=1)
    rng = random.Random(5)
    start = T0 - timedelta(days=31)
    step = 60_000
    ts = [int(start.timestamp() * 1000) + i * step for i in range(31 * 1440)]
    counter = _counter_values(len(ts), rng)
    gauge = [round(rng.uniform(30, 70), 2) for _ in ts]
    _ingest(db, ts, counter, gauge)
    now = T0 + timedelta(minutes=10)
    run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=10_000)

    client = TestClient(create_app(load_settings(auth_required=False, database_url=db_url)))
    window = {"metric": "port_rx_bytes_total", "start": (T0 - timedelta(days=30)).isoformat(),
              "end": T0.isoformat()}
    got = client.get("/api/v1/series", params=window).json()["series"][0]
    inc, _ = _expected(ts, counter, gauge, 3600)
    lo_ms = int((T0 - timedelta(days=30)).timestamp() * 1000)
    want = [[b, a / c] for b, (a, c) in sorted(inc.items()) if lo_ms <= b < T0_MS]
    assert len(got["points"]) == 720 and got["unit"] == "1/s"
    assert [p[0] for p in got["points"]] == [w[0] for w in want]
    assert [p[1] for p in got["points"]] == pytest.approx([w[1] for w in want], rel=1e-12)

    # Probe: with the raw samples gone, the same answer comes back, so it came from the rollups.
    with db.begin() as conn:
        conn.execute(text("TRUNCATE sample_rows, sample_blocks"))
        plan = "\n".join(conn.execute(text(
            "EXPLAIN SELECT * FROM rollup_1h WHERE series_id = ANY(ARRAY[1]) AND bucket >= :lo AND bucket < :hi"),
            {"lo": T0 - timedelta(days=30), "hi": T0}).scalars())
    assert "rollup_1h_p" in plan
    assert client.get("/api/v1/series", params=window).json()["series"][0] == got


def test_retention_drops_expired_rollup_partitions(db: Engine) -> None:
    today = date(2026, 11, 30)
    with db.begin() as conn:
        for lv in (L5M, L1H):
            for name in existing_partitions(conn, lv).values():
                conn.execute(text(f"DROP TABLE {name}"))
        ensure_partitions(conn, L5M, datetime(2026, 8, 29, tzinfo=UTC), datetime(2026, 9, 3, tzinfo=UTC))
        ensure_partitions(conn, L1H, datetime(2025, 10, 1, tzinfo=UTC), datetime(2025, 11, 10, tzinfo=UTC))
        conn.execute(text(
            "INSERT INTO rollup_5m SELECT 1, b, 1, 0, 0, 0, 0, b, b, NULL, NULL FROM generate_series("
            "'2026-08-29'::timestamptz, '2026-09-02 23:55'::timestamptz, '5 min') b"))
        assert len(existing_partitions(conn, L5M)) == 5 and len(existing_partitions(conn, L1H)) == 7
        # 90 days before 2026-11-30 is 2026-09-01: the 5m days 08-29..08-31 go, 09-01 and 09-02 stay.
        dropped = drop_expired(conn, L5M, today=today, retention_days=90)
        assert dropped == ["rollup_5m_p20260829", "rollup_5m_p20260830", "rollup_5m_p20260831"]
        assert conn.execute(text("SELECT min(bucket)::date FROM rollup_5m")).scalar_one() == date(2026, 9, 1)
        # 400 days before is 2025-10-26: weeks that end by then go, the week holding it stays.
        gone = drop_expired(conn, L1H, today=today, retention_days=400)
        left = sorted(existing_partitions(conn, L1H))
        assert gone and all(d + timedelta(days=7) <= date(2025, 10, 26) for d in
                            [datetime.strptime(n[-8:], "%Y%m%d").date() for n in gone])
        assert left[0] <= date(2025, 10, 26) < left[0] + timedelta(days=7)
