"""Writes go to their shard: a device's samples are stored on the shard of its pod (docs/architecture.md#shards).

The shard resolves device and port names against its copy of the inventory (service/shards/setup.py), so the
one `Ingestor` serves every shard unchanged. Unsharded, nothing here is used.
"""

from __future__ import annotations

import contextlib
from collections.abc import Iterable, Iterator
from dataclasses import dataclass, field
from pathlib import Path

from sqlalchemy import Connection, Engine, text

from service.config import Settings
from service.db import get_engine, normalize_url
from service.observability import INGESTED_ROWS
from service.shards.topology import Topology
from service.telemetry.ingest import Ingestor, IngestReport
from service.telemetry.samples import Sample


def topology_of(settings: Settings, control_url: str) -> Topology | None:
    """The topology when shards are configured, else None (every path stays the single-server one)."""
    if not settings.shards.urls:
        return None
    return Topology.of(control_url, settings.shards)


def _is_control(topology: Topology, shard: str) -> bool:
    return normalize_url(topology.url(shard)) == normalize_url(topology.control_url)


_DEVICE_SHARD_SQL = """
SELECT d.name, coalesce(m.shard, '') FROM devices d LEFT JOIN shard_pods m ON m.pod = coalesce(d.pod, '')
WHERE d.name = ANY(:names)
"""


def shards_of_devices(conn: Connection, topology: Topology, names: Iterable[str]) -> dict[str, str]:
    """Device name -> shard, from the stored pod map (a pod not stored yet: where the setting puts it).
    Names the inventory lacks go to the default shard, whose ingest reports them unknown as always."""
    names = sorted(set(names))
    found = dict(conn.execute(text(_DEVICE_SHARD_SQL), {"names": names}).all())
    pods = dict(conn.execute(text("SELECT name, pod FROM devices WHERE name = ANY(:names)"),
                             {"names": [n for n, s in found.items() if not s]}).all())
    return {n: found.get(n) or topology.shard_of(pods.get(n)) for n in names}


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

    @property
    def written(self) -> int:
        return sum(r.written for r in self.reports.values())


def ingest_samples(*, control: Engine, topology: Topology, samples: Iterable[Sample],
                   batch_rows: int = 50_000) -> ShardedReport:
    """Store canonical samples, each on its device's shard, one transaction per shard. A shard that cannot
    be reached stores nothing and is named in `errors`; the others' samples are stored all the same."""
    from sqlalchemy.exc import OperationalError

    from service.migrate import one_line

    batch = list(samples)
    with control.connect() as conn:
        where = shards_of_devices(conn, topology, (s.device for s in batch))
    per_shard: dict[str, list[Sample]] = {}
    for s in batch:
        per_shard.setdefault(where[s.device], []).append(s)
    out = ShardedReport()
    for shard, group in sorted(per_shard.items()):
        try:
            with get_engine(topology.url(shard)).begin() as conn:
                ingestor = Ingestor(conn, batch_rows=batch_rows)
                for s in group:
                    ingestor.add(s)
                out.reports[shard] = ingestor.finish()
        except OperationalError as exc:
            out.errors[shard] = one_line(exc)
    INGESTED_ROWS.inc(out.written)
    return out


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
        control_conn = stack.enter_context(control.connect())
        ingestors: dict[str, Ingestor] = {}
        where: dict[str, str] = {}
        pending: list[PromSample] = []
        first = 0

        def flush() -> None:
            devices = {dict(p[1].labels).get("device") for p in pending}
            new = {d for d in devices if d is not None} - where.keys()
            if new:
                where.update(shards_of_devices(control_conn, topology, new))
            for p in pending:
                shard = where.get(dict(p[1].labels).get("device") or "", topology.default)
                if shard not in ingestors:  # its transaction commits when the stack closes without an error
                    conn = stack.enter_context(get_engine(topology.url(shard)).begin())
                    ingestors[shard] = Ingestor(conn, batch_rows=batch_rows)
                ingestors[shard].add_prom_sample(p, default_ts_ms)
            pending.clear()

        for p in iter_samples(_lines(chunks), source):
            first = first or p[4]
            pending.append(p)
            if len(pending) >= ROUTE_BATCH:
                flush()
        flush()
        reports = {shard: ing.finish() for shard, ing in sorted(ingestors.items())}
        report = merged(reports.values())
        if report.nothing_stored:
            raise NothingStored(report, first, source)  # leaving the stack with it rolls every shard back
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
