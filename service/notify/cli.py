"""`fabricwatch secrets ...`: the key that seals webhook secrets and routing keys (docs/operations.md)."""

from __future__ import annotations

import typer

from service.cli import console, database_url_or_exit, settings_or_exit
from service.notify.sealing import Sealer, SealError, generate_key, reseal_alertmanagers, reseal_subscriptions

app = typer.Typer(help="The key that seals webhook secrets and routing keys at rest.", no_args_is_help=True,
                  add_completion=False)


@app.command("generate-key")
def generate() -> None:
    """Print a new Fernet key (for FABRICWATCH_SECRETS_KEY or its file)."""
    print(generate_key())


@app.command()
def rotate() -> None:
    """Seal every webhook secret, routing key and Alertmanager credential again with the first key (plaintext ones
    for the first time)."""
    from sqlalchemy.exc import OperationalError

    from service.db import get_engine

    settings = settings_or_exit()
    url = database_url_or_exit(settings)
    sealer = Sealer.from_settings(settings)
    if not sealer.configured:
        console.print(f"error: {sealer.error or 'FABRICWATCH_SECRETS_KEY or FABRICWATCH_SECRETS_KEY_FILE is not set'}",
                      markup=False)
        raise typer.Exit(2)
    try:
        with get_engine(url).begin() as conn:  # one transaction: all sealed again, or nothing changed
            done = reseal_subscriptions(conn, sealer)
            ams = reseal_alertmanagers(conn, sealer)
    except SealError as exc:
        console.print(f"error: {exc}; nothing was changed", markup=False)
        raise typer.Exit(1) from None
    except OperationalError as exc:
        console.print(f"error: database: {' '.join(str(exc.orig).split())}; nothing was changed", markup=False)
        raise typer.Exit(1) from None
    console.print(f"sealed the secrets of {done.subscriptions} webhook subscription(s) and the credentials of "
                  f"{ams} Alertmanager destination(s) with the first key of {sealer.source} ({done.plaintext} "
                  f"were plaintext)", markup=False)
