"""A prefork pool process talks to PostgreSQL on connections of its own.

`fabricwatch worker` migrates the schema (and, on the embedded broker, creates kombu's tables) before
Celery forks its pool, so pooled connections exist in the parent at the fork. A child that checked one
out would share the parent's socket with its siblings. Celery sends `worker_process_init` in every pool
process; service/worker.py answers it by giving the child empty pools, leaving the parent's connections
open. Here a real fork does what a pool process does, and the PostgreSQL backend pids tell whose
connection each side uses.
"""

from __future__ import annotations

import multiprocessing
from typing import Any

from celery.signals import worker_process_init
from kombu import Connection
from sqlalchemy import text

import service.worker  # noqa: F401  (connects the worker_process_init handler)
from service.db import get_engine
from service.embedded import BROKER_SCHEME, broker_url_for, celery_transport_options

SELECT_PID = "SELECT pg_backend_pid()"


def _backend_pids(db_url: str) -> tuple[int, int]:
    """(the app's pool, the embedded broker's pool): the backend pid of the connection each hands out."""
    with get_engine(db_url).connect() as conn:
        app = conn.execute(text(SELECT_PID)).scalar_one()
    with Connection(broker_url_for(db_url), transport_options=celery_transport_options()) as broker:
        session = broker.default_channel.session
        try:
            kombu = session.execute(text(SELECT_PID)).scalar_one()
        finally:
            session.close()
    return app, kombu


def _pool_process(db_url: str, out: Any) -> None:
    worker_process_init.send(sender=None)  # what Celery's prefork pool sends in each new pool process
    out.put(_backend_pids(db_url))


def test_a_pool_process_does_not_use_the_connections_its_parent_pooled(db_url: str) -> None:
    assert broker_url_for(db_url).startswith(BROKER_SCHEME)
    # The pool hands out its connections in turn (FIFO): with several pooled by earlier tests in this
    # process, the last check would see another of the parent's own connections. Start from one.
    get_engine(db_url).dispose()
    parent = _backend_pids(db_url)  # both connections are back in their pools now, as at the fork
    ctx = multiprocessing.get_context("fork")
    out = ctx.Queue()
    child = ctx.Process(target=_pool_process, args=(db_url, out))
    child.start()
    try:
        got = out.get(timeout=60)
    finally:
        child.join(30)
    assert child.exitcode == 0
    assert got[0] != parent[0], "the pool process used its parent's pooled database connection"
    assert got[1] != parent[1], "the pool process used its parent's pooled broker connection"
    assert _backend_pids(db_url) == parent  # and the parent's connections were left open and usable
