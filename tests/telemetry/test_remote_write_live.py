"""A real Prometheus scrapes a real node_exporter and a real snmp_exporter (walking snmpsim serving a real
Arista recording, and net-snmp's snmpd reporting this machine's interfaces) and remote-writes into a
fabricwatch API started here; the samples land under the catalogue's names and the inventory's ports,
checked against the exporters' own /metrics.

Programs: Debian prometheus, prometheus-node-exporter, prometheus-snmp-exporter, snmpd; snmpsim (dev extra).
They start once for the module, scrape every second and send every second.
"""

from __future__ import annotations

import math
import shutil
import signal
import subprocess
import tempfile
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import httpx
import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from service.config import load_settings
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry import remote_write as rw
from tests.exporter_peers import binary, metrics, start, wait_http
from tests.live_api import free_tcp_port, live_api
from tests.snmp_peers import Peer, free_udp_port, require, start_snmpsim

DATA = Path(__file__).resolve().parents[1] / "data"
ARISTA = DATA / "snmp" / "arista_eos_4.20_dcs-7150s-24.snmprec"
SNMP_YML = DATA / "exporters" / "snmp.yml"


def _start_snmpd_v2c(work: Path) -> Peer:
    """net-snmp snmpd answering v2c `public` on 127.0.0.1: this machine's own IF-MIB, live counters."""
    port = free_udp_port()
    conf, log = work / "snmpd.conf", work / "snmpd.log"
    conf.write_text("rocommunity public 127.0.0.1\n")
    args = [require("snmpd", "the Debian package snmpd"), "-f", "-C", "-c", str(conf), "-Lf", str(log),
            "-p", str(work / "snmpd.pid"), f"udp:127.0.0.1:{port}"]
    env = {"SNMP_PERSISTENT_DIR": str(work / "persist"), "PATH": "/usr/sbin:/usr/bin:/bin"}
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=work)
    peer = Peer("snmpd", port, proc, work, log)
    peer.wait_ready()
    return peer


@dataclass
class Lab:
    db: Engine
    node_url: str
    snmp_url: str
    snmp_target: str
    snmpd_target: str
    before: list[tuple[str, dict[str, str], float]]  # node_exporter before Prometheus started
    snmpd_before: list[tuple[str, dict[str, str], float]]  # snmp_exporter walking snmpd, likewise


@pytest.fixture(scope="module")
def lab(engine: Engine, db_url: str) -> Iterator[Lab]:
    from tests.conftest import _TABLES_SQL

    with engine.begin() as conn:
        conn.execute(text(f"TRUNCATE {conn.execute(text(_TABLES_SQL)).scalar()} RESTART IDENTITY CASCADE"))
    work = Path(tempfile.mkdtemp(prefix="fw-rw-"))
    procs: list[subprocess.Popen[bytes]] = []
    snmpsim = start_snmpsim({"public": ARISTA})
    (work / "snmpd").mkdir(mode=0o755)
    snmpd = _start_snmpd_v2c(work / "snmpd")
    try:
        ne_port, se_port, prom_port = free_tcp_port(), free_tcp_port(), free_tcp_port()
        procs.append(ne := start([binary("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{ne_port}",
                                   "--collector.disable-defaults", "--collector.netdev", "--collector.netclass"],
                                  work / "node.log"))
        procs.append(se := start([binary("prometheus-snmp-exporter"), f"--config.file={SNMP_YML}",
                                   f"--web.listen-address=127.0.0.1:{se_port}"], work / "snmp.log"))
        node_url, snmp_url = f"http://127.0.0.1:{ne_port}/metrics", f"http://127.0.0.1:{se_port}/snmp"
        wait_http(node_url, ne, work / "node.log")
        wait_http(f"http://127.0.0.1:{se_port}/", se, work / "snmp.log")
        before = metrics(httpx.get(node_url).text)
        netdevs = sorted({lb["device"] for n, lb, _ in before if n == "node_network_receive_bytes_total"})
        assert netdevs, "node_exporter shows no network device"
        target = f"127.0.0.1:{snmpsim.port}"
        if_names = sorted({lb["ifName"] for n, lb, _ in metrics(httpx.get(
            snmp_url, params={"target": target, "module": "if_mib"}, timeout=20).text) if n == "ifHighSpeed"})
        snmpd_target = f"127.0.0.1:{snmpd.port}"
        snmpd_before = metrics(httpx.get(snmp_url, params={"target": snmpd_target, "module": "if_mib"},
                                          timeout=20).text)
        snmpd_ifs = sorted({lb["ifName"] for n, lb, _ in snmpd_before if n == "ifHCInOctets"})
        assert snmpd_ifs, "snmpd shows no interface"
        inventory = {"devices": [
            {"name": "lab-host", "kind": "host", "role": "host", "mgmt_address": "127.0.0.1",
             "ports": [{"name": d} for d in netdevs]},
            {"name": "arista1", "kind": "switch", "role": "leaf",
             "ports": [{"name": n, **({"optic": {"type": "10G-SR"}} if n == "Ethernet21" else {})} for n in if_names],
             "endpoints": [{"protocol": "snmp", "address": "127.0.0.1", "port": snmpsim.port,
                            "community": {"env": "FW_TEST_COMMUNITY"}}]},
            # this machine's own interfaces, as net-snmp reports them, as a switch on its SNMP endpoint
            {"name": "snmpd-box", "kind": "switch", "role": "leaf", "ports": [{"name": n} for n in snmpd_ifs],
             "endpoints": [{"protocol": "snmp", "address": "127.0.0.1", "port": snmpd.port,
                            "community": {"env": "FW_TEST_COMMUNITY"}}]},
        ]}
        with Session(engine) as session:
            upsert_inventory(session=session, inventory=Inventory.model_validate(inventory))
            session.commit()
        rw.MAPPER.forget()
        settings = load_settings(auth_required=False, database_url=db_url)
        with live_api(settings) as api:
            (work / "prometheus.yml").write_text(f"""
global: {{scrape_interval: 1s, scrape_timeout: 900ms}}
scrape_configs:
  - job_name: node
    static_configs: [{{targets: ["127.0.0.1:{ne_port}"]}}]
  - job_name: snmp_if_mib
    scrape_interval: 2s
    scrape_timeout: 2s
    metrics_path: /snmp
    params: {{module: [if_mib]}}
    static_configs: [{{targets: ["{target}", "{snmpd_target}"]}}]
    relabel_configs:
      - {{source_labels: [__address__], target_label: __param_target}}
      - {{source_labels: [__param_target], target_label: instance}}
      - {{target_label: __address__, replacement: "127.0.0.1:{se_port}"}}
  - job_name: snmp_dom
    scrape_interval: 2s
    scrape_timeout: 2s
    metrics_path: /snmp
    params: {{module: [dom]}}
    static_configs: [{{targets: ["{target}"]}}]
    relabel_configs:
      - {{source_labels: [__address__], target_label: __param_target}}
      - {{source_labels: [__param_target], target_label: instance}}
      - {{target_label: __address__, replacement: "127.0.0.1:{se_port}"}}
remote_write:
  - url: {api}/api/v1/write
    queue_config: {{batch_send_deadline: 1s, min_backoff: 100ms, max_backoff: 1s}}
    metadata_config: {{send_interval: 2s}}
""")
            procs.append(start([binary("prometheus"), f"--config.file={work / 'prometheus.yml'}",
                                 f"--storage.tsdb.path={work / 'tsdb'}", f"--web.listen-address=127.0.0.1:{prom_port}"],
                                work / "prometheus.log"))
            deadline = time.monotonic() + 60
            while time.monotonic() < deadline:  # three scrapes of each arrived
                with engine.connect() as conn:
                    n = conn.execute(text(
                        "SELECT min(c) FROM (SELECT d.name, count(DISTINCT x.ts) c FROM samples x JOIN series s "
                        "ON s.id = x.series_id JOIN devices d ON d.id = s.device_id GROUP BY d.name) q "
                        "HAVING count(*) = 3")).scalar()
                if n is not None and n >= 3:
                    break
                time.sleep(0.5)
            else:
                targets = httpx.get(f"http://127.0.0.1:{prom_port}/api/v1/targets").text[:3000]
                pytest.fail(f"no remote write arrived: {rw.TOTALS.to_dict()} {targets}")
            yield Lab(engine, node_url, snmp_url, target, snmpd_target, before, snmpd_before)
    finally:
        for p in procs:
            p.send_signal(signal.SIGTERM)
        for p in procs:
            try:
                p.wait(10)
            except subprocess.TimeoutExpired:
                p.kill()
        snmpsim.close()
        snmpd.close()
        shutil.rmtree(work, ignore_errors=True)


def _stored(db: Engine, device: str) -> dict[tuple[str, str | None, int | None], list[float]]:
    out: dict[tuple[str, str | None, int | None], list[float]] = {}
    with db.connect() as conn:
        for metric, port, lane, value in conn.execute(text(
                "SELECT s.metric, p.name, s.lane, x.value FROM samples x JOIN series s ON s.id = x.series_id "
                "JOIN devices d ON d.id = s.device_id LEFT JOIN ports p ON p.id = s.port_id WHERE d.name = :d "
                "ORDER BY x.ts"), {"d": device}):
            out.setdefault((metric, port, lane), []).append(value)
    return out


def test_node_exporter_through_prometheus_lands_on_the_hosts_ports(lab: Lab) -> None:
    after = metrics(httpx.get(lab.node_url).text)
    stored = _stored(lab.db, "lab-host")
    counters = {"node_network_receive_bytes_total": "port_rx_bytes_total",
                "node_network_transmit_packets_total": "port_tx_packets_total",
                "node_network_receive_errs_total": "port_rx_errors_total"}
    checked = 0
    for name, metric in counters.items():
        lo = {lb["device"]: v for n, lb, v in lab.before if n == name}
        hi = {lb["device"]: v for n, lb, v in after if n == name}
        for dev in lo:
            values = stored[(metric, dev, None)]
            # every stored reading is one node_exporter gave between the two reads of its own /metrics
            assert all(lo[dev] <= v <= hi[dev] for v in values), (metric, dev, lo[dev], values, hi[dev])
            assert values == sorted(values)
            checked += 1
    assert checked >= 3
    netdevs = {lb["device"] for n, lb, _ in lab.before if n == "node_network_receive_bytes_total"}
    up = {lb["device"]: v for n, lb, v in after if n == "node_network_up"}
    assert {d: stored[("port_oper_up", d, None)][-1] for d in up if d in netdevs} == {
        d: v for d, v in up.items() if d in netdevs}
    # a netdev the inventory does not have is counted per port, not stored
    status = rw.TOTALS.to_dict()
    for d in set(up) - netdevs:
        assert status["unmapped_detail"]["unknown_port"][f"lab-host:{d}"] > 0
    # non-fabric series (node_exporter's own, Go runtime, scrape health) were counted, not stored
    assert any(k.startswith("go_") for k in status["unmapped_detail"]["unmapped_metric"])
    assert {m for m, _p, _l in stored} <= {"port_rx_bytes_total", "port_tx_bytes_total", "port_rx_packets_total",
                                            "port_tx_packets_total", "port_rx_errors_total", "port_tx_errors_total",
                                            "port_rx_discards_total", "port_tx_discards_total", "port_oper_up",
                                            "port_carrier_changes_total", "port_speed_bits_per_second"}


def test_snmp_exporter_through_prometheus_lands_on_the_switch_ports(lab: Lab) -> None:
    own = {}
    for module in ("if_mib", "dom"):
        r = httpx.get(lab.snmp_url, params={"target": lab.snmp_target, "module": module}, timeout=20)
        own.update({(n, lb.get("ifName") or lb.get("entPhysicalDescr")): v for n, lb, v in metrics(r.text)})
    stored = _stored(lab.db, "arista1")
    # IF-MIB: the recording is static, so every stored reading equals snmp_exporter's, in catalogue units
    for obj, metric, conv in (("ifHCInOctets", "port_rx_bytes_total", lambda v: v),
                              ("ifHighSpeed", "port_speed_bits_per_second", lambda v: v * 1e6),
                              ("ifOperStatus", "port_oper_up", lambda v: 1.0 if v == 1 else 0.0),
                              ("ifLastChange", "port_last_change_seconds", lambda v: v / 100)):
        ports = {p: v for (n, p), v in own.items() if n == obj}
        assert len(ports) >= 20
        for port, v in ports.items():
            assert set(stored[(metric, port, None)]) == {conv(v)}, (obj, port)
    # DOM on Ethernet21 (Arista ENTITY-SENSOR-MIB): temperature, voltage, bias, Tx power; the Rx sensor's
    # -1e9 is Arista's "no reading" and is not stored
    descr = "DOM {} Sensor for Ethernet21"
    assert stored[("optic_temperature_celsius", "Ethernet21", None)][-1] == own[("entPhySensorValue",
                                                                                 descr.format("Temperature"))] / 10
    assert math.isclose(stored[("optic_tx_bias_amperes", "Ethernet21", 0)][-1],
                        own[("entPhySensorValue", descr.format("TX Bias"))] * 1e-5)
    tx_w = own[("entPhySensorValue", descr.format("TX Power"))] * 1e-7
    assert math.isclose(stored[("optic_tx_power_dbm", "Ethernet21", 0)][-1], 10 * math.log10(tx_w * 1000))
    assert own[("entPhySensorValue", descr.format("RX Power"))] == -1e9
    assert ("optic_rx_power_dbm", "Ethernet21", 0) not in stored
    assert rw.TOTALS.to_dict()["unmapped"].get("blank_value", 0) > 0


def test_snmp_exporter_walking_live_snmpd_lands_on_its_interfaces(lab: Lab) -> None:
    """net-snmp's snmpd reports this machine's interfaces with moving counters: every stored reading lies
    between two walks snmp_exporter made itself, before Prometheus started and now."""
    after = metrics(httpx.get(lab.snmp_url, params={"target": lab.snmpd_target, "module": "if_mib"},
                               timeout=20).text)
    stored = _stored(lab.db, "snmpd-box")
    checked = 0
    for obj, metric in (("ifHCInOctets", "port_rx_bytes_total"), ("ifHCOutUcastPkts", "port_tx_packets_total")):
        lo = {lb["ifName"]: v for n, lb, v in lab.snmpd_before if n == obj}
        hi = {lb["ifName"]: v for n, lb, v in after if n == obj}
        for port in lo:
            values = stored[(metric, port, None)]
            assert all(lo[port] <= v <= hi[port] for v in values), (obj, port, lo[port], values, hi[port])
            checked += 1
    assert checked >= 2
    oper = {lb["ifName"]: v for n, lb, v in after if n == "ifOperStatus"}
    assert {p: stored[("port_oper_up", p, None)][-1] for p in oper} == {p: float(v == 1) for p, v in oper.items()}
    with lab.db.connect() as conn:  # Counter64: the series keep their width
        assert conn.execute(text("SELECT DISTINCT counter_bits FROM series s JOIN devices d ON d.id = s.device_id "
                                 "WHERE d.name = 'snmpd-box' AND s.metric = 'port_rx_bytes_total'")).all() == [(64,)]
