"""Writes go to their shard: a device's samples are stored on the shard of its pod (docs/architecture.md#shards).

The shard resolves device and port names against its copy of the inventory (service/shards/setup.py), so the
one `Ingestor` serves every shard unchanged. Unsharded, nothing here is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

from sqlalchemy import Connection, Engine, text

from service.config import Settings
from service.db import get_engine, normalize_url
from service.observability import INGESTED_ROWS
from service.shards.topology import Topology
from service.telemetry.exporters.mapper import Block, Mapper, MapResult
from service.telemetry.exporters.store import store_mapped
from service.telemetry.ingest import Ingestor, IngestReport, SeriesKey
from service.telemetry.samples import Sample


def topology_of(settings: Settings, control_url: str) -> Topology | None:
    """The topology when shards are configured, else None (every path stays the single-server one)."""
    if not settings.shards.urls:
        return None
    return Topology.of(control_url, settings.shards)


def _is_control(topology: Topology, shard: str) -> bool:
    return normalize_url(topology.url(shard)) == normalize_url(topology.control_url)


# Writers hold this advisory lock, shared, per pod (the second key is hashtext(pod)) from reading the pod's
# route until their shard writes have committed; a move takes it alone to change the route, so a write in
# flight never misses a change (service/shards/rebalance.py). Shared holders never wait on each other.
ROUTE_LOCK = 0x66770020

_DEVICE_PODS_SQL = "SELECT name, coalesce(pod, '') FROM devices WHERE name = ANY(:names)"
_LOCK_PODS_SQL = ("SELECT count(pg_advisory_xact_lock_shared(:k, hashtext(p))) "
                  "FROM unnest(CAST(:pods AS text[])) p")
_ROUTES_SQL = "SELECT pod, shard, move_to FROM shard_pods WHERE pod = ANY(:pods)"


@dataclass(frozen=True)
class Route:
    """Where a device's samples are written: its pod's shard, and during a move first the shard it is
    moving to (`copy_to`), so that shard never lacks a sample the old one has."""

    shard: str
    copy_to: str | None = None


def routes(conn: Connection, topology: Topology, names: Iterable[str]) -> dict[str, Route]:
    """Device name -> its route, from the stored pod map (a pod not stored yet: where the setting puts it;
    names the inventory lacks: the default shard, whose ingest reports them unknown as always). Takes the
    routing lock of the devices' pods, shared, for `conn`'s transaction: keep that transaction open until
    the shard writes have committed."""
    names = sorted(set(names))
    pods = dict(conn.execute(text(_DEVICE_PODS_SQL), {"names": names}).all())
    wanted = sorted(set(pods.values()))
    if not wanted:
        return {n: Route(topology.default) for n in names}
    conn.execute(text(_LOCK_PODS_SQL), {"k": ROUTE_LOCK, "pods": wanted})
    stored = {pod: (shard, to) for pod, shard, to in conn.execute(text(_ROUTES_SQL), {"pods": wanted})}
    out = {}
    for n in names:
        pod = pods.get(n)
        shard, to = stored.get(pod, (None, None)) if pod is not None else (None, None)
        out[n] = Route(shard or topology.shard_of(pod or None), to)
    return out


def shards_of_devices(conn: Connection, topology: Topology, names: Iterable[str]) -> dict[str, str]:
    """Device name -> the shard its pod's telemetry is read from (`routes`, without the move target)."""
    return {n: r.shard for n, r in routes(conn, topology, names).items()}


def shard_engine_for_device(control: Engine, settings: Settings, device_id: int) -> Engine | None:
    """The engine of the shard that stores this device's samples; None when that is the control database
    (unsharded, or the control doubles as the device's shard)."""
    topology = topology_of(settings, control.url.render_as_string(hide_password=False))
    if topology is None:
        return None
    shard = _shard_of_device(control, topology, device_id)
    return None if _is_control(topology, shard) else get_engine(topology.url(shard))


def _shard_of_device(control: Engine, topology: Topology, device_id: int) -> str:
    """The shard of the device's pod (the default shard for a device the control database does not know)."""
    with control.connect() as conn:
        name = conn.execute(text("SELECT name FROM devices WHERE id = :i"), {"i": device_id}).scalar()
        return shards_of_devices(conn, topology, [name])[name] if name is not None else topology.default


@dataclass
class ShardedReport:
    """Per shard: what its ingest stored, or why it could not be reached (nothing of it stored)."""

    reports: dict[str, IngestReport] = field(default_factory=dict)
    errors: dict[str, str] = field(default_factory=dict)
    copies: dict[str, IngestReport] = field(default_factory=dict)  # a moving pod's writes to its new shard

    @property
    def written(self) -> int:
        return sum(r.written for r in self.reports.values())


T = TypeVar("T")


def write_routed(*, control_conn: Connection, topology: Topology, items: list[T], device: Callable[[T], str],
                 store: Callable[[Connection, list[T]], IngestReport], strict: bool,
                 same: Connection | None = None) -> ShardedReport:
    """Store items, each on its device's shard, one transaction per shard: first every move target's copy
    (`Route.copy_to`), then every pod's own shard, so a moving pod's new shard never lacks what the old
    one stored. `control_conn` holds the pods' routing lock until it ends: the caller ends it after this.
    A shard that cannot be reached raises OperationalError when `strict` (what is committed stays: ingest
    is idempotent, a retry stores no duplicate); else it is named in `errors`, and a moving pod whose new
    shard failed is not written to its old one either. `same`: the control connection itself, used for
    the shard that is the control database (one transaction with the caller's other writes)."""
    from sqlalchemy.exc import OperationalError

    from service.migrate import one_line

    where = routes(control_conn, topology, {device(i) for i in items})
    copies: dict[str, list[T]] = {}
    for i in items:
        to = where[device(i)].copy_to
        if to is not None:
            copies.setdefault(to, []).append(i)
    out = ShardedReport()
    failed: set[str] = set()  # devices whose copy failed: not written to their old shard either

    def one(shard: str, group: list[T], primary: bool) -> IngestReport | None:
        if primary and same is not None and _is_control(topology, shard):
            return store(same, group)
        try:
            with get_engine(topology.url(shard)).begin() as conn:
                return store(conn, group)
        except OperationalError as exc:
            if strict:
                raise
            out.errors[shard] = one_line(exc)
            return None

    for shard, group in sorted(copies.items()):
        report = one(shard, group, False)
        if report is None:
            failed |= {device(i) for i in group}
        else:
            out.copies[shard] = report
    per_shard: dict[str, list[T]] = {}
    for i in items:
        if device(i) not in failed:
            per_shard.setdefault(where[device(i)].shard, []).append(i)
    for shard, group in sorted(per_shard.items()):
        report = one(shard, group, True)
        if report is not None:
            out.reports[shard] = report
    return out


def _store_samples(batch_rows: int) -> Callable[[Connection, list[Sample]], IngestReport]:
    def store(conn: Connection, group: list[Sample]) -> IngestReport:
        ingestor = Ingestor(conn, batch_rows=batch_rows)
        for s in group:
            ingestor.add(s)
        return ingestor.finish()
    return store


def ingest_samples(*, control: Engine, topology: Topology, samples: Iterable[Sample],
                   batch_rows: int = 50_000) -> ShardedReport:
    """Store canonical samples, each on its device's shard, one transaction per shard. A shard that cannot
    be reached stores nothing and is named in `errors`; the others' samples are stored all the same."""
    with control.begin() as conn:  # holds the pods' routing lock until the shards have committed
        out = write_routed(control_conn=conn, topology=topology, items=list(samples), device=lambda s: s.device,
                           store=_store_samples(batch_rows), strict=False)
    INGESTED_ROWS.inc(out.written)
    return out


def store_samples(conn: Connection, topology: Topology, samples: list[Sample], *,
                  batch_rows: int = 50_000) -> IngestReport:
    """A collection's samples (an exporter scrape's may name several devices), each on its device's shard,
    with `conn` the caller's control transaction, which holds their pods' routing lock until it ends. A
    shard that cannot be reached raises OperationalError: the caller spools the collection, and its retry
    stores no duplicate of what was committed."""
    out = write_routed(control_conn=conn, topology=topology, items=samples, device=lambda s: s.device,
                       store=_store_samples(batch_rows), strict=True, same=conn)
    return merged(out.reports.values())


def _sub_block(block: Block, idx: list[int]) -> Block:
    """The part of a mapped block whose series texts are these (codes renumbered)."""
    import numpy as np

    remap = np.full(len(block.texts), -1, np.int32)
    remap[idx] = np.arange(len(idx), dtype=np.int32)
    new = remap[block.codes]
    keep = new >= 0
    return Block([block.texts[i] for i in idx], [block.keys[i] for i in idx], new[keep], block.ts_ms[keep],
                 block.values[keep])


def store_mapped_routed(conn: Connection, topology: Topology, mapped: MapResult, mapper: Mapper, *,
                        batch_rows: int = 50_000, source: str = "remote write") -> tuple[IngestReport, list[SeriesKey]]:
    """What `exporters.store_mapped` does, with each mapped series on its device's shard (remote write with
    shards configured); `conn` is the control transaction the mapping ran in, which holds the pods'
    routing lock until it ends. A shard that cannot be reached raises OperationalError (answered 503, and
    the sender's retry stores no duplicate of what was committed)."""
    items: list[tuple[str, int, str]] = [("row", i, r.key[1]) for i, r in enumerate(mapped.rows)]
    block = mapped.block
    if block is not None:
        items += [("text", i, k[1]) for i, k in enumerate(block.keys)]
    widths: list[SeriesKey] = []

    def store(shard_conn: Connection, group: list[tuple[str, int, str]]) -> IngestReport:
        texts = [i for kind, i, _ in group if kind == "text"]
        part = MapResult(rows=[mapped.rows[i] for kind, i, _ in group if kind == "row"],
                         block=_sub_block(block, texts) if block is not None and texts else None)
        report, w = store_mapped(shard_conn, part, mapper, batch_rows=batch_rows, source=source)
        widths.extend(w)
        return report

    out = write_routed(control_conn=conn, topology=topology, items=items, device=lambda i: i[2], store=store,
                       strict=True, same=conn)
    return merged(out.reports.values()), widths


def _lines(chunks: Iterable[bytes]) -> Iterator[str]:
    """UTF-8 lines (without their ends) of a body given in chunks of any size."""
    import codecs

    decoder = codecs.getincrementaldecoder("utf-8")()
    rest = ""
    for chunk in chunks:
        text_ = rest + decoder.decode(chunk)
        lines = text_.split("\n")
        rest = lines.pop()
        yield from (line.removesuffix("\r") for line in lines)
    rest += decoder.decode(b"", final=True)
    if rest:
        yield rest.removesuffix("\r")


def merged(reports: Iterable[IngestReport]) -> IngestReport:
    """One report of several shards' reports."""
    out = IngestReport()
    for r in reports:
        out.received += r.received
        out.written += r.written
        out.duplicates += r.duplicates
        out.skipped_nan += r.skipped_nan
        for name in ("unknown_metrics", "unknown_devices", "unknown_ports", "invalid"):
            getattr(out, name).update(getattr(r, name))
    return out


ROUTE_BATCH = 50_000  # lines parsed before their devices' shards are looked up (one query)


def import_exposition(*, control: Engine, topology: Topology, chunks: Iterable[bytes], source: str,
                      default_ts_ms: int, batch_rows: int = 50_000) -> tuple[IngestReport, dict[str, IngestReport]]:
    """Import exposition text with each sample stored on its device's shard: the merged report and each
    shard's. Parsed line by line (`promtext.iter_samples`; the single-server import's Arrow blocks are not
    used here yet). A malformed line anywhere, or every sample refused (NothingStored), writes nothing on any
    shard. Each shard's part is one transaction, committed one shard after another at the end: a shard lost
    between two commits leaves the parts before it stored (there is no two-phase commit across shards)."""
    from service.telemetry.ingest import NothingStored
    from service.telemetry.promtext import PromSample, iter_samples

    with contextlib.ExitStack() as stack:
        # the control connection's transaction holds the pods' routing lock until the shards have committed
        control_conn = stack.enter_context(control.begin())
        # (shard, 0): a moving pod's new shard, committed first; (shard, 1): the pods' own shards
        parts: dict[tuple[str, int], tuple[Ingestor, Any]] = {}
        where: dict[str, Route] = {}
        pending: list[PromSample] = []
        first = 0

        def add(shard: str, role: int, p: PromSample) -> None:
            if (shard, role) not in parts:  # rolled back when the stack closes, unless committed below
                conn = stack.enter_context(get_engine(topology.url(shard)).connect())
                parts[shard, role] = (Ingestor(conn, batch_rows=batch_rows), conn.begin())
            parts[shard, role][0].add_prom_sample(p, default_ts_ms)

        def flush() -> None:
            devices = {dict(p[1].labels).get("device") for p in pending}
            new = {d for d in devices if d is not None} - where.keys()
            if new:
                where.update(routes(control_conn, topology, new))
            for p in pending:
                route = where.get(dict(p[1].labels).get("device") or "", Route(topology.default))
                if route.copy_to is not None:
                    add(route.copy_to, 0, p)
                add(route.shard, 1, p)
            pending.clear()

        for p in iter_samples(_lines(chunks), source):
            first = first or p[4]
            pending.append(p)
            if len(pending) >= ROUTE_BATCH:
                flush()
        flush()
        done = {key: ing.finish() for key, (ing, _) in sorted(parts.items())}
        reports = {shard: r for (shard, role), r in done.items() if role == 1}
        report = merged(reports.values())
        if report.nothing_stored:
            raise NothingStored(report, first, source)  # leaving the stack with it rolls every shard back
        for key in sorted(parts, key=lambda k: (k[1], k[0])):  # copies first
            parts[key][1].commit()
    INGESTED_ROWS.inc(report.written)
    return report, reports


def shard_spools(spool_dir: Path, settings: Settings) -> list[Path]:
    """The per-shard spools under the collectors' spool (none unsharded)."""
    return [spool_dir / "shards" / name for name in sorted(settings.shards.urls)]


def shard_spool_for(spool_dir: Path, control: Engine, settings: Settings, device_id: int) -> Path:
    """Where a collection that could not be stored waits: unsharded, or when the control database cannot say
    the device's shard, the spool itself; else that shard's spool (`shard_spools`)."""
    from sqlalchemy.exc import OperationalError

    topology = topology_of(settings, control.url.render_as_string(hide_password=False))
    if topology is None:
        return spool_dir
    try:
        shard = _shard_of_device(control, topology, device_id)
    except OperationalError:
        return spool_dir  # the control database is away: every shard's writes wait in the one spool
    return spool_dir / "shards" / shard
