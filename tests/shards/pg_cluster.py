"""Extra PostgreSQL servers on loopback ports for the shard tests: initdb and pg_ctl of the installed
PostgreSQL 15, each server in its own data directory under /tmp, stopped (and removed) on exit.

As root, initdb and the server run as the `postgres` user (PostgreSQL refuses to run as root): the data
directory is created under /tmp and handed to that user. Authentication is trust on loopback only, as the
suite's main server; every server listens on 127.0.0.1 alone, on a port picked free.
"""

from __future__ import annotations

import os
import pwd
import shutil
import socket
import subprocess
import tempfile
import time
from dataclasses import dataclass, field
from pathlib import Path

import psycopg

PG_BIN = Path(os.environ.get("FABRICWATCH_TEST_PG_BIN", "/usr/lib/postgresql/15/bin"))
RUN_AS = "postgres"


class ClusterError(RuntimeError):
    """A test server could not be started; the message has the command's output."""


def available() -> str | None:
    """Why servers cannot be started here, or None."""
    if not (PG_BIN / "initdb").is_file() or not (PG_BIN / "pg_ctl").is_file():
        return f"no initdb/pg_ctl in {PG_BIN} (set FABRICWATCH_TEST_PG_BIN)"
    if os.geteuid() == 0:
        try:
            pwd.getpwnam(RUN_AS)
        except KeyError:
            return f"running as root and there is no {RUN_AS!r} user to run PostgreSQL as"
    return None


def free_port() -> int:
    """A port nothing listens on now (the server binds it a moment later; a clash fails its start, loudly)."""
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _as_owner(argv: list[str]) -> list[str]:
    return ["runuser", "-u", RUN_AS, "--", *argv] if os.geteuid() == 0 else argv


def _run(argv: list[str], timeout: float = 120) -> None:
    done = subprocess.run(_as_owner(argv), capture_output=True, text=True, timeout=timeout)
    if done.returncode:
        raise ClusterError(f"{' '.join(argv)} exited {done.returncode}: {(done.stdout + done.stderr).strip()[-2000:]}")


@dataclass
class PgServer:
    """One PostgreSQL server: `start()` runs initdb (once) and pg_ctl start; `stop()` a fast shutdown."""

    name: str
    base: Path = field(default_factory=lambda: Path(tempfile.mkdtemp(prefix="fw-shard-pg-", dir="/tmp")))
    port: int = field(default_factory=free_port)

    @property
    def data_dir(self) -> Path:
        return self.base / "data"

    def url(self, database: str = "postgres") -> str:
        return f"postgresql://postgres@127.0.0.1:{self.port}/{database}"

    def _chown(self) -> None:
        if os.geteuid() == 0:
            owner = pwd.getpwnam(RUN_AS)
            os.chown(self.base, owner.pw_uid, owner.pw_gid)

    def start(self) -> PgServer:
        if not (self.data_dir / "PG_VERSION").exists():
            self._chown()
            _run([str(PG_BIN / "initdb"), "-D", str(self.data_dir), "-U", "postgres", "--auth=trust",
                  "-E", "UTF8", "--locale=C", "--no-sync"])
        # The socket in the data dir, not /var/run/postgresql (the suite's main server's); fsync off: test data.
        opts = (f"-c listen_addresses=127.0.0.1 -c port={self.port} -c unix_socket_directories={self.data_dir} "
                f"-c fsync=off -c synchronous_commit=off -c full_page_writes=off -c max_connections=60 "
                f"-c shared_buffers=32MB")
        _run([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-l", str(self.base / "log"), "-o", opts,
              "-w", "-t", "60", "start"])
        self.wait_ready()
        return self

    def wait_ready(self, timeout_s: float = 30) -> None:
        deadline = time.monotonic() + timeout_s
        while True:
            try:
                psycopg.connect(self.url(), connect_timeout=2).close()
                return
            except psycopg.OperationalError:
                if time.monotonic() > deadline:
                    raise
                time.sleep(0.1)

    def running(self) -> bool:
        return (self.data_dir / "postmaster.pid").exists()

    def stop(self) -> None:
        if self.running():
            _run([str(PG_BIN / "pg_ctl"), "-D", str(self.data_dir), "-m", "fast", "-w", "-t", "60", "stop"])

    def remove(self) -> None:
        """Stop the server and delete its folder."""
        try:
            self.stop()
        finally:
            shutil.rmtree(self.base, ignore_errors=True)

    def create_database(self, name: str) -> str:
        with psycopg.connect(self.url(), autocommit=True) as conn:
            conn.execute(f'CREATE DATABASE "{name}"')
        return self.url(name)
