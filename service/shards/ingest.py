"""Writes go to their shard: a device's samples are stored on the shard of its pod (docs/architecture.md#shards).

The shard resolves device and port names against its copy of the inventory (service/shards/setup.py), so the
one `Ingestor` serves every shard unchanged. Unsharded, nothing here is used.
"""

from __future__ import annotations

from collections.abc import Iterable
from dataclasses import dataclass, field

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
    with control.connect() as conn:
        name = conn.execute(text("SELECT name FROM devices WHERE id = :i"), {"i": device_id}).scalar()
        shard = shards_of_devices(conn, topology, [name])[name] if name is not None else topology.default
    return None if _is_control(topology, shard) else get_engine(topology.url(shard))


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
