"""Daily partitions are created ahead and on demand, and dropped after retention."""

from __future__ import annotations

from datetime import date, timedelta

from sqlalchemy import Engine, text

from service.telemetry.partitions import drop_expired, ensure_ahead, existing_partitions
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.factories import add_hosts


def test_ahead_on_demand_and_retention(db: Engine) -> None:
    today = date(2026, 11, 30)
    with db.begin() as conn:
        for d in list(existing_partitions(conn).values()):
            conn.execute(text(f"DROP TABLE {d}"))
        created = ensure_ahead(conn, today=today, days_ahead=3)
    assert created == [f"samples_p202611{d}" for d in (30,)] + ["samples_p20261201", "samples_p20261202",
                                                                "samples_p20261203"]
    add_hosts(db, 1)
    old_ts = 1_761_955_200_000  # 2025-11-01: far outside, created on demand
    assert ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, old_ts, "h-000", "eth0")]).written == 1
    with db.begin() as conn:
        assert date(2025, 11, 1) in existing_partitions(conn)
        dropped = drop_expired(conn, today=today, retention_days=30)
        assert dropped == ["samples_p20251101"]
        remaining = existing_partitions(conn)
        assert min(remaining) == today and max(remaining) == today + timedelta(days=3)
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 0
