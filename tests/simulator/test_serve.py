"""The live fabric answers the REAL collectors: SNMP, gNMI and host polls against simulator/serve.py.

Nothing is mocked: pysnmp agents on UDP ports, grpcio gNMI targets, sysfs and ethtool files,
and the collectors that production runs. Most tests step the fabric by hand (tick_s=None)
so every poll can be compared with the exact step it sees.
"""

from __future__ import annotations

import json
import math
import os
import signal
import socket
import subprocess
import sys
import threading
import time
from collections.abc import Iterator
from pathlib import Path

import pytest

from collectors.base import Neighbor, Target
from collectors.gnmi import collect_gnmi
from collectors.host import collect_host, run_command
from collectors.snmp import collect_snmp
from service.inventory.secrets import target_for
from service.telemetry.samples import Sample
from simulator.live_host import ethtool_runner
from simulator.serve import COMMUNITY_ENV, LiveFabric, serve_fabric
from simulator.topology import read_inventory
from tests.paths import REPO
from tests.snmp_peers import _udp_bound

T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z
LEAF, PORT, LANE = "leaf-p1-r0-01", "Ethernet1/1", 2
SCENARIO = f"""
name: live-dirty-connector
seed: 5
topology: {{shape: rail-optimized, hosts: 4, gpus_per_host: 2, nics_per_host: 2, hosts_per_leaf: 4, spines: 2,
           host_speed_gbps: 400, fabric_speed_gbps: 400, optics_mix: {{400G-DR4: 1}}}}
faults:
  - {{id: s1, type: dirty_connector, device: {LEAF}, port: {PORT}, lanes: [{LANE}], drop_db: 4, at: 10m}}
"""


def _scenario(tmp: Path) -> Path:
    f = tmp / "live.yaml"
    f.write_text(SCENARIO)
    return f


@pytest.fixture(scope="module")
def live(tmp_path_factory: pytest.TempPathFactory) -> Iterator[LiveFabric]:
    base = tmp_path_factory.mktemp("live")
    with serve_fabric(_scenario(base), start=T0, base_dir=base, tick_s=None) as fab:
        yield fab


def snmp_target(fab: LiveFabric, device: str) -> Target:
    return Target(name=f"{device}/snmp", device=device, protocol="snmp", port=fab.snmp_ports[device],
                  secrets={"community": fab.community}, timeout_s=2, retries=1)


def gnmi_target(fab: LiveFabric, device: str) -> Target:
    return Target(name=f"{device}/gnmi", device=device, protocol="gnmi", port=fab.gnmi_ports[device],
                  params={"tls": False}, timeout_s=3)


def pick(samples: list[Sample], metric: str, port: str, lane: int | None = None) -> float:
    hits = [s.value for s in samples if s.metric == metric and s.port == port and s.lane == lane]
    assert len(hits) == 1, (metric, port, lane, hits)
    return hits[0]


def mw(dbm: float) -> float:
    return 10 ** (dbm / 10)


def test_snmp_counters_rise_and_dom_equals_the_model(live: LiveFabric) -> None:
    r1 = collect_snmp(snmp_target(live, LEAF), now_ms=1)
    assert r1.ok and not r1.warnings, (r1.error, r1.warnings)
    v1 = live.view(LEAF, PORT)
    assert pick(r1.samples, "port_rx_bytes_total", PORT) == v1.values["port_rx_bytes_total"]
    live.advance(60)
    r2 = collect_snmp(snmp_target(live, LEAF), now_ms=2)
    v2 = live.view(LEAF, PORT)
    rx2 = pick(r2.samples, "port_rx_bytes_total", PORT)
    assert rx2 == v2.values["port_rx_bytes_total"] > pick(r1.samples, "port_rx_bytes_total", PORT)
    assert pick(r2.samples, "port_oper_up", PORT) == 1.0
    assert pick(r2.samples, "port_speed_bits_per_second", PORT) == 400e9
    for lane, dbm in v2.lanes["optic_rx_power_dbm"].items():
        # ENTITY-SENSOR carries mW with 4 decimals (Arista: scale milli, precision 4)
        assert abs(mw(pick(r2.samples, "optic_rx_power_dbm", PORT, lane)) - mw(dbm)) <= 0.5e-4 + 1e-9
    bias = v2.lanes["optic_tx_bias_amperes"][0]
    assert pick(r2.samples, "optic_tx_bias_amperes", PORT, 0) == pytest.approx(bias, abs=0.5e-5)
    assert pick(r2.samples, "optic_temperature_celsius", PORT) == pytest.approx(
        v2.values["optic_temperature_celsius"], abs=0.05)


def test_gnmi_serves_the_same_port(live: LiveFabric) -> None:
    snmp = collect_snmp(snmp_target(live, LEAF), now_ms=1)
    r = collect_gnmi(gnmi_target(live, LEAF), now_ms=1)
    assert r.ok and not r.warnings, (r.error, r.warnings)
    v = live.view(LEAF, PORT)
    for metric in ("port_rx_bytes_total", "port_tx_bytes_total", "port_rx_packets_total"):
        assert pick(r.samples, metric, PORT) == v.values[metric] == pick(snmp.samples, metric, PORT)
    for lane, dbm in v.lanes["optic_rx_power_dbm"].items():
        assert pick(r.samples, "optic_rx_power_dbm", PORT, lane) == pytest.approx(dbm, abs=1e-9)
    assert pick(r.samples, "port_oper_up", PORT) == 1.0
    assert pick(r.samples, "port_speed_bits_per_second", PORT) == 400e9


def test_host_collector_reads_the_trees_and_the_ethtool_shim(live: LiveFabric) -> None:
    host = live.hosts[0]
    root = live.host_dirs[host]
    target = Target(name=f"{host}/host", device=host, protocol="host",
                    params={"interfaces": ["eth0", "eth1"], "sysfs_root": str(root)}, timeout_s=5)
    r = collect_host(target, now_ms=1, run=ethtool_runner(root / "ethtool"))
    assert r.ok and not r.warnings, (r.error, r.warnings)
    v = live.view(host, "eth0")
    assert pick(r.samples, "port_rx_bytes_total", "eth0") == v.values["port_rx_bytes_total"]
    assert pick(r.samples, "port_fec_corrected_bits_total", "eth0") == v.values["port_fec_corrected_bits_total"]
    assert pick(r.samples, "port_ecn_marked_packets_total", "eth0") == v.values["port_ecn_marked_packets_total"]
    for lane, dbm in v.lanes["optic_rx_power_dbm"].items():
        assert abs(mw(pick(r.samples, "optic_rx_power_dbm", "eth0", lane)) - mw(dbm)) <= 0.5e-4 + 1e-9
    # the shim answers like ethtool, so the collector's default subprocess path works too
    shim = str(root / "bin" / "ethtool")
    via_shim = collect_host(target, now_ms=1, run=lambda cmd, t: run_command([shim, *cmd[1:]], t))
    assert via_shim.ok and not via_shim.warnings, via_shim.warnings
    assert {(s.metric, s.port, s.lane): s.value for s in via_shim.samples} == \
        {(s.metric, s.port, s.lane): s.value for s in r.samples}
    # without ethtool: sysfs alone still gives the traffic (4-byte PMA words: within 3 bytes)
    sysfs_only = collect_host(target.model_copy(update={"params": {"sysfs_root": str(root)}}), now_ms=1)
    assert sysfs_only.ok
    assert abs(pick(sysfs_only.samples, "port_rx_bytes_total", "eth0") - v.values["port_rx_bytes_total"]) < 4


def test_inventory_endpoints_reach_the_live_agents_and_lldp_matches_links(
        live: LiveFabric, monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv(COMMUNITY_ENV, live.community)
    inv = read_inventory(live.inventory_path)
    links: dict[str, set[Neighbor]] = {}
    for link in inv.links:
        (ad, ap), (bd, bp) = link.a.split(":", 1), link.b.split(":", 1)
        links.setdefault(ad, set()).add(Neighbor(ap, bd, bp))
        links.setdefault(bd, set()).add(Neighbor(bp, ad, ap))
    protocols = {}
    for dev in inv.devices:
        assert len(dev.endpoints) == 1, dev.name
        ep = dev.endpoints[0]
        protocols[dev.name] = ep.protocol
        target = target_for(ep, dev.name)
        if ep.protocol == "host":
            target = target.model_copy(update={"params": {**target.params, "interfaces": [p.name for p in dev.ports]}})
            r = collect_host(target, now_ms=1, run=ethtool_runner(Path(ep.sysfs_root or "/") / "ethtool"))
        elif ep.protocol == "snmp":
            r = collect_snmp(target, now_ms=1)
            assert set(r.neighbors) == links[dev.name]
        else:
            r = collect_gnmi(target, now_ms=1)
        assert r.ok and not r.warnings, (dev.name, r.error, r.warnings)
        assert {s.port for s in r.samples if s.port} == {p.name for p in dev.ports}, dev.name
    assert protocols["spine-01"] == "gnmi" and protocols[LEAF] == "snmp"
    # spines are inventoried with gNMI but answer SNMP too, LLDP included
    r = collect_snmp(snmp_target(live, "spine-01"), now_ms=1)
    assert set(r.neighbors) == links["spine-01"]


def test_dirty_connector_shows_in_polled_rx_power(tmp_path: Path) -> None:
    with serve_fabric(_scenario(tmp_path), start=T0, base_dir=tmp_path, tick_s=None, gnmi=False,
                      host=False) as fab:
        before = collect_snmp(snmp_target(fab, LEAF), now_ms=1)
        truth = json.loads(fab.truth_path.read_text())
        assert [e["id"] for e in truth["events"]] == ["s1"] and truth["events"][0]["onset_unix"] == T0 + 600
        fab.advance(900)  # past the onset (10m)
        after = collect_snmp(snmp_target(fab, LEAF), now_ms=2)
        view = fab.view(LEAF, PORT)
    drop = pick(before.samples, "optic_rx_power_dbm", PORT, LANE) - pick(after.samples, "optic_rx_power_dbm",
                                                                           PORT, LANE)
    other = pick(before.samples, "optic_rx_power_dbm", PORT, 0) - pick(after.samples, "optic_rx_power_dbm", PORT, 0)
    assert 3.0 < drop < 5.0 and abs(other) < 1.0  # 4 dB on lane 2, the rest within noise and temperature drift
    assert abs(mw(pick(after.samples, "optic_rx_power_dbm", PORT, LANE)) - mw(view.lanes["optic_rx_power_dbm"][LANE])) \
        <= 0.5e-4 + 1e-9


def _tcp_open(port: int) -> bool:
    with socket.socket() as s:
        s.settimeout(0.5)
        return s.connect_ex(("127.0.0.1", port)) == 0


def test_clock_steps_with_speedup_and_close_frees_everything(tmp_path: Path) -> None:
    before = {t.name for t in threading.enumerate()}
    fab = serve_fabric(None, start=T0, speedup=60, base_dir=tmp_path, tick_s=0.1)
    try:
        deadline = time.monotonic() + 10
        while len(fab.step_costs) < 4 and time.monotonic() < deadline:
            time.sleep(0.05)
        assert len(fab.step_costs) >= 4
        assert fab.t is not None and fab.t - T0 >= 3 * 0.1 * 60 * 0.9  # data time runs 60x
        udp = list(fab.snmp_ports.values())
        tcp = list(fab.gnmi_ports.values())
        assert all(_udp_bound(p) for p in udp) and all(_tcp_open(p) for p in tcp)
    finally:
        fab.close()
    assert not any(_udp_bound(p) for p in udp)
    assert not any(_tcp_open(p) for p in tcp)
    left = {t.name for t in threading.enumerate()} - before
    assert not {n for n in left if n.startswith("fw-sim")}, left


def _children(pid: int) -> set[int]:
    out: set[int] = set()
    for task in Path(f"/proc/{pid}/task").iterdir():
        with open(task / "children") as f:
            out |= {int(x) for x in f.read().split()}
    return out


@pytest.mark.parametrize("sig", [signal.SIGINT, signal.SIGTERM])
def test_cli_serve_prints_where_and_stops_cleanly(tmp_path: Path, sig: signal.Signals) -> None:
    proc = subprocess.Popen([sys.executable, "-m", "service.cli", "sim", "serve", "--scenario",
                             str(_scenario(tmp_path)), "--dir", str(tmp_path / "out"), "--tick", "0.2",
                             "--speedup", "30"], cwd=REPO, stdout=subprocess.PIPE, stderr=subprocess.STDOUT,
                            text=True, env={**os.environ, "COLUMNS": "200"})
    lines: list[str] = []
    try:
        assert proc.stdout is not None
        for line in proc.stdout:
            lines.append(line)
            if "Ctrl-C stops." in line:
                break
        text = "".join(lines)
        assert "inventory" in text and str(tmp_path / "out" / "inventory.yaml") in text, text
        udp = [int(x.split("udp/")[1].split(",")[0]) for x in lines if "udp/" in x]
        assert len(udp) == 4 and all(_udp_bound(p) for p in udp)
        assert not _children(proc.pid)  # everything runs in-process: nothing to orphan
        proc.send_signal(sig)
        rest, _ = proc.communicate(timeout=15)
    finally:
        if proc.poll() is None:
            proc.kill()
            proc.wait()
    assert proc.returncode == 0, "".join(lines) + rest
    assert "stopping after" in rest
    assert not any(_udp_bound(p) for p in udp)
    inv = read_inventory(tmp_path / "out" / "inventory.yaml")
    assert {e.protocol for d in inv.devices for e in d.endpoints} == {"snmp", "gnmi", "host"}
    assert math.isfinite(json.loads((tmp_path / "out" / "ground_truth.json").read_text())["events"][0]
                         ["onset_wall_unix"])
