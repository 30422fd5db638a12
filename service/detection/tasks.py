"""The detection cycle on a schedule: beat sends it; one cycle at a time (an advisory lock in detect_at).

With shards (FABRICWATCH_SHARDS_URLS), beat sends one task per shard, each on the shard's own queue
(`detect.<shard>`, service/worker.py), so a slow or down shard delays only its own cycles
(service/shards/detection.py). Unsharded, it is the one cycle on the one database, as it always was.
"""

from __future__ import annotations

import time
from typing import Any

from service.config import get_settings
from service.db import get_engine
from service.pipeline import run_cycle
from service.worker import celery_app


@celery_app.task(name="fabricwatch.run_detection", acks_late=False)
def run_detection(at_ms: int | None = None, shard: str | None = None) -> dict[str, Any]:
    """One cycle at data time `at_ms` (default: now): of `shard`, or, sharded and sent without one, of every
    shard in turn. Not re-queued if a worker dies: the next cycle covers the same samples, so a lost cycle
    only delays, never loses, a finding."""
    settings = get_settings()
    now = at_ms if at_ms is not None else int(time.time() * 1000)
    url = settings.database_url or ""
    if not settings.shards.urls:
        if shard is not None:
            raise ValueError(f"run_detection: shard {shard!r} given, but no shards are configured "
                             f"(FABRICWATCH_SHARDS_URLS is empty)")
        return run_cycle(get_engine(url), now).summary()
    from service.shards.detection import run_all_shards, run_shard_cycle
    from service.shards.topology import Topology

    topology = Topology.of(url, settings.shards)
    if shard is not None:
        return run_shard_cycle(topology, shard, now).summary()
    done, failed = run_all_shards(topology, now)
    return {"shards": {s: c.summary() for s, c in done.items()}, "failed": failed}
