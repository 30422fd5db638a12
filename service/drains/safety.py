"""The safety verdict: may this drain go ahead, given the topology, what is already down or drained,
and how many drains the fleet has recently had? Pure functions over the in-memory graph.

Constraints (docs/drains.md):
- circuit_breaker: at most `breaker_max` drains recommended per `breaker_window_s`; once tripped,
  nothing is recommended until an attributed reset (Cluster API maxUnhealthy, NVSentinel).
- pod_concurrency: at most `max_per_pod` active drains per pod.
- uplink_floor: every switch keeps max(ceil(fraction * uplinks), min) healthy uplinks (CorrOpt).
- rail_host_path: never the last healthy path of a host NIC to its rail, unless the host is drained.
- rail_uplinks: the leaves of a rail in a pod keep at least `rail_min_uplinks` healthy uplinks.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import datetime

from service.drains.schemas import Check, DrainSettings, Verdict
from service.drains.topology import Graph


@dataclass(frozen=True)
class Effect:
    """What a drain takes out of service."""

    link_ids: frozenset[int] = frozenset()
    host_ids: frozenset[int] = frozenset()
    switch_ids: frozenset[int] = frozenset()   # a whole switch: its own uplink floor no longer applies
    pod: str = ""


@dataclass
class FleetState:
    """What is already out: links down or drained, hosts drained, active drains per pod, breaker."""

    unavailable: set[int] = field(default_factory=set)
    drained_hosts: set[int] = field(default_factory=set)
    drained_switches: set[int] = field(default_factory=set)
    active_by_pod: Counter[str] = field(default_factory=Counter)
    breaker_tripped: bool = False
    breaker_reason: str | None = None
    recommended_in_window: int = 0


def _floor(total: int, s: DrainSettings) -> int:
    # 1e-9: 0.75 * 8 must be 6, not 7 after float rounding.
    return min(total, max(math.ceil(s.uplink_floor_fraction * total - 1e-9), s.uplink_floor_min))


def _check_breaker(state: FleetState, s: DrainSettings) -> Check:
    numbers = {"recommended": state.recommended_in_window, "limit": s.breaker_max, "window_s": s.breaker_window_s}
    if state.breaker_tripped:
        return Check(constraint="circuit_breaker", ok=False, subject="fleet", numbers=numbers,
                     message=f"circuit breaker is tripped ({state.breaker_reason or 'no reason recorded'}); "
                             "reset it with POST /api/v1/drains/breaker/reset")
    ok = state.recommended_in_window < s.breaker_max
    return Check(constraint="circuit_breaker", ok=ok, subject="fleet", numbers=numbers,
                 message=(f"{state.recommended_in_window} drains recommended in the last {s.breaker_window_s:g} s, "
                          f"limit is {s.breaker_max}" + ("" if ok else "; the breaker trips")))


def _check_pod(effect: Effect, state: FleetState, s: DrainSettings) -> Check:
    active = state.active_by_pod.get(effect.pod, 0)
    would = active + 1
    return Check(constraint="pod_concurrency", ok=would <= s.max_per_pod, subject=effect.pod,
                 numbers={"active": active, "would_be": would, "maximum": s.max_per_pod},
                 message=f"pod {effect.pod} would have {would} concurrent drains, maximum is {s.max_per_pod}")


def _check_uplinks(g: Graph, effect: Effect, out_links: set[int], s: DrainSettings) -> list[Check]:
    checks = []
    touched = {g.links[lid].lo.device_id for lid in effect.link_ids}
    for sw in sorted(touched - effect.switch_ids):
        ups = g.uplinks.get(sw, [])
        if not ups or not set(ups) & effect.link_ids:
            continue
        total, floor = len(ups), _floor(len(ups), s)
        keep = sum(1 for lid in ups if lid not in out_links)
        already = sum(1 for lid in ups if lid in out_links and lid not in effect.link_ids)
        name = g.devices[sw].name
        checks.append(Check(constraint="uplink_floor", ok=keep >= floor, subject=name,
                            numbers={"keep": keep, "total": total, "floor": floor, "already_out": already},
                            message=f"{name} would keep {keep} of {total} uplinks, floor is {floor}"
                                    + (f" ({already} already down or drained)" if already else "")))
    return checks


def _check_rails(g: Graph, effect: Effect, state: FleetState, out_links: set[int], s: DrainSettings) -> list[Check]:
    checks = []
    hosts_out = state.drained_hosts | set(effect.host_ids)
    for lid in sorted(effect.link_ids):
        lo = g.links[lid].lo
        host = g.devices[lo.device_id]
        if host.role != "host" or lo.rail is None:
            continue
        others = [x for x in g.host_links.get((host.id, lo.rail), []) if x != lid and x not in out_links]
        drained = host.id in hosts_out
        checks.append(Check(
            constraint="rail_host_path", ok=bool(others) or drained, subject=f"{host.name}:{lo.name}",
            numbers={"rail": lo.rail, "other_healthy_paths": len(others), "host_drained": drained},
            message=(f"{host.name}:{lo.name} is the last healthy path of {host.name} to rail {lo.rail} "
                     f"({len(others)} other healthy links on rail {lo.rail}); drain the host first"
                     if not others else
                     f"{host.name} keeps {len(others)} other healthy links to rail {lo.rail}")
            if not drained else f"{host.name} is drained; its link to rail {lo.rail} may go down"))
    # Rails whose leaves lose uplinks (or a whole leaf) through this drain.
    leaves = {g.links[lid].lo.device_id for lid in effect.link_ids} | set(effect.switch_ids)
    rails = {(g.devices[leaf].pod, r) for leaf in leaves for r in g.leaf_rails.get(leaf, ())}
    gone = set(effect.switch_ids) | state.drained_switches
    for pod, rail in sorted(rails, key=lambda x: (x[0] or "", x[1])):
        members = g.rail_leaves(pod, rail)
        total = sum(len(g.uplinks.get(leaf, [])) for leaf in members)
        if total == 0:
            continue
        keep = sum(1 for leaf in members if leaf not in gone for lid in g.uplinks.get(leaf, [])
                   if lid not in out_links)
        where = f"rail {rail}" + (f" in pod {pod}" if pod else "")
        checks.append(Check(constraint="rail_uplinks", ok=keep >= s.rail_min_uplinks, subject=where,
                            numbers={"rail": rail, "pod": pod, "keep": keep, "total": total,
                                     "minimum": s.rail_min_uplinks, "leaves": len(members)},
                            message=f"{where} would keep {keep} of {total} leaf uplinks, minimum is "
                                    f"{s.rail_min_uplinks}"))
    return checks


def _slack(c: Check) -> float:
    n = c.numbers
    if c.constraint == "uplink_floor":
        return n["keep"] - n["floor"]
    if c.constraint == "rail_uplinks":
        return n["keep"] - n["minimum"]
    if c.constraint == "rail_host_path":
        return n["other_healthy_paths"]
    if c.constraint == "pod_concurrency":
        return n["maximum"] - n["would_be"]
    return n.get("limit", 0) - n.get("recommended", 0)


def evaluate(*, graph: Graph, effect: Effect, state: FleetState, settings: DrainSettings,
             at: datetime) -> Verdict:
    """The verdict: all failed checks, plus the tightest passing check of each constraint."""
    out_links = state.unavailable | set(effect.link_ids)
    checks = [_check_breaker(state, settings), _check_pod(effect, state, settings),
              *_check_uplinks(graph, effect, out_links, settings),
              *_check_rails(graph, effect, state, out_links, settings)]
    failed = [c for c in checks if not c.ok]
    tightest: dict[str, Check] = {}
    for c in checks:
        if c.ok and (c.constraint not in tightest or _slack(c) < _slack(tightest[c.constraint])):
            tightest[c.constraint] = c
    shown = failed[:100] + list(tightest.values())
    blocked_by = sorted({c.constraint for c in failed})
    if failed:
        summary = "blocked: " + "; ".join(c.message for c in failed[:3])
        if len(failed) > 3:
            summary += f" (+{len(failed) - 3} more)"
    else:
        summary = "safe: " + "; ".join(c.message for c in tightest.values())
    return Verdict(safe=not failed, summary=summary, blocked_by=blocked_by, checks=shown, evaluated_at=at)
