"""`fabricwatch detect --at T` and `fabricwatch backtest --from A --to B --step S`.

The lead mounts `detect_command` and `backtest_command` at the top level; `app` carries the
same two commands for use as a sub-app. Times are ISO-8601 (with a zone) or Unix milliseconds;
steps are like 60s, 5m, 1h.
"""

from __future__ import annotations

import io
import json
import re
import sys
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from datetime import datetime
from pathlib import Path
from typing import TYPE_CHECKING, Annotated, Any, TextIO

import typer

if TYPE_CHECKING:
    from rich.console import RenderableType
    from sqlalchemy import Engine

    from service.alerts.service import AlertChange
    from service.detection.findings import Finding
    from service.pipeline import CycleOutcome

app = typer.Typer(help="Detection: one live cycle, or a replay of stored history.", no_args_is_help=True)

_STEP = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


# Times a fabric's history can hold; outside them a value is a typo (Unix seconds given as milliseconds).
EARLIEST_MS = 946_684_800_000   # 2000-01-01
LATEST_MS = 4_102_444_800_000   # 2100-01-01


def parse_time_ms(v: str) -> int:
    v = v.strip()
    if v.isdigit():
        ms = int(v)
    else:
        try:
            dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
        except ValueError:
            raise typer.BadParameter(f"{v!r} is neither ISO-8601 nor Unix milliseconds") from None
        if dt.tzinfo is None:
            raise typer.BadParameter(f"{v!r} has no time zone; add Z or an offset")
        ms = int(dt.timestamp() * 1000)
    if not EARLIEST_MS <= ms < LATEST_MS:
        hint = "; Unix seconds? give milliseconds (x1000) or ISO-8601" if v.isdigit() and ms < EARLIEST_MS else ""
        raise typer.BadParameter(f"{v!r} is outside 2000-01-01 .. 2100-01-01{hint}")
    return ms


def parse_step_ms(v: str) -> int:
    m = _STEP.match(v.strip())
    if not m:
        raise typer.BadParameter(f"{v!r} is not a step like 60s, 5m, 1h")
    ms = int(float(m.group(1)) * _UNIT_MS[m.group(2)])
    if ms <= 0:
        raise typer.BadParameter("step must be positive")
    return ms


def _engine() -> Engine:
    from service.cli import database_url_or_exit, settings_or_exit
    from service.db import get_engine

    return get_engine(database_url_or_exit(settings_or_exit()))


def _print(findings: list, as_json: bool) -> None:
    if as_json:
        for f in findings:
            sys.stdout.write(json.dumps(f.to_dict(), default=str) + "\n")
        return
    for f in findings:
        sys.stdout.write(f"{f.at_ms}\t{f.state}\t{f.severity}\t{f.fingerprint}\t{f.cause}\t{f.action}\t{f.summary}\n")


def change_row(at_ms: int, c: AlertChange, finding: Finding | None) -> dict[str, Any]:
    """One alert change as a JSON object: the change, and what the alert says (from the finding that made it,
    or for a resolve the last one seen): entity, cause, severity, action, summary and evidence (onset_ms)."""
    from service.detection.service import iso_time

    row: dict[str, Any] = {"type": "change", "at_ms": at_ms, "at": iso_time(at_ms), "event": c.event,
                           "alert_id": c.alert_id, "fingerprint": c.fingerprint, "from_state": c.from_state,
                           "state": c.to_state, "notified": c.notified, "muted_by": c.muted_by}
    d = finding.to_dict() if finding is not None else {}
    for k in ("kind", "device", "port", "lane", "peer_device", "peer_port", "cause", "severity", "action", "score",
              "summary", "evidence", "members"):
        row[k] = d.get(k)
    return row


def _write_changes(outcome: CycleOutcome, last: dict[str, Finding], as_json: bool, out: TextIO, *,
                   shard: str | None = None) -> None:
    """The alert changes of one cycle (what on-call would have seen); `last` is the newest finding per
    fingerprint, updated here, so a resolve still names its cause. With shards, each names its `shard`."""
    last.update((f.fingerprint, f) for f in outcome.findings)
    for c in outcome.changes.changes:
        row = change_row(outcome.at_ms, c, last.get(c.fingerprint))
        if shard is not None:
            row = {"type": row.pop("type"), "shard": shard, **row}
        if as_json:
            out.write(json.dumps(row, default=_json_default) + "\n")
        else:
            where = f"shard {shard}\t" if shard is not None else ""
            out.write(f"{outcome.at_ms}\t{where}alert {c.alert_id}\t{c.event}\t{c.to_state}\t{c.fingerprint}\t"
                      f"{row['cause']}\t{row['severity']}\n")


def _json_default(o: object) -> object:
    from service.detection.service import _json_default as numpy_default

    return numpy_default(o)


@app.command("detect")
def detect_command(
    at: Annotated[str, typer.Option("--at", help="Cycle time (data time): ISO-8601 or Unix ms.")],
    name: Annotated[str, typer.Option(help="Detector state name.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Run one live cycle at data time T: new samples only, then alerts and drain recommendations. With shards,
    every shard's cycle in turn (a shard that fails is named, exit 1, and the others run)."""
    from service.cli import console, database_errors, database_url_or_exit, settings_or_exit
    from service.detection.service import iso_time
    from service.pipeline import run_cycle

    at_ms = parse_time_ms(at)
    settings = settings_or_exit()
    failed: dict[str, str] = {}
    try:
        with database_errors():
            if settings.shards.urls:
                from service.shards.detection import run_all_shards
                from service.shards.topology import Topology

                topology = Topology.of(database_url_or_exit(settings), settings.shards)
                done, failed = run_all_shards(topology, at_ms, name=name)
                outcomes = {f"shard {s}: ": c.outcome for s, c in done.items()}
            else:
                outcomes = {"": run_cycle(_engine(), at_ms, name=name)}
    except ValueError as exc:
        console.print(f"[red]error:[/red] {exc}")
        raise typer.Exit(2) from None
    for label, outcome in outcomes.items():
        _print(outcome.findings, as_json)
        _write_changes(outcome, {}, as_json, sys.stdout)
        changes = outcome.changes
        console.print(f"{label}cycle at {iso_time(at_ms)}: {len(outcome.findings)} findings; alerts: "
                      f"{len(changes.opened)} opened, {len(changes.reopened)} reopened, "
                      f"{len(changes.resolved)} resolved")
        if outcome.drains:
            console.print(f"{label}drain recommendations: {outcome.drains}")
    for shard, why in failed.items():
        console.print(f"[red]error:[/red] shard {shard}: the cycle failed: {why}")
    if failed:
        raise typer.Exit(1)


@app.command("backtest")
def backtest_command(
    from_: Annotated[str, typer.Option("--from", help="First cycle time: ISO-8601 or Unix ms.")],
    to: Annotated[str, typer.Option("--to", help="Last cycle time (inclusive).")],
    step: Annotated[str, typer.Option("--step", help="Cycle step, e.g. 60s, 5m.")] = "60s",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line: each alert change, then a "
                                                         "summary object.")] = False,
    out: Annotated[Path | None, typer.Option("--out", help="Also write the JSON lines (changes and summary) to "
                                                          "this file, written whole when the replay ends.",
                                             dir_okay=False)] = None,
    findings: Annotated[bool, typer.Option(help="Print every cycle's findings too.")] = False,
    shard: Annotated[str | None, typer.Option("--shard", help="With shards: replay this shard only (default: "
                                                               "every shard in turn).")] = None,
) -> None:
    """Replay stored history from a fresh state: the alert changes live detection would have made.

    Nothing is written to the database and nobody is notified (the alert tables are shadowed for the
    replay). Each alert change (opened, reopened, severity_changed, resolved, ...) goes to standard output
    with its data time, entity, cause, severity, action and evidence; with --json one JSON object per line
    and a closing {"type": "summary"} object. A progress bar and the summary table go to standard error.
    With shards, each shard's history is replayed as its live cycles run (its own findings and alerts, its far
    link ends read through the fleet tables): every line and summary names its shard, and a shard that cannot
    be replayed (down) is named, the others replayed, and the command exits 1.
    """
    from rich.progress import BarColumn, MofNCompleteColumn, Progress, TextColumn, TimeRemainingColumn

    from service.cli import console, database_errors, database_url_or_exit, settings_or_exit
    from service.pipeline import replay_alerts

    settings = settings_or_exit()
    a, b = parse_time_ms(from_), parse_time_ms(to)
    if b < a:
        raise typer.BadParameter("--to is before --from")
    step_ms = parse_step_ms(step)
    if out is not None and not out.parent.is_dir():
        raise typer.BadParameter(f"{str(out)!r}: directory {str(out.parent)!r} does not exist", param_hint="--out")
    shards: list[str | None] = [None]
    if settings.shards.urls:
        from service.shards.topology import Topology

        topology = Topology.of(database_url_or_exit(settings), settings.shards)
        if shard is not None and shard not in topology.shards:
            raise typer.BadParameter(f"unknown shard {shard!r} (shards: {', '.join(sorted(topology.shards))})",
                                     param_hint="--shard")
        shards = [shard] if shard is not None else sorted(topology.shards)
    elif shard is not None:
        raise typer.BadParameter("no shards are configured (FABRICWATCH_SHARDS_URLS is empty)", param_hint="--shard")
    n_cycles = (b - a) // step_ms + 1
    done: dict[str | None, tuple[list[CycleOutcome], _Tally]] = {}
    failed: dict[str, str] = {}
    with database_errors(), Progress(TextColumn("replaying"), BarColumn(), MofNCompleteColumn(),
                                     TimeRemainingColumn(), console=console, transient=True) as progress:
        task = progress.add_task("backtest", total=n_cycles * len(shards))
        for name in shards:
            tally = _Tally()

            def on_cycle(outcome: CycleOutcome, tally: _Tally = tally) -> None:
                tally.add(outcome)
                progress.advance(task)

            if name is None:
                done[None] = (replay_alerts(_engine(), a, b, step_ms, on_cycle=on_cycle), tally)
                continue
            replayed = _replay_shard(topology, name, a, b, step_ms, on_cycle, failed)
            if replayed is not None:
                done[name] = (replayed, tally)
    if findings:
        _print([f for outcomes, _ in done.values() for o in outcomes for f in o.findings], as_json)
    lines = io.StringIO()
    for name, (outcomes, tally) in done.items():
        last: dict[str, Finding] = {}
        for o in outcomes:
            _write_changes(o, last, True, lines, shard=name)
        head = {"type": "summary", "shard": name} if name is not None else {}
        lines.write(json.dumps(head | tally.as_dict(a, b, step_ms)) + "\n")
    for name, why in failed.items():
        lines.write(json.dumps({"type": "error", "shard": name, "error": why}) + "\n")
    if as_json:
        sys.stdout.write(lines.getvalue())
    else:
        for name, (outcomes, _) in done.items():
            last = {}
            for o in outcomes:
                _write_changes(o, last, False, sys.stdout, shard=name)
    if out is not None:  # whole or not at all: a temporary file beside it, renamed
        tmp = out.with_name(f".{out.name}.tmp")
        tmp.write_text(lines.getvalue())
        tmp.replace(out)
    for name, (_, tally) in done.items():
        if name is not None:
            console.print(f"shard {name}:")
        console.print(tally.summary(a, b, step))
    for name, why in failed.items():
        console.print(f"[red]error:[/red] shard {name}: not replayed: {why}")
    if failed:
        raise typer.Exit(1)


def _replay_shard(topology: Any, shard: str, a: int, b: int, step_ms: int,
                  on_cycle: Callable[[CycleOutcome], None], failed: dict[str, str]) -> list[CycleOutcome] | None:
    """One shard's replay; a shard that fails (down, say) is noted in `failed` and the others go on. A far shard
    whose link ends could not be read is named too: its links were replayed one-sided."""
    import psycopg
    from sqlalchemy.exc import DBAPIError

    from service.cli import console
    from service.migrate import one_line
    from service.shards.detection import replay_shard

    try:
        got = replay_shard(topology, shard, a, b, step_ms, on_cycle=on_cycle)
    except (DBAPIError, psycopg.Error, ValueError) as exc:
        failed[shard] = one_line(exc)
        return None
    for far, why in got.far_missing.items():
        console.print(f"[yellow]warning:[/yellow] shard {shard}: far link ends on shard {far} not read in some "
                      f"cycles (replayed one-sided): {why}")
    return got.outcomes


@dataclass
class _Tally:
    """What a backtest did, by cause: findings, and the alerts opened, reopened and resolved."""

    cycles: int = 0
    findings: int = 0
    cause_of: dict[str, str] = field(default_factory=dict)  # alert fingerprint -> cause of its findings
    by_cause: dict[str, Counter[str]] = field(default_factory=dict)  # cause -> counts ("findings", events)
    events: Counter[str] = field(default_factory=Counter)

    def add(self, outcome: CycleOutcome) -> None:
        self.cycles += 1
        self.findings += len(outcome.findings)
        for f in outcome.findings:
            self.cause_of[f.fingerprint] = str(f.cause)
            self.by_cause.setdefault(str(f.cause), Counter())["findings"] += 1
        for c in outcome.changes.changes:
            self.events[c.event] += 1
            self.by_cause.setdefault(self.cause_of.get(c.fingerprint, "?"), Counter())[c.event] += 1

    def as_dict(self, from_ms: int, to_ms: int, step_ms: int) -> dict[str, Any]:
        """The closing JSON object of `backtest --json`."""
        from service.detection.service import iso_time

        events = ("opened", "reopened", "severity_changed", "resolved")
        alerts = {e: self.events[e] for e in events} | {e: n for e, n in self.events.items() if e not in events}
        by_cause = {cause: {k: n[k] for k in ("findings", *events)} for cause, n in sorted(self.by_cause.items())}
        return {"type": "summary", "from": iso_time(from_ms), "to": iso_time(to_ms), "step_ms": step_ms,
                "cycles": self.cycles, "findings": self.findings, "alerts": alerts, "by_cause": by_cause}

    def summary(self, from_ms: int, to_ms: int, step: str) -> RenderableType:
        from rich.console import Group
        from rich.table import Table

        e = self.events
        from service.detection.service import iso_time

        head = (f"backtest {iso_time(from_ms)} .. {iso_time(to_ms)} every {step}: {self.cycles} cycles, "
                f"{self.findings} findings; alerts: {e['opened']} opened, {e['reopened']} reopened, "
                f"{e['resolved']} resolved")
        if not self.by_cause:
            return head
        table = Table("cause", "findings", "opened", "reopened", "resolved", box=None)
        for cause, n in sorted(self.by_cause.items(), key=lambda kv: (-kv[1]["opened"], -kv[1]["findings"])):
            table.add_row(cause, *(str(n[k]) for k in ("findings", "opened", "reopened", "resolved")))
        return Group(head, table)

