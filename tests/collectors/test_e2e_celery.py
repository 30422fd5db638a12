"""End to end: a real Celery worker and beat collect from real peers on 127.0.0.1 into PostgreSQL.

Peers: snmpsim serving a real Arista walk, the grpcio gNMI target, a host sysfs tree derived from
real captures, a real dcgm-exporter page scraped over HTTP, and an SNMP target that never
answers. The dead one must show as a failing target
while the others keep their schedule.
"""

from __future__ import annotations

import os
import subprocess
import sys
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from collectors.snmp import parse_snmprec
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from simulator.gnmi_target import serve_gnmi
from tests.exporter_peers import page_server
from tests.paths import REPO
from tests.snmp_peers import silent_udp_socket, start_snmpsim

ARISTA = REPO / "tests/data/snmp/arista_eos_4.20_dcs-7150s-24.snmprec"
DCGM = REPO / "tests/data/real/dcgm/tmax_hypercloud_dcgm-exporter1.4.6_pod_gpu_metrics_2gpu_blank_nvlink.prom"
SYSFS = REPO / "tests/data/host/sysfs_roce"
IF = "/interfaces/interface[name={}]/state"


def gnmi_data() -> dict[str, object]:
    t = int(time.time())
    return {IF.format("Ethernet1") + "/counters/in-octets": 1000 * t,
            IF.format("Ethernet1") + "/counters/out-octets": 2000 * t,
            IF.format("Ethernet1") + "/oper-status": "UP"}


def inventory(snmp_port: int, dead_port: int, gnmi_port: int, dcgm_url: str, queue: str) -> Inventory:
    arista_ports = sorted({s.port for s in parse_snmprec(ARISTA.read_text(), device="x", ts_ms=0)[0]
                           if s.port and s.metric != "device_temperature_celsius"})
    fast = {"counters": 2, "optics": 2, "state": 2}
    return Inventory.model_validate({
        "devices": [
            {"name": "leaf-snmp", "kind": "switch", "role": "leaf", "ports": [{"name": p} for p in arista_ports],
             "endpoints": [{"protocol": "snmp", "port": snmp_port, "version": "2c", "queue": queue,
                            "community": {"env": "FW_E2E_COMMUNITY"}, "intervals": fast, "timeout_s": 10}]},
            {"name": "leaf-dead", "kind": "switch", "role": "leaf", "ports": [{"name": "Ethernet1"}],
             "endpoints": [{"protocol": "snmp", "port": dead_port, "version": "2c", "queue": queue,
                            "community": {"env": "FW_E2E_COMMUNITY"}, "intervals": fast, "timeout_s": 0.5,
                            "retries": 0}]},
            {"name": "spine-gnmi", "kind": "switch", "role": "spine", "ports": [{"name": "Ethernet1"}],
             "endpoints": [{"protocol": "gnmi", "port": gnmi_port, "tls": {"enabled": False}, "queue": queue,
                            "intervals": fast, "timeout_s": 2}]},
            {"name": "gpu-001", "kind": "host", "role": "host", "gpus": 8,
             "ports": [{"name": "ens1f0np0", "nic": "mlx5_0", "rail": 0, "gpu": 0}],
             "endpoints": [{"protocol": "host", "sysfs_root": str(SYSFS), "queue": queue, "intervals": fast,
                            "timeout_s": 2}]},
            {"name": "gpu-scrape", "kind": "host", "role": "host", "gpus": 2,
             "endpoints": [{"protocol": "scrape", "scrape_urls": [dcgm_url], "queue": queue, "intervals": fast,
                            "timeout_s": 2}]},
        ]})


@pytest.fixture()
def worker_env(db_url: str, broker_url: str) -> dict[str, str]:
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FW_E2E_COMMUNITY": "arista",
           "FABRICWATCH_LOG_LEVEL": "WARNING"}
    redis = broker_url if broker_url.startswith("redis") else None
    if redis:
        env["FABRICWATCH_REDIS_URL"] = redis
    else:
        env.pop("FABRICWATCH_REDIS_URL", None)  # the database is the broker (embedded default)
    return env


@pytest.fixture()
def peers() -> Iterator[tuple[int, int, int, str]]:
    snmp = start_snmpsim({"arista": ARISTA})
    dead_sock, dead_port = silent_udp_socket()
    try:
        with serve_gnmi(gnmi_data) as (gnmi_port, _), page_server({"/metrics": (200, DCGM.read_bytes())}) as pages:
            yield snmp.port, dead_port, gnmi_port, f"{pages}/metrics"
    finally:
        snmp.close()
        dead_sock.close()


def _status(db: Engine) -> dict[str, tuple]:
    with db.connect() as conn:
        rows = conn.execute(text(
            "SELECT d.name, t.last_success, t.last_error, t.consecutive_failures FROM endpoints e "
            "JOIN devices d ON d.id = e.device_id LEFT JOIN target_status t ON t.endpoint_id = e.id")).all()
    return {r[0]: tuple(r[1:]) for r in rows}


def _collections(db: Engine, device: str) -> int:
    """How many collections stored for the device: the most samples of any one of its series."""
    with db.connect() as conn:
        return conn.execute(text(
            "SELECT coalesce(max(n), 0) FROM (SELECT count(*) AS n FROM samples x JOIN series s ON s.id = x.series_id "
            "JOIN devices d ON d.id = s.device_id WHERE d.name = :d GROUP BY s.id) per_series"),
            {"d": device}).scalar_one()


def _octets(db: Engine) -> int:
    with db.connect() as conn:
        return conn.execute(text(
            "SELECT count(*) FROM samples x JOIN series s ON s.id = x.series_id JOIN devices d "
            "ON d.id = s.device_id WHERE d.name = 'leaf-snmp' AND s.metric = 'port_rx_bytes_total'")).scalar_one()


def test_worker_and_beat_collect_into_postgres(db: Engine, worker_env: dict[str, str],
                                               peers: tuple[int, int, int, str], tmp_path: Path) -> None:
    snmp_port, dead_port, gnmi_port, dcgm_url = peers
    queue = f"e2e-{os.getpid()}-{time.monotonic_ns()}"
    with Session(db) as session:
        upsert_inventory(session=session, inventory=inventory(snmp_port, dead_port, gnmi_port, dcgm_url, queue))
        session.commit()
    log = (tmp_path / "worker.log").open("wb")
    worker = subprocess.Popen(
        [sys.executable, "-m", "service.cli", "worker", "--beat", "-Q", f"fabricwatch,{queue}", "-c", "4"],
        env=worker_env, stdout=log, stderr=subprocess.STDOUT, cwd=REPO)
    try:
        deadline = time.monotonic() + 120
        good = ("leaf-snmp", "spine-gnmi", "gpu-001", "gpu-scrape")
        while time.monotonic() < deadline:
            status = _status(db)
            if all(status[d][0] is not None for d in good) and status["leaf-dead"][1] is not None \
                    and all(_collections(db, d) >= 2 for d in good) and _octets(db) > 0:
                break
            assert worker.poll() is None, (tmp_path / "worker.log").read_text()[-3000:]
            time.sleep(1)
        status = _status(db)
        for d in good:
            assert status[d][0] is not None and _collections(db, d) >= 2, \
                f"{d}: {status[d]}\n{(tmp_path / 'worker.log').read_text()[-3000:]}"
        assert status["leaf-dead"][0] is None and status["leaf-dead"][2] >= 1
        assert "timed out" in status["leaf-dead"][1] or "no response" in status["leaf-dead"][1].lower()
        assert _octets(db) > 0, (tmp_path / "worker.log").read_text()[-3000:]
    finally:
        worker.terminate()
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            worker.kill()
        log.close()
