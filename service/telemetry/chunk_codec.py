"""One series' samples as a compressed chunk: time-series encodings in numpy, entropy coding by zstd.

The encodings are array transforms, the coding is zstd (pyarrow's codec, already a dependency):

- times (microseconds since the Unix epoch, or milliseconds when every one is a whole millisecond, as
  polls stamp them): a constant step is kept as (first, step, n); anything else as delta-of-delta,
  zigzagged, byte-stream-split, zstd.
- values: if every value is a whole number of 10^-k (k <= 6, checked to decode bit for bit),
  the scaled integers as deltas (counters, states, two-decimal gauges), else the float64 bits
  XORed with the previous value's (Gorilla's idea: close values share sign, exponent and the top of
  the mantissa). Either is zigzagged, byte-stream-split (the i-th byte of every value together, as
  Parquet's BYTE_STREAM_SPLIT does) and zstd-coded. Both candidates that apply are tried and the
  smaller kept: a chunk is a few hundred values, so trying costs microseconds.

Decoding is exact: the same float64 bits come back (NaN payloads and -0.0 included).

Layout: a 24-byte header `<B version, B flags, H k, I n, q first_us, q step_us>`, then the times
section (absent for a constant step) and the values section, each `<I length>` + zstd frame.
"""

from __future__ import annotations

import struct

import numpy as np
import pyarrow as pa

VERSION = 1
_HEAD = struct.Struct("<BBHIqq")
_LEN = struct.Struct("<I")
_CONST_STEP = 1  # flags: times are first + i * step
_SCALED = 2      # flags: values are integers / 10**k, as deltas; else XORed float bits
_MS = 4          # flags: times (and step) are in milliseconds: every one is a whole millisecond
_MAX_EXACT = 2.0 ** 53
_ZSTD = pa.Codec("zstd", compression_level=9)


class ChunkError(ValueError):
    """A chunk that cannot be decoded: names what is wrong with it."""


def _zigzag(x: np.ndarray) -> np.ndarray:
    return ((x << 1) ^ (x >> 63)).view(np.uint64)


def _unzigzag(u: np.ndarray) -> np.ndarray:
    return ((u >> np.uint64(1)).view(np.int64)) ^ -((u & np.uint64(1)).view(np.int64))


def _pack(u: np.ndarray) -> bytes:
    """uint64 array -> byte-stream-split, zstd frame."""
    split = np.ascontiguousarray(u.astype("<u8", copy=False).view(np.uint8).reshape(-1, 8).T)
    frame = _ZSTD.compress(split.tobytes(), asbytes=True)
    return _LEN.pack(len(frame)) + frame


def _unpack(data: memoryview, at: int, n: int) -> tuple[np.ndarray, int]:
    if at + 4 > len(data):
        raise ChunkError(f"chunk truncated at byte {at}: a section length is missing")
    (size,) = _LEN.unpack_from(data, at)
    at += 4
    if at + size > len(data):
        raise ChunkError(f"chunk truncated: a section of {size} bytes at byte {at} runs past its end ({len(data)})")
    try:
        raw = _ZSTD.decompress(data[at:at + size], decompressed_size=8 * n, asbytes=True)
    except (pa.ArrowException, OSError) as e:
        raise ChunkError(f"chunk section at byte {at} is not a zstd frame of {n} values: {e}") from e
    if len(raw) != 8 * n:
        raise ChunkError(f"chunk section at byte {at} holds {len(raw)} bytes, not {n} values")
    split = np.frombuffer(raw, np.uint8).reshape(8, n)
    return np.ascontiguousarray(split.T).view("<u8").reshape(n), at + size


def _scale(values: np.ndarray) -> tuple[int, np.ndarray] | None:
    """(k, integers) with integers / 10**k == values bit for bit, for the smallest k <= 6; None if none."""
    if not np.isfinite(values).all():
        return None
    for k in range(7):
        scaled = np.rint(values * 10.0 ** k)
        if np.abs(scaled).max(initial=0.0) >= _MAX_EXACT:
            return None
        ints = scaled.astype(np.int64)
        back = ints.astype(np.float64) / 10.0 ** k  # as decode computes it (so -0.0 fails: it comes back 0.0)
        if np.array_equal(back.view(np.uint64), values.view(np.uint64)):
            return k, ints
    return None


def encode(ts_us: np.ndarray, values: np.ndarray) -> bytes:
    """A chunk of one series' samples; `ts_us` strictly increasing int64 microseconds, `values` float64."""
    n = len(ts_us)
    if n == 0 or n != len(values):
        raise ValueError(f"a chunk needs matching, non-empty times and values (got {n} and {len(values)})")
    ts_us = np.asarray(ts_us, np.int64)
    values = np.ascontiguousarray(values, np.float64)
    if n > 1 and np.diff(ts_us).min() <= 0:
        raise ValueError("chunk times must be strictly increasing")
    flags = 0
    if not (ts_us % 1000).any():  # polls stamp milliseconds: jitter in ms takes 10 bits less than in us
        ts_us, flags = ts_us // 1000, _MS
    steps = np.diff(ts_us)
    step = int(steps[0]) if n > 1 else 0
    times = b""
    if n < 2 or (steps == step).all():
        flags |= _CONST_STEP
    else:
        dod = np.empty(n, np.int64)
        dod[0] = 0
        dod[1] = steps[0]
        dod[2:] = np.diff(steps)
        times = _pack(_zigzag(dod))
    bits = values.view(np.int64)
    xored = bits.copy()
    xored[1:] ^= bits[:-1]
    body, k = _pack(xored.view(np.uint64)), 0
    scaled = _scale(values)
    if scaled is not None:
        deltas = scaled[1].copy()
        deltas[1:] -= scaled[1][:-1]
        candidate = _pack(_zigzag(deltas))
        if len(candidate) <= len(body):
            body, k, flags = candidate, scaled[0], flags | _SCALED
    return _HEAD.pack(VERSION, flags, k, n, int(ts_us[0]), step) + times + body


def decode(data: bytes | memoryview) -> tuple[np.ndarray, np.ndarray]:
    """(int64 microseconds, float64 values) of a chunk."""
    view = memoryview(data)
    if len(view) < _HEAD.size:
        raise ChunkError(f"chunk of {len(view)} bytes is shorter than its {_HEAD.size}-byte header")
    version, flags, k, n, first, step = _HEAD.unpack_from(view, 0)
    if version != VERSION:
        raise ChunkError(f"chunk version {version} is not one this release reads ({VERSION})")
    at = _HEAD.size
    if flags & _CONST_STEP:
        ts = first + step * np.arange(n, dtype=np.int64)
    else:
        dod, at = _unpack(view, at, n)
        ts = np.empty(n, np.int64)
        ts[0] = first
        np.cumsum(np.cumsum(_unzigzag(dod)[1:]), out=ts[1:])
        ts[1:] += first
    if flags & _MS:
        ts *= 1000
    body, at = _unpack(view, at, n)
    if flags & _SCALED:
        values = np.cumsum(_unzigzag(body)).astype(np.float64) / 10.0 ** k
    else:
        bits = body.view(np.int64)
        values = np.bitwise_xor.accumulate(bits).view(np.float64)
    if at != len(view):
        raise ChunkError(f"chunk has {len(view) - at} bytes after its values")
    return ts, values
