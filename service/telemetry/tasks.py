"""Storage maintenance on a schedule: partitions ahead, retention behind, compression and rollups.

Each task works on every database that stores samples: the one database, or with telemetry shards each shard
(docs/architecture.md#shards), one after another. A shard that cannot be reached does not stop the others'
maintenance; the task then fails naming it, after the others are done."""

from __future__ import annotations

import logging
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError

from service.config import Settings, get_settings
from service.db import get_engine
from service.telemetry.partitions import drop_expired, ensure_ahead
from service.worker import celery_app

log = logging.getLogger(__name__)


def on_each_store(settings: Settings, work: Callable[[Engine], dict[str, Any]]) -> dict[str, Any]:
    """`work` on each database that stores samples. Unsharded: its result. Sharded: {"shards": {name: result}};
    a shard that cannot be reached is logged and, once the others are done, raised (ShardsUnavailable)."""
    from service.migrate import one_line
    from service.shards.topology import ShardsUnavailable, Topology

    topology = Topology.of(settings.database_url or "", settings.shards)
    if not topology.sharded:
        return work(get_engine(topology.control_url))
    done: dict[str, Any] = {}
    down: dict[str, str] = {}
    for name, url in sorted(topology.shards.items()):
        try:
            done[name] = work(get_engine(url))
        except OperationalError as exc:
            down[name] = one_line(exc) or type(exc).__name__
            log.warning("shard %s: storage maintenance skipped: %s", name, down[name])
    if down:
        raise ShardsUnavailable(down)
    return {"shards": done}


@celery_app.task(name="fabricwatch.maintain_partitions")
def maintain_partitions() -> dict[str, Any]:
    settings = get_settings()
    today = datetime.now(UTC).date()

    def work(engine: Engine) -> dict[str, Any]:
        with engine.begin() as conn:
            created = ensure_ahead(conn, today=today, days_ahead=settings.partition_days_ahead)
            dropped = drop_expired(conn, today=today, retention_days=settings.retention_days)
        return {"created": created, "dropped": dropped}

    return on_each_store(settings, work)


@celery_app.task(name="fabricwatch.compress_samples")
def compress_samples() -> dict[str, Any]:
    """Move samples past the hot window into compressed chunks (bounded work per run)."""
    from service.telemetry.compress import run_compression

    settings = get_settings()
    return on_each_store(settings, lambda engine: run_compression(
        engine, now=datetime.now(UTC), hot_s=settings.compress_after_s, batch_series=settings.compress_batch_series,
        max_batches=settings.compress_max_batches).to_dict())


@celery_app.task(name="fabricwatch.compute_rollups")
def compute_rollups() -> dict[str, Any]:
    """Bring the 5-minute and 1-hour rollups up to the last closed bucket (bounded work per run)."""
    from service.telemetry.rollups import run_rollups

    settings = get_settings()
    return on_each_store(settings, lambda engine: {"levels": [r.to_dict() for r in run_rollups(
        engine, now=datetime.now(UTC), lag_s=settings.rollup_lag_s, max_gap_s=settings.rollup_max_gap_s,
        max_chunks=settings.rollup_max_chunks)]})


@celery_app.task(name="fabricwatch.maintain_rollups")
def maintain_rollups() -> dict[str, Any]:
    """Drop rollup partitions past their level's retention (partitions are created on demand)."""
    from service.telemetry.rollups import L1H, L5M, drop_expired

    settings = get_settings()
    today = datetime.now(UTC).date()

    def work(engine: Engine) -> dict[str, Any]:
        with engine.begin() as conn:
            dropped = (drop_expired(conn, L5M, today=today, retention_days=settings.rollup_5m_retention_days)
                       + drop_expired(conn, L1H, today=today, retention_days=settings.rollup_1h_retention_days))
        return {"dropped": dropped}

    return on_each_store(settings, work)
