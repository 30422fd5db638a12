"""The host collector end to end on fixture text and trees; failure isolation; pushing samples."""

from __future__ import annotations

import shutil
import subprocess
from pathlib import Path

import httpx
import pytest

from collectors.base import CollectError, Target, get_collector
from collectors.host import agent
from collectors.host.agent import PushError, collect_host, push_samples, run_command
from service.telemetry import catalogue
from service.telemetry.promtext import parse_text
from service.telemetry.samples import Sample
from tests.paths import FIXTURES

DATA = Path(__file__).resolve().parents[1] / "data" / "host"
ROCE = DATA / "sysfs_roce"

OUTPUTS = {
    ("ethtool", "-S", "ens1f0np0"): (DATA / "mlx5_100G_with_prio3_pause_ethtool_S.txt").read_text(),
    ("ethtool", "-m", "ens1f0np0"): (FIXTURES / "ethtool_module" /
                                     "lore_netdev_20241015_cmis_qsfpdd_arista_QDD-400G-XDR4_ethtool_m.txt").read_text(),
    ("ethtool", "-m", "ens1f1np1"): (FIXTURES / "ethtool_module" /
                                     "showmax_bnxt_en_sfp_FS_SFP-10GSR-85_garbled_dom_ethtool_m.txt").read_text(),
}


def fixture_runner(cmd: list[str], timeout_s: float) -> str:
    if tuple(cmd) == ("ethtool", "-S", "ens1f1np1"):
        raise subprocess.TimeoutExpired(cmd, timeout_s)
    return OUTPUTS[tuple(cmd)]


def target(**params: object) -> Target:
    return Target(name="gpu1-host", device="gpu1", protocol="host", timeout_s=2.0, params=params)


def index(samples: list[Sample]) -> dict[tuple, float]:
    assert all(catalogue.get(s.metric) is not None for s in samples)
    keys = [(s.metric, s.port, s.lane, s.priority, s.gpu) for s in samples]
    assert len(keys) == len(set(keys)), "one sample per series"
    return {(s.metric, s.port, s.lane, s.priority): s.value for s in samples}


def test_registered() -> None:
    assert get_collector("host") is collect_host


def test_all_sources_with_one_timeout_and_one_bad_module() -> None:
    res = collect_host(target(interfaces=["ens1f0np0", "ens1f1np1"]), now_ms=1_700_000_000_000,
                       run=fixture_runner, sysfs_root=ROCE)
    assert res.ok, res.error
    got = index(res.samples)
    # ethtool -S (physical port) wins over net sysfs and RDMA for the same series
    assert got[("port_rx_bytes_total", "ens1f0np0", None, None)] == 2027206797
    assert got[("port_pfc_rx_pause_frames_total", "ens1f0np0", None, 3)] == 123456
    # ethtool -m: CMIS lane 0 Rx 2.2489 mW
    assert got[("optic_rx_power_dbm", "ens1f0np0", 0, None)] == pytest.approx(3.5197, abs=1e-4)
    # RDMA hw_counters land on the netdev's port via gid_attrs discovery
    assert got[("port_cnp_sent_total", "ens1f0np0", None, None)] == 1052612505
    assert got[("port_xmit_wait_ticks_total", "ens1f0np0", None, None)] == 4294967295
    # net sysfs fills what only it has
    assert got[("port_carrier_changes_total", "ens1f0np0", None, None)] == 5
    assert got[("port_oper_up", "ens1f1np1", None, None)] == 0.0
    # the timed-out interface still has its net sysfs view, and the failures are named
    assert got[("port_rx_bytes_total", "ens1f1np1", None, None)] == 0
    assert any(w.startswith("ethtool -S ens1f1np1: timed out after 2 s") for w in res.warnings)
    assert any(w.startswith("ethtool -m ens1f1np1:") and "implausible DOM" in w for w in res.warnings)
    assert all(s.ts_ms == 1_700_000_000_000 and s.device == "gpu1" for s in res.samples)


RDMA_STAT = (FIXTURES / "rdma_sysfs" / "cn_notes_mlx5_rdma_statistic_show_4links_nonzero_cqe_errors.txt").read_text()
MLX5_OOB = (FIXTURES / "ethtool_stats" / "lore_bpf_20240619_mlx5_kernel5.15_xdp_nonzero_ethtool_S.txt").read_text()


def test_rdma_statistic_is_an_optional_source(tmp_path: Path) -> None:
    """A containerised agent without /sys/class/infiniband still gets the RoCE loss and CQE errors."""
    calls: list[list[str]] = []

    def runner(cmd: list[str], timeout_s: float) -> str:
        calls.append(cmd)
        if cmd == ["/opt/mellanox/iproute2/sbin/rdma", "statistic", "show"]:
            return RDMA_STAT
        raise FileNotFoundError(cmd[0])

    res = collect_host(target(rdma_statistic=True, rdma="/opt/mellanox/iproute2/sbin/rdma",
                              port_names={"mlx5_0/1": "eth01"}), now_ms=1, run=runner, sysfs_root=tmp_path)
    assert res.ok, res.error
    got = index(res.samples)
    assert got[("port_responder_cqe_errors_total", "eth01", None, None)] == 1009
    assert got[("port_requester_cqe_flush_errors_total", "eth01", None, None)] == 11
    assert got[("port_out_of_buffer_total", "eth01", None, None)] == 135
    assert got[("port_icrc_errors_total", "mlx5_3/1", None, None)] == 0  # unmapped links keep DEV/PORT
    # without the param the command is never run
    calls.clear()
    collect_host(target(), now_ms=1, run=runner, sysfs_root=tmp_path)
    assert not any(c[-2:] == ["statistic", "show"] for c in calls)


def test_rdma_statistic_missing_tool_is_a_warning(tmp_path: Path) -> None:
    def runner(cmd: list[str], timeout_s: float) -> str:
        raise FileNotFoundError(2, "No such file or directory", cmd[0])

    res = collect_host(target(interfaces=["lo"], rdma_statistic=True), now_ms=1, run=runner, sysfs_root=ROCE)
    assert res.ok
    assert "rdma statistic: not found: rdma" in res.warnings


def test_out_of_buffer_adds_the_netdev_and_rdma_halves_once(tmp_path: Path) -> None:
    """mlx5 counts receive-buffer drops of the netdev queues and of the RDMA QPs apart: one port, their sum."""
    roce = tmp_path / "r"
    shutil.copytree(ROCE, roce)
    (roce / "sys/class/infiniband/mlx5_0/ports/1/hw_counters/out_of_buffer").write_text("135\n")

    def runner(cmd: list[str], timeout_s: float) -> str:
        if cmd[1] == "-S":
            return MLX5_OOB  # rx_out_of_buffer: 990473555
        if cmd[1] == "statistic":
            return RDMA_STAT  # its mlx5_0/1 is the sysfs tree's mlx5_0/1, named ens1f0np0 by gid_attrs
        raise subprocess.TimeoutExpired(cmd, timeout_s)

    res = collect_host(target(interfaces=["ens1f0np0"], rdma_statistic=True), now_ms=1, run=runner, sysfs_root=roce)
    oob = [s for s in res.samples if s.metric == "port_out_of_buffer_total" and s.port == "ens1f0np0"]
    assert len(oob) == 1
    # netdev 990473555 + RDMA QPs 135; `rdma statistic` repeats the sysfs 135 and is not added again
    assert oob[0].value == 990473555 + 135 and oob[0].counter_bits is None
    # other series keep the first source's value and width
    cqe = [s for s in res.samples if s.metric == "port_responder_cqe_errors_total" and s.port == "ens1f0np0"]
    assert [(s.value, s.counter_bits) for s in cqe] == [(3293504, 32)]  # sysfs (show_counters values)


def test_sysfs_root_may_be_the_sysfs_mount_or_a_root_holding_sys() -> None:
    """`sysfs_root: /sys` (the mount, as the example inventory says) and `/` (a root with sys/) read the same."""
    tgt = target(interfaces=["ens1f0np0", "ens1f1np1"], sysfs_root=str(ROCE / "sys"))
    as_mount = collect_host(tgt, now_ms=1_700_000_000_000, run=fixture_runner)
    as_root = collect_host(target(interfaces=["ens1f0np0", "ens1f1np1"]), now_ms=1_700_000_000_000,
                           run=fixture_runner, sysfs_root=ROCE)
    assert as_mount.ok, as_mount.error
    got = index(as_mount.samples)
    assert got[("port_cnp_sent_total", "ens1f0np0", None, None)] == 1052612505  # RDMA hw_counters
    assert got[("port_carrier_changes_total", "ens1f0np0", None, None)] == 5  # net sysfs
    assert got == index(as_root.samples)


def test_garbled_command_output_is_a_warning_naming_source_and_line() -> None:
    def runner(cmd: list[str], timeout_s: float) -> str:
        return "NIC statistics:\n     rx_bytes: 1\n     tx_bytes: ??\n" if cmd[1] == "-S" else "Identifier"

    res = collect_host(target(interfaces=["eth7"]), now_ms=1, run=runner, sysfs_root=ROCE)
    assert res.ok  # net sysfs still answered
    assert "ethtool -S eth7:3: counter 'tx_bytes' has non-integer value '??'" in res.warnings
    assert any(w.startswith("ethtool -m eth7:") for w in res.warnings)
    assert any("net sysfs" in w and "eth7" in w for w in res.warnings)


def test_every_source_failing_is_an_error(tmp_path: Path) -> None:
    def runner(cmd: list[str], timeout_s: float) -> str:
        raise subprocess.TimeoutExpired(cmd, timeout_s)

    res = collect_host(target(interfaces=["eth0"]), now_ms=1, run=runner, sysfs_root=tmp_path)
    assert not res.ok and res.samples == []
    assert res.error.startswith("all 3 host sources failed:")
    assert "ethtool -S eth0: timed out after 2 s" in res.error and "no /sys/class/net" in res.error


def test_poll_budget_exhausted_is_a_clear_status() -> None:
    res = collect_host(target(interfaces=["ens1f0np0"], budget_s=0), now_ms=1, run=fixture_runner,
                       sysfs_root=ROCE)
    assert not res.ok and "used up its 0 s budget" in res.error


def test_dcgm_and_nvml_sources(monkeypatch: pytest.MonkeyPatch) -> None:
    def fake_scrape(url: str, **kw: object) -> list[Sample]:
        raise CollectError(f"dcgm-exporter {url}: no answer within 2 s")

    def fake_nvml(**kw: object) -> list[Sample]:
        return [Sample("gpu_temperature_celsius", 40.0, 1, "gpu1", gpu=0)]

    monkeypatch.setattr(agent, "scrape_dcgm", fake_scrape)
    monkeypatch.setattr(agent, "collect_nvml", fake_nvml)
    res = collect_host(target(dcgm_url="http://localhost:9400", nvml=True), now_ms=1, run=fixture_runner,
                       sysfs_root=ROCE)
    assert res.ok and ("gpu_temperature_celsius", None, None, None) in index(res.samples)
    assert "dcgm http://localhost:9400: dcgm-exporter http://localhost:9400: no answer within 2 s" in res.warnings


def test_real_machine_default_runner() -> None:
    """On this machine: real subprocess runner and real /sys (ethtool may be absent or refuse lo)."""
    res = collect_host(target(interfaces=["lo"]), now_ms=1)
    assert res.ok
    assert ("port_rx_bytes_total", "lo", None, None) in index(res.samples)


def test_run_command() -> None:
    assert run_command(["sh", "-c", "echo hi"], 5) == "hi\n"
    with pytest.raises(CollectError, match="exit status 3: boom"):
        run_command(["sh", "-c", "echo boom >&2; exit 3"], 5)
    with pytest.raises(subprocess.TimeoutExpired):
        run_command(["sleep", "5"], 0.2)


SAMPLES = [Sample("port_rx_bytes_total", 10.0, 1000, "gpu1", port="eth0"),
           Sample("optic_rx_power_dbm", -3.5, 1000, "gpu1", port="eth0", lane=2)]


def test_push_retries_then_succeeds() -> None:
    calls: list[httpx.Request] = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(503 if len(calls) < 3 else 204)

    n = push_samples(SAMPLES, "http://fw:8000/", token="t0k", backoff_s=0, transport=httpx.MockTransport(handler))
    assert n == 2 and len(calls) == 3
    req = calls[-1]
    assert req.url.path == "/api/v1/import/prometheus" and req.headers["authorization"] == "Bearer t0k"
    lines = parse_text(req.content.decode())
    assert [(p.name, dict(p.labels).get("lane"), p.value, p.ts_ms) for p in lines] == [
        ("port_rx_bytes_total", None, 10.0, 1000), ("optic_rx_power_dbm", "2", -3.5, 1000)]


def test_push_client_error_is_not_retried() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        return httpx.Response(400, text="bad line 1")

    with pytest.raises(PushError, match="HTTP 400: bad line 1"):
        push_samples(SAMPLES, "http://fw:8000", backoff_s=0, transport=httpx.MockTransport(handler))
    assert len(calls) == 1


def test_push_gives_up_on_connection_errors() -> None:
    calls = []

    def handler(request: httpx.Request) -> httpx.Response:
        calls.append(request)
        raise httpx.ConnectError("refused", request=request)

    with pytest.raises(PushError, match="gave up after 3 attempts"):
        push_samples(SAMPLES, "http://fw:8000", attempts=3, backoff_s=0, transport=httpx.MockTransport(handler))
    assert len(calls) == 3
