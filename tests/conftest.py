"""Shared fixtures: a fresh PostgreSQL database per test run, migrated to head.

With FABRICWATCH_TEST_DATABASE_URL set (as in CI) the run creates its own database on that
server and drops it at the end; without it, the embedded PostgreSQL is started in a temp dir.
FABRICWATCH_TEST_REDIS_URL likewise names the broker for Celery tests.
"""

from __future__ import annotations

import os
import shutil
import tempfile
import uuid
from collections.abc import Iterator
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, make_url, text

from service.config import get_settings
from service.db import dispose_engines, get_engine, normalize_url
from service.migrate import upgrade

# Webhook secrets are sealed at rest (service/notify/sealing.py): the suite runs with a fixed key
# (base64 of b"fw-test-key-not-for-production!!"), as a deployment does; workers that tests start inherit it.
os.environ.setdefault("FABRICWATCH_SECRETS_KEY", "ZnctdGVzdC1rZXktbm90LWZvci1wcm9kdWN0aW9uISE=")


@pytest.fixture(autouse=True)
def _settings_read_afresh() -> Iterator[None]:
    """The service reads its settings once per process (get_settings); a test that sets FABRICWATCH_*
    variables gets them read again from its first call on."""
    get_settings.cache_clear()
    yield
    get_settings.cache_clear()


def _admin_url(url: str) -> str:
    u = make_url(normalize_url(url))
    return u.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def server_url() -> Iterator[str]:
    """URL of a PostgreSQL server's maintenance database (real one, or embedded)."""
    configured = os.environ.get("FABRICWATCH_TEST_DATABASE_URL")
    if configured:
        yield configured
        return
    from service.embedded import EmbeddedPostgres

    # A private folder directly under /tmp: pgserver opens up every parent of its data dir.
    data_dir = Path(tempfile.mkdtemp(prefix="fw-test-pg-", dir="/tmp"))
    try:
        with EmbeddedPostgres(data_dir) as pg:
            yield pg.url
    finally:
        shutil.rmtree(data_dir, ignore_errors=True)


@pytest.fixture(scope="session")
def db_url(server_url: str) -> Iterator[str]:
    """A fresh database for this test run, migrated to head; dropped afterwards."""
    name = f"fw_test_{uuid.uuid4().hex[:10]}"
    admin = _admin_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(normalize_url(server_url)).set(database=name).render_as_string(hide_password=False)
    upgrade(url)
    try:
        yield url
    finally:
        dispose_engines()
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture(scope="session")
def engine(db_url: str) -> Engine:
    return get_engine(db_url)


_TABLES_SQL = """
SELECT string_agg(format('%I', c.relname), ', ')
FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace
WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') AND NOT c.relispartition
  AND c.relname <> 'alembic_version'
"""


@pytest.fixture()
def db(engine: Engine) -> Iterator[Engine]:
    """The test database, emptied before the test."""
    with engine.begin() as conn:
        tables = conn.execute(text(_TABLES_SQL)).scalar()
        if tables:
            conn.execute(text(f"TRUNCATE {tables} RESTART IDENTITY CASCADE"))
    yield engine


def worker_redis_url() -> str | None:
    """The configured Redis, on a database of its own per pytest-xdist worker (gw0 keeps the configured
    one), so that parallel workers never take each other's Celery tasks."""
    configured = os.environ.get("FABRICWATCH_TEST_REDIS_URL")
    worker = os.environ.get("PYTEST_XDIST_WORKER", "gw0")
    if not configured or worker == "gw0":
        return configured
    url = make_url(configured)
    base = int(url.database or 0)
    return url.set(database=str((base + int(worker.removeprefix("gw"))) % 16)).render_as_string(hide_password=False)


@pytest.fixture(scope="session")
def broker_url(db_url: str) -> str:
    """The Celery broker: the configured Redis, else the embedded default (SQLAlchemy transport)."""
    from service.embedded import broker_url_for

    return worker_redis_url() or broker_url_for(db_url)
