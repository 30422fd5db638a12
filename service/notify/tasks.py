"""Celery tasks: deliver due outbox rows to webhooks and Alertmanagers. Beat runs them every few seconds;
several may run at once."""

from __future__ import annotations

from service.config import get_settings
from service.db import get_engine
from service.notify import alertmanager
from service.notify.outbox import deliver_due
from service.worker import celery_app


@celery_app.task(name="fabricwatch.deliver_outbox")  # time limits: service/worker.py
def deliver_outbox(limit: int = 500, budget_s: float = 60.0) -> dict[str, int]:
    """Send what is due; rows locked by another worker are skipped (FOR UPDATE SKIP LOCKED)."""
    settings = get_settings()
    return deliver_due(get_engine(settings.database_url or ""), limit=limit, budget_s=budget_s)


@celery_app.task(name="fabricwatch.deliver_alertmanager")  # time limits: service/worker.py
def deliver_alertmanager(budget_s: float = 60.0) -> dict[str, int]:
    """Push due alert states to the Alertmanagers; rows another worker holds are skipped (SKIP LOCKED)."""
    settings = get_settings()
    return alertmanager.deliver(get_engine(settings.database_url or ""), budget_s=budget_s)
