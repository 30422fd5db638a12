"""Decoded chunks come out sorted by (series, time) without sorting every sample when they are already in
order (service/telemetry/store.py `_decoded`, `merge`): the same samples, in the same order, as a sort of
everything, whatever order the server sent the chunks in, with chunks cut at the range's ends, and with
chunks that overlap (then every sample is sorted, as before)."""

from __future__ import annotations

import random
from datetime import UTC, datetime, timedelta

import numpy as np
import pytest

from service.telemetry.chunk_codec import decode, encode
from service.telemetry.store import Samples, _decoded, _us, merge

T0 = datetime(2026, 11, 2, tzinfo=UTC)


def _chunk(first_s: int, n: int, step_s: int = 60, seed: int = 0) -> bytes:
    ts = _us(T0) + (first_s + step_s * np.arange(n, dtype=np.int64)) * 1_000_000
    return encode(ts, np.random.default_rng(seed).normal(size=n))


def _sorted_everything(chunks: list[tuple[int, bytes]], lo: datetime, hi: datetime) -> Samples:
    """The reference: every sample as the chunks came, kept in [lo, hi], then sorted (stable) by series, time."""
    parts = [(sid, *decode(data)) for sid, data in chunks]
    out = Samples(np.concatenate([np.full(len(t), s, np.int64) for s, t, _ in parts]),
                  np.concatenate([t for _, t, _ in parts]), np.concatenate([v for _, _, v in parts]))
    out = out.take((out.ts_us >= _us(lo)) & (out.ts_us <= _us(hi)))
    return out.take(np.lexsort((out.ts_us, out.sid)))


def _same(a: Samples, b: Samples) -> None:
    assert np.array_equal(a.sid, b.sid) and np.array_equal(a.ts_us, b.ts_us)
    assert np.array_equal(a.value.view(np.int64), b.value.view(np.int64))


@pytest.mark.parametrize("seed", range(5))
def test_chunks_in_any_order_read_as_a_sort_of_every_sample(seed: int) -> None:
    rng = random.Random(seed)
    # 30 series, each its day in 1 to 4 disjoint chunks (hours compressed apart, then a day's merge)
    chunks = []
    for sid in range(1, 31):
        cuts = sorted(rng.sample(range(1, 1440), rng.randint(0, 3)))
        for a, b in zip([0, *cuts], [*cuts, 1440], strict=True):
            chunks.append((sid, _chunk(a * 60, b - a, seed=sid * 10_000 + a)))
    rng.shuffle(chunks)
    for lo, hi in ((T0, T0 + timedelta(days=1)), (T0 + timedelta(hours=3, seconds=30), T0 + timedelta(hours=9))):
        got = _decoded(chunks, lo, hi)
        _same(got, _sorted_everything(chunks, lo, hi))
        assert got.strictly_sorted() and len(got)
        _same(merge(got, Samples.empty())[0], got)
        _same(merge(Samples.empty(), got)[0], got)


def test_overlapping_chunks_are_sorted_and_deduplicated_as_before() -> None:
    # a series whose two chunks share their times (a re-import compressed twice): not in order by start
    chunks = [(2, _chunk(0, 100, seed=1)), (1, _chunk(0, 50, seed=2)), (2, _chunk(30 * 60, 100, seed=3))]
    lo, hi = T0, T0 + timedelta(days=1)
    got = _decoded(chunks, lo, hi)
    _same(got, _sorted_everything(chunks, lo, hi))
    assert not got.strictly_sorted()  # twice the same (series, time): the fallback's sort, stable
    deduped, dropped = merge(got, Samples.empty())
    assert dropped == 70 and len(deduped) == len(got) - 70 and deduped.strictly_sorted()
