"""`fabricwatch sim ...`: build a topology, generate a scenario's telemetry offline."""

from __future__ import annotations

import shutil
import sys
import time
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console
from rich.filesize import decimal

from simulator.generate import GenerationDeclined, SizeEstimate, generate
from simulator.scenarios import ScenarioError
from simulator.topology import TopologyParams, build_topology_dict, write_inventory

app = typer.Typer(help="Simulated GPU fabrics: topologies and fault scenarios.", no_args_is_help=True)
console = Console(soft_wrap=True)  # an error stays one line


@app.command()
def topology(
    out: Annotated[Path, typer.Option("--out", "-o", help="inventory YAML to write")] = Path("inventory.yaml"),
    shape: Annotated[str, typer.Option(help="rail-optimized, two-tier or three-tier")] = "rail-optimized",
    hosts: int = 4,
    gpus_per_host: int = 8,
    nics_per_host: int = 8,
    rails: Annotated[int | None, typer.Option()] = None,
    pods: int = 1,
    hosts_per_leaf: int = 32,
    leaves: Annotated[int | None, typer.Option(help="leaves per pod")] = None,
    spines: Annotated[int | None, typer.Option(help="spines (per pod for three-tier)")] = None,
    uplinks_per_leaf: Annotated[int | None, typer.Option()] = None,
    cores: int = 4,
    host_speed: Annotated[int, typer.Option(help="host link Gb/s: 100, 400, 800")] = 400,
    fabric_speed: Annotated[int, typer.Option(help="fabric link Gb/s: 100, 400, 800")] = 800,
    optic: Annotated[list[str] | None, typer.Option(help="TYPE=WEIGHT, repeatable, e.g. 400G-FR4=0.5")] = None,
    port_style: str = "ethernet",
    seed: int = 0,
    validate: Annotated[bool, typer.Option(help="validate with schemas.Inventory (slow for huge fabrics)")]
    = False,
) -> None:
    """Generate a fabric and write its inventory file."""
    mix = {}
    for item in optic or []:
        name, _, w = item.partition("=")
        mix[name] = float(w or 1)
    try:
        params = TopologyParams(shape=shape, hosts=hosts, gpus_per_host=gpus_per_host, nics_per_host=nics_per_host,
                                rails=rails, pods=pods, hosts_per_leaf=hosts_per_leaf, leaves=leaves,
                                spines=spines, uplinks_per_leaf=uplinks_per_leaf, cores=cores,
                                host_speed_gbps=host_speed, fabric_speed_gbps=fabric_speed, optics_mix=mix,
                                port_style=port_style, seed=seed)
    except ValueError as exc:
        console.print(f"[red]bad topology parameters:[/red] {exc}")
        raise typer.Exit(2) from None
    t = time.perf_counter()
    inv = build_topology_dict(params)
    if validate:
        from service.inventory.schemas import Inventory

        Inventory.model_validate(inv)
    write_inventory(inv, out)
    roles: dict[str, int] = {}
    for d in inv["devices"]:
        roles[d["role"]] = roles.get(d["role"], 0) + 1
    console.print(f"[green]wrote[/green] {out}  ({time.perf_counter() - t:.1f} s)")
    console.print("  " + ", ".join(f"{n} {r}" for r, n in roles.items())
                  + f"; {len(inv['links'])} links; {hosts * gpus_per_host} GPUs")


# Above this, `generate` asks before writing (or, not on a terminal, wants --yes).
CONFIRM_ABOVE_BYTES = 1_000_000_000
# What --store costs a sample on disk (bench/sim_generate.py --store: 2.99 B for a week of 64 hosts), for the
# hint beside a large text run
STORE_BYTES_PER_SAMPLE = 3.0


def _interactive() -> bool:
    return sys.stdin.isatty()


@app.command("generate")
def generate_cmd(
    scenario: Annotated[Path, typer.Option("--scenario", "-s", help="scenario YAML file")],
    start: Annotated[str | None, typer.Option("--from", help="ISO time or offset; default from the file")]
    = None,
    end: Annotated[str | None, typer.Option("--to", help="ISO time or offset from --from, e.g. 30d")] = None,
    step: Annotated[str | None, typer.Option(help="sample interval, e.g. 60s")] = None,
    out: Annotated[Path, typer.Option("--out", "-o", help="output directory")] = Path("sim-out"),
    gz: Annotated[bool, typer.Option("--gzip", help="write metrics.prom.gz")] = False,
    group: Annotated[list[str] | None, typer.Option(help="only these metric groups (repeatable)")] = None,
    yes: Annotated[bool, typer.Option("--yes", "-y", help="write without asking, however large")] = False,
    store: Annotated[bool, typer.Option("--store", help="write straight into the database "
                                        "($FABRICWATCH_DATABASE_URL) as compressed chunks, not text")] = False,
) -> None:
    """Generate a scenario's telemetry (Prometheus text), inventory and ground truth.

    It says how much it will write first; above 1 GB it asks (or, not on a terminal, wants --yes).
    With --store the samples go into the database instead (month-scale runs: a few bytes a sample)."""
    if store:
        _generate_into_store(scenario, start, end, step, set(group) if group else None, yes)
        return

    def confirm(e: SizeEstimate) -> bool:
        other = f"; about {decimal(e.gzip_bytes)} with --gzip" if not e.gzipped else ""
        console.print(f"about {decimal(e.bytes)} to write: {e.samples:,} samples over {e.steps:,} steps{other}")
        parent = next(p for p in (e.out_dir, *e.out_dir.parents) if p.exists())
        free = shutil.disk_usage(parent).free
        if e.bytes > free:
            console.print(f"[red]error:[/red] {parent} has {decimal(free)} free; a shorter --to, a longer --step, "
                          "--gzip or fewer --group would write less")
            raise typer.Exit(2)
        if e.bytes < CONFIRM_ABOVE_BYTES or yes:
            return True
        console.print(f"[yellow]large:[/yellow] --store would keep these samples in the database, about "
                      f"{STORE_BYTES_PER_SAMPLE:g} bytes each ({decimal(int(e.samples * STORE_BYTES_PER_SAMPLE))})")
        if not _interactive():
            console.print(f"[red]error:[/red] over {decimal(CONFIRM_ABOVE_BYTES)}: pass --yes to write it (or a "
                          "shorter --to, a longer --step, --gzip, fewer --group or --store)")
            raise typer.Exit(2)
        return typer.confirm("write it?", default=False)

    try:
        r = generate(scenario, start, end, step, out, compress_gz=gz, groups=set(group) if group else None,
                     confirm=confirm)
    except GenerationDeclined:
        console.print("nothing written")
        raise typer.Exit(1) from None
    except ScenarioError as exc:
        console.print(f"[red]scenario error:[/red] {exc}")
        raise typer.Exit(2) from None
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    except OSError as exc:  # the scenario or its inventory file
        console.print(f"[red]error:[/red] {exc.filename}: {exc.strerror}")
        raise typer.Exit(2) from None
    rate = r.samples / r.seconds if r.seconds else 0
    console.print(f"[green]wrote[/green] {r.metrics_file}: {r.samples:,} samples, {r.steps} steps, "
                  f"{r.series:,} series on {r.ports:,} ports ({r.seconds:.1f} s, {rate:,.0f} samples/s)")
    console.print(f"[green]wrote[/green] {r.inventory_file}")
    console.print(f"[green]wrote[/green] {r.ground_truth_file}: {r.faults} fault(s)")


def _duration(seconds: float) -> str:
    return f"{seconds:.0f} s" if seconds < 120 else f"{seconds / 60:.0f} min"


def _generate_into_store(scenario: Path, start: str | None, end: str | None, step: str | None,
                         groups: set[str] | None, yes: bool) -> None:
    """`sim generate --store`: estimate, ask above the threshold, then write with a progress bar."""
    import psycopg
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn
    from sqlalchemy.exc import OperationalError

    from service.config import SettingsError, load_settings
    from service.db import get_engine
    from simulator.store_writer import StoreDeclined, StoreError, StoreEstimate, generate_into_store

    try:
        settings = load_settings()
    except SettingsError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    url = settings.database_url
    if not url:
        console.print("[red]error:[/red] --store needs FABRICWATCH_DATABASE_URL (the database to write into)")
        raise typer.Exit(2)
    if settings.shards.urls:  # the writer fills one database: here the control one, which no reader asks for samples
        console.print("[red]error:[/red] --store writes into one database, and telemetry shards are configured "
                      "(FABRICWATCH_SHARDS_URLS): its samples would be on none of them; write the text output and "
                      "`fabricwatch import` it (stored on each device's shard), nothing was written")
        raise typer.Exit(2)
    progress = Progress(TextColumn("storing"), BarColumn(), MofNCompleteColumn(), TextColumn("steps"),
                        TextColumn("{task.fields[samples]:,} samples"), TimeRemainingColumn(), console=console)
    task = progress.add_task("store", total=None, samples=0)

    def confirm(e: StoreEstimate) -> bool:
        console.print(f"about {decimal(e.disk_bytes)} on disk ({e.bytes_per_sample:.1f} B/sample): {e.samples:,} "
                      f"samples of {e.series:,} series over {e.steps:,} steps, about {_duration(e.seconds)} "
                      f"(as text: {decimal(e.text_bytes)}); from {e.hot_from:%Y-%m-%d %H:%M} UTC on as rows")
        if e.disk_bytes >= CONFIRM_ABOVE_BYTES and not yes:
            if not _interactive():
                console.print(f"[red]error:[/red] over {decimal(CONFIRM_ABOVE_BYTES)}: pass --yes to store it (or a "
                              "shorter --to, a longer --step or fewer --group)")
                raise typer.Exit(2)
            if not typer.confirm("store it?", default=False):
                return False
        progress.update(task, total=e.steps)
        progress.start()  # after the question: a live bar would draw over it
        return True

    def advance(steps: int, samples: int) -> None:
        progress.update(task, completed=steps, samples=samples)

    try:
        r = generate_into_store(get_engine(url), scenario, start, end, step, groups=groups, confirm=confirm,
                                progress=advance)
    except StoreDeclined:
        console.print("nothing written")
        raise typer.Exit(1) from None
    except ScenarioError as exc:
        console.print(f"[red]scenario error:[/red] {exc}")
        raise typer.Exit(2) from None
    except (StoreError, ValueError) as exc:
        console.print(f"[red]error:[/red] {exc}; nothing was written")
        raise typer.Exit(2) from None
    except OSError as exc:  # the scenario or its inventory file
        console.print(f"[red]error:[/red] {exc.filename}: {exc.strerror}; nothing was written")
        raise typer.Exit(2) from None
    except (OperationalError, psycopg.OperationalError) as exc:
        first = str(getattr(exc, "orig", None) or exc).strip().splitlines()
        console.print(f"[red]error:[/red] database: {first[0] if first else type(exc).__name__}; nothing was written")
        raise typer.Exit(1) from None
    finally:
        progress.stop()
    rate = r.samples / r.seconds if r.seconds else 0
    console.print(f"[green]stored[/green] {r.samples:,} samples of {r.series:,} series on {r.ports:,} ports: "
                  f"{r.chunk_samples:,} in {r.chunks:,} chunks, {r.row_samples:,} as rows (hot window); "
                  f"{decimal(r.disk_bytes)} on disk, {r.disk_bytes / max(r.samples, 1):.2f} B/sample "
                  f"({r.seconds:.1f} s, {rate:,.0f} samples/s)")
    if r.duplicates:
        console.print(f"{r.duplicates:,} samples were stored before and kept their readings")


@app.command("serve")
def serve_cmd(
    scenario: Annotated[Path | None, typer.Option("--scenario", "-s", help="scenario YAML; default: a small "
                                                  "fault-free fabric")] = None,
    speedup: Annotated[float, typer.Option(help="data seconds per wall second")] = 1.0,
    out: Annotated[Path, typer.Option("--dir", "-d", help="where inventory, ground truth and host trees go")]
    = Path("sim-live"),
    tick: Annotated[float, typer.Option(help="wall seconds between steps")] = 1.0,
    poll_interval: Annotated[float | None, typer.Option(help="poll interval written into the inventory (s)")]
    = None,
    snmp: Annotated[bool, typer.Option(help="serve SNMP agents")] = True,
    gnmi: Annotated[bool, typer.Option(help="serve gNMI targets")] = True,
    host: Annotated[bool, typer.Option(help="write host sysfs/ethtool trees")] = True,
    host_root: Annotated[Path | None, typer.Option(help="where host trees go (default DIR/hosts; a tmpfs "
                                                   "such as /dev/shm/... is much cheaper per step)")] = None,
) -> None:
    """Serve a live fabric on 127.0.0.1 (SNMP, gNMI, host trees) until Ctrl-C or SIGTERM."""
    import signal
    import threading

    from simulator.serve import COMMUNITY_ENV, serve_fabric

    stop = threading.Event()
    previous = {s: signal.signal(s, lambda *_: stop.set()) for s in (signal.SIGINT, signal.SIGTERM)}
    try:
        try:
            live = serve_fabric(scenario, speedup=speedup, base_dir=out, tick_s=tick, poll_interval_s=poll_interval,
                                snmp=snmp, gnmi=gnmi, host=host, host_root=host_root)
        except ScenarioError as exc:
            console.print(f"[red]scenario error:[/red] {exc}")
            raise typer.Exit(2) from None
        except ValueError as exc:
            console.print(f"[red]error:[/red] {exc}")
            raise typer.Exit(2) from None
        with live:
            console.print(f"[green]serving[/green] {len(live.switches)} switches, {len(live.hosts)} hosts "
                          f"(speedup {speedup:g}, a step every {tick:g} s)")
            for d in live.switches:
                parts = [f"snmp udp/{live.snmp_ports[d]}" if d in live.snmp_ports else "",
                         f"gnmi tcp/{live.gnmi_ports[d]}" if d in live.gnmi_ports else ""]
                console.print(f"  {d}: " + ", ".join(p for p in parts if p))
            for h, root in live.host_dirs.items():
                console.print(f"  {h}: sysfs_root {root}  (ethtool shim: {root / 'bin' / 'ethtool'})")
            console.print(f"[green]inventory[/green] {live.inventory_path}")
            console.print(f"[green]ground truth[/green] {live.truth_path}")
            console.print(f"  export {COMMUNITY_ENV}={live.community}")
            console.print(f"  fabricwatch inventory load {live.inventory_path}")
            console.print("Ctrl-C stops.")
            while not stop.wait(0.5):
                pass
            cost = sorted(live.step_costs)
            console.print(f"stopping after {len(cost)} steps (median step {1000 * cost[len(cost) // 2]:.1f} ms)")
    finally:
        for s, h in previous.items():
            signal.signal(s, h)
