"""Transceiver components tied to ports: the openconfig component tree first, names only as a fallback."""

from __future__ import annotations

from collectors.gnmi_components import PortTies
from collectors.gnmi_decode import Leaf, normalize, parse_path
from collectors.gnmi_paths import map_notification

CH = "/components/component[name={}]/transceiver/physical-channels/channel[index=0]/state/input-power/instant"


def leaf(path: str, value: object) -> Leaf:
    return Leaf(normalize(parse_path(path)), value, 1_700_000_000_000_000_000)


def test_parent_and_hardware_port_tie_a_transceiver_whose_name_says_nothing() -> None:
    leaves = [
        leaf("/interfaces/interface[name=Ethernet8]/state/hardware-port", "openconfig-platform-port:1/8"),
        leaf("/components/component[name=1/8]/subcomponents/subcomponent[name=optic-8]/state/name", "optic-8"),
        leaf("/components/component[name=optic-8]/state/type", "openconfig-platform-types:TRANSCEIVER"),
        leaf("/interfaces/interface[name=Ethernet12]/state/hardware-port", "port-12"),
        leaf("/components/component[name=transceiver-Ethernet99]/state/parent", "port-12"),
        leaf(CH.format("optic-8"), -12.0),
        leaf(CH.format("transceiver-Ethernet99"), -28.0),  # the tree beats the name
    ]
    ties = PortTies()
    ties.learn(leaves)
    assert ties.port_of("optic-8") == ("Ethernet8", "parent hardware-port")
    r = map_notification(leaves, device="sw")
    got = {(s.port, s.value) for s in r.samples if s.metric == "optic_rx_power_dbm"}
    assert got == {("Ethernet8", -12.0), ("Ethernet12", -28.0)}
    assert not r.problems


def test_names_are_the_fallback_and_an_untied_component_is_reported_once() -> None:
    leaves = [leaf(CH.format(name), -3.0) for name in
              ("transceiver-Ethernet0", "Ethernet4 transceiver", "Ethernet-1/31-transceiver", "QSFP-DD 7")]
    leaves.append(leaf(CH.format("QSFP-DD 7").replace("input-power", "output-power"), -1.0))
    r = map_notification(leaves, device="sw")
    assert {s.port for s in r.samples} == {"Ethernet0", "Ethernet4", "Ethernet-1/31"}
    assert len(r.problems) == 1 and "'QSFP-DD 7': not tied to a port" in r.problems[0]
