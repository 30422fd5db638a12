"""A disk spool for collections that could not be stored: nothing collected is lost to a database outage.

When PostgreSQL is unreachable at store time, the collection (samples, status, neighbours) is
written to one JSON file in the worker's spool directory (atomic rename). Every later collection
task on that worker first drains the spool, oldest first, deleting a file only after its
transaction committed. Stores are idempotent (samples ON CONFLICT DO NOTHING), so a file stored
twice after a crash between commit and delete writes nothing twice.
"""

from __future__ import annotations

import json
import logging
import os
import tempfile
import time
import uuid
from collections.abc import Callable
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from collectors.base import CollectResult, Neighbor
from service.telemetry.samples import Sample

log = logging.getLogger(__name__)


@dataclass
class PendingStore:
    """Everything a collection needs to be stored later."""

    endpoint_id: int
    device_id: int
    protocol: str
    groups: list[str]
    started_ms: int
    result: CollectResult = field(default_factory=lambda: CollectResult(target=""))


def default_spool_dir() -> Path:
    if os.geteuid() == 0:
        return Path("/var/lib/fabricwatch/spool")
    return Path(tempfile.gettempdir()) / f"fabricwatch-{os.geteuid()}" / "spool"


def _encode(p: PendingStore) -> str:
    r = p.result
    return json.dumps({
        "endpoint_id": p.endpoint_id, "device_id": p.device_id, "protocol": p.protocol, "groups": p.groups,
        "started_ms": p.started_ms,
        "result": {"target": r.target, "error": r.error, "warnings": r.warnings, "duration_s": r.duration_s,
                   "neighbors": [asdict(n) for n in r.neighbors],
                   "samples": [[s.metric, s.value, s.ts_ms, s.device, s.port, s.lane, s.priority, s.gpu,
                                s.counter_bits, s.saturating] for s in r.samples]},
    })


def _decode(text: str) -> PendingStore:
    d = json.loads(text)
    r = d["result"]
    result = CollectResult(target=r["target"], samples=[Sample(*row) for row in r["samples"]], error=r["error"],
                           warnings=r["warnings"], neighbors=[Neighbor(**n) for n in r["neighbors"]],
                           duration_s=r["duration_s"])
    return PendingStore(d["endpoint_id"], d["device_id"], d["protocol"], d["groups"], d["started_ms"], result)


def spool_write(directory: Path, pending: PendingStore) -> Path:
    directory.mkdir(parents=True, exist_ok=True, mode=0o700)
    name = f"{time.time_ns():020d}-{uuid.uuid4().hex[:8]}.json"
    tmp = directory / f".{name}.tmp"
    tmp.write_text(_encode(pending))
    os.replace(tmp, directory / name)
    return directory / name


def spool_drain(directory: Path, store: Callable[[PendingStore], Any]) -> int:
    """Store spooled collections oldest first; stop at the first failure (the database is still away)."""
    if not directory.is_dir():
        return 0
    done = 0
    for path in sorted(directory.glob("*.json")):
        try:
            pending = _decode(path.read_text())
        except FileNotFoundError:
            continue  # another worker thread stored it first
        except (OSError, ValueError, KeyError, TypeError) as exc:
            # A damaged file must not block the spool forever; keep it aside for a person to look at.
            log.error("spool file %s is unreadable (%s); moved aside", path, exc)
            path.rename(path.with_suffix(".bad"))
            continue
        store(pending)  # raises while the database is unreachable; the file stays for the next try
        path.unlink(missing_ok=True)
        done += 1
    return done
