"""gNMI values and paths into plain leaves: TypedValue decoding, path handling, JSON renderings.

Everything here is pure: protobuf messages or JSON text in, `Leaf` objects out. Which leaf
means which canonical metric is gnmi_paths.py's job.
"""

from __future__ import annotations

import base64
import binascii
import json
import re
from collections.abc import Iterator, Mapping
from dataclasses import dataclass
from decimal import Decimal
from typing import Any, NamedTuple

import numpy as np
from pygnmi.spec.v080 import gnmi_pb2

from collectors.base import ParseError

# A decoded leaf value. Decimal keeps decimal64 exact until a metric needs a float;
# bytes stay raw because their meaning (IEEE float, opaque blob) depends on the path.
Scalar = bool | int | float | str | bytes | Decimal
Value = Scalar | list[Scalar]


class DecodeError(ValueError):
    """A TypedValue that cannot be turned into a Python value (garbled or unsupported)."""


class PathElem(NamedTuple):
    name: str
    keys: tuple[tuple[str, str], ...] = ()

    def key(self, k: str) -> str | None:
        for name, val in self.keys:
            if name == k:
                return val
        return None


@dataclass(frozen=True, slots=True)
class Leaf:
    """One value at one fully keyed path, stamped with its notification's time."""

    path: tuple[PathElem, ...]
    value: Value
    ts_ns: int
    origin: str = ""

    @property
    def schema(self) -> str:
        """The path without keys, e.g. `interfaces/interface/state/counters/in-octets`."""
        return "/".join(e.name for e in self.path)

    def text(self) -> str:
        return format_path(self.path, self.origin)


# ---------------------------------------------------------------------------- paths

_ELEM_RE = re.compile(r"\[([^=\]]+)=((?:\\.|[^\]\\])*)\]")


def parse_path(text: str) -> list[PathElem]:
    """Parse gNMI path syntax (`/a/b[k=v]/c`), allowing `/` inside key values."""
    text = text.strip()
    # `origin:/path`: the origin is not part of the path (module prefixes like `oc-if:x` are)
    text = re.sub(r"^[A-Za-z0-9_.-]+:(?=/)", "", text)
    elems: list[PathElem] = []
    i, n = 0, len(text)
    while i < n:
        if text[i] == "/":
            i += 1
            continue
        j = i
        while j < n and text[j] not in "/[":
            j += 1
        name = text[i:j]
        keys: list[tuple[str, str]] = []
        while j < n and text[j] == "[":
            m = _ELEM_RE.match(text, j)
            if m is None:
                raise DecodeError(f"unbalanced key in path {text!r} at {j}")
            keys.append((m.group(1), re.sub(r"\\(.)", r"\1", m.group(2))))
            j = m.end()
        elems.append(PathElem(name, tuple(keys)))
        i = j
    return elems


def format_path(elems: tuple[PathElem, ...] | list[PathElem], origin: str = "") -> str:
    parts = []
    for e in elems:
        keys = "".join(f"[{k}={v.replace(']', chr(92) + ']')}]" for k, v in e.keys)
        parts.append(e.name + keys)
    body = "/" + "/".join(parts)
    return f"{origin}:{body}" if origin else body


def path_to_proto(path: str | list[PathElem], origin: str = "") -> gnmi_pb2.Path:
    elems = parse_path(path) if isinstance(path, str) else path
    return gnmi_pb2.Path(
        origin=origin,
        elem=[gnmi_pb2.PathElem(name=e.name, key=dict(e.keys)) for e in elems],
    )


def path_from_proto(p: gnmi_pb2.Path) -> list[PathElem]:
    if p.elem:
        return [PathElem(e.name, tuple(sorted(e.key.items()))) for e in p.elem]
    # gNMI < 0.4 devices still send the deprecated string elements
    return [PathElem(s) for s in p.element]


def _strip_module(name: str) -> str:
    # `openconfig-interfaces:counters`, `oc-if:interfaces` -> the YANG node name
    return name.rsplit(":", 1)[-1]


def normalize(elems: list[PathElem]) -> tuple[PathElem, ...]:
    """Drop module prefixes and fold name-less keyed elements into the one before.

    Junos sends `qmon-sw/[name=xe-0/0/0:0]` and `egress/[queue-number=0]`: the keys belong
    to the preceding list node (telegraf #16515).
    """
    out: list[PathElem] = []
    for e in elems:
        if not e.name and e.keys and out:
            prev = out[-1]
            out[-1] = PathElem(prev.name, prev.keys + e.keys)
        elif e.name or e.keys:
            out.append(PathElem(_strip_module(e.name), tuple((_strip_module(k), v) for k, v in e.keys)))
    return tuple(out)


# ---------------------------------------------------------------------------- values

def float32(v: float) -> float:
    # float_val is IEEE single precision: give back the shortest decimal that round-trips
    # (36.66, not 36.65999984741211) so thresholds and tests see what the device meant.
    return float(str(np.float32(v)))


def decimal64(digits: int | str, precision: int | str) -> Decimal:
    """decimal64 is digits * 10^-precision."""
    try:
        d, p = int(digits), int(precision)
    except (TypeError, ValueError) as e:
        raise DecodeError(f"decimal64 with non-integer digits/precision {digits!r}/{precision!r}") from e
    if not 0 <= p <= 18:
        raise DecodeError(f"decimal64 precision {p} is outside 0..18")
    return Decimal(d).scaleb(-p)


def _json_bytes(raw: bytes, kind: str) -> Any:
    try:
        return json.loads(raw)
    except (UnicodeDecodeError, json.JSONDecodeError) as e:
        raise DecodeError(f"{kind} is not valid JSON: {e}") from e


def decode_typed_value(tv: gnmi_pb2.TypedValue) -> Any:
    """A protobuf TypedValue as a Python value. JSON kinds come back as parsed JSON."""
    kind = tv.WhichOneof("value")
    if kind is None:
        raise DecodeError("TypedValue carries no value")
    if kind in ("string_val", "ascii_val", "int_val", "uint_val", "bool_val", "bytes_val", "double_val"):
        return getattr(tv, kind)
    if kind == "float_val":
        return float32(tv.float_val)
    if kind == "decimal_val":
        return decimal64(tv.decimal_val.digits, tv.decimal_val.precision)
    if kind in ("json_val", "json_ietf_val"):
        return _json_bytes(getattr(tv, kind), kind)
    if kind == "leaflist_val":
        out = []
        for el in tv.leaflist_val.element:
            v = decode_typed_value(el)
            if isinstance(v, dict | list):
                raise DecodeError("leaflist element is a container")
            out.append(v)
        return out
    raise DecodeError(f"unsupported TypedValue kind {kind}")


def _int(v: Any, kind: str) -> int:
    try:
        return int(v)
    except (TypeError, ValueError) as e:
        raise DecodeError(f"{kind} {v!r} is not an integer") from e


def _b64(v: Any, kind: str) -> bytes:
    try:
        return base64.b64decode(v, validate=True)
    except (binascii.Error, TypeError, ValueError) as e:
        raise DecodeError(f"{kind} {v!r} is not base64") from e


def decode_json_typed_value(tv: Mapping[str, Any]) -> Any:
    """A TypedValue in protobuf's JSON rendering (`{"uintVal": "3"}`), as telegraf test cases store it.

    64-bit integers may be strings or numbers; bytes, JSON and proto bytes are base64.
    """
    if not isinstance(tv, Mapping) or len(tv) != 1:
        raise DecodeError(f"val must be an object with exactly one kind, got {tv!r}")
    ((kind, v),) = tv.items()
    kind = re.sub(r"_([a-z])", lambda m: m.group(1).upper(), kind)  # accept snake_case too
    if kind in ("stringVal", "asciiVal"):
        if not isinstance(v, str):
            raise DecodeError(f"{kind} {v!r} is not a string")
        return v
    if kind in ("intVal", "uintVal"):
        return _int(v, kind)
    if kind == "boolVal":
        if not isinstance(v, bool):
            raise DecodeError(f"boolVal {v!r} is not a boolean")
        return v
    if kind in ("floatVal", "doubleVal"):
        try:
            f = float(v)  # protojson writes "NaN"/"Infinity" as strings
        except (TypeError, ValueError) as e:
            raise DecodeError(f"{kind} {v!r} is not a number") from e
        return float32(f) if kind == "floatVal" else f
    if kind == "decimalVal":
        if not isinstance(v, Mapping):
            raise DecodeError(f"decimalVal {v!r} is not an object")
        return decimal64(v.get("digits", 0), v.get("precision", 0))
    if kind == "bytesVal":
        return _b64(v, kind)
    if kind in ("jsonVal", "jsonIetfVal"):
        return _json_bytes(_b64(v, kind), kind)
    if kind == "leaflistVal":
        elements = v.get("element", []) if isinstance(v, Mapping) else None
        if not isinstance(elements, list):
            raise DecodeError("leaflistVal has no element list")
        return [decode_json_typed_value(el) for el in elements]
    raise DecodeError(f"unsupported TypedValue kind {kind}")


_LIST_KEYS = ("name", "index", "id", "queue-number", "lane_number")


def flatten(path: tuple[PathElem, ...], value: Any) -> Iterator[tuple[tuple[PathElem, ...], Value]]:
    """Expand a JSON container into (leaf path, scalar) pairs; scalars pass straight through.

    A `{digits, precision}` object is gnmic's rendering of a decimal64 and counts as a leaf.
    Lists of objects are YANG lists: each entry is keyed by its key leaf.
    """
    if isinstance(value, dict):
        if value and set(value) <= {"digits", "precision"} and "digits" in value:
            yield path, decimal64(value["digits"], value.get("precision", 0))
            return
        for k, v in value.items():
            yield from flatten(path + (PathElem(_strip_module(k)),), v)
    elif isinstance(value, list) and value and all(isinstance(x, dict) for x in value):
        parent, last = path[:-1], path[-1]
        for pos, entry in enumerate(value):
            plain = {_strip_module(k): v for k, v in entry.items()}
            key = next((k for k in _LIST_KEYS if k in plain and not isinstance(plain[k], dict)), None)
            keys = ((key, str(plain[key])),) if key else (("index", str(pos)),)
            yield from flatten(parent + (PathElem(last.name, last.keys + keys),), entry)
    elif isinstance(value, list):
        if any(isinstance(x, dict | list) for x in value):
            raise DecodeError(f"{format_path(path)}: mixed list of containers and scalars")
        yield path, value
    elif value is None:
        return  # JSON null: an empty leaf, nothing to report
    else:
        yield path, value


# ---------------------------------------------------------------------------- notifications

# A stream repeats the same few thousand paths every interval; building and normalising
# them each time was most of the decode cost (bench/gnmi_stream.py).
_PATH_CACHE: dict[tuple[bytes, bytes], tuple[PathElem, ...]] = {}
_PATH_CACHE_MAX = 500_000


def _full_path(prefix: gnmi_pb2.Path, prefix_key: bytes, path: gnmi_pb2.Path) -> tuple[PathElem, ...]:
    key = (prefix_key, path.SerializeToString(deterministic=True))
    hit = _PATH_CACHE.get(key)
    if hit is None:
        if len(_PATH_CACHE) >= _PATH_CACHE_MAX:
            _PATH_CACHE.clear()
        hit = _PATH_CACHE[key] = normalize(path_from_proto(prefix) + path_from_proto(path))
    return hit


def notification_leaves(n: gnmi_pb2.Notification) -> tuple[list[Leaf], list[str]]:
    """All leaves of one Notification, with the reasons any update could not be decoded."""
    prefix_key = n.prefix.SerializeToString(deterministic=True)
    origin = n.prefix.origin
    leaves: list[Leaf] = []
    problems: list[str] = []
    for u in n.update:
        full = _full_path(n.prefix, prefix_key, u.path)
        # gNMI 0.8 puts the value in `val`; very old devices used the deprecated `value`
        if u.HasField("val"):
            try:
                decoded = decode_typed_value(u.val)
            except DecodeError as e:
                problems.append(f"{format_path(full, origin)}: {e}")
                continue
        elif u.HasField("value"):
            try:
                decoded = _json_bytes(u.value.value, "deprecated Value")
            except DecodeError as e:
                problems.append(f"{format_path(full, origin)}: {e}")
                continue
        else:
            problems.append(f"{format_path(full, origin)}: update carries no value")
            continue
        if not isinstance(decoded, dict | list):
            leaves.append(Leaf(full, decoded, n.timestamp, origin or u.path.origin))
            continue
        try:
            for p, v in flatten(full, decoded):
                leaves.append(Leaf(normalize(list(p)), v, n.timestamp, origin or u.path.origin))
        except DecodeError as e:
            problems.append(str(e))
    return leaves, problems


# ---------------------------------------------------------------------------- JSON files

def _json_documents(text: str, source: str) -> list[Any]:
    """One JSON document, or several concatenated (gnmic subscribe prints one per notification)."""
    dec = json.JSONDecoder()
    docs: list[Any] = []
    i, n = 0, len(text)
    while True:
        while i < n and text[i].isspace():
            i += 1
        if i >= n:
            break
        try:
            doc, i = dec.raw_decode(text, i)
        except json.JSONDecodeError as e:
            raise ParseError(source, f"invalid JSON: {e.msg} (column {e.colno})", line=e.lineno) from e
        docs.append(doc)
    if not docs:
        raise ParseError(source, "empty input")
    return docs


def _ts_ns(raw: Any, source: str, where: str) -> int | None:
    if raw is None:
        return None
    try:
        ts = int(raw)
    except (TypeError, ValueError) as e:
        raise ParseError(source, f"{where}: timestamp {raw!r} is not an integer") from e
    return ts if ts > 0 else None


def _gnmic_leaves(obj: Mapping[str, Any], source: str, where: str, default_ts_ns: int | None) -> list[Leaf]:
    """gnmic's own rendering: `{"timestamp", "prefix": "a/b", "updates": [{"Path", "values"}]}`."""
    ts = _ts_ns(obj.get("timestamp"), source, where) or default_ts_ns
    if ts is None:
        shown = f" (time says {obj['time']!r})" if "time" in obj else ""
        raise ParseError(source, f"{where}: notification has no timestamp{shown}; pass default_ts_ms")
    prefix_text = str(obj.get("prefix") or "")
    origin = ""
    if ":" in prefix_text.split("/", 1)[0]:
        # gnmic writes the prefix as `origin:path`, e.g. `eos_native:LANZ/config`
        origin, prefix_text = prefix_text.split(":", 1)
    try:
        prefix = parse_path(prefix_text)
    except ValueError as e:
        raise ParseError(source, f"{where}: bad prefix: {e}") from e
    updates = obj.get("updates")
    if not isinstance(updates, list):
        raise ParseError(source, f"{where}: 'updates' is not a list")
    leaves: list[Leaf] = []
    for k, u in enumerate(updates):
        if not isinstance(u, Mapping) or not isinstance(u.get("Path"), str):
            raise ParseError(source, f"{where}.updates[{k}]: no 'Path' string")
        values = u.get("values")
        if not isinstance(values, Mapping):
            raise ParseError(source, f"{where}.updates[{k}]: 'values' is not an object")
        try:
            base = normalize(prefix + parse_path(u["Path"]))
            # `values` is keyed by the schema path of `Path`; its value sits at `Path` itself
            for _schema, v in values.items():
                for p, leaf in flatten(base, v):
                    leaves.append(Leaf(normalize(list(p)), leaf, ts, origin))
        except (ValueError, DecodeError) as e:
            raise ParseError(source, f"{where}.updates[{k}]: {e}") from e
    return leaves


def _proto_path(obj: Any, source: str, where: str) -> list[PathElem]:
    if obj is None:
        return []
    if not isinstance(obj, Mapping):
        raise ParseError(source, f"{where}: path is not an object")
    elems = obj.get("elem", [])
    if not isinstance(elems, list):
        raise ParseError(source, f"{where}: 'elem' is not a list")
    out = []
    for e in elems:
        keys = e.get("key", {}) if isinstance(e, Mapping) else None
        if not isinstance(keys, Mapping):
            raise ParseError(source, f"{where}: bad path element {e!r}")
        out.append(PathElem(str(e.get("name", "")), tuple(sorted((k, str(v)) for k, v in keys.items()))))
    return out


def _protojson_leaves(
    obj: Mapping[str, Any], source: str, where: str, default_ts_ns: int | None
) -> tuple[list[Leaf], list[str]]:
    """A SubscribeResponse in protobuf JSON (`{"update": {"timestamp", "prefix", "update": [...]}}`)."""
    if "syncResponse" in obj or "sync_response" in obj:
        return [], []
    if "error" in obj:
        raise ParseError(source, f"{where}: device sent an error: {obj['error']!r}")
    n = obj.get("update")
    if not isinstance(n, Mapping):
        raise ParseError(source, f"{where}: no 'update' notification")
    ts = _ts_ns(n.get("timestamp"), source, where) or default_ts_ns
    if ts is None:
        raise ParseError(source, f"{where}: notification has no timestamp; pass default_ts_ms")
    prefix_obj = n.get("prefix") or {}
    prefix = _proto_path(prefix_obj, source, f"{where}.prefix")
    origin = str(prefix_obj.get("origin", "")) if isinstance(prefix_obj, Mapping) else ""
    updates = n.get("update", [])
    if not isinstance(updates, list):
        raise ParseError(source, f"{where}: 'update' is not a list")
    leaves: list[Leaf] = []
    problems: list[str] = []
    for k, u in enumerate(updates):
        if not isinstance(u, Mapping) or "val" not in u:
            raise ParseError(source, f"{where}.update[{k}]: no 'val'")
        full = normalize(prefix + _proto_path(u.get("path"), source, f"{where}.update[{k}].path"))
        try:
            for p, v in flatten(full, decode_json_typed_value(u["val"])):
                leaves.append(Leaf(normalize(list(p)), v, ts, origin))
        except DecodeError as e:
            problems.append(f"{format_path(full, origin)}: {e}")
    return leaves, problems


def json_leaves(
    text: str, *, source: str, default_ts_ns: int | None = None
) -> tuple[list[list[Leaf]], list[str]]:
    """Leaves of a gnmic or telegraf JSON capture, grouped per notification, plus value problems."""
    groups: list[list[Leaf]] = []
    problems: list[str] = []
    for d, doc in enumerate(_json_documents(text, source)):
        items = doc if isinstance(doc, list) else [doc]
        for i, obj in enumerate(items):
            where = f"notification {len(groups) + 1}" if len(items) == 1 else f"document {d}[{i}]"
            if isinstance(obj, list):
                raise ParseError(source, f"{where}: a list where a notification object was expected")
            if not isinstance(obj, Mapping):
                raise ParseError(source, f"{where}: not a JSON object")
            if "updates" in obj:
                groups.append(_gnmic_leaves(obj, source, where, default_ts_ns))
            elif "update" in obj or "syncResponse" in obj or "error" in obj:
                leaves, probs = _protojson_leaves(obj, source, where, default_ts_ns)
                groups.append(leaves)
                problems.extend(probs)
            else:
                raise ParseError(
                    source, f"{where}: neither gnmic ('updates') nor SubscribeResponse ('update') shape")
    return groups, problems
