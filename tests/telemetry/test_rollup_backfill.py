"""History written behind the rollup watermark gets its rollups: an import (blocks for new series, rows
for existing ones), a late import into hours already rolled up, and marks re-made while a run computes."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Engine, make_url, text

from service.telemetry.counters import increase
from service.telemetry.rollups import L1H, L5M, LevelRun, _unmark, run_backfill, run_rollups
from service.telemetry.samples import Sample
from service.telemetry.service import import_prometheus, ingest_samples
from tests.factories import add_hosts

T0 = datetime(2026, 11, 2, 0, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
STEP_MS = 10_000
METRICS = ("port_rx_bytes_total", "optic_temperature_celsius")


def _series(rng: random.Random, n: int) -> tuple[list[float], list[float]]:
    """A counter that resets once (a reboot) and a gauge."""
    counter, v = [], 1000.0
    for i in range(n):
        v = float(rng.randrange(100)) if i == n // 2 else v + rng.randrange(1_000, 9_000_000)
        counter.append(v)
    return counter, [round(rng.uniform(30, 70), 2) for _ in range(n)]


def _text(port: str, ts: list[int], counter: list[float], gauge: list[float]) -> bytes:
    lab = f'device="h-000",port="{port}"'
    return "".join(f"port_rx_bytes_total{{{lab}}} {c:.0f} {t}\noptic_temperature_celsius{{{lab}}} {g} {t}\n"
                   for t, c, g in zip(ts, counter, gauge, strict=True)).encode()


def _expected(points: dict[int, tuple[float, float]], width_s: int) -> dict[tuple[str, int], tuple]:
    """Per (metric, bucket ms): (n, min, max, avg, last, increase, covered s) from the raw samples."""
    w = width_s * 1000
    ts = sorted(points)
    out: dict[tuple[str, int], tuple] = {}
    for m, k in ((METRICS[0], 0), (METRICS[1], 1)):
        by: dict[int, list[int]] = {}
        for t in ts:
            by.setdefault(t - t % w, []).append(t)
        for b, times in by.items():
            vals = [points[t][k] for t in times]
            inc = cov = None
            if k == 0:
                steps = [(p, t) for p, t in zip(ts, ts[1:], strict=False) if b <= t < b + w]
                if steps:
                    inc = sum(increase(points[p][0], points[t][0]) or 0.0 for p, t in steps)
                    cov = sum((t - p) / 1000 for p, t in steps)
            out[(m, b)] = (len(vals), min(vals), max(vals), sum(vals) / len(vals), vals[-1], inc, cov)
    return out


def _rows(db: Engine, table: str, port: str) -> dict[tuple[str, int], tuple]:
    with db.connect() as conn:
        rows = conn.execute(text(
            f"SELECT s.metric, (extract(epoch FROM r.bucket) * 1000)::bigint, r.n, r.min, r.max, r.avg, r.last, "
            f"r.increase, r.covered_s FROM {table} r JOIN series s ON s.id = r.series_id "
            f"JOIN ports p ON p.id = s.port_id WHERE p.name = :p"), {"p": port}).all()
    return {(r[0], r[1]): tuple(r[2:]) for r in rows}


def _assert_rollups(db: Engine, port: str, points: dict[int, tuple[float, float]]) -> None:
    for level in (L5M, L1H):
        want = _expected(points, level.bucket_s)
        got = _rows(db, level.table, port)
        assert set(got) == set(want), (level.name, port)
        for key, w in want.items():
            assert got[key][:3] == w[:3] and got[key][4] == w[4], (level.name, port, key)
            assert got[key][3] == pytest.approx(w[3]), (level.name, port, key)
            assert (got[key][5] is None) == (w[5] is None), (level.name, port, key)
            if w[5] is not None:
                assert got[key][5:] == pytest.approx(w[5:], rel=1e-12), (level.name, port, key)


def _marks(db: Engine) -> list[tuple[str, datetime]]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(text("SELECT level, hour FROM rollup_backfill ORDER BY 1, 2"))]


def test_imported_history_and_a_late_import_get_their_rollups(db: Engine) -> None:
    add_hosts(db, 1, ports=2)
    rng = random.Random(7)
    n = 4 * 360  # four hours of 10-second samples, off the bucket grid
    ts = [T0_MS + 5_000 + i * STEP_MS for i in range(n)]
    c0, g0 = _series(rng, n)
    c1, g1 = _series(rng, n)
    # Live: eth0's fourth hour arrives first (rows) and is rolled up; the watermark passes it.
    ingest_samples(engine=db, samples=[s for t, c, g in zip(ts[1080:], c0[1080:], g0[1080:], strict=True)
                                       for s in (Sample(METRICS[0], c, t, "h-000", "eth0"),
                                                 Sample(METRICS[1], g, t, "h-000", "eth0"))])
    now = T0 + timedelta(hours=4, minutes=2)
    run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)
    with db.connect() as conn:
        assert conn.execute(text("SELECT done_until FROM rollup_watermarks WHERE level = '5m'")).scalar_one() \
            == T0 + timedelta(hours=4)

    # Then the history of the first three hours is imported: eth0's as rows (its series exist), eth1's as
    # blocks (new series); the import marks the hours it wrote and the hour after (its first step).
    report = import_prometheus(engine=db, chunks=[_text("eth0", ts[:1080], c0[:1080], g0[:1080]),
                                                  _text("eth1", ts[:1080], c1[:1080], g1[:1080])])
    assert report.written == 4 * 1080
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_blocks")).scalar_one() == 2
    assert _marks(db) == [("5m", T0 + timedelta(hours=h)) for h in range(4)]

    runs = run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)
    assert [(r.backfilled, r.backfill_left) for r in runs] == [(4, False), (4, False)]
    assert _marks(db) == []
    eth0 = {t: (c, g) for t, c, g in zip(ts, c0, g0, strict=True)}
    eth1 = {t: (c, g) for t, c, g in zip(ts[:1080], c1[:1080], g1[:1080], strict=True)}
    _assert_rollups(db, "eth0", eth0)  # the step from the imported 2:59:55 into live 3:00:05 included
    _assert_rollups(db, "eth1", eth1)
    with db.connect() as conn:
        revised = conn.execute(text("SELECT level, revised_at IS NOT NULL FROM rollup_watermarks ORDER BY 1")).all()
    assert [tuple(r) for r in revised] == [("1h", True), ("5m", True)]

    # A late import into the rolled-up hour 1: samples between the others, a gauge spike among them.
    late_ts = [T0_MS + 3600_000 + 7_500 + i * 60_000 for i in range(20)]
    late = {t: (eth1[t - 2_500][0] + 10.0, 99.5 if i == 7 else 50.0) for i, t in enumerate(late_ts)}
    import_prometheus(engine=db, chunks=[_text("eth1", late_ts, [v[0] for v in late.values()],
                                               [v[1] for v in late.values()])])
    assert _marks(db) == [("5m", T0 + timedelta(hours=1)), ("5m", T0 + timedelta(hours=2))]
    runs = run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)
    assert [r.backfilled for r in runs] == [2, 2] and _marks(db) == []
    _assert_rollups(db, "eth1", eth1 | late)
    assert _rows(db, "rollup_1h", "eth1")[(METRICS[1], T0_MS + 3600_000)][2] == 99.5
    _assert_rollups(db, "eth0", eth0)  # untouched


def test_history_before_the_first_rollup_run_and_hours_not_closed(db: Engine) -> None:
    """A fresh database fed only an import (blocks): no row for the forward run to start from; the marks
    are computed once their hours close."""
    add_hosts(db, 1, ports=1)
    rng = random.Random(9)
    n = 2 * 360
    ts = [T0_MS + 5_000 + i * STEP_MS for i in range(n)]
    c, g = _series(rng, n)
    import_prometheus(engine=db, chunks=[_text("eth0", ts, c, g)])
    assert [h for _, h in _marks(db)] == [T0 + timedelta(hours=h) for h in range(3)]
    # at 1:30 only hour 0 is closed
    runs = run_rollups(db, now=T0 + timedelta(hours=1, minutes=30), lag_s=60, max_gap_s=900, max_chunks=100)
    assert (runs[0].backfilled, runs[0].backfill_left, runs[1].backfilled) == (1, True, 1)
    runs = run_rollups(db, now=T0 + timedelta(hours=3, minutes=2), lag_s=60, max_gap_s=900, max_chunks=100)
    assert runs[0].backfilled == 2 and _marks(db) == []
    _assert_rollups(db, "eth0", {t: (a, b) for t, a, b in zip(ts, c, g, strict=True)})


def test_a_mark_made_while_its_hour_is_computed_stays(db: Engine) -> None:
    """A run deletes only the marks it read before computing: a writer that marks the hour meanwhile may
    have committed after the computation read the samples, so its mark stays for the next round."""
    add_hosts(db, 1, ports=1)
    import_prometheus(engine=db, chunks=[_text("eth0", [T0_MS + i * STEP_MS for i in range(10)], [1.0] * 10,
                                               [40.0] * 10)])
    with db.begin() as conn:
        ids = conn.execute(text("SELECT array_agg(id) FROM rollup_backfill WHERE hour = :h"), {"h": T0}).scalar_one()
        conn.execute(text("INSERT INTO rollup_backfill (level, hour) VALUES ('5m', :h)"), {"h": T0})  # a writer
        _unmark(conn, ids)
    assert _marks(db) == [("5m", T0), ("5m", T0 + timedelta(hours=1))]
    out = LevelRun("5m")
    run_backfill(db, L5M, out, now=T0 + timedelta(days=1), lag_s=60, max_gap_s=900, max_hours=10)
    assert out.backfilled == 2 and not out.backfill_left and [lv for lv, _ in _marks(db)] == ["1h", "1h"]


def test_concurrent_writers_of_late_samples_do_not_wait_for_each_other(db: Engine, db_url: str) -> None:
    """Two transactions marking the same hour, neither committed: the second does not block on the first."""
    import psycopg

    from service.telemetry.backfill import Hours

    add_hosts(db, 1, ports=1)
    with db.begin() as conn:
        conn.execute(text("INSERT INTO rollup_watermarks (level, done_until) VALUES ('5m', :t)"),
                     {"t": T0 + timedelta(days=1)})
    hours = Hours()
    hours.add_times(np.array([T0_MS + 60_000]))
    url = make_url(db_url).set(drivername="postgresql").render_as_string(hide_password=False)
    with psycopg.connect(url) as a, psycopg.connect(url) as b:
        assert hours.mark(a.cursor(), with_blocks=False) == 2  # the hour and the one after
        b.execute("SET lock_timeout = '2s'")
        assert hours.mark(b.cursor(), with_blocks=False) == 2  # would raise LockNotAvailable if it waited
        a.commit()
        b.commit()
    assert _marks(db) == [("5m", T0), ("5m", T0), ("5m", T0 + timedelta(hours=1)), ("5m", T0 + timedelta(hours=1))]


def test_a_late_live_sample_recomputes_its_buckets_once_a_run(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A sample later than the lag marks its hour from its own time: the run computes from its bucket to
    the watermark, not the whole hour, and an hour marked again during the run waits for the next run."""
    from service.telemetry import rollups

    add_hosts(db, 1, ports=1)
    ts = [T0_MS + 5_000 + i * STEP_MS for i in range(2 * 360)]
    ingest_samples(engine=db, samples=[Sample(METRICS[1], 40.0, t, "h-000", "eth0") for t in ts])
    now = T0 + timedelta(hours=1, minutes=52)
    run_rollups(db, now=now, lag_s=60, max_gap_s=900, max_chunks=100)  # the 5m watermark at 1:50
    late = T0_MS + 3600_000 + 40 * 60_000 + 2_500  # 1:40:02.5, after its bucket was rolled up
    ingest_samples(engine=db, samples=[Sample(METRICS[1], 95.0, late, "h-000", "eth0")])
    assert _marks(db) == [("5m", T0 + timedelta(hours=1))]

    seen: list[tuple[str, datetime, datetime]] = []
    real = rollups.compute_chunk

    def spy(conn, level, lo, hi, **kw):  # type: ignore[no-untyped-def]
        seen.append((level.name, lo, hi))
        if level is L5M and len(seen) == 1:  # a writer marks the hour again while it is computed
            conn.execute(text("INSERT INTO rollup_backfill (level, hour, lo) VALUES ('5m', :h, :h)"),
                         {"h": T0 + timedelta(hours=1)})
        return real(conn, level, lo, hi, **kw)

    monkeypatch.setattr(rollups, "compute_chunk", spy)
    out = LevelRun("5m")
    run_backfill(db, L5M, out, now=now, lag_s=60, max_gap_s=900, max_hours=10)
    assert seen == [("5m", T0 + timedelta(hours=1, minutes=40), T0 + timedelta(hours=1, minutes=50))]
    assert out.backfilled == 1 and out.backfill_left  # the new mark: next run
    with db.connect() as conn:
        assert conn.execute(text("SELECT max FROM rollup_5m WHERE bucket = :b"),
                            {"b": T0 + timedelta(hours=1, minutes=40)}).scalar_one() == 95.0
    run_backfill(db, L5M, LevelRun("5m"), now=now, lag_s=60, max_gap_s=900, max_hours=10)
    assert seen[1] == ("5m", T0 + timedelta(hours=1), T0 + timedelta(hours=1, minutes=50))
    assert [lv for lv, _ in _marks(db)] == ["1h", "1h"]
