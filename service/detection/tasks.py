"""The detection cycle on a schedule: beat sends it; one cycle at a time (an advisory lock in detect_at)."""

from __future__ import annotations

import time
from typing import Any

from service.config import get_settings
from service.db import get_engine
from service.pipeline import run_cycle
from service.worker import celery_app


@celery_app.task(name="fabricwatch.run_detection", acks_late=False)
def run_detection(at_ms: int | None = None) -> dict[str, Any]:
    """One cycle at data time `at_ms` (default: now). Not re-queued if a worker dies: the next cycle
    covers the same samples, so a lost cycle only delays, never loses, a finding."""
    settings = get_settings()
    now = at_ms if at_ms is not None else int(time.time() * 1000)
    return run_cycle(get_engine(settings.database_url or ""), now).summary()
