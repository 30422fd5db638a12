"""SNMP mapping without a network: real recorded walks, malformed recordings, unit rules."""

from __future__ import annotations

import math

import pytest

from collectors.base import Neighbor, ParseError
from collectors.snmp import parse_snmprec, parse_snmprec_varbinds, samples_from_varbinds
from collectors.snmp_dom import watts_to_dbm
from collectors.snmp_oids import oid
from service.telemetry import catalogue
from service.telemetry.samples import Sample
from tests.paths import FIXTURES
from tests.snmp_peers import DATA

REAL = FIXTURES / "snmp"


def _one(samples: list[Sample], metric: str, port: str, lane: int | None = None) -> Sample:
    hits = [s for s in samples if s.metric == metric and s.port == port and s.lane == lane]
    assert len(hits) == 1, f"{metric} {port} lane={lane}: {hits}"
    return hits[0]


# Per real file: spot checks read by hand from the .snmprec text (OID noted beside each).
EXPECT: dict[str, list[tuple[str, str, int | None, float]]] = {
    "librenms_arista_eos_4.20.12.1M_dcs-7150s-24.snmprec": [
        ("port_rx_bytes_total", "Ethernet1", None, 6576944),  # 31.1.1.1.6.1 Counter64
        ("port_tx_bytes_total", "Ethernet1", None, 5488273),  # 31.1.1.1.10.1
        ("port_speed_bits_per_second", "Ethernet1", None, 1e9),  # ifHighSpeed 1000
        ("port_last_change_seconds", "Ethernet21", None, 80.51),  # ifLastChange 8051 ticks
        # DOM TX Power Sensor for Ethernet21: 2210, watts, milli, precision 4 -> 0.221 mW
        ("optic_tx_power_dbm", "Ethernet21", 0, round(10 * math.log10(0.221), 6)),
        ("optic_tx_bias_amperes", "Ethernet21", 0, 0.01656),  # 1656, amperes, milli, prec 2
        ("optic_temperature_celsius", "Ethernet21", None, 41.0),  # 410, units, prec 1
        ("optic_voltage_volts", "Ethernet21", None, 3.26),  # 326, units, prec 2
    ],
    "librenms_arista_eos_4.15.3F_dcs-7050tx-128_TRIMMED.snmprec": [
        ("port_rx_bytes_total", "Ethernet1", None, 522941215169),
        # DOM RX Power Sensor for Ethernet1 = 1 (0.0001 mW) -> the -40 dBm floor
        ("optic_rx_power_dbm", "Ethernet1", 0, -40.0),
        ("optic_tx_power_dbm", "Ethernet1", 0, round(10 * math.log10(0.6322), 6)),  # 6322
        ("optic_tx_bias_amperes", "Ethernet1", 0, 0.03345),
    ],
    "librenms_cisco_nxos_10.5.2_n9k-c93180yc-fx3.snmprec": [
        ("port_rx_bytes_total", "Ethernet1/1", None, 0),
        ("port_speed_bits_per_second", "Ethernet1/1", None, 25e9),
        # CISCO-ENTITY-SENSOR-MIB 300042247: celsius, milli, 45542; 300042243: voltsDC 3270
        ("optic_temperature_celsius", "Ethernet1/25", None, 45.542),
        ("optic_voltage_volts", "Ethernet1/25", None, 3.27),
    ],
    "librenms_junos_evo_22.2R3_qfx5130-32cd.snmprec": [
        ("port_rx_bytes_total", "et-0/0/0", None, 0),
        ("optic_temperature_celsius", "et-0/0/0", None, 24.0),  # jnxDomCurrentModuleTemperature.507
        ("optic_voltage_volts", "et-0/0/0", None, 3.384),  # jnxDomCurrentModuleVoltage.507 = 3384 mV
    ],
    "librenms_cumulus_4.2.1_mellanox_spectrum.snmprec": [
        ("port_oper_up", "swp1", None, 1.0),  # ifOperStatus.5 = up(1); no counters in this walk
    ],
}


def test_every_real_walk_is_mapped_or_rejected() -> None:
    files = sorted(REAL.glob("*"))
    assert files, f"no fixtures under {REAL}"
    for path in files:
        try:
            samples, _ = parse_snmprec(path.read_text(), device="dut", ts_ms=1, source=path.name)
        except ParseError as exc:  # a rejection must say where and why
            assert path.name in str(exc) and exc.reason
            continue
        assert samples, f"{path.name}: parsed but gave no samples"
        assert {s.metric for s in samples} <= set(catalogue.METRICS), path.name
        assert path.name in EXPECT, f"{path.name}: new fixture, add spot checks"
        for metric, port, lane, value in EXPECT[path.name]:
            assert _one(samples, metric, port, lane).value == pytest.approx(value), (path.name, metric, port)


def test_dom_rules_on_real_walks() -> None:
    text = (REAL / "librenms_arista_eos_4.20.12.1M_dcs-7150s-24.snmprec").read_text()
    mapped = samples_from_varbinds(parse_snmprec_varbinds(text), device="a", ts_ms=1)
    # RX power -1000000000 is a "no reading" sentinel: dropped and said so, not clamped.
    assert not [s for s in mapped.samples if s.metric == "optic_rx_power_dbm" and s.port == "Ethernet21"]
    assert any("negative value" in w and "Ethernet21/rx" in w for w in mapped.warnings)
    # Non-optic temperature sensors become device temperatures named after the component.
    cpu = [s for s in mapped.samples if s.metric == "device_temperature_celsius" and s.port == "Cpu temp sensor"]
    assert [s.value for s in cpu] == [41.8]

    cisco = (REAL / "librenms_cisco_nxos_10.5.2_n9k-c93180yc-fx3.snmprec").read_text()
    mapped = samples_from_varbinds(parse_snmprec_varbinds(cisco), device="c", ts_ms=1)
    # Cisco lanes "Lane 1" with 0 dBm / 0 dBm / 0 A: no optical monitoring -> dropped with a warning.
    assert not [s for s in mapped.samples if s.metric == "optic_rx_power_dbm"]
    assert any("Ethernet1/25/0" in w for w in mapped.warnings)
    # Management, VLAN, loopback and nve interfaces are not fabric ports.
    ports = {s.port for s in mapped.samples if s.metric == "port_oper_up"}
    assert not ports & {"mgmt0", "Vlan1", "loopback0", "nve1"} and "Ethernet1/54" in ports


def test_counter_widths_and_packet_sum() -> None:
    text = (REAL / "librenms_arista_eos_4.20.12.1M_dcs-7150s-24.snmprec").read_text()
    samples, _ = parse_snmprec(text, device="a", ts_ms=1)
    assert _one(samples, "port_rx_bytes_total", "Ethernet1").counter_bits == 64
    assert _one(samples, "port_rx_errors_total", "Ethernet1").counter_bits == 32  # ifInErrors Counter32
    vb = {o: v for o, _, v in parse_snmprec_varbinds(text)}
    want = sum(int(vb[oid(f"1.3.6.1.2.1.31.1.1.1.{c}.1")]) for c in (7, 8, 9))  # HC ucast+mcast+bcast
    assert _one(samples, "port_rx_packets_total", "Ethernet1").value == want
    assert "Port-Channel1" not in {s.port for s in samples}  # LAGs aggregate members


def test_lldp_neighbours_from_real_walk() -> None:
    text = (REAL / "librenms_arista_eos_4.20.12.1M_dcs-7150s-24.snmprec").read_text()
    _, neighbors = parse_snmprec(text, device="a", ts_ms=1)
    assert Neighbor("Ethernet23", "switchname3", "Ethernet23") in neighbors  # portId subtype 5
    assert Neighbor("Ethernet1", "switchname2", "47") in neighbors  # subtype local(7): portDesc
    assert len(neighbors) == 4


def test_fcs_errors_and_garbled_values() -> None:
    # No real walk carries dot3StatsFCSErrors (only dot3StatsIndex/DuplexStatus); use varbinds.
    base = [(oid("1.3.6.1.2.1.31.1.1.1.1.7"), "OctetString", b"Ethernet7"),
            (oid("1.3.6.1.2.1.2.2.1.3.7"), "Integer", 6)]
    mapped = samples_from_varbinds(base + [
        (oid("1.3.6.1.2.1.10.7.2.1.3.7"), "Counter32", 12),
        (oid("1.3.6.1.2.1.31.1.1.1.6.7"), "OctetString", b"garbage"),
    ], device="d", ts_ms=5)
    fcs = _one(mapped.samples, "port_rx_fcs_errors_total", "Ethernet7")
    assert (fcs.value, fcs.counter_bits, fcs.ts_ms) == (12, 32, 5)
    assert not [s for s in mapped.samples if s.metric == "port_rx_bytes_total"]
    assert any("1.3.6.1.2.1.31.1.1.1.6.7" in w and "garbled" in w for w in mapped.warnings)


def test_watts_to_dbm() -> None:
    assert watts_to_dbm(0.001) == pytest.approx(0.0)
    assert watts_to_dbm(0.0) == -40.0
    assert watts_to_dbm(1e-12) == -40.0


@pytest.mark.parametrize(("text", "line", "reason"), [
    ("1.3.6.1.2.1.1.5.0|4|sw1\n1.3.6.1.2.1.31.1.1.1.6.1|70", 2, "expected 'oid|type|value'"),
    ("1.3.6.1.2.1.1.5.0|4|sw1\n\n1.3.6.1.2.1.31.1.1.1.6.1|70|12x4", 3, "not an integer"),
    ("1.3.6.1.2.1.31.1.1.1.6.1|65|4294967296", 1, "out of range"),
    ("1.3.6.1.2.1.31.1.1.1.6.1|99|1", 1, "type tag"),
    ("iso.3.6|2|1", 1, "numeric OID"),
    ("1.3.6.1.2.1.31.1.1.1.1.1|4x|zz", 1, "bad hex"),
])
def test_malformed_snmprec_names_the_line(text: str, line: int, reason: str) -> None:
    with pytest.raises(ParseError) as info:
        parse_snmprec(text, device="d", ts_ms=1, source="bad.snmprec")
    assert info.value.line == line and reason in info.value.reason
    assert str(info.value).startswith(f"bad.snmprec:{line}:")


def test_truncated_real_recording() -> None:
    lines = (DATA / "arista_eos_4.20_dcs-7150s-24.snmprec").read_text().splitlines()
    cut = "\n".join(lines[:200]) + "\n" + lines[200][: lines[200].index("|")]  # cut mid-line
    with pytest.raises(ParseError) as info:
        parse_snmprec(cut, device="d", ts_ms=1, source="cut.snmprec")
    assert info.value.line == 201


def test_walk_plan_follows_poll_groups() -> None:
    from collectors import snmp_oids as O
    from collectors.snmp import walk_plan

    def cols(poll_groups: list[str] | None) -> set[tuple[int, ...]]:
        return {c for group in walk_plan(list(O.DEFAULT_GROUPS), poll_groups) for c in group}

    everything = cols(None)
    assert everything == {c for g in O.WALK_GROUPS.values() for c in g}
    naming = {(*O.IF_ENTRY, O.IF_DESCR), (*O.IF_ENTRY, O.IF_TYPE), (*O.IFX_ENTRY, O.IFX_NAME)}
    lldp = set(O.WALK_GROUPS["lldp_rem"]) | set(O.WALK_GROUPS["lldp_loc"])
    state, counters, optics = cols(["state"]), cols(["counters"]), cols(["optics"])
    assert naming <= state & counters & optics
    assert lldp <= state and not lldp & (counters | optics)
    assert (*O.IFX_ENTRY, O.IFX_HC_IN_OCTETS) in counters and (*O.IFX_ENTRY, O.IFX_HC_IN_OCTETS) not in state
    assert set(O.WALK_GROUPS["jnx_dom"]) <= optics and not set(O.WALK_GROUPS["jnx_dom"]) & (state | counters)
    # ENTITY sensors give optics and device_temperature_celsius, which group_of also files under optics
    assert set(O.WALK_GROUPS["ent_sensor"]) <= optics and not set(O.WALK_GROUPS["ent_sensor"]) & (state | counters)
    assert cols(["counters", "optics", "state"]) == everything
