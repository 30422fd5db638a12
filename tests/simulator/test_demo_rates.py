"""The demo's own data is physically possible: no rate above line rate, no pause share above 100 %.

The demo's fabric (simulator/data/demo.yaml) runs data time faster than the clock, while the
collectors stamp samples with the clock. Each test polls every device through the inventory
endpoints with the REAL collectors, as the worker does (SNMP leaves, gNMI spines, hosts through
the ethtool shim), and checks every counter-derived rate between two polls of a series.
"""

from __future__ import annotations

import subprocess
import time
from collections.abc import Iterator
from dataclasses import dataclass
from pathlib import Path

import pytest

import collectors.gnmi  # each registers its collector
import collectors.host
import collectors.snmp  # noqa: F401
from collectors.base import Target, get_collector
from service.demo import DEMO_SCENARIO
from service.inventory.secrets import target_for
from service.telemetry.samples import Sample
from simulator.ramp import Ramp, clock
from simulator.serve import COMMUNITY_ENV, LiveFabric, serve_fabric
from simulator.topology import read_inventory

pytestmark = pytest.mark.slow

T0 = 1_735_689_600.0  # 2025-01-01T00:00:00Z
BYTES = ("port_rx_bytes_total", "port_tx_bytes_total")
PAUSE = ("port_pfc_rx_pause_seconds_total", "port_pfc_tx_pause_seconds_total")


@dataclass
class Poll:
    protocol: str
    start_ms: int  # the collector's stamp
    end_ms: int  # every read happened between start_ms and end_ms
    samples: list[Sample]


def demo_targets(fab: LiveFabric) -> list[tuple[str, Target]]:
    """One target per inventory endpoint, shaped as the worker shapes it (collectors/tasks.py)."""
    out = []
    for dev in read_inventory(fab.inventory_path).devices:
        for ep in dev.endpoints:
            t = target_for(ep, dev.name)
            if ep.protocol == "host":
                t = t.model_copy(update={"params": {**t.params, "interfaces": [p.name for p in dev.ports],
                                                     "nic_ports": {p.nic: p.name for p in dev.ports if p.nic}}})
            out.append((ep.protocol, t))
    return out


def poll_all(targets: list[tuple[str, Target]], stamp_ms: int | None = None) -> list[Poll]:
    """Poll every target once, stamped now (as the worker does) or with `stamp_ms`; failed polls left out."""
    polls = []
    for protocol, target in targets:
        start = stamp_ms if stamp_ms is not None else int(time.time() * 1000)
        r = get_collector(protocol)(target, now_ms=start)
        if r.ok:
            polls.append(Poll(protocol, start, int(time.time() * 1000) if stamp_ms is None else start, r.samples))
    return polls


@dataclass
class Rate:
    share: float  # of line rate (bytes) or of the time (pause)
    metric: str
    device: str
    port: str
    protocol: str


def rates(rounds: list[list[Poll]], speed_bps: dict[tuple[str, str], float], *, window: str) -> list[Rate]:
    """Every rate between consecutive polls of a series, largest first.

    window "polls": over the polls' stamps; "stamps": over the samples' own stamps (what the service
    computes); "reads": over the longest time two reads can be apart (first poll's start to second's end).
    """
    last: dict[tuple, tuple[float, float]] = {}
    out = []
    for polls in rounds:
        for poll in polls:
            for s in poll.samples:
                if s.metric not in BYTES + PAUSE:
                    continue
                key = (s.metric, s.device, s.port, s.priority)
                end = {"polls": poll.start_ms, "stamps": s.ts_ms, "reads": poll.end_ms}[window]
                if key in last and s.value >= last[key][1]:
                    t0, v0 = last[key]
                    seconds = (end - t0) / 1000
                    assert seconds > 0, (key, end, t0)
                    per_s = (s.value - v0) / seconds
                    share = per_s * 8 / speed_bps[(s.device, s.port)] if s.metric in BYTES else per_s
                    out.append(Rate(share, s.metric, s.device, s.port or "", poll.protocol))
                last[key] = (s.ts_ms if window == "stamps" else poll.start_ms, s.value)
    return sorted(out, key=lambda r: -r.share)


def speeds(fab: LiveFabric) -> dict[tuple[str, str], float]:
    return {(v.device, v.port): v.speed_bps for v in fab.views}


@pytest.fixture
def community(monkeypatch: pytest.MonkeyPatch) -> Iterator[None]:
    monkeypatch.setenv(COMMUNITY_ENV, "fabricwatch-sim")
    yield


@pytest.mark.serial
def test_each_step_carries_its_wall_seconds_of_traffic(tmp_path: Path, community: None) -> None:
    """Stepped by hand at the demo's speedup: a step of D data seconds stands for D / 10 wall seconds.

    Stamping each poll with that wall time, every rate must stay within the line rate, every pause
    share within 100 %, through the storm (15m), the flaps (18m) and the incast (10m-30m).
    """
    speedup, step = 10.0, 50.0  # the demo's speedup; 50 data s = its 5 s poll interval
    with serve_fabric(DEMO_SCENARIO, start=T0, speedup=speedup, base_dir=tmp_path, tick_s=None) as fab:
        targets = demo_targets(fab)
        assert {p for p, _ in targets} == {"snmp", "gnmi", "host"}
        fab.advance(14 * 60)
        wall_ms = 1_000_000
        rounds = [poll_all(targets, wall_ms)]
        for _ in range(6):
            fab.advance(step)
            wall_ms += int(step / speedup * 1000)
            rounds.append(poll_all(targets, wall_ms))
        found = rates(rounds, speeds(fab), window="polls")
    assert all(len(r) == len(targets) for r in rounds), [len(r) for r in rounds]
    util = [r for r in found if r.metric in BYTES]
    pause = [r for r in found if r.metric in PAUSE]
    assert util[0].share <= 1.0, util[:5]
    assert pause[0].share <= 1.0, pause[:5]
    # not vacuous: the incast fills a link, and the stuck NIC pauses nearly all the time
    assert util[0].share > 0.9 and pause[0].share > 0.9, (util[:3], pause[:3])
    assert {r.protocol for r in util} == {"snmp", "gnmi", "host"}


@pytest.mark.serial
def test_live_clock_rates_stay_physical(tmp_path: Path, community: None) -> None:
    """The running clock (as in the demo, sped up to pass the faults quickly), polled as the worker polls.

    gNMI samples carry the time the target read its counters, so there the rate over the stamps must
    stay within line rate exactly. SNMP samples are stamped when the agent answered and host samples when
    the poll starts, while the served counters move in ticks; for them the counters can't have grown by
    more than the line rate carries between the first poll's start and the second poll's end.
    """
    with serve_fabric(DEMO_SCENARIO, start=T0, speedup=90, base_dir=tmp_path, tick_s=0.5,
                      host_root=tmp_path / "hosts") as fab:
        targets = demo_targets(fab)
        rounds = []
        deadline = time.monotonic() + 22  # 33 data minutes: post-FEC, incast, storm (at 10 s), flaps
        while time.monotonic() < deadline:
            rounds.append(poll_all(targets))
        bps = speeds(fab)
    assert len(rounds) >= 4 and sum(map(len, rounds)) >= 0.8 * len(rounds) * len(targets), [len(r) for r in rounds]
    stamped = rates(rounds, bps, window="stamps")
    gnmi = [r for r in stamped if r.protocol == "gnmi"]
    assert gnmi and gnmi[0].share <= 1.0, gnmi[:5]
    assert gnmi[0].share > 0.2, gnmi[:3]  # the uplinks carry the job's bursts (~1/3 of the time at 85 %)
    reads = rates(rounds, bps, window="reads")
    assert reads[0].share <= 1.0, reads[:5]
    storm = [r for r in reads if r.metric in PAUSE and r.device == "host-p1-00003" and r.port == "eth0"]
    assert storm and storm[0].share > 0.5, storm[:3]


@pytest.mark.serial
def test_counters_grow_with_the_clock_between_steps(tmp_path: Path) -> None:
    """Between steps (1 s apart) the served counters keep growing, read through the ethtool shim."""
    with serve_fabric(DEMO_SCENARIO, start=T0, speedup=10, base_dir=tmp_path, tick_s=1.0, snmp=False,
                      gnmi=False, host_root=tmp_path / "hosts") as fab:
        time.sleep(3.5)
        host = fab.hosts[0]
        shim = fab.host_dirs[host] / "bin" / "ethtool"
        reads = []
        for _ in range(8):
            t0 = clock()
            out = subprocess.run([str(shim), "-S", "eth0"], capture_output=True, text=True, check=True).stdout
            ramp = fab.view(host, "eth0").counter("port_tx_bytes_total")
            t1 = clock()
            served = int(next(ln for ln in out.splitlines() if "tx_bytes_phy" in ln).split(":")[1])
            reads.append(served)
            assert isinstance(ramp, Ramp)
            assert ramp.at(t0 - 0.01) <= served <= ramp.at(t1 + 0.01), (ramp, served, t0, t1)  # to the centisecond
            time.sleep(0.15)
    # eight reads over ~1.5 s: a counter that moved once a step would repeat most of them (a step late
    # on a loaded machine may leave a short flat stretch, never a drop)
    rises = [b > a for a, b in zip(reads, reads[1:], strict=False)]
    assert sum(rises) >= 5 and all(b >= a for a, b in zip(reads, reads[1:], strict=False)), reads
