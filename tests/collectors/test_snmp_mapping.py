"""SNMP mapping without a network: real recorded walks, malformed recordings, unit rules."""

from __future__ import annotations

import math
from pathlib import Path

import pytest

from collectors.base import Neighbor, ParseError
from collectors.snmp import Mapped, parse_snmprec, parse_snmprec_varbinds, samples_from_varbinds
from collectors.snmp_dom import watts_to_dbm
from collectors.snmp_oids import Varbind, oid
from service.telemetry import catalogue
from service.telemetry.samples import Sample
from tests.paths import FIXTURES
from tests.snmp_peers import DATA

REAL = FIXTURES / "snmp"


def _one(samples: list[Sample], metric: str, port: str, lane: int | None = None) -> Sample:
    hits = [s for s in samples if s.metric == metric and s.port == port and s.lane == lane]
    assert len(hits) == 1, f"{metric} {port} lane={lane}: {hits}"
    return hits[0]


def test_every_real_walk_maps_to_catalogue_metrics() -> None:
    # Hand-checked values per walk: tests/data/snmp/conformance.toml (test_snmp_conformance.py).
    files = sorted(REAL.glob("*.snmprec"))
    assert files, f"no fixtures under {REAL}"
    for path in files:
        samples, _ = parse_snmprec(path.read_text(), device="dut", ts_ms=1, source=path.name)
        assert samples, f"{path.name}: parsed but gave no samples"
        assert {s.metric for s in samples} <= set(catalogue.METRICS), path.name


def test_dom_rules_on_real_walks() -> None:
    text = (REAL / "librenms_arista_eos_4.20.12.1M_dcs-7150s-24.snmprec").read_text()
    mapped = samples_from_varbinds(parse_snmprec_varbinds(text), device="a", ts_ms=1)
    # RX power -1000000000 is a "no reading" sentinel: dropped and said so, not clamped.
    assert not [s for s in mapped.samples if s.metric == "optic_rx_power_dbm" and s.port == "Ethernet21"]
    assert any(w.startswith("optics:") and "negative value" in w and "Ethernet21/rx" in w for w in mapped.warnings)
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


# ---------------------------------------------------------------------------
# Port rules (which physical interfaces are fabric ports) on real walks

SONIC = REAL / "librenms_dell_enterprise_sonic_4.4.1_e3248p.snmprec"
CUMULUS = REAL / "librenms_cumulus_5.9.2_nvidia_msn4600_TRIMMED.snmprec"
NXOS7 = REAL / "librenms_cisco_nxos_7.0.3.I7.8_n3k-c3064pq_TRIMMED.snmprec"


def _map(path: Path, **kw: object) -> Mapped:
    return samples_from_varbinds(parse_snmprec_varbinds(path.read_text()), device="d", ts_ms=1, **kw)  # type: ignore[arg-type]


def _ports(mapped: Mapped) -> set[str | None]:
    return {s.port for s in mapped.samples if s.metric == "port_oper_up"}


def test_front_ports_named_like_eth_are_ports() -> None:
    """Dell SONiC's Eth1/N front ports matched the old `eth\\d` management prefix: all 54 were lost."""
    mapped = _map(SONIC)
    ports = _ports(mapped)
    assert ports == {f"Eth1/{n}" for n in range(1, 55)}
    # eth0 is the management port: its ifAlias says so, and an up port left out is said out loud.
    ports_warnings = [w for w in mapped.warnings if w.startswith("ports:")]
    assert ports_warnings == ["ports: 1 up interface(s) not collected as fabric ports: "
                              "eth0 [management (ifAlias 'Management0')]"]


def test_declared_management_ports_are_left_out_quietly() -> None:
    mapped = _map(SONIC, management_ports=["eth0"])
    assert "eth0" not in _ports(mapped) and len(_ports(mapped)) == 54
    assert not [w for w in mapped.warnings if w.startswith("ports:")]


def test_port_pattern_that_drops_an_up_port_is_warned() -> None:
    mapped = _map(SONIC, port_pattern=r"^Eth1/(?:[1-9]|[1-4]\d)$")  # leaves out Eth1/50..54 and eth0
    assert len(_ports(mapped)) == 49
    warning = next(w for w in mapped.warnings if w.startswith("ports:"))
    assert "Eth1/53 [does not match port_pattern" in warning  # up: named
    assert "Eth1/54" not in warning  # down: a rule may leave a down interface out quietly


def test_linux_bonds_are_not_front_ports() -> None:
    """Cumulus reports bonds, bridges and the peer link as ethernetCsmacd like its swp ports."""
    mapped = _map(CUMULUS)
    assert _ports(mapped) == {f"swp{n}" for n in range(1, 65)}
    warning = next(w for w in mapped.warnings if w.startswith("ports:"))
    assert "peerlink [not a cumulus front-panel port name]" in warning and "eth0 [management" in warning


def test_empty_cages_stay_ports() -> None:
    """NX-OS and Junos say ifConnectorPresent false for an empty cage: only an up interface
    without a connector (mgmt0, Junos bme0) is internal."""
    mapped = _map(NXOS7)
    ports = _ports(mapped)
    assert "mgmt0" not in ports and len(ports) == 52
    down = {s.port for s in mapped.samples if s.metric == "port_oper_up" and s.value == 0}
    assert "Ethernet1/9" in down  # ifOperStatus down, ifConnectorPresent false: still watched
    assert any(w.startswith("ports:") and "mgmt0 [up without a connector" in w for w in mapped.warnings)


def test_blind_spots_are_reported_per_polled_group() -> None:
    cumulus_421 = REAL / "librenms_cumulus_4.2.1_mellanox_spectrum.snmprec"  # no counters, no DOM
    every = _map(cumulus_421).warnings
    assert any(w.startswith("counters:") and "ifHCInOctets (56 of 56 ports)" in w for w in every)
    assert any(w.startswith("optics:") and "no transceiver reading" in w for w in every)
    state_only = _map(cumulus_421, groups=["state"]).warnings
    assert not [w for w in state_only if w.startswith(("counters:", "optics:"))]
    assert any(w.startswith("state:") and "ifHighSpeed" in w for w in state_only)


# ---------------------------------------------------------------------------
# DOM: sensors to ports and lanes, on walks built from single varbinds

_SENSOR, _W, _DBM = 8, 6, 14  # entPhysicalClass sensor; sensor types watts, dBm


def _walk(ifnames: dict[int, str], entities: list[tuple[int, str, int]],
          sensors: list[tuple[int, int, int]], sys_descr: str = "test agent") -> list[Varbind]:
    """ifIndex -> ifName; entities (index, descr, contained-in); sensors (index, type, value in
    thousandths: of a dBm, or of a mW)."""
    out: list[Varbind] = [(oid("1.3.6.1.2.1.1.1.0"), "OctetString", sys_descr.encode())]
    for i, name in ifnames.items():
        out += [(oid(f"1.3.6.1.2.1.31.1.1.1.1.{i}"), "OctetString", name.encode()),
                (oid(f"1.3.6.1.2.1.2.2.1.3.{i}"), "Integer", 6), (oid(f"1.3.6.1.2.1.2.2.1.8.{i}"), "Integer", 1)]
    for idx, descr, parent in entities:
        out += [(oid(f"1.3.6.1.2.1.47.1.1.1.1.2.{idx}"), "OctetString", descr.encode()),
                (oid(f"1.3.6.1.2.1.47.1.1.1.1.4.{idx}"), "Integer", parent)]
    for idx, stype, value in sensors:
        out += [(oid(f"1.3.6.1.2.1.99.1.1.1.{col}.{idx}"), "Integer", v)
                for col, v in ((1, stype), (2, 8), (3, 3 if stype == _W else 0), (4, value), (5, 1))]
    return out


def _lanes(mapped: Mapped, metric: str = "optic_rx_power_dbm") -> dict[tuple[str | None, int | None], float]:
    return {(s.port, s.lane): s.value for s in mapped.samples if s.metric == metric}


@pytest.mark.parametrize(("names", "port"), [
    (["Ethernet1 Lane {n} Transceiver Receive Power Sensor"], "Ethernet1"),  # Cisco
    (["DOM RX Power Sensor for Ethernet1/{n}"], "Ethernet1"),  # SONiC: a /N suffix on the port name
    (["RX power et-0/0/1-{n}"], "et-0/0/1"),  # -N
    (["Xcvr Rx Power {n}"], "swp5"),  # a trailing N
    (["DOM Rx{n} Power"], "swp5"),  # RxN
    (["Transceiver Channel {n} RX power"], "swp5"),
])
def test_every_common_lane_form_is_placed(names: list[str], port: str) -> None:
    module = f"QSFP28 transceiver for {port}"
    sensors = [(100 + n, _DBM, -1000 * n) for n in range(1, 5)]  # lane n reads -n dBm
    walk = _walk({7: port}, [(99, module, 1)] + [(100 + n, names[0].format(n=n), 99) for n in range(1, 5)],
                 sensors)
    mapped = samples_from_varbinds(walk, device="d", ts_ms=1)
    assert _lanes(mapped) == {(port, n - 1): -float(n) for n in range(1, 5)}, mapped.warnings


def test_a_lane_that_cannot_be_placed_is_named() -> None:
    """Two Rx sensors on one port and neither names a lane: which is which? Say so, drop neither silently."""
    walk = _walk({7: "swp5"}, [(99, "QSFP28 transceiver for swp5", 1), (101, "DOM RX Power Sensor", 99),
                               (102, "DOM RX Power Sensor", 99)], [(101, _DBM, -1000), (102, _DBM, -2000)])
    mapped = samples_from_varbinds(walk, device="d", ts_ms=1)
    assert not _lanes(mapped)
    warning = next(w for w in mapped.warnings if "could not be placed on a lane" in w)
    assert "'DOM RX Power Sensor' (101)" in warning and "'DOM RX Power Sensor' (102)" in warning


def test_a_sensor_tied_to_no_port_is_named() -> None:
    walk = _walk({7: "swp5"}, [(101, "DOM RX Power Sensor for swp99", 1)], [(101, _DBM, -1000)])
    mapped = samples_from_varbinds(walk, device="d", ts_ms=1)
    assert any(w.startswith("optics:") and "'DOM RX Power Sensor for swp99' (101)" in w for w in mapped.warnings)


def test_sonic_index_layout_ties_sensors_without_names() -> None:
    """sonic-snmpagent numbers a transceiver's entities from the ifIndex: the names need not
    name any interface (Dell SONiC says "Ethernet52" for ifName Eth1/53)."""
    layouts = {
        "sonic": (1_000_000_000 + 53 * 100, lambda n: 30 + n),  # 1e9 + ifIndex*100 + rx(3)*10 + lane
        "sonic-legacy": (53 * 1000, lambda n: n * 10 + 1),  # ifIndex*1000 + lane*10 + rx(1)
    }
    for base, offset in layouts.values():
        entities = [(base, "QSFP28 for Ethernet52", 1)] + [(base + offset(n), "DOM RX Power Sensor", base)
                                                          for n in range(1, 5)]
        walk = _walk({53: "Eth1/53"}, entities, [(base + offset(n), _W, 1000 - 100 * n) for n in range(1, 5)],
                     sys_descr="SONiC Software Version: SONiC.4.4.1-Lite")
        mapped = samples_from_varbinds(walk, device="d", ts_ms=1)
        assert _lanes(mapped) == {("Eth1/53", n - 1): pytest.approx(10 * math.log10(1 - 0.1 * n))
                                  for n in range(1, 5)}, mapped.warnings
        # The same walk from an OS without that layout: not tied, and said so.
        other = samples_from_varbinds(walk[1:], device="d", ts_ms=1)
        assert not _lanes(other) and any("could not be tied to a port" in w for w in other.warnings)
