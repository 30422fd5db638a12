"""The metric catalogue follows Prometheus naming, and docs/metrics.md is generated from it."""

from __future__ import annotations

import re

from service.telemetry.catalogue import METRICS, Kind
from service.telemetry.catalogue_doc import render
from tests.paths import REPO


def test_names_follow_prometheus_conventions() -> None:
    for m in METRICS.values():
        assert re.fullmatch(r"[a-z][a-z0-9_]*", m.name), m.name
        assert m.name.endswith("_total") == (m.kind is Kind.COUNTER), m.name
        assert not re.search(r"_(mw|ma|ms|kbps|mbps|gbps|percent)(_|$)", m.name), f"non-base unit in {m.name}"


def test_required_metrics_exist() -> None:
    required = {
        "port_oper_up", "port_speed_bits_per_second", "port_link_down_events_total", "port_rx_bytes_total",
        "port_tx_packets_total", "port_rx_fcs_errors_total", "port_rx_discards_total", "port_symbol_errors_total",
        "port_fec_corrected_codewords_total", "port_fec_uncorrectable_codewords_total", "port_pre_fec_ber",
        "port_pfc_rx_pause_frames_total", "port_pfc_tx_pause_seconds_total", "port_ecn_marked_packets_total",
        "port_cnp_sent_total", "port_cnp_handled_total", "optic_rx_power_dbm", "optic_tx_power_dbm",
        "optic_tx_bias_amperes", "optic_temperature_celsius", "optic_voltage_volts",
        "gpu_nvlink_crc_errors_total", "gpu_nvlink_replay_errors_total", "gpu_nvlink_recovery_errors_total",
        "gpu_xid_errors_total",
    }
    assert required <= set(METRICS)


def test_docs_match_the_catalogue() -> None:
    assert (REPO / "docs" / "metrics.md").read_text() == render(), \
        "docs/metrics.md is stale: run `fabricwatch metrics doc --out docs/metrics.md`"
