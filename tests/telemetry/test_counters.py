"""Counter increases and rates across resets, 32/64-bit wraps, saturation and gaps."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from service.telemetry import catalogue
from service.telemetry.catalogue import Kind
from service.telemetry.counters import counter_max, increase, rates
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.factories import add_hosts

MAX32 = counter_max(32)


@pytest.mark.parametrize(("prev", "cur", "kw", "expected"), [
    (100, 250, {}, 150),                                     # plain increase
    (MAX32 - 99, 50, {"bits": 32}, 150),                     # 32-bit wrap
    ((1 << 64) - 10, 5, {"bits": 64}, 15),                   # 64-bit wrap
    (1_000_000, 40, {"bits": 32}, 40),                       # reset: the drop is too large to be a wrap
    (1_000_000, 40, {}, 40),                                 # reset of a counter of unknown width
    (MAX32 - 5, MAX32, {"bits": 32, "saturating": True}, None),  # stuck at max: increase unknown
    (MAX32, MAX32, {"bits": 32, "saturating": True}, None),
    (10, 20, {"bits": 32, "saturating": True}, 10),          # saturating counter below max behaves normally
    (500, 20, {"bits": 32, "saturating": True}, 20),         # a saturating counter cleared by reset
    (float("nan"), 5, {}, None),
])
def test_increase(prev: float, cur: float, kw: dict, expected: float | None) -> None:
    assert increase(prev, cur, **kw) == expected


def test_rates_skip_long_gaps_and_bad_steps() -> None:
    ts = [0, 10_000, 20_000, 320_000, 330_000, 330_000]
    vals = [0, 100, 300, 400, 500, 600]
    assert rates(ts, vals, max_gap_ms=60_000) == [None, 10.0, 20.0, None, 10.0, None]
    assert rates(ts, vals)[3] == pytest.approx(100 / 300)


def test_wrap_reset_and_saturation_through_storage(db: Engine, db_url: str) -> None:
    add_hosts(db, 1)
    t0 = 1_764_500_000_000
    wrap_vals = [MAX32 - 2000, MAX32 - 1000, 500, 1500]       # wraps between 2nd and 3rd reading
    reset_vals = [5_000_000, 6_000_000, 1000, 2000]           # 64-bit counter that resets
    sat_vals = [MAX32 - 3000, MAX32 - 1000, MAX32, MAX32]      # IB PortXmitWait style saturation
    samples = []
    for i in range(4):
        ts = t0 + i * 10_000
        samples.append(Sample("port_rx_bytes_total", wrap_vals[i], ts, "h-000", "eth0", counter_bits=32))
        samples.append(Sample("port_tx_bytes_total", reset_vals[i], ts, "h-000", "eth0", counter_bits=64))
        samples.append(Sample("port_xmit_wait_ticks_total", sat_vals[i], ts, "h-000", "eth0", counter_bits=32,
                              saturating=True))
    assert ingest_samples(engine=db, samples=samples).written == 12
    client = TestClient(create_app(load_settings(auth_required=False, database_url=db_url)))
    window = {"device": "h-000", "port": "eth0", "start": str(t0), "end": str(t0 + 60_000)}  # Unix ms

    def rates_of(metric: str) -> list[float | None]:
        body = client.get("/api/v1/series", params={"metric": metric, **window}).json()
        return [v for _, v in body["series"][0]["points"]]

    assert rates_of("port_rx_bytes_total") == [100.0, pytest.approx(150.1), 100.0]
    assert rates_of("port_tx_bytes_total") == [100_000.0, 100.0, 100.0]
    assert rates_of("port_xmit_wait_ticks_total") == [200.0, None, None]


def test_counter_width_is_stored_for_every_series_of_a_large_first_poll(db: Engine) -> None:
    # A poll bringing more new series than one resolution round takes (1,024) starts that round
    # part way through; each series must still be created with the width its sample gave.
    port_counters = [m.name for m in catalogue.METRICS.values()
                     if m.kind is Kind.COUNTER and m.labels == ("device", "port")]
    add_hosts(db, 1, ports=64)
    samples = [Sample(metric, 1000.0, 1_764_500_000_000, "h-000", f"eth{p}", counter_bits=32)
               for p in range(64) for metric in port_counters]
    assert len(samples) > 1024
    assert ingest_samples(engine=db, samples=samples).written == len(samples)
    with db.connect() as conn:
        widths = conn.execute(text("SELECT counter_bits, count(*) FROM series GROUP BY 1")).all()
    assert widths == [(32, len(samples))]
