"""Inventory logic: load a validated Inventory into PostgreSQL, and export it back.

The load is set-based: the file is COPYed into temporary staging tables, then a handful of
INSERT ... ON CONFLICT DO UPDATE ... WHERE <something differs> and DELETE statements make the
tables match. A 300k-port fabric is then a few statements, not 300k ORM round trips, and
rows that did not change are not touched (so a second load reports, and writes, nothing).

Sync policy (docs/inventory.md, "Loading"): the file is authoritative for every device it
lists (ports, optics, endpoints and links of those devices that are not in the file are
deleted). Devices and pods that are not in the file are kept and reported, unless
`prune=True`: deleting a device deletes its telemetry history, and loading one pod's file
should not wipe the rest of the fabric.
"""

from __future__ import annotations

import json
import time
from collections.abc import Iterable, Sequence
from dataclasses import dataclass, field
from typing import Any

from psycopg import Cursor
from sqlalchemy.orm import Session

from service.inventory.loader import split_port_ref, validate_inventory
from service.inventory.schemas import Endpoint, Inventory

# Endpoint fields that have their own columns; everything else goes to Endpoint.config.
_ENDPOINT_COLUMNS = {"protocol", "address", "port"}


@dataclass
class Changes:
    """Row counts of one table changed by a load."""

    added: int = 0
    updated: int = 0
    removed: int = 0

    @property
    def total(self) -> int:
        return self.added + self.updated + self.removed


@dataclass
class UpsertReport:
    """What a load changed, table by table, and what it kept that the file no longer lists."""

    pods: Changes = field(default_factory=Changes)
    devices: Changes = field(default_factory=Changes)
    ports: Changes = field(default_factory=Changes)
    optics: Changes = field(default_factory=Changes)
    endpoints: Changes = field(default_factory=Changes)
    links: Changes = field(default_factory=Changes)
    kept_devices: list[str] = field(default_factory=list)
    kept_pods: list[str] = field(default_factory=list)
    elapsed_s: float = 0.0

    TABLES = ("pods", "devices", "ports", "optics", "endpoints", "links")

    @property
    def total_changes(self) -> int:
        return sum(getattr(self, t).total for t in self.TABLES)

    def as_dict(self) -> dict[str, Any]:
        out: dict[str, Any] = {t: vars(getattr(self, t)).copy() for t in self.TABLES}
        out.update(kept_devices=self.kept_devices, kept_pods=self.kept_pods,
                   total_changes=self.total_changes, elapsed_s=round(self.elapsed_s, 3))
        return out


# ---------------------------------------------------------------------------- staging

_STAGING = {
    "_inv_pods": "ord int, name text, description text",
    "_inv_devices": "ord int, name text, kind text, role text, pod text, rack text, vendor text, model text, "
                    "mgmt_address text, gpus int",
    "_inv_ports": "ord int, device text, name text, speed_gbps float8, rail int, gpu int, nic text, "
                  "has_optic bool, o_vendor text, o_part_number text, o_serial text, o_type text, "
                  "o_form_factor text, o_lanes int, o_thresholds jsonb",
    "_inv_endpoints": "ord int, device text, protocol text, address text, port int, config jsonb",
    "_inv_links": "ord int, a_device text, a_port text, b_device text, b_port text, cable_type text, "
                  "length_m float8",
}


def _copy(cur: Cursor[Any], table: str, rows: Iterable[Sequence[Any]]) -> None:
    cols = ", ".join(c.split()[0] for c in _STAGING[table].split(", "))
    with cur.copy(f"COPY {table} ({cols}) FROM STDIN") as cp:
        for row in rows:
            cp.write_row(row)


def endpoint_config(ep: Endpoint) -> dict[str, Any]:
    """The JSON kept in Endpoint.config: settings and secret references (never resolved secrets)."""
    return ep.model_dump(mode="json", exclude=_ENDPOINT_COLUMNS, exclude_none=True)


def _stage(cur: Cursor[Any], inv: Inventory) -> None:
    for table, cols in _STAGING.items():
        # ON COMMIT DROP cleans up after the caller's commit; the explicit DROP below also
        # covers two loads in one transaction.
        cur.execute(f"DROP TABLE IF EXISTS {table}")
        cur.execute(f"CREATE TEMP TABLE {table} ({cols}) ON COMMIT DROP")
    _copy(cur, "_inv_pods", ((i, p.name, p.description) for i, p in enumerate(inv.pods)))
    _copy(cur, "_inv_devices", ((i, d.name, d.kind, d.role, d.pod, d.rack, d.vendor, d.model, d.mgmt_address,
                                 d.gpus) for i, d in enumerate(inv.devices)))

    def port_rows() -> Iterable[Sequence[Any]]:
        n = 0
        for d in inv.devices:
            for p in d.ports:
                o = p.optic
                optic: tuple[Any, ...] = (
                    (True, o.vendor, o.part_number, o.serial, o.type, o.form_factor, o.lanes,
                     json.dumps(o.thresholds.model_dump(mode="json", exclude_none=True)))
                    if o is not None else (False, None, None, None, None, None, None, None))
                yield (n, d.name, p.name, p.speed_gbps, p.rail, p.gpu, p.nic, *optic)
                n += 1

    _copy(cur, "_inv_ports", port_rows())
    _copy(cur, "_inv_endpoints", (
        (i, d.name, ep.protocol, ep.address, ep.port, json.dumps(endpoint_config(ep)))
        for i, (d, ep) in enumerate((d, ep) for d in inv.devices for ep in d.endpoints)))

    ports_by_device = {d.name: {p.name for p in d.ports} for d in inv.devices}

    def link_rows() -> Iterable[Sequence[Any]]:
        for i, link in enumerate(inv.links):
            a = split_port_ref(link.a, ports_by_device)
            b = split_port_ref(link.b, ports_by_device)
            assert a is not None and b is not None  # validate_inventory checked the references
            yield (i, *a, *b, link.cable.type, link.cable.length_m)

    _copy(cur, "_inv_links", link_rows())
    cur.execute("CREATE INDEX ON _inv_ports (device, name)")
    for table in _STAGING:
        cur.execute(f"ANALYZE {table}")  # autovacuum never analyses temp tables; plans need row counts


# ---------------------------------------------------------------------------- statements

# Each upsert returns (added, updated); rows equal to the file are left alone by the WHERE.
_UPSERT_PODS = """
WITH up AS (
  INSERT INTO pods (name, description)
  SELECT name, description FROM _inv_pods ORDER BY ord
  ON CONFLICT (name) DO UPDATE SET description = EXCLUDED.description
  WHERE pods.description IS DISTINCT FROM EXCLUDED.description
  RETURNING (xmax = 0) AS ins)
SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM up"""

_UPSERT_DEVICES = """
WITH up AS (
  INSERT INTO devices (name, kind, role, pod, rack, vendor, model, mgmt_address, gpus)
  SELECT name, kind, role, pod, rack, vendor, model, mgmt_address, gpus FROM _inv_devices ORDER BY ord
  ON CONFLICT (name) DO UPDATE SET kind = EXCLUDED.kind, role = EXCLUDED.role, pod = EXCLUDED.pod,
    rack = EXCLUDED.rack, vendor = EXCLUDED.vendor, model = EXCLUDED.model,
    mgmt_address = EXCLUDED.mgmt_address, gpus = EXCLUDED.gpus, updated_at = now()
  WHERE (devices.kind, devices.role, devices.pod, devices.rack, devices.vendor, devices.model,
         devices.mgmt_address, devices.gpus)
    IS DISTINCT FROM (EXCLUDED.kind, EXCLUDED.role, EXCLUDED.pod, EXCLUDED.rack, EXCLUDED.vendor,
                      EXCLUDED.model, EXCLUDED.mgmt_address, EXCLUDED.gpus)
  RETURNING (xmax = 0) AS ins)
SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM up"""

_UPSERT_PORTS = """
WITH up AS (
  INSERT INTO ports (device_id, name, speed_gbps, rail, gpu, nic)
  SELECT d.id, s.name, s.speed_gbps, s.rail, s.gpu, s.nic
  FROM _inv_ports s JOIN devices d ON d.name = s.device ORDER BY s.ord
  ON CONFLICT (device_id, name) DO UPDATE SET speed_gbps = EXCLUDED.speed_gbps, rail = EXCLUDED.rail,
    gpu = EXCLUDED.gpu, nic = EXCLUDED.nic
  WHERE (ports.speed_gbps, ports.rail, ports.gpu, ports.nic)
    IS DISTINCT FROM (EXCLUDED.speed_gbps, EXCLUDED.rail, EXCLUDED.gpu, EXCLUDED.nic)
  RETURNING (xmax = 0) AS ins)
SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM up"""

# The file's links as port ids, once the ports exist.
_WANTED_LINKS = """
CREATE TEMP TABLE _inv_link_ids ON COMMIT DROP AS
SELECT l.ord, pa.id AS a_id, pb.id AS b_id, l.cable_type, l.length_m
FROM _inv_links l
JOIN devices da ON da.name = l.a_device JOIN ports pa ON pa.device_id = da.id AND pa.name = l.a_port
JOIN devices db ON db.name = l.b_device JOIN ports pb ON pb.device_id = db.id AND pb.name = l.b_port"""

# Ports of the devices the file lists: the scope in which the file is authoritative.
_SCOPE_PORTS = """
CREATE TEMP TABLE _inv_scope_ports ON COMMIT DROP AS
SELECT p.id, p.name, d.name AS device FROM ports p JOIN devices d ON d.id = p.device_id
JOIN _inv_devices s ON s.name = d.name"""

_DELETE_LINKS = """
WITH gone AS (
  DELETE FROM links k
  WHERE (k.a_port_id IN (SELECT id FROM _inv_scope_ports) OR k.b_port_id IN (SELECT id FROM _inv_scope_ports))
    AND NOT EXISTS (SELECT 1 FROM _inv_link_ids w WHERE w.a_id = k.a_port_id AND w.b_id = k.b_port_id)
  RETURNING 1)
SELECT count(*) FROM gone"""

_DELETE_ENDPOINTS = """
WITH gone AS (
  DELETE FROM endpoints e USING devices d, _inv_devices s
  WHERE e.device_id = d.id AND d.name = s.name
    AND NOT EXISTS (SELECT 1 FROM _inv_endpoints x WHERE x.device = d.name AND x.protocol = e.protocol)
  RETURNING 1)
SELECT count(*) FROM gone"""

_DELETE_OPTICS = """
WITH gone AS (
  DELETE FROM optics o USING _inv_scope_ports sp
  WHERE o.port_id = sp.id
    AND NOT EXISTS (SELECT 1 FROM _inv_ports x WHERE x.device = sp.device AND x.name = sp.name AND x.has_optic)
  RETURNING 1)
SELECT count(*) FROM gone"""

_DELETE_PORTS = """
WITH gone AS (
  DELETE FROM ports p USING _inv_scope_ports sp
  WHERE p.id = sp.id AND NOT EXISTS (SELECT 1 FROM _inv_ports x WHERE x.device = sp.device AND x.name = sp.name)
  RETURNING 1)
SELECT count(*) FROM gone"""

_UPSERT_OPTICS = """
WITH up AS (
  INSERT INTO optics (port_id, vendor, part_number, serial, type, form_factor, lanes, thresholds)
  SELECT p.id, x.o_vendor, x.o_part_number, x.o_serial, x.o_type, x.o_form_factor, x.o_lanes, x.o_thresholds
  FROM _inv_ports x JOIN devices d ON d.name = x.device JOIN ports p ON p.device_id = d.id AND p.name = x.name
  WHERE x.has_optic ORDER BY x.ord
  ON CONFLICT (port_id) DO UPDATE SET vendor = EXCLUDED.vendor, part_number = EXCLUDED.part_number,
    serial = EXCLUDED.serial, type = EXCLUDED.type, form_factor = EXCLUDED.form_factor,
    lanes = EXCLUDED.lanes, thresholds = EXCLUDED.thresholds
  WHERE (optics.vendor, optics.part_number, optics.serial, optics.type, optics.form_factor, optics.lanes,
         optics.thresholds)
    IS DISTINCT FROM (EXCLUDED.vendor, EXCLUDED.part_number, EXCLUDED.serial, EXCLUDED.type,
                      EXCLUDED.form_factor, EXCLUDED.lanes, EXCLUDED.thresholds)
  RETURNING (xmax = 0) AS ins)
SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM up"""

_UPSERT_ENDPOINTS = """
WITH up AS (
  INSERT INTO endpoints (device_id, protocol, address, port, config)
  SELECT d.id, x.protocol, x.address, x.port, x.config
  FROM _inv_endpoints x JOIN devices d ON d.name = x.device ORDER BY x.ord
  ON CONFLICT (device_id, protocol) DO UPDATE SET address = EXCLUDED.address, port = EXCLUDED.port,
    config = EXCLUDED.config
  WHERE (endpoints.address, endpoints.port, endpoints.config)
    IS DISTINCT FROM (EXCLUDED.address, EXCLUDED.port, EXCLUDED.config)
  RETURNING (xmax = 0) AS ins)
SELECT count(*) FILTER (WHERE ins), count(*) FILTER (WHERE NOT ins) FROM up"""

_UPDATE_LINKS = """
WITH up AS (
  UPDATE links k SET cable_type = w.cable_type, length_m = w.length_m
  FROM _inv_link_ids w
  WHERE k.a_port_id = w.a_id AND k.b_port_id = w.b_id
    AND (k.cable_type, k.length_m) IS DISTINCT FROM (w.cable_type, w.length_m)
  RETURNING 1)
SELECT count(*) FROM up"""

_INSERT_LINKS = """
WITH up AS (
  INSERT INTO links (a_port_id, b_port_id, cable_type, length_m)
  SELECT w.a_id, w.b_id, w.cable_type, w.length_m FROM _inv_link_ids w
  WHERE NOT EXISTS (SELECT 1 FROM links k WHERE k.a_port_id = w.a_id AND k.b_port_id = w.b_id)
  ORDER BY w.ord
  RETURNING 1)
SELECT count(*) FROM up"""


def _one(cur: Cursor[Any], sql: str) -> tuple[Any, ...]:
    cur.execute(sql)
    row = cur.fetchone()
    assert row is not None
    return tuple(row)


def _upsert(cur: Cursor[Any], sql: str, changes: Changes) -> None:
    changes.added, changes.updated = _one(cur, sql)


# ---------------------------------------------------------------------------- public API


def upsert_inventory(*, session: Session, inventory: Inventory, prune: bool = False) -> UpsertReport:
    """Make the inventory tables match `inventory` in one savepoint; see the module doc for the policy."""
    started = time.perf_counter()
    validate_inventory(inventory)
    report = UpsertReport()
    # A savepoint makes the load all-or-nothing even if the caller goes on to commit.
    with session.begin_nested():
        raw = session.connection().connection.driver_connection
        with raw.cursor() as cur:
            _stage(cur, inventory)
            _upsert(cur, _UPSERT_PODS, report.pods)
            _upsert(cur, _UPSERT_DEVICES, report.devices)
            _upsert(cur, _UPSERT_PORTS, report.ports)
            for sql in ("DROP TABLE IF EXISTS _inv_link_ids", _WANTED_LINKS,
                        "DROP TABLE IF EXISTS _inv_scope_ports", _SCOPE_PORTS,
                        "ANALYZE _inv_link_ids", "ANALYZE _inv_scope_ports"):
                cur.execute(sql)
            # Deletions first: links free their ports' unique slots before new links take them,
            # and counting links before ports go keeps the ON DELETE CASCADE out of the numbers.
            (report.links.removed,) = _one(cur, _DELETE_LINKS)
            (report.endpoints.removed,) = _one(cur, _DELETE_ENDPOINTS)
            (report.optics.removed,) = _one(cur, _DELETE_OPTICS)
            (report.ports.removed,) = _one(cur, _DELETE_PORTS)
            _upsert(cur, _UPSERT_OPTICS, report.optics)
            _upsert(cur, _UPSERT_ENDPOINTS, report.endpoints)
            (report.links.updated,) = _one(cur, _UPDATE_LINKS)
            (report.links.added,) = _one(cur, _INSERT_LINKS)
            _finish_outside(cur, report, prune)
            for table in (*_STAGING, "_inv_link_ids", "_inv_scope_ports"):
                cur.execute(f"DROP TABLE {table}")
    session.expire_all()  # ORM objects loaded before the load may now be stale
    report.elapsed_s = time.perf_counter() - started
    return report


def _finish_outside(cur: Cursor[Any], report: UpsertReport, prune: bool) -> None:
    """Devices and pods the file does not list: delete them (prune) or report them as kept."""
    if prune:
        cur.execute("DELETE FROM devices WHERE name NOT IN (SELECT name FROM _inv_devices) RETURNING name")
        report.devices.removed = len(cur.fetchall())
        cur.execute("DELETE FROM pods WHERE name NOT IN (SELECT name FROM _inv_pods) RETURNING name")
        report.pods.removed = len(cur.fetchall())
        return
    cur.execute("SELECT name FROM devices WHERE name NOT IN (SELECT name FROM _inv_devices) ORDER BY id")
    report.kept_devices = [r[0] for r in cur.fetchall()]
    cur.execute("SELECT name FROM pods WHERE name NOT IN (SELECT name FROM _inv_pods) ORDER BY id")
    report.kept_pods = [r[0] for r in cur.fetchall()]


def export_inventory(*, session: Session) -> Inventory:
    """Read the inventory tables back into the file format (rows in load order)."""
    raw = session.connection().connection.driver_connection
    with raw.cursor() as cur:
        cur.execute("SELECT name, description FROM pods ORDER BY id")
        pods = [_drop_none({"name": n, "description": d}) for n, d in cur.fetchall()]
        cur.execute("SELECT id, name, kind, role, pod, rack, vendor, model, mgmt_address, gpus "
                    "FROM devices ORDER BY id")
        devices: dict[int, dict[str, Any]] = {}
        for row in cur.fetchall():
            keys = ("name", "kind", "role", "pod", "rack", "vendor", "model", "mgmt_address", "gpus")
            devices[row[0]] = {**_drop_none(dict(zip(keys, row[1:], strict=True))), "ports": [], "endpoints": []}
        cur.execute("""
            SELECT p.id, p.device_id, p.name, p.speed_gbps, p.rail, p.gpu, p.nic,
                   o.id, o.vendor, o.part_number, o.serial, o.type, o.form_factor, o.lanes, o.thresholds
            FROM ports p LEFT JOIN optics o ON o.port_id = p.id ORDER BY p.id""")
        port_ref: dict[int, str] = {}
        for (pid, did, name, speed, rail, gpu, nic, oid, ov, opn, oser, otype, off, olanes,
             oth) in cur.fetchall():
            port = _drop_none({"name": name, "speed_gbps": speed, "rail": rail, "gpu": gpu, "nic": nic})
            if oid is not None:
                port["optic"] = _drop_none({"vendor": ov, "part_number": opn, "serial": oser, "type": otype,
                                            "form_factor": off, "lanes": olanes, "thresholds": oth})
            devices[did]["ports"].append(port)
            port_ref[pid] = f"{devices[did]['name']}:{name}"
        cur.execute("SELECT device_id, protocol, address, port, config FROM endpoints ORDER BY id")
        for did, protocol, address, port, config in cur.fetchall():
            devices[did]["endpoints"].append({**config, **_drop_none(
                {"protocol": protocol, "address": address, "port": port})})
        cur.execute("SELECT a_port_id, b_port_id, cable_type, length_m FROM links ORDER BY id")
        links = [{"a": port_ref[a], "b": port_ref[b], "cable": _drop_none({"type": t, "length_m": m})}
                 for a, b, t, m in cur.fetchall()]
    return Inventory.model_validate({"version": 1, "pods": pods, "devices": list(devices.values()),
                                     "links": links})


def _drop_none(d: dict[str, Any]) -> dict[str, Any]:
    return {k: v for k, v in d.items() if v is not None}
