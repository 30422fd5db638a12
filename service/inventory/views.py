"""Inventory endpoints: devices, ports, links and optics (with live DOM and threshold margins).

Lists are keyset-paginated: `limit` items and an opaque `next_cursor` that encodes the last
row's sort key. A page never repeats or skips a row that existed when the first page was
read, however many rows are inserted meanwhile (offsets would shift). Endpoint `config`
blocks are never returned: they hold credential references and collector settings.
"""

from __future__ import annotations

import base64
import binascii
import json
import math
from datetime import datetime
from typing import Annotated, Any, Generic, Literal, TypeVar

from fastapi import APIRouter, Query, Response
from pydantic import BaseModel, Field
from sqlalchemy import Connection, text

from service.api.auth import ReadScope
from service.api.deps import EngineDep, SettingsDep
from service.api.problems import Problem
from service.inventory.schemas import DeviceKind, DeviceRole
from service.shards.views import say_missing
from service.telemetry.schemas import TargetState

router = APIRouter(prefix="/api/v1", tags=["inventory"])

Limit = Annotated[int, Query(ge=1, le=1000, description="page size")]
Cursor = Annotated[str | None, Query(description="next_cursor from the previous page")]

# DOM quantities: threshold key -> (metric, per lane?)
DOM = {
    "rx_power_dbm": ("optic_rx_power_dbm", True),
    "tx_power_dbm": ("optic_tx_power_dbm", True),
    "tx_bias_amperes": ("optic_tx_bias_amperes", True),
    "temperature_celsius": ("optic_temperature_celsius", False),
    "voltage_volts": ("optic_voltage_volts", False),
}
_METRIC_KEY = {m: k for k, (m, _) in DOM.items()}


# ---------------------------------------------------------------------------- response models

Item = TypeVar("Item")
DomStatus = Literal["ok", "warning", "alarm", "unknown"]


class Page(BaseModel, Generic[Item]):
    items: list[Item]
    next_cursor: str | None = Field(description="pass as `cursor` for the next page; null: this is the last")


class EndpointRef(BaseModel):
    protocol: str
    address: str
    port: int | None


class DeviceItem(BaseModel):
    name: str
    kind: str
    role: str
    pod: str | None
    rack: str | None
    vendor: str | None
    model: str | None
    mgmt_address: str | None
    gpus: int
    ports: int = Field(description="how many ports")
    endpoints: list[EndpointRef]


class PortOptic(BaseModel):
    type: str | None
    part_number: str | None
    vendor: str | None
    serial: str | None
    form_factor: str | None
    lanes: int | None


class PortPeer(BaseModel):
    link_id: int
    device: str
    port: str


class DevicePort(BaseModel):
    name: str
    speed_gbps: float | None
    rail: int | None
    gpu: int | None
    nic: str | None
    optic: PortOptic | None
    peer: PortPeer | None
    oper_up: bool | None = Field(description="the latest port_oper_up sample; null: none stored")
    oper_at: datetime | None


class DeviceTarget(EndpointRef):
    last_attempt: datetime | None
    last_success: datetime | None
    last_error: str | None
    consecutive_failures: int
    state: TargetState


class DeviceDetail(BaseModel):
    name: str
    kind: str
    role: str
    pod: str | None
    rack: str | None
    vendor: str | None
    model: str | None
    mgmt_address: str | None
    gpus: int
    updated_at: datetime
    ports: list[DevicePort]
    endpoints: list[DeviceTarget]
    missing_pods: list[str] = Field(description="the device's pod when its shard did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header): oper status unknown, not down; "
                                    "empty when the answer is whole")


class PortItem(BaseModel):
    id: int
    device: str
    name: str
    speed_gbps: float | None
    rail: int | None
    gpu: int | None
    nic: str | None
    optic_type: str | None
    link_id: int | None
    peer_device: str | None
    peer_port: str | None


class LinkEnd(BaseModel):
    device: str
    port: str


class LinkItem(BaseModel):
    id: int
    a: LinkEnd
    b: LinkEnd
    cable_type: str
    length_m: float | None
    speed_gbps: float | None
    rail: int | None
    pod: str | None


class DomReading(BaseModel):
    value: float | None
    at: datetime
    margin: dict[str, float] | None = Field(description="reading minus each low threshold, each high threshold "
                                            "minus the reading: negative is past it")
    status: DomStatus


class DomLane(BaseModel):
    """One lane's readings; a quantity without a stored reading is absent."""

    lane: int
    rx_power_dbm: DomReading | None = None
    tx_power_dbm: DomReading | None = None
    tx_bias_amperes: DomReading | None = None


class Dom(BaseModel):
    at: datetime | None = Field(description="the newest reading's time")
    module: dict[str, DomReading] = Field(description="temperature_celsius, voltage_volts")
    lanes: list[DomLane]


class WorstRxMargin(BaseModel):
    lane: int
    quantity: str
    to: str
    margin_db: float


class OpticItem(BaseModel):
    id: int
    device: str
    port: str
    vendor: str | None
    part_number: str | None
    serial: str | None
    type: str | None
    form_factor: str | None
    lanes: int
    thresholds: dict[str, dict[str, float]] = Field(description="quantity -> low_alarm, low_warning, ... "
                                                    "as the inventory gives them")
    dom: Dom
    status: DomStatus
    worst_rx_margin: WorstRxMargin | None


# ---------------------------------------------------------------------------- cursors

def encode_cursor(kind: str, key: Any) -> str:
    raw = json.dumps({"k": kind, "v": key}, separators=(",", ":")).encode()
    return base64.urlsafe_b64encode(raw).decode().rstrip("=")


def decode_cursor(cursor: str | None, kind: str) -> Any:
    """The keyset value of a cursor made by this resource; a 400 problem otherwise."""
    if cursor is None:
        return None
    try:
        data = json.loads(base64.urlsafe_b64decode(cursor + "=" * (-len(cursor) % 4)))
        if data["k"] != kind:
            raise ValueError
        return data["v"]
    except (binascii.Error, ValueError, KeyError, TypeError, UnicodeDecodeError):
        raise Problem(400, "Bad cursor", f"not a cursor of /{kind}; start again without one") from None


def _page(rows: list[dict[str, Any]], limit: int, kind: str, key: str) -> dict[str, Any]:
    more = len(rows) > limit
    rows = rows[:limit]
    return {"items": rows, "next_cursor": encode_cursor(kind, rows[-1][key]) if more and rows else None}


def _num(v: float | None) -> float | None:
    return None if v is None or math.isnan(v) or math.isinf(v) else v


# ---------------------------------------------------------------------------- devices

_DEVICES_SQL = """
SELECT d.id, d.name, d.kind, d.role, d.pod, d.rack, d.vendor, d.model, d.mgmt_address, d.gpus,
       (SELECT count(*) FROM ports p WHERE p.device_id = d.id) AS ports,
       coalesce((SELECT json_agg(json_build_object('protocol', e.protocol, 'address', e.address, 'port', e.port)
                                 ORDER BY e.protocol)
                 FROM endpoints e WHERE e.device_id = d.id), '[]') AS endpoints
FROM devices d
WHERE (CAST(:role AS text) IS NULL OR d.role = :role)
  AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
  AND (CAST(:kind AS text) IS NULL OR d.kind = :kind)
  AND (CAST(:after AS text) IS NULL OR d.name > :after)
ORDER BY d.name
LIMIT :limit
"""


@router.get("/devices", summary="Devices, by name; filter by role, pod or kind", response_model=Page[DeviceItem])
def list_devices(engine: EngineDep, _: ReadScope, role: DeviceRole | None = None, pod: str | None = None,
                 kind: DeviceKind | None = None, limit: Limit = 100, cursor: Cursor = None) -> dict[str, Any]:
    after = decode_cursor(cursor, "devices")
    with engine.connect() as conn:
        rows = conn.execute(text(_DEVICES_SQL), {"role": role, "pod": pod, "kind": kind, "after": after,
                                                 "limit": limit + 1}).mappings().all()
    items = [{k: v for k, v in r.items() if k != "id"} for r in rows]
    return _page(items, limit, "devices", "name")


_DEVICE_PORTS_SQL = """
SELECT p.id, p.name, p.speed_gbps, p.rail, p.gpu, p.nic,
       o.type AS optic_type, o.part_number, o.vendor AS optic_vendor, o.serial, o.form_factor, o.lanes,
       l.id AS link_id, pd.name AS peer_device, pp.name AS peer_port
FROM ports p
LEFT JOIN optics o ON o.port_id = p.id
LEFT JOIN links l ON l.a_port_id = p.id OR l.b_port_id = p.id
LEFT JOIN ports pp ON pp.id = CASE WHEN l.a_port_id = p.id THEN l.b_port_id ELSE l.a_port_id END
LEFT JOIN devices pd ON pd.id = pp.device_id
WHERE p.device_id = :id
ORDER BY p.id
"""

# Each port's newest port_oper_up sample: on one server from its own series; sharded, from the device's shard
# through the fleet tables (port ids are the control database's on every shard).
_OPER_SQL = """
SELECT s.port_id, st.value, st.ts FROM series s JOIN LATERAL last_samples(s.id, 1) st ON true
WHERE s.metric = 'port_oper_up' AND s.device_id = :id AND s.port_id IS NOT NULL
  AND s.lane IS NULL AND s.priority IS NULL AND s.gpu IS NULL
"""
_FLEET_OPER_SQL = """
SELECT port_id, value, ts FROM fleet.latest
WHERE pod = ANY(:pods) AND metric = 'port_oper_up' AND rn = 1 AND port_id = ANY(:ports) AND lane IS NULL
"""


def _oper(conn: Connection, settings: Any, device_id: int, pod: str | None, ports: list[int]
          ) -> tuple[dict[int, tuple[float, datetime]], list[str]]:
    """Port id -> (latest port_oper_up, its time), and the device's pod when its shard did not answer."""
    from service.shards.views import fleet_topology

    shards = fleet_topology(conn.engine, settings)
    if shards is None:
        return {r[0]: (r[1], r[2]) for r in conn.execute(text(_OPER_SQL), {"id": device_id})}, []
    from service.shards.fleet import read_fleet

    def read(pods: list[str], _: dict[str, str]) -> dict[int, tuple[float, datetime]]:
        if not pods:
            return {}
        return {r[0]: (r[1], r[2]) for r in conn.execute(text(_FLEET_OPER_SQL), {"pods": pods, "ports": ports})}

    got, seen = read_fleet(conn, shards, read, asked={pod or ""})
    return got, seen.missing_shown


_TARGETS_SQL = """
SELECT e.protocol, e.address, e.port, t.last_attempt, t.last_success, t.last_error,
       coalesce(t.consecutive_failures, 0) AS consecutive_failures
FROM endpoints e LEFT JOIN target_status t ON t.endpoint_id = e.id
WHERE e.device_id = :id ORDER BY e.protocol
"""


@router.get("/devices/{name}", summary="One device with its ports (optic, peer, oper status) and targets",
            response_model=DeviceDetail)
def get_device(name: str, engine: EngineDep, settings: SettingsDep, response: Response,
               _: ReadScope) -> dict[str, Any]:
    with engine.connect() as conn:
        dev = conn.execute(text("SELECT id, name, kind, role, pod, rack, vendor, model, mgmt_address, gpus, "
                                "updated_at FROM devices WHERE name = :n"), {"n": name}).mappings().first()
        if dev is None:
            raise Problem(404, "Not found", f"no device named {name!r}")
        rows = conn.execute(text(_DEVICE_PORTS_SQL), {"id": dev["id"]}).mappings().all()
        targets = []
        for t in conn.execute(text(_TARGETS_SQL), {"id": dev["id"]}).mappings():
            state = "never_polled" if t["last_attempt"] is None else (
                "failing" if t["consecutive_failures"] else "ok")
            targets.append({**t, "state": state})
        oper, missing = _oper(conn, settings, dev["id"], dev["pod"], sorted({r["id"] for r in rows}))
    ports = []
    for r in rows:
        up, at = oper.get(r["id"], (None, None))
        ports.append({
            "name": r["name"], "speed_gbps": r["speed_gbps"], "rail": r["rail"], "gpu": r["gpu"],
            "nic": r["nic"],
            "optic": None if r["optic_type"] is None and r["part_number"] is None else {
                "type": r["optic_type"], "part_number": r["part_number"], "vendor": r["optic_vendor"],
                "serial": r["serial"], "form_factor": r["form_factor"], "lanes": r["lanes"]},
            "peer": None if r["link_id"] is None else {
                "link_id": r["link_id"], "device": r["peer_device"], "port": r["peer_port"]},
            "oper_up": None if up is None else up >= 0.5, "oper_at": at,
        })
    out = {k: v for k, v in dev.items() if k != "id"}
    out.update(ports=ports, endpoints=targets)
    return say_missing(response, out, missing)


# ---------------------------------------------------------------------------- ports and links

_PORTS_SQL = """
SELECT p.id, d.name AS device, p.name, p.speed_gbps, p.rail, p.gpu, p.nic, o.type AS optic_type,
       l.id AS link_id, pd.name AS peer_device, pp.name AS peer_port
FROM ports p JOIN devices d ON d.id = p.device_id
LEFT JOIN optics o ON o.port_id = p.id
LEFT JOIN links l ON l.a_port_id = p.id OR l.b_port_id = p.id
LEFT JOIN ports pp ON pp.id = CASE WHEN l.a_port_id = p.id THEN l.b_port_id ELSE l.a_port_id END
LEFT JOIN devices pd ON pd.id = pp.device_id
WHERE (CAST(:device AS text) IS NULL OR d.name = :device)
  AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
  AND (CAST(:rail AS int) IS NULL OR p.rail = :rail)
  AND (CAST(:after AS bigint) IS NULL OR p.id > :after)
ORDER BY p.id
LIMIT :limit
"""


@router.get("/ports", summary="Ports with their optic type and link peer; filter by device, pod or rail",
            response_model=Page[PortItem])
def list_ports(engine: EngineDep, _: ReadScope, device: str | None = None, pod: str | None = None,
               rail: Annotated[int | None, Query(ge=0)] = None, limit: Limit = 100,
               cursor: Cursor = None) -> dict[str, Any]:
    after = decode_cursor(cursor, "ports")
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(text(_PORTS_SQL), {
            "device": device, "pod": pod, "rail": rail, "after": after, "limit": limit + 1}).mappings()]
    return _page(rows, limit, "ports", "id")


_LINKS_SQL = """
SELECT l.id, da.name AS a_device, pa.name AS a_port, db.name AS b_device, pb.name AS b_port,
       l.cable_type, l.length_m, coalesce(pa.speed_gbps, pb.speed_gbps) AS speed_gbps,
       coalesce(pa.rail, pb.rail) AS rail, coalesce(da.pod, db.pod) AS pod
FROM links l
JOIN ports pa ON pa.id = l.a_port_id JOIN devices da ON da.id = pa.device_id
JOIN ports pb ON pb.id = l.b_port_id JOIN devices db ON db.id = pb.device_id
WHERE (CAST(:device AS text) IS NULL OR da.name = :device OR db.name = :device)
  AND (CAST(:pod AS text) IS NULL OR da.pod = :pod OR db.pod = :pod)
  AND (CAST(:after AS bigint) IS NULL OR l.id > :after)
ORDER BY l.id
LIMIT :limit
"""


def _link(r: Any) -> dict[str, Any]:
    return {"id": r["id"], "a": {"device": r["a_device"], "port": r["a_port"]},
            "b": {"device": r["b_device"], "port": r["b_port"]}, "cable_type": r["cable_type"],
            "length_m": r["length_m"], "speed_gbps": r["speed_gbps"], "rail": r["rail"], "pod": r["pod"]}


@router.get("/links", summary="Links (both ends, cable); filter by device or pod", response_model=Page[LinkItem])
def list_links(engine: EngineDep, _: ReadScope, device: str | None = None, pod: str | None = None,
               limit: Limit = 100, cursor: Cursor = None) -> dict[str, Any]:
    after = decode_cursor(cursor, "links")
    with engine.connect() as conn:
        rows = [_link(r) for r in conn.execute(text(_LINKS_SQL), {
            "device": device, "pod": pod, "after": after, "limit": limit + 1}).mappings()]
    return _page(rows, limit, "links", "id")


# ---------------------------------------------------------------------------- optics

_OPTICS_SQL = """
SELECT o.id, o.port_id, p.device_id, d.name AS device, p.name AS port, o.vendor, o.part_number, o.serial,
       o.type, o.form_factor, o.lanes, o.thresholds
FROM optics o JOIN ports p ON p.id = o.port_id JOIN devices d ON d.id = p.device_id
WHERE (CAST(:device AS text) IS NULL OR d.name = :device)
  AND (CAST(:port AS text) IS NULL OR p.name = :port)
  AND (CAST(:pod AS text) IS NULL OR d.pod = :pod)
  AND (CAST(:after AS bigint) IS NULL OR o.id > :after)
ORDER BY o.id
LIMIT :limit
"""

# The newest reading of each DOM series of the page's ports (one index probe per series).
_DOM_SQL = """
SELECT s.port_id, s.metric, s.lane, x.ts, x.value
FROM unnest(CAST(:devices AS int[]), CAST(:ports AS int[])) AS t(device_id, port_id)
JOIN series s ON s.device_id = t.device_id AND s.port_id = t.port_id AND s.metric = ANY(:metrics)
JOIN LATERAL last_samples(s.id, 1) x ON true
"""
# Across shards: the same from the shards' newest samples (service/shards/fleet.py), of the pods `:pods`.
_FLEET_DOM_SQL = """
SELECT port_id, metric, lane, ts, value FROM fleet.latest
WHERE rn = 1 AND pod = ANY(:pods) AND metric = ANY(:metrics) AND port_id = ANY(:ports)
"""


class OpticPage(Page[OpticItem]):
    missing_pods: list[str] = Field(description="pods of the shards that did not answer (the "
                                    "X-Fabricwatch-Missing-Pods header); empty when the answer is whole")


def margins(value: float | None, th: dict[str, Any] | None) -> dict[str, float] | None:
    """Distance from a reading to each threshold, positive while inside (dB for power, A, C, V)."""
    if value is None or not th:
        return None
    out = {}
    for key, sign in (("low_alarm", 1), ("low_warning", 1), ("high_warning", -1), ("high_alarm", -1)):
        if th.get(key) is not None:
            out[key] = round(sign * (value - th[key]), 4)
    return out


def status(m: dict[str, float] | None) -> str:
    if not m:
        return "unknown"
    if any(m.get(k, 1) < 0 for k in ("low_alarm", "high_alarm")):
        return "alarm"
    if any(m.get(k, 1) < 0 for k in ("low_warning", "high_warning")):
        return "warning"
    return "ok"


def optic_doms(conn: Connection, rows: list[dict[str, Any]], fleet_pods: list[str] | None = None
               ) -> list[dict[str, Any]]:
    """Attach the latest DOM per lane, the module thresholds and the margins to each optic row.
    `fleet_pods`: the DOM read across shards, from these pods' shards."""
    latest: dict[int, list[tuple[str, int | None, Any, float]]] = {}
    if rows:
        sql = _FLEET_DOM_SQL if fleet_pods is not None else _DOM_SQL
        for pid, metric, lane, ts, value in conn.execute(text(sql), {
                "devices": [r["device_id"] for r in rows], "ports": [r["port_id"] for r in rows],
                "metrics": [m for m, _ in DOM.values()], "pods": fleet_pods}).all():
            latest.setdefault(pid, []).append((metric, lane, ts, value))
    out = []
    for r in rows:
        th = r["thresholds"] or {}
        lanes: dict[int, dict[str, Any]] = {}
        module: dict[str, Any] = {}
        newest = None
        for metric, lane, ts, value in latest.get(r["port_id"], []):
            key = _METRIC_KEY[metric]
            v = _num(value)
            reading = {"value": v, "at": ts, "margin": margins(v, th.get(key))}
            reading["status"] = status(reading["margin"])
            newest = ts if newest is None or ts > newest else newest
            if DOM[key][1] and lane is not None:
                lanes.setdefault(lane, {"lane": lane})[key] = reading
            else:
                module[key] = reading
        worst = None
        for ln in lanes.values():
            m = (ln.get("rx_power_dbm") or {}).get("margin") or {}
            if "low_warning" in m and (worst is None or m["low_warning"] < worst["margin_db"]):
                worst = {"lane": ln["lane"], "quantity": "rx_power_dbm", "to": "low_warning",
                         "margin_db": m["low_warning"]}
        states = [q["status"] for ln in lanes.values() for k, q in ln.items() if k != "lane"]
        states += [q["status"] for q in module.values()]
        overall = "alarm" if "alarm" in states else "warning" if "warning" in states else \
            "ok" if states else "unknown"
        out.append({
            "id": r["id"], "device": r["device"], "port": r["port"], "vendor": r["vendor"],
            "part_number": r["part_number"], "serial": r["serial"], "type": r["type"],
            "form_factor": r["form_factor"], "lanes": r["lanes"], "thresholds": th,
            "dom": {"at": newest, "module": module, "lanes": [lanes[k] for k in sorted(lanes)]},
            "status": overall, "worst_rx_margin": worst,
        })
    return out


@router.get("/optics", summary="Optics with current DOM per lane, module thresholds and margins",
            response_model=OpticPage, response_model_exclude_unset=True)
def list_optics(engine: EngineDep, settings: SettingsDep, response: Response, _: ReadScope,
                device: str | None = None, port: str | None = None,
                pod: str | None = None, limit: Annotated[int, Query(ge=1, le=500)] = 100,
                cursor: Cursor = None) -> dict[str, Any]:
    after = decode_cursor(cursor, "optics")
    with engine.connect() as conn:
        rows = [dict(r) for r in conn.execute(text(_OPTICS_SQL), {
            "device": device, "port": port, "pod": pod, "after": after, "limit": limit + 1}).mappings()]
        more = len(rows) > limit
        items, missing = _doms(conn, settings, rows[:limit])
    return say_missing(response, {
        "items": items, "next_cursor": encode_cursor("optics", items[-1]["id"]) if more and items else None},
        missing)


def _doms(conn: Connection, settings: Any, rows: list[dict[str, Any]]) -> tuple[list[dict[str, Any]], list[str]]:
    """optic_doms, across shards when they are configured: the page's devices' pods are what can be missing."""
    from service.shards.views import fleet_topology

    shards = fleet_topology(conn.engine, settings)
    if shards is None:
        return optic_doms(conn, rows), []
    from service.shards.fleet import read_fleet

    asked = set(conn.execute(text("SELECT coalesce(pod, '') FROM devices WHERE id = ANY(:ids)"),
                             {"ids": [r["device_id"] for r in rows]}).scalars())
    items, seen = read_fleet(conn, shards, lambda pods, _: optic_doms(conn, rows, pods), asked=asked)
    return items, seen.missing_shown
