"""`fabricwatch inventory ...`: validate, load and export the inventory file."""

from __future__ import annotations

from pathlib import Path

import typer
from rich.console import Console
from rich.table import Table
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError, SQLAlchemyError
from sqlalchemy.orm import sessionmaker

from service.config import SettingsError, get_settings
from service.db import get_engine, session_scope
from service.inventory.loader import InventoryError, dump_inventory_yaml, load_inventory_file
from service.inventory.schemas import Inventory
from service.inventory.service import UpsertReport, export_inventory, upsert_inventory

app = typer.Typer(help="Validate, load and export the fabric inventory (docs/inventory.md).",
                  no_args_is_help=True, add_completion=False)

out = Console(highlight=False, soft_wrap=True)  # one problem, one line: greppable
err = Console(stderr=True, highlight=False, soft_wrap=True)

_SHOW_KEPT = 10  # names listed before "and N more"


def _fail(message: str, code: int = 2) -> typer.Exit:
    # markup=False: names in messages come from user files and may contain [brackets].
    err.print(message, markup=False)
    return typer.Exit(code)


def _read(file: Path) -> Inventory:
    try:
        return load_inventory_file(file)
    except InventoryError as e:
        for problem in e.errors:
            err.print(str(problem), markup=False)
        n = len(e.errors)
        raise _fail(f"{file}: {n} problem{'s' if n != 1 else ''}; nothing was loaded") from None


def _first_line(e: SQLAlchemyError) -> str:
    # the driver's own message, without SQLAlchemy's statement dump (it can be huge)
    text = str(getattr(e, "orig", None) or e).strip()
    return text.splitlines()[0] if text else type(e).__name__


def _engine() -> Engine:
    try:
        url = get_settings().database_url
    except SettingsError as e:
        raise _fail(str(e)) from None
    if not url:
        raise _fail("FABRICWATCH_DATABASE_URL is not set; point it at the PostgreSQL database "
                    "(e.g. postgresql://user@host/fabricwatch)")
    return get_engine(url)


def _summary(file: Path, inv: Inventory) -> str:
    ports = sum(len(d.ports) for d in inv.devices)
    endpoints = sum(len(d.endpoints) for d in inv.devices)
    return (f"{file}: {len(inv.pods)} pods, {len(inv.devices)} devices, {ports} ports, "
            f"{len(inv.links)} links, {endpoints} endpoints")


def _print_report(report: UpsertReport, *, dry_run: bool) -> None:
    if report.total_changes == 0:
        out.print("No changes: the database already matches the file.")
    else:
        table = Table(title="Would change" if dry_run else "Changes", title_justify="left")
        table.add_column("table")
        for col in ("added", "updated", "removed"):
            table.add_column(col, justify="right")
        for name in report.TABLES:
            c = getattr(report, name)
            table.add_row(name, str(c.added), str(c.updated), str(c.removed))
        out.print(table)
    for what, names in (("devices", report.kept_devices), ("pods", report.kept_pods)):
        if names:
            shown = ", ".join(names[:_SHOW_KEPT]) + (f" and {len(names) - _SHOW_KEPT} more"
                                                     if len(names) > _SHOW_KEPT else "")
            out.print(f"Kept {len(names)} {what} that the file does not list (--prune deletes them): {shown}",
                      markup=False)
    out.print(f"{'Dry run, rolled back' if dry_run else 'Committed'} in {report.elapsed_s:.2f}s.")


@app.command()
def validate(file: Path = typer.Argument(..., help="inventory YAML file")) -> None:
    """Check an inventory file without touching the database (exit 2 if it has problems)."""
    inv = _read(file)
    out.print(f"OK {_summary(file, inv)}", markup=False)


@app.command()
def load(
    file: Path = typer.Argument(..., help="inventory YAML file"),
    prune: bool = typer.Option(False, "--prune", help="delete devices and pods that the file does not list"),
    dry_run: bool = typer.Option(False, "--dry-run", help="show what would change, then roll back"),
) -> None:
    """Validate FILE and make the database match it, in one transaction."""
    inv = _read(file)
    engine = _engine()
    try:
        if dry_run:
            with sessionmaker(bind=engine)() as session:
                report = upsert_inventory(session=session, inventory=inv, prune=prune)
                session.rollback()
        else:
            with session_scope(engine) as session:
                report = upsert_inventory(session=session, inventory=inv, prune=prune)
    except InventoryError as e:
        raise _fail(str(e)) from None
    except OperationalError as e:
        raise _fail(f"cannot reach the database: {_first_line(e)}", 1) from None
    except SQLAlchemyError as e:
        raise _fail(f"database error, nothing was loaded: {_first_line(e)}", 1) from None
    out.print(_summary(file, inv), markup=False)
    _print_report(report, dry_run=dry_run)
    if not dry_run:  # sharded: each shard's copy of its pods' devices (docs/architecture.md#shards)
        from service.shards.cli import refresh

        refresh(str(engine.url.render_as_string(hide_password=False)), when="the inventory was loaded")


@app.command()
def export(out_file: Path | None = typer.Option(None, "--out", "-o", help="write here instead of stdout")) -> None:
    """Write the inventory in the database as an inventory YAML file."""
    engine = _engine()
    try:
        with session_scope(engine) as session:
            inv = export_inventory(session=session)
    except SQLAlchemyError as e:
        raise _fail(f"database error: {_first_line(e)}", 1) from None
    text = dump_inventory_yaml(inv)
    if out_file is None:
        typer.echo(text, nl=False)
    else:
        out_file.write_text(text, encoding="utf-8")
        err.print(f"wrote {_summary(out_file, inv)}", markup=False)
