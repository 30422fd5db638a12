import collections

import pytest

from service.inventory.schemas import Inventory
from simulator.topology import TopologyParams, build_topology, read_inventory, write_inventory


def _links(inv: Inventory) -> list[tuple[str, str, str, str]]:
    out = []
    for link in inv.links:
        a, b = link.a.split(":", 1), link.b.split(":", 1)
        out.append((a[0], a[1], b[0], b[1]))
    return out


@pytest.mark.parametrize("kw", [
    {"hosts": 2},
    {"hosts": 40, "hosts_per_leaf": 16, "pods": 2, "spines": 4},
    {"hosts": 24, "shape": "two-tier", "pods": 2, "hosts_per_leaf": 32},
    {"hosts": 32, "shape": "three-tier", "pods": 2, "hosts_per_leaf": 8, "spines": 2, "cores": 3},
])
def test_invariants(kw: dict) -> None:
    p = TopologyParams(**kw)
    inv = build_topology(p)
    role = {d.name: d.role for d in inv.devices}
    dev = {d.name: d for d in inv.devices}
    counts = collections.Counter(role.values())
    assert counts["host"] == p.hosts
    links = _links(inv)
    # no port used twice, every linked port exists on its device
    ends = [(a, pa) for a, pa, _, _ in links] + [(b, pb) for _, _, b, pb in links]
    assert len(ends) == len(set(ends))
    for d, pn in ends:
        assert pn in {x.name for x in dev[d].ports}
    tiers = collections.Counter(tuple(sorted((role[a], role[b]))) for a, _, b, _ in links)
    assert tiers[("host", "leaf")] == p.hosts * p.nics_per_host
    n_leaves, n_spines = counts["leaf"], counts["spine"]
    ups = p.uplinks_per_leaf or (p.spines if p.spines else None)
    if ups:
        assert tiers[("leaf", "spine")] == n_leaves * ups
    if p.shape == "three-tier":
        assert tiers[("core", "spine")] == n_spines * p.cores
    # every NIC goes to a leaf of its own rail and pod
    for a, pa, b, _ in links:
        if role[a] == "host":
            port = next(x for x in dev[a].ports if x.name == pa)
            assert port.nic == f"mlx5_{port.rail}" and port.gpu == port.rail
            assert dev[b].pod == dev[a].pod
            if p.shape != "two-tier":
                assert f"-r{port.rail}-" in b
    # every port with a link carries a full optic
    for d, pn in ends:
        o = next(x for x in dev[d].ports if x.name == pn).optic
        assert o and o.vendor and o.part_number and o.serial and o.type and o.lanes
        assert o.thresholds.temperature_celsius is not None


def test_yaml_round_trip(tmp_path) -> None:
    inv = build_topology(TopologyParams(hosts=4, shape="three-tier", pods=2, port_style="swp"))
    path = write_inventory(inv, tmp_path / "inv.yaml")
    assert read_inventory(path) == inv


def test_same_seed_same_fabric() -> None:
    a = build_topology(TopologyParams(hosts=8, seed=4))
    b = build_topology(TopologyParams(hosts=8, seed=4))
    c = build_topology(TopologyParams(hosts=8, seed=5))
    assert a == b and a != c


def test_bad_params() -> None:
    with pytest.raises(ValueError, match="multiple of rails"):
        TopologyParams(hosts=8, leaves=3)
    with pytest.raises(ValueError, match="unknown module type"):
        TopologyParams(hosts=8, optics_mix={"999G-XX": 1})
