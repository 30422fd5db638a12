"""The embedded PostgreSQL starts, serves, and leaves no process behind; configured URLs win."""

from __future__ import annotations

import os
import shutil
import signal
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
import sqlalchemy as sa
from kombu import Connection

from service import embedded
from service.embedded import EmbeddedError, EmbeddedPostgres, check_data_dir, resolve_urls
from tests.paths import REPO

pytestmark = pytest.mark.timeout(60)


@pytest.fixture
def data_dir() -> Iterator[Path]:
    # Our own folder under /tmp, not pytest's tmp_path: pgserver (as root) opens every parent folder.
    base = Path(tempfile.mkdtemp(prefix="fw-embedded-", dir="/tmp"))
    yield base / "pg"
    shutil.rmtree(base, ignore_errors=True)


def _ppid(pid: str) -> int | None:
    try:
        stat = Path(f"/proc/{pid}/stat").read_text()
    except OSError:
        return None
    return int(stat.rsplit(")", 1)[1].split()[1])  # field 4; the name in (...) may contain spaces


def _server_pids(data_dir: Path, children: bool = True) -> set[int]:
    """The postmaster started on data_dir (matched by its -D argument) and, unless told not to, its children."""
    postmasters: set[int] = set()
    parents: dict[int, int] = {}
    for entry in Path("/proc").iterdir():
        if not entry.name.isdigit():
            continue
        try:
            argv = (entry / "cmdline").read_bytes().split(b"\0")
        except OSError:
            continue
        if str(data_dir).encode() in argv and Path(argv[0].decode()).name == "postgres":
            postmasters.add(int(entry.name))
        ppid = _ppid(entry.name)
        if ppid is not None:
            parents[int(entry.name)] = ppid
    if not children:
        return postmasters
    return postmasters | {pid for pid, ppid in parents.items() if ppid in postmasters}


def _wait_gone(pids: set[int], timeout_s: float = 10.0) -> set[int]:
    deadline = time.monotonic() + timeout_s
    alive = pids
    while alive and time.monotonic() < deadline:
        alive = {p for p in alive if Path(f"/proc/{p}").exists() and _ppid(str(p)) is not None}
        time.sleep(0.05)
    return alive


def _select(url: str, sql: str) -> object:
    engine = sa.create_engine(url)
    try:
        with engine.connect() as conn:
            return conn.execute(sa.text(sql)).scalar()
    finally:
        engine.dispose()


def test_embedded_default_starts_serves_db_and_broker_and_stops(data_dir: Path) -> None:
    urls = resolve_urls(None, None, data_dir=data_dir)
    assert urls.embedded is not None and urls.embedded.owner
    try:
        running = _server_pids(data_dir)
        assert running, "no postgres process found for the data dir"
        assert _select(urls.database_url, "SELECT current_database()") == "fabricwatch"
        assert "host=" in urls.database_url and "@/" in urls.database_url  # unix socket, no TCP
        # The broker URL works on the same database, with the lowered polling interval accepted.
        assert urls.broker_url.startswith("fwsqla+postgresql+psycopg://")
        with Connection(urls.broker_url, transport_options=urls.broker_transport_options) as conn:
            queue = conn.SimpleQueue("fw-embedded-test")
            queue.put({"ping": 1})
            assert queue.get(timeout=5).payload == {"ping": 1}
            queue.close()
            assert conn.transport.polling_interval == embedded.BROKER_POLLING_INTERVAL_S
    finally:
        urls.embedded.stop()
    assert _wait_gone(running) == set()
    assert _server_pids(data_dir) == set()
    assert not (data_dir / "postmaster.pid").exists()
    urls.embedded.stop()  # idempotent


def _start_holder(data_dir: Path) -> subprocess.Popen[str]:
    code = (
        "import signal, sys, time\n"
        # Python's own Ctrl-C handling, even when the suite runs in the background (SIGINT ignored)
        "signal.signal(signal.SIGINT, signal.default_int_handler)\n"
        "from pathlib import Path\n"
        "from service.embedded import EmbeddedPostgres\n"
        "with EmbeddedPostgres(Path(sys.argv[1])) as pg:\n"
        "    print(pg.url, flush=True)\n"
        "    time.sleep(120)\n"
    )
    proc = subprocess.Popen(
        [sys.executable, "-c", code, str(data_dir)],
        cwd=REPO,
        stdout=subprocess.PIPE,
        stderr=subprocess.DEVNULL,
        text=True,
        env={**os.environ, "PYTHONPATH": str(REPO)},
    )
    assert proc.stdout is not None
    url = proc.stdout.readline().strip()
    assert url.startswith("postgresql+psycopg://"), f"holder did not start (rc={proc.poll()})"
    return proc


@pytest.mark.parametrize("sig", [signal.SIGTERM, signal.SIGINT], ids=["SIGTERM", "SIGINT"])
def test_signal_to_owner_leaves_nothing_running(data_dir: Path, sig: signal.Signals) -> None:
    holder = _start_holder(data_dir)
    try:
        running = _server_pids(data_dir)
        assert running
        if sig == signal.SIGTERM:
            # A second process attaches to the running server; it must not stop the owner's server.
            with EmbeddedPostgres(data_dir) as guest:
                assert not guest.owner
                assert _select(guest.url, "SELECT 1") == 1
                url = guest.url
            # The same postmaster still serves (its backends and autovacuum workers come and go).
            postmaster = _server_pids(data_dir, children=False)
            assert postmaster and postmaster <= running and _select(url, "SELECT 1") == 1
        holder.send_signal(sig)
        rc = holder.wait(timeout=20)
    finally:
        if holder.poll() is None:
            holder.kill()
    assert rc != 0  # interrupted, not a normal return
    assert _wait_gone(running) == set()
    assert _server_pids(data_dir) == set()


def test_server_orphaned_by_sigkill_is_adopted_and_stopped(data_dir: Path) -> None:
    holder = _start_holder(data_dir)
    holder.kill()  # SIGKILL: nothing can run; the server stays up
    holder.wait(timeout=10)
    orphaned = _server_pids(data_dir)
    assert orphaned
    pg = EmbeddedPostgres(data_dir).start()
    try:
        assert pg.owner  # the recorded owner is dead, so this process takes over
        assert _select(pg.url, "SELECT 1") == 1
    finally:
        pg.stop()
    assert _wait_gone(orphaned) == set()


def test_configured_urls_win_and_start_nothing(data_dir: Path, monkeypatch: pytest.MonkeyPatch) -> None:
    def must_not_start(self: EmbeddedPostgres) -> EmbeddedPostgres:
        raise AssertionError("embedded PostgreSQL started although a database URL is configured")

    monkeypatch.setattr(EmbeddedPostgres, "start", must_not_start)
    db = "postgresql+psycopg://fw:secret@127.0.0.1:5432/fabricwatch"

    both = resolve_urls(db, "redis://127.0.0.1:6379/0", data_dir=data_dir)
    assert both.embedded is None
    assert both.database_url == db
    assert both.broker_url == both.result_backend == "redis://127.0.0.1:6379/0"
    assert both.broker_transport_options == {}

    db_only = resolve_urls(db, None, data_dir=data_dir)
    assert db_only.embedded is None
    assert db_only.broker_url == "fwsqla+postgresql+psycopg://fw:secret@127.0.0.1:5432/fabricwatch"
    assert db_only.result_backend == "db+postgresql+psycopg://fw:secret@127.0.0.1:5432/fabricwatch"
    assert db_only.broker_transport_options["polling_interval"] < 1.0

    assert not data_dir.exists()


def test_data_dir_in_home_is_refused() -> None:
    for bad in (Path("/root/fabricwatch/pg"), Path("/home/someone/pg"), Path.home() / "pg"):
        with pytest.raises(EmbeddedError, match="home directory"):
            check_data_dir(bad)
    with pytest.raises(EmbeddedError):
        EmbeddedPostgres(Path("/root/pg"))
    default = check_data_dir(embedded.default_data_dir())
    assert not str(default).startswith(("/root", "/home"))
