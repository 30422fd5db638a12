"""/api/v1/series writes its body without validating it through SeriesRead first (service/telemetry/views.py):
the bytes are those the model would write, for raw samples, counter rates, steps and rollups."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime, timedelta

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.api.app import create_app
from service.config import load_settings
from service.telemetry.rollups import run_rollups
from service.telemetry.samples import Sample
from service.telemetry.schemas import SeriesRead
from service.telemetry.service import ingest_samples
from tests.factories import add_hosts
from tests.telemetry import drop_day_partitions


@pytest.fixture()
def now() -> datetime:
    """The data ends here; taken when the test starts, since the default window is the last hour of real time."""
    return datetime.now(UTC).replace(second=0, microsecond=0)


@pytest.fixture()
def client(db: Engine, db_url: str, now: datetime) -> Iterator[TestClient]:
    with db.begin() as conn:
        drop_day_partitions(conn)
    add_hosts(db, 1, ports=2)
    t0 = int((now - timedelta(days=3)).timestamp() * 1000)
    samples = []
    counter = 0.0
    for i in range(3 * 1440):
        counter = 5.0 if i == 2000 else counter + 1e9 + (i % 7) * 1e8  # a counter reset at 2,000
        t = t0 + 60_000 * i
        samples.append(Sample("port_rx_bytes_total", counter, t, "h-000", "eth0"))
        samples.append(Sample("optic_rx_power_dbm", -2 + (i % 13) * 0.1, t, "h-000", "eth1", lane=0))
    ingest_samples(engine=db, samples=samples)
    run_rollups(db, now=now, max_chunks=10_000)
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


@pytest.mark.parametrize("params", [
    {"metric": "port_rx_bytes_total", "device": "h-000"},
    {"metric": "port_rx_bytes_total", "raw": "true", "start": timedelta(hours=2)},
    {"metric": "port_rx_bytes_total", "step": "600", "start": timedelta(hours=5)},
    {"metric": "port_rx_bytes_total", "start": timedelta(days=3)},
    {"metric": "optic_rx_power_dbm", "lane": "0"},
    {"metric": "optic_rx_power_dbm", "step": "3600", "start": timedelta(days=2, hours=7)},
    {"metric": "optic_rx_power_dbm", "device": "nobody"},
], ids=["rates", "raw", "step", "rollups", "gauge", "gauge rollups", "none"])
def test_body_is_what_the_model_writes(client: TestClient, now: datetime,
                                       params: dict[str, str | timedelta]) -> None:
    params = {k: (now - v).isoformat() if isinstance(v, timedelta) else v for k, v in params.items()}
    r = client.get("/api/v1/series", params=params)
    assert r.status_code == 200, r.text
    assert r.headers["content-type"] == "application/json" and r.headers["x-fabricwatch-missing-pods"] == ""
    assert r.content == SeriesRead.model_validate_json(r.content).model_dump_json().encode()
    series = r.json()["series"]
    if params.get("device") == "nobody":
        assert series == []
        return
    assert len(series) == 1 and len(series[0]["points"]) > 20
    assert all(isinstance(t, int) and (v is None or isinstance(v, float)) for t, v in series[0]["points"])
