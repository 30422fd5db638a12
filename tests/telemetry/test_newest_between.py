"""newest_between: each series' newest sample in a range, the same from hot rows as from compressed chunks."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine, text

from service.telemetry.compress import run_compression
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from service.telemetry.store import newest_between
from tests.factories import add_hosts
from tests.telemetry import drop_day_partitions

T0 = datetime(2026, 11, 2, tzinfo=UTC)


@pytest.fixture(autouse=True)
def _only_our_days(db: Engine) -> None:
    with db.begin() as conn:
        drop_day_partitions(conn)


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _newest(db: Engine, lo: datetime, hi: datetime) -> dict[str, tuple[datetime, float]]:
    with db.connect() as conn:
        sids = dict(conn.execute(text("SELECT s.id, p.name FROM series s JOIN ports p ON p.id = s.port_id "
                                      "WHERE s.metric = 'port_oper_up'")).all())
        got = newest_between(conn, lo, hi, list(sids))
    return {sids[sid]: (datetime.fromtimestamp(us / 1e6, UTC), v) for sid, (us, v) in got.items()}


def test_newest_in_range_from_rows_and_from_chunks(db: Engine) -> None:
    add_hosts(db, 1, ports=3)
    at = T0 + timedelta(hours=10)
    # eth0: up every minute for an hour but down at minute 40; eth1: one reading before the range; eth2: none
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0.0 if i == 40 else 1.0, _ms(at + timedelta(minutes=i)),
                                              "h-000", "eth0") for i in range(60)]
                   + [Sample("port_oper_up", 0.0, _ms(at - timedelta(hours=1)), "h-000", "eth1")])
    hi = at + timedelta(minutes=40)
    expected = {"eth0": (hi, 0.0)}
    assert _newest(db, at, hi) == expected
    assert _newest(db, at, hi + timedelta(seconds=59)) == expected  # the next reading is a minute later
    assert _newest(db, at - timedelta(hours=1), at - timedelta(hours=1)) == {"eth1": (at - timedelta(hours=1), 0.0)}

    run = run_compression(db, now=T0 + timedelta(days=2), hot_s=3600)
    assert run.samples == 61
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_rows")).scalar() == 0
    # a range that ends inside a chunk (its tail is after the range) reads the chunk's samples
    assert _newest(db, at, hi) == expected
    assert _newest(db, at, at + timedelta(hours=2)) == {"eth0": (at + timedelta(minutes=59), 1.0)}

    # a hot reading after the chunk is newer than any of the chunk's
    now = T0 + timedelta(days=2)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0.0, _ms(now), "h-000", "eth0")])
    assert _newest(db, at, now) == {"eth0": (now, 0.0)}
    assert _newest(db, now - timedelta(minutes=15), now) == {"eth0": (now, 0.0)}
