"""/series over rollups: the per-process cache of rollup rows before the watermark (service/telemetry/readcache.py)
never serves a row that changed: rollups moving on, a back-fill rewriting history, retention, a reset or
restore, a watermark moved back. Each case reads warm (through the cache) and cold (cache emptied) and
asserts both equal, and that the change did change the answer (so a stale cache would fail)."""

from __future__ import annotations

import random
from datetime import UTC, date, datetime, timedelta
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from service.telemetry.readcache import ROLLUPS
from service.telemetry.rollups import L1H, L5M, drop_expired, read_rollup, run_rollups
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples, query_series
from tests.factories import add_hosts

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
MIN_MS = 60_000
COUNTER, GAUGE = "port_rx_bytes_total", "optic_temperature_celsius"


def _ingest(db: Engine, minutes: range, seed: int = 1) -> None:
    """One counter and one gauge per port of h-000 (2 ports), a sample a minute."""
    rng = random.Random(seed)
    samples = []
    for p in range(2):
        v = 0.0
        for i in minutes:
            v += rng.randrange(10**6, 10**9)
            t = T0_MS + i * MIN_MS + 7_000
            samples.append(Sample(COUNTER, v + i * 10**9, t, "h-000", f"eth{p}"))
            samples.append(Sample(GAUGE, round(rng.uniform(30, 70), 2), t, "h-000", f"eth{p}"))
    ingest_samples(engine=db, samples=samples)


def _roll(db: Engine, until: datetime) -> None:
    run_rollups(db, now=until, lag_s=60, max_gap_s=900, max_chunks=1000)


def _series(db: Engine, metric: str = COUNTER, *, start: datetime = T0, end: datetime,
            step_s: float | None = None, after: tuple[float, float] = (3600, 1e9)) -> list[Any]:
    with db.connect() as conn:
        res = query_series(conn=conn, metric=metric, start=start, end=end, step_s=step_s, level_after_s=after)
    return [(r.device, r.port, r.points) for r in res]


def _warm_equals_cold(db: Engine, **kw: Any) -> list[Any]:
    warm = _series(db, **kw)
    ROLLUPS.clear()
    cold = _series(db, **kw)
    assert warm == cold
    return warm


@pytest.fixture()
def rolled(db: Engine) -> Engine:
    """Two days of minutes for 2 ports, rolled up to 47:00 (5m) and 47:00 (1h)."""
    ROLLUPS.clear()
    add_hosts(db, 1, ports=2)
    _ingest(db, range(0, 48 * 60 - 30))
    _roll(db, T0 + timedelta(hours=47, minutes=1, seconds=30))
    with db.connect() as conn:
        wm = conn.execute(text("SELECT done_until FROM rollup_watermarks WHERE level = '5m'")).scalar_one()
    assert wm == T0 + timedelta(hours=47)
    return db


def test_cached_reads_equal_the_rows_folded_one_by_one(rolled: Engine) -> None:
    """The cache and its fold give the very floats of adding each rollup row in order (the code before it),
    for both kinds, a step of one bucket and of many, and the 1h level followed by 5m rows and raw."""
    end = T0 + timedelta(hours=47, minutes=20)
    for metric in (COUNTER, GAUGE):
        for step, after in ((None, (3600, 1e9)), (3600.0, (3600, 1e9)), (3600.0, (60, 3600)), (900.0, (60, 1e9))):
            ROLLUPS.clear()
            reads = ROLLUPS.reads
            first = _series(rolled, metric, end=end, step_s=step, after=after)
            assert ROLLUPS.reads > reads
            reads = ROLLUPS.reads
            assert _series(rolled, metric, end=end, step_s=step, after=after) == first
            assert ROLLUPS.reads == reads  # served from the cache
            _assert_as_folded_row_by_row(rolled, metric, end, step, after, first)


def _assert_as_folded_row_by_row(db: Engine, metric: str, end: datetime, step_s: float | None,
                                 after: tuple[float, float], got: list[Any]) -> None:
    """The rollup part as the read path did it before the cache: rows one by one into cells."""
    from service.telemetry.service import _pick_level

    level = _pick_level(end - T0, step_s, after)
    assert level is not None
    width = level.bucket_s
    step_ms = int(max(width, -(-(step_s or width) // width) * width) * 1000)
    out = []
    with db.connect() as conn:
        found = conn.execute(text("SELECT s.id, p.name FROM series s JOIN ports p ON p.id = s.port_id "
                                  "WHERE s.metric = :m ORDER BY p.name"), {"m": metric}).all()
        wms = dict(conn.execute(text("SELECT level, done_until FROM rollup_watermarks")).all())
        for sid, port in found:
            acc: dict[int, list[float]] = {}
            lo = T0
            for lv in ((L1H, L5M) if level is L1H else (L5M,)):
                wm = wms[lv.name]
                for _, b_ms, n, avg, inc, cov in read_rollup(conn, lv, [sid], lo, min(wm, end)):
                    a, b = (avg * n, n) if metric == GAUGE else (inc, cov * 1000.0)
                    if metric == GAUGE or (inc is not None and cov):
                        cell = acc.setdefault(b_ms - b_ms % step_ms, [0.0, 0.0])
                        cell[0] += a
                        cell[1] += b
                lo = max(lo, wm)
            scale = 1000.0 if metric == COUNTER else 1.0
            rolled = [(b, a * scale / c) for b, (a, c) in sorted(acc.items()) if c]
            out.append((sid, port, rolled))
    lo_ms = int(wms[L5M.name].timestamp() * 1000)
    cut = lo_ms - lo_ms % step_ms  # cells before this one hold rollup rows only (after it the raw tail adds)
    assert len(got) == len(out) == 2
    for (_, port, rolled), (_, gport, points) in zip(out, got, strict=True):
        assert port == gport
        assert len([p for p in points if p[0] < cut]) > 20
        assert [p for p in points if p[0] < cut] == [p for p in rolled if p[0] < cut]  # the same floats


def test_rollups_moving_on_are_read_as_the_new_buckets_only(rolled: Engine) -> None:
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, end=end)
    _ingest(rolled, range(48 * 60 - 30, 50 * 60), seed=1)  # the same values continued
    _roll(rolled, T0 + timedelta(hours=49, minutes=1, seconds=30))
    reads = ROLLUPS.reads
    end2 = T0 + timedelta(hours=49, minutes=30)
    warm = _series(rolled, end=end2)
    assert ROLLUPS.reads == reads + 1  # one read of the buckets the watermark passed, for both ports
    ROLLUPS.clear()
    assert warm == _series(rolled, end=end2)
    # The buckets before the old watermark are unchanged and the new ones are there.
    for (_, _, old), (_, _, new) in zip(before, warm, strict=True):
        cut = T0_MS + 47 * 3_600_000
        assert [p for p in new if p[0] < cut] == [p for p in old if p[0] < cut]
        assert new[-1][0] > old[-1][0]


def test_a_back_fill_rewriting_rows_before_the_watermark_is_seen(rolled: Engine) -> None:
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, end=end)
    bucket = T0 + timedelta(hours=10)
    with rolled.begin() as conn:  # what run_backfill does: rows rewritten, revised_at moved, one transaction
        conn.execute(text("UPDATE rollup_5m SET increase = increase * 3 WHERE bucket = :b"), {"b": bucket})
        conn.execute(text("UPDATE rollup_watermarks SET revised_at = now() WHERE level = '5m'"))
    after = _warm_equals_cold(rolled, end=end)
    assert after != before
    b_ms = int(bucket.timestamp() * 1000)
    for (_, _, old), (_, _, new) in zip(before, after, strict=True):
        assert dict(new)[b_ms] == pytest.approx(3 * dict(old)[b_ms])


def test_a_late_sample_behind_the_watermark_is_seen_once_its_hour_is_rolled_up_again(rolled: Engine) -> None:
    """The real path: a late sample marks its hour (rollup_backfill), the rollup task computes it again."""
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, GAUGE, end=end)  # cached
    late = T0_MS + 10 * 3_600_000 + 37_000  # between two samples of 10:00; a gauge far off its neighbours
    ingest_samples(engine=rolled, samples=[Sample(GAUGE, 1000.0, late, "h-000", "eth0")])
    assert _series(rolled, GAUGE, end=end) == before  # not rolled up yet: rollups before the watermark as they were
    _roll(rolled, T0 + timedelta(hours=47, minutes=1, seconds=30))
    after = _warm_equals_cold(rolled, metric=GAUGE, end=end)
    b_ms = T0_MS + 10 * 3_600_000
    assert dict(before[0][2])[b_ms] < 70 < 150 < dict(after[0][2])[b_ms]  # 5 readings of 30..70 and 1000
    assert after[1] == before[1]  # the other port's series is untouched


def test_retention_dropping_a_partition_is_seen(rolled: Engine) -> None:
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, end=end)
    with rolled.begin() as conn:
        dropped = drop_expired(conn, L5M, today=date(2026, 11, 3) + timedelta(days=90), retention_days=90)
    assert "rollup_5m_p20261102" in dropped
    after = _warm_equals_cold(rolled, end=end)
    first_kept = T0_MS + 86_400_000
    for (_, _, old), (_, _, new) in zip(before, after, strict=True):
        assert old[0][0] < first_kept and new[0][0] == first_kept  # the dropped day is gone from the answer


def test_a_reset_and_new_data_under_the_same_ids_is_seen(rolled: Engine) -> None:
    """A TRUNCATE (the tests' reset; a restore gives new tables alike) and data again: the series get the
    same ids, the watermark the same value, and the cache must still not answer with the old rows."""
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, end=end)
    with rolled.begin() as conn:
        tables = conn.execute(text(
            "SELECT string_agg(format('%I', c.relname), ', ') FROM pg_class c JOIN pg_namespace n "
            "ON n.oid = c.relnamespace WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') "
            "AND NOT c.relispartition AND c.relname <> 'alembic_version'")).scalar_one()
        conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    add_hosts(rolled, 1, ports=2)
    _ingest(rolled, range(0, 48 * 60 - 30), seed=2)
    _roll(rolled, T0 + timedelta(hours=47, minutes=1, seconds=30))
    after = _warm_equals_cold(rolled, end=end)
    assert [p[:2] for p in after] == [p[:2] for p in before] and after != before


def test_a_watermark_moved_back_is_seen(rolled: Engine) -> None:
    """A rebuild: the watermark set back, the rows after it computed again (here: changed), the watermark
    forward again. A request while it is back must drop what it cached beyond it."""
    end = T0 + timedelta(hours=47, minutes=20)
    before = _series(rolled, end=end)  # cached up to 47:00
    back = T0 + timedelta(hours=40)
    with rolled.begin() as conn:
        conn.execute(text("UPDATE rollup_watermarks SET done_until = :t WHERE level = '5m'"), {"t": back})
    during = _series(rolled, end=end)
    for (_, _, old), (_, _, new) in zip(before, during, strict=True):  # after it, from raw samples (not the rows)
        assert [t for t, _ in new] == [t for t, _ in old]
        assert [v for _, v in new] == pytest.approx([v for _, v in old], rel=1e-9)
    with rolled.begin() as conn:
        conn.execute(text("UPDATE rollup_5m SET increase = increase * 5 WHERE bucket >= :t"), {"t": back})
        conn.execute(text("UPDATE rollup_watermarks SET done_until = :t WHERE level = '5m'"),
                     {"t": T0 + timedelta(hours=47)})
    moved = _warm_equals_cold(rolled, end=end)
    assert moved != before


def test_the_api_serves_the_cache_and_sees_a_back_fill(rolled: Engine, db_url: str) -> None:
    client = TestClient(create_app(load_settings(database_url=db_url, auth_required=False)))
    params = {"metric": COUNTER, "device": "h-000", "port": "eth1",
              "start": T0.isoformat(), "end": (T0 + timedelta(hours=47, minutes=20)).isoformat()}
    first = client.get("/api/v1/series", params=params)
    assert first.status_code == 200
    reads = ROLLUPS.reads
    assert client.get("/api/v1/series", params=params).json() == first.json()
    assert ROLLUPS.reads == reads
    with rolled.begin() as conn:
        conn.execute(text("UPDATE rollup_5m SET increase = 0 WHERE bucket = :b"), {"b": T0 + timedelta(hours=3)})
        conn.execute(text("UPDATE rollup_watermarks SET revised_at = now() WHERE level = '5m'"))
    points = dict((t, v) for t, v in client.get("/api/v1/series", params=params).json()["series"][0]["points"])
    assert points[T0_MS + 3 * 3_600_000] == 0.0 != dict(first.json()["series"][0]["points"])[T0_MS + 3 * 3_600_000]
