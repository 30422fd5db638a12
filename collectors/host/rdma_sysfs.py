"""RDMA port counters: /sys/class/infiniband trees, plus the text tools that print them.

Sources, all mapped to the same canonical metrics:
- sysfs `ports/N/counters/*` (IB PMA PortCounters), `counters_ext/*` (legacy mlx4 64-bit
  copies, used only where `counters/` lacks the value) and `hw_counters/*` (RoCE: ECN, CNP,
  out-of-sequence, out-of-buffer, and the RC transport's loss and retransmit signals (ACK
  timeouts, NAK sequence errors, RNR NAKs, duplicate requests, ICRC errors, adaptive
  retransmissions) and completion errors (CQE errors and flushes));
- `show_counters`-style `name: value` dumps of hw_counters, `rdma statistic show link` text
  and `perfquery -x` text.

Counter widths, so deltas treat wraps and saturation right:
- PMA error counters are narrow and *saturate* at all-ones (symbol_error 16 bit, link_downed
  and link_error_recovery 8 bit, port_rcv_errors/port_xmit_discards 16 bit); port_xmit_wait is
  32 bit and saturating, with no 64-bit copy in sysfs.
- Data and packet counters in `counters/` are 64-bit where the HCA supports
  PortCountersExtended (the kernel then shows those), else 32-bit saturating; a value above
  2**32-1 proves 64 bit, exactly 2**32-1 proves a saturated 32-bit one, otherwise unknown.
- Data counters count 4-byte words; we emit bytes (x4), and leave the width unset for them
  because a byte value no longer has a power-of-two range.
- mlx5 Q counters (out_of_sequence, out_of_buffer, the retransmit and CQE error counters)
  are 32-bit (mlx5_ifc query_q_counter_out) and wrap; congestion counters (np_*/rp_*) and
  rx_icrc_encapsulated (a PPCNT high/low pair) are 64-bit.
"""

from __future__ import annotations

import re
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path

from collectors.base import ParseError
from collectors.host.sysfs import sysfs_class_dir
from service.telemetry.samples import Sample

U32_MAX = (1 << 32) - 1
_NA_RE = re.compile(r"^N/A\b")  # e.g. "N/A (no PMA)" on iWARP devices


@dataclass(frozen=True, slots=True)
class _Def:
    metric: str
    bits: int | None  # None: decide from the value (data/packet counters)
    saturating: bool = False
    scale: int = 1
    rank: int = 0  # lower wins when two files give one series


_PMA: dict[str, _Def] = {
    "symbol_error": _Def("port_symbol_errors_total", 16, True),
    "link_error_recovery": _Def("port_link_error_recovery_total", 8, True),
    "link_downed": _Def("port_link_down_events_total", 8, True),
    "port_rcv_errors": _Def("port_rx_errors_total", 16, True),
    "port_xmit_discards": _Def("port_tx_discards_total", 16, True),
    "port_xmit_wait": _Def("port_xmit_wait_ticks_total", 32, True),
    "port_rcv_data": _Def("port_rx_bytes_total", None, scale=4),
    "port_xmit_data": _Def("port_tx_bytes_total", None, scale=4),
    "port_rcv_packets": _Def("port_rx_packets_total", None),
    "port_xmit_packets": _Def("port_tx_packets_total", None),
}
_EXT: dict[str, _Def] = {
    "port_rcv_data_64": _Def("port_rx_bytes_total", 64, scale=4, rank=1),
    "port_xmit_data_64": _Def("port_tx_bytes_total", 64, scale=4, rank=1),
    "port_rcv_packets_64": _Def("port_rx_packets_total", 64, rank=1),
    "port_xmit_packets_64": _Def("port_tx_packets_total", 64, rank=1),
}
HW_COUNTERS: dict[str, _Def] = {
    "np_ecn_marked_roce_packets": _Def("port_ecn_marked_packets_total", 64),
    "np_cnp_sent": _Def("port_cnp_sent_total", 64),
    "rp_cnp_handled": _Def("port_cnp_handled_total", 64),
    "rx_icrc_encapsulated": _Def("port_icrc_errors_total", 64),  # PPCNT extended group, high/low words
    **{name: _Def(metric, 32) for name, metric in (  # Q counters
        ("out_of_sequence", "port_out_of_sequence_total"),
        ("out_of_buffer", "port_out_of_buffer_total"),
        ("local_ack_timeout_err", "port_local_ack_timeouts_total"),
        ("packet_seq_err", "port_nak_sequence_errors_total"),
        ("implied_nak_seq_err", "port_implied_nak_sequence_errors_total"),
        ("rnr_nak_retry_err", "port_rnr_naks_total"),
        ("duplicate_request", "port_duplicate_requests_total"),
        ("roce_adp_retrans", "port_adaptive_retransmits_total"),
        ("roce_adp_retrans_to", "port_adaptive_retransmit_timeouts_total"),
        ("req_transport_retries_exceeded", "port_transport_retries_exceeded_total"),
        ("req_rnr_retries_exceeded", "port_rnr_retries_exceeded_total"),
        ("req_cqe_error", "port_requester_cqe_errors_total"),
        ("resp_cqe_error", "port_responder_cqe_errors_total"),
        ("req_cqe_flush_error", "port_requester_cqe_flush_errors_total"),
        ("resp_cqe_flush_error", "port_responder_cqe_flush_errors_total"),
        ("req_remote_access_errors", "port_requester_remote_access_errors_total"),
        ("req_remote_invalid_request", "port_requester_remote_invalid_request_errors_total"),
        ("resp_remote_access_errors", "port_responder_remote_access_errors_total"),
        ("resp_local_length_error", "port_responder_local_length_errors_total"),
    )},
}
_DIRS: dict[str, dict[str, _Def]] = {"counters": _PMA, "counters_ext": _EXT, "hw_counters": HW_COUNTERS}


def parse_sysfs_value(text: str, source: str) -> int | None:
    """One sysfs counter file -> int; None for 'N/A ...' (no PMA); ParseError otherwise."""
    s = text.strip()
    if _NA_RE.match(s):
        return None
    if not s.isascii() or not s.isdigit():
        raise ParseError(source, f"counter value is not a non-negative integer: {s[:40]!r}", 1)
    return int(s)


def _sample(d: _Def, value: int, *, device: str, port: str, ts_ms: int) -> Sample:
    bits, saturating = d.bits, d.saturating
    if bits is None:
        if value > U32_MAX:
            bits = 64 if d.scale == 1 else None
        elif value == U32_MAX:
            saturating = True
            bits = 32 if d.scale == 1 else None
    elif d.scale != 1:
        bits = None
    return Sample(metric=d.metric, value=float(value * d.scale), ts_ms=ts_ms, device=device, port=port,
                  counter_bits=bits, saturating=saturating)


def _port_label(ibdev: str, portnum: int, port_names: Mapping[tuple[str, int], str] | None) -> str:
    if port_names and (ibdev, portnum) in port_names:
        return port_names[(ibdev, portnum)]
    return f"{ibdev}/{portnum}"


def _collect(found: dict[tuple[str, str], tuple[_Def, int]], d: _Def, value: int, port: str) -> None:
    key = (port, d.metric)
    cur = found.get(key)
    if cur is None or d.rank < cur[0].rank:
        found[key] = (d, value)


def _emit(found: dict[tuple[str, str], tuple[_Def, int]], *, device: str, ts_ms: int) -> list[Sample]:
    return [_sample(d, v, device=device, port=port, ts_ms=ts_ms)
            for (port, _metric), (d, v) in sorted(found.items())]


def read_rdma_sysfs(
    root: Path,
    *,
    device: str,
    ts_ms: int,
    port_names: Mapping[tuple[str, int], str] | None = None,
    warnings: list[str] | None = None,
) -> list[Sample]:
    """Walk root/sys/class/infiniband/*/ports/*/{counters,counters_ext,hw_counters}.

    A bad counter file raises ParseError, or, when `warnings` is given, is skipped with a
    warning so one odd file does not hide the other counters. No infiniband class -> [].
    """
    base = sysfs_class_dir(root, "infiniband")
    if not base.is_dir():
        return []
    found: dict[tuple[str, str], tuple[_Def, int]] = {}
    for devdir in sorted(base.iterdir()):
        ports = devdir / "ports"
        if not ports.is_dir():
            continue
        for portdir in sorted(ports.iterdir()):
            if not portdir.name.isdigit():
                continue
            label = _port_label(devdir.name, int(portdir.name), port_names)
            for dirname, table in _DIRS.items():
                cdir = portdir / dirname
                if not cdir.is_dir():
                    continue
                for name, d in table.items():
                    f = cdir / name
                    if not f.is_file():
                        continue
                    try:
                        value = parse_sysfs_value(f.read_text(errors="replace"), str(f))
                    except OSError as exc:
                        err = ParseError(str(f), f"cannot read: {exc.strerror or exc}")
                        if warnings is None:
                            raise err from None
                        warnings.append(f"rdma sysfs: {err}")
                        continue
                    except ParseError as err:
                        if warnings is None:
                            raise
                        warnings.append(f"rdma sysfs: {err}")
                        continue
                    if value is not None:
                        _collect(found, d, value, label)
    return _emit(found, device=device, ts_ms=ts_ms)


def discover_port_names(root: Path) -> dict[tuple[str, int], str]:
    """(ibdev, port) -> netdev, from ports/N/gid_attrs/ndevs/0 (RoCE ports name their netdev)."""
    out: dict[tuple[str, int], str] = {}
    base = sysfs_class_dir(root, "infiniband")
    if not base.is_dir():
        return out
    for ndev in sorted(base.glob("*/ports/*/gid_attrs/ndevs/0")):
        try:
            name = ndev.read_text().strip()
        except OSError:
            continue
        portdir = ndev.parents[2]
        if name and portdir.name.isdigit():
            out[(portdir.parents[1].name, int(portdir.name))] = name
    return out


# ----------------------------------------------------------------------------- text tools

_DUMP_HEADER_RE = re.compile(r"^#\s*show_counters\s+(?P<dev>\S+)")
_DUMP_PORT_RE = re.compile(r"^Port\s+(?P<port>\d+)\s+hw counters:$")
_DUMP_LINE_RE = re.compile(r"^(?P<name>[A-Za-z0-9_]+):\s*(?P<value>\S+)$")


def parse_hw_counters_dump(
    text: str,
    *,
    device: str,
    ts_ms: int,
    source: str,
    ibdev: str | None = None,
    port_names: Mapping[tuple[str, int], str] | None = None,
) -> list[Sample]:
    """Parse `name: value` dumps of hw_counters (Mellanox `show_counters` output)."""
    found: dict[tuple[str, str], tuple[_Def, int]] = {}
    portnum: int | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if (m := _DUMP_HEADER_RE.match(line)) is not None:
            ibdev = ibdev or m.group("dev")
            continue
        if (m := _DUMP_PORT_RE.match(line)) is not None:
            portnum = int(m.group("port"))
            continue
        m = _DUMP_LINE_RE.match(line)
        if m is None:
            raise ParseError(source, f"not a 'name: value' counter line: {line[:80]!r}", lineno)
        if ibdev is None or portnum is None:
            raise ParseError(source, "counter before the device/port header ('# show_counters DEV', "
                                     "'Port N hw counters:')", lineno)
        value = parse_sysfs_value(m.group("value"), f"{source}:{lineno}")
        d = HW_COUNTERS.get(m.group("name"))
        if d is not None and value is not None:
            _collect(found, d, value, _port_label(ibdev, portnum, port_names))
    if not found and ibdev is None:
        raise ParseError(source, "no '# show_counters DEV' header and no counters")
    return _emit(found, device=device, ts_ms=ts_ms)


_LINK_RE = re.compile(r"^(?P<dev>[^/\s]+)/(?P<port>\d+)$")
_QP_KEYS = {"cntn", "pid", "comm", "LQPN:", "lqpn"}


def parse_rdma_stat(
    text: str,
    *,
    device: str,
    ts_ms: int,
    source: str,
    port_names: Mapping[tuple[str, int], str] | None = None,
) -> list[Sample]:
    """Parse `rdma statistic show [link DEV/PORT]` text (plain or -p); QP records are skipped.

    `rdma stat qp show` prints per-QP counters; summing them would double count the link
    totals, so those records (with cntn/pid/LQPN) are recognised and left out.
    """
    records: list[tuple[int, str, list[tuple[int, str]]]] = []  # (line, dev/port, tokens)
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line.startswith(("$", "#")):
            continue
        tokens = line.split()
        if tokens[0] == "link":
            if len(tokens) < 2:
                raise ParseError(source, "'link' without DEV/PORT", lineno)
            records.append((lineno, tokens[1], [(lineno, t) for t in tokens[2:]]))
        elif records:
            records[-1][2].extend((lineno, t) for t in tokens)
        else:
            raise ParseError(source, f"text before the first 'link DEV/PORT' record: {line[:60]!r}", lineno)
    if not records:
        raise ParseError(source, "no 'link DEV/PORT' record: not `rdma statistic` output")
    found: dict[tuple[str, str], tuple[_Def, int]] = {}
    for lineno, link, toks in records:
        m = _LINK_RE.match(link)
        if m is None:
            raise ParseError(source, f"bad link name {link!r}, expected DEV/PORT", lineno)
        if any(t in _QP_KEYS for _, t in toks):
            continue
        if len(toks) % 2:
            raise ParseError(source, f"odd number of name/value tokens in the record for {link}", toks[-1][0])
        label = _port_label(m.group("dev"), int(m.group("port")), port_names)
        for i in range(0, len(toks), 2):
            (ln, name), (_ln, val) = toks[i], toks[i + 1]
            value = parse_sysfs_value(val, f"{source}:{ln}")
            d = HW_COUNTERS.get(name)
            if d is not None and value is not None:
                _collect(found, d, value, label)
    return _emit(found, device=device, ts_ms=ts_ms)


_PQ_HEADER_RE = re.compile(r"^# Port (?:extended )?counters: Lid (?P<lid>\d+) port (?P<port>\d+)"
                           r"(?: \(CapMask: (?P<cap>0x[0-9A-Fa-f]+)(?: CapMask2: (?P<cap2>0x[0-9A-Fa-f]+))?\))?")
_PQ_LINE_RE = re.compile(r"^(?P<name>[A-Za-z0-9]+):\.*(?P<value>\S+)$")
_PQ_DATA: dict[str, _Def] = {
    "PortXmitData": _Def("port_tx_bytes_total", 64, scale=4),
    "PortRcvData": _Def("port_rx_bytes_total", 64, scale=4),
    "PortXmitPkts": _Def("port_tx_packets_total", 64),
    "PortRcvPkts": _Def("port_rx_packets_total", 64),
}
# Present in `perfquery -x` only when CapMask2 bit 1 (additional extended counters) is set;
# they are then 64-bit. Without that bit the HCA does not implement them.
_PQ_ADDITIONAL: dict[str, _Def] = {
    "SymbolErrorCounter": _Def("port_symbol_errors_total", 64),
    "LinkErrorRecoveryCounter": _Def("port_link_error_recovery_total", 64),
    "LinkDownedCounter": _Def("port_link_down_events_total", 64),
    "PortRcvErrors": _Def("port_rx_errors_total", 64),
    "PortXmitDiscards": _Def("port_tx_discards_total", 64),
    "PortXmitWait": _Def("port_xmit_wait_ticks_total", 64),
}


def parse_perfquery(text: str, *, device: str, ts_ms: int, source: str, node: str | None = None) -> list[Sample]:
    """Parse `perfquery -x` output (one or more port blocks). Port label: '<node or lidN>/<port>'."""
    found: dict[tuple[str, str], tuple[_Def, int]] = {}
    label: str | None = None
    additional = False
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line:
            continue
        if line.startswith("#"):
            m = _PQ_HEADER_RE.match(line)
            if m is None:
                raise ParseError(source, f"unknown perfquery header {line[:60]!r}", lineno)
            if "extended" not in line:
                raise ParseError(source, "only `perfquery -x` (extended counters) is supported", lineno)
            label = f"{node or 'lid' + m.group('lid')}/{m.group('port')}"
            additional = bool(m.group("cap2")) and bool(int(m.group("cap2"), 16) & 0x2)
            continue
        m = _PQ_LINE_RE.match(line)
        if m is None:
            raise ParseError(source, f"not a 'Name:....value' line: {line[:60]!r}", lineno)
        if label is None:
            raise ParseError(source, "counter before the '# Port extended counters' header", lineno)
        name, val = m.group("name"), m.group("value")
        d = _PQ_DATA.get(name) or (_PQ_ADDITIONAL.get(name) if additional else None)
        if d is None:
            continue
        if not val.isdigit():
            raise ParseError(source, f"{name}: value {val[:30]!r} is not an integer", lineno)
        _collect(found, d, int(val), label)
    if label is None:
        raise ParseError(source, "no '# Port extended counters' header: not `perfquery -x` output")
    return _emit(found, device=device, ts_ms=ts_ms)
