"""Per-target collection bookkeeping: status rows, link up/down events and LLDP neighbours."""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from collectors.base import CollectResult
from service.telemetry.catalogue import METRICS

GROUPS = ("counters", "optics", "state")


def group_of(metric: str) -> str:
    """The poll group a metric belongs to: optics (and slow device sensors) and state have their own intervals."""
    m = METRICS.get(metric)
    if m is None:
        return "counters"
    if m.group == "device":
        return "optics"  # component temperatures change as slowly as DOM readings
    return m.group if m.group in ("optics", "state") else "counters"


@dataclass(frozen=True, slots=True)
class EndpointRow:
    id: int
    device_id: int
    device: str
    pod: str | None
    protocol: str
    config: dict[str, Any]


def load_endpoints(conn: Connection, ids: list[int] | None = None) -> list[EndpointRow]:
    sql = ("SELECT e.id, e.device_id, d.name, d.pod, e.protocol, e.config FROM endpoints e "
           "JOIN devices d ON d.id = e.device_id")
    params: dict[str, Any] = {}
    if ids is not None:
        sql += " WHERE e.id = ANY(:ids)"
        params["ids"] = ids
    return [EndpointRow(*r) for r in conn.execute(text(sql + " ORDER BY e.id"), params).all()]


_STATUS_SQL = """
INSERT INTO target_status AS t (endpoint_id, last_attempt, last_success, last_error, last_error_at,
                                last_warnings, duration_s, samples, consecutive_failures)
VALUES (:id, :at, CASE WHEN :ok THEN CAST(:at AS timestamptz) END, :error,
        CASE WHEN :ok THEN NULL ELSE CAST(:at AS timestamptz) END, :warnings, :duration, :samples,
        CASE WHEN :ok THEN 0 ELSE 1 END)
ON CONFLICT (endpoint_id) DO UPDATE SET
  last_attempt = EXCLUDED.last_attempt,
  last_success = COALESCE(EXCLUDED.last_success, t.last_success),
  last_error = CASE WHEN :ok THEN t.last_error ELSE EXCLUDED.last_error END,
  last_error_at = CASE WHEN :ok THEN t.last_error_at ELSE EXCLUDED.last_error_at END,
  last_warnings = EXCLUDED.last_warnings,
  duration_s = EXCLUDED.duration_s,
  samples = EXCLUDED.samples,
  consecutive_failures = CASE WHEN :ok THEN 0 ELSE t.consecutive_failures + 1 END
"""


def record_status(conn: Connection, *, endpoint_id: int, result: CollectResult, stored: int,
                  at: datetime) -> None:
    """Remember how the last collection went; an error is kept until the next error replaces it."""
    conn.execute(text(_STATUS_SQL), {
        "id": endpoint_id, "at": at, "ok": result.ok, "error": result.error,
        "warnings": "\n".join(result.warnings[:50]) or None, "duration": result.duration_s, "samples": stored})


_PREV_OPER_SQL = """
SELECT DISTINCT ON (s.port_id) s.port_id, p.name, x.value
FROM series s JOIN ports p ON p.id = s.port_id
JOIN LATERAL last_samples(s.id, 1, :ts) x ON true
WHERE s.device_id = :device_id AND s.metric = 'port_oper_up'
"""


def record_link_events(conn: Connection, *, device_id: int, result: CollectResult, source: str) -> int:
    """Insert an up/down event for each port whose oper status changed since its previous sample."""
    oper = [s for s in result.samples if s.metric == "port_oper_up" and s.port is not None]
    if not oper:
        return 0
    first_ts = min(s.ts_ms for s in oper)
    at = datetime.fromtimestamp(first_ts / 1000, tz=UTC)
    prev = {name: (pid, v) for pid, name, v in conn.execute(text(_PREV_OPER_SQL),
                                                            {"ts": at, "device_id": device_id}).all()}
    events = []
    for s in sorted(oper, key=lambda s: s.ts_ms):
        known = prev.get(s.port or "")
        if known is None:
            continue
        pid, before = known
        if (before >= 0.5) != (s.value >= 0.5):
            events.append({"port_id": pid, "ts": datetime.fromtimestamp(s.ts_ms / 1000, tz=UTC),
                           "state": "up" if s.value >= 0.5 else "down", "source": source})
        prev[s.port or ""] = (pid, s.value)
    if events:
        conn.execute(text("INSERT INTO link_events (port_id, ts, state, source) VALUES (:port_id, :ts, :state, "
                          ":source) ON CONFLICT ON CONSTRAINT link_event_once DO NOTHING"), events)
    return len(events)


def record_neighbors(conn: Connection, *, device_id: int, result: CollectResult, at: datetime) -> None:
    """Replace the device's LLDP view with what this collection saw (when it saw any)."""
    if not result.neighbors:
        return
    conn.execute(text("DELETE FROM lldp_neighbors WHERE device_id = :d"), {"d": device_id})
    conn.execute(text("INSERT INTO lldp_neighbors (device_id, local_port, remote_device, remote_port, seen_at) "
                      "VALUES (:d, :lp, :rd, :rp, :at) ON CONFLICT DO NOTHING"),
                 [{"d": device_id, "lp": n.local_port, "rd": n.remote_device, "rp": n.remote_port, "at": at}
                  for n in result.neighbors])


_TARGETS_SQL = """
SELECT d.name, e.protocol, e.address, e.port, d.pod, t.last_attempt, t.last_success, t.last_error,
       t.last_error_at, t.last_warnings, t.duration_s, t.samples, coalesce(t.consecutive_failures, 0),
       e.config, t.coverage, g.state, g.reason, g.since, g.owner, g.lease_until, g.last_data_at,
       g.endpoint_id IS NOT NULL
FROM endpoints e JOIN devices d ON d.id = e.device_id LEFT JOIN target_status t ON t.endpoint_id = e.id
LEFT JOIN gnmi_stream_state g ON g.endpoint_id = e.id
WHERE (CAST(:device AS text) IS NULL OR d.name = :device)
  AND (CAST(:protocol AS text) IS NULL OR e.protocol = :protocol)
  AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
ORDER BY d.name, e.protocol
"""


def list_targets(conn: Connection, *, device: str | None = None, protocol: str | None = None,
                 pod: str | None = None, rules: bool = True,
                 blocked_of: Callable[[str], list[dict[str, Any]] | None] | None = None) -> list[dict[str, Any]]:
    """Every collection target with its last status and coverage.

    `state` is ok, degraded (the target answered, but the last collection stored no sample, or an
    expected metric group is missing: a blind spot, `reason` says why in words), failing or
    never_polled; never `ok` with nothing. `coverage` (service/telemetry/coverage.py) is the groups
    expected against those that arrived, the refused samples per reason with examples and, with
    `rules`, the detector's per-port rules that cannot run on the device (`blocked_of(device)` when given:
    a sharded deployment reads them from each device's shard). gNMI targets also carry
    `stream`: their mode and the state of their Subscribe stream (collectors/gnmi_stream.py).
    """
    from collectors.gnmi_stream import describe
    from service.telemetry.coverage import blocked_rules_by_device, state_of, summarize

    blocked = blocked_rules_by_device(conn) if rules and blocked_of is None else None

    def rules_of(dev: str) -> list[dict[str, Any]] | None:
        if blocked_of is not None:
            return blocked_of(dev)
        return None if blocked is None else blocked.get(dev, [])
    out = []
    rows = conn.execute(text(_TARGETS_SQL), {"device": device, "protocol": protocol, "pod": pod}).all()
    for (dev, proto, addr, port, pod, attempt, success, error, error_at, warnings, duration, samples,
         failures, config, record, *stream) in rows:
        cov = summarize(record, rules_of(dev))
        state = "never_polled" if attempt is None else ("failing" if failures else "ok")
        reason = error if failures else None
        if state == "ok" and (why := state_of(cov, stored=samples, warnings=warnings.split("\n") if warnings else [])):
            state, reason = "degraded", why
        extra = {"stream": describe(tuple(stream[:6]) if stream[6] else None, config or {})} if proto == "gnmi" else {}
        out.append({
            "target": f"{dev}/{proto}", "device": dev, "protocol": proto, "address": addr, "port": port,
            "pod": pod, "state": state, "last_attempt": attempt, "last_success": success,
            "last_error": error, "last_error_at": error_at,
            "warnings": warnings.split("\n") if warnings else [], "duration_s": duration,
            "samples": samples, "consecutive_failures": failures, "reason": reason, "coverage": cov, **extra,
        })
    return out


_LINKCHECK_SQL = """
WITH ends AS (
  SELECT da.name AS dev, pa.name AS port, db.name AS peer_dev, pb.name AS peer_port
  FROM links l JOIN ports pa ON pa.id = l.a_port_id JOIN devices da ON da.id = pa.device_id
  JOIN ports pb ON pb.id = l.b_port_id JOIN devices db ON db.id = pb.device_id
  UNION ALL
  SELECT db.name, pb.name, da.name, pa.name
  FROM links l JOIN ports pa ON pa.id = l.a_port_id JOIN devices da ON da.id = pa.device_id
  JOIN ports pb ON pb.id = l.b_port_id JOIN devices db ON db.id = pb.device_id
)
SELECT d.name, n.local_port, n.remote_device, n.remote_port, n.seen_at, e.peer_dev, e.peer_port,
       (SELECT count(*) FROM devices x WHERE x.name = n.remote_device) AS known
FROM lldp_neighbors n JOIN devices d ON d.id = n.device_id
LEFT JOIN ends e ON e.dev = d.name AND e.port = n.local_port
ORDER BY d.name, n.local_port
"""


def link_check(conn: Connection) -> dict[str, list[dict[str, Any]]]:
    """LLDP against the inventory's links: miscabled ports, unknown neighbours, and matches."""
    result: dict[str, list[dict[str, Any]]] = {"miscabled": [], "unknown_neighbors": [], "unexpected": [],
                                               "ok": []}
    for dev, lport, rdev, rport, seen, peer_dev, peer_port, known in conn.execute(text(_LINKCHECK_SQL)).all():
        item = {"device": dev, "port": lport, "lldp_device": rdev, "lldp_port": rport, "seen_at": seen,
                "expected_device": peer_dev, "expected_port": peer_port}
        if peer_dev is None:
            result["unknown_neighbors" if not known else "unexpected"].append(item)
        elif (peer_dev, peer_port) == (rdev, rport):
            result["ok"].append(item)
        else:
            result["miscabled"].append(item)
    return result
