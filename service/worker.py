"""The Celery application: collection tasks, their dispatcher, and storage maintenance.

Reliability settings: tasks are acknowledged late and re-queued if a worker dies mid-task
(`task_acks_late`, `task_reject_on_worker_lost`); every write they make is idempotent
(samples ON CONFLICT DO NOTHING, slots claimed atomically), so a re-run stores nothing twice.
"""

from __future__ import annotations

import os

from celery import Celery

from service.broker import broker_url, transport_class, transport_options
from service.config import Settings, get_settings

DEFAULT_QUEUE = "fabricwatch"

celery_app = Celery("fabricwatch")


def configure(app: Celery, settings: Settings) -> Celery:
    app.conf.update(
        broker_url=broker_url(settings),
        broker_transport=transport_class(settings),
        broker_transport_options=transport_options(settings),
        broker_connection_retry_on_startup=True,
        task_acks_late=True,
        task_reject_on_worker_lost=True,
        worker_prefetch_multiplier=1,
        task_ignore_result=True,
        task_default_queue=DEFAULT_QUEUE,
        timezone="UTC",
        enable_utc=True,
        imports=("collectors.tasks", "service.telemetry.tasks", "service.notify.tasks", "service.detection.tasks"),
        beat_schedule={
            "dispatch-collections": {"task": "fabricwatch.dispatch_collections",
                                     "schedule": settings.dispatch_interval_s},
            "maintain-partitions": {"task": "fabricwatch.maintain_partitions", "schedule": 3600.0},
            "compute-rollups": {"task": "fabricwatch.compute_rollups", "schedule": settings.rollup_interval_s},
            "maintain-rollups": {"task": "fabricwatch.maintain_rollups", "schedule": 3600.0},
            "run-detection": {"task": "fabricwatch.run_detection", "schedule": settings.detect_interval_s,
                              "options": {"expires": settings.detect_interval_s}},
            "deliver-webhooks": {"task": "fabricwatch.deliver_outbox", "schedule": settings.webhook_poll_s},
        },
    )
    return app


# `celery -A service.worker` and `fabricwatch worker/beat` both land here; the CLI exports the
# resolved database URL first, so a worker reuses the parent's (possibly embedded) database.
if os.environ.get("FABRICWATCH_DATABASE_URL") or os.environ.get("FABRICWATCH_REDIS_URL"):
    configure(celery_app, get_settings())
