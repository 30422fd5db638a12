"""Against PostgreSQL: a backtest reads stored history forward in spans, each sample once, and finds what
cycles reading their own windows find, over history that is part compressed chunks and part rows
(service/detection/replay.py)."""

from __future__ import annotations

import io
import threading
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

import service.telemetry.store as sample_store
from service.detection.replay import HistoryReader, read_span
from service.detection.service import backtest, load_fabric, load_series
from service.detection.state import Config
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry.compress import run_compression
from service.telemetry.service import import_prometheus, ingest_samples
from simulator.generate import BlockText, write_frame
from simulator.scenarios import Scenario
from simulator.telemetry import frame_samples, make_sim, resolve_inventory, timeline
from tests.detection.test_live import SPEC, STEP, T0

START = int(T0 * 1000)
MINUTES = 75


def _findings(fs: list) -> list[dict]:
    return [f.to_dict() for f in fs]


@pytest.fixture()
def history(db: Engine) -> Engine:
    """75 minutes of the small faulty fabric, imported then polled; its first hour compressed into chunks,
    the rest rows."""
    _imported_then_polled(db, 40, MINUTES)
    run = run_compression(db, now=datetime.fromtimestamp(T0, UTC) + timedelta(hours=2), hot_s=3600)
    assert run.complete and run.samples > 0
    return db


def test_backtest_streams_history_once_and_finds_what_per_window_reads_find(
        history: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """The per-window path reads each cycle's window with its own query, as live cycles do (test_live.py
    checks live cycles against a backtest over rows); here the history is mostly chunks."""
    cfg = Config()
    times = list(range(START + 30 * 60_000, START + MINUTES * 60_000 + 1, 60_000))
    reads: list[tuple[datetime, datetime, int]] = []

    def spy(real):  # type: ignore[no-untyped-def]
        def read(conn, lo, hi, *args):  # type: ignore[no-untyped-def]
            got = real(conn, lo, hi, *args)
            reads.append((lo, hi, len(got)))
            return got
        return read

    monkeypatch.setattr(sample_store, "read_samples", spy(sample_store.read_samples))  # a cycle's window
    monkeypatch.setattr("service.detection.replay.read_span", spy(read_span))  # a span of history
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


def test_history_reader_refuses_to_go_back_and_a_bad_span(db: Engine) -> None:
    _imported_then_polled(db, 12, 20)
    with db.connect() as conn:
        fabric = load_fabric(conn)
        sx = load_series(conn, fabric)
        with pytest.raises(ValueError, match="span must be positive"):
            HistoryReader(conn, fabric, 0)
        reader = HistoryReader(conn, fabric, 10 * 60_000)
        got, _ = reader.read(START, START + 20 * 60_000, sx)
        assert got and all(len(e) == len(ts) for e, ts, _ in got.values())
        with pytest.raises(ValueError, match="go forward"):
            reader.read(START + 5 * 60_000, START + 30 * 60_000, sx)


def _imported_then_polled(db: Engine, imported_min: int, minutes: int) -> None:
    """The faulty fabric's first minutes imported as Prometheus text (import blocks), the rest ingested
    poll by poll (rows)."""
    sc = Scenario.model_validate({"name": "t", **SPEC})
    inv = resolve_inventory(sc.inventory_source())
    with Session(db) as s:
        upsert_inventory(session=s, inventory=Inventory.model_validate(inv))
        s.commit()
    sim = make_sim(inv, sc, T0)
    texts = {b.metric: BlockText(b, sim.m) for b in sim.blocks}
    buf, polled = io.StringIO(), []
    for t in timeline(T0, T0 + minutes * 60, STEP):
        frame = sim.step(t, STEP)
        if t < T0 + imported_min * 60:
            write_frame(sim, texts, frame, buf)
        else:
            polled += list(frame_samples(sim, frame))
    import_prometheus(engine=db, chunks=[buf.getvalue().encode()], source="history")
    ingest_samples(engine=db, samples=polled)


def _same(a: sample_store.Samples, b: sample_store.Samples) -> bool:
    return (np.array_equal(a.sid, b.sid) and np.array_equal(a.ts_us, b.ts_us)
            and np.array_equal(a.value, b.value))


def test_span_reads_equal_the_store_reader_over_blocks_rows_and_chunks(db: Engine) -> None:
    _imported_then_polled(db, 12, 20)
    t0 = datetime.fromtimestamp(T0, UTC)
    ranges = [(t0 - timedelta(days=1), t0 + timedelta(days=1)),                      # everything: blocks whole
              (t0 + timedelta(minutes=5, seconds=30), t0 + timedelta(minutes=15)),  # a block cut, and rows
              (t0 + timedelta(minutes=2), t0 + timedelta(minutes=8)),               # inside the blocks
              (t0 + timedelta(minutes=15), t0 + timedelta(minutes=15)),             # one instant
              (t0 + timedelta(hours=3), t0 + timedelta(hours=4))]                   # nothing
    with db.connect() as conn:
        blocks = conn.execute(text("SELECT count(*) FROM sample_blocks")).scalar_one()
        assert blocks > 0 and conn.execute(text("SELECT count(*) FROM sample_rows")).scalar_one() > 0
        for lo, hi in ranges:
            want = sample_store.read_samples(conn, lo, hi)
            assert _same(read_span(conn, lo, hi), want), (lo, hi)
        assert len(read_span(conn, *ranges[0])) > len(read_span(conn, *ranges[1])) > 0
    run_compression(db, now=t0 + timedelta(hours=2), hot_s=3600)  # blocks and rows: chunks
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_chunks")).scalar_one() > 0
        for lo, hi in ranges:
            assert _same(read_span(conn, lo, hi), sample_store.read_samples(conn, lo, hi)), (lo, hi)


def _batches_equal(a: dict, b: dict) -> bool:
    return a.keys() == b.keys() and all(all(np.array_equal(x, y) for x, y in zip(a[k], b[k], strict=True))
                                        for k in a)


def test_reading_ahead_hands_out_what_reading_in_turn_does_and_stops_with_the_reader(db: Engine) -> None:
    """With an engine, spans are read on their own connection in a background thread, one ahead of the
    caller; the slices handed out are the same, also when the caller jumps past the span read ahead."""
    _imported_then_polled(db, 12, 20)
    until = START + 20 * 60_000
    # (lo, hi] ranges: cycles a minute apart, then a jump over two 3-minute spans, then to the end
    ranges = [(START + i * 60_000, START + (i + 1) * 60_000) for i in range(5)]
    ranges += [(START + 11 * 60_000, START + 12 * 60_000), (START + 12 * 60_000, until)]
    threads: list[str] = []

    def spy(conn, lo, hi):  # type: ignore[no-untyped-def]
        threads.append(threading.current_thread().name)
        return read_span(conn, lo, hi)

    with db.connect() as conn:
        fabric = load_fabric(conn)
        sx = load_series(conn, fabric)
        in_turn = HistoryReader(conn, fabric, 3 * 60_000, until)
        want = [in_turn.read(lo, hi, sx)[0] for lo, hi in ranges]
        with pytest.MonkeyPatch.context() as mp:
            mp.setattr("service.detection.replay.read_span", spy)
            with HistoryReader(conn, fabric, 3 * 60_000, until, read_ahead=db) as ahead:
                got = [ahead.read(lo, hi, sx)[0] for lo, hi in ranges]
                assert ahead.samples_read == in_turn.samples_read > 0
    assert sum(len(ts) for b in want for _, ts, _ in b.values()) > 0
    assert all(_batches_equal(w, g) for w, g in zip(want, got, strict=True))
    assert threads and all(name.startswith("history-read-ahead") for name in threads)
    assert not [t for t in threading.enumerate() if t.name.startswith("history-read-ahead")]  # closed


def test_a_backtest_that_fails_midway_stops_reading_ahead(history: Engine) -> None:
    def boom(at_ms: int, _: list) -> None:
        if at_ms >= START + 40 * 60_000:
            raise RuntimeError("stop here")

    with pytest.raises(RuntimeError, match="stop here"):
        backtest(history, START + 30 * 60_000, START + MINUTES * 60_000, 60_000, span_ms=5 * 60_000, on_cycle=boom)
    assert not [t for t in threading.enumerate() if t.name.startswith("history-read-ahead")]
