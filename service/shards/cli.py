"""`fabricwatch shards ...`: bring the shards in line with the topology, and show them."""

from __future__ import annotations

from collections.abc import Iterable
from typing import TYPE_CHECKING, Annotated

import typer

from service.shards.topology import Topology

if TYPE_CHECKING:
    from service.config import Settings
    from service.telemetry.ingest import IngestReport

app = typer.Typer(help="Telemetry shards (docs/architecture.md#shards).", no_args_is_help=True)


def _topology() -> Topology:
    from service.cli import console, database_url_or_exit, settings_or_exit

    settings = settings_or_exit()
    url = database_url_or_exit(settings)
    if not settings.shards.urls:
        console.print("no shards configured (FABRICWATCH_SHARDS_URLS): the control database is the only shard")
        raise typer.Exit(0)
    return Topology.of(url, settings.shards)


@app.command("apply")
def apply_cmd(
    allow_down: Annotated[bool, typer.Option(help="Skip shards that do not answer instead of failing.")] = False,
) -> None:
    """Migrate every shard, store the pod map, copy each shard its inventory, rebuild the fleet tables."""
    from service.cli import console, database_errors
    from service.shards.setup import PodMoved, apply
    from service.shards.topology import ShardsUnavailable

    topology = _topology()
    with database_errors():
        try:
            done = apply(topology, allow_down=allow_down)
        except ShardsUnavailable as exc:
            for name, why in sorted(exc.errors.items()):
                console.print(f"[red]error:[/red] shard {name!r} unreachable: {why}")
            raise typer.Exit(1) from None
        except PodMoved as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(1) from None
    for name, why in sorted(done.down.items()):
        console.print(f"[yellow]warning:[/yellow] shard {name!r} skipped, unreachable: {why}")
    for shard in sorted(topology.shards):
        pods = sorted(p or "(no pod)" for p, s in done.pod_map.items() if s == shard)
        print(f"{shard}: {', '.join(pods) or '(no pods)'}")


@app.command("status")
def status_cmd() -> None:
    """Each shard: whether it answers, and its pods (from the stored map). Exit 1 if one does not answer."""
    from sqlalchemy import make_url, text

    from service.cli import database_errors
    from service.db import get_engine, normalize_url
    from service.shards.fleet import pod_map
    from service.shards.topology import probe

    topology = _topology()
    with database_errors(), get_engine(topology.control_url).connect() as conn:
        stored = pod_map(conn)
        moves = conn.execute(text("SELECT pod, shard, move_to, leftover FROM shard_pods "
                                  "WHERE move_to IS NOT NULL OR leftover IS NOT NULL ORDER BY pod")).all()
    seen = probe(topology)
    for shard in sorted(topology.shards):
        shown = make_url(normalize_url(topology.url(shard))).render_as_string(hide_password=True)
        pods = sorted(p or "(no pod)" for p, s in stored.items() if s == shard)
        state = "up" if seen[shard] is None else f"DOWN ({seen[shard]})"
        print(f"{shard}\t{state}\t{shown}\t{', '.join(pods) or '(no pods stored: run fabricwatch shards apply)'}")
    for pod, shard, to, leftover in moves:  # unfinished moves (service/shards/rebalance.py)
        shown = pod or "(no pod)"
        if to is not None:
            print(f"{shown}: moving from {shard} to {to}, writes going to both: finish it with `fabricwatch shards "
                  f"move '{shown}' --to {to}` (or --abort)")
        else:
            print(f"{shown}: an old copy on {leftover} still to remove: `fabricwatch shards move '{shown}' --to "
                  f"{shard}`")
    if any(seen.values()):
        raise typer.Exit(1)


@app.command("move")
def move_cmd(
    pod: Annotated[str, typer.Argument(help="The pod to move; '(no pod)' for the devices without one.")],
    to: Annotated[str | None, typer.Option("--to", help="The shard to move it to.")] = None,
    abort: Annotated[bool, typer.Option(help="Stop a move before its switch and remove the target's copy.")] = False,
    batch_series: Annotated[int, typer.Option(min=1, help="Series copied per transaction.")] = 500,
) -> None:
    """Move a pod's telemetry to another shard: copy its history while writes go to both, verify the counts
    per series, switch, remove the old copy. Run it again to finish an interrupted move (docs/operations.md)."""
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from service.cli import console, database_errors
    from service.shards.rebalance import MoveError, abort_move, move_pod
    from service.shards.topology import NO_POD, ShardsUnavailable, UnknownShard

    topology = _topology()
    name = NO_POD if pod == "(no pod)" else pod
    if to is None and not abort:
        console.print("[red]error:[/red] --to SHARD is required (or --abort)")
        raise typer.Exit(2)
    with Progress(TextColumn("{task.description}"), BarColumn(), MofNCompleteColumn(), TimeRemainingColumn(),
                  console=console, transient=True) as bar:
        tasks: dict[str, object] = {}

        def progress(phase: str, done: int, total: int) -> None:
            if phase not in tasks:
                tasks[phase] = bar.add_task(phase, total=total)
            bar.update(tasks[phase], completed=done, total=total)  # type: ignore[arg-type]

        with database_errors():
            try:
                if abort:
                    target = abort_move(topology, name, batch_series=batch_series, progress=progress)
                    print(f"{pod}: move to {target} aborted; its copy there removed")
                    return
                assert to is not None
                report = move_pod(topology, name, to, batch_series=batch_series, progress=progress)
            except (MoveError, UnknownShard) as exc:
                console.print(f"[red]error:[/red] {str(exc).strip(chr(34))}")
                raise typer.Exit(1) from None
            except ShardsUnavailable as exc:
                console.print(f"[red]error:[/red] {exc}; the move did not go on (run it again when the shard "
                              f"is back; nothing of it was lost)")
                raise typer.Exit(1) from None
    for what, n in sorted(report.extra.items()):
        console.print(f"[yellow]warning:[/yellow] {what}: {n} samples on {report.target} that {report.source} "
                      f"lacked (a write that failed on {report.source} after storing on {report.target}): kept")
    if report.source == report.target:
        print(f"{pod}: on {report.target}; the old copy left by its move removed ({report.removed_series} series)")
        return
    print(f"{pod}: moved from {report.source} to {report.target}: {report.series} series, {report.samples} "
          f"samples verified, {report.removed_series} series removed from {report.source}"
          + (" (an interrupted move finished)" if report.resumed else ""))
    print(f"set FABRICWATCH_SHARDS_PODS to put {pod} under {report.target!r} (the old setting is tolerated "
          f"with a warning until then)")


def refresh(url: str, *, when: str) -> None:
    """After the inventory or the schema changed (`when` says which): with shards configured, `apply` with the
    shards that answer, naming each one skipped; unsharded, nothing."""
    from service.cli import console, settings_or_exit
    from service.shards.setup import PodMoved, apply

    settings = settings_or_exit()
    if not settings.shards.urls:
        return
    try:
        done = apply(Topology.of(url, settings.shards), allow_down=True)
    except PodMoved as exc:
        console.print(f"[red]error:[/red] shards not updated ({when}): {exc}")
        raise typer.Exit(1) from None
    for name, why in sorted(done.down.items()):
        console.print(f"[yellow]warning:[/yellow] shard {name!r} not updated ({when}), unreachable: {why}; "
                      f"run `fabricwatch shards apply` when it is back")


def import_to_shards(url: str, settings: Settings, chunks: Iterable[bytes], source: str) -> IngestReport:
    """`fabricwatch import` with shards configured: each sample on its device's shard, each shard's part one
    transaction (service/shards/ingest.py:import_exposition). A shard that cannot be reached: one line, exit 1."""
    import time

    from sqlalchemy.exc import OperationalError

    from service.cli import console
    from service.db import get_engine
    from service.migrate import one_line
    from service.shards.ingest import import_exposition

    try:
        report, _ = import_exposition(control=get_engine(url), topology=Topology.of(url, settings.shards),
                                      chunks=chunks, source=source, default_ts_ms=int(time.time() * 1000),
                                      batch_rows=settings.ingest_batch_rows)
    except OperationalError as exc:
        console.print(f"[red]error:[/red] database: {one_line(exc)}; nothing was written on that shard")
        raise typer.Exit(1) from None
    if not report.received:  # a converter that wrote nothing, say
        console.print(f"[red]error:[/red] {source}: no sample lines; nothing was written")
        raise typer.Exit(1)
    return report
