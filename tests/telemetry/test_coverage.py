"""Coverage, not just success: every collection records, per target, the metric groups its role expects
against what arrived and what was refused (service/telemetry/coverage.py); a blind target is `degraded`
with the reason in /api/v1/targets and /metrics, and after N collections a telemetry_gap alert opens.

Real parts: the SNMP collector polls snmpsim on 127.0.0.1 serving a real Arista walk (and the same walk
without ENTITY-SENSOR-MIB, so its optics vanish), the host collector runs an `ethtool` script printing a
real mlx5 capture over a real sysfs tree, ingest writes to PostgreSQL, and the detection cycle opens and
resolves the alert through the alerts service.
"""

from __future__ import annotations

import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from collectors.base import CollectResult
from collectors.spool import PendingStore
from collectors.tasks import run_collection, store_collection
from service.api.app import create_app
from service.config import SettingsError, load_settings
from service.detection.state import BLOCKED
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.pipeline import run_cycle
from service.telemetry.coverage import StreamClock, assess
from service.telemetry.ingest import IngestReport
from service.telemetry.samples import Sample
from service.telemetry.targets import list_targets
from tests.paths import REPO
from tests.snmp_peers import DATA, Peer, start_snmpsim

WALK = DATA / "arista_eos_4.20_dcs-7150s-24.snmprec"   # 24 fabric ports, DOM on Ethernet21 and Ethernet22
PORTS = [f"Ethernet{i}" for i in range(1, 25)]
ALL = ["counters", "optics", "state"]
SYSFS = REPO / "tests/data/host/sysfs_roce"
MLX5_S = REPO / "tests/data/host/mlx5_100G_with_prio3_pause_ethtool_S.txt"


@pytest.fixture(scope="module")
def sim(tmp_path_factory: pytest.TempPathFactory) -> Iterator[Peer]:
    """One snmpsim: `full` the real walk; `nooptics` the walk without ENTITY-SENSOR-MIB (1.3.6.1.2.1.99);
    `silent` an agent with nothing but its system group."""
    tmp = tmp_path_factory.mktemp("walks")
    lines = WALK.read_text().splitlines(keepends=True)
    (tmp / "nooptics.snmprec").write_text("".join(ln for ln in lines if not ln.startswith("1.3.6.1.2.1.99.")))
    (tmp / "silent.snmprec").write_text("".join(ln for ln in lines if ln.startswith("1.3.6.1.2.1.1.")))
    peer = start_snmpsim({"full": WALK, "nooptics": tmp / "nooptics.snmprec", "silent": tmp / "silent.snmprec"})
    yield peer
    peer.close()


def _switch(name: str, port: int, env: str, ports: list[str], optics: tuple[str, ...] = ("Ethernet21",)) -> dict:
    return {"name": name, "kind": "switch", "role": "leaf",
            "ports": [{"name": p, **({"optic": {"type": "10G-SR"}} if p in optics else {})} for p in ports],
            "endpoints": [{"protocol": "snmp", "port": port, "community": {"env": env}, "timeout_s": 2}]}


def _load(db: Engine, *devices: dict) -> dict[str, int]:
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate({"devices": list(devices)}))
        session.commit()
    with db.connect() as conn:
        return dict(conn.execute(text(
            "SELECT d.name, e.id FROM endpoints e JOIN devices d ON d.id = e.device_id")).all())


def _poll(db_url: str, ep: int, groups: list[str] = ALL) -> dict[str, Any]:
    out = run_collection(ep, groups, settings=load_settings(database_url=db_url))
    assert out.get("ok"), out
    return out


def _target(db: Engine, device: str) -> dict[str, Any]:
    with db.connect() as conn:
        return list_targets(conn, device=device)[0]


def _gauge(body: str, name: str, **labels: str) -> float:
    want = ",".join(f'{k}="{v}"' for k, v in labels.items())
    m = re.search(rf"^{name}{{{re.escape(want)}}} (\S+)$", body, re.M)
    assert m, f"{name}{{{want}}} not in /metrics"
    return float(m.group(1))


def _gap_alert(db: Engine, device: str) -> dict[str, Any] | None:
    with db.connect() as conn:
        row = conn.execute(text("SELECT * FROM alerts WHERE fingerprint = :f"),
                           {"f": f"telemetry_gap/{device}"}).mappings().first()
    return dict(row) if row else None


def _cycle(db: Engine) -> None:
    run_cycle(db, int(time.time() * 1000))


def test_healthy_switch_is_ok_with_every_expected_group(db: Engine, db_url: str, sim: Peer,
                                                       monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_COV_LEAF", "full")
    ep = _load(db, _switch("leaf1", sim.port, "FW_COV_LEAF", PORTS, optics=("Ethernet21", "Ethernet22")))["leaf1"]
    _poll(db_url, ep)
    t = _target(db, "leaf1")
    cov = t["coverage"]
    assert t["state"] == "ok" and t["reason"] is None, t["reason"]
    assert cov["expected"] == ["state", "counters", "optics"] and cov["arrived"] == cov["expected"]
    assert cov["missing"] == [] and cov["not_collected_yet"] == []
    assert cov["groups"]["optics"]["samples"] == 8 and cov["groups"]["state"]["samples"] == 24 * 4
    # the partial blind spots the collector reports are kept with the record, per group
    assert any("dot3StatsFCSErrors" in w for w in cov["blind_spots"]["counters"])
    assert any("Management1" in w for w in cov["blind_spots"]["ports"])
    # component temperatures name no inventory port: refused, counted, named (never silently dropped)
    assert cov["rejected"]["not in the inventory"]["count"] == 8
    assert "leaf1:Cpu temp sensor" in cov["rejected"]["not in the inventory"]["examples"]


def test_optics_vanishing_degrades_then_alerts_after_n_polls_and_resolves(db: Engine, db_url: str, sim: Peer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_COV_LEAF", "full")
    ep = _load(db, _switch("leaf1", sim.port, "FW_COV_LEAF", PORTS))["leaf1"]
    _poll(db_url, ep)
    assert _target(db, "leaf1")["state"] == "ok"

    monkeypatch.setenv("FW_COV_LEAF", "nooptics")   # the agent stops serving ENTITY-SENSOR-MIB
    _poll(db_url, ep, ["optics"])
    t = _target(db, "leaf1")
    assert t["state"] == "degraded"
    assert t["reason"].startswith("optics: no transceiver reading in ENTITY-SENSOR-MIB"), t["reason"]
    assert t["coverage"]["missing"] == ["optics"] and t["coverage"]["arrived"] == ["state", "counters"]
    assert t["coverage"]["groups"]["optics"]["missing_polls"] == 1

    app = create_app(load_settings(database_url=db_url, auth_required=False))
    client = TestClient(app)
    api = client.get("/api/v1/targets", params={"device": "leaf1"}).json()
    assert api["targets"][0]["state"] == "degraded" and api["targets"][0]["coverage"]["missing"] == ["optics"]
    assert api["targets"][0]["reason"].startswith("optics: ")
    body = client.get("/metrics").text
    assert _gauge(body, "fabricwatch_target_degraded", protocol="snmp") == 1
    assert _gauge(body, "fabricwatch_target_missing_groups", group="optics") == 1
    assert _gauge(body, "fabricwatch_target_missing_groups", group="counters") == 0
    assert _gauge(body, "fabricwatch_targets", state="degraded") == 1
    assert _gauge(body, "fabricwatch_targets_not_ok", protocol="snmp", reason="group_missing") == 1

    _cycle(db)   # one collection without optics: degraded, no alert yet
    assert _gap_alert(db, "leaf1") is None
    _poll(db_url, ep, ["optics"])
    _poll(db_url, ep, ["counters", "state"])   # other groups do not count as optics collections
    _cycle(db)
    assert _gap_alert(db, "leaf1") is None
    _poll(db_url, ep, ["optics"])   # the third optics collection in a row without optics
    _cycle(db)
    alert = _gap_alert(db, "leaf1")
    assert alert is not None and alert["state"] == "firing"
    assert (alert["kind"], alert["cause"], alert["severity"], alert["scope"]) == \
        ("telemetry_gap", "telemetry_gap", "ticket", "device")
    ev = {e["feature"]: e for e in alert["evidence"]}
    assert set(ev) == {"snmp:optics"} and ev["snmp:optics"]["value"] == 3 and ev["snmp:optics"]["baseline"] == 3
    assert ev["snmp:optics"]["note"].startswith("optics: no transceiver reading")
    assert "snmp:optics missing for 3 collections" in alert["summary"]
    listed = client.get("/api/v1/alerts", params={"state": "firing"}).json()["items"]
    assert [a["kind"] for a in listed] .count("telemetry_gap") == 1

    # the detector's per-port rules that cannot run show under the target's coverage
    blocked = _target(db, "leaf1")["coverage"]["blocked_rules"]
    assert blocked and all(b["ports"] >= 1 and b["examples"] and b["reason"] in BLOCKED for b in blocked), blocked
    assert {"rule": "congestion", "reason": "no ECN-marked packets and no pause counters", "ports": 24,
            "examples": sorted(PORTS)[:5]} in blocked   # IF-MIB has neither

    monkeypatch.setenv("FW_COV_LEAF", "full")   # optics are back
    _poll(db_url, ep, ["optics"])
    assert _target(db, "leaf1")["state"] == "ok"
    for _ in range(3):   # the usual clear cycles (FABRICWATCH_ALERT_CLEAR_CYCLES)
        _cycle(db)
    assert _gap_alert(db, "leaf1")["state"] == "resolved"
    body = client.get("/metrics").text
    assert _gauge(body, "fabricwatch_target_missing_groups", group="optics") == 0
    assert _gauge(body, "fabricwatch_target_degraded", protocol="snmp") == 0


def test_target_with_zero_samples_is_degraded(db: Engine, db_url: str, sim: Peer,
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_COV_BLIND", "silent")
    ep = _load(db, _switch("blind1", sim.port, "FW_COV_BLIND", PORTS[:4], optics=("Ethernet1",)))["blind1"]
    out = _poll(db_url, ep)
    assert out["samples"] == 0
    t = _target(db, "blind1")
    assert t["state"] == "degraded" and "no canonical metric was found" in t["reason"], t["reason"]
    cov = t["coverage"]
    assert cov["last_received"] == 0 and cov["arrived"] == [] and cov["missing"] == ["state", "counters", "optics"]
    assert all(cov["groups"][g]["reason"].startswith(f"{g}: ") for g in cov["missing"])
    for _ in range(2):
        _poll(db_url, ep)
    _cycle(db)
    alert = _gap_alert(db, "blind1")
    assert alert is not None and {e["feature"] for e in alert["evidence"]} == {"snmp:state", "snmp:counters",
                                                                              "snmp:optics"}


def test_samples_for_ports_not_in_the_inventory_are_counted_with_examples(db: Engine, db_url: str, sim: Peer,
                                                                          monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FW_COV_LEAF", "full")
    # Ethernet21 and 22 (the two with DOM) are missing from the inventory; the optic sits on Ethernet20
    ep = _load(db, _switch("leaf1", sim.port, "FW_COV_LEAF", PORTS[:20] + PORTS[22:], optics=("Ethernet20",)))["leaf1"]
    _poll(db_url, ep)
    t = _target(db, "leaf1")
    refused = t["coverage"]["rejected"]["not in the inventory"]
    # per port: 4 state, 8 counters (no FCS counter on this agent) + 4 DOM readings on each; 8 components
    assert refused["count"] == 2 * (4 + 8 + 4) + 8
    assert {"leaf1:Ethernet21", "leaf1:Ethernet22"} <= set(refused["examples"])
    # every optics sample the agent gave was refused: the group is missing, and the reason says why
    assert t["state"] == "degraded" and t["coverage"]["missing"] == ["optics"]
    assert t["reason"].startswith("optics: all 8 samples were refused: 8 not in the inventory (e.g. leaf1:Ethernet2"), \
        t["reason"]


def test_unknown_metrics_and_invalid_lanes_are_counted(db: Engine) -> None:
    ep = _load(db, _switch("leaf1", 1, "FW_COV_UNUSED", ["Ethernet1"], optics=("Ethernet1",)))["leaf1"]
    with db.connect() as conn:
        dev = conn.execute(text("SELECT id FROM devices WHERE name = 'leaf1'")).scalar_one()
    now = int(time.time() * 1000)
    samples = [Sample("port_oper_up", 1, now, "leaf1", "Ethernet1"), Sample("port_rx_bytes_total", 5, now, "leaf1",
                                                                           "Ethernet1"),
               Sample("optic_rx_power_dbm", -2.0, now, "leaf1", "Ethernet1", lane=0),
               Sample("optic_rx_power_dbm", -2.0, now, "leaf1", "Ethernet1", lane=5),   # a 10G-SR has one lane
               Sample("port_rx_bogus_total", 1, now, "leaf1", "Ethernet1")]
    store_collection(db, PendingStore(ep, dev, "snmp", ALL, now, CollectResult("leaf1/snmp", samples=samples)),
                     settings=load_settings())
    cov = _target(db, "leaf1")["coverage"]
    assert cov["rejected"]["unknown metric"] == {"count": 1, "examples": ["port_rx_bogus_total"]}
    assert cov["rejected"]["invalid lane"]["count"] == 1
    assert cov["rejected"]["invalid lane"]["examples"][0].startswith("leaf1:Ethernet1 lane 5: the port's optic has 1")
    assert cov["arrived"] == ["state", "counters", "optics"] and cov["last_accepted"] == 3


def test_a_switch_with_only_dacs_expects_no_optics(db: Engine) -> None:
    ep = _load(db, {**_switch("leaf1", 1, "FW_COV_UNUSED", ["Ethernet1", "Ethernet2"], optics=()),
                    "ports": [{"name": "Ethernet1", "optic": {"type": "400G-DAC"}}, {"name": "Ethernet2"}]})["leaf1"]
    with db.connect() as conn:
        dev = conn.execute(text("SELECT id FROM devices WHERE name = 'leaf1'")).scalar_one()
    now = int(time.time() * 1000)
    samples = [Sample("port_oper_up", 1, now, "leaf1", "Ethernet1"), Sample("port_rx_bytes_total", 5, now, "leaf1",
                                                                           "Ethernet1")]
    store_collection(db, PendingStore(ep, dev, "snmp", ALL, now, CollectResult("leaf1/snmp", samples=samples)),
                     settings=load_settings())
    t = _target(db, "leaf1")
    assert t["state"] == "ok" and t["coverage"]["expected"] == ["state", "counters"]


def _host(ethtool: Path) -> dict:
    return {"name": "gpu1", "kind": "host", "role": "host",
            "ports": [{"name": "ens1f0np0", "nic": "mlx5_0"}, {"name": "ens1f1np1", "nic": "mlx5_1"}],
            "endpoints": [{"protocol": "host", "sysfs_root": str(SYSFS), "ethtool": str(ethtool), "timeout_s": 5}]}


def test_a_host_nic_expects_pfc_counters(db: Engine, db_url: str, tmp_path: Path,
                                         monkeypatch: pytest.MonkeyPatch) -> None:
    """The host agent over a real sysfs tree, its `ethtool` a script printing a real mlx5 capture (PFC on
    priority 3) while FW_COV_PFC is set, and failing as a NIC without those statistics does otherwise."""
    ethtool = tmp_path / "ethtool"
    ethtool.write_text(f"#!/bin/sh\n[ \"$1\" = -S ] && [ \"$2\" = ens1f0np0 ] && [ -n \"$FW_COV_PFC\" ] && "
                       f"exec cat '{MLX5_S}'\necho 'Cannot get stats: Operation not supported' >&2\nexit 95\n")
    ethtool.chmod(0o755)
    monkeypatch.setenv("FW_COV_PFC", "1")
    ep = _load(db, _host(ethtool))["gpu1"]
    _poll(db_url, ep)
    t = _target(db, "gpu1")
    assert t["state"] == "ok", t["reason"]
    assert t["coverage"]["expected"] == ["state", "counters", "pfc"] == t["coverage"]["arrived"]
    assert t["coverage"]["groups"]["pfc"]["samples"] > 0
    monkeypatch.setenv("FW_COV_PFC", "")
    _poll(db_url, ep)
    t = _target(db, "gpu1")
    assert t["state"] == "degraded" and t["coverage"]["missing"] == ["pfc"]
    assert t["reason"] == "pfc: the target gave no PFC or pause counter", t["reason"]


def test_a_failing_target_alerts_after_n_polls(db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.snmp_peers import silent_udp_socket

    sock, port = silent_udp_socket()
    try:
        monkeypatch.setenv("FW_COV_GONE", "x")
        ep = _load(db, _switch("gone1", port, "FW_COV_GONE", ["Ethernet1"]))["gone1"]
        settings = load_settings(database_url=db_url)
        for _ in range(3):
            assert not run_collection(ep, ["state"], settings=settings)["ok"]
    finally:
        sock.close()
    t = _target(db, "gone1")
    assert t["state"] == "failing" and t["coverage"]["missing"] == ["state"]
    assert t["coverage"]["groups"]["state"]["reason"].startswith("state: the collection failed: snmp target")
    _cycle(db)
    alert = _gap_alert(db, "gone1")
    assert alert is not None and [e["feature"] for e in alert["evidence"]] == ["snmp:collection"]
    assert "no response" in alert["evidence"][0]["note"]


def test_a_stream_is_judged_by_its_sample_interval() -> None:
    """A gNMI stream stores every second what arrived: a second without optics is no gap; a group overdue by
    more than one sample interval is, and state (ON_CHANGE) is covered once it arrived in this stream."""
    clock = StreamClock(since_ms=1_000_000, interval_ms=10_000)
    s = lambda metric, t, **kw: Sample(metric, 1.0, t, "spine1", "Ethernet1", **kw)  # noqa: E731
    report = IngestReport()
    expected = ["state", "counters", "optics"]
    rec = assess(CollectResult("spine1/gnmi", samples=[s("port_oper_up", 1_000_500), s("port_rx_bytes_total",
                                                                                       1_000_500)]),
                 report, polled=ALL, expected=expected, previous=None, at_ms=1_000_500, stream=clock)
    assert rec["mode"] == "stream" and rec["groups"]["optics"]["missing_polls"] == 0   # not overdue yet
    rec = assess(CollectResult("spine1/gnmi", samples=[s("port_rx_bytes_total", 1_025_000)]), report,
                 polled=ALL, expected=expected, previous=rec, at_ms=1_025_000, stream=clock)
    assert rec["groups"]["state"]["missing_polls"] == 0   # given once in this stream
    assert rec["groups"]["optics"]["missing_polls"] == 1
    assert rec["groups"]["optics"]["reason"] == ("optics: the stream brought no transceiver (DOM) reading for 25 s "
                                                 "(sample interval 10 s)")
    restarted = StreamClock(since_ms=1_030_000, interval_ms=10_000)
    rec = assess(CollectResult("spine1/gnmi", samples=[s("port_rx_bytes_total", 1_055_000)]), report,
                 polled=ALL, expected=expected, previous=rec, at_ms=1_055_000, stream=restarted)
    assert rec["groups"]["state"]["missing_polls"] == 1   # not given since the stream restarted


def test_gap_polls_setting() -> None:
    assert load_settings().telemetry_gap_polls == 3
    assert load_settings(telemetry_gap_polls=5).telemetry_gap_polls == 5
    with pytest.raises(SettingsError, match="TELEMETRY_GAP_POLLS"):
        load_settings(telemetry_gap_polls=0)


def test_targets_filter_by_state_and_pod_and_the_summary_counts_the_whole_selection(
        db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from tests.snmp_peers import silent_udp_socket

    sock, port = silent_udp_socket()
    try:
        monkeypatch.setenv("FW_COV_GONE", "x")
        eps = _load(db, {**_switch("gone2", port, "FW_COV_GONE", ["Ethernet1"]), "pod": "pod-a"},
                    {**_switch("new2", port, "FW_COV_GONE", ["Ethernet1"]), "pod": "pod-a"},
                    {**_switch("new3", port, "FW_COV_GONE", ["Ethernet1"]), "pod": "pod-b"})
        assert not run_collection(eps["gone2"], ["state"], settings=load_settings(database_url=db_url))["ok"]
    finally:
        sock.close()
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as client:
        def names(**params: Any) -> tuple[list[str], dict[str, int]]:
            r = client.get("/api/v1/targets", params=params)
            assert r.status_code == 200, r.text
            return [t["device"] for t in r.json()["targets"]], r.json()["summary"]

        assert names(state="failing") == (["gone2"], {"failing": 1, "never_polled": 2})
        assert names(state=["failing", "never_polled"], pod="pod-a") == (["gone2", "new2"],
                                                                         {"failing": 1, "never_polled": 1})
        assert names(pod="pod-b") == (["new3"], {"never_polled": 1})
        assert names(state="ok") == ([], {"failing": 1, "never_polled": 2})
        bad = client.get("/api/v1/targets", params={"state": "down"})
        assert bad.status_code == 422 and "never_polled" in bad.text
