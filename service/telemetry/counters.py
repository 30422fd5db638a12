"""Counter arithmetic: increases and rates that stay right across resets, wraps and saturation.

Storage keeps raw cumulative values exactly as devices report them; increases are derived
here, at read and feature time, so a late fix to this logic re-derives history correctly.

Rules for a step from `prev` to `cur`:
- `cur >= prev`: the increase is `cur - prev`, unless the counter saturates and sits at its
  maximum, where the true increase is unknown (None).
- `cur < prev` on a counter of known width whose wrap-around increase `2**bits - prev + cur`
  is below half the range: a wrap.
- any other drop: a reset (reboot, driver reload); the increase is `cur` (counted since zero).
"""

from __future__ import annotations

import math
from collections.abc import Sequence


def counter_max(bits: int) -> int:
    return (1 << bits) - 1


def increase(prev: float, cur: float, *, bits: int | None = None, saturating: bool = False) -> float | None:
    """The increase between two readings, or None when it cannot be known."""
    if math.isnan(prev) or math.isnan(cur):
        return None
    if saturating and bits is not None and cur >= counter_max(bits):
        return None
    if cur >= prev:
        return cur - prev
    if bits is not None and not saturating:
        wrapped = (1 << bits) - prev + cur
        if 0 <= wrapped < (1 << (bits - 1)):
            return wrapped
    return cur


def rates(
    ts_ms: Sequence[int],
    values: Sequence[float],
    *,
    bits: int | None = None,
    saturating: bool = False,
    max_gap_ms: int | None = None,
) -> list[float | None]:
    """Per-second rates between consecutive readings; element i covers (i-1, i]; element 0 is None.

    A step longer than `max_gap_ms` gives None: the counter's history across a long gap is
    unknown, and spreading it would invent a rate.
    """
    out: list[float | None] = [None] * len(values)
    for i in range(1, len(values)):
        dt = ts_ms[i] - ts_ms[i - 1]
        if dt <= 0 or (max_gap_ms is not None and dt > max_gap_ms):
            continue
        inc = increase(values[i - 1], values[i], bits=bits, saturating=saturating)
        if inc is not None:
            out[i] = inc * 1000.0 / dt
    return out
