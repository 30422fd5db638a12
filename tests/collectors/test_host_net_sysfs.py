"""/sys/class/net reader on this machine's real /sys and on a small derived tree."""

from __future__ import annotations

import shutil
from pathlib import Path

import pytest

from collectors.base import ParseError
from collectors.host.net_sysfs import read_net_sysfs
from service.telemetry import catalogue

ROCE = Path(__file__).resolve().parents[1] / "data" / "host" / "sysfs_roce"


def test_real_sys_of_this_machine() -> None:
    real = Path("/sys/class/net")
    if not real.is_dir():
        pytest.skip("no /sys/class/net here")
    ifaces = sorted(p.name for p in real.iterdir())
    got = read_net_sysfs(Path("/"), device="self", ts_ms=1)
    assert all(catalogue.get(s.metric) is not None for s in got)
    assert {s.port for s in got} == set(ifaces)
    lo = {s.metric: s.value for s in got if s.port == "lo"}
    if lo:
        assert lo["port_admin_up"] == 1.0 and "port_oper_up" not in lo  # operstate "unknown"
    # counters only grow: a second read is >= the first
    again = {(s.port, s.metric): s.value for s in read_net_sysfs(Path("/"), device="self", ts_ms=2)}
    for s in got:
        if s.metric.endswith("_total"):
            assert again[(s.port, s.metric)] >= s.value


def test_derived_tree() -> None:
    got = {(s.port, s.metric): s.value
           for s in read_net_sysfs(ROCE, device="h", ts_ms=1, port_names={"ens1f0np0": "rail3"})}
    assert got[("rail3", "port_rx_bytes_total")] == 262807800957497
    assert got[("rail3", "port_rx_discards_total")] == 7
    assert got[("rail3", "port_carrier_changes_total")] == 5
    assert got[("rail3", "port_speed_bits_per_second")] == 100e9
    assert got[("rail3", "port_oper_up")] == 1.0 and got[("rail3", "port_admin_up")] == 1.0
    assert got[("ens1f1np1", "port_oper_up")] == 0.0 and got[("ens1f1np1", "port_admin_up")] == 0.0
    assert ("ens1f1np1", "port_speed_bits_per_second") not in got  # speed -1: unknown


def test_interface_filter_and_missing_interface() -> None:
    got = read_net_sysfs(ROCE, device="h", ts_ms=1, interfaces=["ens1f1np1"])
    assert {s.port for s in got} == {"ens1f1np1"}
    with pytest.raises(ParseError, match="interface not found"):
        read_net_sysfs(ROCE, device="h", ts_ms=1, interfaces=["nope0"])
    warnings: list[str] = []
    assert read_net_sysfs(ROCE, device="h", ts_ms=1, interfaces=["nope0"], warnings=warnings) == []
    assert "nope0" in warnings[0]


def test_garbled_counter(tmp_path: Path) -> None:
    shutil.copytree(ROCE, tmp_path / "r")
    (tmp_path / "r/sys/class/net/ens1f0np0/statistics/rx_bytes").write_text("12 34\n")
    with pytest.raises(ParseError) as exc:
        read_net_sysfs(tmp_path / "r", device="h", ts_ms=1)
    assert exc.value.source.endswith("statistics/rx_bytes")
    warnings: list[str] = []
    got = read_net_sysfs(tmp_path / "r", device="h", ts_ms=1, warnings=warnings)
    assert ("ens1f0np0", "port_tx_bytes_total") in {(s.port, s.metric) for s in got}
    assert len(warnings) == 1


def test_no_net_class(tmp_path: Path) -> None:
    with pytest.raises(ParseError, match="no /sys/class/net"):
        read_net_sysfs(tmp_path, device="h", ts_ms=1)
