"""Migration 0020 upgrades and downgrades cleanly on its own branch (from 0003)."""

from __future__ import annotations

import uuid

import psycopg
from sqlalchemy import inspect, make_url

from service.db import get_engine, normalize_url
from service.migrate import downgrade, upgrade
from tests.conftest import _admin_url

TABLES = {"alerts", "alert_events", "silences", "maintenance_windows", "webhook_subscriptions", "webhook_outbox",
          "webhook_deliveries"}


def test_upgrade_downgrade_upgrade(server_url: str) -> None:
    name = f"fw_mig_{uuid.uuid4().hex[:10]}"
    admin = _admin_url(server_url)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE DATABASE "{name}"')
    url = make_url(normalize_url(server_url)).set(database=name).render_as_string(hide_password=False)
    try:
        upgrade(url, "0020")
        engine = get_engine(url)
        assert set(inspect(engine).get_table_names()) >= TABLES
        downgrade(url, "0003")
        assert not TABLES & set(inspect(engine).get_table_names())
        assert "api_tokens" in inspect(engine).get_table_names()
        upgrade(url, "0020")
        assert set(inspect(engine).get_table_names()) >= TABLES
        engine.dispose()
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
