"""Exporter mappings (service/telemetry/exporters) on real captured /metrics texts, against a real inventory."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from sqlalchemy.orm import Session

from collectors.host.dcgm import parse_dcgm_exporter
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry.exporters import Mapper, Reason, match_series
from service.telemetry.promtext import parse_lines

REAL = Path(__file__).resolve().parents[1] / "data" / "real"
DCGM_VGPU = REAL / "dcgm" / "vks_grid_a100-8c_vgpu_driver580.65.06_dcgm_exporter_metrics.prom"
DCGM_MIG = REAL / "dcgm" / "cn_notes_a800-sxm4-80gb_x8_mig_driver535.129.03_dcgm_exporter_metrics_EXCERPT.prom"
DCGM_BLANK = REAL / "dcgm" / "tmax_hypercloud_dcgm-exporter1.4.6_pod_gpu_metrics_2gpu_blank_nvlink.prom"
GNMIC = REAL / "gnmic" / "clab_cluster_gnmic_prometheus_output_EXCERPT.prom"
TS = 1_796_040_000_000

INVENTORY = {"devices": [
    {"name": "gpu-a01", "kind": "host", "role": "host", "mgmt_address": "10.0.1.1", "gpus": 8,
     "ports": [{"name": "eth0", "nic": "mlx5_0"}, {"name": "eth1", "nic": "mlx5_1"}]},
    # a switch on the host's address (a lab, or an address reused): node_exporter series still go to the host
    {"name": "leaf9", "kind": "switch", "role": "leaf", "mgmt_address": "10.0.1.1", "ports": [{"name": "eth0"}]},
    {"name": "leaf1", "kind": "switch", "role": "leaf", "mgmt_address": "172.20.20.3",
     "ports": [{"name": "Ethernet1"}, {"name": "Ethernet2"}]},
    {"name": "leaf2", "kind": "switch", "role": "leaf", "mgmt_address": "172.20.20.9", "ports": []},
    {"name": "leaf3", "kind": "switch", "role": "leaf", "mgmt_address": "172.20.20.9", "ports": []},
]}


@pytest.fixture()
def inv(db: Engine) -> Iterator[Engine]:
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate(INVENTORY))
        session.commit()
    yield db


def _series(path: Path, **extra: str) -> list[tuple[dict[str, str], list[tuple[int, float]]]]:
    out = []
    for pl in parse_lines(path.read_text().splitlines(), path.name):
        labels = {**dict(pl.labels), **extra, "__name__": pl.name}
        out.append((labels, [(pl.ts_ms or TS, pl.value)]))
    return out


def _map(db: Engine, series: list, mapper: Mapper | None = None):
    with db.connect() as conn:
        return (mapper or Mapper()).map(conn, series)


@pytest.mark.parametrize("capture", [DCGM_VGPU, DCGM_MIG], ids=["vgpu", "mig"])
def test_dcgm_capture_maps_as_the_host_agent_parses_it(inv: Engine, capture: Path) -> None:
    """Remote write and the host agent give the same GPU samples from one dcgm-exporter text."""
    res = _map(inv, _series(capture, instance="10.0.1.1:9400"))
    agent = parse_dcgm_exporter(capture.read_text(), device="gpu-a01", ts_ms=TS, source=capture.name)
    got = sorted((s.metric, s.device, s.gpu, s.value) for s in res.samples)
    assert got == sorted((s.metric, s.device, s.gpu, s.value) for s in agent)
    assert got, "the capture has GPU fields the catalogue takes"
    # everything else in the text (clocks, memory, utilisation, bandwidth) is counted, never stored
    assert res.unmapped[Reason.UNMAPPED_METRIC] == res.received - res.mapped_series
    assert "DCGM_FI_DEV_FB_FREE" in res.details[Reason.UNMAPPED_METRIC]


def test_dcgm_blank_values_are_no_reading(inv: Engine) -> None:
    """dcgm-exporter 1.4.6 prints DCGM's NOT_SUPPORTED blank (9223372036854775794) for NVLink counters."""
    res = _map(inv, _series(DCGM_BLANK, instance="10.0.1.1:9400"))
    got = {(s.metric, s.gpu): s.value for s in res.samples}
    assert got == {("gpu_temperature_celsius", 0): 36.0, ("gpu_temperature_celsius", 1): 31.0,
                   ("gpu_last_xid", 0): 0.0, ("gpu_last_xid", 1): 0.0}
    # CRC flit + data, replay, recovery: 4 fields x 2 GPUs, all blank
    assert res.unmapped[Reason.BLANK_VALUE] == 8
    assert res.details[Reason.BLANK_VALUE]["DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"] == 2


def test_gnmic_capture_is_claimed_and_its_counters_reported(inv: Engine) -> None:
    """Real gnmic output: broadcast/multicast packet leaves have no catalogue metric; counted by name."""
    res = _map(inv, _series(GNMIC, instance="gnmic1:9804"))
    assert res.samples == []
    assert dict(res.details[Reason.UNMAPPED_METRIC]) == {
        "interfaces_interface_state_counters_in_broadcast_pkts": 1,
        "interfaces_interface_state_counters_in_multicast_pkts": 1}
    # the same output's in-octets leaf, named as gnmic names it (prefix and all), lands on the switch named
    # by `source` (gnmic's own instance is not the switch)
    name = "gnmic_sub1_interfaces_interface_state_counters_in_octets"
    res = _map(inv, [({"__name__": name, "interface_name": "Ethernet1", "source": "172.20.20.3:6030",
                       "subscription_name": "sub1", "instance": "10.0.1.1:9804"}, [(TS, 1234.0)])])
    assert [(s.metric, s.device, s.port, s.value) for s in res.samples] == [
        ("port_rx_bytes_total", "leaf1", "Ethernet1", 1234.0)]


def test_identity_resolution_and_reasons(inv: Engine) -> None:
    def one(labels: dict[str, str], value: float = 1.0) -> tuple:
        res = _map(inv, [(labels, [(TS, value)])])
        if res.samples:
            s = res.samples[0]
            return ("ok", s.metric, s.device, s.port, s.lane, s.priority, s.gpu, s.value)
        (reason, details), = res.details.items()
        return (reason, *details)

    # node_exporter on 10.0.1.1: the host, not the switch on the same address
    assert one({"__name__": "node_network_receive_bytes_total", "device": "eth1", "instance": "10.0.1.1:9100"},
               5) == ("ok", "port_rx_bytes_total", "gpu-a01", "eth1", None, None, None, 5.0)
    # RDMA device -> the port whose nic it is
    assert one({"__name__": "node_infiniband_port_transmit_wait_total", "device": "mlx5_1", "port": "1",
                "instance": "gpu-a01:9100"})[:4] == ("ok", "port_xmit_wait_ticks_total", "gpu-a01", "eth1")
    # ethtool names recovered from node_exporter's spelling; pause durations µs -> s, priorities kept
    assert one({"__name__": "node_ethtool_received_prio3_pause_duration", "device": "eth0",
                "instance": "10.0.1.1:9100"}, 2_000_000) == (
        "ok", "port_pfc_rx_pause_seconds_total", "gpu-a01", "eth0", None, 3, None, 2.0)
    # speed: bytes/s -> bits/s; node_exporter's -125000 ("unknown") is no reading
    assert one({"__name__": "node_network_speed_bytes", "device": "eth0", "instance": "10.0.1.1:9100"},
               50e9)[-1] == 400e9
    assert one({"__name__": "node_network_speed_bytes", "device": "eth0", "instance": "10.0.1.1:9100"},
               -125000)[0] == Reason.BLANK_VALUE
    # SNMP: ifName names the port, ifOperStatus down(2) -> 0, ifHighSpeed Mb/s -> b/s
    assert one({"__name__": "ifOperStatus", "ifName": "Ethernet2", "ifIndex": "2", "instance": "172.20.20.3"},
               2) == ("ok", "port_oper_up", "leaf1", "Ethernet2", None, None, None, 0.0)
    assert one({"__name__": "ifHighSpeed", "ifName": "Ethernet1", "instance": "leaf1"}, 400000)[-1] == 400e9
    # what is not resolvable, per reason
    assert one({"__name__": "node_network_up", "device": "eth9", "instance": "10.0.1.1:9100"}) == (
        Reason.UNKNOWN_PORT, "gpu-a01:eth9")
    assert one({"__name__": "node_network_up", "device": "eth0", "instance": "10.9.9.9:9100"}) == (
        Reason.UNKNOWN_INSTANCE, "10.9.9.9:9100")
    assert one({"__name__": "ifInErrors", "ifName": "Ethernet1", "instance": "172.20.20.9"})[:2] == (
        Reason.AMBIGUOUS_INSTANCE, "172.20.20.9 (leaf2, leaf3)")
    assert one({"__name__": "node_cpu_seconds_total", "cpu": "0", "instance": "10.0.1.1:9100"}) == (
        Reason.UNMAPPED_METRIC, "node_cpu_seconds_total")
    assert one({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "x", "instance": "10.0.1.1:9400"})[0] == Reason.BAD_LABEL
    assert one({"__name__": "node_network_up", "device": "eth0", "instance": "10.0.1.1:9100"},
               float("nan"))[0] == Reason.NOT_FINITE
    # catalogue names pass through as the text import takes them
    assert one({"__name__": "optic_rx_power_dbm", "device": "gpu-a01", "port": "eth0", "lane": "2"}, -3.5) == (
        "ok", "optic_rx_power_dbm", "gpu-a01", "eth0", 2, None, None, -3.5)


def test_ranks_and_sums_hold_across_batches(inv: Engine) -> None:
    """A remote-write request may carry part of a scrape: the better source and whole sums win across requests."""
    mapper = Mapper()
    inst = {"instance": "10.0.1.1:9100", "device": "eth0"}
    phy = ({"__name__": "node_ethtool_received_bytes_phy", **inst}, [(TS, 900.0)])
    sw = ({"__name__": "node_network_receive_bytes_total", **inst}, [(TS, 100.0)])
    res = _map(inv, [phy, sw], mapper)
    assert [(s.metric, s.value) for s in res.samples] == [("port_rx_bytes_total", 900.0)]
    assert res.unmapped[Reason.SUPERSEDED] == 1
    # the next request has only the kernel's counter: still superseded, not stored as a fake drop
    res = _map(inv, [({"__name__": "node_network_receive_bytes_total", **inst}, [(TS + 10_000, 110.0)])], mapper)
    assert res.samples == [] and res.unmapped[Reason.SUPERSEDED] == 1

    gpu = {"instance": "10.0.1.1:9400", "gpu": "3"}
    flit = "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL"
    data = "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL"
    res = _map(inv, [({"__name__": flit, **gpu}, [(TS, 5.0)]), ({"__name__": data, **gpu}, [(TS, 7.0)])], mapper)
    assert [(s.metric, s.gpu, s.value) for s in res.samples] == [("gpu_nvlink_crc_errors_total", 3, 12.0)]
    res = _map(inv, [({"__name__": flit, **gpu}, [(TS + 10_000, 6.0)])], mapper)
    assert res.samples == [] and res.unmapped[Reason.INCOMPLETE_SUM] == 1


def test_every_mapping_names_catalogue_metrics() -> None:
    from service.telemetry import catalogue
    from service.telemetry.exporters import dcgm_exporter, gnmic, node_exporter, snmp_exporter

    names = ([m for m, _r, _s in node_exporter._NETWORK.values()]
             + [m for m, _b, _s in node_exporter._INFINIBAND.values()]
             + [m for m, _c in dcgm_exporter.FIELDS.values()] + [v[0] for v in snmp_exporter.IF_MIB.values()]
             + [r.metric for _p, r in gnmic._TAILS.values()])
    assert names and all(catalogue.get(n) is not None for n in names)
    assert match_series({"__name__": "up", "instance": "x"})[0] == ""


def _node_exporter_name(stat: str) -> str:
    """node_exporter's name for an `ethtool -S` counter (collector/ethtool_linux.go): non-alphanumerics as
    `_`, lowered, leading `_` dropped, `rx`/`tx` words spelt out; seven pre-declared ones end in `_total`."""
    import re

    predeclared = {"rx_bytes": "received_bytes_total", "rx_dropped": "received_dropped_total",
                   "rx_errors": "received_errors_total", "rx_packets": "received_packets_total",
                   "tx_bytes": "transmitted_bytes_total", "tx_errors": "transmitted_errors_total",
                   "tx_packets": "transmitted_packets_total"}
    if stat in predeclared:
        return "node_ethtool_" + predeclared[stat]
    name = re.sub(r"_*[^0-9A-Za-z_]+_*", "_", stat).lower().lstrip("_")
    name = re.sub(r"(^|_)rx(_|$)", r"\1received\2", name)
    name = re.sub(r"(^|_)tx(_|$)", r"\1transmitted\2", name)
    return "node_ethtool_" + name


@pytest.mark.parametrize("capture", ["cn_notes_mlx5_100G_fec_lane_errors_ethtool_S_COMMENTS_STRIPPED.txt",
                                     "lore_bpf_20240619_mlx5_kernel5.15_xdp_nonzero_ethtool_S.txt",
                                     "showmax_i40e_fw8.60_rhel8_sfp10gsr_ethtool_S.txt", "ethq_ice_ethtool_S.txt",
                                     "cn_notes_ixgbe_ethtool_S_EXCERPT_queue_lines_left_out.txt",
                                     "mlxsw_spectrum_swp31_per_prio_pause_ethtool_S.txt"])
def test_node_exporter_ethtool_maps_as_the_host_agent_parses(inv: Engine, capture: str) -> None:
    """A real `ethtool -S` capture as node_exporter's ethtool collector would name it maps to what the host
    agent's own parser makes of the capture: same metrics, priorities, lanes, units (pause µs -> s)."""
    from collectors.host.ethtool_stats import iter_counters, parse_ethtool_stats

    text_ = (REAL / "ethtool_stats" / capture).read_text()
    series, names = [], set()
    for _line, stat, value, queue in iter_counters(text_, capture):
        name = _node_exporter_name(stat)
        if queue is None and name not in names:  # per-queue `[N]:` lines have no node_exporter name
            names.add(name)
            series.append(({"__name__": name, "device": "eth0", "instance": "10.0.1.1:9100"}, [(TS, float(value))]))
    res = _map(inv, series)
    agent = parse_ethtool_stats(text_, device="gpu-a01", port="eth0", ts_ms=TS, source=capture)
    key = lambda s: (s.metric, s.priority, s.lane)  # noqa: E731
    assert {key(s): s.value for s in res.samples} == pytest.approx({key(s): s.value for s in agent})
    assert len(agent) >= 8


@pytest.mark.parametrize("tree", ["procfs_fixtures_infiniband_tree", "node_exporter_fixtures_infiniband_tree"])
def test_real_node_exporter_infiniband_maps_as_the_host_agent_reads_sysfs(db: Engine, tree: str) -> None:
    """The real node_exporter reads a real sysfs tree (prometheus/procfs and node_exporter fixtures: mlx5, mlx4,
    hfi1, i40iw); its node_infiniband_* map onto the ports whose `nic` they name, with the values the host
    agent reads from the same tree (bytes from 4-octet words, the saturated 32-bit PortXmitWait)."""
    import shutil
    import subprocess
    import time

    import httpx

    from collectors.host.rdma_sysfs import read_rdma_sysfs
    from tests.live_api import free_tcp_port

    root = REAL / "rdma_sysfs" / tree
    ports = sorted({f"{d.name}/{p.name}" for d in (root / "sys/class/infiniband").iterdir()
                    for p in (d / "ports").iterdir()})
    inventory = {"devices": [{"name": "ib-host", "kind": "host", "role": "host", "mgmt_address": "10.0.3.1",
                              "ports": [{"name": f"ib{i}", "nic": nic} for i, nic in enumerate(ports)]}]}
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate(inventory))
        session.commit()
    exe = shutil.which("prometheus-node-exporter")
    assert exe, "install the Debian package prometheus-node-exporter"
    port = free_tcp_port()
    proc = subprocess.Popen([exe, f"--web.listen-address=127.0.0.1:{port}", "--collector.disable-defaults",
                             "--collector.infiniband", f"--path.sysfs={root / 'sys'}"],
                            stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL)
    try:
        for _ in range(100):
            try:
                text_ = httpx.get(f"http://127.0.0.1:{port}/metrics", timeout=2).text
                break
            except httpx.HTTPError:
                time.sleep(0.1)
    finally:
        proc.terminate()
        proc.wait(10)
    series = [({**dict(pl.labels), "__name__": pl.name, "instance": "10.0.3.1:9100"}, [(TS, pl.value)])
              for pl in parse_lines(text_.splitlines(), "node_exporter") if pl.name.startswith("node_infiniband_")]
    res = _map(db, series)
    by_nic = {f"ib{i}": nic for i, nic in enumerate(ports)}
    got = {(by_nic[s.port], s.metric): s.value for s in res.samples}
    agent = {(s.port, s.metric): s.value for s in read_rdma_sysfs(root, device="ib-host", ts_ms=TS)}
    assert len(got) >= (30 if tree.startswith("procfs") else 12)
    assert got == {k: agent[k] for k in got}
    assert res.unmapped.get(Reason.UNKNOWN_PORT, 0) == 0 and res.unmapped.get(Reason.UNKNOWN_INSTANCE, 0) == 0
    if tree.startswith("node_exporter"):
        assert got[("mlx4_0/1", "port_xmit_wait_ticks_total")] == 4294967295.0  # saturated, kept as read
