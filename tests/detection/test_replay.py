"""Against PostgreSQL: a backtest reads stored history forward in spans, each sample once, and finds what
cycles reading their own windows find, over history that is part compressed chunks and part rows
(service/detection/replay.py)."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

import service.telemetry.store as sample_store
from service.detection.replay import HistoryReader
from service.detection.service import backtest, load_fabric, load_series
from service.detection.state import Config
from service.telemetry.compress import run_compression
from tests.detection.test_live import SPEC, T0, _load

START = int(T0 * 1000)
MINUTES = 75


def _findings(fs: list) -> list[dict]:
    return [f.to_dict() for f in fs]


@pytest.fixture()
def history(db: Engine) -> Engine:
    """75 minutes of the small faulty fabric; its first hour compressed into chunks, the rest rows."""
    _load(db, SPEC, MINUTES)
    run = run_compression(db, now=datetime.fromtimestamp(T0, UTC) + timedelta(hours=2), hot_s=3600)
    assert run.complete and run.samples > 0
    return db


def test_backtest_streams_history_once_and_finds_what_per_window_reads_find(
        history: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-window path reads each cycle's window with its own query, as live cycles do (test_live.py
    checks live cycles against a backtest over rows); here the history is mostly chunks."""
    cfg = Config()
    times = list(range(START + 30 * 60_000, START + MINUTES * 60_000 + 1, 60_000))
    real = sample_store.read_samples
    reads: list[tuple[datetime, datetime, int]] = []

    def spy(conn, lo, hi, series_ids=None):  # type: ignore[no-untyped-def]
        got = real(conn, lo, hi, series_ids)
        reads.append((lo, hi, len(got)))
        return got

    monkeypatch.setattr(sample_store, "read_samples", spy)
    # the default span (a UTC day), and 7-minute spans whose edges fall between and on cycle times
    day = backtest(history, times[0], times[-1], 60_000, config=cfg)
    day_reads, reads[:] = list(reads), []
    short = backtest(history, times[0], times[-1], 60_000, config=cfg, span_ms=7 * 60_000)
    short_reads, reads[:] = list(reads), []
    per_window = backtest(history, times[0], times[-1], 60_000, config=cfg, span_ms=None)
    assert any(f.state == "firing" for f in per_window)  # the faults fire: the comparison compares something
    assert _findings(day) == _findings(per_window)
    assert _findings(short) == _findings(per_window)

    # per window: a query per cycle; streamed: one per span, and together they read each stored sample once
    assert len(reads) == len(times)
    assert len(day_reads) == 1
    first = datetime.fromtimestamp((times[0] - cfg.lateness_ms - cfg.initial_lookback_ms) / 1000, UTC)
    last = datetime.fromtimestamp((times[-1] - cfg.lateness_ms) / 1000, UTC)
    with history.connect() as conn:
        stored = len(sample_store.read_samples(conn, first + timedelta(milliseconds=1), last))
    assert stored > 0 and day_reads[0][2] == stored
    assert len(short_reads) > 5
    for (_, hi, _), (lo, _, _) in zip(short_reads, short_reads[1:], strict=False):
        assert lo - hi == timedelta(microseconds=1)  # spans abut: nothing read twice, nothing skipped
    assert short_reads[0][0] == first + timedelta(milliseconds=1) and short_reads[-1][1] == last
    assert sum(n for *_, n in short_reads) == stored


def test_history_reader_refuses_to_go_back_and_a_bad_span(history: Engine) -> None:
    with history.connect() as conn:
        fabric = load_fabric(conn)
        sx = load_series(conn, fabric)
        with pytest.raises(ValueError, match="span must be positive"):
            HistoryReader(conn, fabric, 0)
        reader = HistoryReader(conn, fabric, 10 * 60_000)
        got, _ = reader.read(START, START + 20 * 60_000, sx)
        assert got and all(len(e) == len(ts) for e, ts, _ in got.values())
        with pytest.raises(ValueError, match="go forward"):
            reader.read(START + 5 * 60_000, START + 30 * 60_000, sx)
