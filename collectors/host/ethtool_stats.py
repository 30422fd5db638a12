"""`ethtool -S IF` text -> canonical samples, for mlx5, bnxt_en, i40e/ice, ixgbe, mlxsw and Cumulus switchd.

We parse the text form because `ethtool --json -S` fails on ethtool 6.1. The format is a
"NIC statistics:" header followed by `name: value` lines; bnxt_en prefixes per-queue lines
with `[N]: `. Counter names are driver-specific; the rule table below maps the ones that
have a canonical meaning and ignores the rest (queue, XDP, cache counters...).

Choices that matter:
- Traffic counters come from the *physical port* where the driver has them (mlx5 `*_phy`,
  mlxsw `a_octets_*`, bnxt port stats, ice `*.nic`): on a RoCE NIC the kernel's software
  counters (`rx_bytes`) and the vport counters miss all RDMA traffic, which is most of it.
  The software `rx_bytes`/`rx_packets` are a fallback only.
- i40e `port.rx_bytes` & co. are 48-bit hardware counters that the driver lets wrap (the
  captured fixture shows `port.tx_bytes` < `tx_bytes` by ~2 x 2**48), so for i40e we use the
  64-bit software totals instead.
- Pause durations are microseconds on mlx5 (per priority and global), mlxsw and bnxt
  (`*_duration_us`); we emit seconds.
- Receive drops for lack of a posted buffer (mlx5 `rx_out_of_buffer`, bnxt
  `rx_total_ring_discards`, ixgbe `rx_no_dma_resources`) are `port_out_of_buffer_total`: the
  NIC had the packet and the host had no room for it, unlike a discard on the wire side.
- When several names give one canonical series, the lowest rank wins; names of one rank that
  map to one series are summed (e.g. ucast+mcast+bcast packets).
"""

from __future__ import annotations

import re
from collections.abc import Iterator
from dataclasses import dataclass

from collectors.base import ParseError
from service.telemetry.samples import Sample

_HEADER = "NIC statistics:"
# A captured terminal line such as `cumulus@switch:~$ sudo ethtool -S swp1` before the header.
_PROMPT_RE = re.compile(r"^\S*[$#]\s*(sudo\s+)?ethtool\b")
_LINE_RE = re.compile(r"^\s+(?:\[(?P<queue>\d+)\]:\s+)?(?P<name>\S(?:.*\S)?):\s+(?P<value>\S+)\s*$")
_INT_RE = re.compile(r"^\d+$")


@dataclass(frozen=True, slots=True)
class _Rule:
    pattern: re.Pattern[str]
    metric: str
    rank: int
    scale: float = 1.0


def _r(pattern: str, metric: str, rank: int = 0, scale: float = 1.0) -> _Rule:
    return _Rule(re.compile(pattern + r"\Z"), metric, rank, scale)


_US = 1e-6  # pause durations are reported in microseconds
_P = r"(?P<prio>[0-7])"

# Ordered only for readability; selection is by rank per canonical series.
_RULES: tuple[_Rule, ...] = (
    # --- traffic: physical port first, software totals last ---
    _r(r"rx_bytes_phy", "port_rx_bytes_total"),
    _r(r"tx_bytes_phy", "port_tx_bytes_total"),
    _r(r"rx_packets_phy", "port_rx_packets_total"),
    _r(r"tx_packets_phy", "port_tx_packets_total"),
    _r(r"a_octets_received_ok", "port_rx_bytes_total"),  # mlxsw
    _r(r"a_octets_transmitted_ok", "port_tx_bytes_total"),
    _r(r"a_frames_received_ok", "port_rx_packets_total"),
    _r(r"a_frames_transmitted_ok", "port_tx_packets_total"),
    _r(r"HwIfInOctets", "port_rx_bytes_total"),  # Cumulus switchd
    _r(r"HwIfOutOctets", "port_tx_bytes_total"),
    _r(r"HwIfIn(?:Ucast|Mcast|Bcast)Pkts", "port_rx_packets_total"),
    _r(r"HwIfOut(?:Ucast|Mcast|Bcast)Pkts", "port_tx_packets_total"),
    _r(r"rx_bytes\.nic", "port_rx_bytes_total"),  # ice port counters
    _r(r"tx_bytes\.nic", "port_tx_bytes_total"),
    _r(r"rx_(?:unicast|multicast|broadcast)\.nic", "port_rx_packets_total"),
    _r(r"tx_(?:unicast|multicast|broadcast)\.nic", "port_tx_packets_total"),
    _r(r"rx_total_frames", "port_rx_packets_total", 1),  # bnxt port stats
    _r(r"tx_total_frames", "port_tx_packets_total", 1),
    _r(r"rx_bytes_nic", "port_rx_bytes_total", 1),  # ixgbe hardware (GORC/GPRC) totals
    _r(r"tx_bytes_nic", "port_tx_bytes_total", 1),
    _r(r"rx_pkts_nic", "port_rx_packets_total", 1),
    _r(r"tx_pkts_nic", "port_tx_packets_total", 1),
    _r(r"rx_bytes", "port_rx_bytes_total", 5),  # software (bnxt: port) totals
    _r(r"tx_bytes", "port_tx_bytes_total", 5),
    _r(r"rx_packets", "port_rx_packets_total", 5),
    _r(r"tx_packets", "port_tx_packets_total", 5),
    # --- errors and discards ---
    _r(r"rx_crc_errors_phy", "port_rx_fcs_errors_total"),
    _r(r"a_frame_check_sequence_errors", "port_rx_fcs_errors_total"),
    _r(r"dot3stats_fcs_errors", "port_rx_fcs_errors_total", 1),
    _r(r"rx_fcs_err_frames", "port_rx_fcs_errors_total"),  # bnxt
    _r(r"port\.rx_crc_errors", "port_rx_fcs_errors_total"),  # i40e
    _r(r"rx_crc_errors\.nic", "port_rx_fcs_errors_total"),  # ice
    _r(r"rx_crc_errors", "port_rx_fcs_errors_total", 5),
    _r(r"rx_discards_phy", "port_rx_discards_total"),
    _r(r"tx_discards_phy", "port_tx_discards_total"),
    _r(r"if_in_discards", "port_rx_discards_total"),  # mlxsw
    _r(r"if_out_discards", "port_tx_discards_total"),
    _r(r"HwIfInDiscards", "port_rx_discards_total"),
    _r(r"HwIfOutDiscards", "port_tx_discards_total"),
    _r(r"rx_stat_discard", "port_rx_discards_total"),  # bnxt port level
    _r(r"tx_stat_discard", "port_tx_discards_total"),
    _r(r"port\.rx_dropped", "port_rx_discards_total"),  # i40e
    _r(r"rx_dropped\.nic", "port_rx_discards_total"),  # ice
    _r(r"rx_missed_errors", "port_rx_discards_total", 1),  # ixgbe/igb: Rx packet buffer full (MPC)
    _r(r"rx_dropped", "port_rx_discards_total", 5),
    _r(r"tx_dropped", "port_tx_discards_total", 5),
    _r(r"rx_errors_phy", "port_rx_errors_total"),
    _r(r"tx_errors_phy", "port_tx_errors_total"),
    _r(r"if_out_errors", "port_tx_errors_total"),
    _r(r"HwIfInErrors", "port_rx_errors_total"),
    _r(r"HwIfOutErrors", "port_tx_errors_total"),
    _r(r"rx_stat_err", "port_rx_errors_total"),  # bnxt
    _r(r"tx_stat_error", "port_tx_errors_total"),
    _r(r"port\.tx_errors", "port_tx_errors_total"),
    _r(r"rx_errors", "port_rx_errors_total", 5),
    _r(r"tx_errors", "port_tx_errors_total", 5),
    # --- PHY / FEC ---
    _r(r"rx_bits_phy", "port_rx_phy_bits_total"),
    _r(r"rx_bits", "port_rx_phy_bits_total", 1),  # bnxt
    _r(r"rx_corrected_bits_phy", "port_fec_corrected_bits_total"),
    _r(r"rx_corrected_bits", "port_fec_corrected_bits_total", 1),  # bnxt
    _r(r"rx_fec_corrected_blocks(?:_phy)?", "port_fec_corrected_codewords_total"),
    _r(r"rx_fec_uncorrectable_blocks(?:_phy)?", "port_fec_uncorrectable_codewords_total"),
    _r(r"rx_err_lane_(?P<lane>\d+)_phy", "port_fec_lane_errors_total"),
    # rx_pcs_symbol_err_phy is the post-FEC symbol error counter; rx_symbol_err_phy is the
    # 802.3 "symbol error during carrier" counter, a fallback for older firmware.
    _r(r"rx_pcs_symbol_err_phy", "port_symbol_errors_total"),
    _r(r"rx_pcs_symbol_err", "port_symbol_errors_total"),  # bnxt
    _r(r"rx_symbol_err_phy", "port_symbol_errors_total", 1),
    _r(r"a_symbol_error_during_carrier", "port_symbol_errors_total", 1),  # mlxsw
    _r(r"link_down_events_phy", "port_link_down_events_total"),
    _r(r"link_down_events", "port_link_down_events_total", 1),  # bnxt
    # --- PFC per priority ---
    _r(rf"rx_prio{_P}_pause", "port_pfc_rx_pause_frames_total"),  # mlx5
    _r(rf"tx_prio{_P}_pause", "port_pfc_tx_pause_frames_total"),
    _r(rf"rx_prio{_P}_pause_duration", "port_pfc_rx_pause_seconds_total", 0, _US),
    _r(rf"tx_prio{_P}_pause_duration", "port_pfc_tx_pause_seconds_total", 0, _US),
    _r(rf"rx_pause_prio_{_P}", "port_pfc_rx_pause_frames_total"),  # mlxsw
    _r(rf"tx_pause_prio_{_P}", "port_pfc_tx_pause_frames_total"),
    _r(rf"rx_pause_duration_prio_{_P}", "port_pfc_rx_pause_seconds_total", 0, _US),
    _r(rf"tx_pause_duration_prio_{_P}", "port_pfc_tx_pause_seconds_total", 0, _US),
    _r(rf"rx_pfc_ena_frames_pri{_P}", "port_pfc_rx_pause_frames_total"),  # bnxt
    _r(rf"tx_pfc_ena_frames_pri{_P}", "port_pfc_tx_pause_frames_total"),
    _r(rf"pfc_pri{_P}_rx_duration_us", "port_pfc_rx_pause_seconds_total", 0, _US),
    _r(rf"pfc_pri{_P}_tx_duration_us", "port_pfc_tx_pause_seconds_total", 0, _US),
    # Intel counts XOFF (pause requests) and XON (resumes) separately; XOFF is the pause.
    _r(rf"port\.rx_priority_{_P}_xoff_rx", "port_pfc_rx_pause_frames_total"),  # i40e
    _r(rf"port\.tx_priority_{_P}_xoff_tx", "port_pfc_tx_pause_frames_total"),
    _r(rf"rx_priority_{_P}_xoff(?:\.nic)?", "port_pfc_rx_pause_frames_total"),  # ice
    _r(rf"tx_priority_{_P}_xoff(?:\.nic)?", "port_pfc_tx_pause_frames_total"),
    _r(rf"rx_pb_{_P}_pxoff", "port_pfc_rx_pause_frames_total"),  # ixgbe (per user priority)
    _r(rf"tx_pb_{_P}_pxoff", "port_pfc_tx_pause_frames_total"),
    # --- global (802.3x) pause ---
    _r(r"rx_global_pause", "port_rx_pause_frames_total"),  # mlx5
    _r(r"tx_global_pause", "port_tx_pause_frames_total"),
    _r(r"rx_global_pause_duration", "port_rx_pause_seconds_total", 0, _US),
    _r(r"tx_global_pause_duration", "port_tx_pause_seconds_total", 0, _US),
    _r(r"rx_flow_control_xoff", "port_rx_pause_frames_total"),  # ixgbe
    _r(r"tx_flow_control_xoff", "port_tx_pause_frames_total"),
    _r(r"rx_pause_ctrl_phy", "port_rx_pause_frames_total", 1),
    _r(r"tx_pause_ctrl_phy", "port_tx_pause_frames_total", 1),
    _r(r"a_pause_mac_ctrl_frames_received", "port_rx_pause_frames_total"),  # mlxsw
    _r(r"a_pause_mac_ctrl_frames_xmitted", "port_tx_pause_frames_total"),
    _r(r"dot3in_pause_frames", "port_rx_pause_frames_total", 1),
    _r(r"rx_pause_frames", "port_rx_pause_frames_total"),  # bnxt
    _r(r"tx_pause_frames", "port_tx_pause_frames_total"),
    _r(r"(?:port\.)?link_xoff_rx(?:\.nic)?", "port_rx_pause_frames_total"),  # i40e / ice
    _r(r"(?:port\.)?link_xoff_tx(?:\.nic)?", "port_tx_pause_frames_total"),
    # --- pause storm prevention (mlx5) ---
    _r(r"tx_pause_storm_warning_events", "port_pause_storm_warning_events_total"),
    _r(r"tx_pause_storm_error_events", "port_pause_storm_error_events_total"),
    # --- receive drops for lack of host buffers (a posted WQE / descriptor) ---
    _r(r"rx_out_of_buffer", "port_out_of_buffer_total"),  # mlx5 netdev queues (RDMA QPs: hw_counters)
    _r(r"rx_total_ring_discards", "port_out_of_buffer_total"),  # bnxt: sum of the rings' rx_discards
    _r(r"rx_no_dma_resources", "port_out_of_buffer_total"),  # ixgbe: no free Rx descriptor (QPRDC)
    # --- egress queue drops (mlxsw per traffic class) ---
    _r(r"tc_no_buffer_discard_uc_tc_(?P<prio>\d+)", "port_queue_drops_total"),
)

# Exact-name lookups first: most names are literal, and a dict hit is far cheaper than
# trying every regex on each of the ~700 lines an i40e prints.
_LITERAL: dict[str, _Rule] = {}
_PATTERNED: list[_Rule] = []
for _rule in _RULES:
    _src = _rule.pattern.pattern.removesuffix(r"\Z")
    if re.fullmatch(r"[A-Za-z0-9_]+", _src):
        _LITERAL[_src] = _rule
    else:
        _PATTERNED.append(_rule)


def _match(name: str) -> tuple[_Rule, re.Match[str] | None] | None:
    rule = _LITERAL.get(name)
    if rule is not None:
        return rule, None
    for rule in _PATTERNED:
        m = rule.pattern.match(name)
        if m is not None:
            return rule, m
    return None


def match_stat(name: str) -> tuple[str, int, float, int | None, int | None] | None:
    """(metric, rank, scale, priority, lane) for one `ethtool -S` counter name, None if it has no
    canonical meaning. Also used for node_exporter's ethtool collector (service/telemetry/exporters)."""
    hit = _match(name)
    if hit is None:
        return None
    rule, m = hit
    groups = m.groupdict() if m is not None else {}
    prio, lane = groups.get("prio"), groups.get("lane")
    return (rule.metric, rule.rank, rule.scale, None if prio is None else int(prio),
            None if lane is None else int(lane))


def iter_counters(text: str, source: str) -> Iterator[tuple[int, str, int, int | None]]:
    """Yield (line number, name, value, queue) for each counter line; ParseError on bad input."""
    lines = text.splitlines()
    start = None
    for i, raw in enumerate(lines):
        stripped = raw.strip()
        if stripped == _HEADER:
            start = i + 1
            break
        if stripped and not _PROMPT_RE.match(stripped):
            raise ParseError(source, f"expected {_HEADER!r} header, found {stripped[:60]!r}", i + 1)
    if start is None:
        raise ParseError(source, f"no {_HEADER!r} header", 1 if lines else None)
    for i in range(start, len(lines)):
        raw = lines[i]
        if not raw.strip():
            continue
        m = _LINE_RE.match(raw)
        if m is None:
            raise ParseError(source, f"not a 'name: value' counter line: {raw.strip()[:80]!r}", i + 1)
        value = m.group("value")
        if not _INT_RE.match(value):
            raise ParseError(source, f"counter {m.group('name')!r} has non-integer value {value[:40]!r}", i + 1)
        queue = m.group("queue")
        yield i + 1, m.group("name"), int(value), int(queue) if queue is not None else None


def parse_ethtool_stats(text: str, *, device: str, port: str, ts_ms: int, source: str) -> list[Sample]:
    """Parse `ethtool -S` text into canonical samples; unknown counters are ignored."""
    # (metric, priority, lane) -> rank -> (value, scale); per-queue lines carry no port totals.
    best: dict[tuple[str, int | None, int | None], tuple[int, float]] = {}
    seen: set[str] = set()
    for _lineno, name, value, queue in iter_counters(text, source):
        if queue is not None or name in seen:
            continue  # per-queue counters; a repeated name keeps its first value
        seen.add(name)
        hit = _match(name)
        if hit is None:
            continue
        rule, m = hit
        prio = int(m.group("prio")) if m is not None and "prio" in m.groupdict() else None
        lane = int(m.group("lane")) if m is not None and "lane" in m.groupdict() else None
        key = (rule.metric, prio, lane)
        scaled = value * rule.scale
        cur = best.get(key)
        if cur is None or rule.rank < cur[0]:
            best[key] = (rule.rank, scaled)
        elif rule.rank == cur[0]:
            best[key] = (rule.rank, cur[1] + scaled)
    return [
        Sample(metric=metric, value=float(val), ts_ms=ts_ms, device=device, port=port, lane=lane, priority=prio)
        for (metric, prio, lane), (_rank, val) in sorted(best.items(), key=_order)
    ]


def _order(item: tuple[tuple[str, int | None, int | None], tuple[int, float]]) -> tuple[str, int, int]:
    (metric, prio, lane), _ = item
    return metric, -1 if prio is None else prio, -1 if lane is None else lane
