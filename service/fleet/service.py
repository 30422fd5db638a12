"""Fleet-wide views: the topology graph with health, and the summary a NOC looks at first.

Health, worst first: `critical` (a page alert), `down` (oper status 0), `warning` (a ticket
alert, or errors rising when there is no alerts table), `info`, `ok`, `unknown` (no
telemetry). With the alerts table present (migration 0020), open alerts (firing or
acknowledged) decide health and the latest `port_oper_up` adds `down`; without it, the
latest oper status and rising error counters stand in. Other domains' tables are optional:
each is looked up with to_regclass, so this module works before they land.
"""

from __future__ import annotations

from collections import Counter, defaultdict
from typing import Any

from sqlalchemy import Connection, text

HEALTH = ("unknown", "ok", "info", "warning", "down", "critical")
RANK = {h: i for i, h in enumerate(HEALTH)}
SEVERITY_HEALTH = {"page": "critical", "ticket": "warning", "info": "info"}
OPEN_ALERT_STATES = ("firing", "acknowledged")
# Counters whose increase means a link is taking errors (fallback health without alerts).
ERROR_METRICS = ("port_rx_fcs_errors_total", "port_fec_uncorrectable_codewords_total", "port_symbol_errors_total")


def worst(*levels: str) -> str:
    return max(levels, key=lambda h: RANK[h]) if levels else "unknown"


def has_table(conn: Connection, name: str) -> bool:
    return conn.execute(text("SELECT to_regclass(:n) IS NOT NULL"), {"n": f"public.{name}"}).scalar_one()


# ---------------------------------------------------------------------------- telemetry state

_OPER_SQL = """
SELECT s.port_id, x.value
FROM series s JOIN devices d ON d.id = s.device_id
JOIN LATERAL last_samples(s.id, 1) x ON true
WHERE s.metric = 'port_oper_up' AND s.port_id IS NOT NULL AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
"""

# Ports whose error counters rose between their last two readings (a reset counts as a rise).
_ERRORS_SQL = """
SELECT DISTINCT s.port_id
FROM series s JOIN devices d ON d.id = s.device_id
JOIN LATERAL (SELECT max(value) FILTER (WHERE rn = 1) AS cur, max(value) FILTER (WHERE rn = 2) AS prev
              FROM (SELECT value, row_number() OVER (ORDER BY ts DESC) AS rn
                    FROM last_samples(s.id, 2) t) u) x
  ON true
WHERE s.metric = ANY(:metrics) AND s.port_id IS NOT NULL AND x.prev IS NOT NULL AND x.cur <> x.prev
  AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
"""


# Across shards (service/shards/fleet.py): the same from the shards' newest two samples per series, through
# the fleet tables, for the pods `:pods` (the shards that answered). Pods are '' for pod-less devices there.
_FLEET_LATEST = ("SELECT pod, series_id, port_id, rn, value FROM fleet.latest WHERE pod = ANY(:pods) "
                 "AND metric = ANY(:metrics) AND port_id IS NOT NULL")
_FLEET_OPER_SQL = f"SELECT port_id, value FROM ({_FLEET_LATEST}) x WHERE rn = 1"
_FLEET_ERRORS_SQL = f"""
SELECT DISTINCT port_id FROM ({_FLEET_LATEST}) x GROUP BY pod, series_id, port_id
HAVING max(value) FILTER (WHERE rn = 2) IS NOT NULL
   AND max(value) FILTER (WHERE rn = 1) <> max(value) FILTER (WHERE rn = 2)
"""


def _fleet_pods(fleet_pods: list[str], pod: str | None) -> list[str]:
    return [p for p in fleet_pods if pod is None or p == pod]


def port_states(conn: Connection, pod: str | None = None, errors: bool = False,
                fleet_pods: list[str] | None = None) -> dict[int, str]:
    """Per port id: 'down', 'warning' (errors rising; only with errors=True) or 'ok', from the latest samples.
    `fleet_pods`: read across shards, from these pods' shards (sharded deployments)."""
    out: dict[int, str] = {}
    if fleet_pods is not None:
        pods = _fleet_pods(fleet_pods, pod)
        oper = conn.execute(text(_FLEET_OPER_SQL), {"pods": pods, "metrics": ["port_oper_up"]}).all()
    else:
        oper = conn.execute(text(_OPER_SQL), {"pod": pod}).all()
    for pid, value in oper:
        out[pid] = "ok" if value is not None and value >= 0.5 else "down"
    if errors:
        rising = conn.execute(text(_FLEET_ERRORS_SQL), {"pods": pods, "metrics": list(ERROR_METRICS)}).all() \
            if fleet_pods is not None else \
            conn.execute(text(_ERRORS_SQL), {"pod": pod, "metrics": list(ERROR_METRICS)}).all()
        for (pid,) in rising:
            if out.get(pid) != "down":
                out[pid] = "warning"
    return out


def open_alerts(conn: Connection, pod: str | None = None) -> list[dict[str, Any]] | None:
    """Open alerts (firing or acknowledged) in short form; None when the alerts table does not exist."""
    if not has_table(conn, "alerts"):
        return None
    rows = conn.execute(text(
        "SELECT id, kind, scope, device, port, lane, peer_device, peer_port, pod, state, severity, cause, "
        "action, summary, score FROM alerts WHERE state = ANY(:states) "
        "AND (CAST(:pod AS text) IS NULL OR pod = :pod) ORDER BY id"),
        {"states": list(OPEN_ALERT_STATES), "pod": pod}).mappings().all()
    return [dict(r) for r in rows]


# ---------------------------------------------------------------------------- topology

_NODES_SQL = """
SELECT d.id, d.name, d.kind, d.role, d.pod, d.rack, d.gpus FROM devices d
WHERE (CAST(:pod AS text) IS NULL OR d.pod = :pod OR d.pod IS NULL) ORDER BY d.name
"""

_EDGES_SQL = """
SELECT l.id, da.name AS a, pa.name AS a_port, pa.id AS a_port_id, db.name AS b, pb.name AS b_port,
       pb.id AS b_port_id, coalesce(pa.rail, pb.rail) AS rail, coalesce(pa.speed_gbps, pb.speed_gbps) AS speed_gbps,
       l.cable_type
FROM links l
JOIN ports pa ON pa.id = l.a_port_id JOIN devices da ON da.id = pa.device_id
JOIN ports pb ON pb.id = l.b_port_id JOIN devices db ON db.id = pb.device_id
WHERE (CAST(:pod AS text) IS NULL OR da.pod = :pod OR db.pod = :pod)
ORDER BY l.id
"""


def topology(conn: Connection, *, pod: str | None = None, hosts: bool = True,
             fleet_pods: list[str] | None = None) -> dict[str, Any]:
    """Nodes (devices with role, pod, rail, health) and edges (links with health and reasons).
    `fleet_pods`: port states read across shards, from these pods' shards."""
    alerts = open_alerts(conn, None)
    ports = port_states(conn, pod, errors=alerts is None, fleet_pods=fleet_pods)
    nodes = {r.name: {"id": r.name, "kind": r.kind, "role": r.role, "pod": r.pod, "rack": r.rack, "rail": None,
                      "health": "unknown", "alerts": 0, "reasons": []}
             for r in conn.execute(text(_NODES_SQL), {"pod": pod}).all()}
    by_port: dict[tuple[str, str], list[dict[str, Any]]] = defaultdict(list)
    for a in alerts or []:
        level = SEVERITY_HEALTH.get(a["severity"], "warning")
        node = nodes.get(a["device"])
        if node is not None:
            node["health"] = worst(node["health"], level)
            node["alerts"] += 1
            node["reasons"].append(f"{a['severity']}: {a['kind']}")
        for end in ((a["device"], a["port"]), (a["peer_device"], a["peer_port"])):
            if end[1] is not None:
                by_port[end].append(a)
    edges = []
    leaf_rails: dict[str, Counter[int]] = defaultdict(Counter)
    telemetry_seen: set[str] = set()
    for e in conn.execute(text(_EDGES_SQL), {"pod": pod}).mappings():
        health, reasons, alert_ids = "unknown", [], []
        for end_port, dev, port in ((e["a_port_id"], e["a"], e["a_port"]), (e["b_port_id"], e["b"], e["b_port"])):
            st = ports.get(end_port)
            if st is not None:
                telemetry_seen.add(dev)
                health = worst(health, st)
                if st != "ok":
                    reasons.append(f"{dev}:{port} {'oper down' if st == 'down' else 'errors rising'}")
            for a in by_port.get((dev, port), []):
                if a["id"] not in alert_ids:
                    alert_ids.append(a["id"])
                    health = worst(health, SEVERITY_HEALTH.get(a["severity"], "warning"))
                    reasons.append(f"{a['severity']}: {a['kind']} ({a['cause']})")
        edge = {"id": e["id"], "source": e["a"], "source_port": e["a_port"], "target": e["b"],
                "target_port": e["b_port"], "rail": e["rail"], "speed_gbps": e["speed_gbps"],
                "cable_type": e["cable_type"], "health": health, "reasons": reasons, "alerts": alert_ids}
        edges.append(edge)
        for here, there in ((e["a"], e["b"]), (e["b"], e["a"])):
            if e["rail"] is not None and nodes.get(here, {}).get("role") == "leaf" and \
                    nodes.get(there, {}).get("role") == "host":
                leaf_rails[here][e["rail"]] += 1
    for name, node in nodes.items():
        if name in telemetry_seen and node["health"] == "unknown":
            node["health"] = "ok"
        if leaf_rails.get(name):
            node["rail"] = leaf_rails[name].most_common(1)[0][0]
    # A bad link degrades both ends: down or critical links make their devices at least 'warning'.
    for edge in edges:
        if RANK[edge["health"]] >= RANK["warning"]:
            for end in (edge["source"], edge["target"]):
                node = nodes.get(end)
                if node is not None and RANK[node["health"]] < RANK["warning"]:
                    node["health"] = "warning"
                    node["reasons"].append(f"link {edge['id']} {edge['health']}")
    if not hosts:
        keep = {n for n, v in nodes.items() if v["role"] != "host"}
        nodes = {n: v for n, v in nodes.items() if n in keep}
        edges = [e for e in edges if e["source"] in keep and e["target"] in keep]
    pods: dict[str, Counter[str]] = defaultdict(Counter)
    for node in nodes.values():
        pods[node["pod"] or "(shared)"][node["health"]] += 1
    return {"health_source": "alerts" if alerts is not None else "telemetry",
            "nodes": list(nodes.values()), "edges": edges,
            "pods": [{"pod": p, "health": worst(*c.keys()), "devices": dict(c)} for p, c in sorted(pods.items())]}


# ---------------------------------------------------------------------------- summary

_RX_MARGIN_SQL = """
SELECT s.port_id, min(x.value - CAST(o.thresholds -> 'rx_power_dbm' ->> 'low_warning' AS float8)) AS margin
FROM series s JOIN optics o ON o.port_id = s.port_id
JOIN LATERAL last_samples(s.id, 1) x ON true
WHERE s.metric = 'optic_rx_power_dbm' AND o.thresholds -> 'rx_power_dbm' ? 'low_warning'
  AND x.value <> CAST('NaN' AS float8)  -- NaN readings carry no margin
GROUP BY s.port_id
"""
_FLEET_RX_MARGIN_SQL = f"""
SELECT x.port_id, min(x.value - CAST(o.thresholds -> 'rx_power_dbm' ->> 'low_warning' AS float8)) AS margin
FROM ({_FLEET_LATEST}) x JOIN optics o ON o.port_id = x.port_id
WHERE x.rn = 1 AND o.thresholds -> 'rx_power_dbm' ? 'low_warning' AND x.value <> CAST('NaN' AS float8)
GROUP BY x.port_id
"""


def _counts(conn: Connection, sql: str) -> dict[str, int]:
    return {str(k): int(v) for k, v in conn.execute(text(sql)).all()}


def summary(conn: Connection, *, worst_n: int = 10, fleet_pods: list[str] | None = None) -> dict[str, Any]:
    """Counts, target states, alerts by severity and state, drains, open incidents, and the worst links.
    `fleet_pods`: telemetry (port states, Rx margins) read across shards, from these pods' shards."""
    out: dict[str, Any] = {
        "devices": {"total": conn.execute(text("SELECT count(*) FROM devices")).scalar_one(),
                    "by_role": _counts(conn, "SELECT role, count(*) FROM devices GROUP BY role")},
        "pods": conn.execute(text("SELECT count(DISTINCT pod) FROM devices WHERE pod IS NOT NULL")).scalar_one(),
        "ports": conn.execute(text("SELECT count(*) FROM ports")).scalar_one(),
        "links": conn.execute(text("SELECT count(*) FROM links")).scalar_one(),
        "optics": conn.execute(text("SELECT count(*) FROM optics")).scalar_one(),
    }
    targets = {"ok": 0, "failing": 0, "never_polled": 0}
    targets.update(_counts(conn, """
        SELECT CASE WHEN t.last_attempt IS NULL THEN 'never_polled'
                    WHEN t.consecutive_failures > 0 THEN 'failing' ELSE 'ok' END, count(*)
        FROM endpoints e LEFT JOIN target_status t ON t.endpoint_id = e.id GROUP BY 1"""))
    out["targets"] = targets
    if has_table(conn, "alerts"):
        out["alerts"] = {
            "available": True,
            "open_by_severity": _counts(conn, "SELECT severity, count(*) FROM alerts "
                                              "WHERE state IN ('firing', 'acknowledged') GROUP BY 1"),
            "by_state": _counts(conn, "SELECT state, count(*) FROM alerts GROUP BY 1"),
        }
    else:
        out["alerts"] = {"available": False, "open_by_severity": {}, "by_state": {}}
    if has_table(conn, "drain_recommendations"):
        by_status = _counts(conn, "SELECT status, count(*) FROM drain_recommendations GROUP BY 1")
        out["drains"] = {"available": True, "by_status": by_status, "pending": by_status.get("pending", 0),
                         "blocked": by_status.get("blocked", 0)}
    else:
        out["drains"] = {"available": False, "by_status": {}, "pending": 0, "blocked": 0}
    if has_table(conn, "incidents"):
        out["incidents"] = {"available": True, "open": conn.execute(text(
            "SELECT count(*) FROM incidents WHERE closed_at IS NULL")).scalar_one()}
    else:
        out["incidents"] = {"available": False, "open": 0}
    topo = topology(conn, fleet_pods=fleet_pods)
    out["health_source"] = topo["health_source"]
    out["device_health"] = dict(Counter(n["health"] for n in topo["nodes"]))
    out["link_health"] = dict(Counter(e["health"] for e in topo["edges"]))
    out["worst_links"] = worst_links(conn, topo["edges"], worst_n, fleet_pods)
    return out


def worst_links(conn: Connection, edges: list[dict[str, Any]], n: int,
                fleet_pods: list[str] | None = None) -> list[dict[str, Any]]:
    """Links ranked by health, then by the smallest Rx margin to low-warning at either end."""
    margins = conn.execute(text(_FLEET_RX_MARGIN_SQL), {"pods": fleet_pods, "metrics": ["optic_rx_power_dbm"]}) \
        if fleet_pods is not None else conn.execute(text(_RX_MARGIN_SQL))
    margin: dict[int, float] = {pid: m for pid, m in margins.all()}
    port_ids: dict[int, tuple[int, int]] = {
        lid: (a, b) for lid, a, b in conn.execute(text("SELECT id, a_port_id, b_port_id FROM links")).all()}
    ranked = []
    for e in edges:
        a, b = port_ids.get(e["id"], (0, 0))
        ms = [m for m in (margin.get(a), margin.get(b)) if m is not None]
        m = min(ms) if ms else None
        if RANK[e["health"]] <= RANK["ok"] and (m is None or m > 3.0):
            continue  # healthy with room to spare: not worth a NOC's attention
        ranked.append({**{k: e[k] for k in ("id", "source", "source_port", "target", "target_port", "rail",
                                            "health", "reasons", "alerts")},
                       "rx_margin_db": None if m is None else round(m, 2)})
    ranked.sort(key=lambda r: (-RANK[r["health"]], r["rx_margin_db"] if r["rx_margin_db"] is not None else 1e9))
    return ranked[:n]
