"""A DOM-threshold finding says which of the module's readings crossed which of its own alarm thresholds."""

from __future__ import annotations

from tests.detection.crafted import TH, Driver, firing


def test_the_dom_finding_names_the_lane_and_threshold_that_fired_it() -> None:
    d = Driver(seed=5)
    d.run(30)
    p = d.port("leaf", "Ethernet1/4")
    lane = 2
    d.tx[d.fab.lane_off[p] + lane] = -5.5  # under the low alarm (-3.9 dBm), still lit
    (f, *_) = firing(d.run(6), "dom_threshold")
    assert (f.device, f.port) == ("leaf", "Ethernet1/4")
    assert [e.feature for e in f.evidence] == ["tx_power_dbm", "onset_ms"], f.evidence
    e = f.evidence[0]
    assert e.value < TH["tx_power_dbm"]["low_alarm"] and e.unit == "dBm"
    assert e.note == f"lane {lane}: low alarm {TH['tx_power_dbm']['low_alarm']:g} dBm"
    assert "tx_power_dbm" in f.summary and f"lane {lane}" in f.summary
