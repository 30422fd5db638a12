"""A fault bed for cadence and missing-input tests: one recorded fabric with a fault of every class.

One simulated fabric (16 hosts x 4 NICs, 4 leaves, 2 spines: 72 links, 1 % missing polls, +-400 ms jitter) carries
one fault of each class on its own links, from 45 min; it is recorded once at 10 s and replayed with counters
(and port state, FEC, pause, PCIe) every {10 s, 60 s, 5 min} and optics (DOM) every {60 s, 5 min, 15 min}, with
cycles every 60 s, every counter poll and every optics poll (tests/detection/test_cadence.py), or with an input
left out (test_inputs.py).
"""

from __future__ import annotations

from typing import Any

import numpy as np

from service.detection.findings import Finding
from tests.detection.simfeed import T0, Batch, Recording

TOPO = {"shape": "two-tier", "hosts": 16, "pods": 2, "nics_per_host": 4, "gpus_per_host": 4, "hosts_per_leaf": 16,
        "spines": 2, "optics_mix": {"400G-DR4": 0.8, "400G-FR4": 0.2, "800G-DR8": 1.0}}
ON_S = 45 * 60
END_S = 135 * 60
FAULTS: list[dict[str, Any]] = [
    {"id": "contamination", "type": "dirty_connector", "device": "leaf-p1-01", "port": "Ethernet1/1", "lanes": [1],
     "drop_db": 3.6, "at": "45m"},  # the 3.6 dB single-lane step
    {"id": "fiber", "type": "damaged_fiber", "device": "leaf-p1-01", "port": "Ethernet1/9", "lanes": [0, 1],
     "drop_db": 3.0, "wobble_db": 1.0, "at": "45m"},
    {"id": "loose", "type": "loose_transceiver", "device": "host-p1-00005", "port": "eth0", "bursts_per_hour": 6,
     "at": "45m"},
    {"id": "storm", "type": "flap_storm", "device": "leaf-p1-02", "port": "Ethernet1/5", "duration": "2m",
     "flaps_per_10s": 6, "at": "45m"},
    {"id": "post_fec", "type": "post_fec", "device": "host-p1-00007", "port": "eth0", "post_fec_ber": 1e-10,
     "at": "45m"},
    {"id": "line_card", "type": "line_card", "device": "leaf-p2-01", "fraction": 0.4, "at": "45m", "until": "105m"},
    {"id": "down", "type": "flap_storm", "device": "leaf-p2-02", "port": "Ethernet1/1", "duration": "10s",
     "flaps_per_10s": 1, "ends": "down", "at": "45m"},
    {"id": "pause", "type": "pause_storm", "device": "host-p2-00014", "port": "eth0", "at": "45m", "until": "65m"},
    {"id": "host", "type": "slow_host", "device": "host-p2-00016", "gpus": [0, 1], "at": "45m"},
]
SPEC = {"seed": 7, "topology": TOPO, "artefacts": {"missing_fraction": 0.01, "jitter_ms": 400}, "faults": FAULTS}
TX_FAULT = ("host-p1-00002", "eth0")  # a transmitter wearing out at 4 dB/h (overlaid on the recording, below)
# fault -> (expected cause, the device, the port (None: the device))
EXPECT: dict[str, tuple[str, str, str | None]] = {
    "contamination": ("connector_contamination", "leaf-p1-01", "Ethernet1/1"),
    "tx_wearout": ("transmitter_wearout", *TX_FAULT),
    "fiber": ("fiber_damage", "leaf-p1-01", "Ethernet1/9"),
    "loose": ("loose_module", "host-p1-00005", "eth0"),
    "storm": ("flap_storm", "leaf-p1-02", "Ethernet1/5"),
    "post_fec": ("post_fec_errors", "host-p1-00007", "eth0"),
    "line_card": ("shared_component", "leaf-p2-01", None),
    "down": ("link_down", "leaf-p2-02", "Ethernet1/1"),
    "pause": ("nic_pause_storm", "host-p2-00014", "eth0"),
    "host": ("host_side", "host-p2-00016", None),
}
COUNTERS_S = (10, 60, 300)
OPTICS_S = (60, 300, 900)


def tx_wearout(t: float, b: Batch, rec: Recording) -> None:
    """The far laser of leaf-p1-01:Ethernet1/5 fades 4 dB/h from the onset: its tx and that receiver's rx."""
    if t - T0 < ON_S:
        return
    fab = rec.fabric
    p = rec.port(*TX_FAULT)
    q = int(fab.peer[p])
    drop = min(4.0 * (t - T0 - ON_S) / 3600, 5.0)
    for m, x in (("optic_tx_power_dbm", p), ("optic_rx_power_dbm", q)):
        if m in b:
            idx, ts, v = b[m]
            lanes = np.arange(fab.lane_off[x], fab.lane_off[x + 1])
            b[m] = (idx, ts, np.where(np.isin(idx, lanes), v - drop, v))


def record() -> Recording:
    return Recording(SPEC, END_S, overlay=tx_wearout)


def ends_of(rec: Recording, dev: str, port: str | None) -> set[tuple[str, str | None]]:
    """The entities a finding of this fault may name: the port and its link's far end, or a device and its links."""
    fab = rec.fabric
    if port is not None:
        p = rec.port(dev, port)
        q = int(fab.peer[p])
        return {(dev, port), (fab.dev_names[fab.dev[q]], fab.port_names[q])}
    ports = np.flatnonzero(np.asarray(fab.dev_names)[fab.dev] == dev)
    out: set[tuple[str, str | None]] = {(dev, None)}
    for p in ports.tolist():
        out.add((dev, fab.port_names[p]))
        q = int(fab.peer[p])
        if q >= 0:
            out.add((fab.dev_names[fab.dev[q]], fab.port_names[q]))
    return out


def matches(f: Finding, ends: set[tuple[str, str | None]]) -> bool:
    return (f.device, f.port) in ends or (f.peer_device, f.peer_port) in ends


def verdict(rec: Recording, out: list[Finding]) -> tuple[dict[str, Any], list[str]]:
    """Per fault: the cause of the first alert that names it (the alert's cause at the end: an open alert's cause
    is refreshed as its finding's is), None if missed; and the ticket/page findings that name no fault."""
    alarms = [f for f in out if f.state == "firing" and f.severity.value != "info"]
    final = {f.fingerprint: f.cause.value for f in out}  # the newest finding per fingerprint
    got: dict[str, Any] = {}
    named: set[int] = set()
    for fault, (cause, dev, port) in EXPECT.items():
        ends = ends_of(rec, dev, port)
        hits = [f for f in alarms if matches(f, ends)]
        named |= {id(f) for f in hits}
        if not hits:
            got[fault] = None
            continue
        first = min(f.at_ms for f in hits)
        causes = {final[f.fingerprint] for f in hits if f.at_ms == first}
        got[fault] = cause if cause in causes else sorted(causes)
        assert first >= (T0 + ON_S) * 1000, f"{fault} alerted before its onset"
    stray = sorted({f"{f.kind} {f.device}:{f.port} {f.cause.value}" for f in alarms if id(f) not in named})
    return got, stray


WANT = {fault: cause for fault, (cause, *_) in EXPECT.items()}
