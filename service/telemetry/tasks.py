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
