"""Writes go to their shard: a device's samples are stored on the shard of its pod (docs/architecture.md#shards).

The shard resolves device and port names against its copy of the inventory (service/shards/setup.py), so the
one `Ingestor` serves every shard unchanged. Unsharded, nothing here is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Callable, Iterable
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import Connection, Engine, text

from service.config import Settings
from service.db import get_engine, normalize_url
from service.observability import INGESTED_ROWS
from service.shards.topology import Topology
from service.telemetry.exporters.mapper import Block, Mapper, MapResult
from service.telemetry.exporters.store import store_mapped
from service.telemetry.ingest import Ingestor, IngestReport, SeriesKey, check_block_times, check_line_time
from service.telemetry.promtext import (
    CANONICAL_SERIES_RE,
    SHARED_CACHE_LIMIT,
    PromBlock,
    PromSample,
    iter_blocks,
    parse_series,
)
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


ROUTE_BATCH = 50_000  # lines outside blocks parsed before their devices' shards are looked up (one query)
_DEVICES: dict[str, str] = {}  # series text -> its device label, process-wide (pushes repeat their series)
_DAY_MS = 86_400_000
_PARTITIONS: set[tuple[str, int]] = set()  # (shard URL, day) whose sample partition this process has seen exist


def _device_of(series: str) -> str:
    """The device label of a valid `name{labels}` text ('' if none), as the Ingestor reads it."""
    device = _DEVICES.get(series)
    if device is None:
        m = CANONICAL_SERIES_RE.fullmatch(series)
        device = m.group(2) if m is not None else dict(parse_series(series)[1]).get("device", "")
        if len(_DEVICES) >= SHARED_CACHE_LIMIT:
            _DEVICES.clear()
        _DEVICES[series] = device
    return device


@dataclass
class _Part:
    """One shard's part of an import: its Ingestor, streaming inside the transaction `tx`, and the stream's
    texts routed to it (`texts`: the sub-blocks' shared list; `local`: per stream text, its index there or -1)."""

    ingestor: Ingestor
    tx: Any
    texts: list[str]
    local: np.ndarray


class _Router:
    """Splits one parsed stream (`promtext.iter_blocks`) by shard: a block's lines by their series' shards,
    with numpy (each series text is routed once, when it is new to the stream), each shard's rows handed to
    its Ingestor as one block; lines outside blocks one by one, in stream order. A moving pod's lines go to
    its new shard's part too (role 0; role 1: the pods' own shards)."""

    def __init__(self, control_conn: Connection, topology: Topology, conns: contextlib.ExitStack,
                 streams: contextlib.ExitStack, *, source: str, default_ts_ms: int, batch_rows: int) -> None:
        self.control_conn, self.topology, self.conns, self.streams = control_conn, topology, conns, streams
        self.source, self.default_ts_ms, self.batch_rows = source, default_ts_ms, batch_rows
        self.parts: dict[tuple[str, int], _Part] = {}
        self.where: dict[str, Route] = {}
        self.stream: list[str] | None = None  # the stream's texts (PromBlock.texts), routed up to `mapped`
        self.mapped = 0
        self.pending: list[PromSample] = []  # lines waiting for their devices' routes
        self.first = 0  # the first sample line

    def part(self, key: tuple[str, int]) -> _Part:
        part = self.parts.get(key)
        if part is None:  # rolled back when the stacks close, unless committed
            conn = self.conns.enter_context(get_engine(self.topology.url(key[0])).connect())
            ingestor = Ingestor(conn, batch_rows=self.batch_rows)
            part = _Part(ingestor, conn.begin(), [], np.full(self.mapped, -1, np.int32))
            self.streams.enter_context(ingestor.streaming(self.source))
            self.parts[key] = part
        return part

    def days(self, shard: str, days: Iterable[int]) -> None:
        """Make sure the shard has these days' partitions, created and committed in a transaction of their
        own before a part writes them: two parts of one import on one shard (a moving pod's copy, and the
        shard's own pods) would otherwise each create them in its open transaction, the second waiting on
        the first's partition lock for ever (partitions.create_partitions). A part whose partition was
        dropped since (retention) creates it itself, as any ingest does."""
        url = self.topology.url(shard)
        new = sorted({d for d in days if (url, d) not in _PARTITIONS})
        if not new:
            return
        from datetime import UTC, datetime

        from service.telemetry.partitions import create_partitions

        with get_engine(url).begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '30s'"))  # an error, never a hang
            with conn.connection.driver_connection.cursor() as cur:  # type: ignore[union-attr]
                create_partitions(cur, [datetime.fromtimestamp(d * _DAY_MS / 1000, tz=UTC).date() for d in new])
        _PARTITIONS.update((url, d) for d in new)

    def look_up(self, devices: Iterable[str]) -> None:
        new = set(devices) - self.where.keys()
        if new:
            self.where.update(routes(self.control_conn, self.topology, new))

    def add(self, item: PromBlock | PromSample) -> None:
        if isinstance(item, PromBlock):
            self.add_block(item)
        else:
            check_line_time(item[3], item[4], self.source)  # now, as the single-server import would
            self.first = self.first or item[4]
            self.pending.append(item)
            if len(self.pending) >= ROUTE_BATCH:
                self.flush_lines()

    def flush_lines(self) -> None:
        """Hand the waiting lines to their shards' Ingestors, in order."""
        if not self.pending:
            return
        devices = [_device_of(p[0]) for p in self.pending]
        self.look_up(devices)
        days: dict[str, set[int]] = {}
        for p, device in zip(self.pending, devices, strict=True):
            route, day = self.where[device], (self.default_ts_ms if p[3] is None else p[3]) // _DAY_MS
            days.setdefault(route.shard, set()).add(day)
            if route.copy_to is not None:
                days.setdefault(route.copy_to, set()).add(day)
        for shard, some in sorted(days.items()):
            self.days(shard, some)
        for p, device in zip(self.pending, devices, strict=True):
            route = self.where[device]
            if route.copy_to is not None:
                self.part((route.copy_to, 0)).ingestor.add_prom_sample(p, self.default_ts_ms)
            self.part((route.shard, 1)).ingestor.add_prom_sample(p, self.default_ts_ms)
        self.pending.clear()

    def add_block(self, block: PromBlock) -> None:
        self.flush_lines()  # the lines before it first
        self.first = self.first or block.first_line
        lo, hi = check_block_times(block, self.source)  # its first bad line, whichever shard's it is
        one_day = lo // _DAY_MS == hi // _DAY_MS
        if block.texts is not self.stream:  # a new stream: its texts are routed afresh
            self.stream, self.mapped = block.texts, 0
            for part in self.parts.values():
                part.texts, part.local = [], np.empty(0, np.int32)
        if len(block.texts) > self.mapped:
            self.route_texts(block.texts[self.mapped:])
        first = block.first_line
        for (shard, _), part in list(self.parts.items()):
            codes = part.local[block.codes]
            keep = codes >= 0
            n = int(np.count_nonzero(keep))
            if n == len(codes):  # the whole block (a push names one device)
                sub = PromBlock(first, part.texts, codes, block.values, block.ts_ms)
            elif n:
                rows = np.flatnonzero(keep)
                sub = PromBlock(first, part.texts, codes[rows], block.values[rows], block.ts_ms[rows], rows + first)
            else:
                continue
            self.days(shard, [lo // _DAY_MS] if one_day else np.unique(sub.ts_ms // _DAY_MS).tolist())
            part.ingestor.add_prom_block(sub)

    def route_texts(self, texts: list[str]) -> None:
        """Route texts new to the stream: each one's index in the texts of its part (and of its new
        shard's part, for a moving pod), appended there. Python works per device, numpy per text: a
        push's texts are all new to its stream, and usually all of one device."""
        devices = list(map(_DEVICES.get, texts))
        if None in devices:
            devices = [_device_of(t) if d is None else d for t, d in zip(texts, devices, strict=True)]
        uniq = list(dict.fromkeys(devices))
        self.look_up(uniq)
        for d in uniq:
            route = self.where[d]
            self.part((route.shard, 1))
            if route.copy_to is not None:
                self.part((route.copy_to, 0))
        index = {key: i for i, key in enumerate(self.parts)}
        targets = np.array([(index[r.shard, 1], -1 if r.copy_to is None else index[r.copy_to, 0])
                            for r in map(self.where.__getitem__, uniq)], np.int32)  # per device
        if len(uniq) == 1:
            which = None
        else:
            position = dict(zip(uniq, range(len(uniq)), strict=True))
            which = np.fromiter(map(position.__getitem__, devices), np.int32, len(devices))
        for i, part in enumerate(self.parts.values()):
            mine = (targets == i).any(axis=1)  # per device
            local = np.full(len(texts), -1, np.int32)
            if mine.all():
                local = np.arange(len(part.texts), len(part.texts) + len(texts), dtype=np.int32)
                part.texts.extend(texts)
            elif mine.any() and which is not None:  # (one device: all or none)
                rows = np.flatnonzero(mine[which])
                local[rows] = np.arange(len(part.texts), len(part.texts) + len(rows), dtype=np.int32)
                part.texts.extend([texts[r] for r in rows.tolist()])
            part.local = np.concatenate([part.local, local])
        self.mapped += len(texts)


def import_exposition(*, control: Engine, topology: Topology, chunks: Iterable[bytes], source: str,
                      default_ts_ms: int, batch_rows: int = 50_000) -> tuple[IngestReport, dict[str, IngestReport]]:
    """Import exposition text with each sample stored on its device's shard: the merged report and each
    shard's. Parsed as the single-server import parses it (`promtext.iter_blocks`), and each block split by
    shard with numpy (`_Router`): each shard's Ingestor gets its rows as blocks, at about the single-server
    import's cost per sample. A malformed line anywhere, or every sample refused (NothingStored), writes
    nothing on any shard; the error names the line the single-server import names. Each shard's part is one
    transaction, committed one shard after another at the end (a moving pod's new shard first): a shard lost
    between two commits leaves the parts before it stored (there is no two-phase commit across shards). A
    shard that cannot be reached raises OperationalError, and nothing is committed anywhere."""
    from service.telemetry.ingest import NothingStored

    with contextlib.ExitStack() as stack:
        # the control connection's transaction holds the pods' routing lock until the shards have committed
        control_conn = stack.enter_context(control.begin())
        conns = stack.enter_context(contextlib.ExitStack())
        # closed before the connections, so that an error aborts each COPY before its rollback
        streams = stack.enter_context(contextlib.ExitStack())
        router = _Router(control_conn, topology, conns, streams, source=source, default_ts_ms=default_ts_ms,
                         batch_rows=batch_rows)
        for item in iter_blocks(chunks, source):
            router.add(item)
        router.flush_lines()
        streams.close()  # each shard's rows sent
        done = {key: part.ingestor.finish() for key, part in sorted(router.parts.items())}
        reports = {shard: r for (shard, role), r in done.items() if role == 1}
        report = merged(reports.values())
        if report.nothing_stored:
            raise NothingStored(report, router.first, source)  # leaving the stack with it rolls every shard back
        for key in sorted(router.parts, key=lambda k: (k[1], k[0])):  # copies first
            router.parts[key].tx.commit()
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
