"""The host conformance corpus: every real host capture in tests/data/real, with hand-checked values.

One row per (capture, source, metric group): the values were read from the capture by hand
(the vendor name and raw value are in the comment). The source names are the rows of the
Hosts table in docs/devices.md, the groups its columns (the catalogue's groups). A row with
no values says "no samples of this group": the capture is one the parser must not turn into
readings (all-zero or garbled DOM), and must say why in a warning.

Shared by tests/collectors/test_host_conformance.py and bench/device_conformance.py.
"""

from __future__ import annotations

import math
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path

from collectors.base import ParseError
from collectors.host.ethtool_module import parse_ethtool_module
from collectors.host.ethtool_stats import parse_ethtool_stats
from collectors.host.rdma_sysfs import parse_hw_counters_dump, parse_perfquery, parse_rdma_stat, read_rdma_sysfs
from service.telemetry import catalogue
from service.telemetry.samples import Sample
from tests.paths import FIXTURES

Key = tuple[str, str | None, int | None, int | None]  # metric, port, lane, priority
P = "p"  # the port label given to single-port outputs (ethtool)


def dbm(mw: float) -> float:
    return 10 * math.log10(mw)


@dataclass(frozen=True)
class Case:
    path: str  # under tests/data/real
    source: str  # a row of the Hosts table in docs/devices.md
    group: str  # a catalogue group, a column of that table
    expect: dict[Key, float]


def _stats(path: Path) -> list[Sample]:
    return parse_ethtool_stats(path.read_text(), device="h", port=P, ts_ms=1, source=path.name)


def _module(path: Path) -> list[Sample]:
    return parse_ethtool_module(path.read_text(), device="h", port=P, ts_ms=1, source=path.name).samples


def _text(fn: Callable[..., list[Sample]]) -> Callable[[Path], list[Sample]]:
    return lambda path: fn(path.read_text(), device="h", ts_ms=1, source=path.name)


def parser_for(path: str) -> Callable[[Path], list[Sample]]:
    if path.startswith("ethtool_stats/"):
        return _stats
    if path.startswith("ethtool_module/"):
        return _module
    if path.endswith("_tree"):
        return lambda p: read_rdma_sysfs(p, device="h", ts_ms=1)
    if "show_counters" in path:
        return _text(parse_hw_counters_dump)
    if "rdma_stat" in path:
        return _text(parse_rdma_stat)
    if "perfquery_extended" in path:
        return _text(parse_perfquery)
    raise AssertionError(f"no parser for {path}")


MLX5_S, BNXT_S, ICE_S, I40E_S, IXGBE_S = (f"{d} (`ethtool -S`)" for d in ("mlx5", "bnxt_en", "ice", "i40e", "ixgbe"))
MLXSW_S, CUMULUS_S = "mlxsw, Spectrum switchdev (`ethtool -S`)", "Cumulus switchd (`ethtool -S`)"
SFP_M, SFP28_M = "SFP / SFP+, SFF-8472 (`ethtool -m`)", "SFP28, SFF-8472 (`ethtool -m`)"
QSFP_M = "QSFP+ / QSFP28, SFF-8636 (`ethtool -m`, text and JSON)"
QSFPDD_M = "QSFP-DD, CMIS (`ethtool -m`, text and JSON)"
MLX5_SYSFS = "mlx5 RDMA sysfs (`counters/`, `hw_counters/`)"
MLX4_SYSFS = "mlx4 RDMA sysfs (`counters/`, `counters_ext/`)"
HFI1_SYSFS = "hfi1 Omni-Path sysfs (`counters/`)"
SHOW_COUNTERS, RDMA_STAT = "mlx5 `show_counters` dump", "mlx5 `rdma statistic show`"
PERFQUERY = "`perfquery -x` (IB switch and HCA ports)"

S = "ethtool_stats/"
MLX5_FEC = S + "cn_notes_mlx5_100G_fec_lane_errors_ethtool_S_COMMENTS_STRIPPED.txt"
MLX5_XDP = S + "lore_bpf_20240619_mlx5_kernel5.15_xdp_nonzero_ethtool_S.txt"
BNXT_OLD, BNXT_NEW = S + "showmax_bnxt_en_fw220_rhel8_sfp10g_ethtool_S.txt", S + "ethq_bnxt_en_ethtool_S.txt"
ICE, I40E = S + "ethq_ice_ethtool_S.txt", S + "showmax_i40e_fw8.60_rhel8_sfp10gsr_ethtool_S.txt"
IXGBE = S + "cn_notes_ixgbe_ethtool_S_EXCERPT_queue_lines_left_out.txt"
MLXSW = S + "mlxsw_spectrum_swp31_per_prio_pause_ethtool_S.txt"
CUMULUS = S + "cumulus_docs_cl37_switch_swp1_ethtool_S.txt"
M = "ethtool_module/"
R = "rdma_sysfs/"
PROCFS, NODE_EXP = R + "procfs_fixtures_infiniband_tree", R + "node_exporter_fixtures_infiniband_tree"
TREY = "other/treydock_ib_"


def k(metric: str, port: str | None = P, lane: int | None = None, prio: int | None = None) -> Key:
    return (f"port_{metric}" if not metric.startswith("optic_") else metric, port, lane, prio)


CASES: list[Case] = [
    # ---- mlx5 ethtool -S: physical-port (_phy) counters, not the netdev/vport ones
    Case(MLX5_FEC, MLX5_S, "state", {k("link_down_events_total"): 0}),  # link_down_events_phy
    Case(MLX5_FEC, MLX5_S, "traffic", {k("rx_bytes_total"): 2027206797,  # rx_bytes_phy, not rx_bytes 74420
                                       k("tx_packets_total"): 7222595}),  # tx_packets_phy
    Case(MLX5_FEC, MLX5_S, "errors", {k("rx_fcs_errors_total"): 386}),  # rx_crc_errors_phy
    Case(MLX5_FEC, MLX5_S, "phy", {k("fec_lane_errors_total", lane=0): 28116,  # rx_err_lane_0_phy
                                   k("fec_lane_errors_total", lane=3): 17722623,
                                   k("fec_corrected_bits_total"): 17750739,  # rx_corrected_bits_phy
                                   k("symbol_errors_total"): 386}),  # rx_pcs_symbol_err_phy
    Case(MLX5_FEC, MLX5_S, "pfc", {k("tx_pause_frames_total"): 2,  # tx_pause_ctrl_phy (no tx_global_pause line)
                                   k("pause_storm_error_events_total"): 0}),
    Case(MLX5_FEC, MLX5_S, "congestion", {k("out_of_buffer_total"): 0}),  # rx_out_of_buffer
    Case(MLX5_XDP, MLX5_S, "traffic", {k("rx_bytes_total"): 6211329423080}),
    Case(MLX5_XDP, MLX5_S, "errors", {k("rx_discards_total"): 58591428329}),  # rx_discards_phy
    Case(MLX5_XDP, MLX5_S, "pfc", {k("tx_pause_frames_total"): 5745042,  # tx_global_pause beats tx_pause_ctrl_phy
                                   k("tx_pause_seconds_total"): 771.10381}),  # tx_global_pause_duration 771103810 us
    Case(MLX5_XDP, MLX5_S, "congestion", {k("out_of_buffer_total"): 990473555}),  # rx_out_of_buffer
    # ---- bnxt_en
    Case(BNXT_OLD, BNXT_S, "state", {k("link_down_events_total"): 4}),
    Case(BNXT_OLD, BNXT_S, "traffic", {k("rx_bytes_total"): 215351646640,  # port stats, not the [N]: lines
                                       k("rx_packets_total"): 1570244352}),  # rx_total_frames
    Case(BNXT_OLD, BNXT_S, "phy", {k("rx_phy_bits_total"): 1722813173120}),  # rx_bits
    Case(BNXT_OLD, BNXT_S, "pfc", {k("pfc_rx_pause_frames_total", prio=3): 0,  # rx_pfc_ena_frames_pri3
                                   k("pfc_tx_pause_seconds_total", prio=3): 0}),  # pfc_pri3_tx_duration_us
    Case(BNXT_NEW, BNXT_S, "traffic", {k("rx_bytes_total"): 577687185962088,
                                       k("tx_packets_total"): 754109637868}),  # tx_total_frames
    Case(BNXT_NEW, BNXT_S, "errors", {k("rx_discards_total"): 49337}),  # rx_stat_discard
    Case(BNXT_NEW, BNXT_S, "phy", {k("rx_phy_bits_total"): 4621497487696704,
                                   k("fec_uncorrectable_codewords_total"): 0}),  # rx_fec_uncorrectable_blocks
    Case(BNXT_NEW, BNXT_S, "congestion", {k("out_of_buffer_total"): 655430134}),  # rx_total_ring_discards
    # ---- ice: the .nic port counters
    Case(ICE, ICE_S, "traffic", {k("rx_bytes_total"): 848255752,  # rx_bytes.nic, not rx_bytes 848243014
                                 k("rx_packets_total"): 12117448 + 197 + 0,  # rx_unicast/multicast/broadcast.nic
                                 k("tx_packets_total"): 48786299 + 253 + 4}),
    Case(ICE, ICE_S, "errors", {k("rx_discards_total"): 0, k("rx_fcs_errors_total"): 0}),  # rx_dropped.nic, crc
    Case(ICE, ICE_S, "pfc", {k("rx_pause_frames_total"): 0,  # link_xoff_rx.nic
                             k("pfc_tx_pause_frames_total", prio=3): 0}),  # tx_priority_3_xoff.nic
    # ---- i40e: 64-bit software totals (port.* are 48-bit and wrap)
    Case(I40E, I40E_S, "traffic", {k("tx_bytes_total"): 721274579342884, k("rx_packets_total"): 258269468302}),
    Case(I40E, I40E_S, "errors", {k("rx_fcs_errors_total"): 0}),  # port.rx_crc_errors
    Case(I40E, I40E_S, "pfc", {k("pfc_rx_pause_frames_total", prio=3): 0}),  # port.rx_priority_3_xoff_rx
    # ---- ixgbe: the *_nic hardware totals
    Case(IXGBE, IXGBE_S, "traffic", {k("rx_bytes_total"): 314224148414349,  # rx_bytes_nic, not rx_bytes
                                     k("rx_packets_total"): 514913553697}),  # rx_pkts_nic
    Case(IXGBE, IXGBE_S, "errors", {k("rx_discards_total"): 0, k("rx_fcs_errors_total"): 0}),  # rx_missed_errors
    Case(IXGBE, IXGBE_S, "pfc", {k("tx_pause_frames_total"): 0,  # tx_flow_control_xoff
                                 k("pfc_rx_pause_frames_total", prio=3): 0}),  # rx_pb_3_pxoff
    Case(IXGBE, IXGBE_S, "congestion", {k("out_of_buffer_total"): 236}),  # rx_no_dma_resources
    # ---- Linux switches (the host agent on a switch OS)
    Case(MLXSW, MLXSW_S, "errors", {k("rx_fcs_errors_total"): 0,  # a_frame_check_sequence_errors
                                    k("rx_discards_total"): 0}),  # if_in_discards
    Case(MLXSW, MLXSW_S, "phy", {k("symbol_errors_total"): 0}),  # a_symbol_error_during_carrier
    Case(MLXSW, MLXSW_S, "traffic", {k("rx_bytes_total"): 319786790393748, k("tx_packets_total"): 57271205843}),
    Case(MLXSW, MLXSW_S, "pfc", {k("pfc_rx_pause_frames_total", prio=4): 0,  # rx_pause_prio_4
                                 k("pfc_tx_pause_seconds_total", prio=7): 0}),  # tx_pause_duration_prio_7
    Case(MLXSW, MLXSW_S, "congestion", {k("queue_drops_total", prio=15): 0}),  # tc_no_buffer_discard_uc_tc_15
    Case(CUMULUS, CUMULUS_S, "traffic", {k("rx_bytes_total"): 1435339,  # HwIfInOctets
                                         k("rx_packets_total"): 11795 + 3 + 4578,  # HwIfIn{Ucast,Bcast,Mcast}Pkts
                                         k("tx_packets_total"): 11791 + 136493 + 0}),
    Case(CUMULUS, CUMULUS_S, "errors", {k("rx_discards_total"): 0}),  # HwIfInDiscards
    # ---- ethtool -m
    Case(M + "cumulus_docs_cl37_sfp_1000base-sx_jdsu_swp3_ethtool_m.txt", SFP_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(0.3195), k("optic_tx_bias_amperes", lane=0): 0.021348,
        k("optic_temperature_celsius"): 41.70, k("optic_voltage_volts"): 3.2947}),
    Case(M + "showmax_i40e_sfp_10GSR_ethtool_m.txt", SFP_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(0.6486), k("optic_tx_bias_amperes", lane=0): 0.006090,
        k("optic_temperature_celsius"): 39.18}),
    # every value 0 (ixgbe read nothing): no reading, not a dark lane with a dead laser
    Case(M + "showmax_ixgbe_sfp_FS_SFP-10GSR-85_all_zero_dom_ethtool_m.txt", SFP_M, "optics", {}),
    Case(M + "showmax_bnxt_en_sfp_FS_SFP-10GSR-85_garbled_dom_ethtool_m.txt", SFP_M, "optics", {}),  # 0.2287 V
    Case(M + "unidentified_sfp28_25G-SR_finisar_FTLF8536P5BCL-HP_ethtool_m.txt", SFP28_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(0.7457), k("optic_tx_power_dbm", lane=0): dbm(0.7572),
        k("optic_tx_bias_amperes", lane=0): 0.007956, k("optic_temperature_celsius"): 53.13,
        k("optic_voltage_volts"): 3.3011}),
    Case(M + "lore_netdev_20240523_qsfp+_40G-SR4_avago_mlx4_ethtool_m.txt", QSFP_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(0.7682),
        k("optic_rx_power_dbm", lane=3): -40.0,  # 0.0000 mW on a live module: a dark lane
        k("optic_tx_bias_amperes", lane=3): 0.0, k("optic_temperature_celsius"): 42.17}),
    Case(M + "robinchrist_cwdm4_qsfp28_finisar_FTLC1152RGPL6-FB_mlx5_live_ethtool_m.txt", QSFP_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(0.9969), k("optic_tx_power_dbm", lane=3): dbm(1.1533),
        k("optic_tx_bias_amperes", lane=0): 0.042068, k("optic_temperature_celsius"): 33.76,
        k("optic_voltage_volts"): 3.2505}),
    # the same module before its OUI was changed: the ConnectX-4 keeps its lasers off. Temperature and
    # voltage are live, so 0.0001 mW is a reading (dark lanes, no bias), not "no reading"
    Case(M + "robinchrist_cwdm4_qsfp28_finisar_FTLC1152RGPL6-FB_mlx5_laser_disabled_ethtool_m.txt", QSFP_M,
         "optics", {k("optic_tx_power_dbm", lane=0): -40.0, k("optic_rx_power_dbm", lane=3): -40.0,
                    k("optic_tx_bias_amperes", lane=2): 0.0, k("optic_temperature_celsius"): 34.5,
                    k("optic_voltage_volts"): 3.2706}),
    Case(M + "lore_netdev_20250210_sff8636_qsfp28_aoc_mellanox_MFS1S00-V003E_ethtool_json_m.json", QSFP_M,
         "optics", {k("optic_rx_power_dbm", lane=3): dbm(0.0394), k("optic_voltage_volts"): 3.259}),
    Case(M + "lore_netdev_20241015_cmis_qsfpdd_arista_QDD-400G-XDR4_ethtool_m.txt", QSFPDD_M, "optics", {
        k("optic_rx_power_dbm", lane=0): dbm(2.2489), k("optic_rx_power_dbm", lane=7): -40.0,  # unused lane 8
        k("optic_tx_bias_amperes", lane=3): 0.1101, k("optic_temperature_celsius"): 70.49}),
    Case(M + "lore_netdev_20250205_cmis_qsfpdd_finisar_FTCD8613E1PCM_ethtool_json_m.json", QSFPDD_M, "optics", {
        k("optic_temperature_celsius"): 37.5273,  # the reading, not the duplicate threshold object
        k("optic_rx_power_dbm", lane=0): -40.0, k("optic_voltage_volts"): 3.3358}),
    # ---- RDMA sysfs (procfs fixture: hfi1, mlx4 and mlx5 devices)
    Case(PROCFS, MLX5_SYSFS, "state", {k("link_down_events_total", "mlx5_0/1"): 0}),  # counters/link_downed
    Case(PROCFS, MLX5_SYSFS, "traffic", {k("tx_packets_total", "mlx5_0/1"): 10907922116,
                                         k("rx_bytes_total", "mlx5_0/1"): 18126345378 * 4}),  # 4-byte words
    Case(PROCFS, MLX5_SYSFS, "errors", {k("rx_errors_total", "mlx5_0/1"): 0}),
    Case(PROCFS, MLX5_SYSFS, "phy", {k("symbol_errors_total", "mlx5_0/1"): 0}),
    Case(PROCFS, MLX5_SYSFS, "congestion", {k("out_of_sequence_total", "mlx5_0/1"): 1,
                                            k("out_of_buffer_total", "mlx5_0/1"): 0,
                                            k("xmit_wait_ticks_total", "mlx5_0/1"): 0}),
    Case(PROCFS, MLX5_SYSFS, "rdma", {k("local_ack_timeouts_total", "mlx5_0/1"): 131,  # local_ack_timeout_err
                                      k("nak_sequence_errors_total", "mlx5_0/1"): 1,  # packet_seq_err
                                      k("duplicate_requests_total", "mlx5_0/1"): 41,  # duplicate_request
                                      k("rnr_naks_total", "mlx5_0/1"): 0,  # rnr_nak_retry_err
                                      k("requester_cqe_errors_total", "mlx5_0/1"): 3481,  # req_cqe_error
                                      k("responder_cqe_errors_total", "mlx5_0/1"): 8109,  # resp_cqe_error
                                      k("requester_cqe_flush_errors_total", "mlx5_0/1"): 80,
                                      k("responder_cqe_flush_errors_total", "mlx5_0/1"): 4708,
                                      k("adaptive_retransmits_total", "mlx5_0/1"): 99,  # roce_adp_retrans
                                      k("adaptive_retransmit_timeouts_total", "mlx5_0/1"): 4}),
    Case(PROCFS, MLX4_SYSFS, "state", {k("link_down_events_total", "mlx4_0/1"): 0}),
    Case(PROCFS, MLX4_SYSFS, "traffic", {k("rx_bytes_total", "mlx4_0/1"): 2221223609 * 4}),
    Case(PROCFS, MLX4_SYSFS, "phy", {k("symbol_errors_total", "mlx4_0/1"): 0}),
    Case(PROCFS, MLX4_SYSFS, "congestion", {k("xmit_wait_ticks_total", "mlx4_0/2"): 3846}),
    Case(PROCFS, HFI1_SYSFS, "traffic", {k("rx_bytes_total", "hfi1_0/1"): 345091702026 * 4,
                                         k("rx_packets_total", "hfi1_0/1"): 638036947}),
    Case(PROCFS, HFI1_SYSFS, "state", {k("link_down_events_total", "hfi1_0/1"): 0}),
    Case(PROCFS, HFI1_SYSFS, "errors", {k("rx_errors_total", "hfi1_0/1"): 0}),  # port_rcv_errors
    Case(PROCFS, HFI1_SYSFS, "phy", {k("symbol_errors_total", "hfi1_0/1"): 0}),
    Case(PROCFS, HFI1_SYSFS, "congestion", {k("xmit_wait_ticks_total", "hfi1_0/1"): 0}),
    Case(NODE_EXP, MLX4_SYSFS, "traffic", {k("rx_packets_total", "mlx4_0/1"): 6825908347}),
    Case(NODE_EXP, MLX4_SYSFS, "errors", {k("tx_discards_total", "mlx4_0/1"): 5}),  # port_xmit_discards
    Case(NODE_EXP, MLX4_SYSFS, "congestion", {k("xmit_wait_ticks_total", "mlx4_0/1"): 4294967295}),  # saturated
    # ---- text dumps of the same counters
    Case(R + "cn_notes_mlx5_bond_0_show_counters_hw_counters_nonzero_ecn_cnp.txt", SHOW_COUNTERS, "congestion", {
        k("cnp_sent_total", "mlx5_bond_0/1"): 1052612505, k("ecn_marked_packets_total", "mlx5_bond_0/1"): 21278189006,
        k("out_of_sequence_total", "mlx5_bond_0/1"): 1811101}),
    Case(R + "cn_notes_mlx5_bond_0_show_counters_hw_counters_nonzero_ecn_cnp.txt", SHOW_COUNTERS, "rdma", {
        k("responder_cqe_errors_total", "mlx5_bond_0/1"): 3293504,
        k("responder_cqe_flush_errors_total", "mlx5_bond_0/1"): 3211234,
        k("icrc_errors_total", "mlx5_bond_0/1"): 0}),  # rx_icrc_encapsulated
    Case(R + "cn_notes_mlx5_rdma_statistic_show_4links_nonzero_cqe_errors.txt", RDMA_STAT, "congestion", {
        k("out_of_buffer_total", "mlx5_0/1"): 135, k("cnp_handled_total", "mlx5_2/1"): 0}),
    Case(R + "cn_notes_mlx5_rdma_statistic_show_4links_nonzero_cqe_errors.txt", RDMA_STAT, "rdma", {
        k("responder_cqe_errors_total", "mlx5_0/1"): 1009, k("requester_cqe_errors_total", "mlx5_0/1"): 22,
        k("responder_cqe_flush_errors_total", "mlx5_0/1"): 998,
        k("requester_cqe_flush_errors_total", "mlx5_0/1"): 11,
        k("icrc_errors_total", "mlx5_3/1"): 0, k("local_ack_timeouts_total", "mlx5_1/1"): 0}),
    Case(R + "lore_netdev_20190710_iproute2_rdma_stat_show_mlx5_examples.txt", RDMA_STAT, "rdma", {
        k("nak_sequence_errors_total", "rocep1s0f5/1"): 0}),  # the QP record of mlx5_2/1 is left out
    # ---- perfquery -x
    Case(TREY + "switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt", PERFQUERY, "congestion", {
        k("xmit_wait_ticks_total", "lid1719/1"): 22730501, k("xmit_wait_ticks_total", "lid1719/2"): 36510964}),
    Case(TREY + "switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt", PERFQUERY, "traffic", {
        k("tx_bytes_total", "lid1719/1"): 36298026860928 * 4, k("rx_packets_total", "lid1719/1"): 32262508468}),
    Case(TREY + "switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt", PERFQUERY, "state", {
        k("link_down_events_total", "lid1719/1"): 0}),  # LinkDownedCounter (CapMask2 bit 1: 64-bit)
    Case(TREY + "switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt", PERFQUERY, "errors", {
        k("rx_errors_total", "lid1719/1"): 0, k("tx_discards_total", "lid1719/2"): 0}),
    Case(TREY + "switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt", PERFQUERY, "phy", {
        k("symbol_errors_total", "lid1719/1"): 0}),
    Case(TREY + "hca_edr_perfquery_extended_0x7cfe9003003b4b96.txt", PERFQUERY, "traffic", {
        k("rx_packets_total", "lid133/1"): 100583719365}),
]


def mismatches(case: Case) -> list[str]:
    """What the parser gets wrong for one row: wrong or missing values, or readings where there must be none.

    A row with no values must also say why in a warning ("no DOM reading"): a blind spot, never silent.
    """
    path = FIXTURES / case.path
    try:
        samples = parser_for(case.path)(path)
    except ParseError as e:
        return [f"refused: {e}"]
    out = [f"{s.metric}: not in the catalogue" for s in samples if catalogue.get(s.metric) is None]
    got = {(s.metric, s.port, s.lane, s.priority): s.value for s in samples}
    if len(got) != len(samples):
        out.append("more than one sample per series")
    if not case.expect:
        readings = sorted({m for m, *_ in got if catalogue.get(m) is not None and catalogue.get(m).group == case.group})
        if readings:
            out.append(f"must not be turned into readings: {readings}")
        if case.path.startswith("ethtool_module/"):
            warnings = parse_ethtool_module(path.read_text(), device="h", port=P, ts_ms=1, source=path.name).warnings
            if not any("no DOM reading" in w for w in warnings):
                out.append(f"no reading, but no warning says so: {warnings}")
    for key, value in case.expect.items():
        if catalogue.get(key[0]) is None or catalogue.get(key[0]).group != case.group:
            out.append(f"{key[0]} is not in group {case.group}")
        elif key not in got:
            out.append(f"{key}: missing")
        elif not math.isclose(got[key], value, rel_tol=0, abs_tol=1e-4):
            out.append(f"{key}: want {value}, got {got[key]}")
    return out
