"""Counters as a live fabric serves them: growing smoothly with the clock, not in jumps at each step.

A live fabric steps about once a second, but a collector may read at any moment and stamps
the sample with its own clock. A counter that jumped once per step would read 20 % high or
low over a 5 s poll, depending on how many steps fell between two polls. So each traffic
counter is served as a ``Ramp``: from the moment a step is published, the counter climbs to the
step's value over as many seconds as the step carries, at the step's own rate (after the climb
of the step before, if that is still going). Read off at the moment of the read, it never jumps,
and between two reads it grows by no more than the model sends in that time.

Times are this machine's ``CLOCK_BOOTTIME`` seconds, the clock ``/proc/uptime`` shows, so
the host ``ethtool`` shim (a shell script) reads the same ramps (simulator/live_host.py).
"""

from __future__ import annotations

import time
from dataclasses import dataclass

_CLOCK = getattr(time, "CLOCK_BOOTTIME", None)

def clock() -> float:
    """Seconds on the ramp clock (CLOCK_BOOTTIME where there is one)."""
    return time.clock_gettime(_CLOCK) if _CLOCK is not None else time.monotonic()


@dataclass(frozen=True, slots=True)
class Ramp:
    """A counter through `values` at `times` (oldest first), straight between them, flat outside."""

    times: tuple[float, ...]
    values: tuple[int, ...]

    def at(self, now: float) -> int:
        t, v = self.times, self.values
        if now >= t[-1]:
            return v[-1]
        for j in range(len(t) - 1, 0, -1):
            if now >= t[j - 1]:
                a, b = v[j - 1], v[j]
                if b < a:  # a reset or a wrap shows whole at its point, not spread as a decline
                    return a
                return a + int((b - a) * (now - t[j - 1]) / (t[j] - t[j - 1]))
        return v[0]

    def now(self) -> int:
        return self.at(clock())


def settle(x: object, now: float) -> object:
    """A served value at `now`: a Ramp read off, anything else as it is."""
    return x.at(now) if isinstance(x, Ramp) else x
