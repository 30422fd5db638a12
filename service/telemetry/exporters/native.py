"""Series already named after the catalogue (docs/metrics.md), e.g. forwarded by vmagent from a
fabricwatch-shaped source: the same rules as the Prometheus-text import. `device` and `port` are
inventory names, `lane`/`priority`/`gpu` integers; other labels are ignored."""

from __future__ import annotations

from service.telemetry import catalogue
from service.telemetry.exporters.base import Labels, Match, PortBy, Reason, Unmapped, int_label


def match(name: str, labels: Labels) -> Match | Unmapped | None:
    mdef = catalogue.get(name)
    if mdef is None:
        return None
    device = labels.get("device")
    if not device:
        return Unmapped(Reason.MISSING_LABEL, f"{name}: no 'device' label")
    try:
        lane, prio, gpu = (int_label(labels, k) for k in ("lane", "priority", "gpu"))
    except ValueError as exc:
        return Unmapped(Reason.BAD_LABEL, f"{name}: {exc}")
    given = {"port": labels.get("port") or None, "lane": lane, "priority": prio, "gpu": gpu}
    for label in mdef.labels[1:]:
        if given[label] is None:
            return Unmapped(Reason.MISSING_LABEL, f"{name}: no {label!r} label")
    port = labels.get("port")
    return Match(name, None, (device,), (PortBy.NAME, port) if port else None, lane=lane, priority=prio, gpu=gpu,
                 exact=True)
