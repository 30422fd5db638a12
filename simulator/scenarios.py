"""Fault scenarios (detection.md 4.2, S1-S12): the YAML file format, its validation, the fault
models that act on the telemetry model, and the ground truth they write.

A fault names where it acts (device, port, lanes; the end is implied by the type and
written out in the ground truth), when (``at``; ``until`` for bounded ones) and how hard.
Times are ISO-8601 instants or offsets from the run start ("90m", "6h", "2d", seconds).
"""

from __future__ import annotations

import math
import re
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated, Any, Literal

import numpy as np
import yaml
from pydantic import BaseModel, ConfigDict, Field, ValidationError, field_validator, model_validator

from service.telemetry.catalogue import METRICS
from simulator.telemetry import LMAX, Effects, FabricModel, FabricSim, Frame, Workload
from simulator.topology import TopologyParams, read_inventory

TimeSpec = str | float | int
_DUR_RE = re.compile(r"^\+?\s*(?:\d+(?:\.\d+)?\s*(?:ms|s|m|h|d|w)?\s*)+$")
_PART_RE = re.compile(r"(\d+(?:\.\d+)?)\s*(ms|s|m|h|d|w)?")
_UNIT = {"ms": 1e-3, "s": 1, "m": 60, "h": 3600, "d": 86400, "w": 604800, None: 1}


def parse_duration(v: TimeSpec) -> float:
    if isinstance(v, int | float):
        return float(v)
    if not _DUR_RE.match(v.strip()):
        raise ValueError(f"{v!r} is not a duration like '90s', '15m', '6h', '1h30m', '2d'")
    return sum(float(n) * _UNIT[u or None] for n, u in _PART_RE.findall(v))


def parse_time(v: TimeSpec, start: float | None = None) -> float:
    """An instant in Unix seconds: ISO-8601, or an offset from ``start``."""
    if isinstance(v, str) and ("T" in v or "-" in v[1:]) and not _DUR_RE.match(v.strip()):
        try:
            dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise ValueError(f"{v!r} is neither an ISO-8601 time nor an offset like '6h'") from None
        if dt.tzinfo is None:
            raise ValueError(f"{v!r} has no timezone; add 'Z' or an offset")
        return dt.timestamp()
    if isinstance(v, str) and not _DUR_RE.match(v.strip()):
        raise ValueError(f"{v!r} is neither an ISO-8601 time nor an offset like '6h' or '1h30m'")
    if start is None:
        raise ValueError(f"{v!r} is an offset, but there is no start time to add it to")
    return start + parse_duration(v)


class Strict(BaseModel):
    model_config = ConfigDict(extra="forbid")


def _check_time(v: TimeSpec | None) -> TimeSpec | None:
    if v is not None:
        parse_time(v, 0.0)
    return v


class FaultBase(Strict):
    id: str | None = None
    device: str
    port: str | None = None
    at: TimeSpec = 0
    until: TimeSpec | None = None
    note: str | None = None

    # ground-truth labels; subclasses override
    scenario: str = Field(default="", exclude=True)
    cause: str = Field(default="", exclude=True)
    action: str = Field(default="", exclude=True)
    alert: bool = Field(default=True, exclude=True)

    @field_validator("at", "until")
    @classmethod
    def _times(cls, v: TimeSpec | None) -> TimeSpec | None:
        return _check_time(v)

    # resolved at bind time
    def bind(self, m: FabricModel, start: float) -> None:
        self._t_on = parse_time(self.at, start)
        self._t_off = parse_time(self.until, start) if self.until is not None else math.inf
        if self._t_off <= self._t_on:
            raise ValueError(f"'until' ({self.until}) is not after 'at' ({self.at})")
        self._idx = self._ports(m)

    def _ports(self, m: FabricModel) -> np.ndarray:
        if self.port is None:
            raise ValueError(f"{self.type} needs 'port'")  # type: ignore[attr-defined]
        return np.asarray([m.port(self.device, self.port)])

    def active(self, t0: float, t1: float) -> bool:
        return t1 > self._t_on and t0 < self._t_off

    def overlap(self, t0: float, t1: float) -> float:
        return max(0.0, min(t1, self._t_off) - max(t0, self._t_on))

    def hard_failure(self, m: FabricModel) -> float | None:
        return None

    def truth(self, m: FabricModel) -> dict[str, Any]:
        i = int(self._idx[0]) if len(self._idx) else -1
        peer = int(m.peer[i]) if i >= 0 else -1
        hf = self.hard_failure(m)
        return {
            "id": self.id, "type": self.type, "scenario": self.scenario,  # type: ignore[attr-defined]
            "cause": self.cause, "action": self.action, "alert_expected": self.alert,
            "device": self.device, "port": self.port, "lanes": getattr(self, "lanes", None),
            "end": self.end, "ports": [f"{m.port_dev_name[j]}:{m.port_name[j]}" for j in self._idx],
            "peer": f"{m.port_dev_name[peer]}:{m.port_name[peer]}" if peer >= 0 else None,
            "onset": _iso(self._t_on), "onset_unix": self._t_on,
            "until": _iso(self._t_off) if math.isfinite(self._t_off) else None,
            "hard_failure": _iso(hf) if hf is not None else None, "hard_failure_unix": hf,
            "params": self.model_dump(exclude={"id", "type", "device", "port", "at", "until", "note"},
                                      exclude_none=True),
        }

    end: str = Field(default="rx", exclude=True)


def _iso(t: float) -> str:
    return datetime.fromtimestamp(t, tz=UTC).strftime("%Y-%m-%dT%H:%M:%S.%f")[:-3] + "Z"


Lanes = Annotated[list[Annotated[int, Field(ge=0, lt=LMAX)]], Field(min_length=1)]


def _lanes(m: FabricModel, i: int, lanes: list[int] | None, default: list[int]) -> list[int]:
    use = lanes if lanes is not None else default
    bad = [x for x in use if x >= m.lanes[i]]
    if bad:
        raise ValueError(f"lane(s) {bad} beyond the {int(m.lanes[i])} lanes of "
                         f"{m.port_dev_name[i]}:{m.port_name[i]}")
    return use


class DirtyConnector(FaultBase):
    """S1: Rx step at maintenance time on one lane (LC) or several (MPO); stable afterwards."""

    type: Literal["dirty_connector"]
    lanes: Lanes | None = None
    drop_db: float = Field(default=3.0, gt=0, le=20)
    scenario: str = Field(default="S1", exclude=True)
    cause: str = Field(default="physical-contamination", exclude=True)
    action: str = Field(default="clean connector", exclude=True)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        self.lanes = _lanes(m, int(self._idx[0]), self.lanes, [0])

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if t1 >= self._t_on and t1 < self._t_off:
            fx.rx_loss_db[self._idx[0], self.lanes] += self.drop_db


class DecayingLaser(FaultBase):
    """S2: the module at device:port transmits less (or needs more bias) each day, then a cliff."""

    type: Literal["decaying_laser"]
    lanes: Lanes | None = None
    mode: Literal["tx_decline", "bias_rise"] = "tx_decline"
    rate_db_per_day: float = Field(default=0.2, gt=0, le=5)
    bias_pct_per_day: float = Field(default=3.0, gt=0, le=50)
    plateau_days: float = Field(default=2.0, ge=0)
    scenario: str = Field(default="S2", exclude=True)
    cause: str = Field(default="physical-tx", exclude=True)
    action: str = Field(default="replace module (transmitting end)", exclude=True)
    end: str = Field(default="tx", exclude=True)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        i = int(self._idx[0])
        self.lanes = _lanes(m, i, self.lanes, list(range(int(m.lanes[i]))))
        self._fail = self._compute_failure(m)

    def _compute_failure(self, m: FabricModel) -> float:
        i = int(self._idx[0])
        if self.mode == "bias_rise":
            return self._t_on + (80.0 / self.bias_pct_per_day + self.plateau_days) * 86400
        # the link dies when the peer's pre-FEC BER passes 20x the FEC limit (or rx hits low alarm - 1 dB)
        p = int(m.peer[i])
        need_ber = (math.log10(20 * m.fec_limit[p]) - m.base_log_ber[p]) / m.ber_slope[p]
        rx_nom = (m.tx_nom[i] - m.loss[p])[self.lanes]
        need_alarm = float(np.min(rx_nom - (m.rx_low_alarm[p] - 1)))
        return self._t_on + min(need_ber, need_alarm) / self.rate_db_per_day * 86400

    def hard_failure(self, m: FabricModel) -> float | None:
        return self._fail

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if t1 < self._t_on:
            return
        i = self._idx[0]
        if t1 >= self._fail:
            fx.tx_delta_db[i, self.lanes] -= 60.0  # laser dead: dark
            return
        days = (t1 - self._t_on) / 86400
        if self.mode == "tx_decline":
            fx.tx_delta_db[i, self.lanes] -= self.rate_db_per_day * days
        else:
            fx.bias_mult[i, self.lanes] *= min(1 + self.bias_pct_per_day / 100 * days, 1.8)


class DamagedFiber(FaultBase):
    """S3: lane-specific loss with a temperature/handling wobble; follows the cable."""

    type: Literal["damaged_fiber"]
    lanes: Lanes | None = None
    drop_db: float = Field(default=3.0, gt=0, le=20)
    wobble_db: float = Field(default=1.0, ge=0, le=10)
    both_directions: bool = False
    scenario: str = Field(default="S3", exclude=True)
    cause: str = Field(default="physical-fiber", exclude=True)
    action: str = Field(default="replace cable", exclude=True)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        self.lanes = _lanes(m, int(self._idx[0]), self.lanes, [0])
        if self.both_directions:
            self.end = "both"

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if not (self._t_on <= t1 < self._t_off):
            return
        wob = self.wobble_db * (0.6 * math.sin(2 * math.pi * t1 / 86400) + 0.4 * rng.normal())
        loss = max(self.drop_db + wob, 0.0)
        i = self._idx[0]
        fx.rx_loss_db[i, self.lanes] += loss
        if self.both_directions:
            fx.rx_loss_db[m.peer[i], self.lanes] += loss


class LooseTransceiver(FaultBase):
    """S4: intermittent error bursts, link recoveries and some flaps; powers stay normal.

    The onset is the first burst (the module is knocked or starts to lose contact), so the
    ground truth's onset is observable; later bursts arrive at `bursts_per_hour`.
    """

    type: Literal["loose_transceiver"]
    bursts_per_hour: float = Field(default=3.0, gt=0, le=3600)
    flap_probability: float = Field(default=0.3, ge=0, le=1)
    scenario: str = Field(default="S4", exclude=True)
    cause: str = Field(default="flap-seating", exclude=True)
    action: str = Field(default="reseat or replace module", exclude=True)
    end: str = Field(default="module", exclude=True)

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        ov = self.overlap(t0, t1)
        if ov <= 0:
            return
        bursts = rng.poisson(self.bursts_per_hour * ov / 3600) + int(t0 <= self._t_on < t1)
        if bursts:
            i = self._idx[0]
            fx.recoveries[i] += bursts * rng.integers(1, 5)
            fx.ber_add_dec[i] += 2.0
            fx.flaps[i] += rng.binomial(bursts, self.flap_probability)


class FlapStorm(FaultBase):
    """S5: >= 5 flaps per 10 s for a while; the port may end error-disabled."""

    type: Literal["flap_storm"]
    duration: TimeSpec = "2m"
    flaps_per_10s: float = Field(default=6.0, ge=1, le=100)
    ends: Literal["up", "down"] = "up"
    scenario: str = Field(default="S5", exclude=True)
    cause: str = Field(default="flap", exclude=True)
    action: str = Field(default="disable port (capacity-checked)", exclude=True)
    end: str = Field(default="link", exclude=True)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        self._t_off = min(self._t_off, self._t_on + parse_duration(self.duration))

    def hard_failure(self, m: FabricModel) -> float | None:
        return self._t_off if self.ends == "down" else None

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        i = self._idx[0]
        ov = self.overlap(t0, t1)
        if ov > 0:
            fx.flaps[i] += round(ov / 10 * self.flaps_per_10s)
            fx.down[i] |= self._t_on <= t1 < self._t_off and rng.random() < 0.5
        if self.ends == "down" and t1 >= self._t_off:
            fx.down[i] = True


class SingleFlap(FaultBase):
    """S5 counterpart: isolated single flaps, hours apart. Must not alert."""

    type: Literal["single_flap"]
    count: int = Field(default=1, ge=1, le=1000)
    spacing: TimeSpec = "6h"
    scenario: str = Field(default="S5-benign", exclude=True)
    cause: str = Field(default="benign", exclude=True)
    action: str = Field(default="none", exclude=True)
    alert: bool = Field(default=False, exclude=True)
    end: str = Field(default="link", exclude=True)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        sp = parse_duration(self.spacing)
        self._times = [self._t_on + k * sp for k in range(self.count)]

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        fx.flaps[self._idx[0]] += sum(1 for x in self._times if t0 < x <= t1)


class LineCard(FaultBase):
    """S6: one component of a device: BER and flaps on many of its ports at the same moments."""

    type: Literal["line_card"]
    ports: list[str] | None = None
    fraction: float = Field(default=0.4, gt=0, le=1)
    ber_add_decades: float = Field(default=2.5, ge=0, le=10)
    flaps_per_hour: float = Field(default=2.0, ge=0)
    scenario: str = Field(default="S6", exclude=True)
    cause: str = Field(default="shared-component", exclude=True)
    action: str = Field(default="one device ticket: replace line card", exclude=True)
    end: str = Field(default="device", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        if self.ports:
            return np.asarray([m.port(self.device, p) for p in self.ports])
        allp = m.device_ports(self.device)
        return allp[: max(1, int(round(len(allp) * self.fraction)))]  # the first slot's ports

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        ov = self.overlap(t0, t1)
        if ov <= 0:
            return
        fx.ber_add_dec[self._idx] += self.ber_add_decades
        if rng.random() < self.flaps_per_hour * ov / 3600:  # one event hits every port at once
            fx.flaps[self._idx] += 1


def _host_nics(m: FabricModel, device: str, port: str | None) -> np.ndarray:
    idx = np.asarray([m.port(device, port)]) if port else m.device_ports(device)
    if not m.is_host[idx].all():
        raise ValueError(f"{device} is not a host")
    return idx


class Congestion(FaultBase):
    """S7: incast onto a host: ECN/CNP up, PFC pause duty <= 20 %, BER untouched."""

    type: Literal["congestion"]
    duration: TimeSpec = "30m"
    intensity: float = Field(default=1.0, gt=0, le=3)
    scenario: str = Field(default="S7", exclude=True)
    cause: str = Field(default="congestion", exclude=True)
    action: str = Field(default="none (congestion label only)", exclude=True)
    alert: bool = Field(default=False, exclude=True)
    end: str = Field(default="host", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        return _host_nics(m, self.device, self.port)

    def bind(self, m: FabricModel, start: float) -> None:
        super().bind(m, start)
        self._t_off = min(self._t_off, self._t_on + parse_duration(self.duration))

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        share = self.overlap(t0, t1) / max(t1 - t0, 1e-9)
        if share <= 0:
            return
        i, leaf = self._idx, m.peer[self._idx]
        fx.util_mult[leaf] *= 1 + 1.5 * share  # the leaf pushes the incast at line rate
        fx.ecn_frac_add[i] += 0.03 * self.intensity * share
        same_pod = np.flatnonzero(m.is_host & (m.port_pod == m.port_pod[i[0]]))
        fx.util_mult[same_pod] *= 1 + 0.2 * share  # the fan-in senders
        duty = np.minimum(0.08 * self.intensity * share * rng.uniform(0.5, 1.5, len(i)), 0.2)  # F30: <= 20 %
        fx.tx_pause_duty[i] = np.maximum(fx.tx_pause_duty[i], duty)


class EcmpHotspot(FaultBase):
    """S8: ECMP polarisation: a few uplinks of a switch run hot, with sustained ECN and PFC."""

    type: Literal["ecmp_hotspot"]
    ports: list[str] | None = None
    count: int = Field(default=2, ge=1)
    scenario: str = Field(default="S8", exclude=True)
    cause: str = Field(default="congestion-hotspot", exclude=True)
    action: str = Field(default="rebalance ECMP / add capacity; no drain", exclude=True)
    alert: bool = Field(default=False, exclude=True)
    end: str = Field(default="uplinks", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        if self.ports:
            return np.asarray([m.port(self.device, p) for p in self.ports])
        allp = m.device_ports(self.device)
        roles = np.asarray([m.dev_role[m.dev[m.peer[j]]] for j in allp])
        up = allp[np.isin(roles, ["spine", "core"])] if (np.isin(roles, ["spine", "core"])).any() else allp
        return up[: self.count]

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if not self.active(t0, t1):
            return
        both = np.concatenate([self._idx, m.peer[self._idx]])
        fx.util_mult[both] *= 2.5
        fx.ecn_frac_add[both] += 0.02
        fx.tx_pause_duty[both] = np.maximum(fx.tx_pause_duty[both], rng.uniform(0.08, 0.25, len(both)))


class PauseStorm(FaultBase):
    """S9: stuck NIC receiver: tx pause ~100 %, rx ~0, storm counters; pauses spread upstream."""

    type: Literal["pause_storm"]
    spread_hops: int = Field(default=2, ge=0, le=3)
    scenario: str = Field(default="S9", exclude=True)
    cause: str = Field(default="nic-stall", exclude=True)
    action: str = Field(default="isolate host (job-aware drain)", exclude=True)
    end: str = Field(default="host-nic", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        if self.port is None:
            raise ValueError("pause_storm needs 'port' (the stuck NIC)")
        return _host_nics(m, self.device, self.port)

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        ov = self.overlap(t0, t1)
        if ov <= 0:
            return
        share = ov / (t1 - t0)
        i = self._idx[0]
        fx.tx_pause_duty[i] = max(fx.tx_pause_duty[i], 0.99 * share)  # F24/F25: ~99 % of each 100-200 ms
        fx.rx_drain[i] = min(fx.rx_drain[i], 1 - 0.995 * share)
        fx.storm_warn[i] += max(1, round(ov / 5))  # the stall watchdog fires again and again
        fx.storm_err[i] += max(1, round(ov / 8))
        # the leaf, unable to drain towards the NIC, pauses its other ingress ports; then the next tier
        frontier, duty = {int(m.dev[m.peer[i]])}, 0.6
        seen = {int(m.dev[i])}
        for _ in range(self.spread_hops):
            nxt: set[int] = set()
            for d in frontier:
                ports = np.flatnonzero(m.dev == d)
                ports = ports[ports != m.peer[i]]
                fx.tx_pause_duty[ports] = np.maximum(fx.tx_pause_duty[ports], duty * share)
                nxt |= {int(m.dev[m.peer[p]]) for p in ports if not m.is_host[m.peer[p]]}
            seen |= frontier
            frontier, duty = nxt - seen, duty * 0.4


class SlowHost(FaultBase):
    """S10: PCIe downgrade: width/generation drop, sustained moderate tx pause, reduced rx."""

    type: Literal["slow_host"]
    gpus: list[int] | None = None
    pcie_width: int = Field(default=8, ge=1, le=16)
    pcie_generation: int = Field(default=4, ge=1, le=6)
    pause_duty: float = Field(default=0.3, ge=0, le=0.9)
    rx_factor: float = Field(default=0.5, gt=0, le=1)
    scenario: str = Field(default="S10", exclude=True)
    cause: str = Field(default="host", exclude=True)
    action: str = Field(default="host ticket (not network)", exclude=True)
    end: str = Field(default="host", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        idx = _host_nics(m, self.device, self.port)
        if self.gpus is not None:
            idx = idx[np.isin(m.gpu[idx], self.gpus)]
        return idx

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if not (self._t_on <= t1 < self._t_off):
            return
        g = np.isin(m.gpu_port, self._idx)
        fx.pcie_width[g] = self.pcie_width
        fx.pcie_gen[g] = self.pcie_generation
        fx.tx_pause_duty[self._idx] = np.maximum(
            fx.tx_pause_duty[self._idx], self.pause_duty * rng.uniform(0.8, 1.2, len(self._idx)))
        fx.rx_drain[self._idx] *= self.rx_factor


class PostFec(FaultBase):
    """S11: uncorrectable codewords at 1e-12..1e-9 post-FEC BER with normal Rx (electrical, DAC)."""

    type: Literal["post_fec"]
    post_fec_ber: float = Field(default=1e-10, gt=0, le=1e-3)
    scenario: str = Field(default="S11", exclude=True)
    cause: str = Field(default="physical-electrical", exclude=True)
    action: str = Field(default="replace cable (DAC) urgently", exclude=True)

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if self._t_on <= t1 < self._t_off:
            fx.post_fec_ber[self._idx] += self.post_fec_ber


class _Artefact(FaultBase):
    scenario: str = Field(default="S12", exclude=True)
    cause: str = Field(default="telemetry-artefact", exclude=True)
    action: str = Field(default="none", exclude=True)
    alert: bool = Field(default=False, exclude=True)
    end: str = Field(default="telemetry", exclude=True)

    def _ports(self, m: FabricModel) -> np.ndarray:
        return np.asarray([m.port(self.device, self.port)]) if self.port else m.device_ports(self.device)

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        return None

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        return None


class CounterReset(_Artefact):
    """Driver reload or reboot: every counter of the device (or port) restarts from 0."""

    type: Literal["counter_reset"]

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if t0 < self._t_on <= t1:
            fx.resets[self._idx] = True


def _counter_names(metrics: list[str] | None, default: list[str]) -> list[str]:
    names = metrics or default
    for n in names:
        if n not in METRICS or METRICS[n].kind != "counter":
            raise ValueError(f"{n!r} is not a canonical counter")
    return names


class CounterWrap(_Artefact):
    """32-bit (or other width) counters on a device/port: reported modulo 2**bits."""

    type: Literal["counter_wrap"]
    metrics: list[str] | None = None
    bits: int = Field(default=32, ge=8, le=63)

    def setup(self, sim: FabricSim) -> None:
        self._names = _counter_names(self.metrics, ["port_rx_packets_total", "port_tx_packets_total"])
        self._masks = {}
        for n in self._names:
            b = sim.block.get(n)
            if b is None:
                continue
            mask = np.isin(b.ports, self._idx)
            if b.counter_bits is None:
                b.counter_bits = np.zeros(len(b.ports), dtype=np.int64)
            b.counter_bits[mask] = self.bits
            self._masks[n] = mask

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        for n, mask in self._masks.items():
            v = frame.values[n]
            frame.values[n] = np.where(mask, np.mod(v, 2**self.bits), v)


class Saturate(_Artefact):
    """Counters that stick at their maximum (IB PMA style)."""

    type: Literal["saturate"]
    metrics: list[str] | None = None
    bits: int = Field(default=16, ge=4, le=63)

    def setup(self, sim: FabricSim) -> None:
        self._names = _counter_names(self.metrics, ["port_symbol_errors_total",
                                                    "port_link_error_recovery_total"])
        self._masks = {}
        for n in self._names:
            b = sim.block.get(n)
            if b is None:
                continue
            mask = np.isin(b.ports, self._idx)
            if b.saturating is None:
                b.saturating = np.zeros(len(b.ports), dtype=bool)
            if b.counter_bits is None:
                b.counter_bits = np.zeros(len(b.ports), dtype=np.int64)
            b.saturating[mask] = True
            b.counter_bits[mask] = self.bits
            self._masks[n] = mask

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        for n, mask in self._masks.items():
            v = frame.values[n]
            frame.values[n] = np.where(mask, np.minimum(v, 2**self.bits - 1), v)


class Missing(_Artefact):
    """Polls that returned nothing: the series of a device/port are absent for a while."""

    type: Literal["missing"]
    fraction: float = Field(default=1.0, gt=0, le=1)

    def setup(self, sim: FabricSim) -> None:
        self._sim = sim

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        if not (self._t_on <= frame.t < self._t_off) or rng.random() > self.fraction:
            return
        for b in self._sim.blocks:
            hit = np.isin(b.gpu_dev, m.dev[self._idx]) if b.gpu is not None else np.isin(b.ports, self._idx)
            keep = frame.keep.get(b.metric)
            frame.keep[b.metric] = ~hit if keep is None else keep & ~hit


class NanRun(_Artefact):
    """A run of NaN readings (garbled DOM reads)."""

    type: Literal["nan_run"]
    metrics: list[str] = Field(default_factory=lambda: ["optic_rx_power_dbm", "optic_tx_power_dbm"])

    def setup(self, sim: FabricSim) -> None:
        for n in self.metrics:
            if n not in METRICS:
                raise ValueError(f"{n!r} is not a canonical metric")
        self._sim = sim

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        if not (self._t_on <= frame.t < self._t_off):
            return
        for n in self.metrics:
            b = self._sim.block.get(n)
            if b is not None:
                frame.values[n] = np.where(np.isin(b.ports, self._idx), np.nan, frame.values[n])


class AdminDown(_Artefact):
    """An administratively disabled port: reads 0 mW (-40 dBm), oper down, counters frozen."""

    type: Literal["admin_down"]

    def apply(self, m: FabricModel, fx: Effects, t0: float, t1: float, rng: np.random.Generator) -> None:
        if self._t_on <= t1 < self._t_off:
            fx.admin_down[self._idx] = True


FaultSpec = Annotated[
    DirtyConnector | DecayingLaser | DamagedFiber | LooseTransceiver | FlapStorm | SingleFlap | LineCard
    | Congestion | EcmpHotspot | PauseStorm | SlowHost | PostFec | CounterReset | CounterWrap | Saturate
    | Missing | NanRun | AdminDown,
    Field(discriminator="type"),
]
FAULT_TYPES = [c.model_fields["type"].annotation.__args__[0]  # type: ignore[union-attr]
               for c in FaultSpec.__origin__.__args__]  # type: ignore[attr-defined]


class WorkloadSpec(Strict):
    period: TimeSpec = "5m"
    burst_duty: float = Field(default=0.35, ge=0, le=1)
    burst_util: float = Field(default=0.85, ge=0, le=1)
    compute_util: float = Field(default=0.06, ge=0, le=1)
    alltoall_every: int = Field(default=4, ge=0)
    idle_hours_per_day: float = Field(default=1.0, ge=0, le=24)

    def to_model(self) -> Workload:
        return Workload(parse_duration(self.period), self.burst_duty, self.burst_util, self.compute_util,
                        self.alltoall_every, self.idle_hours_per_day)


class RandomMissing:
    """Fleet-wide poll failures: each device misses a step with a given probability."""

    def __init__(self, fraction: float) -> None:
        self.fraction = fraction

    def setup(self, sim: FabricSim) -> None:
        self._sim = sim

    def report(self, m: FabricModel, frame: Frame, rng: np.random.Generator) -> None:
        lost = rng.random(len(m.dev_names)) < self.fraction
        if not lost.any():
            return
        for b in self._sim.blocks:
            devs = b.gpu_dev if b.gpu is not None else m.dev[b.ports]
            keep = frame.keep.get(b.metric)
            frame.keep[b.metric] = ~lost[devs] if keep is None else keep & ~lost[devs]


class ArtefactSpec(Strict):
    jitter_ms: int = Field(default=0, ge=0, le=30000)
    missing_fraction: float = Field(default=0.0, ge=0, le=0.5)


class Scenario(Strict):
    """A scenario file: the fabric, the workload, the faults, and default time range."""

    name: str
    description: str | None = None
    seed: int = 0
    topology: TopologyParams | None = None
    inventory: str | None = None
    start: TimeSpec | None = None
    end: TimeSpec | None = None
    step: TimeSpec | None = None
    groups: list[Literal["state", "traffic", "errors", "phy", "pfc", "congestion", "optics", "gpu"]] | None \
        = None
    workload: WorkloadSpec = Field(default_factory=WorkloadSpec)
    artefacts: ArtefactSpec = Field(default_factory=ArtefactSpec)
    faults: list[FaultSpec] = Field(default_factory=list)

    @model_validator(mode="after")
    def _source(self) -> Scenario:
        if self.topology is not None and self.inventory is not None:
            raise ValueError("give 'topology' or 'inventory', not both")
        ids = [f.id for f in self.faults if f.id]
        dup = sorted({i for i in ids if ids.count(i) > 1})
        if dup:
            raise ValueError(f"fault ids repeat: {', '.join(dup)}")
        return self

    _base_dir: Path = Path(".")

    def inventory_source(self) -> Any:
        if self.inventory is not None:
            return read_inventory(self._base_dir / self.inventory)
        return self.topology or TopologyParams(seed=self.seed)

    def bind(self, m: FabricModel, start: float) -> tuple[list[Any], list[Any]]:
        """Resolve every fault against the fabric; errors name the fault by its index."""
        for k, f in enumerate(self.faults):
            if f.id is None:
                f.id = f"{f.type}-{k}"
            try:
                f.bind(m, start)
            except (KeyError, ValueError) as exc:
                msg = exc.args[0] if exc.args else str(exc)
                raise ScenarioError(str(self._base_dir / "<scenario>") if not hasattr(self, "_file")
                                    else self._file, f"faults.{k}", msg, getattr(self, "_lines", {})
                                    .get(("faults", k))) from None
        arts: list[Any] = [f for f in self.faults if isinstance(f, _Artefact)]
        if self.artefacts.missing_fraction:
            arts.append(RandomMissing(self.artefacts.missing_fraction))
        return list(self.faults), arts

    def ground_truth(self, m: FabricModel) -> list[dict[str, Any]]:
        return [f.truth(m) for f in self.faults]


class ScenarioError(ValueError):
    """A bad scenario file: which file, which field path, why, and the line when known."""

    def __init__(self, file: str, path: str, reason: str, line: int | None = None) -> None:
        self.file, self.path, self.reason, self.line = file, path, reason, line
        where = f"{file}:{line}" if line else file
        super().__init__(f"{where}: {path}: {reason}")


def _node_lines(node: yaml.Node, path: tuple = ()) -> dict[tuple, int]:
    """Map each field path to its 1-based line, from the YAML node marks."""
    out = {path: node.start_mark.line + 1}
    if isinstance(node, yaml.MappingNode):
        for k, v in node.value:
            out.update(_node_lines(v, (*path, k.value)))
            out[(*path, k.value)] = k.start_mark.line + 1
    elif isinstance(node, yaml.SequenceNode):
        for i, v in enumerate(node.value):
            out.update(_node_lines(v, (*path, i)))
    return out


def _line_for(lines: dict[tuple, int], loc: tuple) -> tuple[tuple, int | None]:
    """Drop the union tags pydantic adds to a location and find the deepest known line."""
    clean = tuple(x for x in loc if not (isinstance(x, str) and x in FAULT_TYPES
                                         and len(loc) > 2 and loc[0] == "faults"))
    for n in range(len(clean), -1, -1):
        if clean[:n] in lines:
            return clean, lines[clean[:n]]
    return clean, None


def load_scenario(path: str | Path) -> Scenario:
    """Read and validate a scenario file; raise ScenarioError naming file, field path, line and reason."""
    path = Path(path)
    text = path.read_text()
    try:
        node = yaml.compose(text, Loader=yaml.SafeLoader)
        data = yaml.safe_load(text)
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        raise ScenarioError(str(path), "<yaml>", str(getattr(exc, "problem", exc)),
                            mark.line + 1 if mark else None) from None
    if not isinstance(data, dict):
        raise ScenarioError(str(path), "<root>", "a scenario file is a mapping (name, topology, faults, ...)", 1)
    lines = _node_lines(node) if node is not None else {}
    try:
        sc = Scenario.model_validate(data)
    except ValidationError as exc:
        err = exc.errors()[0]
        loc, line = _line_for(lines, tuple(err["loc"]))
        reason = err["msg"]
        if len(exc.errors()) > 1:
            reason += f" (and {len(exc.errors()) - 1} more error(s))"
        raise ScenarioError(str(path), ".".join(str(x) for x in loc) or "<root>", reason, line) from None
    sc._base_dir = path.parent
    sc._file = str(path)  # type: ignore[attr-defined]
    sc._lines = lines  # type: ignore[attr-defined]
    return sc
