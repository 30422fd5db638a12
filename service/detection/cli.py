"""`fabricwatch detect --at T` and `fabricwatch backtest --from A --to B --step S`.

The lead mounts `detect_command` and `backtest_command` at the top level; `app` carries the
same two commands for use as a sub-app. Times are ISO-8601 (with a zone) or Unix milliseconds;
steps are like 60s, 5m, 1h.
"""

from __future__ import annotations

import json
import re
import sys
from datetime import datetime
from typing import TYPE_CHECKING, Annotated

import typer

if TYPE_CHECKING:
    from sqlalchemy import Engine

app = typer.Typer(help="Detection: one live cycle, or a replay of stored history.", no_args_is_help=True)

_STEP = re.compile(r"^(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?$")
_UNIT_MS = {"ms": 1, "s": 1000, "m": 60_000, "h": 3_600_000, "d": 86_400_000, None: 1000}


def parse_time_ms(v: str) -> int:
    v = v.strip()
    if v.isdigit():
        return int(v)
    try:
        dt = datetime.fromisoformat(v.replace("Z", "+00:00"))
    except ValueError:
        raise typer.BadParameter(f"{v!r} is neither ISO-8601 nor Unix milliseconds") from None
    if dt.tzinfo is None:
        raise typer.BadParameter(f"{v!r} has no time zone; add Z or an offset")
    return int(dt.timestamp() * 1000)


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


def _print_changes(outcomes: list, as_json: bool) -> None:
    """The alert changes of each cycle: what on-call would have seen."""
    for o in outcomes:
        for c in o.changes.changes:
            row = {"at_ms": o.at_ms, "alert_id": c.alert_id, "event": c.event, "state": c.to_state}
            if as_json:
                sys.stdout.write(json.dumps(row) + "\n")
            else:
                sys.stdout.write(f"{o.at_ms}\talert {c.alert_id}\t{c.event}\t{c.to_state}\n")


@app.command("detect")
def detect_command(
    at: Annotated[str, typer.Option("--at", help="Cycle time (data time): ISO-8601 or Unix ms.")],
    name: Annotated[str, typer.Option(help="Detector state name.")] = "default",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
) -> None:
    """Run one live cycle at data time T: new samples only, then alerts and drain recommendations."""
    from service.pipeline import run_cycle

    try:
        outcome = run_cycle(_engine(), parse_time_ms(at), name=name)
    except ValueError as exc:
        typer.echo(f"error: {exc}", err=True)
        raise typer.Exit(2) from None
    _print(outcome.findings, as_json)
    _print_changes([outcome], as_json)
    if outcome.drains:
        typer.echo(f"drain recommendations: {outcome.drains}", err=True)


@app.command("backtest")
def backtest_command(
    from_: Annotated[str, typer.Option("--from", help="First cycle time: ISO-8601 or Unix ms.")],
    to: Annotated[str, typer.Option("--to", help="Last cycle time (inclusive).")],
    step: Annotated[str, typer.Option("--step", help="Cycle step, e.g. 60s, 5m.")] = "60s",
    as_json: Annotated[bool, typer.Option("--json", help="One JSON object per line.")] = False,
    findings: Annotated[bool, typer.Option(help="Print every cycle's findings too.")] = False,
) -> None:
    """Replay stored history from a fresh state: the alert changes live detection would have made.

    Nothing is written and nobody is notified (the alert tables are shadowed for the replay).
    """
    from service.pipeline import replay_alerts

    a, b = parse_time_ms(from_), parse_time_ms(to)
    if b < a:
        raise typer.BadParameter("--to is before --from")
    outcomes = replay_alerts(_engine(), a, b, parse_step_ms(step))
    if findings:
        _print([f for o in outcomes for f in o.findings], as_json)
    _print_changes(outcomes, as_json)
