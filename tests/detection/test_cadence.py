"""Detection that does not depend on cadence (issue #23): the same faults, polled at any cadence per metric group
and evaluated at any cycle step, are found with the same cause.

The fault bed (tests/detection/faultbed.py: one fault of each class on a 72-link fabric, recorded once at 10 s) is
replayed with counters every {10 s, 60 s, 5 min} and optics every {60 s, 5 min, 15 min}, cycles every 60 s, every
counter poll and every optics poll. The old detector, whose windows and k-of-n counted cycles, found none of the
optical faults when optics came every 15th cycle (and missed the storm split over 5-min polls).
"""

from __future__ import annotations

import pytest
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from tests.detection.faultbed import COUNTERS_S, ON_S, OPTICS_S, T0, WANT, ends_of, matches, verdict
from tests.detection.simfeed import Recording

COMBOS = sorted({(c, o, cy) for c in COUNTERS_S for o in OPTICS_S for cy in (60, c, o)})


@pytest.mark.parametrize(("counters_s", "optics_s", "cycle_s"), COMBOS)
def test_every_fault_is_found_with_its_cause_at_any_cadence_and_cycle_step(
        rec: Recording, counters_s: int, optics_s: int, cycle_s: int) -> None:
    # short cycle steps only from just before the onsets: the warm-up at 60 s costs a sixth
    out = rec.replay(counters_s, optics_s, cycle_s, warm_until_s=ON_S - 300 if cycle_s < 60 else None)
    got, stray = verdict(rec, out)
    assert got == WANT
    assert stray == []


@settings(max_examples=6, deadline=None, derandomize=True, suppress_health_check=[HealthCheck.function_scoped_fixture])
@given(counters_s=st.sampled_from(COUNTERS_S), optics_s=st.sampled_from(OPTICS_S),
       cycle_s=st.sampled_from((30, 60, 120, 300, 600, 900)), phase=st.integers(0, 89),
       late=st.sampled_from((0.0, 0.03)), dup=st.sampled_from((0.0, 0.03)))
def test_shifting_the_cycle_step_does_not_change_what_is_found(
        rec: Recording, counters_s: int, optics_s: int, cycle_s: int, phase: int, late: float, dup: float) -> None:
    """Any cycle step and phase against the polls, with samples that come a poll late or twice: every fault is
    found, with its cause, exactly as at 60 s cycles on time."""
    out = rec.replay(counters_s, optics_s, cycle_s, phase_s=(phase * 10) % cycle_s, late=late, dup=dup, seed=phase,
                     warm_until_s=ON_S - 300 if cycle_s < 60 else None)
    got, stray = verdict(rec, out)
    assert got == WANT and stray == []


@pytest.mark.parametrize("poll_s", [300, 900])
def test_loose_module_and_line_card_at_5_and_15_min_polls(rec: Recording, poll_s: int) -> None:
    """Counters and optics both every 5 or 15 min (the imported fabric's cadence), cycles every minute: the loose
    module is a loose_module finding, not post-FEC; the line card is one shared_component finding on the
    switch with its ports as members, and none of its ports (or their far ends) pages on its own."""
    out = rec.replay(poll_s, poll_s, 60)
    got, _ = verdict(rec, out)
    assert got["loose"] == "loose_module" and got["line_card"] == "shared_component"
    loose_ends = ends_of(rec, "host-p1-00005", "eth0")
    assert {f.cause.value for f in out if matches(f, loose_ends) and f.severity.value != "info"} == {"loose_module"}
    card = [f for f in out if f.kind == "shared_component"]
    assert {f.device for f in card} == {"leaf-p2-01"}
    assert set(card[0].members) >= {f"Ethernet1/{i}" for i in range(1, 6)}
    on_card = [f for f in out if f.kind != "shared_component" and matches(f, ends_of(rec, "leaf-p2-01", None))
               and f.physical and (T0 + ON_S) * 1000 <= f.at_ms <= (T0 + 105 * 60) * 1000]
    assert on_card == [], sorted({(f.kind, f.device, f.port) for f in on_card})


def test_a_state_saved_and_restored_every_cycle_finds_the_same(rec: Recording) -> None:
    """Live detection saves its state after every cycle and loads it before the next: every held observation,
    observation history, flap ring, penalty and onset survives, so the findings equal one uninterrupted run."""
    straight = rec.replay(300, 900, 60, until_s=100 * 60)
    restarted = rec.replay(300, 900, 60, until_s=100 * 60, restart=True)
    assert [f.to_dict() for f in restarted] == [f.to_dict() for f in straight] and straight
