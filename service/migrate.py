"""Run Alembic migrations from code (`fabricwatch db upgrade`, `serve`, `worker`, tests, the embedded default).

Every upgrade and downgrade holds one PostgreSQL advisory lock for the database, so replicas that start
together migrate one after the other: the first brings the schema to head, the others then find it there
and change nothing.
"""

from __future__ import annotations

import contextlib
import logging
from collections.abc import Iterator
from pathlib import Path

from alembic import command
from alembic.config import Config

import migrations
from service.db import normalize_url

log = logging.getLogger(__name__)

MIGRATION_LOCK = 74_201_000  # pg_advisory_lock key: one schema migration at a time per database


def alembic_config(url: str) -> Config:
    cfg = Config()
    cfg.set_main_option("script_location", str(Path(next(iter(migrations.__path__)))))
    cfg.attributes["url"] = normalize_url(url)
    return cfg


class DatabaseUnavailable(Exception):
    """The database cannot be reached, or is missing and cannot be created; the message is one line."""


def one_line(exc: BaseException) -> str:
    """A driver's connection error as one line: libpq's own words, without its prefixes and line breaks."""
    text = " ".join(str(getattr(exc, "orig", None) or exc).split()).removeprefix("connection failed: ")
    return text.split("FATAL: ", 1)[-1]


def create_database_if_missing(url: str) -> str | None:
    """Create the URL's database, as `createdb` would (owned by the URL's role), if the server answers
    and it does not exist; its name if it was created. DatabaseUnavailable, in one line, when the server
    cannot be reached, the role is refused, or the role may not create databases."""
    import psycopg
    from psycopg import sql
    from sqlalchemy import make_url

    u = make_url(normalize_url(url)).set(drivername="postgresql")
    shown = u.render_as_string(hide_password=True)

    def refusal() -> psycopg.OperationalError | None:
        try:
            psycopg.connect(u.render_as_string(hide_password=False), connect_timeout=10).close()
            return None
        except psycopg.OperationalError as exc:
            return exc

    if (refused := refusal()) is None:
        return None
    for maintenance in ("postgres", "template1") if u.database else ():
        try:
            admin = psycopg.connect(u.set(database=maintenance).render_as_string(hide_password=False),
                                    autocommit=True, connect_timeout=10)
        except psycopg.OperationalError:
            continue  # the same refusal (no such role, no server), or no such maintenance database
        with admin:
            if admin.execute("SELECT 1 FROM pg_database WHERE datname = %s", [u.database]).fetchone():
                # it exists: another replica created it since the first try, or the refusal was not about it
                if (refused := refusal()) is None:
                    return None
                break
            try:
                admin.execute(sql.SQL("CREATE DATABASE {}").format(sql.Identifier(u.database)))
            except (psycopg.errors.DuplicateDatabase, psycopg.errors.UniqueViolation):
                return None  # created meanwhile by another process (a concurrent CREATE DATABASE is the latter)
            except psycopg.Error as exc:
                raise DatabaseUnavailable(
                    f"database {u.database!r} does not exist and role {u.username or admin.info.user!r} cannot "
                    f"create it ({one_line(exc)}); as an administrator: createdb -O {admin.info.user} {u.database}"
                ) from None
            return u.database
    raise DatabaseUnavailable(f"cannot connect to {shown}: {one_line(refused)}")


@contextlib.contextmanager
def migration_lock(url: str) -> Iterator[None]:
    """Hold the database's migration lock for the block, waiting for another process's migration first.

    A session lock on a connection of its own, so migrations keep their own transactions; a process that
    dies holding it loses its connection, and with it the lock.
    """
    from sqlalchemy import text

    from service.db import get_engine

    with get_engine(url).connect() as conn:
        key = {"k": MIGRATION_LOCK}
        if not conn.execute(text("SELECT pg_try_advisory_lock(:k)"), key).scalar_one():
            log.warning("waiting for another process's schema migration to finish")
            conn.execute(text("SELECT pg_advisory_lock(:k)"), key)
        conn.commit()  # no transaction left open while the migration runs; the session lock stays
        try:
            yield
        finally:
            conn.execute(text("SELECT pg_advisory_unlock(:k)"), key)
            conn.commit()


def upgrade(url: str, revision: str = "heads") -> None:
    with migration_lock(url):
        command.upgrade(alembic_config(url), revision)


def downgrade(url: str, revision: str = "base") -> None:
    with migration_lock(url):
        command.downgrade(alembic_config(url), revision)


def current(url: str) -> str | None:
    """The schema revision(s) of the database, comma-separated when branches are not merged yet."""
    from alembic.runtime.migration import MigrationContext

    from service.db import get_engine

    with get_engine(url).connect() as conn:
        heads = MigrationContext.configure(conn).get_current_heads()
    return ",".join(sorted(heads)) or None
