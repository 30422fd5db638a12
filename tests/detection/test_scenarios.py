"""Simulator scenarios (detection.md 4.2, S1-S12) fed straight into the engine: cause, end, action."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from service.detection.findings import Action, Cause
from tests.detection.simfeed import Feed

EXAMPLES = Path(__file__).resolve().parents[2] / "examples" / "scenarios"
H = 3_600_000
T0_MS = 1_735_689_600_000


def _spec(name: str) -> dict:
    spec = yaml.safe_load((EXAMPLES / name).read_text())
    for k in ("name", "start", "end", "step", "description"):
        spec.pop(k, None)
    return spec


def _fired(out: list) -> dict[tuple[str, str, str | None], list]:
    got: dict[tuple[str, str, str | None], list] = {}
    for f in out:
        if f.state == "firing":
            got.setdefault((f.kind, f.device, f.port), []).append(f)
    return got


def test_physical_faults_s1_s3_s4_s11() -> None:
    spec = {"seed": 11, "topology": {"shape": "rail-optimized", "hosts": 8, "hosts_per_leaf": 8, "spines": 2,
                                     "optics_mix": {"400G-DR4": 0.8, "400G-DAC": 0.2}},
            "faults": [
                {"type": "dirty_connector", "device": "leaf-p1-r0-01", "port": "Ethernet1/1", "lanes": [2],
                 "drop_db": 3.5, "at": "2h"},
                {"type": "damaged_fiber", "device": "leaf-p1-r2-01", "port": "Ethernet1/4", "lanes": [0, 1],
                 "drop_db": 3, "at": "2h"},
                {"type": "post_fec", "device": "host-p1-00002", "port": "eth5", "at": "2h"},
                {"type": "loose_transceiver", "device": "host-p1-00005", "port": "eth3", "at": "2h",
                 "bursts_per_hour": 6}]}
    out = Feed(spec).run(4 * 3600)
    got = _fired(out)
    s1 = got[("optical_degradation", "leaf-p1-r0-01", "Ethernet1/1")]
    assert {f.cause for f in s1} == {Cause.CONTAMINATION} and s1[0].action is Action.CLEAN and s1[0].end == "local"
    assert s1[0].at_ms - T0_MS <= 2 * H + 6 * 60_000  # within a few cycles of the onset
    s3 = got[("optical_degradation", "leaf-p1-r2-01", "Ethernet1/4")]
    assert sum(f.cause is Cause.FIBER for f in s3) >= 0.8 * len(s3) and s3[-1].action is Action.REPLACE_CABLE
    s11 = got[("post_fec_errors", "host-p1-00002", "eth5")]
    assert s11[0].at_ms - T0_MS <= 2 * H + 3 * 60_000 and s11[0].severity.value == "page"
    s4 = got[("loose_module", "host-p1-00005", "eth3")]
    assert s4[0].action is Action.RESEAT and s4[0].cause is Cause.LOOSE_MODULE
    assert all(f.at_ms >= 2 * H + T0_MS for fs in got.values() for f in fs)  # nothing before any onset
    faulty = {("leaf-p1-r0-01", "Ethernet1/1"), ("leaf-p1-r2-01", "Ethernet1/4"), ("host-p1-00002", "eth5"),
              ("host-p1-00005", "eth3")}
    assert {(d, p) for _, d, p in got} <= faulty


def test_storms_shared_component_and_congestion_confounders() -> None:
    """S5 flap storm vs single flaps, S6 line card, S7/S8 congestion, S9 pause storm, S10 slow host."""
    fd = Feed(_spec("congestion-and-storms.yaml"), step=10)
    out = fd.run(5.5 * 3600, cycle_steps=6)
    got = _fired(out)
    storm = got[("flap_storm", "leaf-p1-01", "Ethernet1/3")]
    assert abs(storm[0].at_ms - (T0_MS + 1 * H)) <= 2 * 60_000 and storm[0].action is Action.DISABLE_PORT
    # the isolated single flaps (leaf-p2-01 Ethernet1/2 at 30 m and 2 h 30 m) raise nothing
    assert not [f for fs in got.values() for f in fs if f.device == "leaf-p2-01" and f.at_ms - T0_MS < 4 * H]
    shared = got[("shared_component", "leaf-p2-01", None)]
    assert shared[0].at_ms - (T0_MS + 4 * H) <= 5 * 60_000 and len(shared[0].members) >= 3
    assert shared[0].action is Action.ESCALATE_DEVICE
    # one device ticket, not N link tickets: no other physical finding on that switch during the fault
    assert not [f for fs in got.values() for f in fs if f.device == "leaf-p2-01" and f.physical
                and f.kind != "shared_component" and 4 * H <= f.at_ms - T0_MS <= 5 * H]
    ps = got[("pause_storm", "host-p1-00002", "eth0")]
    assert abs(ps[0].at_ms - (T0_MS + 3 * H)) <= 2 * 60_000 and ps[0].cause is Cause.NIC_PAUSE_STORM
    assert {k[2] for k in got if k[0] == "host_side" and k[1] == "host-p2-00006"} == {"eth0", "eth1"}
    # congestion (S7 on host-p1-00004, S8 hotspot on leaf-p1-01's uplink) is labelled, never physical
    assert ("congestion", "host-p1-00004", "eth0") in got or any(k[1] == "host-p1-00004" for k in got)
    physical = {(d, p) for (k, d, p), fs in got.items() if fs[0].physical}
    assert physical == {("leaf-p1-01", "Ethernet1/3"), ("leaf-p2-01", None)}, physical


def test_decaying_laser_and_bias_rise_s2() -> None:
    spec = {"seed": 3, "topology": {"hosts": 4, "hosts_per_leaf": 4, "spines": 2, "optics_mix": {"400G-DR4": 1.0}},
            "faults": [{"type": "decaying_laser", "device": "host-p1-00002", "port": "eth1", "mode": "tx_decline",
                        "rate_db_per_day": 0.5, "at": "6h"},
                       {"type": "decaying_laser", "device": "host-p1-00003", "port": "eth2", "mode": "bias_rise",
                        "bias_pct_per_day": 5, "at": "6h"}]}
    fd = Feed(spec, step=600)
    out = fd.run(3.5 * 86400)
    got = _fired(out)
    tx = got[("optical_degradation", "host-p1-00002", "eth1")]  # the transmitter, seen from the peer's rx
    assert tx[0].cause is Cause.TX_WEAROUT and tx[0].end == "peer" and tx[0].action is Action.REPLACE_PEER
    assert tx[0].ttt_hours is not None and tx[0].ttt_hours >= 24  # predictive: well before low-warning
    bias = got[("bias_drift", "host-p1-00003", "eth2")]
    assert bias[0].cause is Cause.TX_WEAROUT and bias[0].action is Action.REPLACE_LOCAL
    # the forest may see the dying transmitter early (INFO, on that port only); nothing else is raised
    early = {k for k in got if k[0] == "anomaly"}
    assert {k[1:] for k in early} <= {("host-p1-00002", "eth1"), ("host-p1-00003", "eth2")}
    assert all(f.severity.value == "info" for k in early for f in got[k])
    assert set(got) - early == {("optical_degradation", "host-p1-00002", "eth1"),
                                ("bias_drift", "host-p1-00003", "eth2")}


@pytest.mark.parametrize("step", [60])
def test_telemetry_artefacts_s12_raise_nothing(step: int) -> None:
    """Counter reset, 32-bit wrap, saturation, missing polls, NaN runs, admin-down 0 mW, jitter."""
    fd = Feed(_spec("telemetry-artefacts.yaml"), step=step)
    assert fd.run(3 * 3600) == []
