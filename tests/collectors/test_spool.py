"""A collection that cannot be stored (database away) is spooled to disk and stored later, once."""

from __future__ import annotations

from pathlib import Path

import pytest
from sqlalchemy import Engine, create_engine, text
from sqlalchemy.exc import OperationalError

from collectors.base import CollectResult, Neighbor
from collectors.spool import PendingStore, spool_drain, spool_write
from collectors.tasks import store_collection
from service.config import load_settings
from service.telemetry.samples import Sample
from tests.factories import add_hosts


def _pending(db: Engine) -> PendingStore:
    add_hosts(db, 1)
    with db.begin() as conn:
        dev_id = conn.execute(text("SELECT id FROM devices WHERE name = 'h-000'")).scalar_one()
        ep_id = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                                  "VALUES (:d, 'host', '127.0.0.1', '{}') RETURNING id"), {"d": dev_id}).scalar_one()
    samples = [Sample("port_rx_bytes_total", float(i * 100), 1_764_500_000_000 + i * 10_000, "h-000", "eth0",
                      counter_bits=64) for i in range(20)]
    result = CollectResult(target="h-000/host", samples=samples, warnings=["ethtool -m eth3: no module"],
                           neighbors=[Neighbor("eth0", "leaf-1", "Ethernet1")], duration_s=0.2)
    return PendingStore(ep_id, dev_id, "host", ["counters"], 1_764_500_200_000, result)


def test_spooled_collection_is_stored_after_the_outage(db: Engine, tmp_path: Path) -> None:
    pending = _pending(db)
    settings = load_settings(database_url="postgresql://postgres@127.0.0.1:1/none")
    dead = create_engine("postgresql+psycopg://postgres@127.0.0.1:1/none", connect_args={"connect_timeout": 2})
    with pytest.raises(OperationalError):
        store_collection(dead, pending, settings=settings)
    spool_write(tmp_path, pending)
    spool_write(tmp_path, pending)  # the same collection spooled twice (a retried task) stores once
    with pytest.raises(OperationalError):
        spool_drain(tmp_path, lambda p: store_collection(dead, p, settings=settings))
    assert len(list(tmp_path.glob("*.json"))) == 2  # nothing lost while the database is away

    assert spool_drain(tmp_path, lambda p: store_collection(db, p, settings=settings)) == 2
    assert not list(tmp_path.glob("*.json"))
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM samples")).scalar_one() == 20
        status = conn.execute(text("SELECT samples, last_warnings FROM target_status")).one()
        assert "no module" in status.last_warnings
        assert conn.execute(text("SELECT remote_device FROM lldp_neighbors")).scalar_one() == "leaf-1"


def test_a_damaged_spool_file_is_set_aside(db: Engine, tmp_path: Path) -> None:
    (tmp_path / "00000000000000000001-bad.json").write_text("{not json")
    assert spool_drain(tmp_path, lambda p: None) == 0
    assert (tmp_path / "00000000000000000001-bad.bad").exists()
