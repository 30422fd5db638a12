"""The SNMP conformance corpus: every real walk served by one snmpsim on loopback, polled by the
real collector, checked against hand-read values (tests/data/snmp/conformance.toml)."""

from __future__ import annotations

from collections.abc import Iterator
from dataclasses import replace

import pytest

from collectors.base import CollectResult, Target
from collectors.snmp import parse_snmprec_varbinds, samples_from_varbinds
from collectors.snmp_oids import Cells
from tests.snmp_corpus import Walk, load_walks, score
from tests.snmp_peers import Peer, start_snmpsim, unstamped

WALKS = load_walks()
NOW_MS = 1_700_000_000_000


@pytest.fixture(scope="module")
def sim() -> Iterator[Peer]:
    peer = start_snmpsim({w.community: w.path for w in WALKS})
    yield peer
    peer.close()


@pytest.fixture(scope="module")
def polls(sim: Peer) -> dict[str, CollectResult]:
    """One poll of every walk, all at once, as the service polls a fabric."""
    from collectors.snmp import collect_many

    # One snmpsim answers all 18 walks at once: on a busy 2-core box a GETBULK can wait seconds for its turn,
    # and this test is about what the answers map to, not how fast they come (test_snmp_live times out).
    targets = [Target(name=w.community, device=w.community, protocol="snmp", port=sim.port,
                      secrets={"community": w.community}, timeout_s=15.0, retries=1) for w in WALKS]
    return {r.target: r for r in collect_many(targets, now_ms=NOW_MS)}


def test_corpus_covers_every_walk() -> None:
    files = sorted(p.name for p in WALKS[0].path.parent.glob("*.snmprec"))
    assert files == sorted(w.file for w in WALKS), "a walk without expectations (or expectations without a walk)"
    platforms = {w.dialect for w in WALKS}
    assert {"sonic", "cumulus", "arista-eos", "cisco-nxos", "juniper-junos", "dell-os10"} <= platforms


@pytest.mark.parametrize("walk", WALKS, ids=[w.community for w in WALKS])
def test_walk_through_snmpsim(walk: Walk, polls: dict[str, CollectResult]) -> None:
    res = polls[walk.community]
    assert res.ok, res.error
    ports = {s.port for s in res.samples if s.metric == "port_oper_up"}
    got = score(walk, res.samples, res.warnings, {p for p in ports if p})
    assert not got.wrong, got.wrong
    assert not got.silent, f"blind spots not reported: {got.silent}; warnings: {res.warnings}"
    # The live poll maps exactly what the recording holds.
    offline = samples_from_varbinds(parse_snmprec_varbinds(walk.path.read_text()), device=walk.community,
                                    ts_ms=NOW_MS)
    assert sorted(map(unstamped, res.samples)) == sorted(map(unstamped, offline.samples))
    assert res.warnings == offline.warnings


@pytest.mark.parametrize("walk", WALKS, ids=[w.community for w in WALKS])
def test_dialect_is_detected(walk: Walk) -> None:
    from collectors.snmp import dialect_of

    assert dialect_of(Cells(parse_snmprec_varbinds(walk.path.read_text()))).name == walk.dialect


def test_score_catches_a_wrong_value_and_a_silent_gap() -> None:
    """The checker itself: a value off by one and a missing warning are both caught."""
    walk = next(w for w in WALKS if w.dialect == "sonic")
    mapped = samples_from_varbinds(parse_snmprec_varbinds(walk.path.read_text()), device="d", ts_ms=1)
    ports = {s.port for s in mapped.samples if s.metric == "port_oper_up" and s.port}
    assert not score(walk, mapped.samples, mapped.warnings, ports).wrong
    bumped = [replace(s, value=s.value + 1) if s.metric == "port_rx_bytes_total" else s for s in mapped.samples]
    assert score(walk, bumped, mapped.warnings, ports).wrong["counters"]
    quiet = [w for w in mapped.warnings if not w.startswith("ports:")]
    assert score(walk, mapped.samples, quiet, ports).silent == ["ports: eth0"]


def test_inventory_management_ports_reach_the_poll(sim: Peer, monkeypatch: pytest.MonkeyPatch) -> None:
    """`management_ports` on an inventory endpoint: the named port is left out without a warning."""
    from collectors.snmp import collect_snmp
    from service.inventory.loader import load_inventory_text
    from service.inventory.secrets import target_for

    walk = next(w for w in WALKS if w.dialect == "sonic")
    monkeypatch.setenv("FW_TEST_SNMP_COMMUNITY", walk.community)
    inv = load_inventory_text(f"""
version: 1
devices:
  - name: leaf1
    kind: switch
    role: leaf
    endpoints:
      - protocol: snmp
        port: {sim.port}
        community: {{env: FW_TEST_SNMP_COMMUNITY}}
        management_ports: [eth0]
""")
    target = target_for(inv.devices[0].endpoints[0], inv.devices[0])
    assert target.params["management_ports"] == ["eth0"]
    declared = collect_snmp(target, now_ms=NOW_MS)
    assert declared.ok, declared.error
    assert not [w for w in declared.warnings if w.startswith("ports:")]
    assert len({s.port for s in declared.samples if s.metric == "port_oper_up"}) == 54
    undeclared = collect_snmp(target.model_copy(update={"params": {}}), now_ms=NOW_MS)
    assert [w for w in undeclared.warnings if w.startswith("ports:") and "eth0" in w]


def test_management_ports_belong_to_snmp_endpoints() -> None:
    from service.inventory.loader import InventoryError, load_inventory_text

    with pytest.raises(InventoryError) as info:
        load_inventory_text("""
version: 1
devices:
  - name: leaf1
    kind: switch
    role: leaf
    endpoints:
      - {protocol: gnmi, management_ports: [mgmt0]}
""", source="inv.yaml")
    assert "management_ports: is an SNMP setting" in str(info.value)


def test_devices_md_says_what_the_corpus_tests() -> None:
    """docs/devices.md, Switches (SNMP): "tested"/"partial" exactly where a walk has checked values."""
    from tests.snmp_corpus import REPO

    text = (REPO / "docs" / "devices.md").read_text()
    section = text.split("\n## Switches (SNMP)\n", 1)[1].split("\n## ", 1)[0]
    rows = [[c.strip() for c in line.strip("|").split("|")] for line in section.splitlines() if line.startswith("|")]
    header, body = rows[0][1:], {r[0]: r[1:] for r in rows[2:]}
    assert header == ["ports", "state", "counters", "optics", "device"]
    for walk in WALKS:
        assert walk.platform in body, f"{walk.platform}: no row in docs/devices.md"
        for group, cell in zip(header, body[walk.platform], strict=True):
            claimed = cell.startswith(("tested", "partial"))
            assert claimed == (group == "ports" or group in walk.expect), (walk.platform, group, cell)
            if group in walk.unsupported:
                assert cell.startswith(("not supported", "not in the walk")), (walk.platform, group, cell)
