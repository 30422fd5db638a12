"""The chunk codec gives back the same times and the same float64 bits, and says what is wrong with a
chunk it cannot read."""

from __future__ import annotations

import numpy as np
import pytest

from service.telemetry.chunk_codec import ChunkError, decode, encode

T0 = 1_764_547_200_000_000  # 2025-12-01 in Unix microseconds


def _same(a: np.ndarray, b: np.ndarray) -> bool:
    return a.dtype == b.dtype and np.array_equal(a.view(np.uint64), b.view(np.uint64))


@pytest.mark.parametrize("seed", range(7))
def test_round_trip_is_exact(seed: int) -> None:
    rng = np.random.default_rng(seed)
    n = int(rng.integers(1, 800))
    step = int(rng.choice([1_000, 10_000_000, 60_000_000]))
    ts = T0 + step * np.arange(n, dtype=np.int64)
    if seed % 2:  # scrape jitter and a gap
        ts = ts + np.sort(rng.integers(0, step // 3 + 1, n))
        ts[n // 2:] += 7 * step
    values = [np.cumsum(rng.integers(0, 10**9, n)).astype(np.float64),      # counter
              np.round(rng.normal(-3, 0.5, n), 2),                            # two-decimal gauge
              10 * np.log10(rng.uniform(0.1, 2, n)),                          # full-precision float
              np.where(rng.random(n) < 0.2, np.nan, rng.normal(size=n)),      # NaNs among floats
              np.full(n, -0.0), np.full(n, 2.0 ** 60), np.full(n, np.inf)][seed]
    got_ts, got_values = decode(encode(ts, values))
    assert np.array_equal(got_ts, ts) and _same(got_values, values)


def test_edge_values_round_trip() -> None:
    ts = T0 + np.arange(5, dtype=np.int64) * 10_000_000
    for values in (np.array([-0.0, 0.0, -0.0, 1.5, -1.5]), np.array([np.inf, -np.inf, np.nan, 0.0, 1e308]),
                   np.array([2.0 ** 53, 2.0 ** 53 + 2, -(2.0 ** 60), 1e-300, 5e-324])):
        got_ts, got = decode(encode(ts, values))
        assert np.array_equal(got_ts, ts) and _same(got, values)
    one_ts, one = decode(encode(ts[:1], np.array([42.0])))
    assert one_ts.tolist() == [T0] and one.tolist() == [42.0]


def test_regular_counters_take_few_bytes() -> None:
    """A counter at a steady step is times (first, step) plus small deltas: well under 2 bytes a sample,
    where rows take about 100."""
    ts = T0 + np.arange(360, dtype=np.int64) * 10_000_000
    values = np.cumsum(np.random.default_rng(1).poisson(40, 360)).astype(np.float64)
    assert len(encode(ts, values)) < 360 * 2


def test_poll_times_in_whole_milliseconds_take_under_a_byte() -> None:
    """Polls stamp milliseconds: a few ms of jitter on a 10 s step is kept in ms, not in us (10 bits less)."""
    jitter = np.random.default_rng(2).integers(0, 8, 360) * 1000
    ts = T0 + np.arange(360, dtype=np.int64) * 10_000_000 + jitter
    data = encode(ts, np.ones(360))
    assert len(data) < 360 and np.array_equal(decode(data)[0], ts)


def test_bad_input_and_bad_chunks() -> None:
    ts = T0 + np.arange(4, dtype=np.int64)
    with pytest.raises(ValueError, match="strictly increasing"):
        encode(ts[::-1].copy(), np.zeros(4))
    with pytest.raises(ValueError, match="matching, non-empty"):
        encode(ts, np.zeros(3))
    data = encode(ts + np.array([0, 5, 7, 100]), np.array([0.1, 0.2, 0.4, 0.8]))
    with pytest.raises(ChunkError, match="shorter than its 24-byte header"):
        decode(data[:10])
    with pytest.raises(ChunkError, match="truncated"):
        decode(data[:-3])
    with pytest.raises(ChunkError, match="after its values"):
        decode(data + b"x")
    broken = bytearray(data)
    broken[-5:] = b"\xff" * 5
    with pytest.raises(ChunkError, match="zstd"):
        decode(bytes(broken))
    with pytest.raises(ChunkError, match="version 9"):
        decode(bytes([9]) + data[1:])
