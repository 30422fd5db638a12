"""`fabricwatch demo`: a simulated fabric with faults, watched by the real service, from one command.

It starts, in order: an embedded PostgreSQL in a fresh temporary folder (also the Celery broker),
the live simulated fabric (SNMP agents, gNMI targets, host sysfs trees on 127.0.0.1), the
inventory load, a Celery worker with beat (collectors, detection, webhooks), and the API with the
NOC page. It prints the URL and an admin token. Ctrl-C (or SIGTERM) stops everything it started,
in reverse order, and removes the temporary folder.
"""

from __future__ import annotations

import contextlib
import os
import shutil
import tempfile
from pathlib import Path

from rich.console import Console
from sqlalchemy.orm import Session

from service.config import Settings
from service.worker_process import worker_process

# Shipped inside the simulator package, so an installed (non-editable) fabricwatch finds it too.
DEMO_SCENARIO = Path(__file__).resolve().parents[1] / "simulator" / "data" / "demo.yaml"


def run_demo(*, port: int, speedup: float, scenario: Path, console: Console) -> None:
    import uvicorn

    from service.api.app import create_app
    from service.auth.service import create_token
    from service.db import dispose_engines, get_engine
    from service.embedded import EmbeddedPostgres
    from service.inventory.loader import load_inventory_file
    from service.inventory.service import upsert_inventory
    from service.migrate import upgrade
    from simulator.serve import COMMUNITY_ENV, serve_fabric

    # Directly under /tmp: pgserver opens up every parent folder of its data directory.
    work = Path(tempfile.mkdtemp(prefix="fabricwatch-demo-", dir="/tmp"))
    host_root = Path("/dev/shm") if Path("/dev/shm").is_dir() else work
    try:
        with contextlib.ExitStack() as stack:
            pg = stack.enter_context(EmbeddedPostgres(work / "pg"))
            stack.callback(dispose_engines)
            upgrade(pg.url)
            console.print(f"embedded PostgreSQL in {pg.data_dir}")
            live = stack.enter_context(serve_fabric(scenario, speedup=speedup, base_dir=work / "fabric",
                                                    poll_interval_s=5.0, host_root=host_root / work.name))
            os.environ[COMMUNITY_ENV] = live.community
            engine = get_engine(pg.url)
            with Session(engine) as session:
                upsert_inventory(session=session, inventory=load_inventory_file(live.inventory_path))
                session.commit()
            console.print(f"simulated fabric: {len(live.snmp_ports)} SNMP agents, {len(live.gnmi_ports)} gNMI "
                          f"targets, {len(live.host_dirs)} hosts; data time runs {speedup:g}x; "
                          f"faults: {live.truth_path}")
            with engine.begin() as conn:
                token = create_token(conn, name="demo", scopes=["admin"])
            env = {**os.environ, "FABRICWATCH_DATABASE_URL": pg.url, COMMUNITY_ENV: live.community,
                   "FABRICWATCH_DETECT_INTERVAL_S": "10", "FABRICWATCH_LOG_LEVEL": "WARNING"}
            env.pop("FABRICWATCH_REDIS_URL", None)
            stack.enter_context(worker_process(env, work / "worker.log"))
            console.print(f"collectors, detector and webhooks running (log: {work / 'worker.log'})")
            settings = Settings(database_url=pg.url, api_port=port)
            url = f"http://127.0.0.1:{port}/?token={token}"
            console.print(f"\n[bold]NOC page:[/bold] {url}\n[bold]API token:[/bold] {token}\n"
                          "alerts and drain recommendations appear within about 2 minutes; Ctrl-C stops it all\n")
            uvicorn.run(create_app(settings), host="127.0.0.1", port=port, log_level="warning")
    finally:
        shutil.rmtree(work, ignore_errors=True)
        shutil.rmtree(host_root / work.name, ignore_errors=True)
        console.print("demo stopped; everything it started is gone")
