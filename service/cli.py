"""The `fabricwatch` command line (Typer)."""

from __future__ import annotations

import contextlib
import gc
import importlib
import os
import sys
from collections.abc import Iterator
from enum import StrEnum
from pathlib import Path
from typing import Annotated, NoReturn

import click
import typer
from rich.console import Console
from rich.progress import BarColumn, DownloadColumn, Progress, TextColumn, TimeRemainingColumn
from typer.core import TyperGroup
from typer.main import get_command

from service.config import Settings, SettingsError, load_settings


class _LazyGroup(TyperGroup):
    """The top-level group. Command sets that import much of the service load only when named,
    so `fabricwatch import` and `host collect` (run on every GPU host each poll) start without them."""

    # name -> (module whose `app` it is, that app's command, or None for the whole app)
    LAZY: dict[str, tuple[str, str | None]] = {
        "inventory": ("service.inventory.cli", None),
        "detect": ("service.detection.cli", "detect"),
        "backtest": ("service.detection.cli", "backtest"),
        "nccl": ("service.nccl.cli", None),
        "secrets": ("service.notify.cli", None),
        "shards": ("service.shards.cli", None),
        "sim": ("simulator.cli", None),  # optional: not in slim deployments
    }

    def list_commands(self, ctx: click.Context) -> list[str]:
        return [*super().list_commands(ctx), *(n for n in self.LAZY if self._load(n) is not None)]

    def get_command(self, ctx: click.Context, cmd_name: str) -> click.Command | None:
        if cmd_name in self.LAZY:
            return self._load(cmd_name)
        return super().get_command(ctx, cmd_name)

    @classmethod
    def _load(cls, name: str) -> click.Command | None:
        module, command = cls.LAZY[name]
        try:
            group = get_command(importlib.import_module(module).app)
        except ModuleNotFoundError as exc:
            if exc.name and module.startswith(exc.name):  # the optional package itself is absent
                return None
            raise
        if command is not None:
            return group.commands[command]  # type: ignore[attr-defined,no-any-return]
        group.name = name
        return group


app = typer.Typer(help="fabricwatch: fabric telemetry and anomaly detection for GPU clusters.",
                  no_args_is_help=True, pretty_exceptions_enable=False, cls=_LazyGroup)
db_app = typer.Typer(help="Database schema migrations.", no_args_is_help=True)
metrics_app = typer.Typer(help="The canonical metric catalogue.", no_args_is_help=True)
app.add_typer(db_app, name="db")
app.add_typer(metrics_app, name="metrics")
token_app = typer.Typer(help="API tokens.", no_args_is_help=True)
app.add_typer(token_app, name="token")

console = Console(stderr=True, soft_wrap=True)  # one error stays one line


def settings_or_exit(**overrides: object) -> Settings:
    """Settings, or one clear line and exit code 2."""
    try:
        return load_settings(**overrides)
    except SettingsError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None


def database_url_or_exit(settings: Settings) -> str:
    if not settings.database_url:
        console.print("[red]error:[/red] FABRICWATCH_DATABASE_URL is not set (only `serve` and `demo` "
                      "start the embedded database)")
        raise typer.Exit(2)
    return settings.database_url


@contextlib.contextmanager
def database_errors() -> Iterator[None]:
    """A database that cannot be reached (no server, no such role or database) as one line and exit 1,
    not a traceback."""
    import psycopg
    from sqlalchemy.exc import OperationalError

    from service.migrate import DatabaseUnavailable, one_line

    try:
        yield
    except DatabaseUnavailable as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    except (OperationalError, psycopg.OperationalError) as exc:
        console.print(f"[red]error:[/red] database: {one_line(exc)}")
        raise typer.Exit(1) from None


@contextlib.contextmanager
def resolved_settings(settings: Settings) -> Iterator[Settings]:
    """Settings with database/broker URLs filled in, starting the embedded PostgreSQL if none is set."""
    from service.embedded import EmbeddedError, resolve_urls

    try:
        urls = resolve_urls(settings.database_url, settings.redis_url,
                            data_dir=Path(settings.data_dir) if settings.data_dir else None)
    except EmbeddedError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    try:
        if urls.embedded is not None:
            console.print(f"embedded PostgreSQL running in {urls.embedded.data_dir}")
        yield settings.model_copy(update={"database_url": urls.database_url})
    finally:
        if urls.embedded is not None:
            urls.embedded.stop()


@app.command()
def serve(
    host: Annotated[str | None, typer.Option(help="Listen address (default from settings).")] = None,
    port: Annotated[int | None, typer.Option(help="Listen port (default from settings).")] = None,
    worker: Annotated[bool | None, typer.Option(
        help="Also run a Celery worker with beat (default: on with the embedded database).")] = None,
    workers: Annotated[int, typer.Option(
        min=1, help="API processes sharing the port (one per core the API may use; docs/operations.md).")] = 1,
) -> None:
    """Run the API (and, on the embedded default, the database and a worker) until Ctrl-C."""
    import uvicorn

    from service.api.app import create_app
    from service.migrate import upgrade
    from service.worker_process import worker_process

    base = settings_or_exit()
    with resolved_settings(base) as settings, contextlib.ExitStack() as stack:
        upgrade(settings.database_url or "")
        if settings.shards.urls:  # every shard at head and in line with the topology; a down one is named
            from service.shards.cli import refresh

            refresh(settings.database_url or "", when="at start-up")
        if worker if worker is not None else not base.database_url:
            from service.embedded import default_data_dir

            log = Path(settings.data_dir or default_data_dir()).parent / "worker.log"  # beside the database
            stack.enter_context(worker_process({**os.environ, "FABRICWATCH_DATABASE_URL": settings.database_url or ""},
                                               log))
            console.print(f"Celery worker and beat running (log: {log})")
        if not base.database_url:
            _bootstrap_token(settings)
        h, p = host or settings.api_host, port or settings.api_port
        console.print(f"fabricwatch API on http://{h}:{p}  (NOC page at /, OpenAPI at /docs)"
                      + (f", {workers} processes" if workers > 1 else ""))
        if workers == 1:
            uvicorn.run(create_app(settings), host=h, port=p, log_level=settings.log_level.lower())
            return
        # uvicorn's worker processes each build the app from the settings; they read the database URL
        # resolved here (the embedded server's, when that is the one) from the environment.
        os.environ["FABRICWATCH_DATABASE_URL"] = settings.database_url or ""
        uvicorn.run("service.api.app:create_app", factory=True, workers=workers, host=h, port=p,
                    log_level=settings.log_level.lower())


def _bootstrap_token(settings: Settings) -> None:
    """On a fresh embedded database, make the first admin token and show it once."""
    from sqlalchemy import text

    from service.auth.service import create_token
    from service.db import get_engine

    with get_engine(settings.database_url or "").begin() as conn:
        if conn.execute(text("SELECT count(*) FROM api_tokens")).scalar_one():
            return
        token = create_token(conn, name="bootstrap", scopes=["admin"])
    console.print(f"first start: an admin API token was created (shown only now): [bold]{token}[/bold]\n"
                  f"database URL for other fabricwatch commands: {settings.database_url}")


@app.command()
def demo(
    port: Annotated[int, typer.Option(help="API and NOC page port.")] = 8080,
    speedup: Annotated[float, typer.Option(help="How much faster than the clock simulated time runs.")] = 10.0,
    scenario: Annotated[Path | None, typer.Option(help="Scenario file (default: the demo fabric).")] = None,
) -> None:
    """A simulated fabric with faults, watched by the real collectors, detector, API and NOC page."""
    from service.demo import DEMO_SCENARIO, run_demo

    run_demo(port=port, speedup=speedup, scenario=scenario or DEMO_SCENARIO, console=console)


def _celery_for(settings: Settings):  # type: ignore[no-untyped-def]
    """The Celery app configured for these settings; child processes inherit the database URL."""
    os.environ["FABRICWATCH_DATABASE_URL"] = settings.database_url or ""
    from service.config import get_settings
    from service.worker import celery_app, configure

    get_settings.cache_clear()
    celery = configure(celery_app, settings)
    if not settings.redis_url:
        # kombu creates its queue tables on first use; a worker and its beat racing to do it on a fresh
        # database collide on CREATE SEQUENCE, so create them once here, before either starts.
        from kombu import Connection

        with Connection(celery.conf.broker_url, transport_options=celery.conf.broker_transport_options) as conn:
            conn.default_channel.session.close()  # opening the session runs kombu's create_all
    return celery


class WorkerPool(StrEnum):
    """Celery pools `fabricwatch worker` offers; prefork is service.worker.WORKER_POOL."""

    prefork = "prefork"  # a process per slot: time limits enforced
    threads = "threads"  # less memory; Celery ignores time limits here


@app.command()
def worker(
    queues: Annotated[str | None, typer.Option(
        "--queues", "-Q", help="Comma-separated queues to consume (default: fabricwatch, and with shards each "
                               "shard's collect.<shard> and detect.<shard>).")] = None,
    concurrency: Annotated[int | None, typer.Option(
        "--concurrency", "-c", min=1, help="Tasks at once (default: two per CPU, at most 8).")] = None,
    pool: Annotated[WorkerPool, typer.Option(
        help="prefork: a process per task slot, time limits enforced. threads: less memory, but a hung task "
             "is never cut off (no time limits).")] = WorkerPool.prefork,
    beat: Annotated[bool, typer.Option("--beat", "-B", help="Also run the scheduler in this process.")] = False,
) -> None:
    """Run a Celery worker (collections and maintenance) with the tasks' time limits enforced."""
    from service.migrate import upgrade
    from service.worker import default_concurrency, worker_queues

    with resolved_settings(settings_or_exit()) as settings:
        if queues is None:  # everything beat and the dispatcher send: one worker is a whole deployment's
            queues = ",".join(worker_queues(settings))
        upgrade(settings.database_url or "")
        celery = _celery_for(settings)
        if pool is WorkerPool.threads:
            console.print("[yellow]warning:[/yellow] --pool threads: task time limits are not enforced; a hung "
                          "collection or detection cycle holds its slot until the worker restarts")
        argv = ["worker", "-Q", queues, "--pool", pool.value, "-c", str(concurrency or default_concurrency()),
                "--loglevel", settings.log_level, "--without-gossip", "--without-mingle"]
        if beat:
            argv += ["--beat", "--schedule", _beat_schedule_file()]
        celery.worker_main(argv)


@app.command()
def beat() -> None:
    """Run the Celery beat scheduler (one per deployment)."""
    with resolved_settings(settings_or_exit()) as settings:
        celery = _celery_for(settings)
        celery.start(["beat", "--schedule", _beat_schedule_file(), "--loglevel", settings.log_level])


def _beat_schedule_file() -> str:
    import tempfile

    return os.path.join(tempfile.gettempdir(), f"fabricwatch-beat-{os.getuid()}")


@app.command()
def collect(target: Annotated[str, typer.Argument(help="device/protocol, e.g. leaf-01/snmp")]) -> None:
    """Collect one target now, store the samples, and print the outcome."""
    import json

    from sqlalchemy import text

    from collectors.tasks import run_collection
    from service.db import get_engine
    from service.telemetry.targets import GROUPS

    settings = settings_or_exit()
    device, _, protocol = target.partition("/")
    with get_engine(database_url_or_exit(settings)).connect() as conn:
        endpoint_id = conn.execute(text(
            "SELECT e.id FROM endpoints e JOIN devices d ON d.id = e.device_id WHERE d.name = :d AND e.protocol = :p"),
            {"d": device, "p": protocol}).scalar()
    if endpoint_id is None:
        console.print(f"[red]error:[/red] no target {target!r} in the inventory")
        raise typer.Exit(2)
    outcome = run_collection(endpoint_id, list(GROUPS), settings=settings)
    print(json.dumps(outcome, indent=2, default=str))
    if not outcome.get("ok"):
        raise typer.Exit(1)


host_app = typer.Typer(help="The GPU-host agent.", no_args_is_help=True)
app.add_typer(host_app, name="host")


@host_app.command("collect")
def host_collect(
    push: Annotated[str, typer.Option(help="fabricwatch base URL to push the samples to.")],
    device: Annotated[str, typer.Option(help="This host's inventory name.")] = os.uname().nodename,
    interface: Annotated[list[str] | None, typer.Option(help="Interfaces for ethtool; repeatable.")] = None,
    sysfs_root: Annotated[Path, typer.Option(help="Root of /sys (tests use fixture trees).")] = Path("/"),
    dcgm_url: Annotated[str | None, typer.Option(help="dcgm-exporter URL, if one runs here.")] = None,
    nvml: Annotated[bool, typer.Option(help="Read NVLink errors and XIDs through NVML.")] = False,
    rdma_statistic: Annotated[bool, typer.Option(
        help="Also run `rdma statistic show` (RDMA counters where /sys/class/infiniband is not readable).")] = False,
    token_env: Annotated[str, typer.Option(help="Environment variable holding an 'ingest' token.")] =
        "FABRICWATCH_TOKEN",
) -> None:
    """Collect this host once (ethtool, RDMA and net sysfs, DCGM/NVML) and push to the API."""
    import time

    from collectors.base import Target
    from collectors.host import PushError, collect_host, push_samples

    params: dict[str, object] = {"interfaces": interface or [], "sysfs_root": str(sysfs_root), "nvml": nvml,
                                 "rdma_statistic": rdma_statistic}
    if dcgm_url:
        params["dcgm_url"] = dcgm_url
    result = collect_host(Target(name=f"{device}/host", device=device, protocol="host", params=params),
                          now_ms=int(time.time() * 1000))
    for warning in result.warnings:
        console.print(f"[yellow]warning:[/yellow] {warning}")
    if not result.ok:
        console.print(f"[red]error:[/red] {result.error}")
        raise typer.Exit(1)
    try:
        push_samples(result.samples, push, token=os.environ.get(token_env))
    except PushError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(1) from None
    console.print(f"pushed {len(result.samples)} samples from {device} to {push}")


@token_app.command("create")
def token_create(
    name: Annotated[str, typer.Option(help="Who or what holds the token.")],
    scope: Annotated[list[str], typer.Option(help="read, operate, admin or ingest; repeatable.")],
) -> None:
    """Create an API token and print it once (only its hash is stored)."""
    from service.auth.service import create_token
    from service.db import get_engine

    with database_errors(), get_engine(database_url_or_exit(settings_or_exit())).begin() as conn:
        try:
            token = create_token(conn, name=name, scopes=scope)
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
    print(token)


@token_app.command("revoke")
def token_revoke(name: Annotated[str, typer.Option(help="Revoke every token with this name.")]) -> None:
    """Revoke tokens by name."""
    from service.auth.service import revoke_token
    from service.db import get_engine

    with database_errors(), get_engine(database_url_or_exit(settings_or_exit())).begin() as conn:
        console.print(f"revoked {revoke_token(conn, name=name)} token(s)")


@db_app.command("upgrade")
def db_upgrade(revision: str = "heads") -> None:
    """Bring the configured database to the latest schema, creating the database if it does not exist."""
    from service.migrate import create_database_if_missing, current, upgrade

    url = database_url_or_exit(settings_or_exit())
    with database_errors():
        if created := create_database_if_missing(url):
            console.print(f"created database {created}")
        upgrade(url, revision)
        console.print(f"database at revision {current(url)}")


@db_app.command("downgrade")
def db_downgrade(revision: Annotated[str, typer.Argument(help="Target revision, e.g. base or -1.")]) -> None:
    """Step the configured database's schema back."""
    from service.migrate import current, downgrade

    url = database_url_or_exit(settings_or_exit())
    with database_errors():
        downgrade(url, revision)
        console.print(f"database at revision {current(url)}")


@db_app.command("current")
def db_current() -> None:
    """Print the schema revision of the configured database."""
    from service.migrate import current

    url = database_url_or_exit(settings_or_exit())
    with database_errors():
        print(current(url) or "empty")


@app.command("import")
def import_file(
    path: Annotated[str, typer.Argument(metavar="FILE", help="Prometheus text file, or - for standard input.")],
) -> None:
    """Import Prometheus text (timestamps in ms; docs/import.md), streamed, in one transaction."""
    # A one-shot import allocates millions of short-lived objects and no cycles worth collecting;
    # the collector's scans would cost about a tenth of the run.
    gc.disable()
    # It does no linear algebra either: numpy's OpenBLAS would start a thread per core that spins for
    # a while (~0.1 s of a core here) before it sleeps.
    os.environ.setdefault("OPENBLAS_NUM_THREADS", "1")
    import json
    import time

    import psycopg

    from service.telemetry.ingest import Ingestor, NothingStored
    from service.telemetry.promtext import PromParseError

    source = "stdin" if path == "-" else path
    if path == "-":
        raw, size = sys.stdin.buffer, None
    else:
        try:
            raw, size = open(path, "rb"), Path(path).stat().st_size  # noqa: SIM115 - closed below
        except OSError as exc:
            console.print(f"[red]error:[/red] {path}: {exc.strerror}")
            raise typer.Exit(2) from None
    settings = settings_or_exit()
    # plain psycopg: this command does not load SQLAlchemy, a good part of a short import's run
    url = database_url_or_exit(settings).replace("postgresql+psycopg://", "postgresql://", 1)

    def fail(message: str) -> NoReturn:
        console.print(f"[red]error:[/red] {message}; nothing was written")
        raise typer.Exit(1)

    with Progress(TextColumn("importing"), BarColumn(), DownloadColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as progress, raw:
        task = progress.add_task("import", total=size)
        read = 0

        def chunks() -> Iterator[bytes]:
            nonlocal read
            while chunk := raw.read(4 << 20):
                read += len(chunk)
                progress.update(task, completed=read)
                yield chunk

        try:
            if settings.shards.urls:  # each sample on its device's shard (service/shards/ingest.py)
                from service.shards.cli import import_to_shards

                report = import_to_shards(url, settings, chunks(), source)
            else:
                with psycopg.connect(url) as conn:  # commits on leaving, rolls back on an error
                    report = Ingestor(conn, batch_rows=settings.ingest_batch_rows).import_exposition(
                        chunks(), source, int(time.time() * 1000))
                    if not report.received:  # a converter that wrote nothing, say; leaving rolls back
                        fail(f"{source}: no sample lines")
        except NothingStored as exc:
            print(json.dumps(exc.report.to_dict(), indent=2))
            fail(str(exc))
        except PromParseError as exc:
            fail(str(exc))
        except UnicodeDecodeError as exc:
            fail(f"{source}: not UTF-8 ({exc.reason})")
        except psycopg.OperationalError as exc:
            fail(f"database: {' '.join(str(exc).split())}")
    print(json.dumps(report.to_dict(), indent=2))
    if not report.written:
        console.print(f"all {report.duplicates} samples were stored before; nothing new")
    elif report.rejected:
        console.print(f"[yellow]{report.rejected} samples were not stored; see the report above[/yellow]")
    # Committed and reported: leave without the interpreter's teardown, which after a large import
    # spends a noticeable part of the run freeing objects one by one.
    sys.stdout.flush()
    sys.stderr.flush()
    os._exit(0)


@metrics_app.command("doc")
def metrics_doc(out: Annotated[Path | None, typer.Option(help="Write here instead of stdout.")] = None) -> None:
    """Render the metric catalogue as Markdown (docs/metrics.md is made this way)."""
    from service.telemetry.catalogue_doc import render

    text = render()
    if out:
        out.write_text(text)
        console.print(f"wrote {out}")
    else:
        sys.stdout.write(text)


if __name__ == "__main__":
    os.environ.setdefault("PYTHONUNBUFFERED", "1")
    app()
