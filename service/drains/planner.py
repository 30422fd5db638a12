"""From a target (or a detector Finding) to a concrete plan: the action, what it takes out, the pod.

A link with a host at one end is drained at the host (Slurm drain by default: running jobs
finish, F44), because shutting the host's only port to a rail would cut that GPU off its rail.
Switch-to-switch links are shut at both ends; a switch is isolated by shutting all its links.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

from service.detection.findings import Cause, Finding
from service.drains.safety import Effect
from service.drains.schemas import DrainAction, DrainSettings, Target, TargetKind
from service.drains.topology import FABRIC_POD, Graph


class PlanError(ValueError):
    """The target does not exist in the inventory or cannot take the action."""


@dataclass(frozen=True)
class Plan:
    kind: TargetKind
    device: str
    port: str | None
    peer_device: str | None
    peer_port: str | None
    link_id: int | None
    action: DrainAction
    effect: Effect
    ports: tuple[tuple[str, str], ...]   # ports the action shuts
    host: str | None                     # host the action drains


def plan_target(*, graph: Graph, target: Target, settings: DrainSettings,
                action: DrainAction | None = None) -> Plan:
    """Resolve a target against the inventory graph and choose (or check) the action."""
    dev = graph.device(target.device)
    if dev is None:
        raise PlanError(f"device {target.device!r} is not in the inventory")
    host_action = DrainAction(settings.host_action)
    if target.kind is TargetKind.HOST:
        if dev.role != "host":
            raise PlanError(f"{dev.name} is a {dev.role}, not a host")
        act = action or host_action
        if act is DrainAction.SHUT_PORTS:
            raise PlanError("a host is drained through its scheduler; target its links to shut ports")
        return Plan(TargetKind.HOST, dev.name, None, None, None, None, act,
                    Effect(host_ids=frozenset({dev.id}), pod=dev.pod or FABRIC_POD), (), dev.name)
    if target.kind is TargetKind.SWITCH:
        if dev.role == "host":
            raise PlanError(f"{dev.name} is a host, not a switch")
        if action not in (None, DrainAction.SHUT_PORTS):
            raise PlanError("a switch can only be drained by shutting its ports")
        links = frozenset(graph.device_links.get(dev.id, []))
        ports = tuple(sorted((dev.name, end.name) for lid in links for end in graph.links[lid].ends()
                             if end.device_id == dev.id))
        return Plan(TargetKind.SWITCH, dev.name, None, None, None, None, DrainAction.SHUT_PORTS,
                    Effect(link_ids=links, switch_ids=frozenset({dev.id}), pod=dev.pod or FABRIC_POD), ports, None)
    if not target.port:
        raise PlanError(f"a {target.kind} target needs a port")
    end = graph.port(dev.name, target.port)
    if end is None:
        raise PlanError(f"port {dev.name}:{target.port} is not in the inventory")
    lid = graph.link_of_port.get(end.id)
    if lid is None:
        raise PlanError(f"port {dev.name}:{target.port} has no link in the inventory")
    link = graph.links[lid]
    peer = link.hi if link.lo.id == end.id else link.lo
    peer_dev = graph.devices[peer.device_id]
    host = next((graph.devices[e.device_id] for e in link.ends() if graph.devices[e.device_id].role == "host"), None)
    act = action or (host_action if host is not None else DrainAction.SHUT_PORTS)
    pod = graph.link_pod(lid)
    if act is DrainAction.SHUT_PORTS:
        effect = Effect(link_ids=frozenset({lid}), pod=pod)
        return Plan(TargetKind.LINK, dev.name, end.name, peer_dev.name, peer.name, lid, act, effect,
                    ((dev.name, end.name), (peer_dev.name, peer.name)), None)
    if host is None:
        raise PlanError(f"{act} needs a host at one end of {dev.name}:{end.name}")
    effect = Effect(host_ids=frozenset({host.id}), pod=host.pod or pod)
    return Plan(TargetKind.LINK, dev.name, end.name, peer_dev.name, peer.name, lid, act, effect, (), host.name)


_CAUSE_SAFE = re.compile(r"[^A-Za-z0-9._:/@+\-]")


def safe_word(value: str | None, default: str) -> str:
    """A free-text word reduced to characters that are safe as (part of) one argument."""
    cleaned = _CAUSE_SAFE.sub("_", value or "").lstrip("-_")[:64]
    return cleaned or default


def target_for_finding(finding: Finding) -> Target | None:
    """The drain target a finding implies, or None when a drain would not help (congestion)."""
    if finding.cause is Cause.CONGESTION:
        return None   # capacity or ECMP problem: draining makes it worse (detection.md S8)
    if finding.scope == "host" or finding.cause in (Cause.NIC_PAUSE_STORM, Cause.HOST_SIDE) and not finding.port:
        return Target(kind=TargetKind.HOST, device=finding.device)
    if finding.scope == "device" or finding.port is None:
        return Target(kind=TargetKind.SWITCH, device=finding.device)
    return Target(kind=TargetKind.LINK, device=finding.device, port=finding.port)
