"""Every host-side file in fixtures/real/other/ is accounted for: parsed, rejected, or not an input.

Parsed or rejected ones are asserted in the parser tests named here. Files that are not host
telemetry inputs are listed with the reason, and fed to the nearest parser to show that a
misrouted output gets a clear ParseError instead of bogus samples.
"""

from __future__ import annotations

import pytest

from collectors.base import ParseError
from collectors.host.ethtool_module import parse_ethtool_module
from collectors.host.ethtool_stats import parse_ethtool_stats
from collectors.host.rdma_sysfs import parse_perfquery
from tests.paths import FIXTURES

OTHER = FIXTURES / "other"

TESTED_ELSEWHERE = {
    "treydock_ib_switch_edr_perfquery_extended_0x7cfe9003009ce5b0.txt": "parsed: test_host_rdma_sysfs",
    "treydock_ib_hca_edr_perfquery_extended_0x7cfe9003003b4b96.txt": "parsed: test_host_rdma_sysfs",
    "treydock_ib_switch_perfquery_rcv_error_details.txt":
        "rejected (PortRcvErrorDetails has no canonical metric): test_host_rdma_sysfs",
    "opae_docs_qsfpinfo_qsfp28_100G-SR4_finisar_FTLC9551REPM_PARTIAL.txt":
        "rejected as truncated ('...'), body parses as SFF-8636: test_host_ethtool_module",
    "node_exporter_e2e_output_infiniband_lines.prom":
        "oracle for the sysfs reader (node_exporter's output from the same tree): test_host_rdma_sysfs",
}
# name -> (reason it is not a host telemetry input, parser a misrouted copy would hit)
NOT_INPUTS = {
    "showmax_bnxt_en_ethtool_i.txt": ("`ethtool -i`: driver/firmware identity, no counters", parse_ethtool_stats),
    "showmax_i40e_ethtool_i.txt": ("`ethtool -i`: driver/firmware identity, no counters", parse_ethtool_stats),
    "showmax_ixgbe_ethtool_i.txt": ("`ethtool -i`: driver/firmware identity, no counters", parse_ethtool_stats),
    "showmax_bnxt_en_ethtool_settings.txt": (
        "`ethtool IF`: speed and link state; we read them from /sys/class/net (speed, operstate)",
        parse_ethtool_stats),
    "treydock_ibnetdiscover_ports_edr.txt": ("`ibnetdiscover -p`: topology for the inventory, not counters",
                                             parse_perfquery),
    "treydock_ibswinfo_switchib_MSB7790.txt": ("unmanaged IB switch PSU/fan/temperature: switch side",
                                               parse_ethtool_module),
    "sonic_issue9430_z9332_th3_show_pfcwd_stats_pfc_counters_PARTIAL.txt": (
        "SONiC switch CLI (pfcwd, PFC counters): switch side, not a host source", parse_ethtool_stats),
    "procfs_fixtures_mlx5_ecn_sysfs_tree": ("mlx5 DCQCN configuration (enable flags, rates), not counters", None),
}


def test_every_file_is_classified() -> None:
    assert sorted(p.name for p in OTHER.iterdir()) == sorted(set(TESTED_ELSEWHERE) | set(NOT_INPUTS))


@pytest.mark.parametrize("name", sorted(n for n, (_r, fn) in NOT_INPUTS.items() if fn is not None))
def test_misrouted_non_input_is_rejected_clearly(name: str) -> None:
    _reason, parser = NOT_INPUTS[name]
    text = (OTHER / name).read_text()
    kwargs = {"device": "h", "ts_ms": 1, "source": name}
    if parser is not parse_perfquery:
        kwargs["port"] = "p"
    with pytest.raises(ParseError) as exc:
        parser(text, **kwargs)
    assert exc.value.source == name and exc.value.reason
