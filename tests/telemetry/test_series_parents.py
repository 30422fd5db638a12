"""Series have no foreign keys (migration 0080): ingest locks their devices and ports, triggers delete them."""

from __future__ import annotations

import psycopg
import pytest
from sqlalchemy import Engine, text

from service.telemetry.ingest import Ingestor
from service.telemetry.samples import Sample
from tests.factories import add_hosts

T0 = 1_764_500_000_000


def _sample(device: str, port: str, ts_ms: int = T0) -> Sample:
    return Sample(metric="port_rx_bytes_total", value=1.0, ts_ms=ts_ms, device=device, port=port)


def _series(db: Engine) -> list[tuple[str, str]]:
    with db.connect() as conn:
        return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
            "SELECT d.name, p.name FROM series s JOIN devices d ON d.id = s.device_id "
            "JOIN ports p ON p.id = s.port_id ORDER BY 1, 2"))]


def test_an_ingest_holds_its_ports_until_commit_and_their_removal_takes_the_series(db: Engine, db_url: str) -> None:
    (host,) = add_hosts(db, 1, ports=2)
    admin = db_url.replace("postgresql+psycopg://", "postgresql://")
    with db.begin() as conn:
        ingestor = Ingestor(conn)
        ingestor.add(_sample(host, "eth0"))
        ingestor.flush()  # the series exists in this open transaction, its port is locked
        with psycopg.connect(admin, autocommit=True) as other:
            other.execute("SET lock_timeout = '200ms'")
            with pytest.raises(psycopg.errors.LockNotAvailable):
                other.execute("DELETE FROM ports WHERE name = 'eth0'")
            other.execute("DELETE FROM ports WHERE name = 'eth1'")  # not named by the ingest: not locked
        ingestor.finish()
    assert _series(db) == [(host, "eth0")]
    with db.begin() as conn:
        conn.execute(text("DELETE FROM ports WHERE name = 'eth0'"))
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM series")).scalar_one() == 0
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 1  # aged out by retention


def test_a_port_deleted_during_an_ingest_fails_it_and_nothing_is_written(db: Engine, db_url: str) -> None:
    (host,) = add_hosts(db, 1, ports=2)
    admin = db_url.replace("postgresql+psycopg://", "postgresql://")
    with (pytest.raises(psycopg.errors.ForeignKeyViolation, match="ports named by new series were deleted"),
          db.begin() as conn):
        ingestor = Ingestor(conn)
        ingestor.add(_sample(host, "eth0"))
        ingestor.flush()  # looks up the host's ports, eth1 included
        with psycopg.connect(admin, autocommit=True) as other:
            other.execute("DELETE FROM ports WHERE name = 'eth1'")
        ingestor.add(_sample(host, "eth1"))
        ingestor.finish()
    assert _series(db) == []


def test_removing_a_device_takes_its_port_and_device_series(db: Engine) -> None:
    a, b = add_hosts(db, 2, ports=1)
    with db.begin() as conn:
        ingestor = Ingestor(conn)
        for host in (a, b):
            ingestor.add(_sample(host, "eth0"))
            ingestor.add(Sample(metric="gpu_xid_errors_total", value=0.0, ts_ms=T0, device=host, gpu=0))
        assert ingestor.finish().written == 4
    with db.begin() as conn:
        conn.execute(text("DELETE FROM devices WHERE name = :n"), {"n": a})
    with db.connect() as conn:
        left = conn.execute(text("SELECT DISTINCT d.name FROM series s JOIN devices d ON d.id = s.device_id"))
        assert left.scalars().all() == [b]
        assert conn.execute(text("SELECT count(*) FROM series")).scalar_one() == 2
