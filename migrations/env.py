"""Alembic environment: online migrations against the configured PostgreSQL."""

from __future__ import annotations

from alembic import context
from sqlalchemy import pool

from service.config import get_settings
from service.db import get_engine, normalize_url
from service.models import Base

config = context.config
target_metadata = Base.metadata


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or get_settings().database_url
    if not url:
        raise SystemExit("no database configured: set FABRICWATCH_DATABASE_URL")
    return normalize_url(url)


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = get_engine(_url()).execution_options()
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata)
        with context.begin_transaction():
            context.run_migrations()
    _ = pool


run_migrations_online()
