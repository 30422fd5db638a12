"""The scrape collector (collectors/scrape.py) against a real node_exporter on 127.0.0.1 and a real
dcgm-exporter page (tests/data/real/dcgm, see SOURCES.md) served over HTTP: the worker's task body
(`run_collection`) stores the exporters' readings under the catalogue's names and the inventory's
ports, checked against the exporters' own pages; a failing or garbled exporter degrades the target with
the reason and never loses the other exporter's samples."""

from __future__ import annotations

import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from collectors import scrape
from collectors.tasks import run_collection
from service.config import load_settings
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry.targets import list_targets
from tests.exporter_peers import metrics, node_exporter, page_server, snmp_exporter
from tests.live_api import free_tcp_port
from tests.paths import REPO
from tests.snmp_peers import start_snmpsim

DCGM = REPO / "tests/data/real/dcgm/tmax_hypercloud_dcgm-exporter1.4.6_pod_gpu_metrics_2gpu_blank_nvlink.prom"
ARISTA = REPO / "tests/data/snmp/arista_eos_4.20_dcs-7150s-24.snmprec"
SNMP_YML = REPO / "tests/data/exporters/snmp.yml"   # if_mib and Arista DOM modules for snmp_exporter


@pytest.fixture(scope="module")
def node_url() -> Iterator[str]:
    with tempfile.TemporaryDirectory(prefix="fw-scrape-") as work, node_exporter(Path(work)) as url:
        yield url


@pytest.fixture(scope="module")
def pages() -> Iterator[str]:
    with page_server({"/dcgm": (200, DCGM.read_bytes()),
                      "/garbage": (200, b"<html>this is not an exporter</html>\n"),
                      "/down": (503, b"dcgm not ready\n")}) as base:
        yield base


def _netdevs(node_url: str) -> list[str]:
    return sorted({lb["device"] for n, lb, _ in metrics(httpx.get(node_url).text)
                   if n == "node_network_receive_bytes_total"})


def _load(db: Engine, urls: list[str], ports: list[str], **endpoint: Any) -> int:
    inv = {"devices": [{"name": "gpu-a01", "kind": "host", "role": "host", "gpus": 2,
                        "ports": [{"name": p} for p in ports],
                        "endpoints": [{"protocol": "scrape", "scrape_urls": urls, "timeout_s": 2, **endpoint}]}]}
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate(inv))
        session.commit()
    scrape.MAPPER.forget()  # a worker notices an inventory change within seconds; a test does not wait
    with db.connect() as conn:
        return conn.execute(text("SELECT id FROM endpoints")).scalar_one()


def _stored(db: Engine) -> dict[tuple[str, str | None, int | None], float]:
    with db.connect() as conn:
        return {(m, p, g): v for m, p, g, v in conn.execute(text(
            "SELECT s.metric, p.name, s.gpu, x.value FROM samples x JOIN series s ON s.id = x.series_id "
            "LEFT JOIN ports p ON p.id = s.port_id"))}


def _target(db: Engine, device: str = "gpu-a01") -> dict[str, Any]:
    with db.connect() as conn:
        return list_targets(conn, device=device, rules=False)[0]


def test_node_exporter_and_dcgm_pages_land_on_the_hosts_ports_and_gpus(db: Engine, db_url: str, node_url: str,
                                                                      pages: str) -> None:
    netdevs = _netdevs(node_url)
    assert netdevs, "node_exporter shows no network device"
    ep = _load(db, [node_url, f"{pages}/dcgm"], netdevs)
    before = metrics(httpx.get(node_url).text)
    out = run_collection(ep, ["counters", "state"], settings=load_settings(database_url=db_url))
    after = metrics(httpx.get(node_url).text)
    assert out["ok"] and out["written"] > 0 and out["rejected"] == 0, out
    stored = _stored(db)
    for dev in netdevs:
        lo, hi = (next(v for n, lb, v in page if n == "node_network_receive_bytes_total" and lb["device"] == dev)
                  for page in (before, after))
        assert lo <= stored[("port_rx_bytes_total", dev, None)] <= hi, dev
        up = next(v for n, lb, v in after if n == "node_network_up" and lb["device"] == dev)
        assert stored[("port_oper_up", dev, None)] == up
    # dcgm-exporter's page as captured: GPU 0 at 36 C, no XID; its blank NVLink fields are no reading
    assert stored[("gpu_temperature_celsius", None, 0)] == 36.0
    assert stored[("gpu_last_xid", None, 0)] == 0.0
    assert not [k for k in stored if k[0].startswith("gpu_nvlink")]
    t = _target(db)
    assert t["state"] == "ok" and t["protocol"] == "scrape", t
    assert set(t["coverage"]["arrived"]) == {"state", "counters"}


def test_a_failing_or_garbled_exporter_degrades_the_target_and_keeps_the_others(db: Engine, db_url: str,
                                                                               node_url: str, pages: str) -> None:
    netdevs = _netdevs(node_url)
    dead = f"http://127.0.0.1:{free_tcp_port()}/metrics"
    ep = _load(db, [node_url, f"{pages}/garbage", f"{pages}/down", dead], netdevs)
    out = run_collection(ep, ["counters", "state"], settings=load_settings(database_url=db_url))
    assert out["ok"] and out["written"] > 0, out   # node_exporter's samples stored all the same
    assert ("port_rx_bytes_total", netdevs[0], None) in _stored(db)
    t = _target(db)
    assert t["state"] == "degraded", t
    assert f"{pages}/garbage: not Prometheus text" in t["reason"]
    assert f"{pages}/down: HTTP 503" in t["reason"]
    assert dead in t["reason"]


def test_every_exporter_failing_is_a_failed_collection(db: Engine, db_url: str, pages: str) -> None:
    ep = _load(db, [f"{pages}/down"], ["eth0"])
    out = run_collection(ep, ["counters", "state"], settings=load_settings(database_url=db_url))
    assert not out["ok"] and "every exporter URL failed" in out["error"] and "HTTP 503" in out["error"]
    assert _target(db)["state"] == "failing"


def test_ports_the_inventory_lacks_are_named_not_dropped_silently(db: Engine, db_url: str, node_url: str) -> None:
    netdevs = _netdevs(node_url)
    ep = _load(db, [node_url], [*netdevs[1:], "eth-spare"])   # the first netdev is not in the inventory
    out = run_collection(ep, ["counters", "state"], settings=load_settings(database_url=db_url))
    assert out["ok"], out
    spots = _target(db)["coverage"]["blind_spots"]["ports"]
    assert any("unknown_port" in w and f"gpu-a01:{netdevs[0]}" in w for w in spots), spots


def test_snmp_exporter_pages_land_on_the_switch_ports(db: Engine, db_url: str) -> None:
    """A real snmp_exporter walking snmpsim (serving a real Arista recording): the switch needs no SNMP
    collector of ours; every stored reading equals snmp_exporter's own, in catalogue units."""
    sim = start_snmpsim({"public": ARISTA})
    try:
        with tempfile.TemporaryDirectory(prefix="fw-scrape-") as work, \
                snmp_exporter(Path(work), SNMP_YML) as snmp_url:
            pages = {m: f"{snmp_url}?target=127.0.0.1:{sim.port}&module={m}" for m in ("if_mib", "dom")}
            own = {(n, lb.get("ifName")): v for n, lb, v in metrics(httpx.get(pages["if_mib"], timeout=20).text)}
            names = sorted({p for n, p in own if n == "ifHighSpeed" and p})
            inv = {"devices": [{"name": "arista1", "kind": "switch", "role": "leaf",
                                "ports": [{"name": n, **({"optic": {"type": "10G-SR"}} if n == "Ethernet21" else {})}
                                          for n in names],
                                "endpoints": [{"protocol": "scrape", "scrape_urls": list(pages.values()),
                                               "timeout_s": 20}]}]}
            with Session(db) as session:
                upsert_inventory(session=session, inventory=Inventory.model_validate(inv))
                session.commit()
            scrape.MAPPER.forget()
            with db.connect() as conn:
                ep = conn.execute(text("SELECT id FROM endpoints")).scalar_one()
            out = run_collection(ep, ["counters", "state", "optics"], settings=load_settings(database_url=db_url))
    finally:
        sim.close()
    assert out["ok"] and out["rejected"] == 0, out
    stored = _stored(db)
    for obj, metric, conv in (("ifHCInOctets", "port_rx_bytes_total", lambda v: v),
                              ("ifHighSpeed", "port_speed_bits_per_second", lambda v: v * 1e6),
                              ("ifOperStatus", "port_oper_up", lambda v: 1.0 if v == 1 else 0.0)):
        ports = {p: v for (n, p), v in own.items() if n == obj}
        assert len(ports) >= 20
        for port, v in ports.items():
            assert stored[(metric, port, None)] == conv(v), (obj, port)
    assert ("optic_temperature_celsius", "Ethernet21", None) in stored
    t = _target(db, "arista1")
    assert t["state"] == "ok", t


def test_scrape_settings_are_checked_in_the_inventory() -> None:
    bad = {"devices": [{"name": "h", "kind": "host", "role": "host",
                        "endpoints": [{"protocol": "scrape", "scrape_urls": ["not a url"]}]}]}
    with pytest.raises(ValidationError, match="scrape_urls"):
        Inventory.model_validate(bad)
