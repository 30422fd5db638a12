"""Host-side collectors for GPU hosts: ethtool, RDMA and net sysfs, DCGM and NVML.

Importing this package registers the `host` collector (see `agent.collect_host`).
"""

from collectors.host.agent import PushError, collect_host, push_samples, run_command
from collectors.host.dcgm import parse_dcgm_exporter, parse_dcgmi_dmon, scrape_dcgm
from collectors.host.ethtool_module import ModuleReading, parse_ethtool_module
from collectors.host.ethtool_stats import parse_ethtool_stats
from collectors.host.net_sysfs import read_net_sysfs
from collectors.host.nvml import collect_nvml
from collectors.host.rdma_sysfs import (
    discover_port_names,
    parse_hw_counters_dump,
    parse_perfquery,
    parse_rdma_stat,
    read_rdma_sysfs,
)

__all__ = [
    "ModuleReading",
    "PushError",
    "collect_host",
    "collect_nvml",
    "discover_port_names",
    "parse_dcgm_exporter",
    "parse_dcgmi_dmon",
    "parse_ethtool_module",
    "parse_ethtool_stats",
    "parse_hw_counters_dump",
    "parse_perfquery",
    "parse_rdma_stat",
    "push_samples",
    "read_net_sysfs",
    "read_rdma_sysfs",
    "run_command",
    "scrape_dcgm",
]
