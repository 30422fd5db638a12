"""Three PostgreSQL servers of our own for the shard tests: a control database and two telemetry shards.

Started once per module that asks for them (initdb takes a few seconds each), stopped and removed at its
end. Each server runs as the `postgres` user with its data under /tmp.
"""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import dataclass

import pytest
from sqlalchemy import Engine

from service.db import get_engine
from service.inventory.models import Device, Pod, Port
from service.migrate import upgrade
from service.shards import fleet
from service.shards.topology import ShardSettings, Topology
from tests.shards.pg_cluster import PgServer, available

# leaf1 in pod p1 (shard a), leaf2 in p2 and host3 in p3 (shard b), spine1 without a pod (default: shard a)
INVENTORY = [("leaf1", "switch", "leaf", "p1"), ("leaf2", "switch", "leaf", "p2"),
             ("host3", "host", "host", "p3"), ("spine1", "switch", "spine", None)]
LAYOUT = {"a": ["p1"], "b": ["p2", "p3"]}


@dataclass
class Cluster:
    control: PgServer
    shard_a: PgServer
    shard_b: PgServer
    control_url: str

    def settings(self, **over: object) -> ShardSettings:
        return ShardSettings(urls={"a": self.shard_a.url("fw_shard"), "b": self.shard_b.url("fw_shard")},
                             pods=LAYOUT, **over)  # type: ignore[arg-type]

    def topology(self) -> Topology:
        return Topology.of(self.control_url, self.settings())

    @property
    def engine(self) -> Engine:
        return get_engine(self.control_url)


def load_inventory(engine: Engine) -> None:
    from service.db import session_scope

    with session_scope(engine) as s:
        s.add_all([Pod(name=p) for p in ("p1", "p2", "p3")])
        for name, kind, role, pod in INVENTORY:
            s.add(Device(name=name, kind=kind, role=role, pod=pod, gpus=0,
                         ports=[Port(name="eth0"), Port(name="eth1")]))


@pytest.fixture(scope="module")
def cluster() -> Iterator[Cluster]:
    why = available()
    if why:
        pytest.skip(why)
    servers = [PgServer(n) for n in ("control", "a", "b")]
    try:
        for s in servers:
            s.start()
        control_url = servers[0].create_database("fw_control")
        upgrade(control_url)
        load_inventory(get_engine(control_url))
        yield Cluster(*servers, control_url=control_url)
    finally:
        for s in servers:  # our engines only: the suite's own stay pooled
            for db in ("postgres", "fw_control", "fw_shard"):
                get_engine(s.url(db)).dispose()
        for s in servers:
            s.remove()


@pytest.fixture(autouse=True)
def _fresh() -> Iterator[None]:
    """Each test finds the shards up or down for itself: no answer cached from the test before."""
    fleet.recheck_now()
    yield
    fleet.recheck_now()
