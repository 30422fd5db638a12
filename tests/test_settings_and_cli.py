"""Settings fail at start with one clear line; `fabricwatch import` streams a file or writes nothing."""

from __future__ import annotations

import os
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, text

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
