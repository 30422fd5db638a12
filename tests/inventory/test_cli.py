"""`fabricwatch inventory validate|load|export` against the test database."""

from __future__ import annotations

from collections.abc import Iterator
from pathlib import Path

import pytest
from sqlalchemy import Engine
from typer.testing import CliRunner

from service.config import get_settings
from service.inventory.cli import app
from service.inventory.loader import load_inventory_file
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "inventory" / "small-fabric.yaml"
runner = CliRunner()


@pytest.fixture()
def db_env(db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[Engine]:
    monkeypatch.setenv("FABRICWATCH_DATABASE_URL", db_url)
    get_settings.cache_clear()
    yield db
    get_settings.cache_clear()


def test_validate_ok_and_bad(tmp_path: Path) -> None:
    r = runner.invoke(app, ["validate", str(EXAMPLE)])
    assert r.exit_code == 0 and "5 devices, 40 ports, 20 links" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text("devices:\n  - name: x\n    kind: switch\n    role: host\n")
    r = runner.invoke(app, ["validate", str(bad)])
    assert r.exit_code == 2
    assert f"{bad}:2: devices[0]: role 'host' does not fit kind 'switch'" in r.output


def test_load_twice_then_export(db_env: Engine, tmp_path: Path) -> None:
    r = runner.invoke(app, ["load", str(EXAMPLE)])
    assert r.exit_code == 0, r.output
    assert "Changes" in r.output and "Committed" in r.output
    r = runner.invoke(app, ["load", str(EXAMPLE)])
    assert r.exit_code == 0 and "No changes" in r.output
    out = tmp_path / "out.yaml"
    r = runner.invoke(app, ["export", "--out", str(out)])
    assert r.exit_code == 0, r.output
    assert load_inventory_file(out) == load_inventory_file(EXAMPLE)


def test_dry_run_and_bad_file_write_nothing(db_env: Engine, tmp_path: Path) -> None:
    r = runner.invoke(app, ["load", "--dry-run", str(EXAMPLE)])
    assert r.exit_code == 0 and "Would change" in r.output and "rolled back" in r.output
    bad = tmp_path / "bad.yaml"
    bad.write_text(EXAMPLE.read_text().replace("b: spine1:swp4", "b: spine1:swp1"))
    r = runner.invoke(app, ["load", str(bad)])
    assert r.exit_code == 2 and "is already used by links[" in r.output and "nothing was loaded" in r.output
    r = runner.invoke(app, ["export"])
    assert r.exit_code == 0 and r.output == "version: 1\n"  # nothing was written


def test_missing_database_url(monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.delenv("FABRICWATCH_DATABASE_URL", raising=False)
    get_settings.cache_clear()
    try:
        r = runner.invoke(app, ["export"])
    finally:
        get_settings.cache_clear()
    assert r.exit_code == 2 and "FABRICWATCH_DATABASE_URL is not set" in r.output
