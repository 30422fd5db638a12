"""What detection hands to alerting: one Finding per condition per entity per cycle.

This is the contract between `service.detection` (which decides what is wrong) and
`service.alerts` (which decides whom to tell, and when). A finding carries its own
hysteresis state so that alerting never re-derives thresholds:

- `firing`: the enter condition holds (open or keep an alert);
- `holding`: below enter but above the leave condition (keep an open alert, open none);
- a condition that is absent from a cycle's findings has cleared (resolve after the
  alert layer's own clear delay).
"""

from __future__ import annotations

import math
from dataclasses import asdict, dataclass, field
from enum import StrEnum
from typing import Any


class Cause(StrEnum):
    CONTAMINATION = "connector_contamination"
    TX_WEAROUT = "transmitter_wearout"
    FIBER = "fiber_damage"
    LOOSE_MODULE = "loose_module"
    POST_FEC = "post_fec_errors"
    FLAP_STORM = "flap_storm"
    SHARED_COMPONENT = "shared_component"
    CONGESTION = "congestion"
    NIC_PAUSE_STORM = "nic_pause_storm"
    HOST_SIDE = "host_side"
    MODULE_ALARM = "module_alarm"
    LINK_DOWN = "link_down"
    UNKNOWN_PHYSICAL = "unknown_physical"

    @property
    def physical(self) -> bool:
        return self not in (Cause.CONGESTION, Cause.NIC_PAUSE_STORM, Cause.HOST_SIDE)


class Action(StrEnum):
    NONE = "none"
    CLEAN = "clean_connectors"
    RESEAT = "reseat_module"
    REPLACE_LOCAL = "replace_local_module"
    REPLACE_PEER = "replace_peer_module"
    REPLACE_CABLE = "replace_cable"
    ESCALATE_DEVICE = "escalate_device"
    DRAIN_HOST = "drain_host"
    DISABLE_PORT = "disable_port"
    REVIEW_CAPACITY = "review_capacity"
    CHECK_LINK = "check_link"      # a link is down: is the far end up and enabled? then the module and the cable


class Severity(StrEnum):
    PAGE = "page"
    TICKET = "ticket"
    INFO = "info"


@dataclass(frozen=True, slots=True)
class Evidence:
    feature: str
    value: float
    baseline: float | None = None
    cohort: float | None = None
    unit: str = ""
    note: str = ""


@dataclass(slots=True)
class Finding:
    kind: str                      # the condition, e.g. "rx_power_degrading", "pause_storm"
    scope: str                     # "lane" | "port" | "link" | "device" | "host"
    device: str                    # where the fault is (the end at fault for a link)
    port: str | None
    lane: int | None
    cause: Cause
    severity: Severity
    action: Action
    state: str                     # "firing" | "holding"
    score: float                   # larger is worse; comparable within a kind
    at_ms: int                     # data time of the cycle that produced it
    summary: str                   # one line for people
    peer_device: str | None = None  # the other end of the link, when there is one
    peer_port: str | None = None
    end: str | None = None          # "local" | "peer": which end of the link is at fault
    ttt_hours: float | None = None  # time to threshold for trends
    evidence: list[Evidence] = field(default_factory=list)
    members: list[str] = field(default_factory=list)  # ports grouped into a device-level finding

    @property
    def physical(self) -> bool:
        return self.cause.physical

    @property
    def fingerprint(self) -> str:
        """kind + entity: the alert identity that deduplicates across cycles."""
        entity = ":".join(str(x) for x in (self.device, self.port, self.lane) if x is not None)
        return f"{self.kind}/{entity}"

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready: a non-finite number (an evidence value that could not be computed) becomes None,
        since JSON and PostgreSQL's jsonb have no NaN."""
        d = _finite(asdict(self))
        d["cause"], d["severity"], d["action"] = self.cause.value, self.severity.value, self.action.value
        d["physical"], d["fingerprint"] = self.physical, self.fingerprint
        return d


def _finite(o: Any) -> Any:
    if isinstance(o, float) and not math.isfinite(o):
        return None
    if isinstance(o, dict):
        return {k: _finite(v) for k, v in o.items()}
    if isinstance(o, list):
        return [_finite(v) for v in o]
    return o
