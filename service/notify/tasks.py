"""Celery task: deliver due outbox rows. Beat runs it every few seconds; several may run at once."""

from __future__ import annotations

from service.config import get_settings
from service.db import get_engine
from service.notify.outbox import deliver_due
from service.worker import celery_app


@celery_app.task(name="fabricwatch.deliver_outbox")  # time limits: service/worker.py
def deliver_outbox(limit: int = 500, budget_s: float = 60.0) -> dict[str, int]:
    """Send what is due; rows locked by another worker are skipped (FOR UPDATE SKIP LOCKED)."""
    settings = get_settings()
    return deliver_due(get_engine(settings.database_url or ""), limit=limit, budget_s=budget_s)
