"""The Celery application: collection tasks, their dispatcher, and storage maintenance.

Reliability settings: tasks are acknowledged late and re-queued if a worker dies mid-task
(`task_acks_late`, `task_reject_on_worker_lost`); every write they make is idempotent
(samples ON CONFLICT DO NOTHING, slots claimed atomically), so a re-run stores nothing twice.

Every task has a soft and a hard time limit for its kind (TIME_LIMITS, overridden per kind by
FABRICWATCH_TASK_TIME_LIMITS). At the soft limit the task gets SoftTimeLimitExceeded: its transaction
rolls back (a detection cycle frees the alert lock), a collection records the cut as its target's
error. At the hard limit the pool process is killed. The next beat tick runs the next cycle either way.
Celery enforces time limits only in the prefork pool (WORKER_POOL, what `fabricwatch worker` starts);
its threads pool ignores them.
"""

from __future__ import annotations

import os
import subprocess
import sys
import threading
import time
from typing import Any

from celery import Celery, Task, bootsteps
from celery.signals import worker_process_init

from service.broker import broker_url, transport_class, transport_options
from service.config import Settings, SettingsError, get_settings
from service.drains.schemas import drain_settings

DEFAULT_QUEUE = "fabricwatch"
WORKER_POOL = "prefork"  # the pool that enforces time limits (a hung task cannot be cut off in a thread)

# (soft, hard) seconds per task kind, the task name after "fabricwatch.".
TIME_LIMITS: dict[str, tuple[float, float]] = {
    "dispatch_collections": (30.0, 60.0),    # one UPDATE per target and group
    "collect_target": (120.0, 150.0),        # a poll is bounded by its endpoint's timeouts long before this
    "run_detection": (600.0, 660.0),         # a cycle of a large fabric, with training
    "deliver_outbox": (120.0, 150.0),        # its own budget is 60 s
    "deliver_alertmanager": (120.0, 150.0),  # its own budget is 60 s
    # claims for 60 s, then finishes the execution it has: a command may take FABRICWATCH_DRAIN_COMMAND_TIMEOUT_S
    # (120 s) per step; cut off, the execution is recorded `unknown` and never re-run (docs/drains.md)
    "execute_drains": (600.0, 660.0),
    "maintain_partitions": (600.0, 660.0),
    "compute_rollups": (900.0, 960.0),       # bounded chunks per run
    "compress_samples": (1800.0, 1860.0),    # bounded batches per run; a cut batch rolls back whole
    "maintain_rollups": (600.0, 660.0),
}
_CONF_KEY = "fabricwatch_time_limits"


def detect_queue(shard: str) -> str:
    """The queue of a shard's detection cycles (a worker consumes it with `-Q detect.<shard>`)."""
    return f"detect.{shard}"


def collect_queue(shard: str) -> str:
    """The default queue of the collections of a shard's devices (collectors/queues.py)."""
    return f"collect.{shard}"


def worker_queues(settings: Settings) -> list[str]:
    """What `fabricwatch worker` consumes without -Q: every queue beat and the dispatcher send to by default,
    so one worker is a whole deployment's."""
    shards = sorted(settings.shards.urls)
    return [DEFAULT_QUEUE, *(collect_queue(s) for s in shards), *(detect_queue(s) for s in shards)]


def detection_schedule(settings: Settings) -> dict[str, dict[str, Any]]:
    """Beat's detection entries: one cycle on the default queue, or with shards one per shard on its own queue,
    so a shard that is slow or down delays only its own cycles (docs/architecture.md#shards)."""
    every = settings.detect_interval_s
    if not settings.shards.urls:
        return {"run-detection": {"task": "fabricwatch.run_detection", "schedule": every,
                                  "options": {"expires": every}}}
    return {f"run-detection-{shard}": {"task": "fabricwatch.run_detection", "schedule": every,
                                       "kwargs": {"shard": shard},
                                       "options": {"queue": detect_queue(shard), "expires": every}}
            for shard in sorted(settings.shards.urls)}


def default_concurrency() -> int:
    """The pool size when none is given: two per usable CPU (collection mostly waits on the network), at
    most 8, since every prefork child is a process of its own (memory per child: docs/operations.md)."""
    return min(8, 2 * len(os.sched_getaffinity(0)))


def time_limits(settings: Settings) -> dict[str, tuple[float, float]]:
    """TIME_LIMITS with the settings' overrides; SettingsError for an unknown kind or soft >= hard."""
    out = dict(TIME_LIMITS)
    for kind, (soft, hard) in settings.task_time_limits.items():
        if kind not in TIME_LIMITS:
            raise SettingsError(f"setting FABRICWATCH_TASK_TIME_LIMITS: unknown task kind {kind!r} "
                                f"(known: {', '.join(sorted(TIME_LIMITS))})")
        if not 0 < soft < hard:
            raise SettingsError(f"setting FABRICWATCH_TASK_TIME_LIMITS: {kind}: the soft limit ({soft:g} s) "
                                f"must be positive and below the hard one ({hard:g} s)")
        out[kind] = (float(soft), float(hard))
    return out


class LimitedTask(Task):  # type: ignore[misc]
    """A task whose time limits are its kind's, read from the app's configuration when it runs.

    Celery's own tasks (celery.group, ...) have no kind and keep Celery's default: none.
    """

    def _limits(self) -> tuple[float, float] | tuple[None, None]:
        table = self.app.conf.get(_CONF_KEY) or TIME_LIMITS
        return table.get(self.name.removeprefix("fabricwatch."), (None, None))

    @property
    def soft_time_limit(self) -> float | None:  # type: ignore[override]
        return self._limits()[0]

    @property
    def time_limit(self) -> float | None:  # type: ignore[override]
        return self._limits()[1]


celery_app = Celery("fabricwatch", task_cls=LimitedTask)


class GnmiStreams(bootsteps.StartStopStep):  # type: ignore[misc]
    """Runs the gNMI Subscribe streams of the targets on this worker's queues (collectors/gnmi_stream.py).

    They run in a child process (`python -m collectors.gnmi_stream`), restarted if it dies, so the
    worker's own process holds no gRPC threads when its pool forks.
    """

    requires = {"celery.worker.components:Pool"}

    def __init__(self, w: Any, **kwargs: Any) -> None:
        self.proc: subprocess.Popen[bytes] | None = None
        self.stopping = threading.Event()
        self.thread: threading.Thread | None = None

    def start(self, w: Any) -> None:
        queues = ",".join(sorted(w.app.amqp.queues.consume_from or w.app.amqp.queues))
        argv = [sys.executable, "-m", "collectors.gnmi_stream", "--queues", queues]

        def keep_running() -> None:
            delay = 1.0
            while not self.stopping.is_set():
                started = time.monotonic()
                self.proc = subprocess.Popen(argv)
                while self.proc.poll() is None and not self.stopping.wait(0.5):
                    pass
                if time.monotonic() - started > 60:
                    delay = 1.0
                self.stopping.wait(delay)  # a crash loop backs off, up to a minute
                delay = min(60.0, delay * 2)

        self.thread = threading.Thread(target=keep_running, daemon=True, name="gnmi-streams")
        self.thread.start()

    def stop(self, w: Any) -> None:
        self.stopping.set()
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(15)
            except subprocess.TimeoutExpired:
                self.proc.kill()
        if self.thread is not None:
            self.thread.join(5)


celery_app.steps["worker"].add(GnmiStreams)


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
        worker_pool=WORKER_POOL,
        **{_CONF_KEY: time_limits(settings)},
        timezone="UTC",
        enable_utc=True,
        imports=("collectors.tasks", "service.telemetry.tasks", "service.notify.tasks", "service.detection.tasks",
                 "service.drains.tasks"),
        beat_schedule={
            "dispatch-collections": {"task": "fabricwatch.dispatch_collections",
                                     "schedule": settings.dispatch_interval_s},
            "maintain-partitions": {"task": "fabricwatch.maintain_partitions", "schedule": 3600.0},
            "compute-rollups": {"task": "fabricwatch.compute_rollups", "schedule": settings.rollup_interval_s},
            "maintain-rollups": {"task": "fabricwatch.maintain_rollups", "schedule": 3600.0},
            "compress-samples": {"task": "fabricwatch.compress_samples", "schedule": settings.compress_interval_s},
            **detection_schedule(settings),
            "deliver-webhooks": {"task": "fabricwatch.deliver_outbox", "schedule": settings.webhook_poll_s},
            "deliver-alertmanager": {"task": "fabricwatch.deliver_alertmanager",
                                     "schedule": settings.alertmanager.poll_s},
            "execute-drains": {"task": "fabricwatch.execute_drains", "schedule": drain_settings().execute_poll_s,
                               "options": {"expires": drain_settings().execute_poll_s}},
        },
    )
    return app


@worker_process_init.connect
def _own_database_connections(**_: Any) -> None:
    """In each prefork child: forget the database connections pooled in the parent before the fork.

    The parent migrated the schema (and, on the embedded broker, created kombu's tables) before forking,
    so the engines' pools hold its sockets; a child checking one out would talk on the parent's socket,
    interleaved with its siblings. dispose(close=False) gives the child empty pools of its own and leaves
    the parent's connections alone (SQLAlchemy's advice for forked processes).
    """
    from kombu.transport import sqlalchemy as kombu_sqla

    from service.db import forget_engines_after_fork

    forget_engines_after_fork()
    for engine, _session in kombu_sqla.Channel._engines.values():  # the embedded broker's, cached per URL
        engine.dispose(close=False)


# `celery -A service.worker` and `fabricwatch worker/beat` both land here; the CLI exports the
# resolved database URL first, so a worker reuses the parent's (possibly embedded) database.
if os.environ.get("FABRICWATCH_DATABASE_URL") or os.environ.get("FABRICWATCH_REDIS_URL"):
    configure(celery_app, get_settings())
