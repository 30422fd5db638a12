"""Migrations: an empty database reaches head, downgrade-then-upgrade works, the models match the
migrations (`alembic check`), and replicas migrating at once do it one after the other."""

from __future__ import annotations

import importlib.util
import os
import subprocess
import sys
import threading
import time
import uuid
from collections.abc import Iterator
from datetime import UTC, datetime, timedelta
from types import SimpleNamespace

import psycopg
import pytest
from alembic import command
from alembic.script import ScriptDirectory
from sqlalchemy import inspect, make_url, text

from service.db import dispose_engines, get_engine, normalize_url
from service.migrate import alembic_config, create_database_if_missing, current, downgrade, upgrade
from service.telemetry.rollups import LEVELS, ensure_partitions
from tests.conftest import _admin_url
from tests.paths import REPO

EXPECTED = {"devices", "ports", "optics", "links", "endpoints", "series", "sample_rows", "sample_blocks", "link_events",
            "target_status", "pods", "api_tokens"}


@pytest.fixture()
def missing_db(server_url: str) -> Iterator[str]:
    """The URL of a database that does not exist yet; dropped afterwards if something created it."""
    name = f"fw_mig_{uuid.uuid4().hex[:8]}"
    try:
        yield make_url(normalize_url(server_url)).set(database=name).render_as_string(hide_password=False)
    finally:
        dispose_engines()
        with psycopg.connect(_admin_url(server_url), autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')


@pytest.fixture()
def empty_db(server_url: str, missing_db: str) -> str:
    with psycopg.connect(_admin_url(server_url), autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{make_url(missing_db).database}"')
    return missing_db


def _tables(url: str) -> set[str]:
    return set(inspect(get_engine(url)).get_table_names())


def test_empty_to_head_down_and_up_again(empty_db: str) -> None:
    assert current(empty_db) is None
    upgrade(empty_db)
    assert _tables(empty_db) >= EXPECTED
    assert "samples" in inspect(get_engine(empty_db)).get_view_names()  # rows and blocks, for readers
    head = current(empty_db)
    downgrade(empty_db, "base")
    assert _tables(empty_db) <= {"alembic_version"}
    upgrade(empty_db)
    assert _tables(empty_db) >= EXPECTED and current(empty_db) == head


def test_models_match_the_migrations(db_url: str) -> None:
    """`alembic check` on the migrated test database: no operation autogenerate would add, so a model
    changed without its migration (or the reverse) fails here, in CI, not in production. The partitions
    that maintenance creates (rollups here; samples likewise) are not drift."""
    now = datetime.now(UTC)
    with get_engine(db_url).begin() as conn:
        for level in LEVELS:
            ensure_partitions(conn, level, now, now + timedelta(days=1))
    command.check(alembic_config(db_url))


def test_replicas_upgrading_at_once_migrate_once(missing_db: str) -> None:
    """Two `fabricwatch db upgrade` (the step `serve` and `worker` also run first) started together on a
    database that does not exist yet: both succeed, one after the other, and the schema is at head once."""
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": missing_db}
    procs = [subprocess.Popen([sys.executable, "-m", "service.cli", "db", "upgrade"], env=env, cwd=REPO,
                              stdout=subprocess.PIPE, stderr=subprocess.STDOUT, text=True) for _ in range(2)]
    outs = [p.communicate(timeout=180)[0] for p in procs]
    assert [p.returncode for p in procs] == [0, 0], outs
    head = ScriptDirectory.from_config(alembic_config(missing_db)).get_current_head()
    assert current(missing_db) == head
    with get_engine(missing_db).connect() as conn:
        assert conn.execute(text("SELECT version_num FROM alembic_version")).scalars().all() == [head]
    assert sum("created database" in o for o in outs) == 1, outs
    # they did overlap: the second found the first migrating and waited (the race this test is about)
    assert sum("waiting for another process's schema migration" in o for o in outs) == 1, outs


def test_a_database_another_replica_creates_meanwhile_is_used(missing_db: str,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    """The race the test above can lose: this process's first connect is refused (no such database), then
    another replica creates it before this one looks in pg_database. It connects and goes on; it does not
    report the stale "does not exist" (the CI failure of 2026-12-06)."""
    name = make_url(missing_db).database
    real_connect = psycopg.connect
    raced: list[str] = []

    def connect_and_lose_the_race(conninfo: str, *args: object, **kwargs: object) -> psycopg.Connection:
        try:
            return real_connect(conninfo, *args, **kwargs)
        except psycopg.OperationalError:
            if not raced and f"/{name}" in conninfo:
                with real_connect(conninfo.replace(f"/{name}", "/postgres"), autocommit=True) as other:
                    other.execute(f'CREATE DATABASE "{name}"')  # the other replica wins
                raced.append(name)
            raise

    monkeypatch.setattr(psycopg, "connect", connect_and_lose_the_race)
    assert create_database_if_missing(missing_db) is None  # it did not create it, and did not fail
    assert raced == [name]
    monkeypatch.undo()
    upgrade(missing_db)
    assert current(missing_db) == ScriptDirectory.from_config(alembic_config(missing_db)).get_current_head()


def _role_sql(role: str) -> str:
    """The role-creating statement migration 0150 runs, for `role` (no table grants: an empty test database)."""
    spec = importlib.util.spec_from_file_location(
        "m0150", REPO / "migrations" / "versions" / "0150_grafana_read_only_role.py")
    assert spec is not None and spec.loader is not None
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    mod.ROLE, mod.TABLES = role, ()
    executed: list[str] = []
    mod.op = SimpleNamespace(execute=executed.append)
    mod.upgrade()
    return executed[0]


def test_two_databases_creating_the_grafana_role_at_once(server_url: str) -> None:
    """Roles belong to the cluster and the migration lock to one database: two databases migrated at once both
    find the role absent. The second CREATE ROLE waits for the first and must then find it made, not fail
    (it failed the detection bench's parallel scratch databases on a fresh server: duplicate key in pg_authid)."""
    role = f"fw_race_{uuid.uuid4().hex[:8]}"
    sql = _role_sql(role)
    url = _admin_url(server_url)
    errors: list[BaseException] = []
    with psycopg.connect(url) as first, psycopg.connect(url, autocommit=True) as second:
        try:
            first.execute(sql)  # role created, not committed yet
            pid = second.info.backend_pid

            def run_second() -> None:
                try:
                    second.execute(sql)
                except BaseException as exc:  # reported by the assertion below
                    errors.append(exc)

            t = threading.Thread(target=run_second)
            t.start()
            with psycopg.connect(url, autocommit=True) as watch:
                for _ in range(200):  # until the second waits on the first's uncommitted role
                    if watch.execute("SELECT wait_event_type FROM pg_stat_activity WHERE pid = %s",
                                     (pid,)).fetchone() == ("Lock",):
                        break
                    time.sleep(0.05)
                else:
                    pytest.fail("the second CREATE ROLE never waited for the first")
            first.commit()
            t.join(30)
            assert not t.is_alive() and errors == []
        finally:
            first.rollback()
            with psycopg.connect(url, autocommit=True) as admin:
                admin.execute(f"DROP OWNED BY {role}")
                admin.execute(f"DROP ROLE IF EXISTS {role}")
