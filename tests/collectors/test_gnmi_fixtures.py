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
from tests.gnmi_corpus import EXPECTED, GNMI, one


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
    assert one(s, "device_temperature_celsius", port="TempSensor7") == 41.168000000000006
    assert one(s, "device_temperature_celsius", port="DomTemperatureSensor50") == 27.09375
    assert one(s, "device_temperature_celsius", port="TempSensor3") == 21  # no precision: 0
    assert s[0].ts_ms == 1626294876186


def test_missing_timestamp_uses_the_callers_default() -> None:
    name = "arista_eos_gnmic_get_oc_transceiver_physical_channels_dom_Ethernet49.json"
    s = parse_gnmi_json((GNMI / name).read_text(), device="sw1", source=name, default_ts_ms=1_000)
    assert one(s, "optic_rx_power_dbm", port="Ethernet49", lane=0) == 1.08
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
