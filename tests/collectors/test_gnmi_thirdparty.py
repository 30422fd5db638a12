"""The gNMI collector, poll and stream, against a gNMI server not written here (Splice, PyPI splice-gnmi).

Splice answers only exact path prefixes and sends empty heartbeat notifications, as caching
targets do. It serves real openconfig output: an SR Linux interface state (gnmic Get) and an
Arista cEOS interface state (pygnmi Get), both vendored in tests/data/real/gnmi/ (SOURCES.md),
plus a component tree and per-lane optics in the shape openconfig-platform(-transceiver) gives
them (the captures hold no DOM for these interfaces; those values are set by the tests).
Every value asserted was checked by hand against the capture.
"""

from __future__ import annotations

import json
import threading
import time
from collections.abc import Callable, Iterator
from pathlib import Path
from typing import Any

import pytest

from collectors.base import Target
from collectors.gnmi import collect_gnmi, stream_gnmi
from service.telemetry.samples import Sample
from tests.collectors.gnmi_servers import leaves_of, splice_data, splice_server

SRL = "nokia_srlinux_oc_gnmic_get_interface_ethernet-1-31_state.json"
CEOS = "arista_ceos_pygnmi_get_interface_Ethernet2_state.json"
COMP = "/components/component[name={}]"
LANE = COMP + "/transceiver/physical-channels/channel[index={}]/state/input-power/instant"


def fabric(lane2_dbm: float = -12.0) -> dict[str, Any]:
    data = {**leaves_of(SRL), **leaves_of(CEOS)}
    data.update({
        # SR Linux's port and transceiver components (names as its interface state gives them)
        COMP.format("Ethernet-1/31-Port") + "/state/type": "openconfig-platform-types:PORT",
        COMP.format("Ethernet-1/31-transceiver") + "/state/type": "openconfig-platform-types:TRANSCEIVER",
        COMP.format("Ethernet-1/31-transceiver") + "/state/parent": "Ethernet-1/31-Port",
        LANE.format("Ethernet-1/31-transceiver", 0): -2.25,
        LANE.format("Ethernet-1/31-transceiver", 1): -2.5,
        LANE.format("Ethernet-1/31-transceiver", 2): lane2_dbm,
        LANE.format("Ethernet-1/31-transceiver", 3): -2.75,
        # cEOS names the transceiver like its interface (state/transceiver = "Ethernet2")
        LANE.format("Ethernet2", 0): -3.5,
        # a SONiC-style name with no tie leaf: the name pattern ties it to Ethernet8
        LANE.format("transceiver-Ethernet8", 0): -4.5,
        # a name that fits no pattern and no tie: reported, not guessed
        LANE.format("QSFP-DD 7", 0): -5.5,
    })
    return data


def write(path: Path, data: dict[str, Any]) -> None:
    tmp = path.with_suffix(".tmp")
    tmp.write_text(json.dumps(splice_data(data)))
    tmp.replace(path)


@pytest.fixture
def splice(tmp_path: Path) -> Iterator[tuple[int, Path]]:
    data = tmp_path / "splice.json"
    write(data, fabric())
    with splice_server(data) as port:
        yield port, data


def tgt(port: int, **params: Any) -> Target:
    return Target(name="spine11/gnmi", device="spine11", protocol="gnmi", port=port, timeout_s=3.0,
                  params={"tls": False, "sample_interval_s": 0.5, **params})


def one(samples: list[Sample], metric: str, **labels: Any) -> float:
    hits = {s.value for s in samples if s.metric == metric and all(getattr(s, k) == v for k, v in labels.items())}
    assert len(hits) == 1, (metric, labels, hits)
    return hits.pop()


def check_fabric(samples: list[Sample], lane2: float = -12.0) -> None:
    # SR Linux capture: in-octets 28252060, in-errors 3, out-octets 256009833, oper-status UP
    assert one(samples, "port_rx_bytes_total", port="ethernet-1/31") == 28252060
    assert one(samples, "port_rx_errors_total", port="ethernet-1/31") == 3
    assert one(samples, "port_tx_bytes_total", port="ethernet-1/31") == 256009833
    assert one(samples, "port_oper_up", port="ethernet-1/31") == 1.0
    # cEOS capture: in-octets 11932114, carrier-transitions 2
    assert one(samples, "port_rx_bytes_total", port="Ethernet2") == 11932114
    assert one(samples, "port_carrier_changes_total", port="Ethernet2") == 2
    # optics under the interface, not the component
    assert one(samples, "optic_rx_power_dbm", port="ethernet-1/31", lane=2) == lane2
    assert one(samples, "optic_rx_power_dbm", port="ethernet-1/31", lane=0) == -2.25
    assert one(samples, "optic_rx_power_dbm", port="Ethernet2", lane=0) == -3.5
    assert one(samples, "optic_rx_power_dbm", port="Ethernet8", lane=0) == -4.5
    ports = {s.port for s in samples}
    assert not ports & {"Ethernet-1/31-transceiver", "transceiver-Ethernet8", "QSFP-DD 7"}


def test_poll_discovers_the_prefix_splice_answers(splice: tuple[int, Path]) -> None:
    port, _ = splice
    r = collect_gnmi(tgt(port), now_ms=1)
    assert r.ok, r.error
    check_fabric(r.samples)
    paths = r.discovery["paths"]
    # key-less list paths answer nothing on Splice; the parent prefix does, and is remembered
    assert paths["/interfaces/interface/state/counters"]["path"] == "/interfaces/interface"
    assert paths["/components/component/transceiver/physical-channels/channel/state"]["path"] == \
        "/components/component"
    assert r.discovery["capabilities"]["encodings"] == ["JSON_IETF", "PROTO"]
    assert any("'QSFP-DD 7': not tied to a port" in w for w in r.warnings), r.warnings
    # the next poll starts from what was learned: one Get per prefix, same values
    again = collect_gnmi(tgt(port, discovery=r.discovery), now_ms=2)
    assert again.ok and again.discovery == r.discovery
    check_fabric(again.samples)


def _stream(target: Target, stop: threading.Event) -> tuple[list[Sample], list[tuple[str, str]], list[str],
                                                               threading.Thread]:
    samples: list[Sample] = []
    states: list[tuple[str, str]] = []
    errors: list[str] = []
    th = threading.Thread(target=stream_gnmi, args=(target, samples.extend, stop), daemon=True,
                          kwargs={"on_error": errors.append, "on_state": lambda s, r: states.append((s, r)),
                                  "backoff_initial_s": 0.2})
    th.start()
    return samples, states, errors, th


def _wait(cond: Callable[[], bool], timeout: float = 15.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.05)
    return cond()


def test_stream_from_splice_sees_a_lane_decay(splice: tuple[int, Path]) -> None:
    port, data = splice
    stop = threading.Event()
    samples, states, errors, th = _stream(tgt(port), stop)
    try:
        assert _wait(lambda: any(s.metric == "optic_rx_power_dbm" and s.lane == 2 for s in samples)), errors
        check_fabric([s for s in samples if not (s.metric == "optic_rx_power_dbm" and s.lane == 2)] +
                     [next(s for s in samples if s.metric == "optic_rx_power_dbm" and s.lane == 2)])
        write(data, fabric(lane2_dbm=-28.0))
        assert _wait(lambda: any(s.metric == "optic_rx_power_dbm" and s.lane == 2 and s.value == -28.0
                                 for s in samples)), errors
    finally:
        stop.set()
        th.join(5)
    assert states[0][0] == "streaming"
    lane2 = [s.value for s in samples if s.metric == "optic_rx_power_dbm" and s.port == "ethernet-1/31"
             and s.lane == 2]
    assert lane2[0] == -12.0 and lane2[-1] == -28.0


def test_stream_of_empty_updates_is_stalled_not_alive(tmp_path: Path) -> None:
    # A target that serves nothing of the path set: Splice still sends a notification every
    # interval (empty) and a heartbeat every second. That used to count as a live stream.
    data = tmp_path / "empty.json"
    write(data, {"/system/state/hostname": "spine11"})
    with splice_server(data) as port:
        stop = threading.Event()
        _, states, errors, th = _stream(tgt(port, sample_interval_s=0.2) .model_copy(update={"timeout_s": 1.0}),
                                        stop)
        try:
            assert _wait(lambda: any(s == "stalled" for s, _ in states), timeout=10), (states, errors)
        finally:
            stop.set()
            th.join(5)
    reason = next(r for s, r in states if s == "stalled")
    assert "no data for 1.6s" in reason and "empty updates are not data" in reason
    assert "streaming" not in [s for s, _ in states]


def test_poll_serves_arista_eos_captured_dom_and_temperatures(tmp_path: Path) -> None:
    # Splice serving only what EOS itself answered (aristanetworks/openmgmt gnmic examples, SOURCES.md):
    # per-lane DOM under "EthernetN transceiver" components (no tie leaves: the name pattern ties them),
    # component temperatures (decimal64 in the capture; the published comma typo restored) and one
    # interface's state and counters.
    from collectors.gnmi_decode import json_leaves
    from tests.collectors.gnmi_servers import REAL

    data: dict[str, Any] = dict(leaves_of("arista_eos_gnmic_get_oc_transceiver_physical_channels_dom_all.json"))
    text = (REAL / "arista_eos_gnmic_get_component_temperature_decimal64.json").read_text()
    groups, _ = json_leaves(text.replace('+01:00"\n', '+01:00",\n', 1), source="fixed")
    data.update({leaf.text(): str(leaf.value) for leaves in groups for leaf in leaves})  # EOS sends them as strings
    # Ethernet1's state with counters (the published output starts with "[[": one bracket removed)
    text = (REAL / "arista_eos_gnmic_get_interface_Ethernet1_state_counters.json").read_text()
    groups, _ = json_leaves(text.replace("[[", "[", 1), source="fixed")
    data.update({leaf.text(): leaf.value for leaves in groups for leaf in leaves})
    path = tmp_path / "eos.json"
    write(path, data)
    with splice_server(path) as port:
        r = collect_gnmi(tgt(port), now_ms=1)
    assert r.ok, r.error
    # input-power "1.15" / "1.11" dBm, laser-bias-current "0.0" mA, `output-power {}` empty: no Tx power
    assert one(r.samples, "optic_rx_power_dbm", port="Ethernet49", lane=0) == 1.15
    assert one(r.samples, "optic_rx_power_dbm", port="Ethernet50", lane=0) == 1.11
    assert one(r.samples, "optic_tx_bias_amperes", port="Ethernet49", lane=0) == 0.0
    assert not [s for s in r.samples if s.metric == "optic_tx_power_dbm"]
    assert one(r.samples, "device_temperature_celsius", port="TempSensor7") == 41.168000000000006
    assert one(r.samples, "device_temperature_celsius", port="DomTemperatureSensor49") == 27.140625
    # Ethernet1: in-octets "111398", out-octets "117389", in-fcs-errors "0", oper-status UP
    assert one(r.samples, "port_rx_bytes_total", port="Ethernet1") == 111398
    assert one(r.samples, "port_tx_bytes_total", port="Ethernet1") == 117389
    assert one(r.samples, "port_rx_fcs_errors_total", port="Ethernet1") == 0
    assert one(r.samples, "port_oper_up", port="Ethernet1") == 1.0
