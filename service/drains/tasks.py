"""Celery task: run queued drain executions. Beat sends it every FABRICWATCH_DRAIN_EXECUTE_POLL_S seconds.

Several may run at once (each claims a different execution). A redelivered message (acks_late, the worker
was lost) runs the sweep, which marks the lost execution `unknown`; it never starts one twice.
"""

from __future__ import annotations

from service.config import get_settings
from service.db import get_engine
from service.drains.execution import execute_due
from service.worker import celery_app


@celery_app.task(name="fabricwatch.execute_drains")  # time limits: service/worker.py
def execute_drains(budget_s: float = 60.0) -> dict[str, int]:
    """Sweep lost executions, then run the queued ones (each once, no transaction open while it runs)."""
    settings = get_settings()
    return execute_due(get_engine(settings.database_url or ""), budget_s=budget_s)
