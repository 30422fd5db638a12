"""gNMI streams as the worker runs them: a supervised Subscribe per target into PostgreSQL, its state in the API.

The peer is Splice (tests/collectors/gnmi_servers.py), serving real SR Linux and cEOS interface
state and a transceiver lane that decays from -12 to -28 dBm while the stream runs.
"""

from __future__ import annotations

import time
from collections.abc import Callable
from pathlib import Path

import pytest
from pydantic import ValidationError
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from collectors.gnmi_stream import StreamSupervisor, streaming_now
from collectors.tasks import run_collection
from service.config import load_settings
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry.targets import list_targets
from tests.collectors.gnmi_servers import splice_server
from tests.collectors.test_gnmi_thirdparty import CEOS, SRL, fabric, write


def _inventory(port: int, mode: str | None = None) -> Inventory:
    ep = {"protocol": "gnmi", "port": port, "tls": {"enabled": False}, "timeout_s": 3,
          "intervals": {"counters": 0.5, "optics": 0.5, "state": 0.5}}
    if mode:
        ep["mode"] = mode
    return Inventory.model_validate({"devices": [
        {"name": "spine11", "kind": "switch", "role": "spine",
         "ports": [{"name": p} for p in ("ethernet-1/31", "Ethernet2", "Ethernet8")], "endpoints": [ep]}]})


def _load(db: Engine, inv: Inventory) -> int:
    with Session(db) as session:
        upsert_inventory(session=session, inventory=inv)
        session.commit()
    with db.connect() as conn:
        return conn.execute(text("SELECT id FROM endpoints")).scalar_one()


def _lane(db: Engine, port: str, lane: int) -> list[float]:
    with db.connect() as conn:
        return [r[0] for r in conn.execute(text(
            "SELECT x.value FROM samples x JOIN series s ON s.id = x.series_id JOIN ports p ON p.id = s.port_id "
            "WHERE s.metric = 'optic_rx_power_dbm' AND p.name = :p AND s.lane = :l ORDER BY x.ts"),
            {"p": port, "l": lane}).all()]


def _wait(cond: Callable[[], bool], timeout: float = 20.0) -> bool:
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if cond():
            return True
        time.sleep(0.1)
    return cond()


def test_supervised_stream_stores_a_decaying_lane_under_its_port(db: Engine, tmp_path: Path) -> None:
    data = tmp_path / "splice.json"
    write(data, fabric(lane2_dbm=-12.0))
    with splice_server(data) as port:
        ep_id = _load(db, _inventory(port))
        sup = StreamSupervisor(db, scan_s=0.5)
        try:
            sup.scan()
            assert _wait(lambda: -12.0 in _lane(db, "ethernet-1/31", 2)), sup.streams[ep_id]._warnings
            with db.connect() as conn:
                assert streaming_now(conn) == {ep_id}  # the dispatcher leaves this target alone
                t = list_targets(conn, device="spine11")[0]
            assert t["state"] == "ok" and t["stream"]["state"] == "streaming" and t["stream"]["mode"] == "stream"
            assert t["stream"]["worker"] == sup.owner
            write(data, fabric(lane2_dbm=-28.0))
            assert _wait(lambda: -28.0 in _lane(db, "ethernet-1/31", 2))
        finally:
            sup.stop()
        with db.connect() as conn:
            t = list_targets(conn, device="spine11")[0]
            assert streaming_now(conn) == set()
            rx = conn.execute(text(
                "SELECT x.value FROM samples x JOIN series s ON s.id = x.series_id JOIN ports p ON "
                "p.id = s.port_id WHERE s.metric = 'port_rx_bytes_total' AND p.name = 'ethernet-1/31'")).scalars().all()
            found = conn.execute(text("SELECT discovery FROM gnmi_stream_state")).scalar_one()
    lane2 = _lane(db, "ethernet-1/31", 2)
    assert lane2[0] == -12.0 and lane2[-1] == -28.0
    assert set(rx) == {28252060.0}  # SR Linux capture's in-octets
    assert _lane(db, "Ethernet2", 0)[0] == -3.5 and _lane(db, "Ethernet8", 0)[0] == -4.5
    # no transceiver sample was refused as an unknown port
    assert not any("not in the inventory" in w for w in t["warnings"]), t["warnings"]
    assert any("QSFP-DD 7" in w for w in t["warnings"])
    # stopped: the API says the target is polled again, and why
    assert t["stream"]["state"] == "fallback-polling" and "no worker holds" in t["stream"]["reason"]
    assert found["paths"]["/interfaces/interface/state/counters"]["path"] == "/interfaces/interface"


def test_poll_that_stores_nothing_is_degraded_with_a_reason(db: Engine, db_url: str, tmp_path: Path) -> None:
    # The target answers the counters path, but with leaves no catalogue metric uses.
    data = tmp_path / "unmapped.json"
    write(data, {"/interfaces/interface[name=Ethernet2]/state/counters/in-unicast-pkts": 312})
    with splice_server(data) as port:
        ep_id = _load(db, _inventory(port, mode="poll"))
        out = run_collection(ep_id, ["counters", "optics", "state"], settings=load_settings(database_url=db_url))
    assert out["ok"] and out["samples"] == 0
    with db.connect() as conn:
        t = list_targets(conn, device="spine11")[0]
    assert t["state"] == "degraded" and t["reason"].startswith("no samples:")
    assert t["stream"] == {**t["stream"], "mode": "poll", "state": "polling"}


def test_poll_against_splice_stores_real_values_and_remembers_discovery(db: Engine, db_url: str,
                                                                       tmp_path: Path) -> None:
    data = tmp_path / "splice.json"
    write(data, fabric())
    with splice_server(data) as port:
        ep_id = _load(db, _inventory(port, mode="poll"))
        settings = load_settings(database_url=db_url)
        first = run_collection(ep_id, ["counters", "optics", "state"], settings=settings)
        second = run_collection(ep_id, ["optics"], settings=settings)
    assert first["ok"] and first["rejected"] == 0 and first["written"] > 0, first
    assert second["ok"] and second["written"] > 0
    assert _lane(db, "ethernet-1/31", 2) == [-12.0, -12.0]
    with db.connect() as conn:
        t = list_targets(conn, device="spine11")[0]
        found = conn.execute(text("SELECT discovery FROM gnmi_stream_state")).scalar_one()
    assert t["state"] == "ok" and t["reason"] is None
    assert found["paths"]["/components/component/state/parent"]["path"] == "/components/component"


def test_mode_is_a_gnmi_setting() -> None:
    assert _inventory(1, "poll").devices[0].endpoints[0].mode == "poll"
    with pytest.raises(ValidationError, match="stream"):
        _inventory(1, "push")
    from service.inventory.loader import InventoryError, load_inventory_text

    with pytest.raises(InventoryError, match="mode.*gNMI setting"):
        load_inventory_text("devices:\n- {name: a, kind: switch, role: leaf, endpoints: "
                            "[{protocol: snmp, community: {env: X}, mode: poll}]}\n")


def test_captures_are_the_ones_documented() -> None:
    sources = (Path(__file__).resolve().parents[1] / "data" / "real" / "SOURCES.md").read_text()
    assert SRL in sources and CEOS in sources
