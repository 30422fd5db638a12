"""SNMPv2c on the wire: a GetBulkRequest encoder and a strict, fast Response decoder (RFC 3416).

Why it exists: pyasn1 builds a typed object tree for every varbind (~100 µs each) and
spends ~400 µs encoding one GETBULK, which together were most of the collector's CPU on
a big walk. The decoder reads only what a v2c response can hold and returns the
collector's own (oid, type name, value) triples, the same ones `snmp._from_pysnmp` makes
from pysnmp objects. The encoder writes the one request the collector sends; the tests
hold both to pysnmp byte for byte. SNMPv3 stays entirely on pysnmp.

Strict: definite lengths only, every TLV must fit its container exactly, values must fit
their SNMP type's range, no trailing octets. Anything else raises BerError naming the
offset; no other exception escapes `decode_response`.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import NamedTuple

from collectors.base import ParseError
from collectors.snmp_oids import Oid, Value, Varbind

_SEQUENCE, _INTEGER, _OCTETS, _NULL, _OID = 0x30, 0x02, 0x04, 0x05, 0x06
_RESPONSE_PDU = 0xA2  # context-specific, constructed, [2]
_GETBULK_PDU = 0xA5  # [5]
_SNMP_V2C = 1
_MAX_LENGTH_OCTETS = 4  # a UDP datagram never needs more
_MAX_OID_ARCS = 128  # RFC 2578 section 3.5

# Application tags (RFC 2578) with their names as the collector spells them.
_IPADDRESS, _COUNTER32, _GAUGE32, _TIMETICKS, _OPAQUE, _COUNTER64 = 0x40, 0x41, 0x42, 0x43, 0x44, 0x46
_EXCEPTIONS = {0x80: "NoSuchObject", 0x81: "NoSuchInstance", 0x82: "EndOfMibView"}
_UNSIGNED = {_COUNTER32: ("Counter32", 2**32 - 1), _GAUGE32: ("Gauge32", 2**32 - 1),
             _TIMETICKS: ("TimeTicks", 2**32 - 1), _COUNTER64: ("Counter64", 2**64 - 1)}
_INT32_MIN, _INT32_MAX = -(2**31), 2**31 - 1


class BerError(ParseError):
    """Malformed or unexpected BER in an SNMP response; `offset` is where it went wrong."""

    def __init__(self, offset: int, reason: str) -> None:
        self.offset = offset
        super().__init__("SNMP response", f"offset {offset}: {reason}")


class V2cResponse(NamedTuple):
    community: bytes
    request_id: int
    error_status: int
    error_index: int
    varbinds: list[Varbind]


def _tlv(tag: int, content: bytes) -> bytes:
    """Tag, definite length in the fewest octets (as pyasn1 writes it), content."""
    n = len(content)
    if n < 0x80:
        return bytes((tag, n)) + content
    octets = n.to_bytes((n.bit_length() + 7) // 8, "big")
    return bytes((tag, 0x80 | len(octets))) + octets + content


def _enc_integer(v: int) -> bytes:
    return _tlv(_INTEGER, v.to_bytes(v.bit_length() // 8 + 1, "big", signed=True))


def _enc_oid(oid: Oid) -> bytes:
    if len(oid) < 2 or oid[0] > 2 or (oid[0] < 2 and oid[1] > 39) or min(oid) < 0:
        raise ValueError(f"not an encodable OBJECT IDENTIFIER: {oid!r}")
    out = bytearray()
    for arc in (oid[0] * 40 + oid[1], *oid[2:]):
        chunk = [arc & 0x7F]
        arc >>= 7
        while arc:
            chunk.append(0x80 | (arc & 0x7F))
            arc >>= 7
        out += bytes(reversed(chunk))
    return _tlv(_OID, bytes(out))


_NULL_VALUE = bytes((_NULL, 0))


def encode_getbulk(community: bytes, request_id: int, max_repetitions: int, columns: Sequence[Oid]) -> bytes:
    """A v2c GetBulkRequest message (non-repeaters 0) asking for the rows after each of `columns`."""
    if not 0 <= request_id <= _INT32_MAX or not 0 <= max_repetitions <= _INT32_MAX:
        raise ValueError("request-id and max-repetitions must be in 0..2**31-1")
    varbinds = b"".join(_tlv(_SEQUENCE, _enc_oid(c) + _NULL_VALUE) for c in columns)
    pdu = _tlv(_GETBULK_PDU, _enc_integer(request_id) + _enc_integer(0) + _enc_integer(max_repetitions)
               + _tlv(_SEQUENCE, varbinds))
    return _tlv(_SEQUENCE, _enc_integer(_SNMP_V2C) + _tlv(_OCTETS, community) + pdu)


def _length(data: bytes, at: int, end: int) -> tuple[int, int]:
    """The length octets at `at` -> (content length, content start); the content must end by `end`."""
    if at >= end:
        raise BerError(at, "truncated: length octet missing")
    first = data[at]
    if first < 0x80:
        n, start = first, at + 1
    elif first == 0x80:
        raise BerError(at, "indefinite length is not allowed in SNMP")
    else:
        k = first & 0x7F
        if k > _MAX_LENGTH_OCTETS:
            raise BerError(at, f"length of {k} octets is too long")
        if at + 1 + k > end:
            raise BerError(at, f"truncated: {k} length octets announced")
        n, start = int.from_bytes(data[at + 1:at + 1 + k], "big"), at + 1 + k
    if start + n > end:
        raise BerError(at, f"length {n} runs past the end of its container (offset {end})")
    return n, start


def _expect(data: bytes, at: int, end: int, tag: int, what: str) -> tuple[int, int]:
    """A TLV of `tag` at `at` -> (content start, content end)."""
    if at >= end:
        raise BerError(at, f"truncated: {what} missing")
    if data[at] != tag:
        raise BerError(at, f"expected {what} (tag 0x{tag:02x}), got tag 0x{data[at]:02x}")
    n, start = _length(data, at + 1, end)
    return start, start + n


def _integer(data: bytes, at: int, end: int, what: str, lo: int, hi: int) -> tuple[int, int]:
    """An INTEGER TLV at `at` within [lo, hi] -> (value, offset after it)."""
    start, stop = _expect(data, at, end, _INTEGER, what)
    if start == stop:
        raise BerError(at, f"{what}: INTEGER with no content octets")
    value = int.from_bytes(data[start:stop], "big", signed=True)
    if not lo <= value <= hi:
        raise BerError(at, f"{what} {value} out of range [{lo}, {hi}]")
    return value, stop


def _oid(data: bytes, start: int, stop: int) -> Oid:
    """OID content octets -> arcs. Most OIDs have only single-octet arcs: one C-level check."""
    if start == stop:
        raise BerError(start, "OBJECT IDENTIFIER with no content octets")
    raw = data[start:stop]
    if raw.isascii():  # every arc < 128: the octets are the arcs
        if len(raw) + 1 > _MAX_OID_ARCS:
            raise BerError(start, f"OBJECT IDENTIFIER with {len(raw) + 1} arcs (SNMP allows {_MAX_OID_ARCS})")
        first = raw[0]
        head = (0, first) if first < 40 else (1, first - 40) if first < 80 else (2, first - 80)
        return head + tuple(raw[1:])
    arcs: list[int] = []
    acc, arc_start = 0, start
    for i in range(start, stop):
        b = data[i]
        if acc == 0 and b == 0x80:
            raise BerError(i, "OBJECT IDENTIFIER arc with a leading 0x80 octet (not minimal)")
        acc = (acc << 7) | (b & 0x7F)
        if not b & 0x80:
            arcs.append(acc)
            acc, arc_start = 0, i + 1
    if arc_start != stop:
        raise BerError(arc_start, "truncated OBJECT IDENTIFIER: last arc has its continuation bit set")
    first = arcs[0]
    head = (0, first) if first < 40 else (1, first - 40) if first < 80 else (2, first - 80)
    if len(arcs) + 1 > _MAX_OID_ARCS:
        raise BerError(start, f"OBJECT IDENTIFIER with {len(arcs) + 1} arcs (SNMP allows {_MAX_OID_ARCS})")
    return (*head, *arcs[1:])


def _value(data: bytes, tag: int, start: int, stop: int, at: int) -> tuple[str, Value]:
    """A varbind value's tag and content -> (type name, value)."""
    if tag == _INTEGER:
        if start == stop:
            raise BerError(at, "INTEGER with no content octets")
        v = int.from_bytes(data[start:stop], "big", signed=True)
        if not _INT32_MIN <= v <= _INT32_MAX:
            raise BerError(at, f"Integer32 value {v} out of range")
        return "Integer", v
    if tag in _UNSIGNED:
        name, hi = _UNSIGNED[tag]
        if start == stop:
            raise BerError(at, f"{name} with no content octets")
        v = int.from_bytes(data[start:stop], "big", signed=True)
        if not 0 <= v <= hi:
            raise BerError(at, f"{name} value {v} out of range [0, {hi}]")
        return name, v
    if tag == _OCTETS:
        return "OctetString", data[start:stop]
    if tag == _OID:
        return "ObjectIdentifier", ".".join(map(str, _oid(data, start, stop)))
    if tag == _IPADDRESS:
        if stop - start != 4:
            raise BerError(at, f"IpAddress of {stop - start} octets (needs 4)")
        return "IpAddress", ".".join(map(str, data[start:stop]))
    if tag == _OPAQUE:
        return "Opaque", data[start:stop]
    if tag == _NULL or tag in _EXCEPTIONS:
        if start != stop:
            raise BerError(at, f"tag 0x{tag:02x} must have no content, has {stop - start} octets")
        return ("Null" if tag == _NULL else _EXCEPTIONS[tag]), None
    raise BerError(at, f"unsupported varbind value tag 0x{tag:02x}")


def decode_varbinds(data: bytes, start: int, stop: int) -> list[Varbind]:
    """The content of a VarBindList -> (oid, type name, value) triples."""
    out: list[Varbind] = []
    append = out.append
    i = start
    while i < stop:
        # VarBind ::= SEQUENCE { name ObjectName, value ... }; short lengths inline (the common case)
        if data[i] != _SEQUENCE:
            raise BerError(i, f"expected VarBind SEQUENCE (tag 0x30), got tag 0x{data[i]:02x}")
        if i + 1 < stop and data[i + 1] < 0x80:
            vb_start, vb_end = i + 2, i + 2 + data[i + 1]
            if vb_end > stop:
                raise BerError(i + 1, f"length {data[i + 1]} runs past the end of its container (offset {stop})")
        else:
            n, vb_start = _length(data, i + 1, stop)
            vb_end = vb_start + n
        name_start, name_end = _expect(data, vb_start, vb_end, _OID, "VarBind name OBJECT IDENTIFIER")
        name = _oid(data, name_start, name_end)
        if name_end >= vb_end:
            raise BerError(name_end, "truncated: VarBind value missing")
        tag = data[name_end]
        n, v_start = _length(data, name_end + 1, vb_end)
        if v_start + n != vb_end:
            raise BerError(v_start + n, f"{vb_end - v_start - n} stray octet(s) after the VarBind value")
        typ, value = _value(data, tag, v_start, vb_end, name_end)
        append((name, typ, value))
        i = vb_end
    return out


def decode_response(data: bytes) -> V2cResponse:
    """A whole SNMPv2c Response message -> its header and varbinds. Raises BerError only."""
    if not isinstance(data, bytes):
        data = bytes(data)
    end = len(data)
    msg_start, msg_end = _expect(data, 0, end, _SEQUENCE, "Message SEQUENCE")
    if msg_end != end:
        raise BerError(msg_end, f"{end - msg_end} trailing octet(s) after the message")
    version, i = _integer(data, msg_start, msg_end, "version", 0, 2**31 - 1)
    if version != _SNMP_V2C:
        raise BerError(msg_start, f"not an SNMPv2c message (version field {version})")
    c_start, c_end = _expect(data, i, msg_end, _OCTETS, "community OCTET STRING")
    community = data[c_start:c_end]
    pdu_start, pdu_end = _expect(data, c_end, msg_end, _RESPONSE_PDU, "Response-PDU")
    if pdu_end != msg_end:
        raise BerError(pdu_end, "octets after the PDU inside the message")
    request_id, i = _integer(data, pdu_start, pdu_end, "request-id", _INT32_MIN, _INT32_MAX)
    error_status, i = _integer(data, i, pdu_end, "error-status", 0, 18)
    error_index, i = _integer(data, i, pdu_end, "error-index", 0, _INT32_MAX)
    vbl_start, vbl_end = _expect(data, i, pdu_end, _SEQUENCE, "VarBindList SEQUENCE")
    if vbl_end != pdu_end:
        raise BerError(vbl_end, "octets after the VarBindList inside the PDU")
    return V2cResponse(community, request_id, error_status, error_index, decode_varbinds(data, vbl_start, vbl_end))
