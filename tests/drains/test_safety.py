"""Each safety constraint blocks what it should, allows what it should, and quotes its numbers."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import Engine

from service.drains import service
from service.drains.schemas import DrainAction, DrainSettings, Target, TargetKind
from service.incidents import service as incidents
from service.telemetry.samples import Sample
from service.telemetry.service import ingest_samples
from tests.drains import SMALL, load_fabric, settings

AT = datetime(2026, 11, 2, 12, 0, tzinfo=UTC)
LEAF = "leaf-p1-r0-01"


def _link(device: str, port: str) -> Target:
    return Target(kind=TargetKind.LINK, device=device, port=port)


def _recommend(db: Engine, target: Target, s: DrainSettings, at: datetime = AT, **kw: object):  # type: ignore[no-untyped-def]
    with db.begin() as conn:
        return service.recommend(conn=conn, target=target, reason="test", cause="connector_contamination", at=at,
                                 settings=s, **kw)  # type: ignore[arg-type]


def _drain(db: Engine, drain_id: int, s: DrainSettings, at: datetime = AT):  # type: ignore[no-untyped-def]
    with db.begin() as conn:
        row = service.approve(conn=conn, drain_id=drain_id, actor="alice", at=at, settings=s)
        assert row.status == "approved", row.verdict["summary"]
        return service.mark_done(conn=conn, drain_id=drain_id, actor="alice", at=at)


def _failed(row) -> dict[str, dict]:  # type: ignore[no-untyped-def]
    return {c["constraint"]: c for c in row.verdict["checks"] if not c["ok"]}


def test_uplink_floor_allows_one_then_blocks_with_numbers(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    first = _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    assert first.status == "pending" and first.action == "shut_ports" and first.verdict["safe"]
    assert "leaf-p1-r0-01 would keep 3 of 4 uplinks, floor is 3" in first.verdict["summary"]
    _drain(db, first.id, s)
    second = _recommend(db, _link("spine-02", "Ethernet1/1"), s)   # same leaf, named from the spine end
    assert second.status == "blocked" and second.verdict["blocked_by"] == ["uplink_floor"]
    check = _failed(second)["uplink_floor"]
    assert check["message"] == "leaf-p1-r0-01 would keep 2 of 4 uplinks, floor is 3 (1 already down or drained)"
    assert check["numbers"] == {"keep": 2, "total": 4, "floor": 3, "already_out": 1}
    # The other leaf has its own floor and is untouched.
    assert _recommend(db, _link("leaf-p1-r1-01", "Ethernet1/6"), s).status == "pending"


def test_floor_counts_links_that_are_down_in_telemetry(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    ts = int((AT - timedelta(minutes=1)).timestamp() * 1000)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0, ts, "spine-03", "Ethernet1/1")])
    row = _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    assert row.status == "blocked"
    assert _failed(row)["uplink_floor"]["numbers"]["keep"] == 2
    # Back up: a newer reading of 1 makes the same drain safe again (re-evaluated in place).
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 1, ts + 30_000, "spine-03", "Ethernet1/1")])
    again = _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    assert again.id == row.id and again.status == "pending"


def test_fraction_and_count_floors(db: Engine) -> None:
    load_fabric(db, **SMALL)
    row = _recommend(db, _link(LEAF, "Ethernet1/5"), settings(uplink_floor_fraction=0.5, uplink_floor_min=4))
    assert _failed(row)["uplink_floor"]["message"] == "leaf-p1-r0-01 would keep 3 of 4 uplinks, floor is 4"


def test_per_pod_concurrency(db: Engine) -> None:
    load_fabric(db, **{**SMALL, "pods": 2})
    s = settings(max_per_pod=1)
    a = _recommend(db, Target(kind=TargetKind.HOST, device="host-p1-00001"), s)
    assert a.status == "pending" and a.action == "slurm_drain" and a.pod == "p1"
    _drain(db, a.id, s)
    b = _recommend(db, Target(kind=TargetKind.HOST, device="host-p1-00002"), s)
    assert b.status == "blocked" and b.verdict["blocked_by"] == ["pod_concurrency"]
    assert _failed(b)["pod_concurrency"]["message"] == "pod p1 would have 2 concurrent drains, maximum is 1"
    assert _recommend(db, Target(kind=TargetKind.HOST, device="host-p2-00003"), s).status == "pending"
    # Returning the first host to service frees the pod's slot.
    with db.begin() as conn:
        assert service.release_for_incident(conn=conn, incident_id=a.incident_id, actor="bob", at=AT) == 1
    assert _recommend(db, Target(kind=TargetKind.HOST, device="host-p1-00002"), s).status == "pending"


def test_last_path_of_a_host_to_its_rail(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    # Default for a host link: drain the host in Slurm, which keeps the rail intact.
    default = _recommend(db, _link("host-p1-00001", "eth0"), s)
    assert default.action == "slurm_drain" and default.status == "pending"
    with db.begin() as conn:
        service.reject(conn=conn, drain_id=default.id, actor="alice", note="try a port shut")
    shut = _recommend(db, _link("host-p1-00001", "eth0"), s, action=DrainAction.SHUT_PORTS)
    assert shut.status == "blocked" and "rail_host_path" in shut.verdict["blocked_by"]
    assert _failed(shut)["rail_host_path"]["message"] == (
        "host-p1-00001:eth0 is the last healthy path of host-p1-00001 to rail 0 "
        "(0 other healthy links on rail 0); drain the host first")
    # With the host drained, shutting its port is allowed.
    host = _recommend(db, Target(kind=TargetKind.HOST, device="host-p1-00001"), s)
    _drain(db, host.id, s)
    again = _recommend(db, _link("host-p1-00001", "eth0"), s, action=DrainAction.SHUT_PORTS)
    assert again.status == "pending", again.verdict["summary"]


def test_switch_drain_checks_every_attached_host(db: Engine) -> None:
    load_fabric(db, **SMALL)
    row = _recommend(db, Target(kind=TargetKind.SWITCH, device=LEAF), settings())
    assert row.status == "blocked" and row.action == "shut_ports" and len(row.link_ids) == 8
    paths = [c for c in row.verdict["checks"] if c["constraint"] == "rail_host_path" and not c["ok"]]
    assert {c["subject"] for c in paths} == {f"host-p1-0000{i}:eth0" for i in range(1, 5)}


def test_rail_keeps_its_last_uplinks(db: Engine) -> None:
    load_fabric(db, **{**SMALL, "spines": 2})   # two uplinks per leaf, one leaf per rail
    s = settings(uplink_floor_fraction=0.0, rail_min_uplinks=1)
    first = _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    assert first.status == "pending"
    _drain(db, first.id, s)
    last = _recommend(db, _link(LEAF, "Ethernet1/6"), s)
    assert last.status == "blocked" and last.verdict["blocked_by"] == ["rail_uplinks"]
    assert _failed(last)["rail_uplinks"]["message"] == "rail 0 in pod p1 would keep 0 of 2 leaf uplinks, minimum is 1"


def test_circuit_breaker_trips_and_resets(db: Engine) -> None:
    load_fabric(db, **{**SMALL, "hosts": 6, "hosts_per_leaf": 6})
    s = settings(breaker_max=2, breaker_window_s=3600)
    hosts = [f"host-p1-0000{i}" for i in range(1, 7)]
    assert [_recommend(db, Target(kind=TargetKind.HOST, device=h), s).status for h in hosts[:2]] == ["pending"] * 2
    third = _recommend(db, Target(kind=TargetKind.HOST, device=hosts[2]), s)
    assert third.status == "blocked" and third.verdict["blocked_by"] == ["circuit_breaker"]
    assert _failed(third)["circuit_breaker"]["numbers"] == {"recommended": 2, "limit": 2, "window_s": 3600.0}
    assert "2 drains recommended in the last 3600 s, limit is 2; the breaker trips" in third.verdict["summary"]
    # Tripped means tripped: even after the window has passed, until someone resets it.
    later = AT + timedelta(hours=3)
    fourth = _recommend(db, Target(kind=TargetKind.HOST, device=hosts[3]), s, at=later)
    assert fourth.status == "blocked" and "circuit breaker is tripped" in fourth.verdict["summary"]
    with db.begin() as conn:
        st = service.breaker_state(conn=conn, settings=s, at=later)
        assert st.tripped and st.tripped_at == AT
        reset = service.reset_breaker(conn=conn, actor="carol", note="storm over", at=later, settings=s)
        assert not reset.tripped and reset.reset_by == "carol" and reset.recommended_in_window == 0
    assert _recommend(db, Target(kind=TargetKind.HOST, device=hosts[3]), s, at=later).status == "pending"


def test_approval_rechecks_safety(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    a = _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    b = _recommend(db, _link(LEAF, "Ethernet1/6"), s)
    assert a.status == b.status == "pending"   # each alone keeps 3 of 4
    _drain(db, a.id, s)
    with db.begin() as conn:
        refused = service.approve(conn=conn, drain_id=b.id, actor="alice", at=AT, settings=s)
    assert refused.status == "blocked" and refused.verdict["blocked_by"] == ["uplink_floor"]
    with db.begin() as conn, pytest.raises(service.DrainStateError, match="'blocked'; cannot approve"):
        service.approve(conn=conn, drain_id=b.id, actor="alice", at=AT, settings=s)


def test_recommend_is_idempotent_and_drives_the_incident(db: Engine) -> None:
    load_fabric(db, **SMALL)
    s = settings()
    a = _recommend(db, _link(LEAF, "Ethernet1/5"), s, alert_id=41)
    b = _recommend(db, _link("spine-01", "Ethernet1/1"), s)   # the same link, other end
    assert a.id == b.id and a.incident_id == b.incident_id
    with db.connect() as conn:
        inc = incidents.get(conn=conn, incident_id=a.incident_id)
        assert inc.state == "drain_recommended" and inc.alert_id == 41 and inc.entity_kind == "link"
        assert inc.entity == "link:leaf-p1-r0-01:Ethernet1/5|spine-01:Ethernet1/1"
        assert inc.part_number  # the optic at the named end, from the generated inventory
    _drain(db, a.id, s)
    with db.connect() as conn:
        assert incidents.get(conn=conn, incident_id=a.incident_id).state == "drained"
        kinds = [e.kind for e in incidents.timeline(conn=conn, incident_id=a.incident_id)]
    assert kinds == ["created", "transition", "drain_approved", "transition"]


def test_a_cycles_recommendations_share_one_read_of_the_fabric_and_see_each_other(
        db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle's pages share one read of the graph and of the links down (each read is over every port: per
    page they slowed a cycle by the fabric's size, bench/drain_cycle.py), while each verdict still counts the
    recommendations made before it in the cycle: with a breaker limit of 2, the third host trips it."""
    from service.drains import topology

    load_fabric(db, **SMALL)
    ts = int((AT - timedelta(minutes=1)).timestamp() * 1000)
    ingest_samples(engine=db, samples=[Sample("port_oper_up", 0, ts, "spine-03", "Ethernet1/1")])
    reads = {"load_graph": 0, "down_links": 0}
    for name in reads:
        real = getattr(topology, name)

        def counted(*a: object, _real=real, _name=name, **kw: object) -> object:  # type: ignore[no-untyped-def]
            reads[_name] += 1
            return _real(*a, **kw)
        monkeypatch.setattr(topology, name, counted)

    s = settings(breaker_max=2, breaker_window_s=3600)
    view = topology.FabricView()
    with db.begin() as conn:
        link = service.recommend(conn=conn, target=_link(LEAF, "Ethernet1/5"), reason="test",
                                 cause="connector_contamination", at=AT, settings=s, view=view)
        rows = [service.recommend(conn=conn, target=Target(kind=TargetKind.HOST, device=f"host-p1-0000{i}"),
                                  reason="test", cause="post_fec_errors", at=AT, settings=s, view=view)
                for i in (1, 2, 3)]
    assert reads == {"load_graph": 1, "down_links": 1}
    # the shared read of the links down counts the one telemetry says is down (spine-03's uplink)
    assert link.status == "blocked"
    assert _failed(link)["uplink_floor"]["numbers"]["keep"] == 2
    assert [r.status for r in rows] == ["pending", "pending", "blocked"]
    assert rows[2].verdict["blocked_by"] == ["circuit_breaker"]

    # without a view (the API, an approval) each decision reads anew
    _recommend(db, Target(kind=TargetKind.HOST, device="host-p1-00004"), s)
    _recommend(db, _link(LEAF, "Ethernet1/5"), s)
    assert reads == {"load_graph": 3, "down_links": 3}


def test_a_live_cycle_reads_the_fabric_once_for_all_its_pages(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """apply_cycle, the pipeline's step: four firing pages, four drain recommendations, one read of the graph."""
    from service.drains import topology
    from service.pipeline import apply_cycle
    from tests.alerts import finding

    load_fabric(db, **{**SMALL, "hosts": 6, "hosts_per_leaf": 6})
    graphs: list[int] = []
    real = topology.load_graph
    monkeypatch.setattr(topology, "load_graph", lambda **kw: graphs.append(1) or real(**kw))
    at_ms = int(AT.timestamp() * 1000)
    pages = [finding("post_fec_errors", device=f"host-p1-0000{i}", port="eth0", at_ms=at_ms) for i in (1, 2, 3, 4)]
    with db.begin() as conn:
        out = apply_cycle(conn, pages, at_ms)
    assert len(out.drains) == 4 and not out.drain_errors
    assert len(graphs) == 1
