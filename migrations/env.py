"""Alembic environment: online migrations against the configured PostgreSQL."""

from __future__ import annotations

import re

from alembic import context

from service.config import get_settings
from service.db import get_engine, normalize_url
from service.models import Base

config = context.config
target_metadata = Base.metadata


# Tables that kombu (broker on PostgreSQL) and Celery's result backend create for themselves, and the
# partitions that maintenance creates and drops (samples_p20261201, rollup_5m_p20261201): not ours to
# autogenerate, nor drift for `alembic check`.
_FOREIGN = ("kombu_", "celery_")
_PARTITION = re.compile(r"\w+_p\d{8}")


def include_object(obj: object, name: str | None, type_: str, reflected: bool, compare_to: object) -> bool:
    return not (type_ == "table" and reflected and name is not None
                and (name.startswith(_FOREIGN) or _PARTITION.fullmatch(name) is not None))


def _url() -> str:
    url = config.attributes.get("url") or config.get_main_option("sqlalchemy.url") or get_settings().database_url
    if not url:
        raise SystemExit("no database configured: set FABRICWATCH_DATABASE_URL")
    return normalize_url(url)


def run_migrations_online() -> None:
    connection = config.attributes.get("connection")
    if connection is not None:
        context.configure(connection=connection, target_metadata=target_metadata, include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()
        return
    engine = get_engine(_url()).execution_options()
    with engine.connect() as conn:
        context.configure(connection=conn, target_metadata=target_metadata, include_object=include_object)
        with context.begin_transaction():
            context.run_migrations()


run_migrations_online()
