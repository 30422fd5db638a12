"""Loading inventories into PostgreSQL: round trip, idempotence, sync policy, atomicity, scale."""

from __future__ import annotations

import time
from typing import Any

import pytest
from sqlalchemy import Engine, text

from service.db import session_scope
from service.inventory.loader import InventoryError, dump_inventory_yaml, load_inventory_file, load_inventory_text
from service.inventory.schemas import Inventory
from service.inventory.service import UpsertReport, export_inventory, upsert_inventory
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "inventory" / "small-fabric.yaml"
TABLES = ("pods", "devices", "ports", "optics", "endpoints", "links")


def load(engine: Engine, inv: Inventory, **kw: Any) -> UpsertReport:
    with session_scope(engine) as s:
        return upsert_inventory(session=s, inventory=inv, **kw)


def export(engine: Engine) -> Inventory:
    with session_scope(engine) as s:
        return export_inventory(session=s)


def counts(engine: Engine) -> dict[str, int]:
    with engine.connect() as c:
        return {t: c.execute(text(f"SELECT count(*) FROM {t}")).scalar_one() for t in TABLES}


def row_versions(engine: Engine) -> dict[str, list[tuple[int, str]]]:
    """(id, xmin) of every row: unchanged xmin proves a row was not rewritten."""
    with engine.connect() as c:
        return {t: [tuple(r) for r in c.execute(text(f"SELECT id, xmin::text FROM {t} ORDER BY id"))]
                for t in TABLES}


def test_round_trip_and_idempotent_second_load(db: Engine) -> None:
    inv = load_inventory_file(EXAMPLE)
    first = load(db, inv)
    assert (first.devices.added, first.ports.added, first.optics.added, first.links.added,
            first.endpoints.added, first.pods.added) == (5, 40, 40, 20, 5, 1)
    assert first.total_changes == 111

    before = row_versions(db)
    second = load(db, load_inventory_file(EXAMPLE))
    assert second.total_changes == 0, second.as_dict()
    assert row_versions(db) == before  # nothing rewritten, not even updated_at

    exported = export(db)
    assert exported == inv
    assert load_inventory_text(dump_inventory_yaml(exported), "export.yaml") == inv


def test_changes_update_and_removals_follow_the_file(db: Engine) -> None:
    inv = load_inventory_file(EXAMPLE)
    load(db, inv)
    data = inv.model_dump(mode="json", exclude_defaults=True)
    leaf1 = next(d for d in data["devices"] if d["name"] == "leaf1")
    host1 = next(d for d in data["devices"] if d["name"] == "gpu-a01")
    leaf1["vendor"] = "Arista Networks"                       # device field changes
    leaf1["ports"][0]["optic"]["serial"] = "NEW123"            # optic field changes
    host1["ports"][7]["optic"] = None                          # optic removed
    del host1["ports"][7]["optic"]
    removed_port = host1["ports"].pop(0)                       # port removed (and its link)
    host1["endpoints"] = []                                    # endpoint removed
    data["links"] = [lk for lk in data["links"] if lk["a"] != f"gpu-a01:{removed_port['name']}"]
    data["links"][0]["cable"] = {"type": "aoc", "length_m": 3}  # link field changes
    data["links"].append({"a": "leaf1:Ethernet1/1", "b": "spine1:swp4"})  # swap an uplink end...
    data["links"] = [lk for lk in data["links"] if lk["b"] != "spine1:swp4" or lk["a"] == "leaf1:Ethernet1/1"]
    changed = Inventory.model_validate(data)

    report = load(db, changed)
    assert vars(report.devices) == {"added": 0, "updated": 1, "removed": 0}
    assert vars(report.ports) == {"added": 0, "updated": 0, "removed": 1}
    # removed: the dropped port's optic and the optic taken off port 7; updated: one serial
    assert vars(report.optics) == {"added": 0, "updated": 1, "removed": 2}
    assert vars(report.endpoints) == {"added": 0, "updated": 0, "removed": 1}
    # removed: the dropped port's link, leaf2's uplink to swp4; added: leaf1:Ethernet1/1-spine1:swp4
    assert vars(report.links) == {"added": 1, "updated": 1, "removed": 2}
    assert export(db) == changed
    assert load(db, changed).total_changes == 0


def test_devices_outside_the_file_are_kept_unless_pruned(db: Engine) -> None:
    inv = load_inventory_file(EXAMPLE)
    load(db, inv)
    only_spine = Inventory(pods=inv.pods, devices=[d for d in inv.devices if d.name == "spine1"], links=[])
    report = load(db, only_spine)
    assert report.kept_devices == ["leaf1", "leaf2", "gpu-a01", "gpu-a02"]
    # spine1 is in the file, so its links (all to leaves) go; the leaves and hosts stay
    assert report.links.removed == 4 and report.devices.removed == 0
    assert counts(db)["devices"] == 5 and counts(db)["links"] == 16

    pruned = load(db, only_spine, prune=True)
    assert pruned.devices.removed == 4 and pruned.kept_devices == []
    assert counts(db) == {"pods": 1, "devices": 1, "ports": 4, "optics": 4, "endpoints": 1, "links": 0}


def test_failing_load_writes_nothing(db: Engine) -> None:
    inv = load_inventory_file(EXAMPLE)
    # A real database failure at the last step (links): every earlier insert must vanish too.
    with db.begin() as c:
        c.execute(text("ALTER TABLE links ADD CONSTRAINT test_only_short CHECK (length_m < 10)"))
    try:
        with pytest.raises(Exception, match="test_only_short"):
            load(db, inv)
        assert counts(db) == dict.fromkeys(TABLES, 0)

        # Same when a caller commits after catching the error: the savepoint already undid it.
        with session_scope(db) as s, pytest.raises(Exception, match="test_only_short"):
            upsert_inventory(session=s, inventory=inv)
        assert counts(db) == dict.fromkeys(TABLES, 0)
    finally:
        with db.begin() as c:
            c.execute(text("ALTER TABLE links DROP CONSTRAINT test_only_short"))

    # A failed change to a loaded fabric leaves the previous state intact.
    load(db, inv)
    before = row_versions(db)
    bad = inv.model_copy(deep=True)
    bad.links[0].b = bad.links[1].b  # port in two links: rejected before any write
    with pytest.raises(InventoryError, match=r"links\[0\]\.b"):
        load(db, bad)
    assert row_versions(db) == before


HOSTILE = [
    "'; DROP TABLE devices; --",
    '<script>alert("x")</script> & </td>',
    "\\N tab\there \\. back\\slash",
    "Ünïcødé ☃ 机架 🚀 \u200b zero-width",
    "line1\nline2\r\n\"quoted\" 'single' %s %(x)s $1 {}",
]


def test_hostile_strings_stored_and_exported_unchanged(db: Engine) -> None:
    devices = []
    for i, s in enumerate(HOSTILE):
        devices.append({
            "name": f"dev{i}.a_b:c/d@e+f-g", "kind": "switch", "role": "leaf", "vendor": s, "model": s[::-1],
            "rack": s[:60], "pod": "p-1",
            "ports": [{"name": "Ethernet1/1:2", "nic": s[:30],
                       "optic": {"vendor": s, "serial": s, "part_number": s[:50]}}],
            "endpoints": [{"protocol": "gnmi", "username": s, "path_set": s,
                           "password": {"file": "/run/secrets/" + s.replace("\n", "")}}],
        })
    inv = Inventory.model_validate({"pods": [{"name": "p-1", "description": "\n".join(HOSTILE)}],
                                    "devices": devices, "links": []})
    load(db, inv)
    assert export(db) == inv
    with db.connect() as c:
        vendors = [r[0] for r in c.execute(text("SELECT vendor FROM devices ORDER BY id"))]
    assert vendors == [s.strip() for s in HOSTILE]  # the schema strips outer whitespace, nothing else
    assert load_inventory_text(dump_inventory_yaml(inv)) == inv
    assert load(db, inv).total_changes == 0


def big_fabric(hosts: int, nics: int = 8, hosts_per_leaf: int = 32, spines: int = 16) -> Inventory:
    """A rail-optimized fabric: NIC r of each host to the rail-r leaf of its group; leaves to all spines."""
    thresholds = {"rx_power_dbm": {"low_alarm": -10.0, "high_alarm": 5.0}}
    devices: list[dict[str, Any]] = []
    links: list[dict[str, Any]] = []
    groups = -(-hosts // hosts_per_leaf)
    for s in range(spines):
        devices.append({"name": f"spine{s}", "kind": "switch", "role": "spine", "pod": "pod1",
                        "ports": [{"name": f"swp{p}", "speed_gbps": 800} for p in range(groups * nics)],
                        "endpoints": [{"protocol": "gnmi", "username": "fw", "password": {"env": "GNMI_PW"}}]})
    for g in range(groups):
        for r in range(nics):
            leaf = f"leaf-g{g}-r{r}"
            down = [{"name": f"Ethernet{p}/1", "speed_gbps": 400, "rail": r,
                     "optic": {"type": "400G-DR4", "serial": f"{leaf}-{p}", "thresholds": thresholds}}
                    for p in range(hosts_per_leaf)]
            up = [{"name": f"Ethernet{hosts_per_leaf + s}/1", "speed_gbps": 800} for s in range(spines)]
            devices.append({"name": leaf, "kind": "switch", "role": "leaf", "pod": "pod1", "ports": down + up,
                            "endpoints": [{"protocol": "snmp", "community": {"env": "SNMP_COMMUNITY"}}]})
            links += [{"a": f"{leaf}:Ethernet{hosts_per_leaf + s}/1", "b": f"spine{s}:swp{g * nics + r}"}
                      for s in range(spines)]
    for h in range(hosts):
        g, slot = divmod(h, hosts_per_leaf)
        name = f"gpu{h:05d}"
        devices.append({"name": name, "kind": "host", "role": "host", "pod": "pod1", "gpus": nics,
                        "ports": [{"name": f"eth{r}", "nic": f"mlx5_{r}", "gpu": r, "rail": r, "speed_gbps": 400,
                                   "optic": {"type": "400G-DR4", "serial": f"{name}-{r}",
                                             "thresholds": thresholds}} for r in range(nics)],
                        "endpoints": [{"protocol": "host", "address": f"10.1.{h // 250}.{h % 250 + 1}"}]})
        links += [{"a": f"{name}:eth{r}", "b": f"leaf-g{g}-r{r}:Ethernet{slot}/1"} for r in range(nics)]
    return Inventory.model_validate({"pods": [{"name": "pod1"}], "devices": devices, "links": links})


def test_thousand_host_fabric_load_time(db: Engine, capsys: pytest.CaptureFixture[str]) -> None:
    inv = big_fabric(1000)
    text_yaml = dump_inventory_yaml(inv)
    t0 = time.perf_counter()
    parsed = load_inventory_text(text_yaml, "big.yaml")
    t_parse = time.perf_counter() - t0
    assert parsed == inv
    first = load(db, inv)
    second = load(db, inv)
    t0 = time.perf_counter()
    assert export(db) == inv
    t_export = time.perf_counter() - t0
    n_ports = sum(len(d.ports) for d in inv.devices)
    assert first.ports.added == n_ports and second.total_changes == 0
    with capsys.disabled():
        print(f"\n1k-host fabric: {len(inv.devices)} devices, {n_ports} ports, {len(inv.links)} links, "
              f"{len(text_yaml) / 1e6:.1f} MB YAML; parse+validate {t_parse:.2f}s, first load "
              f"{first.elapsed_s:.2f}s, no-op reload {second.elapsed_s:.2f}s, export {t_export:.2f}s")
    assert first.elapsed_s < 30 and second.elapsed_s < 30  # generous: shared CI machines
