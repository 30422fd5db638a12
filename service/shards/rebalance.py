"""Moving a pod's telemetry to another shard (rebalancing): `fabricwatch shards move <pod> --to <shard>`.

The pod's row in `shard_pods` (control database, migration 0280) carries the move, so every step is
idempotent and a re-run after a crash goes on from what is stored:

1. **Mark.** Under the pod's routing lock taken alone (service/shards/ingest.py:ROUTE_LOCK; writers hold it
   shared from reading the route until their shard commits, so none is in flight), the target gets the
   pod's inventory and every series of the pod (same identity, its own ids), and `move_to` is set. From
   then on every write of the pod goes to the target first and then to the old shard: the target never
   lacks a sample the old shard has, and fleet reads still read the old shard.
2. **Copy.** The old shard's series of the pod, in batches by id: each batch read in one REPEATABLE READ
   snapshot (rows, import blocks, compressed chunks and rollups agree with each other), series ids mapped
   by identity (device, metric, port, lane, priority, gpu), stored with ON CONFLICT DO NOTHING (what the
   writes already brought is not stored twice; rollups: the old shard's win). `move_cursor` records the
   last batch committed; a batch re-copied after a crash stores nothing twice.
3. **Verify.** With both shards' snapshots taken under the lock (no write in flight), the samples of each
   series (rows + block lengths + chunk counts) are counted on both. A series with fewer on the target is
   copied again and counted again; still fewer stops the move (the writes go on to both; run it again).
   More on the target is kept and reported: a write that stored on the target and then failed on the old
   shard (its sender retries it).
4. **Switch.** Under the lock: `shard` = the target, `leftover` = the old shard, and the control database's
   fleet tables rebuilt with the new map, in one transaction: readers and writers see the pod move at once.
5. **Remove the old copy.** The old shard's samples, blocks, chunks, rollups and series of the pod, in
   batches, then its inventory copy; `leftover` cleared. A move of a pod whose old copy is still to remove
   (a crash here) removes it first.

`--abort` during steps 1-3 sends writes back to the old shard only and removes the target's copy.

Detection state (service/shards/detection.py: each shard's detector states and cohort models, on the shard)
moves with the switch. Both shards' detection locks are held from before the carry until the switch is
committed (session locks: a crash releases them), so no cycle of either shard runs in between, and a cycle reads
the pod map only under its lock: the old shard's last cycle of the pod is the one whose state is carried, and
the new shard's first one reads it. Per state name, the pod's ports' state (by port id: the inventory's ids are
the same on every shard, so no id is remapped) is taken into the target's state and committed there before the
switch; a switch that then fails leaves ports the target does not own, which its next cycle drops and a re-run
carries again. Samples the target's state has read past the old one's watermark are read again for the pod's
ports, so none is skipped; cohort models the target lacks are copied. Step 5 (and an abort) removes the pod's
ports from the state of the shard it leaves.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterator
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection, Engine, text
from sqlalchemy.exc import OperationalError

from service.db import get_engine, normalize_url
from service.shards.ingest import ROUTE_LOCK
from service.shards.topology import NO_POD, ShardsUnavailable, Topology, probe

Progress = Callable[[str, int, int], None]  # (phase, done, total)


class MoveError(RuntimeError):
    """A move refused or stopped; the message says what changed (usually nothing) and what to do."""


@dataclass
class MoveReport:
    """What a move did."""

    pod: str
    source: str
    target: str
    series: int = 0  # the pod's series on the old shard
    samples: int = 0  # their samples on the old shard at the verify
    extra: dict[str, int] = field(default_factory=dict)  # series text -> samples the target has beyond them
    recopied: int = 0  # series copied again after a count that came short
    removed_series: int = 0  # from the old shard
    resumed: bool = False
    carried_ports: int = 0  # the pod's ports, whose detection state went to the new shard


# a shard's series of a pod, owned or held hidden (setup.hidden_pod)
_POD_SERIES_SQL = """
SELECT s.id FROM series s JOIN devices d ON d.id = s.device_id
WHERE coalesce(d.pod, '') IN (:pod, :hidden) AND s.id > :after ORDER BY s.id LIMIT :n"""
_SERIES_COLS = "metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating"
_IDENTITY = ("m.device_id = s.device_id AND m.metric = s.metric AND m.port_id IS NOT DISTINCT FROM s.port_id "
             "AND m.lane IS NOT DISTINCT FROM s.lane AND m.priority IS NOT DISTINCT FROM s.priority "
             "AND m.gpu IS NOT DISTINCT FROM s.gpu")
# what is copied, per table: (columns read on the old shard, the temp table's columns, the conflict clause)
_ROLLUP_COLS = "series_id, bucket, n, min, max, avg, last, first_ts, last_ts, increase, covered_s"
_DATA = {
    "sample_rows": ("series_id, ts, value", "series_id int, ts timestamptz, value float8", "DO NOTHING"),
    "sample_blocks": ("series_id, first_ts, last_ts, ts, vals",
                      "series_id int, first_ts timestamptz, last_ts timestamptz, ts timestamptz[], vals float8[]",
                      "DO NOTHING"),
    "sample_chunks": ("series_id, first_ts, last_ts, n, last_value, prev_ts, prev_value, data",
                      "series_id int, first_ts timestamptz, last_ts timestamptz, n int, last_value float8, "
                      "prev_ts timestamptz, prev_value float8, data bytea", "DO NOTHING"),
    **{t: (_ROLLUP_COLS, "series_id int, bucket timestamptz, n int, min float8, max float8, avg float8, "
           "last float8, first_ts timestamptz, last_ts timestamptz, increase float8, covered_s float8",
           "(series_id, bucket) DO UPDATE SET "
           + ", ".join(f"{c} = excluded.{c}" for c in _ROLLUP_COLS.split(", ")[2:]))
       for t in ("rollup_5m", "rollup_1h")},
}
_COUNT_SQL = """
SELECT s.id, s.metric, s.device_id, s.port_id, s.lane, s.priority, s.gpu,
       coalesce((SELECT count(*) FROM sample_rows r WHERE r.series_id = s.id), 0)
       + coalesce((SELECT sum(cardinality(b.ts)) FROM sample_blocks b WHERE b.series_id = s.id), 0)
       + coalesce((SELECT sum(c.n) FROM sample_chunks c WHERE c.series_id = s.id), 0)
FROM series s JOIN devices d ON d.id = s.device_id WHERE coalesce(d.pod, '') IN (:pod, :hidden)"""

Identity = tuple[Any, ...]  # (metric, device_id, port_id, lane, priority, gpu)


def _raw(conn: Connection) -> Any:
    return conn.connection.driver_connection


def _pod_shown(pod: str) -> str:
    return pod or "(no pod)"


@contextlib.contextmanager
def _routing_lock(control: Engine, pod: str, timeout_s: int) -> Iterator[Connection]:
    """A control transaction holding the pod's routing lock alone: no write of the pod is in flight, and
    none starts until it ends."""
    with control.begin() as conn:
        conn.execute(text(f"SET LOCAL lock_timeout = '{int(timeout_s)}s'"))
        try:
            conn.execute(text("SELECT pg_advisory_xact_lock(:k, hashtext(:p))"), {"k": ROUTE_LOCK, "p": pod})
        except OperationalError as exc:
            if "lock timeout" not in str(exc):
                raise
            raise MoveError(f"writes of pod {_pod_shown(pod)} held its routing lock for more than {timeout_s} s "
                            f"(a long import?): this step changed nothing; run the move again") from None
        conn.execute(text("SET LOCAL lock_timeout = 0"))
        yield conn


def _state(conn: Connection, pod: str) -> dict[str, Any] | None:
    row = conn.execute(text("SELECT shard, move_to, move_cursor, leftover FROM shard_pods WHERE pod = :p FOR UPDATE"),
                       {"p": pod}).mappings().first()
    return dict(row) if row is not None else None


def _check(topology: Topology, control: Engine, pod: str, to: str | None) -> dict[str, Any]:
    """The pod's stored state, after refusing an unknown pod or shard by name."""
    if to is not None:
        topology.url(to)  # UnknownShard, naming the shards
    with control.connect() as conn:
        row = conn.execute(text("SELECT shard, move_to, move_cursor, leftover FROM shard_pods WHERE pod = :p"),
                           {"p": pod}).mappings().first()
        if row is None:
            known = sorted(conn.execute(text("SELECT pod FROM shard_pods")).scalars())
            raise MoveError(f"unknown pod {pod!r}: the stored pod map has no such pod (pods: "
                            f"{', '.join(map(_pod_shown, known)) or 'none: run fabricwatch shards apply'}); "
                            f"nothing changed")
    return dict(row)


def _require_up(topology: Topology, shards: list[str]) -> None:
    down = {s: why for s, why in probe(topology, sorted(set(shards))).items() if why is not None}
    if down:
        raise ShardsUnavailable(down)


def _is_control(topology: Topology, shard: str) -> bool:
    return normalize_url(topology.url(shard)) == normalize_url(topology.control_url)


def _sync_inventory(control_conn: Connection, topology: Topology, shard: str) -> None:
    """The shard's inventory copy as the stored map (committed in the control transaction) says."""
    from service.shards.setup import pods_held, pods_hidden, sync_inventory

    if _is_control(topology, shard):
        return  # the control database doubles as this shard: it has the whole inventory
    with get_engine(topology.url(shard)).begin() as shard_conn:
        sync_inventory(control_conn, shard_conn, pods_held(control_conn).get(shard, set()),
                       pods_hidden(control_conn).get(shard))


def _show(topology: Topology, shard: str, pod: str, hide: bool) -> None:
    """Hide the pod's devices on the shard from fleet reads (held, not owned), or show them again."""
    from service.shards.setup import hidden_pod, hide_pods

    if _is_control(topology, shard):
        return  # the control database's inventory is the real one: never renamed
    with get_engine(topology.url(shard)).begin() as conn:
        if hide:
            hide_pods(conn, {pod})
        else:
            conn.execute(text("UPDATE devices SET pod = NULLIF(:p, '') WHERE pod = :h"),
                         {"h": hidden_pod(pod), "p": pod})


def _copy_partitions(src: Connection, tgt: Connection) -> None:
    """The target gets every day partition the old shard has (samples, chunks, rollups): copied rows need
    theirs to exist."""
    from service.telemetry import partitions, rollups

    with _raw(tgt).cursor() as cur:
        partitions.create_partitions(cur, sorted(partitions.existing_partitions(src)))
        partitions.ensure_chunk_partitions(cur, sorted(partitions.existing_partitions(src, "sample_chunks")))
    from datetime import UTC, datetime, timedelta

    for level in rollups.LEVELS:
        for day in sorted(rollups.existing_partitions(src, level)):
            lo = datetime(day.year, day.month, day.day, tzinfo=UTC)
            rollups.ensure_partitions(tgt, level, lo, lo + timedelta(days=level.partition_days))


def _copy_series(src: Connection, tgt: Connection, ids: list[int]) -> None:
    """Create on the target the series these old-shard ids are (by identity), and leave the map old id ->
    target id in the temp table `mv_map` of the target's transaction."""
    raw_src, raw_tgt = _raw(src), _raw(tgt)
    raw_tgt.execute("CREATE TEMP TABLE IF NOT EXISTS mv_series (old int, metric text, device_id int, port_id int, "
                    "lane smallint, priority smallint, gpu smallint, counter_bits smallint, saturating bool) "
                    "ON COMMIT DROP")
    raw_tgt.execute("CREATE TEMP TABLE IF NOT EXISTS mv_map (old int PRIMARY KEY, new int) ON COMMIT DROP")
    with raw_src.cursor().copy(f"COPY (SELECT id, {_SERIES_COLS} FROM series WHERE id = ANY('{_ids(ids)}')) "
                               f"TO STDOUT (FORMAT BINARY)") as out, \
            raw_tgt.cursor().copy(f"COPY mv_series (old, {_SERIES_COLS}) FROM STDIN (FORMAT BINARY)") as inp:
        for data in out:
            inp.write(data)
    raw_tgt.execute(f"INSERT INTO series ({_SERIES_COLS}) SELECT {_SERIES_COLS} FROM mv_series "
                    f"ON CONFLICT ON CONSTRAINT series_identity DO NOTHING")
    raw_tgt.execute(f"INSERT INTO mv_map SELECT m.old, s.id FROM mv_series m JOIN series s ON {_IDENTITY}")


def _ids(ids: list[int]) -> str:
    return "{" + ",".join(map(str, ids)) + "}"


def _copy_batch(src_engine: Engine, tgt_engine: Engine, ids: list[int]) -> None:
    """Copy these old-shard series and everything stored for them, read in one snapshot, in one target
    transaction; what the target has already is not stored twice."""
    with src_engine.connect().execution_options(isolation_level="REPEATABLE READ") as src, \
            tgt_engine.begin() as tgt:
        src.execute(text("SET TRANSACTION READ ONLY"))
        _copy_series(src, tgt, ids)
        raw_src, raw_tgt = _raw(src), _raw(tgt)
        for table, (cols, temp_cols, conflict) in _DATA.items():
            temp = f"mv_{table}"
            raw_tgt.execute(f"CREATE TEMP TABLE IF NOT EXISTS {temp} ({temp_cols}) ON COMMIT DROP")
            with raw_src.cursor().copy(f"COPY (SELECT {cols} FROM {table} WHERE series_id = ANY('{_ids(ids)}')) "
                                       f"TO STDOUT (FORMAT BINARY)") as out, \
                    raw_tgt.cursor().copy(f"COPY {temp} ({cols}) FROM STDIN (FORMAT BINARY)") as inp:
                for data in out:
                    inp.write(data)
            rest = ", ".join("t." + c for c in cols.split(", ")[1:])
            raw_tgt.execute(f"INSERT INTO {table} ({cols}) SELECT m.new, {rest} "
                            f"FROM {temp} t JOIN mv_map m ON m.old = t.series_id ON CONFLICT {conflict}")
        src.rollback()


def _pods(pod: str) -> dict[str, str]:
    from service.shards.setup import hidden_pod

    return {"pod": pod, "hidden": hidden_pod(pod)}


def _pod_series(conn: Connection, pod: str, after: int, n: int) -> list[int]:
    return list(conn.execute(text(_POD_SERIES_SQL), {**_pods(pod), "after": after, "n": n}).scalars())


def _count_pod_series(conn: Connection, pod: str, after: int) -> int:
    return conn.execute(text("SELECT count(*) FROM series s JOIN devices d ON d.id = s.device_id "
                             "WHERE coalesce(d.pod, '') IN (:pod, :hidden) AND s.id > :after"),
                        {**_pods(pod), "after": after}).scalar_one()


def _counts(conn: Connection, pod: str) -> dict[Identity, tuple[int, int]]:
    """Identity -> (series id, samples) of the pod's series on this shard."""
    return {tuple(r[1:7]): (r[0], int(r[7])) for r in conn.execute(text(_COUNT_SQL), _pods(pod))}


def _verify(control: Engine, topology: Topology, pod: str, source: str, target: str, timeout_s: int
            ) -> tuple[dict[Identity, tuple[int, int]], dict[Identity, tuple[int, int]]]:
    """Both shards' counts, from snapshots taken while no write of the pod was in flight."""
    src_engine, tgt_engine = get_engine(topology.url(source)), get_engine(topology.url(target))
    with src_engine.connect().execution_options(isolation_level="REPEATABLE READ") as src, \
            tgt_engine.connect().execution_options(isolation_level="REPEATABLE READ") as tgt:
        with _routing_lock(control, pod, timeout_s):
            src.execute(text("SELECT 1"))  # the snapshots: taken now, while no write is in flight
            tgt.execute(text("SELECT 1"))
        out = _counts(src, pod), _counts(tgt, pod)
        src.rollback()
        tgt.rollback()
    return out


def _series_text(key: Identity) -> str:
    metric, device, port, lane, prio, gpu = key
    extra = "".join(f",{n}={v}" for n, v in (("port_id", port), ("lane", lane), ("priority", prio), ("gpu", gpu))
                    if v is not None)
    return f"{metric}{{device_id={device}{extra}}}"


# a detector's cycle lock, as detect_in takes it (per transaction); the move takes it per session
_DETECT_LOCK = "SELECT {}(hashtext('fabricwatch-detect:' || :n))"


@contextlib.contextmanager
def _detection_paused(topology: Topology, shards: list[str], timeout_s: int) -> Iterator[dict[str, Connection]]:
    """Connections to these shards, each holding the cycle lock of every detector state it has (session locks:
    released at the end, or with the connection if the move dies): no cycle of theirs runs until then."""
    held: dict[str, Connection] = {}
    try:
        names = {"default"}
        for shard in sorted(set(shards)):  # in name order: two moves never wait for each other crosswise
            held[shard] = conn = get_engine(topology.url(shard)).connect()
            names |= set(conn.execute(text("SELECT name FROM detector_state")).scalars())
            conn.commit()
        for shard, conn in sorted(held.items()):
            conn.execute(text(f"SET lock_timeout = '{int(timeout_s)}s'"))
            for name in sorted(names):
                try:
                    conn.execute(text(_DETECT_LOCK.format("pg_advisory_lock")), {"n": name})
                except OperationalError as exc:
                    if "lock timeout" not in str(exc):
                        raise
                    raise MoveError(f"detection cycle {name!r} of shard {shard!r} ran for more than {timeout_s} s: "
                                    f"nothing switched; run the move again") from None
            conn.execute(text("SET lock_timeout = 0"))
            conn.commit()
        yield held
    finally:
        for conn in held.values():
            try:
                conn.rollback()
                conn.execute(text("SELECT pg_advisory_unlock_all()"))
                conn.commit()
            except Exception:  # never back to the pool holding a lock: closed instead
                conn.invalidate()
            finally:
                conn.close()


def _carry_detection(control: Engine, topology: Topology, pod: str, source: Connection, target: Connection,
                     to: str) -> int:
    """Take the pod's ports' detection state from the old shard's states into the target's, and the cohort models
    the target lacks, committed on the target (module docstring). Returns the pod's ports."""
    import json

    import numpy as np

    from service.detection.service import load_fabric, load_series, read_samples
    from service.detection.state import AXIS, NPRIO, FeatureState
    from service.detection.store import load_state, save_state
    from service.shards.detection import ownership

    with control.connect() as conn:  # the target's fabric as its first cycle after the switch reads it
        own = ownership(conn, topology, to)
        moved = set(conn.execute(text("SELECT id FROM devices WHERE coalesce(pod, '') = :p"), {"p": pod}).scalars())
        fabric = load_fabric(conn, sorted(set(own.devices.values()) | moved))
    ports = np.asarray([own.device_pod.get(fabric.dev_names[d], NO_POD) == pod for d in fabric.dev.tolist()], bool)
    with source.begin():
        names = source.execute(text("SELECT name FROM detector_state ORDER BY name")).scalars().all()
        states = {name: st for name in names if (st := load_state(source, name, fabric)) is not None}
        models = source.execute(text(
            "SELECT DISTINCT ON (cohort) cohort, version, trained_at, threshold, n_rows, features, blob "
            "FROM detector_models ORDER BY cohort, version DESC")).mappings().all()
    with target.begin():
        for name, old in states.items():  # the default Config: every shard's cycle runs with it (tasks.py)
            new = load_state(target, name, fabric)
            if new is None:  # the target's first state of this name: it goes on from the old one's cycles
                new = FeatureState(fabric)
                for a in ("watermark_ms", "last_cycle_ms", "next_bucket_ms", "first_cycle_ms", "last_train_ms",
                          "cycles"):
                    setattr(new, a, getattr(old, a))
            new.take_ports(old, ports)
            if None not in (old.watermark_ms, new.watermark_ms) and new.watermark_ms > old.watermark_ms:
                # the pod's samples the target's state is past and the old one had not read: read now (a sample
                # the old state read is not newer than its port's last one, and changes nothing when read again)
                batch, _ = read_samples(target, fabric, load_series(target, fabric), old.watermark_ms,
                                        new.watermark_ms)
                for metric, (ent, ts, val) in batch.items():
                    axis = AXIS[metric]
                    port = ent if axis == "port" else fabric.lane_port[ent] if axis == "lane" else ent // NPRIO
                    keep = ports[port]
                    batch[metric] = (ent[keep], ts[keep], val[keep])
                new.observe(batch)
            save_state(target, name, new)
        have = set(target.execute(text("SELECT DISTINCT cohort FROM detector_models")).scalars())
        wanted = {fabric.cohort_names[c] for c in fabric.cohort[ports].tolist()}
        for m in models:
            if m["cohort"] in wanted - have:
                target.execute(text(
                    "INSERT INTO detector_models (cohort, version, trained_at, threshold, n_rows, features, blob) "
                    "VALUES (:cohort, :version, :trained_at, :threshold, :n_rows, CAST(:f AS jsonb), :blob) "
                    "ON CONFLICT ON CONSTRAINT detector_model_version DO NOTHING"),
                    {**m, "f": json.dumps(m["features"])})
    return int(ports.sum())


def _drop_detection(control: Engine, topology: Topology, shard: str) -> None:
    """The shard's detector states keep the ports of its own cycle's fabric only (as its next cycle would): those
    of a pod that left it (a move's old shard, an aborted move's target) are dropped, under the cycles' lock."""
    from service.detection.service import load_fabric
    from service.detection.store import load_state, save_state
    from service.shards.detection import ownership

    with get_engine(topology.url(shard)).begin() as conn:
        names = list(conn.execute(text("SELECT name FROM detector_state ORDER BY name")).scalars())
        for name in names:
            conn.execute(text(_DETECT_LOCK.format("pg_advisory_xact_lock")), {"n": name})
        with control.connect() as c:
            fabric = load_fabric(c, sorted(ownership(c, topology, shard).devices.values()))
        for name in names:
            st = load_state(conn, name, fabric)
            if st is not None:
                save_state(conn, name, st)


def remove_copy(control: Engine, topology: Topology, pod: str, shard: str, *, batch_series: int = 500,
                progress: Progress | None = None) -> int:
    """Delete the pod's telemetry on `shard` (its `leftover`), in batches, then its inventory copy there,
    and clear `leftover`. Returns the series removed."""
    with control.connect() as conn:
        owner, to = conn.execute(text("SELECT shard, move_to FROM shard_pods WHERE pod = :p"), {"p": pod}).one()
    if shard in (owner, to):  # never the copy that reads or writes use
        raise MoveError(f"pod {_pod_shown(pod)}: shard {shard!r} holds its live copy; nothing removed")
    _drop_detection(control, topology, shard)
    engine = get_engine(topology.url(shard))
    with engine.connect() as conn:
        total = _count_pod_series(conn, pod, 0)
    done = 0
    if progress:
        progress("removing the old copy", 0, total)
    while True:
        with engine.begin() as conn:
            ids = _pod_series(conn, pod, 0, batch_series)
            if not ids:
                break
            for table in (*_DATA, "series"):
                col = "id" if table == "series" else "series_id"
                conn.execute(text(f"DELETE FROM {table} WHERE {col} = ANY(:ids)"), {"ids": ids})
        done += len(ids)
        if progress:
            progress("removing the old copy", done, total)
    with control.begin() as conn:
        conn.execute(text("UPDATE shard_pods SET leftover = NULL WHERE pod = :p AND leftover = :s"),
                     {"p": pod, "s": shard})
        _sync_inventory(conn, topology, shard)
        owner = conn.execute(text("SELECT shard FROM shard_pods WHERE pod = :p"), {"p": pod}).scalar_one()
    _show(topology, owner, pod, False)  # a switch that stopped before showing the pod on its new shard
    return done


def move_pod(topology: Topology, pod: str, to: str, *, batch_series: int = 500, progress: Progress | None = None,
             lock_timeout_s: int = 120, after_batch: Callable[[int], None] | None = None) -> MoveReport:
    """Move the pod's telemetry to shard `to` (steps in the module's doc); a re-run finishes an interrupted
    move. `after_batch(n)` runs after each batch is committed on the target and before the cursor is stored
    (tests interrupt the move there: the worst place for a crash)."""
    from service.shards.setup import fleet_tables, prepare_shard

    control = get_engine(topology.control_url)
    state = _check(topology, control, pod, to)
    removed = 0
    if state["leftover"] is not None and state["move_to"] is None:  # an earlier move's old copy first
        _require_up(topology, [state["leftover"]])
        removed = remove_copy(control, topology, pod, state["leftover"], batch_series=batch_series,
                              progress=progress)
        state["leftover"] = None
    source = state["shard"]
    if state["move_to"] is None and source == to:
        if removed:  # a move whose last step had not finished: finished now
            return MoveReport(pod, source, to, removed_series=removed, resumed=True)
        raise MoveError(f"pod {_pod_shown(pod)} is on shard {to!r} already: nothing to move")
    if state["move_to"] is not None and state["move_to"] != to:
        raise MoveError(f"pod {_pod_shown(pod)} is being moved to shard {state['move_to']!r}: finish that move "
                        f"(fabricwatch shards move {pod!r} --to {state['move_to']}) or abort it (--abort)")
    report = MoveReport(pod, source, to, resumed=state["move_to"] is not None)
    try:
        _require_up(topology, [source, to])
    except ShardsUnavailable as exc:
        raise MoveError(f"{exc}: " + ("the move stays where it was, writes go on to both shards; run it again "
                                      "when the shard is back" if report.resumed else "nothing changed")) from None
    src_engine, tgt_engine = get_engine(topology.url(source)), get_engine(topology.url(to))

    # 1. mark
    # the target's schema, and the day partitions the copy needs, made before any lock is taken: a write
    # that made a partition on the target waits for nobody while holding that partition lock
    if state["move_to"] is None:
        prepare_shard(topology.url(to))
    with src_engine.connect() as src, tgt_engine.begin() as tgt:
        _copy_partitions(src, tgt)
    if state["move_to"] is None:
        with _routing_lock(control, pod, lock_timeout_s) as conn:
            now = _state(conn, pod)
            if now is None or (now["shard"], now["move_to"], now["leftover"]) != (source, None, None):
                raise MoveError(f"pod {_pod_shown(pod)} changed while the move started: nothing changed; run again")
            conn.execute(text("UPDATE shard_pods SET move_to = :to, move_cursor = 0 WHERE pod = :p"),
                         {"to": to, "p": pod})  # committed with the rest below; read by the inventory sync
            _sync_inventory(conn, topology, to)  # the pod's devices, hidden from fleet reads until the switch
            with src_engine.connect() as src, tgt_engine.begin() as tgt:
                after = 0
                while ids := _pod_series(src, pod, after, 10_000):  # every series, so writes find theirs
                    _copy_series(src, tgt, ids)
                    tgt.execute(text("DROP TABLE mv_series, mv_map"))
                    after = ids[-1]
        state["move_cursor"] = 0

    # 2. copy
    cursor = state["move_cursor"] or 0
    with src_engine.connect() as src:
        report.series = _count_pod_series(src, pod, 0)
        total, done = _count_pod_series(src, pod, cursor), 0
    if progress:
        progress("copying", 0, total)
    while True:
        with src_engine.connect() as src:
            ids = _pod_series(src, pod, cursor, batch_series)
        if not ids:
            break
        _copy_batch(src_engine, tgt_engine, ids)
        if after_batch is not None:
            after_batch(len(ids))
        cursor = ids[-1]
        with control.begin() as conn:
            conn.execute(text("UPDATE shard_pods SET move_cursor = :c WHERE pod = :p AND move_to = :to"),
                         {"c": cursor, "p": pod, "to": to})
        done += len(ids)
        if progress:
            progress("copying", done, total)

    # 3. verify
    if progress:
        progress("verifying", 0, 1)
    for attempt in range(3):
        old, new = _verify(control, topology, pod, source, to, lock_timeout_s)
        short = [key for key, (_, n) in old.items() if new.get(key, (0, 0))[1] < n]
        if progress:
            progress("verifying", 1, 1)
        if not short:
            break
        if attempt == 2:
            shown = ", ".join(f"{_series_text(k)}: {old[k][1]} on {source}, {new.get(k, (0, 0))[1]} on {to}"
                              for k in short[:5])
            raise MoveError(f"pod {_pod_shown(pod)}: {len(short)} series have fewer samples on shard {to!r} than "
                            f"on {source!r} after copying them again ({shown}); writes go on to both shards and "
                            f"nothing is switched: run the move again")
        ids = sorted(old[k][0] for k in short)
        for i in range(0, len(ids), batch_series):
            _copy_batch(src_engine, tgt_engine, ids[i:i + batch_series])
        report.recopied += len(ids)
    report.samples = sum(n for _, n in old.values())
    report.extra = {_series_text(k): n - old.get(k, (0, 0))[1] for k, (_, n) in new.items()
                    if n > old.get(k, (0, 0))[1]}

    if progress:
        progress("switching", 0, 1)
    # 4. switch: the old copy hidden from fleet reads first, then the map, then the new copy shown (a crash
    # in between hides the pod from fleet reads until the re-run or an `apply`; it never shows it twice). The
    # detection state goes first, while neither shard's cycles run until the switch is committed (module
    # docstring); the pod's writes wait for the switch only
    with _detection_paused(topology, [source, to], lock_timeout_s) as held:
        if progress:
            progress("carrying detection state", 0, 1)
        report.carried_ports = _carry_detection(control, topology, pod, held[source], held[to], to)
        if progress:
            progress("carrying detection state", 1, 1)
        with _routing_lock(control, pod, lock_timeout_s) as conn:
            _show(topology, source, pod, True)
            done_ = conn.execute(text(
                "UPDATE shard_pods SET shard = :to, move_to = NULL, move_cursor = NULL, leftover = :src, "
                "moved_from = :src, moved_at = now() WHERE pod = :p AND move_to = :to"),
                {"to": to, "src": source, "p": pod}).rowcount
            if done_ != 1:
                raise MoveError(f"pod {_pod_shown(pod)}: its move was changed by another command; nothing "
                                f"switched")
            fleet_tables(conn, topology, dict(conn.execute(text("SELECT pod, shard FROM shard_pods")).all()))
    _show(topology, to, pod, False)

    # 5. remove the old copy
    report.removed_series = remove_copy(control, topology, pod, source, batch_series=batch_series,
                                        progress=progress)
    return report


def abort_move(topology: Topology, pod: str, *, batch_series: int = 500, progress: Progress | None = None,
               lock_timeout_s: int = 120) -> str:
    """Stop a move before its switch: writes go to the old shard only again, and the target's copy is
    removed. Returns the target."""
    control = get_engine(topology.control_url)
    state = _check(topology, control, pod, None)
    to = state["move_to"]
    if to is None:
        if state["leftover"] is not None:  # an abort (or a switch) whose removal did not finish
            _require_up(topology, [state["leftover"]])
            remove_copy(control, topology, pod, state["leftover"], batch_series=batch_series, progress=progress)
            return str(state["leftover"])
        raise MoveError(f"pod {_pod_shown(pod)} is not being moved: nothing to abort")
    with _routing_lock(control, pod, lock_timeout_s) as conn:
        conn.execute(text("UPDATE shard_pods SET move_to = NULL, move_cursor = NULL, leftover = :to "
                          "WHERE pod = :p AND move_to = :to"), {"to": to, "p": pod})
    _require_up(topology, [to])
    remove_copy(control, topology, pod, to, batch_series=batch_series, progress=progress)
    return str(to)
