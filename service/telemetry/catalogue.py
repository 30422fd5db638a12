"""The canonical metric catalogue: one vocabulary for every source.

Vendor names stop at the collector. Every sample that reaches ingest names one of
these metrics, in base units (seconds, bytes, volts, amperes, celsius), with optical
power in dBm and `_total` on counters. docs/metrics.md is generated from this table
(`fabricwatch metrics doc`), so the two cannot drift.
"""

from __future__ import annotations

from dataclasses import dataclass
from enum import StrEnum


class Kind(StrEnum):
    GAUGE = "gauge"
    COUNTER = "counter"


class Entity(StrEnum):
    DEVICE = "device"
    PORT = "port"
    LANE = "lane"
    PRIORITY = "priority"
    GPU = "gpu"


# Labels that name an entity; every other label is ignored on import.
ENTITY_LABELS = ("device", "port", "lane", "priority", "gpu")


@dataclass(frozen=True, slots=True)
class MetricDef:
    name: str
    kind: Kind
    entity: Entity
    unit: str
    help: str
    group: str

    @property
    def labels(self) -> tuple[str, ...]:
        return _LABELS[self.entity]


_LABELS = {
    Entity.DEVICE: ("device",),
    Entity.PORT: ("device", "port"),
    Entity.LANE: ("device", "port", "lane"),
    Entity.PRIORITY: ("device", "port", "priority"),
    Entity.GPU: ("device", "gpu"),
}
_C, _G = Kind.COUNTER, Kind.GAUGE
_P, _L, _Q, _GPU, _D = Entity.PORT, Entity.LANE, Entity.PRIORITY, Entity.GPU, Entity.DEVICE

_DEFS: list[tuple[str, Kind, Entity, str, str, str]] = [
    # name, kind, entity, unit, group, help
    ("port_oper_up", _G, _P, "bool", "state", "Operational status: 1 up, 0 down."),
    ("port_admin_up", _G, _P, "bool", "state", "Administrative status: 1 up, 0 down."),
    ("port_speed_bits_per_second", _G, _P, "bit/s", "state", "Negotiated line rate."),
    ("port_last_change_seconds", _G, _P, "s", "state",
     "Device uptime at the last oper-status change (SNMP ifLastChange)."),
    ("port_link_down_events_total", _C, _P, "events", "state",
     "Times the link went down (link_down_events_phy, IB link_downed)."),
    ("port_carrier_changes_total", _C, _P, "events", "state", "Carrier up/down transitions seen by the host."),
    ("port_link_error_recovery_total", _C, _P, "events", "state",
     "Successful link retrains (IB LinkErrorRecovery)."),
    ("port_rx_bytes_total", _C, _P, "bytes", "traffic", "Bytes received."),
    ("port_tx_bytes_total", _C, _P, "bytes", "traffic", "Bytes transmitted."),
    ("port_rx_packets_total", _C, _P, "packets", "traffic", "Packets received."),
    ("port_tx_packets_total", _C, _P, "packets", "traffic", "Packets transmitted."),
    ("port_rx_errors_total", _C, _P, "packets", "errors", "Received packets with any error."),
    ("port_tx_errors_total", _C, _P, "packets", "errors", "Packets that failed to transmit."),
    ("port_rx_fcs_errors_total", _C, _P, "packets", "errors", "Frames received with a bad FCS/CRC."),
    ("port_rx_discards_total", _C, _P, "packets", "errors", "Received packets discarded (buffer, policy)."),
    ("port_tx_discards_total", _C, _P, "packets", "errors", "Packets discarded on transmit."),
    ("port_symbol_errors_total", _C, _P, "symbols", "phy",
     "Symbol errors not corrected by FEC (or with FEC off)."),
    ("port_rx_phy_bits_total", _C, _P, "bits", "phy",
     "Bits the PHY could have received at line rate; the pre-FEC BER denominator."),
    ("port_fec_corrected_bits_total", _C, _P, "bits", "phy", "Bits corrected by FEC."),
    ("port_fec_corrected_codewords_total", _C, _P, "codewords", "phy", "FEC codewords (blocks) corrected."),
    ("port_fec_uncorrectable_codewords_total", _C, _P, "codewords", "phy",
     "FEC codewords (blocks) that could not be corrected: post-FEC errors."),
    ("port_fec_lane_errors_total", _C, _L, "symbols", "phy", "Raw per-lane errors before FEC."),
    ("port_pre_fec_ber", _G, _P, "ratio", "phy", "Pre-FEC bit error ratio, as reported by the device."),
    ("port_pfc_rx_pause_frames_total", _C, _Q, "frames", "pfc", "PFC pause frames received per priority."),
    ("port_pfc_tx_pause_frames_total", _C, _Q, "frames", "pfc", "PFC pause frames sent per priority."),
    ("port_pfc_rx_pause_seconds_total", _C, _Q, "s", "pfc", "Time paused by received PFC, per priority."),
    ("port_pfc_tx_pause_seconds_total", _C, _Q, "s", "pfc", "Time the port asked its peer to pause."),
    ("port_rx_pause_frames_total", _C, _P, "frames", "pfc", "Global (802.3x) pause frames received."),
    ("port_tx_pause_frames_total", _C, _P, "frames", "pfc", "Global (802.3x) pause frames sent."),
    ("port_rx_pause_seconds_total", _C, _P, "s", "pfc",
     "Time paused by received global (802.3x) pause frames (mlx5 rx_global_pause_duration)."),
    ("port_tx_pause_seconds_total", _C, _P, "s", "pfc",
     "Time the port held its peer paused with global pause frames (mlx5 tx_global_pause_duration)."),
    ("port_pause_storm_warning_events_total", _C, _P, "events", "pfc",
     "The NIC sent pauses for longer than the warning time."),
    ("port_pause_storm_error_events_total", _C, _P, "events", "pfc",
     "The NIC hit the pause-storm timeout and stopped sending pauses."),
    ("port_ecn_marked_packets_total", _C, _P, "packets", "congestion", "RoCE packets received with ECN CE."),
    ("port_cnp_sent_total", _C, _P, "packets", "congestion", "Congestion notification packets sent."),
    ("port_cnp_handled_total", _C, _P, "packets", "congestion", "CNPs received and acted on by the sender."),
    ("port_xmit_wait_ticks_total", _C, _P, "ticks", "congestion",
     "Ticks with data waiting but no credit to send (IB PortXmitWait)."),
    ("port_out_of_sequence_total", _C, _P, "packets", "congestion", "RoCE packets received out of sequence."),
    ("port_out_of_buffer_total", _C, _P, "packets", "congestion",
     "Drops for lack of receive WQEs/descriptors (netdev queues and RDMA QPs together)."),
    ("port_queue_drops_total", _C, _Q, "packets", "congestion", "Egress queue drops per priority/queue."),
    # RDMA transport (RC) loss, retransmit and completion-error signals, per RDMA port.
    ("port_local_ack_timeouts_total", _C, _P, "events", "rdma",
     "Requester ACK timer expiries, each a retransmission after loss (mlx5 local_ack_timeout_err)."),
    ("port_nak_sequence_errors_total", _C, _P, "packets", "rdma",
     "NAK sequence-error packets received: the responder saw a PSN gap (loss); go-back-N (mlx5 packet_seq_err)."),
    ("port_implied_nak_sequence_errors_total", _C, _P, "events", "rdma",
     "Read/atomic responses beyond the expected PSN, taken as an implied NAK (mlx5 implied_nak_seq_err)."),
    ("port_rnr_naks_total", _C, _P, "packets", "rdma",
     "Receiver-not-ready NAKs received: the peer had no receive WQE posted (mlx5 rnr_nak_retry_err)."),
    ("port_duplicate_requests_total", _C, _P, "packets", "rdma",
     "Requests the responder had already executed: the peer retransmitted (mlx5 duplicate_request)."),
    ("port_icrc_errors_total", _C, _P, "packets", "rdma",
     "RoCE packets received with a bad ICRC, corrupted end to end (mlx5 rx_icrc_encapsulated)."),
    ("port_adaptive_retransmits_total", _C, _P, "events", "rdma",
     "RoCE adaptive retransmissions (mlx5 roce_adp_retrans)."),
    ("port_adaptive_retransmit_timeouts_total", _C, _P, "events", "rdma",
     "RoCE adaptive retransmission timeouts (mlx5 roce_adp_retrans_to)."),
    ("port_transport_retries_exceeded_total", _C, _P, "events", "rdma",
     "QPs that ran out of transport retries and went to error (mlx5 req_transport_retries_exceeded)."),
    ("port_rnr_retries_exceeded_total", _C, _P, "events", "rdma",
     "QPs that ran out of RNR retries and went to error (mlx5 req_rnr_retries_exceeded)."),
    ("port_requester_cqe_errors_total", _C, _P, "completions", "rdma",
     "Requester completions with an error status (mlx5 req_cqe_error)."),
    ("port_responder_cqe_errors_total", _C, _P, "completions", "rdma",
     "Responder completions with an error status (mlx5 resp_cqe_error)."),
    ("port_requester_cqe_flush_errors_total", _C, _P, "completions", "rdma",
     "Requester work requests flushed with error after their QP failed (mlx5 req_cqe_flush_error)."),
    ("port_responder_cqe_flush_errors_total", _C, _P, "completions", "rdma",
     "Receive work requests flushed with error after their QP failed or closed (mlx5 resp_cqe_flush_error)."),
    ("port_requester_remote_access_errors_total", _C, _P, "events", "rdma",
     "Remote access errors (bad rkey or rights) seen by the requester (mlx5 req_remote_access_errors)."),
    ("port_requester_remote_invalid_request_errors_total", _C, _P, "events", "rdma",
     "Invalid-request NAKs seen by the requester (mlx5 req_remote_invalid_request)."),
    ("port_responder_remote_access_errors_total", _C, _P, "events", "rdma",
     "Remote access errors detected by the responder (mlx5 resp_remote_access_errors)."),
    ("port_responder_local_length_errors_total", _C, _P, "events", "rdma",
     "Incoming messages longer than the posted receive buffer (mlx5 resp_local_length_error)."),
    ("optic_rx_power_dbm", _G, _L, "dBm", "optics", "Receive optical power per lane."),
    ("optic_tx_power_dbm", _G, _L, "dBm", "optics", "Transmit optical power per lane."),
    ("optic_tx_bias_amperes", _G, _L, "A", "optics", "Laser bias current per lane."),
    ("optic_temperature_celsius", _G, _P, "celsius", "optics", "Module case temperature."),
    ("optic_voltage_volts", _G, _P, "V", "optics", "Module supply voltage."),
    ("optic_pre_fec_ber", _G, _L, "ratio", "optics", "Module-reported (VDM) pre-FEC BER per lane."),
    ("device_temperature_celsius", _G, _P, "celsius", "device",
     "Temperature of a device component; `port` names the component."),
    ("gpu_nvlink_crc_errors_total", _C, _GPU, "errors", "gpu", "NVLink CRC (flit and data) errors."),
    ("gpu_nvlink_replay_errors_total", _C, _GPU, "errors", "gpu", "NVLink replays."),
    ("gpu_nvlink_recovery_errors_total", _C, _GPU, "errors", "gpu", "NVLink recoveries."),
    ("gpu_nvlink_rx_bytes_total", _C, _GPU, "bytes", "gpu", "NVLink bytes received."),
    ("gpu_nvlink_tx_bytes_total", _C, _GPU, "bytes", "gpu", "NVLink bytes transmitted."),
    ("gpu_xid_errors_total", _C, _GPU, "events", "gpu", "XID error events."),
    ("gpu_last_xid", _G, _GPU, "code", "gpu", "Code of the most recent XID error (0 if none)."),
    ("gpu_pcie_link_generation", _G, _GPU, "gen", "gpu", "Current PCIe link generation."),
    ("gpu_pcie_link_width", _G, _GPU, "lanes", "gpu", "Current PCIe link width."),
    ("gpu_temperature_celsius", _G, _GPU, "celsius", "gpu", "GPU core temperature."),
]

METRICS: dict[str, MetricDef] = {
    name: MetricDef(name=name, kind=kind, entity=entity, unit=unit, group=group, help=help_)
    for name, kind, entity, unit, group, help_ in _DEFS
}


def get(name: str) -> MetricDef | None:
    """The definition of a canonical metric, or None if the name is not canonical."""
    return METRICS.get(name)


def is_counter(name: str) -> bool:
    m = METRICS.get(name)
    return m is not None and m.kind is Kind.COUNTER
