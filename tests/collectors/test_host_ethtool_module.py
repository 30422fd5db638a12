"""ethtool -m (text and --json) parser: SFF-8472, SFF-8636, CMIS, thresholds, flags, garbage."""

from __future__ import annotations

import contextlib
import json
import math
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.base import ParseError
from collectors.host.ethtool_module import ModuleReading, mw_to_dbm, parse_ethtool_module
from service.inventory.schemas import Optic
from service.telemetry import catalogue
from tests.paths import FIXTURES

DIR = FIXTURES / "ethtool_module"
QSFPINFO = FIXTURES / "other" / "opae_docs_qsfpinfo_qsfp28_100G-SR4_finisar_FTLC9551REPM_PARTIAL.txt"


def read(path: Path, text: str | None = None) -> ModuleReading:
    r = parse_ethtool_module(text if text is not None else path.read_text(), device="h1", port="eth0",
                             ts_ms=5, source=path.name)
    Optic(**r.optic)  # what we extract must fit the inventory schema, thresholds included
    assert all(catalogue.get(s.metric) is not None for s in r.samples)
    return r


def values(r: ModuleReading) -> dict[tuple[str, int | None], float]:
    return {(s.metric, s.lane): s.value for s in r.samples}


def dbm(mw: float) -> float:
    return round(10 * math.log10(mw), 4)


def test_sff8472_sfp_cumulus_with_prompt_line() -> None:
    r = read(DIR / "cumulus_docs_cl37_sfp_1000base-sx_jdsu_swp3_ethtool_m.txt")
    assert r.spec == "SFF-8472" and r.dom_valid and r.warnings == []
    v = values(r)
    assert v[("optic_rx_power_dbm", 0)] == dbm(0.3195)  # -4.96 dBm printed
    assert v[("optic_tx_power_dbm", 0)] == dbm(0.3186)
    assert v[("optic_tx_bias_amperes", 0)] == pytest.approx(0.021348)
    assert v[("optic_temperature_celsius", None)] == 41.70
    assert v[("optic_voltage_volts", None)] == 3.2947
    assert r.optic["vendor"] == "JDSU" and r.optic["part_number"] == "PLRXPL-VI-S24-22"
    assert r.optic["form_factor"] == "SFP" and r.optic["lanes"] == 1
    th = r.optic["thresholds"]
    assert th["rx_power_dbm"]["low_alarm"] == pytest.approx(-20.0)
    assert th["tx_bias_amperes"]["high_alarm"] == pytest.approx(0.010)
    assert th["voltage_volts"]["low_warning"] == 2.955
    assert th["temperature_celsius"]["high_warning"] == 85.0
    assert r.flags["rx_power_low_alarm"] is False


def test_sff8636_qsfp_dark_lanes_clamped_and_zero_thresholds_dropped() -> None:
    r = read(DIR / "lore_netdev_20240523_qsfp+_40G-SR4_avago_mlx4_ethtool_m.txt")
    assert r.spec == "SFF-8636" and r.optic["form_factor"] == "QSFP+" and r.optic["lanes"] == 4
    v = values(r)
    assert v[("optic_rx_power_dbm", 0)] == dbm(0.7682)
    assert v[("optic_rx_power_dbm", 1)] == -40.0  # 0.0000 mW / -inf dBm
    assert v[("optic_tx_bias_amperes", 1)] == 0.0
    assert "tx_power_dbm" not in r.optic["thresholds"]  # all four 0.0000 mW: not programmed
    assert r.optic["thresholds"]["rx_power_dbm"]["low_warning"] == dbm(0.1122)
    assert r.flags["rx_power_low_alarm"] == {0: False, 1: False, 2: False, 3: False}


def test_cmis_text_eight_lanes_and_flags() -> None:
    r = read(DIR / "lore_netdev_20241015_cmis_qsfpdd_arista_QDD-400G-XDR4_ethtool_m.txt")
    assert r.spec == "CMIS" and r.optic["form_factor"] == "QSFP-DD" and r.optic["lanes"] == 8
    assert r.optic["serial"] == "XKT242211481"
    v = values(r)
    assert v[("optic_rx_power_dbm", 0)] == dbm(2.2489)  # 3.52 dBm printed
    assert v[("optic_tx_bias_amperes", 3)] == pytest.approx(0.1101)
    assert v[("optic_rx_power_dbm", 7)] == -40.0
    assert v[("optic_temperature_celsius", None)] == 70.49
    assert r.flags["temperature_high_warning"] is True  # 70.49 C >= 70 C warning threshold
    assert r.optic["thresholds"]["temperature_celsius"]["high_warning"] == 70.0


def test_json_with_duplicate_keys_cmis() -> None:
    path = DIR / "lore_netdev_20250205_cmis_qsfpdd_finisar_FTCD8613E1PCM_ethtool_json_m.json"
    # plain json.loads keeps only the last 'module_temperature' (the threshold object)
    assert isinstance(json.loads(path.read_text())[0]["module_temperature"], dict)
    r = read(path)
    v = values(r)
    assert v[("optic_temperature_celsius", None)] == 37.5273  # the reading survived
    assert r.optic["thresholds"]["temperature_celsius"]["high_alarm"] == 75.0  # and the thresholds
    assert r.optic["thresholds"]["voltage_volts"]["low_alarm"] == 3.135
    assert v[("optic_rx_power_dbm", 0)] == -40.0  # 0.0001 mW
    assert r.flags["rx_loss_of_signal"] == ["Yes"] * 8
    assert r.optic["part_number"] == "FTCD8613E1PCM" and r.optic["lanes"] == 8


def test_json_sff8636_aoc_low_rx_flags() -> None:
    r = read(DIR / "lore_netdev_20250210_sff8636_qsfp28_aoc_mellanox_MFS1S00-V003E_ethtool_json_m.json")
    assert r.spec == "SFF-8636" and r.optic["form_factor"] == "QSFP28"
    v = values(r)
    assert v[("optic_rx_power_dbm", 3)] == dbm(0.0394)
    assert v[("optic_voltage_volts", None)] == 3.259
    assert r.optic["thresholds"]["rx_power_dbm"]["low_alarm"] == dbm(0.0467)
    assert r.optic["thresholds"]["tx_bias_amperes"]["low_alarm"] == pytest.approx(0.005492)
    assert r.flags["rx_power_low_alarm"] == {0: True, 1: True, 2: True, 3: True}


def test_i40e_sfp_sane_dom() -> None:
    r = read(DIR / "showmax_i40e_sfp_10GSR_ethtool_m.txt")
    assert r.dom_valid and values(r)[("optic_rx_power_dbm", 0)] == dbm(0.6486)
    assert r.optic["serial"] == "F2020533679"


def test_garbled_dom_keeps_identity_drops_values_with_warning() -> None:
    r = read(DIR / "showmax_bnxt_en_sfp_FS_SFP-10GSR-85_garbled_dom_ethtool_m.txt")
    assert r.dom_valid is False and r.samples == []
    assert r.optic["serial"] == "S2109191251" and r.optic["thresholds"] == {}
    assert any("0.2287 V" in w for w in r.warnings)


def test_all_zero_dom_is_no_reading_not_a_dark_lane_with_a_dead_laser() -> None:
    """ixgbe read this SFP's DOM as all zeros (link up at 10G): not -40 dBm, not 0 A, not 0 C."""
    r = read(DIR / "showmax_ixgbe_sfp_FS_SFP-10GSR-85_all_zero_dom_ethtool_m.txt")
    assert r.dom_valid is False and r.samples == []
    assert r.optic["serial"] == "F2010652115" and r.optic["part_number"] == "SFP-10GSR-85"
    assert r.optic["thresholds"] == {}  # the same page: its thresholds are garbage too
    assert len(r.warnings) == 1 and "no DOM reading" in r.warnings[0] and "all-zero DOM" in r.warnings[0]


SFP28 = DIR / "unidentified_sfp28_25G-SR_finisar_FTLF8536P5BCL-HP_ethtool_m.txt"


def test_dark_lane_on_a_live_module_is_still_minus_40_dbm() -> None:
    """0 mW Rx and 0 mA bias on a module with a supply voltage: a dark lane and a laser that is off."""
    text = SFP28.read_text()
    for live, dead in (("7.956 mA", "0.000 mA"), ("0.7572 mW / -1.21 dBm", "0.0000 mW / -inf dBm"),
                       ("0.7457 mW / -1.27 dBm", "0.0000 mW / -inf dBm")):
        text = text.replace(f": {live}\n", f": {dead}\n", 1)
    r = read(SFP28, text)
    assert r.dom_valid and r.warnings == []
    v = values(r)
    assert v[("optic_rx_power_dbm", 0)] == -40.0 and v[("optic_tx_power_dbm", 0)] == -40.0
    assert v[("optic_tx_bias_amperes", 0)] == 0.0 and v[("optic_voltage_volts", None)] == 3.3011
    # CMIS: lanes 5-8 of the Arista module are dark (0.0000 mW) while lanes 1-4 carry light
    cmis = values(read(DIR / "lore_netdev_20241015_cmis_qsfpdd_arista_QDD-400G-XDR4_ethtool_m.txt"))
    assert [cmis[("optic_rx_power_dbm", ln)] for ln in range(4, 8)] == [-40.0] * 4


def test_zero_temperature_and_voltage_next_to_live_lanes_is_no_module_monitor() -> None:
    text = SFP28.read_text().replace("53.13 degrees C / 127.63 degrees F", "0.00 degrees C / 32.00 degrees F", 1)
    text = text.replace("Module voltage                            : 3.3011 V",
                        "Module voltage                            : 0.0000 V")
    r = read(SFP28, text)
    v = values(r)
    assert r.dom_valid and v[("optic_rx_power_dbm", 0)] == dbm(0.7457)
    assert ("optic_temperature_celsius", None) not in v and ("optic_voltage_volts", None) not in v
    assert any("no module-level monitors" in w for w in r.warnings)


def test_negative_power_is_implausible() -> None:
    text = SFP28.read_text().replace("0.7457 mW / -1.27 dBm", "-0.7457 mW / -inf dBm", 1)
    r = read(SFP28, text)
    assert r.dom_valid is False and r.samples == []
    assert any("negative optical power" in w for w in r.warnings)


def test_unordered_thresholds_are_left_out_with_warning() -> None:
    text = (DIR / "showmax_i40e_sfp_10GSR_ethtool_m.txt").read_text().replace(
        "Laser rx power low alarm threshold        : 0.0389 mW / -14.10 dBm",
        "Laser rx power low alarm threshold        : 1.2000 mW / 0.79 dBm")
    r = read(DIR / "x", text)
    assert r.dom_valid and "rx_power_dbm" not in r.optic["thresholds"]
    assert any("rx_power thresholds are not ordered" in w for w in r.warnings)


def test_qsfpinfo_partial_is_rejected_as_truncated_but_format_is_the_same() -> None:
    with pytest.raises(ParseError) as exc:
        read(QSFPINFO)
    assert "truncated" in exc.value.reason and exc.value.line == 51
    body = QSFPINFO.read_text().replace("\n...", "\n")
    r = read(QSFPINFO, body)
    assert r.spec == "SFF-8636" and values(r)[("optic_rx_power_dbm", 0)] == dbm(0.9603)


def test_mw_to_dbm_clamps() -> None:
    assert mw_to_dbm(0.0) == -40.0 and mw_to_dbm(-1) == -40.0 and mw_to_dbm(1.0) == 0.0
    assert mw_to_dbm(float("nan")) == -40.0


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty"),
        ("Vendor name : X\n", "no 'Identifier'"),
        ("Identifier : 0x03 (SFP)\nModule voltage : lots V\n", "Module voltage"),
        ("Identifier : 0x03 (SFP)\nLaser output power : 0.3 m", "Laser output power"),
        ("Identifier : 0x03 (SFP)\nModule temperature high alarm : Maybe\n", "On/Off"),
        ("Identifier : 0x03 (SFP)\ngarbage line\n", "not a 'key : value'"),
        ('[ {"identifier": 3, "module_voltage": 3.3', "invalid JSON"),
        ('[ {"vendor_name": "X"} ]', "identifier"),
        ('[ {"identifier": 17, "laser_tx_bias_current": ["x"]} ]', "laser_tx_bias_current"),
    ],
)
def test_garbled_input_raises_parse_error(text: str, reason: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse_ethtool_module(text, device="h", port="p", ts_ms=1, source="ethtool -m eth3")
    assert exc.value.source == "ethtool -m eth3" and reason in exc.value.reason


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=300))
def test_arbitrary_text_only_raises_parse_error(text: str) -> None:
    for candidate in (text, "Identifier : 0x11 (QSFP28)\n" + text):
        with contextlib.suppress(ParseError):
            parse_ethtool_module(candidate, device="h", port="p", ts_ms=1, source="fuzz")


_json_values = st.recursive(
    st.none() | st.booleans() | st.integers() | st.floats(allow_nan=False) | st.text(max_size=5),
    lambda inner: st.lists(inner, max_size=4) | st.dictionaries(st.text(max_size=8), inner, max_size=4),
    max_leaves=12,
)
_keys = st.sampled_from(["identifier", "module_temperature", "module_voltage", "rx_power", "laser_tx_bias_current",
                         "transmit_avg_optical_power", "laser_rx_power", "laser_rx_power_low_alarm",
                         "vendor_name", "rx_loss_of_signal"])


@settings(max_examples=300, deadline=None)
@given(st.lists(st.tuples(_keys, _json_values), max_size=8), st.booleans())
def test_arbitrary_json_only_raises_parse_error(pairs: list[tuple[str, object]], wrap: bool) -> None:
    body = "{" + ",".join(f"{json.dumps(k)}: {json.dumps(v)}" for k, v in pairs) + "}"
    text = f"[{body}]" if wrap else body
    with contextlib.suppress(ParseError):
        parse_ethtool_module(text, device="h", port="p", ts_ms=1, source="fuzz")
