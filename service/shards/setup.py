"""Bringing a sharded deployment up: each shard's schema, the stored pod map, the shards' copy of their
inventory, and the control database's fleet tables (partitioned parents with postgres_fdw foreign partitions).

All of it is idempotent and run by `apply` (start-up, or after an inventory load); see
docs/architecture.md#shards for the layout.
"""

from __future__ import annotations

import logging
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, delete, make_url, select, text
from sqlalchemy.dialects.postgresql import insert

from service.db import get_engine, normalize_url
from service.inventory.models import Device, Optic, Port
from service.shards.grafana import grafana_layer
from service.shards.models import ShardPod
from service.shards.topology import NO_POD, Topology

log = logging.getLogger(__name__)

SHARD_SCHEMA = "fw_fleet"  # on each shard: the views the foreign tables read
FLEET_SCHEMA = "fleet"  # on the control database: the partitioned parents and their foreign partitions
# Read-only roles that get SELECT on the fleet tables and a user mapping per shard, when they exist
# (migration 0150 creates Grafana's).
READ_ROLES = ("fabricwatch_grafana",)


class PodMoved(RuntimeError):
    """The setting puts a pod on another shard than the stored map: `fabricwatch shards move` copies it."""


_ROLLUPS = ("rollup_5m", "rollup_1h")
_ROLLUP_COLUMNS = ("pod text, series_id int, bucket timestamptz, n int, min float8, max float8, avg float8, "
                   "last float8, first_ts timestamptz, last_ts timestamptz, increase float8, covered_s float8")

# Each shard's own view of what it holds, with the pod as a column (the partition key on the control side).
# A device without a pod has pod '' so that LIST partitions and `pod = ANY(..)` can name it.
_SHARD_VIEWS = {
    "series": """
SELECT coalesce(d.pod, '') AS pod, s.id AS series_id, s.metric::text AS metric, d.name::text AS device,
       p.name::text AS port, s.lane, s.priority, s.gpu, s.counter_bits, s.saturating, s.port_id,
       s.device_id
FROM series s JOIN devices d ON d.id = s.device_id LEFT JOIN ports p ON p.id = s.port_id""",
    "rows": """
SELECT coalesce(d.pod, '') AS pod, r.series_id, r.ts, r.value
FROM sample_rows r JOIN series s ON s.id = r.series_id JOIN devices d ON d.id = s.device_id""",
    "blocks": """
SELECT coalesce(d.pod, '') AS pod, b.series_id, b.first_ts, b.last_ts, b.ts, b.vals
FROM sample_blocks b JOIN series s ON s.id = b.series_id JOIN devices d ON d.id = s.device_id""",
    "chunks": """
SELECT coalesce(d.pod, '') AS pod, c.series_id, c.first_ts, c.last_ts, c.data
FROM sample_chunks c JOIN series s ON s.id = c.series_id JOIN devices d ON d.id = s.device_id""",
    # the rollup levels (service/telemetry/rollups.py), and each level's watermark once per pod the shard holds
    # (a level without one reads NULL): a fleet read uses rollups only before every asked shard's watermark
    **{level: f"""
SELECT coalesce(d.pod, '') AS pod, r.series_id, r.bucket, r.n, r.min, r.max, r.avg, r.last, r.first_ts,
       r.last_ts, r.increase, r.covered_s
FROM {level} r JOIN series s ON s.id = r.series_id JOIN devices d ON d.id = s.device_id""" for level in _ROLLUPS},
    "rollup_marks": """
SELECT p.pod, l.level, w.done_until
FROM (SELECT DISTINCT coalesce(pod, '') AS pod FROM devices) p CROSS JOIN (VALUES ('5m'), ('1h')) AS l(level)
LEFT JOIN rollup_watermarks w ON w.level = l.level""",
    # Grafana's samples_between and last_samples across shards (service/shards/grafana.py): the 5-minute
    # readings of compressed time, and the chunks' tail samples
    "compressed_5m": """
SELECT coalesce(d.pod, '') AS pod, r.series_id, r.bucket, r.last_ts, r.last
FROM rollup_5m r JOIN series s ON s.id = r.series_id JOIN devices d ON d.id = s.device_id
WHERE r.last_ts < coalesce((SELECT w.done_until FROM chunk_watermark w), '-infinity')""",
    "chunk_tails": """
SELECT coalesce(d.pod, '') AS pod, c.series_id, c.first_ts, c.last_ts, c.last_value, c.prev_ts, c.prev_value
FROM sample_chunks c JOIN series s ON s.id = c.series_id JOIN devices d ON d.id = s.device_id""",
    # each series' newest two samples (rn 1 the newest): the fleet summary's and topology's port states
    "latest": f"""
SELECT coalesce(d.pod, '') AS pod, s.id AS series_id, s.metric::text AS metric, s.port_id, x.rn, x.ts, x.value,
       s.lane
FROM series s JOIN devices d ON d.id = s.device_id
CROSS JOIN LATERAL (SELECT ts, value, row_number() OVER (ORDER BY ts DESC) AS rn
                    FROM {SHARD_SCHEMA}.last_two(s.id)) x""",
}

# The same columns on the control side (types as the views give them).
_FLEET_COLUMNS = {
    "series": "pod text, series_id int, metric text, device text, port text, lane smallint, priority smallint, "
              "gpu smallint, counter_bits smallint, saturating boolean, port_id int, device_id int",
    "rows": "pod text, series_id int, ts timestamptz, value float8",
    "blocks": "pod text, series_id int, first_ts timestamptz, last_ts timestamptz, ts timestamptz[], vals float8[]",
    "chunks": "pod text, series_id int, first_ts timestamptz, last_ts timestamptz, data bytea",
    **dict.fromkeys(_ROLLUPS, _ROLLUP_COLUMNS),
    "rollup_marks": "pod text, level text, done_until timestamptz",
    "latest": "pod text, series_id int, metric text, port_id int, rn bigint, ts timestamptz, value float8, "
              "lane smallint",
    "compressed_5m": "pod text, series_id int, bucket timestamptz, last_ts timestamptz, last float8",
    "chunk_tails": "pod text, series_id int, first_ts timestamptz, last_ts timestamptz, last_value float8, "
                   "prev_ts timestamptz, prev_value float8",
}


def prepare_shard(url: str) -> None:
    """The shard's database (created if missing), its schema at head, and the views the fleet tables read."""
    from service.migrate import create_database_if_missing, upgrade

    create_database_if_missing(url)
    upgrade(url)
    with get_engine(url).begin() as conn:
        conn.execute(text(f"CREATE SCHEMA IF NOT EXISTS {SHARD_SCHEMA}"))
        # postgres_fdw's sessions run with search_path = pg_catalog, and last_samples' body names its tables
        # unqualified: a wrapper that sets the path for it
        conn.execute(text(f"CREATE OR REPLACE FUNCTION {SHARD_SCHEMA}.last_two(sid int) "
                          f"RETURNS TABLE (ts timestamptz, value float8) LANGUAGE sql STABLE "
                          f"SET search_path = public AS 'SELECT * FROM last_samples(sid, 2)'"))
        for name, body in _SHARD_VIEWS.items():
            conn.execute(text(f"CREATE OR REPLACE VIEW {SHARD_SCHEMA}.{name} AS {body}"))


def inventory_pods(conn: Connection) -> set[str]:
    """Every pod the control database knows (the pods table and the devices' pods), and '' for pod-less devices."""
    pods = set(conn.execute(text("SELECT name FROM pods UNION SELECT DISTINCT coalesce(pod, '') FROM devices"))
               .scalars())
    return pods | {NO_POD}


def store_pod_map(conn: Connection, topology: Topology) -> dict[str, str]:
    """Write the pod -> shard map of the inventory's pods into `shard_pods`; the whole map. A pod that the
    setting puts on another shard than the stored one raises PodMoved: its history has to be copied first
    (`fabricwatch shards move`, service/shards/rebalance.py). Tolerated: a setting naming the shard a pod is
    being moved to, or the one its last move came from (not updated yet: a warning)."""
    stored = dict(conn.execute(select(ShardPod.pod, ShardPod.shard)).all())
    moves = {pod: (to, came) for pod, to, came in conn.execute(select(ShardPod.pod, ShardPod.move_to,
                                                                      ShardPod.moved_from))}
    wanted = {pod: topology.shard_of(pod or None) for pod in inventory_pods(conn) | set(topology.pod_shard)}
    moved = []
    for pod, shard in sorted(wanted.items()):
        if pod not in stored or stored[pod] == shard or moves[pod][0] == shard:
            continue
        if moves[pod][1] == shard:
            log.warning("pod %s was moved from shard %s to %s: the setting still names %s (update "
                        "FABRICWATCH_SHARDS_PODS)", pod or "(no pod)", shard, stored[pod], shard)
            continue
        moved.append(f"{pod or '(no pod)'}: {stored[pod]} -> {shard}")
    if moved:
        raise PodMoved("the topology moves pods to another shard, which needs their history copied: run "
                       "`fabricwatch shards move <pod> --to <shard>` for each (docs/operations.md), "
                       "then apply again: " + ", ".join(moved))
    new = {pod: shard for pod, shard in wanted.items() if pod not in stored}
    if new:
        conn.execute(insert(ShardPod).values([{"pod": p, "shard": s} for p, s in sorted(new.items())])
                     .on_conflict_do_nothing())
    return {**stored, **new}


def pods_held(conn: Connection) -> dict[str, set[str]]:
    """Shard -> the pods whose inventory it must hold: its own, one being moved to it, and one whose old
    copy it still holds (deleted by the move, which needs the devices to find it)."""
    out: dict[str, set[str]] = {}
    for pod, shard, to, leftover in conn.execute(select(ShardPod.pod, ShardPod.shard, ShardPod.move_to,
                                                        ShardPod.leftover)):
        for s in {shard, to, leftover} - {None}:
            out.setdefault(s, set()).add(pod)
    return out


def _rows(conn: Connection, table: Any, where: Any) -> list[dict[str, Any]]:
    return [dict(r) for r in conn.execute(select(table).where(where)).mappings()]


def _upsert(conn: Connection, table: Any, rows: list[dict[str, Any]]) -> None:
    if not rows:
        return
    stmt = insert(table).values(rows)
    conn.execute(stmt.on_conflict_do_update(index_elements=["id"],
                                            set_={c.name: stmt.excluded[c.name] for c in table.columns
                                                  if c.name != "id"}))


def hidden_pod(pod: str) -> str:
    """What a shard's copy of the inventory calls a pod it holds but does not own (a move's target before the
    switch, its old shard after): no fleet partition lists it, so fleet reads never see those devices twice.
    Inventory names cannot start with '~'."""
    return ("~" + pod)[:128]


def hide_pods(shard_conn: Connection, pods: set[str]) -> None:
    """Name these pods' devices in the shard's inventory copy by `hidden_pod` (service/shards/rebalance.py)."""
    for pod in sorted(pods):
        shard_conn.execute(text("UPDATE devices SET pod = :h WHERE coalesce(pod, '') = :p"),
                           {"h": hidden_pod(pod), "p": pod})


def pods_hidden(conn: Connection) -> dict[str, set[str]]:
    """Shard -> the pods it holds without owning them: one being moved to it, one whose old copy it keeps."""
    out: dict[str, set[str]] = {}
    for pod, to, leftover in conn.execute(select(ShardPod.pod, ShardPod.move_to, ShardPod.leftover)):
        for s in {to, leftover} - {None}:
            out.setdefault(s, set()).add(pod)
    return out


def sync_inventory(control: Connection, shard_conn: Connection, pods: set[str],
                   hidden: set[str] | None = None) -> int:
    """Copy the devices of these pods ('' for pod-less ones), their ports and optics into the shard, with the
    control database's ids, and remove what the shard holds beyond them (the series of a removed device or
    port go with it: migration 0080's triggers). Ingest on the shard resolves names against this copy.
    The pods in `hidden` are held without being owned (`hide_pods`). Returns the devices copied."""
    dev_t, port_t, optic_t = Device.__table__, Port.__table__, Optic.__table__
    in_pods = Device.pod.in_(sorted(pods - {NO_POD}))
    devices = _rows(control, dev_t, in_pods | Device.pod.is_(None) if NO_POD in pods else in_pods)
    dev_ids = [d["id"] for d in devices]
    ports = _rows(control, port_t, Port.device_id.in_(dev_ids))
    port_ids = [p["id"] for p in ports]
    optics = _rows(control, optic_t, Optic.port_id.in_(port_ids))
    # Removed first: a name freed by one id may be taken by another (unique names).
    shard_conn.execute(delete(dev_t).where(dev_t.c.id.not_in(dev_ids)))
    shard_conn.execute(delete(port_t).where(port_t.c.id.not_in(port_ids)))
    shard_conn.execute(delete(optic_t).where(optic_t.c.id.not_in([o["id"] for o in optics])))
    for table, rows in ((dev_t, devices), (port_t, ports), (optic_t, optics)):
        for i in range(0, len(rows), 1000):
            _upsert(shard_conn, table, rows[i:i + 1000])
    hide_pods(shard_conn, hidden or set())
    return len(devices)


def _literal(conn: Connection, value: str) -> str:
    return conn.execute(text("SELECT quote_literal(:v)"), {"v": value}).scalar_one()


def fleet_tables(conn: Connection, topology: Topology, pod_map: dict[str, str]) -> None:
    """(Re)build the control database's fleet schema: a foreign server and user mapping per shard, and per
    fleet table a parent partitioned by LIST (pod) with one foreign partition per shard listing its pods.
    Queries on the parent prune shards by pod and send their time and pod conditions to the shard."""
    conn.execute(text("CREATE EXTENSION IF NOT EXISTS postgres_fdw"))
    conn.execute(text(f"DROP SCHEMA IF EXISTS {FLEET_SCHEMA} CASCADE"))
    conn.execute(text(f"CREATE SCHEMA {FLEET_SCHEMA}"))
    for name, cols in _FLEET_COLUMNS.items():
        conn.execute(text(f"CREATE TABLE {FLEET_SCHEMA}.{name} ({cols}) PARTITION BY LIST (pod)"))
    readers = [r for r in READ_ROLES if conn.execute(text(
        "SELECT 1 FROM pg_roles WHERE rolname = :r AND rolname <> current_user"), {"r": r}).first()]
    for role in readers:  # the parents only: a query through a parent checks the parent's privileges
        conn.execute(text(f"GRANT USAGE ON SCHEMA {FLEET_SCHEMA} TO {role}"))
        conn.execute(text(f"GRANT SELECT ON ALL TABLES IN SCHEMA {FLEET_SCHEMA} TO {role}"))
    for shard, url in sorted(topology.shards.items()):
        u = make_url(normalize_url(url))
        server = f"fw_shard_{shard}"
        opts = {"host": u.host or "localhost", "port": str(u.port or 5432), "dbname": u.database or "postgres",
                # shards are scanned at once (async append), and rows come in large fetches
                "async_capable": "true", "fetch_size": "10000",
                "connect_timeout": str(topology.connect_timeout_s)}
        exists = conn.execute(text("SELECT 1 FROM pg_foreign_server WHERE srvname = :s"), {"s": server}).first()
        if exists:
            conn.execute(text(f"DROP SERVER {server} CASCADE"))  # its options may have changed
        conn.execute(text(f"CREATE SERVER {server} FOREIGN DATA WRAPPER postgres_fdw OPTIONS ("
                          + ", ".join(f"{k} {_literal(conn, v)}" for k, v in opts.items()) + ")"))
        creds = {"user": u.username or "postgres"} | ({"password": u.password} if u.password else {})
        conn.execute(text(f"CREATE USER MAPPING FOR CURRENT_USER SERVER {server} OPTIONS ("
                          + ", ".join(f"{k} {_literal(conn, v)}" for k, v in creds.items()) + ")"))
        if readers:
            _reader_mappings(conn, server, creds, readers)
        pods = sorted(p for p, s in pod_map.items() if s == shard)
        if not pods:
            continue  # a LIST partition names at least one value; a shard with no pod holds nothing to read
        values = ", ".join(_literal(conn, p) for p in pods)
        for name in _FLEET_COLUMNS:
            conn.execute(text(
                f"CREATE FOREIGN TABLE {FLEET_SCHEMA}.{name}__{shard} PARTITION OF {FLEET_SCHEMA}.{name} "
                f"FOR VALUES IN ({values}) SERVER {server} "
                f"OPTIONS (schema_name '{SHARD_SCHEMA}', table_name '{name}')"))
    grafana_layer(conn, sorted(topology.shards), pod_map, readers)  # the dashboards' SQL over these tables


def _reader_mappings(conn: Connection, server: str, creds: dict[str, str], readers: list[str]) -> None:
    """User mappings for the read-only roles (Grafana's): postgres_fdw connects as the mapped user, so the
    role reads the shard with the shard URL's credentials; what it may read is its SELECT on the fleet
    parents (granted above, nothing else). Without a password in the URL (trust or peer on the shard), a
    non-superuser's connection is refused unless its mapping says `password_required 'false'`, which
    only a superuser may set: `apply` run by another role then leaves the reader without a mapping and
    says so."""
    opts = dict(creds)
    if "password" not in creds:
        if not conn.execute(text("SELECT rolsuper FROM pg_roles WHERE rolname = current_user")).scalar_one():
            log.warning("%s: no user mapping for %s: the shard URL has no password, and only a superuser may "
                        "map a read-only role without one (password_required 'false')", server,
                        ", ".join(readers))
            return
        opts["password_required"] = "false"
    for role in readers:
        conn.execute(text(f"CREATE USER MAPPING FOR {role} SERVER {server} OPTIONS ("
                          + ", ".join(f"{k} {_literal(conn, v)}" for k, v in opts.items()) + ")"))


@dataclass
class Applied:
    """What `apply` did: the stored pod map, and the shards it could not reach (name -> why)."""

    pod_map: dict[str, str]
    down: dict[str, str] = field(default_factory=dict)


def apply(topology: Topology, *, allow_down: bool = False) -> Applied:
    """Bring every shard and the control database's fleet tables in line with the topology and the
    inventory. A shard that cannot be reached raises ShardsUnavailable naming every such shard; with
    `allow_down` (start-up) it is skipped and returned in `down`, and the fleet tables still name it, so
    reads leave it out by pod until it is back and `apply` runs again."""
    from service.migrate import DatabaseUnavailable, create_database_if_missing
    from service.shards.topology import ShardsUnavailable

    down = {}
    for shard, url in sorted(topology.shards.items()):  # every shard tried, so the error names them all
        try:
            create_database_if_missing(url)
        except DatabaseUnavailable as exc:
            down[shard] = str(exc)
    if down and not allow_down:
        raise ShardsUnavailable(down)
    for shard, url in topology.shards.items():
        if shard not in down:
            prepare_shard(url)
    control: Engine = get_engine(topology.control_url)
    with control.begin() as conn:
        pod_map = store_pod_map(conn, topology)
        held, hidden = pods_held(conn), pods_hidden(conn)
        for shard, url in sorted(topology.shards.items()):
            pods = held.get(shard, set())
            if shard in down or normalize_url(url) == normalize_url(topology.control_url):
                continue  # down, or the control database doubles as this shard (it has the whole inventory)
            with get_engine(url).begin() as shard_conn:
                n = sync_inventory(conn, shard_conn, pods, hidden.get(shard))
            log.info("shard %s: %d devices of %d pods", shard, n, len(pods))
        fleet_tables(conn, topology, pod_map)
    return Applied(pod_map, down)
