"""Drain tests; helpers shared by the test modules live here."""

from __future__ import annotations

from typing import Any

from sqlalchemy import Engine

from service.db import session_scope
from service.drains.schemas import DrainSettings
from service.inventory.service import upsert_inventory
from simulator.topology import TopologyParams, build_topology


def load_fabric(db: Engine, **params: Any) -> None:
    """Load a generated topology (the simulator's generator) into the inventory tables."""
    inv = build_topology(TopologyParams(**params))
    with session_scope(db) as session:
        upsert_inventory(session=session, inventory=inv)


def settings(**overrides: Any) -> DrainSettings:
    """Test settings: defaults, but a breaker and pod limit that stay out of the way unless asked."""
    base: dict[str, Any] = {"max_per_pod": 50, "breaker_max": 100}
    base.update(overrides)
    return DrainSettings(**base)


# One pod, two rails, one leaf per rail, four spines: each leaf has 4 uplinks (floor 3 at 75 %).
SMALL = {"shape": "rail-optimized", "hosts": 4, "gpus_per_host": 2, "nics_per_host": 2, "hosts_per_leaf": 4,
         "spines": 4, "pods": 1}
