"""An API process keeps what it built at startup out of the garbage collector's sight while it serves
(gc.freeze in the app's lifespan, service/api/app.py): a full collection then scans what requests left
behind, not the modules and the app (~170k objects, ~100 CPU ms a collection on the bench machine, several
a phase at 500 req/s: the reads' p99 in docs/benchmarks.md, "Reads at 500 req/s"). When it stops, they are
handed back, so a process that serves an app for a while (a test) collects as before afterwards."""

from __future__ import annotations

import gc

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.api.app import create_app
from service.config import load_settings


def test_startup_objects_are_frozen_while_serving_and_handed_back_after(db: Engine, db_url: str) -> None:
    app = create_app(load_settings(database_url=db_url, auth_required=False))
    with TestClient(app) as client:
        assert client.get("/api/v1/alerts", params={"limit": 5}).status_code == 200
        assert gc.get_freeze_count() > 0
        # gc.get_objects lists what a collection scans: the frozen are not in it.
        scanned = {id(o) for o in gc.get_objects()}
        assert id(app) not in scanned and id(app.router) not in scanned and id(app.state) not in scanned
        # What a request builds is still collected: a cycle made now is found by a collection.
        cycle: list[object] = []
        cycle.append(cycle)
        assert id(cycle) in {id(o) for o in gc.get_objects()}
    assert gc.get_freeze_count() == 0
    assert id(app) in {id(o) for o in gc.get_objects()}
