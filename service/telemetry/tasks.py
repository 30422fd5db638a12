"""Storage maintenance on a schedule: partitions ahead, retention behind."""

from __future__ import annotations

from datetime import UTC, datetime
from typing import Any

from service.config import get_settings
from service.db import get_engine
from service.telemetry.partitions import drop_expired, ensure_ahead
from service.worker import celery_app


@celery_app.task(name="fabricwatch.maintain_partitions")
def maintain_partitions() -> dict[str, Any]:
    settings = get_settings()
    today = datetime.now(UTC).date()
    with get_engine(settings.database_url or "").begin() as conn:
        created = ensure_ahead(conn, today=today, days_ahead=settings.partition_days_ahead)
        dropped = drop_expired(conn, today=today, retention_days=settings.retention_days)
    return {"created": created, "dropped": dropped}


@celery_app.task(name="fabricwatch.compress_samples")
def compress_samples() -> dict[str, Any]:
    """Move samples past the hot window into compressed chunks (bounded work per run)."""
    from service.telemetry.compress import run_compression

    settings = get_settings()
    run = run_compression(get_engine(settings.database_url or ""), now=datetime.now(UTC),
                          hot_s=settings.compress_after_s, batch_series=settings.compress_batch_series,
                          max_batches=settings.compress_max_batches)
    return run.to_dict()


@celery_app.task(name="fabricwatch.compute_rollups")
def compute_rollups() -> dict[str, Any]:
    """Bring the 5-minute and 1-hour rollups up to the last closed bucket (bounded work per run)."""
    from service.telemetry.rollups import run_rollups

    settings = get_settings()
    runs = run_rollups(get_engine(settings.database_url or ""), now=datetime.now(UTC),
                       lag_s=settings.rollup_lag_s, max_gap_s=settings.rollup_max_gap_s,
                       max_chunks=settings.rollup_max_chunks)
    return {"levels": [r.to_dict() for r in runs]}


@celery_app.task(name="fabricwatch.maintain_rollups")
def maintain_rollups() -> dict[str, Any]:
    """Drop rollup partitions past their level's retention (partitions are created on demand)."""
    from service.telemetry.rollups import L1H, L5M, drop_expired

    settings = get_settings()
    today = datetime.now(UTC).date()
    with get_engine(settings.database_url or "").begin() as conn:
        dropped = (drop_expired(conn, L5M, today=today, retention_days=settings.rollup_5m_retention_days)
                   + drop_expired(conn, L1H, today=today, retention_days=settings.rollup_1h_retention_days))
    return {"dropped": dropped}
