"""Coverage: per target, the metric groups its role expects against what each collection brought.

"Never blind in silence": a target that answers but gives nothing, or loses a whole metric group,
is `degraded` with the reason in words (/api/v1/targets, the NOC page, /metrics), and after
FABRICWATCH_TELEMETRY_GAP_POLLS collections in a row a `telemetry_gap` alert opens (the detection
cycle reads the records: `gap_findings`, called by service/pipeline.py's run_cycle).

Groups, the catalogue groups (docs/metrics.md) they hold, and who is expected to give them:

    group     catalogue groups   expected from
    state     state              every target
    counters  traffic, errors    every target
    optics    optics             a device with at least one optic in the inventory (a DAC or ACC has no DOM)
    pfc       pfc                a host's own agent (protocol host): its NICs' PFC or pause counters

A group is assessed by a collection that covers its poll group (collectors/tasks.py: counters,
optics, state; pfc rides with counters). Each assessment keeps the samples of the group that ingest
accepted (`samples`), how many assessments in a row found none (`missing_polls`) and why (`reason`,
starting with the group's name). A gNMI stream (a live lease in gnmi_stream_state) stores what
arrived every second, and one second without optics is no gap: for a stream, `missing_polls` counts
the sample intervals a group is overdue beyond the first (state is ON_CHANGE: once it arrived in a
stream, it is covered until the stream restarts). Samples ingest refused are counted per reason,
with a few examples, for the latest collection of each poll group.

The record is one JSON value per target, target_status.coverage (migration 0180).
"""

from __future__ import annotations

import math
import threading
from collections import Counter
from collections.abc import Iterable, Sequence
from dataclasses import dataclass
from datetime import UTC, datetime
from enum import StrEnum
from typing import TYPE_CHECKING, Any

from sqlalchemy import Connection, text

from service.telemetry.catalogue import METRICS

if TYPE_CHECKING:
    from collectors.base import CollectResult
    from service.detection.findings import Finding
    from service.telemetry.ingest import IngestReport
    from service.telemetry.samples import Sample

# coverage group -> (catalogue groups, the poll group that collects it)
COVERAGE_GROUPS: dict[str, tuple[frozenset[str], str]] = {
    "state": (frozenset({"state"}), "state"),
    "counters": (frozenset({"traffic", "errors"}), "counters"),
    "optics": (frozenset({"optics"}), "optics"),
    "pfc": (frozenset({"pfc"}), "counters"),
}
_OF_CATALOGUE = {cg: g for g, (cgs, _) in COVERAGE_GROUPS.items() for cg in cgs}
_NONE_OF = {"state": "no port state (oper/admin status, speed)", "counters": "no traffic or error counter",
            "optics": "no transceiver (DOM) reading", "pfc": "no PFC or pause counter"}
EXAMPLES = 5   # refused keys kept per reason
BLIND_SPOTS = 10   # collector warnings kept per group
# Collector warnings that name a blind spot start with "<group>:" (collectors/snmp.py); the poll group
# whose collection replaces them ("ports" comes with every collection; "source": one of a target's
# sources failed, e.g. one exporter URL of a scrape target, which degrades the target).
_BLIND_POLL = {"state": "state", "counters": "counters", "pfc": "counters", "optics": "optics", "device": "optics",
               "ports": "*", "source": "*"}
STREAM_INTERVAL_S = 10.0   # collectors/gnmi.py's default SAMPLE interval
KIND = "telemetry_gap"


def coverage_group(metric: str) -> str | None:
    """The coverage group of a canonical metric (None: one no target is expected to give, e.g. gpu)."""
    m = METRICS.get(metric)
    return _OF_CATALOGUE.get(m.group) if m is not None else None


def expected_groups(*, kind: str, protocol: str, optics: bool) -> list[str]:
    """What a target must give: its device's kind, the protocol, and whether the inventory lists optics."""
    out = ["state", "counters"]
    if optics:
        out.append("optics")
    if kind == "host" and protocol == "host":
        out.append("pfc")
    return out


# --- one collection's assessment -----------------------------------------------------------------

def _refusal(s: Sample, report: IngestReport, lanes: dict[str, str]) -> tuple[str, str] | None:
    """Why ingest refused this sample, as (reason, example), or None. Mirrors the report's keys
    (service/telemetry/ingest.py): metric names, device names, "device:port" and "device:port lane N"."""
    mdef = METRICS.get(s.metric)
    if mdef is None or s.metric in report.unknown_metrics:
        return "unknown metric", s.metric
    if any(getattr(s, label) is None for label in mdef.labels[1:]):
        return "invalid", f"{s.metric}: missing label"
    if s.device in report.unknown_devices:
        return "not in the inventory", s.device
    where = f"{s.device}:{s.port}"
    if s.port is not None and where in report.unknown_ports:
        return "not in the inventory", where
    if s.lane is not None and (key := lanes.get(f"{where} lane {s.lane}")) is not None:
        return "invalid lane", key
    if not math.isfinite(s.value):
        return "not a number", f"{s.metric} {where}"
    return None


@dataclass(frozen=True, slots=True)
class StreamClock:
    """A gNMI stream's start and SAMPLE interval: what makes a group overdue on a stream."""

    since_ms: int
    interval_ms: int


def assess(result: CollectResult, report: IngestReport, *, polled: Sequence[str], expected: Sequence[str],
           previous: dict[str, Any] | None, at_ms: int, stream: StreamClock | None = None) -> dict[str, Any]:
    """The target's coverage record after this collection: `previous` updated for the polled groups."""
    from service.telemetry.targets import group_of

    lanes = {k.split(": ", 1)[0]: k for k in report.invalid}
    accepted: Counter[str] = Counter()
    offered: Counter[str] = Counter()
    stored = 0
    refused: dict[str, dict[str, Counter[str]]] = {}   # poll group -> reason -> example -> samples
    refused_in: dict[str, dict[str, Counter[str]]] = {}   # the same per coverage group, for reasons
    for s in result.samples:
        g = coverage_group(s.metric)
        if g is not None:
            offered[g] += 1
        why = _refusal(s, report, lanes)
        if why is None:
            stored += 1
            if g is not None:
                accepted[g] += 1
            continue
        refused.setdefault(group_of(s.metric), {}).setdefault(why[0], Counter())[why[1]] += 1
        if g is not None:
            refused_in.setdefault(g, {}).setdefault(why[0], Counter())[why[1]] += 1

    prev = previous or {}
    groups: dict[str, dict[str, Any]] = {g: v for g, v in (prev.get("groups") or {}).items() if g in expected}
    rejected = {pg: v for pg, v in (prev.get("rejected") or {}).items() if pg not in polled}
    for pg in polled:
        if pg in refused:
            rejected[pg] = {why: {"count": sum(c.values()), "examples": [k for k, _ in c.most_common(EXAMPLES)]}
                            for why, c in refused[pg].items()}
    blind = {k: v for k, v in (prev.get("blind_spots") or {}).items()
             if k in _BLIND_POLL and _BLIND_POLL[k] != "*" and _BLIND_POLL[k] not in polled}
    for w in result.warnings:
        head = w.split(":", 1)[0]
        if head in _BLIND_POLL and len(blind.setdefault(head, [])) < BLIND_SPOTS:
            blind[head].append(w)
    for g in expected:
        if COVERAGE_GROUPS[g][1] not in polled:
            continue
        old = groups.get(g) or {}
        last = old.get("last_arrived_ms")
        if accepted[g]:
            groups[g] = {"samples": accepted[g], "missing_polls": 0, "reason": None, "at_ms": at_ms,
                         "last_arrived_ms": at_ms}
            continue
        if stream is None:
            missing = int(old.get("missing_polls") or 0) + 1
            reason = _why_missing(g, result, refused_in.get(g, {}), offered[g])
        else:
            missing, reason = _stream_gap(g, last, stream, at_ms)
        groups[g] = {"samples": 0, "missing_polls": missing, "reason": reason, "at_ms": at_ms,
                     "last_arrived_ms": last}
    return {"expected": list(expected), "groups": groups, "rejected": rejected, "blind_spots": blind,
            "mode": "stream" if stream else "poll",
            "last": {"at_ms": at_ms, "received": len(result.samples), "accepted": stored}}


def _why_missing(g: str, result: CollectResult, refused: dict[str, Counter[str]], offered: int) -> str:
    """In words, starting with the group: why a collection of it brought nothing usable."""
    if result.error:
        return f"{g}: the collection failed: {result.error}"
    if offered:   # the target gave the group; ingest refused all of it
        parts = [f"{sum(c.values())} {why} (e.g. {', '.join(k for k, _ in c.most_common(3))})"
                 for why, c in refused.items()]
        return f"{g}: all {offered} samples were refused: " + "; ".join(parts)
    said = next((w for w in result.warnings if w.startswith(f"{g}:")), None)
    if said:
        return said   # the collector's own blind-spot warning (SNMP: "optics: no transceiver reading in ...")
    if not result.samples and (said := headline(result.warnings)):
        return f"{g}: nothing collected: {said}"
    return f"{g}: the target gave {_NONE_OF[g]}"


def headline(warnings: Sequence[str]) -> str | None:
    """The warning that says what happened to the whole collection: the first one that is not a group's blind
    spot ("ports: ...", "counters: ..."), e.g. SNMP's "the agent answered but no canonical metric was found"."""
    return next((w for w in warnings if w.split(":", 1)[0] not in _BLIND_POLL), None) or next(iter(warnings), None)


def _stream_gap(g: str, last_ms: int | None, clock: StreamClock, at_ms: int) -> tuple[int, str | None]:
    """Intervals a group is overdue on a stream beyond the first, and why (None when not overdue)."""
    if g == "state" and last_ms is not None and last_ms >= clock.since_ms:
        return 0, None   # ON_CHANGE: given once in this stream, covered until it restarts
    ref = max(last_ms or 0, clock.since_ms)
    overdue = max(0, (at_ms - ref) // max(clock.interval_ms, 1) - 1)
    if not overdue:
        return 0, None
    return int(overdue), (f"{g}: the stream brought {_NONE_OF[g]} for {(at_ms - ref) / 1000:.0f} s "
                          f"(sample interval {clock.interval_ms / 1000:g} s)")


# --- storage (collectors/tasks.py's store step) --------------------------------------------------

_DEVICE_SQL = """
SELECT d.kind, EXISTS (SELECT 1 FROM ports p JOIN optics o ON o.port_id = p.id WHERE p.device_id = d.id
                      AND coalesce(o.type, '') !~* '(dac|acc|copper)'),   -- copper cables have no DOM
       e.config, g.since, g.owner IS NOT NULL AND g.lease_until > now(), t.coverage
FROM endpoints e JOIN devices d ON d.id = e.device_id
LEFT JOIN gnmi_stream_state g ON g.endpoint_id = e.id
LEFT JOIN target_status t ON t.endpoint_id = e.id
WHERE e.id = :id
"""


def record_coverage(conn: Connection, *, endpoint_id: int, protocol: str, polled: Sequence[str],
                    result: CollectResult, report: IngestReport, at_ms: int) -> dict[str, Any] | None:
    """Assess this collection and store the target's record; call after record_status (its row is locked)."""
    row = conn.execute(text(_DEVICE_SQL), {"id": endpoint_id}).first()
    if row is None:   # the endpoint left the inventory meanwhile
        return None
    kind, optics, config, since, streaming, previous = row
    stream = None
    if streaming and since is not None:
        cfg = config or {}
        # as target_for sets the stream's SAMPLE period: explicit, else the counters interval, else gnmi.py's
        interval = float(cfg.get("sample_interval_s") or cfg.get("sample_interval")
                         or (cfg.get("intervals") or {}).get("counters") or STREAM_INTERVAL_S)
        stream = StreamClock(int(since.timestamp() * 1000), int(interval * 1000))
    record = assess(result, report, polled=polled, expected=expected_groups(kind=kind, protocol=protocol,
                                                                            optics=bool(optics)),
                    previous=previous, at_ms=at_ms, stream=stream)
    conn.execute(text("UPDATE target_status SET coverage = CAST(:c AS jsonb) WHERE endpoint_id = :id"),
                 {"c": _json(record), "id": endpoint_id})
    return record


def _json(v: Any) -> str:
    import json

    return json.dumps(v, separators=(",", ":"))


# --- reading: the API's view ---------------------------------------------------------------------

def _dt(ms: int | None) -> datetime | None:
    return None if ms is None else datetime.fromtimestamp(ms / 1000, tz=UTC)


def summarize(record: dict[str, Any] | None, blocked: list[dict[str, Any]] | None = None) -> dict[str, Any] | None:
    """The `coverage` object of /api/v1/targets: expected, arrived, missing and not yet collected groups,
    each group's detail, refused samples per reason (summed over the poll groups) and the detector's
    per-port rules that cannot run on this device (`blocked_rules`; null when the detector has no state)."""
    if record is None:
        return None
    groups = record.get("groups") or {}
    expected = list(record.get("expected") or [])
    rejected: dict[str, dict[str, Any]] = {}
    for per_reason in (record.get("rejected") or {}).values():
        for why, r in per_reason.items():
            acc = rejected.setdefault(why, {"count": 0, "examples": []})
            acc["count"] += r["count"]
            acc["examples"] = list(dict.fromkeys(acc["examples"] + r["examples"]))[:EXAMPLES]
    last = record.get("last") or {}
    return {
        "expected": expected,
        "arrived": [g for g in expected if g in groups and not groups[g]["missing_polls"]],
        "missing": [g for g in expected if g in groups and groups[g]["missing_polls"]],
        "not_collected_yet": [g for g in expected if g not in groups],
        "groups": {g: {"samples": v["samples"], "missing_polls": v["missing_polls"], "reason": v["reason"],
                       "assessed_at": _dt(v.get("at_ms")), "last_arrived_at": _dt(v.get("last_arrived_ms"))}
                   for g, v in groups.items()},
        "rejected": rejected,
        "blind_spots": record.get("blind_spots") or {},
        "mode": record.get("mode", "poll"),
        "last_received": last.get("received"),
        "last_accepted": last.get("accepted"),
        "blocked_rules": blocked,
    }


def state_of(cov: dict[str, Any] | None, *, stored: int | None, warnings: Sequence[str]) -> str | None:
    """Why a target whose collection succeeded is degraded (None: it is ok). Nothing stored and no group
    arrived: the collection's own words (or the refusals); else the missing groups' reasons."""
    nothing = not stored and (cov is None or not cov["last_accepted"])   # duplicates of stored samples aside
    gap = "; ".join(cov["groups"][g]["reason"] or f"{g}: missing" for g in cov["missing"]) if cov else ""
    lost = "; ".join(cov["blind_spots"].get("source", [])) if cov else ""   # one of its sources failed
    gap = "; ".join(x for x in (gap, lost) if x)
    if nothing and not (cov and cov["arrived"]):
        if cov and cov["last_received"]:
            rej = "; ".join(f"{r['count']} {why} (e.g. {', '.join(r['examples'][:3])})"
                            for why, r in cov["rejected"].items())
            return f"nothing stored: all {cov['last_received']} samples were refused: {rej}"
        return headline(warnings) or "the last collection stored no sample"
    return gap or (headline(warnings) or "the last collection stored no sample" if nothing else None)


# --- the detector's blocked rules, per device ----------------------------------------------------

_blocked_cache: dict[str, Any] = {}
_blocked_lock = threading.Lock()


def blocked_rules_by_device(conn: Connection, name: str = "default") -> dict[str, list[dict[str, Any]]] | None:
    """Per device, the detector's per-port rules that cannot run for missing inputs (service/detection/store.py
    `load_coverage`, from the saved state): [{rule, reason, ports, examples}]. None: no saved state yet. Read
    once per saved state (cached on its saved_at)."""
    saved = conn.execute(text("SELECT saved_at FROM detector_state WHERE name = :n"), {"n": name}).scalar()
    if saved is None:
        return None
    with _blocked_lock:
        if _blocked_cache.get("key") == (name, saved):
            return _blocked_cache["value"]
    value = _read_blocked(conn, name)
    with _blocked_lock:
        _blocked_cache.update(key=(name, saved), value=value)
    return value


def _read_blocked(conn: Connection, name: str) -> dict[str, list[dict[str, Any]]]:
    from service.detection.store import load_coverage

    gaps = load_coverage(conn, name)
    if not gaps:
        return {}
    names = {pid: (dev, port) for pid, dev, port in conn.execute(text(
        "SELECT p.id, d.name, p.name FROM ports p JOIN devices d ON d.id = p.device_id WHERE p.id = ANY(:ids)"),
        {"ids": list(gaps)}).all()}
    per: dict[str, dict[tuple[str, str], list[str]]] = {}
    for pid, gap in gaps.items():
        if pid not in names:
            continue
        dev, port = names[pid]
        for rule, reason in gap["blocked_rules"].items():
            per.setdefault(dev, {}).setdefault((rule, reason), []).append(port)
    return {dev: [{"rule": rule, "reason": reason, "ports": len(ports), "examples": sorted(ports)[:EXAMPLES]}
                  for (rule, reason), ports in sorted(rules.items())] for dev, rules in per.items()}


# --- the telemetry_gap alert (read by the detection cycle) ---------------------------------------

class GapCause(StrEnum):
    """The alert's cause. The detector's Cause (service/detection/findings.py) is about the fabric; a
    collection gap is not, and alerts store the value as text."""

    TELEMETRY_GAP = "telemetry_gap"

    @property
    def physical(self) -> bool:
        return False


_GAP_SQL = """
SELECT d.name, e.protocol, t.coverage, t.consecutive_failures, t.last_error
FROM target_status t JOIN endpoints e ON e.id = t.endpoint_id JOIN devices d ON d.id = e.device_id
WHERE t.consecutive_failures >= :n OR t.coverage IS NOT NULL
ORDER BY d.name, e.protocol
"""


def gap_findings(conn: Connection, *, at_ms: int, polls: int | None = None) -> list[Finding]:
    """One `telemetry_gap` finding per device with a target that failed, or missed an expected group,
    `polls` collections in a row (FABRICWATCH_TELEMETRY_GAP_POLLS); absent once coverage returns, so the
    alert resolves after the usual clear cycles. Evidence: per target and group, the collections missed
    (value), the threshold (baseline) and the reason (note)."""
    from service.detection.findings import Action, Evidence, Finding, Severity

    if polls is None:
        from service.config import get_settings

        polls = get_settings().telemetry_gap_polls
    per: dict[str, list[Evidence]] = {}
    for dev, proto, record, failures, error in conn.execute(text(_GAP_SQL), {"n": polls}).all():
        if failures >= polls:
            per.setdefault(dev, []).append(Evidence(feature=f"{proto}:collection", value=float(failures),
                                                    baseline=float(polls), unit="polls",
                                                    note=f"{proto}: the collection fails: {error}"[:500]))
            continue
        for g, v in ((record or {}).get("groups") or {}).items():
            if v["missing_polls"] >= polls:
                per.setdefault(dev, []).append(Evidence(feature=f"{proto}:{g}", value=float(v["missing_polls"]),
                                                        baseline=float(polls), unit="polls",
                                                        note=(v["reason"] or f"{g}: missing")[:500]))
    return [Finding(kind=KIND, scope="device", device=dev, port=None, lane=None,
                    cause=GapCause.TELEMETRY_GAP,  # type: ignore[arg-type]
                    severity=Severity.TICKET, action=Action.NONE, state="firing", score=float(len(ev)),
                    at_ms=at_ms, summary=_gap_summary(dev, ev), evidence=ev)
            for dev, ev in per.items()]


def _gap_summary(device: str, ev: Iterable[Any]) -> str:
    items = list(ev)
    what = ", ".join(e.feature for e in items)
    worst = max(int(e.value) for e in items)
    return f"telemetry gap on {device}: {what} missing for {worst} collections in a row; {items[0].note}"[:1000]
