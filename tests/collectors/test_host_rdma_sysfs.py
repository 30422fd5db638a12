"""RDMA counters: real sysfs trees, a derived RoCE tree, show_counters / rdma stat / perfquery text."""

from __future__ import annotations

import contextlib
import shutil
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.base import ParseError
from collectors.host.rdma_sysfs import (
    discover_port_names,
    parse_hw_counters_dump,
    parse_perfquery,
    parse_rdma_stat,
    parse_sysfs_value,
    read_rdma_sysfs,
)
from service.telemetry import catalogue
from service.telemetry.promtext import parse_text
from service.telemetry.samples import Sample
from tests.paths import FIXTURES

DIR = FIXTURES / "rdma_sysfs"
OTHER = FIXTURES / "other"
ROCE = Path(__file__).resolve().parents[1] / "data" / "host" / "sysfs_roce"


def by_key(samples: list[Sample]) -> dict[tuple[str | None, str], Sample]:
    assert all(catalogue.get(s.metric) is not None for s in samples)
    out = {(s.port, s.metric): s for s in samples}
    assert len(out) == len(samples)
    return out


def test_node_exporter_tree_matches_node_exporters_own_output() -> None:
    """node_exporter's e2e output was generated from this very tree: an independent oracle."""
    got = by_key(read_rdma_sysfs(DIR / "node_exporter_fixtures_infiniband_tree", device="h", ts_ms=1))
    lines = parse_text((OTHER / "node_exporter_e2e_output_infiniband_lines.prom").read_text())
    oracle = {(dict(p.labels)["device"], dict(p.labels)["port"], p.name): p.value
              for p in lines if "port" in dict(p.labels)}
    pairs = {
        "port_rx_bytes_total": "node_infiniband_port_data_received_bytes_total",  # x4 words -> bytes
        "port_tx_bytes_total": "node_infiniband_port_data_transmitted_bytes_total",
        "port_rx_packets_total": "node_infiniband_port_packets_received_total",
        "port_tx_packets_total": "node_infiniband_port_packets_transmitted_total",
        "port_xmit_wait_ticks_total": "node_infiniband_port_transmit_wait_total",
        "port_tx_discards_total": "node_infiniband_port_discards_transmitted_total",
        "port_rx_errors_total": "node_infiniband_port_errors_received_total",
        "port_link_down_events_total": "node_infiniband_link_downed_total",
        "port_link_error_recovery_total": "node_infiniband_link_error_recovery_total",
    }
    checked = 0
    for (port, metric), s in got.items():
        ours = pairs.get(metric)
        dev, num = port.split("/")
        if ours and (dev, num, ours) in oracle:
            assert s.value == oracle[(dev, num, ours)], (port, metric)
            checked += 1
    assert checked >= 12
    wait = got[("mlx4_0/1", "port_xmit_wait_ticks_total")]
    assert (wait.value, wait.counter_bits, wait.saturating) == (4294967295, 32, True)
    assert got[("mlx4_0/1", "port_rx_packets_total")].counter_bits == 64  # 6825908347 > 2**32
    assert not any(p.startswith("i40iw0") for p, _ in got)  # "N/A (no PMA)" -> no samples


def test_procfs_tree_widths_and_hw_counters() -> None:
    got = by_key(read_rdma_sysfs(DIR / "procfs_fixtures_infiniband_tree", device="h", ts_ms=1))
    assert got[("hfi1_0/1", "port_rx_bytes_total")].value == 345091702026 * 4
    assert got[("mlx4_0/2", "port_xmit_wait_ticks_total")].value == 3846
    sym = got[("mlx5_0/1", "port_symbol_errors_total")]
    assert (sym.counter_bits, sym.saturating) == (16, True)
    assert got[("mlx5_0/1", "port_link_down_events_total")].counter_bits == 8
    oos = got[("mlx5_0/1", "port_out_of_sequence_total")]
    assert (oos.value, oos.counter_bits, oos.saturating) == (1, 32, False)


def test_roce_transport_counters_and_widths(tmp_path: Path) -> None:
    """Q counters (retransmits, CQE errors) are 32-bit and wrap; rx_icrc_encapsulated is a 64-bit PPCNT pair."""
    got = by_key(read_rdma_sysfs(DIR / "procfs_fixtures_infiniband_tree", device="h", ts_ms=1))
    ack = got[("mlx5_0/1", "port_local_ack_timeouts_total")]
    assert (ack.value, ack.counter_bits, ack.saturating) == (131, 32, False)
    assert got[("mlx5_0/1", "port_responder_cqe_flush_errors_total")].value == 4708
    # newer firmware's retry-exhaustion counters, and the ICRC counter, on a copy of the derived tree
    shutil.copytree(ROCE, tmp_path / "r")
    hw = tmp_path / "r/sys/class/infiniband/mlx5_0/ports/1/hw_counters"
    (hw / "req_transport_retries_exceeded").write_text("3\n")
    (hw / "req_rnr_retries_exceeded").write_text("1\n")
    (hw / "rx_icrc_encapsulated").write_text("4294967296\n")
    got = by_key(read_rdma_sysfs(tmp_path / "r", device="h", ts_ms=1))
    assert got[("mlx5_0/1", "port_transport_retries_exceeded_total")].value == 3
    assert got[("mlx5_0/1", "port_rnr_retries_exceeded_total")].value == 1
    icrc = got[("mlx5_0/1", "port_icrc_errors_total")]
    assert (icrc.value, icrc.counter_bits) == (2**32, 64)


def test_derived_roce_tree_with_port_names_and_saturated_xmit_wait() -> None:
    names = discover_port_names(ROCE)
    assert names == {("mlx5_0", 1): "ens1f0np0"}
    got = by_key(read_rdma_sysfs(ROCE, device="gpu1", ts_ms=7, port_names=names))
    assert got[("ens1f0np0", "port_cnp_sent_total")].value == 1052612505
    assert got[("ens1f0np0", "port_ecn_marked_packets_total")].value == 21278189006
    assert got[("ens1f0np0", "port_cnp_handled_total")].counter_bits == 64
    wait = got[("ens1f0np0", "port_xmit_wait_ticks_total")]
    assert (wait.value, wait.counter_bits, wait.saturating) == (4294967295, 32, True)
    # default label without a mapping
    assert {s.port for s in read_rdma_sysfs(ROCE, device="gpu1", ts_ms=7)} == {"mlx5_0/1"}


def test_bad_counter_file_raises_or_warns(tmp_path: Path) -> None:
    shutil.copytree(ROCE, tmp_path / "r")
    bad = tmp_path / "r/sys/class/infiniband/mlx5_0/ports/1/hw_counters/np_cnp_sent"
    bad.write_text("12ab\n")
    with pytest.raises(ParseError) as exc:
        read_rdma_sysfs(tmp_path / "r", device="h", ts_ms=1)
    assert exc.value.source.endswith("np_cnp_sent") and "12ab" in exc.value.reason
    warnings: list[str] = []
    got = by_key(read_rdma_sysfs(tmp_path / "r", device="h", ts_ms=1, warnings=warnings))
    assert ("mlx5_0/1", "port_cnp_sent_total") not in got and ("mlx5_0/1", "port_symbol_errors_total") in got
    assert len(warnings) == 1 and "np_cnp_sent" in warnings[0]


def test_no_infiniband_class_is_empty(tmp_path: Path) -> None:
    assert read_rdma_sysfs(tmp_path, device="h", ts_ms=1) == []


def test_show_counters_dump() -> None:
    path = DIR / "cn_notes_mlx5_bond_0_show_counters_hw_counters_nonzero_ecn_cnp.txt"
    got = by_key(parse_hw_counters_dump(path.read_text(), device="h", ts_ms=1, source=path.name))
    assert got[("mlx5_bond_0/1", "port_cnp_sent_total")].value == 1052612505
    assert got[("mlx5_bond_0/1", "port_ecn_marked_packets_total")].value == 21278189006
    assert got[("mlx5_bond_0/1", "port_out_of_sequence_total")].value == 1811101
    assert got[("mlx5_bond_0/1", "port_cnp_handled_total")].value == 0


def test_rdma_stat_show_real_counters_per_link() -> None:
    path = DIR / "cn_notes_mlx5_rdma_statistic_show_4links_nonzero_cqe_errors.txt"
    got = by_key(parse_rdma_stat(path.read_text(), device="h", ts_ms=1, source=path.name,
                                 port_names={("mlx5_0", 1): "eth01"}))
    assert {p for p, _ in got} == {"eth01", "mlx5_1/1", "mlx5_2/1", "mlx5_3/1"}
    assert got[("eth01", "port_responder_cqe_errors_total")].value == 1009
    assert got[("eth01", "port_requester_cqe_errors_total")].counter_bits == 32
    assert got[("eth01", "port_out_of_buffer_total")].value == 135
    assert got[("mlx5_2/1", "port_icrc_errors_total")].counter_bits == 64


def test_rdma_stat_show_skips_qp_records() -> None:
    path = DIR / "lore_netdev_20190710_iproute2_rdma_stat_show_mlx5_examples.txt"
    got = by_key(parse_rdma_stat(path.read_text(), device="h", ts_ms=1, source=path.name))
    # plain and -p forms of `stat show link rocep1s0f5/1`; the `stat qp show` mlx5_2/1 record is per-QP
    assert {p for p, _ in got} == {"rocep1s0f5/1"}
    assert got[("rocep1s0f5/1", "port_cnp_sent_total")].value == 0
    assert got[("rocep1s0f5/1", "port_out_of_buffer_total")].value == 0


def test_rdma_stat_garbage() -> None:
    with pytest.raises(ParseError, match="not a non-negative integer"):
        parse_rdma_stat("link mlx5_0/1 np_cnp_sent x1\n", device="h", ts_ms=1, source="s")
    with pytest.raises(ParseError, match="no 'link DEV/PORT'"):
        parse_rdma_stat("", device="h", ts_ms=1, source="s")


def test_perfquery_switch_and_hca() -> None:
    sw = OTHER / "treydock_ib_switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt"
    got = by_key(parse_perfquery(sw.read_text(), device="ib-i1l1s01", ts_ms=1, source=sw.name))
    assert got[("lid1719/1", "port_xmit_wait_ticks_total")].value == 22730501
    assert got[("lid1719/2", "port_xmit_wait_ticks_total")].value == 36510964
    assert got[("lid1719/1", "port_tx_bytes_total")].value == 36298026860928 * 4
    hca = OTHER / "treydock_ib_hca_edr_perfquery_extended_0x7cfe9003003b4b96.txt"
    got = by_key(parse_perfquery(hca.read_text(), device="o0002", ts_ms=1, source=hca.name, node="mlx5_0"))
    assert got[("mlx5_0/1", "port_rx_packets_total")].value == 100583719365
    # CapMask2 0: the HCA lacks the additional 64-bit error counters, so none are reported
    assert ("mlx5_0/1", "port_xmit_wait_ticks_total") not in got


def test_perfquery_rcv_error_details_is_rejected() -> None:
    path = OTHER / "treydock_ib_switch_perfquery_rcv_error_details.txt"
    with pytest.raises(ParseError, match="unknown perfquery header"):
        parse_perfquery(path.read_text(), device="h", ts_ms=1, source=path.name)


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=40))
def test_sysfs_value_parser_only_raises_parse_error(text: str) -> None:
    try:
        v = parse_sysfs_value(text, "fuzz")
    except ParseError:
        return
    assert v is None or (isinstance(v, int) and v >= 0)


@settings(max_examples=150, deadline=None)
@given(st.text(max_size=200))
def test_text_parsers_only_raise_parse_error(text: str) -> None:
    for fn in (parse_hw_counters_dump, parse_rdma_stat, parse_perfquery):
        with contextlib.suppress(ParseError):
            fn(text, device="h", ts_ms=1, source="fuzz")
