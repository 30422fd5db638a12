"""Property tests: arbitrary input to the parsers never raises anything but their own, named errors."""

from __future__ import annotations

from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st
from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import ParseError
from collectors.gnmi import parse_gnmi_json
from collectors.gnmi_decode import DecodeError, decode_json_typed_value, decode_typed_value, parse_path
from collectors.snmp import parse_snmprec
from service.telemetry.promtext import PromParseError, parse_text

FAST = settings(max_examples=300, deadline=None, suppress_health_check=[HealthCheck.too_slow])

# Text that looks like the formats, so the properties reach deep into the parsers, not just line one.
prom_chars = st.sampled_from(list('abc_:{}=",\\ \n#0123456789.-+eEInfNa\t') + ["port", "device", "lane"])
prom_text = st.lists(prom_chars, max_size=200).map("".join)


@FAST
@given(prom_text)
def test_prometheus_text(text: str) -> None:
    try:
        lines = parse_text(text, source="fuzz")
    except PromParseError as exc:
        assert exc.source == "fuzz" and exc.line >= 1 and str(exc).startswith(f"fuzz:{exc.line}: ")
        return
    for line in lines:
        assert line.name and isinstance(line.value, float)


snmprec_chars = st.sampled_from(list("0123456789.|x\n ") + ["1.3.6.1.2.1.2.2.1.10.1", "|65|", "|4x|", "|70|"])


@FAST
@given(st.lists(snmprec_chars, max_size=120).map("".join))
def test_snmprec(text: str) -> None:
    try:
        parse_snmprec(text, device="d", ts_ms=0, source="fuzz.snmprec")
    except ParseError as exc:
        assert "fuzz.snmprec" in str(exc)


typed_values = st.one_of(
    st.builds(lambda v: gnmi_pb2.TypedValue(double_val=v), st.floats(allow_nan=True)),
    st.builds(lambda v: gnmi_pb2.TypedValue(float_val=v), st.floats(width=32)),
    st.builds(lambda v: gnmi_pb2.TypedValue(int_val=v), st.integers(-(2**63), 2**63 - 1)),
    st.builds(lambda v: gnmi_pb2.TypedValue(uint_val=v), st.integers(0, 2**64 - 1)),
    st.builds(lambda v: gnmi_pb2.TypedValue(string_val=v), st.text(max_size=30)),
    st.builds(lambda v: gnmi_pb2.TypedValue(bytes_val=v), st.binary(max_size=16)),
    st.builds(lambda v: gnmi_pb2.TypedValue(json_val=v), st.binary(max_size=40)),
    st.builds(lambda v: gnmi_pb2.TypedValue(json_ietf_val=v), st.binary(max_size=40)),
    st.builds(lambda d, p: gnmi_pb2.TypedValue(decimal_val=gnmi_pb2.Decimal64(digits=d, precision=p)),
              st.integers(-(2**63), 2**63 - 1), st.integers(0, 2**32 - 1)),
)


@FAST
@given(typed_values)
def test_gnmi_typed_values(tv: gnmi_pb2.TypedValue) -> None:
    try:
        decode_typed_value(tv)
    except DecodeError as exc:
        assert str(exc)


json_scalars = st.one_of(st.none(), st.booleans(), st.integers(), st.floats(), st.text(max_size=10))
json_values = st.recursive(json_scalars, lambda inner: st.lists(inner, max_size=3)
                           | st.dictionaries(st.text(max_size=12), inner, max_size=3), max_leaves=8)


@FAST
@given(st.dictionaries(st.sampled_from(["doubleVal", "floatVal", "intVal", "uintVal", "stringVal", "bytesVal",
                                        "jsonVal", "jsonIetfVal", "decimalVal", "boolVal", "asciiVal"]),
                       json_values, max_size=2))
def test_gnmi_json_typed_values(tv: dict) -> None:
    try:
        decode_json_typed_value(tv)
    except DecodeError as exc:
        assert str(exc)


@FAST
@given(st.text(alphabet=st.sampled_from(list("/[]=ab1*'\" \\:-")), max_size=40))
def test_gnmi_paths(text: str) -> None:
    try:
        parse_path(text)
    except DecodeError as exc:
        assert str(exc)


@FAST
@given(json_values.map(lambda v: __import__("json").dumps(v)) | st.text(max_size=80))
def test_gnmi_capture_json(text: str) -> None:
    try:
        parse_gnmi_json(text, device="d", source="fuzz.json", default_ts_ms=0)
    except ParseError as exc:
        assert "fuzz.json" in str(exc)
