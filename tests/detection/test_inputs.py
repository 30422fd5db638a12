"""Missing inputs degrade a rule, never disable it silently (issue #23).

The fault bed (tests/detection/faultbed.py) at the imported fabric's cadence (counters every 5 min, optics every
15 min, cycles every minute), with one input left out at a time: admin status, the line rate (inventory speed and
the speed gauge), the modules' thresholds. Every fault is still found with its cause; what a rule ran without is
in the finding's evidence and in the state's per-port coverage (`blocked_rules` / `degraded_rules`). Then fabrics
that lack whole families: optics only (gNMI DOM), FCS instead of FEC counters, carrier changes instead of a
link-down counter, the device's own pre-FEC BER gauge instead of bit counters.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pytest
from sqlalchemy import Engine

from service.detection.findings import Finding
from service.detection.state import BLOCKED, DEGRADED, FeatureState
from service.detection.store import load_coverage, save_state
from tests.detection.faultbed import EXPECT, WANT, ends_of, matches, verdict
from tests.detection.simfeed import Recording

OPTICAL = {"contamination", "tx_wearout", "fiber"}


def _degraded(f: Finding) -> set[str]:
    return {e.note for e in f.evidence if e.feature == "degraded_input"}


def _first(rec: Recording, out: list[Finding], fault: str) -> Finding:
    _, dev, port = EXPECT[fault]
    ends = ends_of(rec, dev, port)
    return next(f for f in out if f.state == "firing" and f.severity.value != "info" and matches(f, ends))


def test_without_admin_status_every_fault_is_found(rec: Recording) -> None:
    """Host ethtool and most exporters give no admin status: the port is in service when it is oper-up. The old
    detector gated the optical, bias, DOM and forest rules off on every port, with no word about it."""
    out = rec.replay(300, 900, 60, drop={"port_admin_up"})
    got, stray = verdict(rec, out)
    assert got == WANT and stray == []
    for fault in OPTICAL:
        assert DEGRADED[0] in _degraded(_first(rec, out, fault)), fault
    down = _first(rec, out, "down")
    assert down.cause.value == "link_down" and DEGRADED[4] in _degraded(down)  # it was up, then went down
    cov = rec.state.coverage()
    assert cov["leaf-p1-01:Ethernet1/1"]["degraded_rules"]["optical_degradation"] == [DEGRADED[0]]


def test_without_a_line_rate_every_fault_is_found(rec: Recording) -> None:
    """No speed in the inventory and no speed gauge: the rx phy bits counter is the line rate (F14)."""
    fab = dataclasses.replace(rec.fabric, speed_bps=np.full(rec.fabric.P, np.nan))
    out = rec.replay(300, 900, 60, drop={"port_speed_bits_per_second"}, fabric=fab)
    got, stray = verdict(rec, out)
    assert got == WANT and stray == []


def test_without_a_line_rate_or_phy_bits_the_pause_storm_and_ber_still_run(rec: Recording) -> None:
    """No line rate at all: 'draining nothing' is an absolute floor; the pre-FEC BER is the device's gauge."""
    fab = dataclasses.replace(rec.fabric, speed_bps=np.full(rec.fabric.P, np.nan))
    out = rec.replay(300, 900, 60, drop={"port_speed_bits_per_second", "port_rx_phy_bits_total"}, fabric=fab)
    got, stray = verdict(rec, out)
    assert got == WANT and stray == []
    assert DEGRADED[3] in _degraded(_first(rec, out, "pause"))
    p = rec.port("host-p1-00001", "eth0")
    assert rec.state.degraded_rules(p)["ber_degradation"] == [DEGRADED[7]]


def test_without_module_thresholds_every_fault_is_found(rec: Recording) -> None:
    """Modules whose EEPROM gives no thresholds: rx against its own baseline (and trend to baseline - 3 dB); the
    DOM alarm rule cannot run and says so."""
    fab = dataclasses.replace(rec.fabric, th={k: np.full(rec.fabric.P, np.nan) for k in rec.fabric.th})
    out = rec.replay(300, 900, 60, fabric=fab)
    got, stray = verdict(rec, out)
    assert got == WANT and stray == []
    assert DEGRADED[2] in _degraded(_first(rec, out, "contamination"))
    p = rec.port("leaf-p1-01", "Ethernet1/1")
    assert rec.state.blocked_rules(p)["dom_threshold"] == BLOCKED[5]


def test_optics_only_finds_the_optical_faults_and_says_what_cannot_run(rec: Recording) -> None:
    """An optics-only gNMI subscription (DOM, no state, no counters): in service when a lane is lit; the optical
    faults are found with their causes; the counter rules report, per port, that they cannot run."""
    keep = {"optic_rx_power_dbm", "optic_tx_power_dbm", "optic_tx_bias_amperes", "optic_temperature_celsius",
            "optic_voltage_volts"}
    drop = {m for _, b in rec.frames[:1] for m in b} - keep
    out = rec.replay(300, 900, 60, drop=drop)
    got, _ = verdict(rec, out)
    assert {f: got[f] for f in OPTICAL} == {f: WANT[f] for f in OPTICAL}
    assert DEGRADED[1] in _degraded(_first(rec, out, "contamination"))
    p = rec.port("host-p1-00007", "eth0")
    blocked = rec.state.blocked_rules(p)
    assert blocked["post_fec_errors"] == BLOCKED[6] and blocked["flap_storm"] == BLOCKED[8]
    assert blocked["link_down"] == BLOCKED[13] and blocked["pause_storm"] == BLOCKED[10]
    assert "optical_degradation" not in blocked


def test_fcs_carrier_and_ber_gauge_stand_in_for_missing_counters(rec: Recording) -> None:
    """A device without FEC codeword/symbol counters, link-down counter or bit counters: post-FEC errors from
    FCS/CRC errors, flaps from carrier changes, the pre-FEC BER from the device's gauge."""
    drop = {"port_fec_uncorrectable_codewords_total", "port_symbol_errors_total", "port_link_down_events_total",
            "port_fec_corrected_bits_total", "port_rx_phy_bits_total"}
    out = rec.replay(300, 900, 60, drop=drop)
    got, stray = verdict(rec, out)
    assert got["post_fec"] == "post_fec_errors" and got["storm"] == "flap_storm"
    assert got["line_card"] == "shared_component"
    assert DEGRADED[5] in _degraded(_first(rec, out, "post_fec"))
    assert DEGRADED[6] in _degraded(_first(rec, out, "storm"))


@pytest.mark.parametrize("cadence", [(300, 900, 60)])
def test_coverage_is_saved_with_the_state(rec: Recording, db: Engine, cadence: tuple[int, int, int]) -> None:
    """The per-port report travels with the detector state (detector_state.blob), readable on its own."""
    fab = dataclasses.replace(rec.fabric, th={k: np.full(rec.fabric.P, np.nan) for k in rec.fabric.th})
    rec.replay(*cadence, drop={"port_admin_up"}, fabric=fab)
    with db.begin() as conn:
        save_state(conn, "t", rec.state)
    with db.connect() as conn:
        cov = load_coverage(conn, "t")
    p = rec.port("leaf-p1-01", "Ethernet1/1")
    pid = int(fab.port_ids[p])
    assert cov[pid]["blocked_rules"]["dom_threshold"] == BLOCKED[5]
    assert cov[pid]["degraded_rules"]["optical_degradation"] == [DEGRADED[0], DEGRADED[2]]
    again = FeatureState.from_bytes(rec.state.to_bytes(), fab)
    assert again.blocked_rules(p) == rec.state.blocked_rules(p)
