"""Settings fail at start with one clear line; `fabricwatch import` streams a file or writes nothing."""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import uuid
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, make_url, text

from service.config import SettingsError, get_settings
from service.db import normalize_url
from service.drains.schemas import drain_settings
from service.incidents.schemas import incident_settings
from tests.factories import add_hosts
from tests.paths import REPO


def _cli(*args: str, env: dict[str, str] | None = None) -> subprocess.CompletedProcess[str]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], capture_output=True, text=True,
                          env={**os.environ, **(env or {})}, cwd=REPO, timeout=120)


def test_bad_setting_is_one_clear_line(db_url: str) -> None:
    done = _cli("db", "current", env={"FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_RETENTION_DAYS": "soon"})
    assert done.returncode == 2
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert len(lines) == 1 and "FABRICWATCH_RETENTION_DAYS" in lines[0] and "'soon'" in lines[0]


def test_missing_config_file_is_named(tmp_path: Path) -> None:
    done = _cli("db", "current", env={"FABRICWATCH_CONFIG": str(tmp_path / "nope.yaml")})
    assert done.returncode == 2 and "nope.yaml" in done.stderr


def test_config_file_values_and_env_precedence(tmp_path: Path, db_url: str) -> None:
    cfg = tmp_path / "fw.yaml"
    cfg.write_text(f"database_url: {db_url}\napi_port: 70000\n")
    done = _cli("db", "current", env={"FABRICWATCH_CONFIG": str(cfg)})
    assert done.returncode == 2 and "API_PORT" in done.stderr
    done = _cli("db", "current", env={"FABRICWATCH_CONFIG": str(cfg), "FABRICWATCH_API_PORT": "8081"})
    assert done.returncode == 0, done.stderr


def test_import_file_and_malformed_file(db: Engine, db_url: str, tmp_path: Path) -> None:
    add_hosts(db, 2)
    good = tmp_path / "good.prom"
    good.write_text("".join(f'port_rx_bytes_total{{device="h-001",port="eth2"}} {i * 10} {1_764_500_000_000 + i}\n'
                            for i in range(25_000)))
    done = _cli("import", str(good), env={"FABRICWATCH_DATABASE_URL": db_url})
    assert done.returncode == 0, done.stderr
    assert '"written": 25000' in done.stdout
    bad = tmp_path / "bad.prom"
    bad.write_text(good.read_text().replace('} 20000 ', '} twenty ', 1).replace("1764500000000", "1764600000000"))
    done = _cli("import", str(bad), env={"FABRICWATCH_DATABASE_URL": db_url})
    assert done.returncode == 1 and "bad.prom:2001" in done.stderr and "nothing was written" in done.stderr
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 25_000


def test_drain_and_soak_settings_fail_at_start(db_url: str) -> None:
    done = _cli("db", "current", env={"FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_DRAIN_MAX_PER_POD": "lots"})
    assert done.returncode == 2 and "FABRICWATCH_DRAIN_MAX_PER_POD" in done.stderr and "'lots'" in done.stderr
    done = _cli("db", "current", env={"FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_SOAK_WINDOW_S": "-1"})
    assert done.returncode == 2 and "FABRICWATCH_SOAK_WINDOW_S" in done.stderr


def test_drain_and_soak_settings_come_from_the_config_file_too(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    """One Settings model, one precedence: the file's `drain:` and `soak:` groups, the environment's
    FABRICWATCH_DRAIN_<FIELD> over them field by field (they were read from the environment alone)."""
    cfg = tmp_path / "fw.yaml"
    cfg.write_text("drain: {max_per_pod: 5, breaker_max: 7}\nsoak: {window_s: 600}\n")
    monkeypatch.setenv("FABRICWATCH_CONFIG", str(cfg))
    monkeypatch.setenv("FABRICWATCH_DRAIN_MAX_PER_POD", "3")
    drain, soak = drain_settings(), incident_settings()
    assert (drain.max_per_pod, drain.breaker_max, soak.window_s) == (3, 7, 600)
    cfg.write_text("drain: {max_per_pod: 5, max_per_pdo: 1}\n")  # a typo in a group is named, not ignored
    get_settings.cache_clear()
    with pytest.raises(SettingsError, match="^setting FABRICWATCH_DRAIN_MAX_PER_PDO: Extra inputs"):
        drain_settings()


def test_command_sets_load_only_when_named() -> None:
    """`fabricwatch import` and `host collect` start without the inventory, detection, nccl and simulator
    command sets; naming one (or asking for the top-level help) loads it."""
    probe = ("import sys; from service.cli import app; app(args=sys.argv[1:], standalone_mode=False); "
             "print(sorted(m for m in sys.modules if m.endswith('.cli') and m.startswith(('service.', 'simulator.'))))")
    done = subprocess.run([sys.executable, "-c", probe, "metrics", "doc"], capture_output=True, text=True,
                          cwd=REPO, timeout=120)
    assert done.returncode == 0, done.stderr
    assert done.stdout.splitlines()[-1] == "['service.cli']"
    done = subprocess.run([sys.executable, "-c", probe, "--help"], capture_output=True, text=True, cwd=REPO,
                          timeout=120)
    assert done.returncode == 0, done.stderr
    for name in ("inventory", "detect", "backtest", "nccl", "sim"):
        assert f" {name} " in done.stdout, name
    done = _cli("inventory", "validate", str(REPO / "examples/inventory/small-fabric.yaml"))
    assert done.returncode == 0, done.stderr


def _stdin_cli(args: list[str], data: bytes, url: str) -> subprocess.CompletedProcess[bytes]:
    return subprocess.run([sys.executable, "-m", "service.cli", *args], input=data, capture_output=True, cwd=REPO,
                          env={**os.environ, "FABRICWATCH_DATABASE_URL": url}, timeout=120)


def test_import_reads_standard_input_and_says_when_nothing_is_stored(db: Engine, db_url: str,
                                                                      tmp_path: Path) -> None:
    """`import -` reads a converter's output without a file; an import that stores nothing (names not in
    the catalogue, timestamps in seconds, no lines at all) exits 1 and says the likely cause."""
    add_hosts(db, 1)
    good = "".join(f'port_rx_bytes_total{{device="h-000",port="eth0"}} {i} {1_764_500_000_000 + i * 10_000}\n'
                   for i in range(100)).encode()
    done = _stdin_cli(["import", "-"], good, db_url)
    assert done.returncode == 0, done.stderr
    assert json.loads(done.stdout)["written"] == 100
    again = _stdin_cli(["import", "-"], good, db_url)  # a re-import stores nothing new, and that is fine
    assert again.returncode == 0 and b"all 100 samples were stored before; nothing new" in again.stderr

    vendor = tmp_path / "vendor.prom"
    vendor.write_bytes(good.replace(b"port_rx_bytes_total", b"port_rx_bytes"))
    done = _cli("import", str(vendor), env={"FABRICWATCH_DATABASE_URL": db_url})
    assert done.returncode == 1
    error = " ".join(done.stderr.split())
    assert f"{vendor}: nothing stored: all 100 samples were refused: 100 name metrics not in the catalogue" in error
    assert "port_rx_bytes (closest: port_rx_bytes_total or port_tx_bytes_total)" in error
    assert "nothing was written" in error
    assert json.loads(done.stdout)["unknown_metrics"] == {"port_rx_bytes": 100}

    seconds = good.replace(b"1764500000000\n", b"1764500000\n")  # the first line's timestamp in seconds
    done = _stdin_cli(["import", "-"], seconds, db_url)
    assert done.returncode == 1
    assert ("stdin:1: timestamp 1764500000 looks like seconds (2025-11-30T10:53:20Z), not milliseconds"
            in " ".join(done.stderr.decode().split()))

    done = _stdin_cli(["import", "-"], b"# only a comment\n", db_url)
    assert done.returncode == 1 and b"stdin: no sample lines; nothing was written" in done.stderr
    done = _cli("import", str(tmp_path / "missing.prom"), env={"FABRICWATCH_DATABASE_URL": db_url})
    assert done.returncode == 2 and "missing.prom: No such file or directory" in done.stderr
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 100


def _one_error_line(done: subprocess.CompletedProcess[str]) -> str:
    lines = [line for line in done.stderr.splitlines() if line.strip()]
    assert done.returncode == 1 and len(lines) == 1, done.stderr
    return lines[0]


def test_db_upgrade_creates_a_missing_database_or_says_in_one_line_why_not(server_url: str) -> None:
    server = make_url(normalize_url(server_url))
    admin = server.set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    name, role = f"fw_new_{uuid.uuid4().hex[:8]}", f"fw_nocreate_{uuid.uuid4().hex[:8]}"
    url = server.set(database=name).render_as_string(hide_password=False)
    with psycopg.connect(admin, autocommit=True) as conn:
        conn.execute(f'CREATE ROLE "{role}" LOGIN NOCREATEDB')
    try:
        done = _cli("db", "upgrade", env={"FABRICWATCH_DATABASE_URL": url})
        assert done.returncode == 0, done.stderr
        assert f"created database {name}" in done.stderr and "database at revision" in done.stderr
        again = _cli("db", "upgrade", env={"FABRICWATCH_DATABASE_URL": url})
        assert again.returncode == 0 and "created" not in again.stderr

        nobody = server.set(username=f"{role}_x", database="fabricwatch").render_as_string(hide_password=False)
        line = _one_error_line(_cli("db", "upgrade", env={"FABRICWATCH_DATABASE_URL": nobody}))
        assert f'role "{role}_x" does not exist' in line and line.startswith("error: cannot connect to")

        weak = server.set(username=role, database=f"{name}_2").render_as_string(hide_password=False)
        line = _one_error_line(_cli("db", "upgrade", env={"FABRICWATCH_DATABASE_URL": weak}))
        assert f"database '{name}_2' does not exist and role '{role}' cannot create it" in line
        assert f"createdb -O {role} {name}_2" in line

        with socket.socket() as s:  # a port nobody listens on
            s.bind(("127.0.0.1", 0))
            port = s.getsockname()[1]
        closed = f"postgresql://postgres@127.0.0.1:{port}/fabricwatch"
        for args in (["db", "upgrade"], ["db", "current"]):
            line = _one_error_line(_cli(*args, env={"FABRICWATCH_DATABASE_URL": closed}))
            assert f"port {port} failed: Connection refused" in line, args
    finally:
        with psycopg.connect(admin, autocommit=True) as conn:
            conn.execute(f'DROP DATABASE IF EXISTS "{name}" WITH (FORCE)')
            conn.execute(f'DROP ROLE IF EXISTS "{role}"')
