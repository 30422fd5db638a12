"""Run Alembic migrations from code (`fabricwatch db upgrade`, tests, the embedded default)."""

from __future__ import annotations

from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from service.db import normalize_url


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    cfg.attributes["url"] = normalize_url(url)
    return cfg


def upgrade(url: str, revision: str = "heads") -> None:
    command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The schema revision(s) of the database, comma-separated when branches are not merged yet."""
    from alembic.runtime.migration import MigrationContext

    from service.db import get_engine

    with get_engine(url).connect() as conn:
        heads = MigrationContext.configure(conn).get_current_heads()
    return ",".join(sorted(heads)) or None
