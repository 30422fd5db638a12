"""parse_gnmi_json against every real gNMI capture, plus the pure decoding helpers."""

from __future__ import annotations

import base64
import json
from decimal import Decimal
from pathlib import Path

import pytest
from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import ParseError
from collectors.gnmi import parse_gnmi_json
from collectors.gnmi_decode import (
    DecodeError,
    decode_json_typed_value,
    decode_typed_value,
    format_path,
    normalize,
    parse_path,
)
from service.telemetry import catalogue
from tests.paths import FIXTURES

GNMI = FIXTURES / "gnmi"


def _one(samples: list, metric: str, **labels: object) -> float:
    hits = [s for s in samples if s.metric == metric and all(getattr(s, k) == v for k, v in labels.items())]
    assert len(hits) == 1, (metric, labels, hits)
    return hits[0].value


def _check_arista_dom_all(samples: list) -> None:
    assert _one(samples, "optic_rx_power_dbm", port="Ethernet49", lane=0) == 1.15
    assert _one(samples, "optic_rx_power_dbm", port="Ethernet50", lane=0) == 1.11
    assert _one(samples, "optic_tx_bias_amperes", port="Ethernet49", lane=0) == 0.0
    assert {s.ts_ms for s in samples} == {1626293085257}  # data time from the notification
    assert not [s for s in samples if s.metric == "optic_tx_power_dbm"]  # `output-power {}` is empty


def _check_ciena(samples: list) -> None:
    assert _one(samples, "port_rx_bytes_total", port="1") == 95890972327359
    assert _one(samples, "port_tx_bytes_total", port="1") == 885293268981054
    assert _one(samples, "port_rx_discards_total", port="1") == 236
    assert _one(samples, "port_rx_packets_total", port="1") == 222159970919
    assert samples[0].ts_ms == 1739206587847


def _check_prefixed(samples: list) -> None:
    # interface has no key; the quoted `name` leaf (`\"1\`) is the only identity
    assert _one(samples, "port_rx_bytes_total", port="1") == 0
    assert samples[0].ts_ms == 1696617695101


def _check_qmon(samples: list) -> None:
    assert {s.priority for s in samples} == set(range(10))  # queues 0..9, keys on name-less elems
    assert all(s.port == "xe-0/0/0:0" and s.metric == "port_queue_drops_total" for s in samples)
    assert _one(samples, "port_queue_drops_total", priority=0) == 0


def _check_junos_optics(samples: list) -> None:
    assert _one(samples, "optic_temperature_celsius", port="et-0/0/0") == 36.66  # floatVal
    # bytesVal holds big-endian IEEE floats: 'QBR64Q==' is 2.32 dBm, 'vY9cKQ==' is -0.07 dBm
    assert _one(samples, "optic_tx_power_dbm", port="et-0/0/0", lane=0) == 2.32
    assert _one(samples, "optic_rx_power_dbm", port="et-0/0/0", lane=0) == -0.07
    assert _one(samples, "optic_rx_power_dbm", port="et-0/0/0", lane=2) == 0.82
    assert _one(samples, "optic_tx_bias_amperes", port="et-0/0/0", lane=3) == pytest.approx(0.090)  # 90 mA


# Every file must appear here: parsed (with a spot check) or rejected (with the reason's words).
def _srl_interface_state(samples: list) -> None:
    assert _one(samples, "port_rx_bytes_total", port="ethernet-1/31") == 28252060
    assert _one(samples, "port_rx_errors_total", port="ethernet-1/31") == 3
    assert _one(samples, "port_oper_up", port="ethernet-1/31") == 1.0


EXPECTED: dict[str, object] = {
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


def test_every_gnmi_fixture_is_parsed_or_rejected_with_a_reason() -> None:
    files = sorted(p.name for p in GNMI.glob("*"))
    assert files == sorted(EXPECTED), "a gNMI fixture was added or removed: classify it here"
    for name in files:
        text = (GNMI / name).read_text()
        want = EXPECTED[name]
        if isinstance(want, str):
            with pytest.raises(ParseError) as e:
                parse_gnmi_json(text, device="sw1", source=name)
            assert want in str(e.value) and name in str(e.value)
        else:
            samples = parse_gnmi_json(text, device="sw1", source=name)
            assert samples and all(catalogue.get(s.metric) for s in samples)
            assert all(s.device == "sw1" for s in samples)
            want(samples)


def test_decimal64_temperatures_once_the_published_typo_is_fixed() -> None:
    # The published output lacks a comma after "time"; with it restored the decimal64
    # {digits, precision} objects decode exactly.
    text = (GNMI / "arista_eos_gnmic_get_component_temperature_decimal64.json").read_text()
    text = text.replace('+01:00"\n', '+01:00",\n', 1)
    s = parse_gnmi_json(text, device="sw1", source="fixed")
    assert _one(s, "device_temperature_celsius", port="TempSensor7") == 41.168000000000006
    assert _one(s, "device_temperature_celsius", port="DomTemperatureSensor50") == 27.09375
    assert _one(s, "device_temperature_celsius", port="TempSensor3") == 21  # no precision: 0
    assert s[0].ts_ms == 1626294876186


def test_missing_timestamp_uses_the_callers_default() -> None:
    name = "arista_eos_gnmic_get_oc_transceiver_physical_channels_dom_Ethernet49.json"
    s = parse_gnmi_json((GNMI / name).read_text(), device="sw1", source=name, default_ts_ms=1_000)
    assert _one(s, "optic_rx_power_dbm", port="Ethernet49", lane=0) == 1.08
    assert s[0].ts_ms == 1_000


@pytest.mark.parametrize(
    ("text", "reason"),
    [
        ("", "empty input"),
        ("{", "invalid JSON"),
        ("[1]", "not a JSON object"),
        ('[{"foo": 1}]', "neither gnmic"),
        ('[{"update": {"timestamp": "x", "update": []}}]', "is not an integer"),
        ('[{"update": {"timestamp": "5", "update": [{"path": {}, "val": {"uintVal": "a"}}]}}]', "not an integer"),
        ('[{"update": {"timestamp": "5", "update": [{"path": {"elem": [{"name": "interfaces"}, '
         '{"name": "interface", "key": {"name": "e1"}}, {"name": "state"}, {"name": "counters"}, '
         '{"name": "in-octets"}]}, "val": {"stringVal": "lots"}}]}}]', "is not a number"),
        ('[{"error": {"code": 5}}]', "device sent an error"),
    ],
)
def test_malformed_captures_raise_parse_error(text: str, reason: str) -> None:
    with pytest.raises(ParseError) as e:
        parse_gnmi_json(text, device="sw1", source="t.json")
    assert reason in str(e.value)


def test_protojson_typed_value_kinds() -> None:
    assert decode_json_typed_value({"doubleVal": 1.25}) == 1.25
    assert decode_json_typed_value({"floatVal": 36.66}) == 36.66
    assert decode_json_typed_value({"uintVal": "18446744073709551615"}) == 2**64 - 1
    assert decode_json_typed_value({"intVal": -3}) == -3
    assert decode_json_typed_value({"decimalVal": {"digits": "-2709375", "precision": 5}}) == Decimal("-27.09375")
    assert decode_json_typed_value({"bytesVal": "QBR64Q=="}) == bytes.fromhex("40147ae1")
    blob = base64.b64encode(json.dumps({"a": {"b": 1}}).encode()).decode()
    assert decode_json_typed_value({"jsonIetfVal": blob}) == {"a": {"b": 1}}
    assert decode_json_typed_value({"leaflistVal": {"element": [{"intVal": 1}, {"stringVal": "x"}]}}) == [1, "x"]
    assert decode_json_typed_value({"asciiVal": "abc"}) == "abc"
    with pytest.raises(DecodeError):
        decode_json_typed_value({"bytesVal": "!!"})
    with pytest.raises(DecodeError):
        decode_json_typed_value({"anyVal": {}})


def test_proto_typed_value_garbled_json_is_a_decode_error() -> None:
    with pytest.raises(DecodeError, match="json_ietf_val is not valid JSON"):
        decode_typed_value(gnmi_pb2.TypedValue(json_ietf_val=b"{nope"))
    with pytest.raises(DecodeError, match="no value"):
        decode_typed_value(gnmi_pb2.TypedValue())


def test_paths_keep_slashes_inside_keys_and_drop_module_prefixes() -> None:
    p = parse_path("/interfaces/interface[name=ethernet-1/1]/oc-if:state/counters")
    assert [e.name for e in p] == ["interfaces", "interface", "oc-if:state", "counters"]
    assert p[1].key("name") == "ethernet-1/1"
    n = normalize(parse_path("junos/system/qmon-sw/[name=xe-0/0/0:0]/egress/[queue-number=3]/x"))
    assert format_path(n) == "/junos/system/qmon-sw[name=xe-0/0/0:0]/egress[queue-number=3]/x"
    assert format_path(normalize(p)) == "/interfaces/interface[name=ethernet-1/1]/state/counters"
    assert Path(format_path(p)).name == "counters"
