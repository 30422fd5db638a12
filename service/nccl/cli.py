"""`fabricwatch nccl import FILE`: parse, store and compare one nccl-tests run."""

from __future__ import annotations

import json
from datetime import UTC, datetime
from pathlib import Path
from typing import Annotated

import typer
from rich.console import Console

app = typer.Typer(help="NCCL performance baselines (docs/nccl.md).", no_args_is_help=True, add_completion=False)
err = Console(stderr=True, highlight=False, soft_wrap=True)


@app.callback()
def _group() -> None:
    """NCCL performance baselines (docs/nccl.md)."""  # keeps `import` a sub-command when mounted alone


@app.command("import")
def import_cmd(
    file: Annotated[Path, typer.Argument(exists=True, dir_okay=False, readable=True)],
    job: Annotated[str | None, typer.Option(help="Scheduler job id, kept with the run.")] = None,
    hosts: Annotated[str | None, typer.Option(help="Comma-separated hostlist (overrides the rank list).")] = None,
    test: Annotated[str | None, typer.Option(help="The test (e.g. all_reduce_perf) when the output lacks it.")]
    = None,
    run_at: Annotated[str | None, typer.Option("--at", help="When the run happened (RFC 3339); default now.")]
    = None,
    tolerance: Annotated[float, typer.Option(help="busbw drop that counts as a regression.")] = 0.10,
) -> None:
    """Import one run; exit 1 on unusable output, 3 when it regressed against its baseline."""
    from service.config import load_settings
    from service.db import get_engine
    from service.nccl.parser import NcclParseError, parse_nccl_tests
    from service.nccl.service import NcclImportError, import_run

    url = load_settings().database_url
    if not url:
        err.print("error: FABRICWATCH_DATABASE_URL is not set")
        raise typer.Exit(2)
    try:
        run = parse_nccl_tests(file.read_text(encoding="utf-8", errors="replace"), str(file), test=test)
    except NcclParseError as exc:
        err.print(f"error: {exc}; nothing was written", markup=False)
        raise typer.Exit(1) from None
    when = None
    if run_at:
        when = datetime.fromisoformat(run_at)
        when = when if when.tzinfo else when.replace(tzinfo=UTC)
    host_list = [h.strip() for h in hosts.split(",") if h.strip()] if hosts else None
    try:
        with get_engine(url).begin() as conn:
            res = import_run(conn=conn, run=run, actor="cli", run_at=when, job=job, hosts=host_list,
                             tolerance=tolerance)
    except NcclImportError as exc:
        err.print(f"error: {exc}; nothing was written", markup=False)
        raise typer.Exit(1) from None
    typer.echo(json.dumps({"run_id": res.run_id, "created": res.created, "baseline_set": res.baseline_set,
                           "alert_id": res.alert_id, "linked_alert_ids": res.linked_alert_ids,
                           "regressed": res.comparison.get("regressed"), "reasons": res.comparison.get("reasons"),
                           "warnings": run.warnings}, default=str))
    if res.comparison.get("regressed"):
        raise typer.Exit(3)
