"""Fiber or connector when every lane of a port is down (#23, the 10x300 gradual cell): with no undegraded lane to
compare with, the wobble test compares the lanes with their own reading-to-reading jitter before the drop. A noisy
module (0.3 dB mean successive difference, seen in the evaluation's modules) read against a fixed 0.15 dB called
an MPO connector's stable 4-lane loss a damaged fiber; a real wobble is still one."""

from __future__ import annotations

import numpy as np
import pytest

from service.detection.findings import Cause, Finding
from tests.detection.crafted import Driver


def _all_lane_loss(noise_db: float, wobble_db: float, seed: int) -> list[Cause]:
    """Optics, counters and cycles every 60 s; leaf:Ethernet1/4's module reads with `noise_db` of extra noise on
    its 4 lanes throughout; after 4 healthy hours all 4 lanes lose 4 dB (plus a +-`wobble_db` wobble) for 3 hours.
    Returns the cause of the port's optical finding in each cycle it is present."""
    d = Driver(step_ms=60_000, seed=seed)
    p = d.port("leaf", "Ethernet1/4")
    lanes = d.fab.lane_off[p] + np.arange(4)
    causes: list[Cause] = []
    for minute in range(7 * 60):
        rx = d.rx.copy()
        rx[lanes] += d.rng.normal(0, noise_db, 4)
        if minute >= 4 * 60:
            rx[lanes] -= 4.0 + d.rng.uniform(-wobble_db, wobble_db, 4)
        d.step(rx=rx)
        found: list[Finding] = [x for x in d.cycle() if x.kind == "optical_degradation"
                                and (x.device, x.port) == ("leaf", "Ethernet1/4")]
        causes += [x.cause for x in found]
    return causes


SEEDS = range(6)


def test_a_noisy_modules_stable_four_lane_loss_is_the_connector() -> None:
    """Reading noise of 0.27 dB (sd, with the driver's own 0.1): a mean successive difference of 0.30 dB, over
    the fixed reference's 0.15 + 0.12. The mean over few readings after the drop can still run high by chance:
    allowed on at most 2 % of the cycles, and only in the first hour."""
    runs = [_all_lane_loss(noise_db=0.25, wobble_db=0.0, seed=s) for s in SEEDS]
    assert all(len(c) >= 150 for c in runs)  # the alert is open from minutes after the loss to the end
    fiber = [i for c in runs for i, x in enumerate(c) if x is Cause.FIBER]
    assert len(fiber) <= 0.02 * sum(map(len, runs)) and all(i < 60 for i in fiber), fiber
    assert {x for c in runs for x in c} <= {Cause.CONTAMINATION, Cause.FIBER}


@pytest.mark.parametrize("noise_db", [0.0, 0.25], ids=["quiet-module", "noisy-module"])
def test_a_four_lane_loss_that_wobbles_is_still_the_fiber(noise_db: float) -> None:
    for seed in SEEDS[:3]:
        causes = _all_lane_loss(noise_db=noise_db, wobble_db=1.0, seed=seed)
        assert Cause.FIBER in causes
        first = causes.index(Cause.FIBER)
        assert first <= 6 and set(causes[first:]) == {Cause.FIBER}  # sharpened within a few readings, then kept
