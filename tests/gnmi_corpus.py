"""The gNMI capture corpus: every real capture in tests/data/real/gnmi, with what it must give.

A check function asserts hand-checked values (the raw value is in its comment or the capture);
a string is the reason the parser must refuse the capture with (a ParseError naming it).
Shared by tests/collectors/test_gnmi_fixtures.py and bench/device_conformance.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable

from tests.paths import FIXTURES

GNMI = FIXTURES / "gnmi"


def one(samples: list, metric: str, **labels: object) -> float:
    hits = [s for s in samples if s.metric == metric and all(getattr(s, k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0].value


def _check_arista_dom_all(samples: list) -> None:
    assert one(samples, "optic_rx_power_dbm", port="Ethernet49", lane=0) == 1.15
    assert one(samples, "optic_rx_power_dbm", port="Ethernet50", lane=0) == 1.11
    assert one(samples, "optic_tx_bias_amperes", port="Ethernet49", lane=0) == 0.0
    assert {s.ts_ms for s in samples} == {1626293085257}  # data time from the notification
    assert not [s for s in samples if s.metric == "optic_tx_power_dbm"]  # `output-power {}` is empty


def _check_ciena(samples: list) -> None:
    assert one(samples, "port_rx_bytes_total", port="1") == 95890972327359
    assert one(samples, "port_tx_bytes_total", port="1") == 885293268981054
    assert one(samples, "port_rx_discards_total", port="1") == 236
    assert one(samples, "port_rx_packets_total", port="1") == 222159970919
    assert samples[0].ts_ms == 1739206587847


def _check_prefixed(samples: list) -> None:
    # interface has no key; the quoted `name` leaf (`\"1\`) is the only identity
    assert one(samples, "port_rx_bytes_total", port="1") == 0
    assert samples[0].ts_ms == 1696617695101


def _check_qmon(samples: list) -> None:
    assert {s.priority for s in samples} == set(range(10))  # queues 0..9, keys on name-less elems
    assert all(s.port == "xe-0/0/0:0" and s.metric == "port_queue_drops_total" for s in samples)
    assert one(samples, "port_queue_drops_total", priority=0) == 0


def _check_junos_optics(samples: list) -> None:
    assert one(samples, "optic_temperature_celsius", port="et-0/0/0") == 36.66  # floatVal
    # bytesVal holds big-endian IEEE floats: 'QBR64Q==' is 2.32 dBm, 'vY9cKQ==' is -0.07 dBm
    assert one(samples, "optic_tx_power_dbm", port="et-0/0/0", lane=0) == 2.32
    assert one(samples, "optic_rx_power_dbm", port="et-0/0/0", lane=0) == -0.07
    assert one(samples, "optic_rx_power_dbm", port="et-0/0/0", lane=2) == 0.82
    assert math.isclose(one(samples, "optic_tx_bias_amperes", port="et-0/0/0", lane=3), 0.090)  # 90 mA


# Every file must appear here: parsed (with a spot check) or rejected (with the reason's words).
def _srl_interface_state(samples: list) -> None:
    assert one(samples, "port_rx_bytes_total", port="ethernet-1/31") == 28252060
    assert one(samples, "port_rx_errors_total", port="ethernet-1/31") == 3
    assert one(samples, "port_oper_up", port="ethernet-1/31") == 1.0


EXPECTED: dict[str, Callable[[list], None] | str] = {
    # pygnmi's get() rendering is not a capture format we read; tests/collectors/gnmi_servers.py serves it
    "arista_ceos_pygnmi_get_interface_Ethernet2_state.json": "neither gnmic ('updates') nor SubscribeResponse",
    "nokia_srlinux_oc_gnmic_get_interface_ethernet-1-31_state.json": _srl_interface_state,
    "arista_eos_gnmic_get_component_temperature_decimal64.json": "invalid JSON: Expecting ','",
    "arista_eos_gnmic_get_interface_Ethernet1_state_counters.json": "invalid JSON",
    "arista_eos_gnmic_get_oc_transceiver_physical_channels_dom_Ethernet49.json": "has no timestamp",
    "arista_eos_gnmic_get_oc_transceiver_physical_channels_dom_all.json": _check_arista_dom_all,
    "arista_eos_gnmic_lanz_data_streaming.json": "none of the 35 leaves maps",
    "telegraf_issue12931_srlinux_interface_transceiver_subscribe.json": "none of the 5 leaves maps",
    "telegraf_issue14063_oc_if_counters_prefixed_subscribe.json": _check_prefixed,
    "telegraf_issue16476_ciena_oc_if_counters_subscribe.json": _check_ciena,
    "telegraf_issue16515_junos_qmon_queue_drops_subscribe.json": _check_qmon,
    "telegraf_issue17154_junos_optics_lanediags_subscribe.json": _check_junos_optics,
}
