"""Moving a pod between shards (`fabricwatch shards move`, service/shards/rebalance.py) on three real servers:
under load every sample ends on the new shard exactly once and none on the old, fleet reads answer the same,
an interrupted move finishes when run again, bad requests and a down target change nothing, and the pod's
detection state goes with it. Also: remote write and an exporter scrape's samples land on their device's shard.

Each test makes pods of its own (the stored map outlives a test), so the tests do not depend on their order."""

from __future__ import annotations

import itertools
import json
import subprocess
import threading
import time
from collections.abc import Callable
from datetime import UTC, datetime, timedelta
from typing import Any

import numpy as np
import pytest
from sqlalchemy import text

from service.db import get_engine
from service.detection.archive import Archive
from service.inventory.models import Device, Optic, Pod, Port
from service.shards import fleet
from service.shards.detection import run_shard_cycle
from service.shards.ingest import ShardedReport, ingest_samples
from service.shards.rebalance import MoveError, abort_move, move_pod
from service.shards.setup import PodMoved, apply
from service.shards.topology import ShardSettings, Topology, UnknownShard
from service.telemetry.chunk_codec import encode
from service.telemetry.samples import Sample
from tests.shards.conftest import LAYOUT, Cluster

pytestmark = pytest.mark.timeout(240)

T0 = datetime(2026, 11, 30, 12, 0, tzinfo=UTC)
T0_MS = int(T0.timestamp() * 1000)
PODS: dict[str, list[str]] = {k: list(v) for k, v in LAYOUT.items()}  # the setting, as the tests change it
_names = itertools.count(1)


def topology(cluster: Cluster) -> Topology:
    return Topology.of(cluster.control_url, ShardSettings(urls=cluster.settings().urls, pods=PODS))


def new_pod(cluster: Cluster, shard: str, *, optic: bool = False) -> tuple[str, str]:
    """A pod of one device (ports eth0, eth1; with `optic`, a one-lane module in eth0) of its own, on `shard`:
    (pod, device)."""
    from service.db import session_scope

    n = next(_names)
    pod, device = f"m{n}", f"mdev{n}"
    module = Optic(part_number="FR1-TEST", type="400G-FR4", lanes=1,
                   thresholds={"rx_power_dbm": {"low_warning": -10.0, "low_alarm": -13.0}}) if optic else None
    with session_scope(cluster.engine) as s:
        s.add(Pod(name=pod))
        s.add(Device(name=device, kind="switch", role="leaf", pod=pod, gpus=0,
                     ports=[Port(name="eth0", optic=module), Port(name="eth1")]))
    PODS[shard].append(pod)
    apply(topology(cluster))
    return pod, device


def _scalar(url: str, sql: str, **params: Any) -> Any:
    with get_engine(url).connect() as conn:
        return conn.execute(text(sql), params).scalar()


def samples_of(url: str, device: str) -> tuple[int, int]:
    """(samples stored, distinct (series, time)) of a device on a shard: rows, import blocks and chunks."""
    with get_engine(url).connect() as conn:
        n, d = conn.execute(text("""
        SELECT coalesce(sum(n), 0)::int, coalesce(sum(d), 0)::int FROM (
          SELECT count(*) n, count(DISTINCT (r.series_id, r.ts)) d FROM sample_rows r
            JOIN series s ON s.id = r.series_id JOIN devices v ON v.id = s.device_id WHERE v.name = :d
          UNION ALL SELECT sum(cardinality(b.ts)), sum(cardinality(b.ts)) FROM sample_blocks b
            JOIN series s ON s.id = b.series_id JOIN devices v ON v.id = s.device_id WHERE v.name = :d
          UNION ALL SELECT sum(c.n), sum(c.n) FROM sample_chunks c
            JOIN series s ON s.id = c.series_id JOIN devices v ON v.id = s.device_id WHERE v.name = :d) x"""),
                            {"d": device}).one()
    return n, d


def orphans(url: str) -> int:
    """Samples on a shard whose series is gone (a move that deleted series but not what they hold)."""
    return sum(_scalar(url, f"SELECT count(*) FROM {t} x WHERE NOT EXISTS "
                            f"(SELECT 1 FROM series s WHERE s.id = x.series_id)")
               for t in ("sample_rows", "sample_blocks", "sample_chunks", "rollup_5m"))


def history(cluster: Cluster, device: str, shard: str) -> int:
    """Stored history of a device: rows on two days, a compressed chunk and an import block on a third, and a
    rollup row. Returns the samples stored."""
    samples = [Sample(m, 100.0 * i, T0_MS - day * 86_400_000 + i * 10_000, device, port)
               for m in ("port_rx_bytes_total", "port_rx_errors_total") for port in ("eth0", "eth1")
               for day in (0, 1) for i in range(6)]
    report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=samples)
    assert report.errors == {} and report.reports[shard].written == len(samples)
    url = cluster.shard_a.url("fw_shard") if shard == "a" else cluster.shard_b.url("fw_shard")
    day = T0 - timedelta(days=2)
    ts_us = np.array([int((day + timedelta(seconds=10 * i)).timestamp() * 1e6) for i in range(3)], np.int64)
    with get_engine(url).begin() as conn:
        sid = conn.execute(text("SELECT s.id FROM series s JOIN devices d ON d.id = s.device_id JOIN ports p "
                                "ON p.id = s.port_id WHERE d.name = :d AND p.name = 'eth0' "
                                "AND s.metric = 'port_rx_bytes_total'"), {"d": device}).scalar_one()
        conn.execute(text("CREATE TABLE IF NOT EXISTS sample_chunks_p20261128 PARTITION OF sample_chunks "
                          "FOR VALUES FROM ('2026-11-28') TO ('2026-11-29')"))
        conn.execute(text("INSERT INTO sample_chunks (series_id, first_ts, last_ts, n, last_value, prev_ts, "
                          "prev_value, data) VALUES (:s, :f, :l, 3, 20.0, :p, 10.0, :d)"),
                     {"s": sid, "f": day, "l": day + timedelta(seconds=20), "p": day + timedelta(seconds=10),
                      "d": encode(ts_us, np.array([0.0, 10.0, 20.0]))})
        conn.execute(text("INSERT INTO sample_blocks (series_id, first_ts, last_ts, ts, vals) VALUES "
                          "(:s, :f, :l, ARRAY[:f, :l]::timestamptz[], ARRAY[30.0, 40.0])"),
                     {"s": sid, "f": day + timedelta(minutes=1), "l": day + timedelta(minutes=2)})
        from service.telemetry import rollups

        rollups.ensure_partitions(conn, rollups.L5M, T0, T0 + timedelta(minutes=5))
        conn.execute(text("INSERT INTO rollup_5m (series_id, bucket, n, min, max, avg, last, first_ts, last_ts) "
                          "VALUES (:s, :b, 6, 0, 500, 250, 500, :b, :b)"), {"s": sid, "b": T0})
    return len(samples) + 3 + 2


def fleet_read(cluster: Cluster, device: str) -> list[tuple[str, str | None, list[tuple[int, float]]]]:
    out = []
    for metric in ("port_rx_bytes_total", "port_rx_errors_total"):
        with cluster.engine.connect() as conn:
            got, seen = fleet.query_series(conn=conn, topology=topology(cluster), metric=metric, device=device,
                                           start=T0 - timedelta(days=3), end=T0 + timedelta(minutes=5), raw=True)
        assert seen.missing == []
        out += sorted((r.device, r.port, list(r.points))
                      for r in got)
    return out


def fleet_all(cluster: Cluster, device: str) -> list[tuple[str, str | None, list[tuple[int, float]]]]:
    """The device's series in a fleet-wide read (no device asked: every pod read)."""
    with cluster.engine.connect() as conn:
        got, seen = fleet.query_series(conn=conn, topology=topology(cluster), metric="port_rx_bytes_total",
                                       start=T0 - timedelta(days=3), end=T0 + timedelta(minutes=5), raw=True)
    assert seen.missing == []
    return sorted((r.device, r.port, list(r.points)) for r in got if r.device == device)


def api_read(cluster: Cluster, device: str) -> Any:
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import load_settings

    settings = load_settings(database_url=cluster.control_url, auth_required=False,
                             shards=ShardSettings(urls=cluster.settings().urls, pods=PODS).model_dump())
    r = TestClient(create_app(settings)).get("/api/v1/series", params={
        "metric": "port_rx_bytes_total", "device": device, "start": (T0 - timedelta(days=3)).isoformat(),
        "end": (T0 + timedelta(minutes=5)).isoformat()})
    assert r.status_code == 200, r.text
    assert r.headers[fleet.MISSING_HEADER] == ""
    return r.json()["series"]


def killed_at(batch: int) -> Callable[[int], None]:
    """An `after_batch` callback that kills the move (KeyboardInterrupt) once the `batch`-th batch is copied."""
    done: list[int] = []

    def crash(n: int) -> None:
        done.append(n)
        if len(done) == batch:
            raise KeyboardInterrupt("killed")

    return crash


def stored_row(cluster: Cluster, pod: str) -> dict[str, Any]:
    with cluster.engine.connect() as conn:
        return dict(conn.execute(text("SELECT shard, move_to, move_cursor, leftover, moved_from FROM shard_pods "
                                      "WHERE pod = :p"), {"p": pod}).mappings().one())


def test_a_pod_moved_under_load_ends_on_the_new_shard_exactly_once(cluster: Cluster) -> None:
    """A thread stores samples of the pod through ingest_samples before, during and after the move."""
    pod, device = new_pod(cluster, "b")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    stored = history(cluster, device, "b")
    before, before_api = fleet_read(cluster, device), api_read(cluster, device)
    before_all = fleet_all(cluster, device)
    assert samples_of(b, device) == (stored, stored) and len(before) == 4 and len(before_all) == 2

    reports: list[ShardedReport] = []
    stop = threading.Event()
    failure: list[BaseException] = []

    def load() -> None:
        try:
            for i in itertools.count():
                if stop.is_set():
                    return
                t = T0_MS + 3_600_000 + i * 1000
                reports.append(ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[
                    Sample("port_rx_bytes_total", float(i), t, device, "eth0"),
                    Sample("port_rx_bytes_total", float(i), t, device, "eth1")]))
                time.sleep(0.02)
        except BaseException as exc:  # re-raised in the test's thread
            failure.append(exc)

    worker = threading.Thread(target=load)
    worker.start()
    try:
        while len(reports) < 5:
            time.sleep(0.05)
        during: list[Any] = []

        def copied(n: int) -> None:  # slow enough that writes come during the copy
            if not during:  # a fleet-wide read while the pod is on both shards sees it once
                during.append(fleet_all(cluster, device))
            time.sleep(0.3)

        report = move_pod(topology(cluster), pod, "a", batch_series=1, after_batch=copied)
        n_after_switch = len(reports)
        while len(reports) < n_after_switch + 5:
            time.sleep(0.05)
    finally:
        stop.set()
        worker.join(30)
    assert not failure, failure
    assert all(r.errors == {} for r in reports)
    dual = [r for r in reports if r.copies]
    assert dual and all(list(r.copies) == ["a"] and list(r.reports) == ["b"] for r in dual)  # during the copy
    assert list(reports[0].reports) == ["b"] and list(reports[-1].reports) == ["a"] and not reports[-1].copies
    loaded = 2 * len(reports)
    # every sample on the new shard exactly once, none on the old
    assert samples_of(a, device) == (stored + loaded, stored + loaded)
    assert samples_of(b, device) == (0, 0)
    assert _scalar(b, "SELECT count(*) FROM devices WHERE name = :d", d=device) == 0
    assert orphans(b) == 0 and orphans(a) == 0
    assert _scalar(a, "SELECT count(*) FROM rollup_5m r JOIN series s ON s.id = r.series_id JOIN devices d "
                      "ON d.id = s.device_id WHERE d.name = :d", d=device) == 1
    assert report.samples >= stored and report.extra == {} and report.removed_series == 4
    assert stored_row(cluster, pod) == {"shard": "a", "move_to": None, "move_cursor": None, "leftover": None,
                                        "moved_from": "b"}
    # fleet reads: the same history as before, now from shard a, and the load on top
    assert fleet_read(cluster, device) == before
    assert api_read(cluster, device) == before_api
    assert during == [before_all] and fleet_all(cluster, device) == before_all
    with cluster.engine.connect() as conn:
        got, _ = fleet.query_series(conn=conn, topology=topology(cluster), metric="port_rx_bytes_total",
                                    device=device, start=T0 + timedelta(hours=1), end=T0 + timedelta(hours=2),
                                    raw=True)
    assert sum(len(r.points) for r in got) == loaded


def test_the_setting_change_after_a_move_is_accepted(cluster: Cluster, caplog: pytest.LogCaptureFixture) -> None:
    pod, device = new_pod(cluster, "a")
    history(cluster, device, "a")
    move_pod(topology(cluster), pod, "b")
    apply(topology(cluster))  # the setting not updated yet: tolerated, with a warning naming the pod
    assert f"pod {pod} was moved from shard a to b" in caplog.text
    PODS["a"].remove(pod)
    PODS["b"].append(pod)
    done = apply(topology(cluster))  # updated: accepted
    assert done.pod_map[pod] == "b"
    with cluster.engine.connect() as conn:  # the fleet tables list the pod under b
        assert conn.execute(text("SELECT count(*) FROM fleet.series__b WHERE pod = :p"), {"p": pod}).scalar() == 4
    # another pod moved by the setting alone is still refused, with what to run
    other, _ = new_pod(cluster, "a")
    PODS["a"].remove(other)
    PODS["b"].append(other)
    try:
        with pytest.raises(PodMoved) as err:
            apply(topology(cluster))
        assert f"{other}: a -> b" in str(err.value) and "fabricwatch shards move" in str(err.value)
    finally:
        PODS["b"].remove(other)
        PODS["a"].append(other)


def test_an_interrupted_move_finishes_when_run_again(cluster: Cluster) -> None:
    """Killed after a batch was committed on the target and before the cursor was stored (the worst place):
    writes meanwhile go to both shards; the re-run copies on and stores nothing twice."""
    pod, device = new_pod(cluster, "b")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    stored = history(cluster, device, "b")
    before_all = fleet_all(cluster, device)
    with pytest.raises(KeyboardInterrupt):
        move_pod(topology(cluster), pod, "a", batch_series=1, after_batch=killed_at(2))
    state = stored_row(cluster, pod)
    assert state["shard"] == "b" and state["move_to"] == "a" and state["move_cursor"] > 0
    assert fleet_all(cluster, device) == before_all  # on both shards, read once
    # a write now goes to both shards
    report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[
        Sample("port_rx_bytes_total", 1.0, T0_MS + 7_200_000, device, "eth0")])
    assert list(report.copies) == ["a"] and report.reports["b"].written == 1
    status = _cli(cluster, "status")
    assert f"{pod}: moving from b to a, writes going to both" in status.stdout, status.stdout
    # a move elsewhere meanwhile is refused, naming the move in progress
    with pytest.raises(MoveError, match="is being moved to shard 'a'"):
        move_pod(topology(cluster), pod, "b")
    done = move_pod(topology(cluster), pod, "a", batch_series=1)
    assert done.resumed and done.extra == {}
    assert samples_of(a, device) == (stored + 1, stored + 1)
    assert samples_of(b, device) == (0, 0) and orphans(b) == 0
    assert stored_row(cluster, pod)["shard"] == "a"


def test_a_move_killed_while_removing_the_old_copy_finishes_when_run_again(cluster: Cluster) -> None:
    pod, device = new_pod(cluster, "b")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    stored = history(cluster, device, "b")
    before_all = fleet_all(cluster, device)

    def progress(phase: str, done: int, total: int) -> None:
        if phase == "removing the old copy" and done > 0:  # after a first batch removed
            raise KeyboardInterrupt("killed")

    with pytest.raises(KeyboardInterrupt):
        move_pod(topology(cluster), pod, "a", batch_series=1, progress=progress)
    assert stored_row(cluster, pod) | {"move_cursor": None} == {
        "shard": "a", "move_to": None, "move_cursor": None, "leftover": "b", "moved_from": "b"}
    assert samples_of(a, device) == (stored, stored) and 0 < samples_of(b, device)[0] < stored
    assert fleet_all(cluster, device) == before_all  # the old copy's rest is not read
    apply(topology(cluster))  # keeps the pod's devices on b until its copy there is removed
    assert _scalar(b, "SELECT count(*) FROM devices WHERE name = :d", d=device) == 1
    status = _cli(cluster, "status")
    assert f"{pod}: an old copy on b still to remove" in status.stdout, status.stdout
    done = move_pod(topology(cluster), pod, "a")
    assert done.source == done.target == "a" and done.removed_series > 0
    assert samples_of(b, device) == (0, 0) and orphans(b) == 0
    assert _scalar(b, "SELECT count(*) FROM devices WHERE name = :d", d=device) == 0
    assert samples_of(a, device) == (stored, stored) and stored_row(cluster, pod)["leftover"] is None


def test_an_aborted_move_leaves_the_pod_where_it_was(cluster: Cluster) -> None:
    pod, device = new_pod(cluster, "a")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    stored = history(cluster, device, "a")

    with pytest.raises(KeyboardInterrupt):
        move_pod(topology(cluster), pod, "b", batch_series=1, after_batch=killed_at(1))
    assert samples_of(b, device)[0] > 0
    assert abort_move(topology(cluster), pod) == "b"
    assert stored_row(cluster, pod) == {"shard": "a", "move_to": None, "move_cursor": None, "leftover": None,
                                        "moved_from": None}
    assert samples_of(a, device) == (stored, stored)
    assert samples_of(b, device) == (0, 0) and orphans(b) == 0
    report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[
        Sample("port_rx_bytes_total", 1.0, T0_MS + 7_200_000, device, "eth0")])
    assert list(report.reports) == ["a"] and not report.copies
    with pytest.raises(MoveError, match="is not being moved"):
        abort_move(topology(cluster), pod)


def test_a_move_whose_target_went_down_is_aborted_and_writes_go_on(cluster: Cluster) -> None:
    """The new shard lost mid-copy: the pod's writes cannot reach it; --abort needs only the control database,
    writes go to the old shard alone again, and the new shard's copy is removed once it is back."""
    from service.shards.topology import ShardsUnavailable

    pod, device = new_pod(cluster, "a")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    stored = history(cluster, device, "a")

    with pytest.raises(KeyboardInterrupt):
        move_pod(topology(cluster), pod, "b", batch_series=1, after_batch=killed_at(1))
    sample = Sample("port_rx_bytes_total", 1.0, T0_MS + 7_200_000, device, "eth0")
    cluster.shard_b.stop()
    try:
        report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[sample])
        assert list(report.errors) == ["b"] and report.reports == {}  # not stored on a without b either
        with pytest.raises(ShardsUnavailable, match="shard 'b' unreachable"):
            abort_move(topology(cluster), pod)
        assert stored_row(cluster, pod) | {"move_cursor": None} == {
            "shard": "a", "move_to": None, "move_cursor": None, "leftover": "b", "moved_from": None}
        report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[sample])
        assert report.errors == {} and report.reports["a"].written == 1 and not report.copies
    finally:
        cluster.shard_b.start()
    assert abort_move(topology(cluster), pod) == "b"
    assert samples_of(b, device) == (0, 0) and orphans(b) == 0
    assert samples_of(a, device) == (stored + 1, stored + 1)
    assert stored_row(cluster, pod)["leftover"] is None


HOUR_MS = 3_600_000
DAY_MS = 24 * HOUR_MS


def detection_day(cluster: Cluster) -> int:
    """A midnight after every other test's samples and every detection cycle run so far on either shard: the
    first day of a test's own cycles (which must come after each shard's last one, whatever the tests' order)."""
    last = max([T0_MS + 9 * DAY_MS] + [_scalar(url, "SELECT coalesce(max(last_cycle_ms), 0) FROM detector_state")
                                       for url in (cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard"))])
    return (last // DAY_MS + 1) * DAY_MS


def degrading_optic(cluster: Cluster, device: str, d0_ms: int, hours: int) -> None:
    """Every 10 minutes for `hours` from d0: eth0's module up and lit, its rx falling 1.5 dB a day."""
    samples = []
    for t in range(d0_ms + 600_000, d0_ms + hours * HOUR_MS + 1, 600_000):
        days = (t - d0_ms) / DAY_MS
        wobble = 0.01 * ((t // 600_000) % 3 - 1)
        samples += [Sample("optic_rx_power_dbm", -3.0 - 1.5 * days + wobble, t, device, "eth0", lane=0),
                    Sample("optic_tx_power_dbm", -1.0, t, device, "eth0", lane=0),
                    Sample("optic_temperature_celsius", 45.0, t, device, "eth0"),
                    Sample("port_oper_up", 1.0, t, device, "eth0"), Sample("port_admin_up", 1.0, t, device, "eth0")]
    report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=samples)
    assert report.errors == {}


def rx_state(url: str, port_id: int) -> dict[str, Any] | None:
    """What a shard's stored detector state (read as stored, not through the engine) holds of a port's lane 0:
    its rx baseline, trend buckets (bucket -> mean), slope (None: none yet) and newest reading; None: nothing of
    that port."""
    with Archive(bytes(_scalar(url, "SELECT blob FROM detector_state WHERE name = 'default'"))) as z:
        ids = z["port_ids"].tolist()
        if port_id not in ids:
            return None
        lane = int(z["lane_off"][ids.index(port_id)])
        t, buf = z["t|rx|t"], z["t|rx|buf"][lane]
        return {"base_n": int(z["b|rx|n"][lane]), "base_loc": float(z["b|rx|loc"][lane]),
                "buckets": {int(t[k]) // (2 * HOUR_MS): float(buf[k]) for k in range(len(t))
                            if t[k] >= 0 and np.isfinite(buf[k])},
                "slope": float(z["lt|rx_slope"][lane]) if np.isfinite(z["lt|rx_slope"][lane]) else None,
                "last_ts": int(z["g|optic_rx_power_dbm|last_ts"][lane])}


def test_a_moved_pods_detection_state_goes_with_it(cluster: Cluster) -> None:
    """A transmitter wearing out for 30 hours on shard a: its rx trend and baseline are on a's detector state.
    Moved to b, they are on b's (merged with b's own, whose cycles ran one step further) and no longer on a's, and
    b's next cycles go on with them: no warm-up, the same slope."""
    pod, device = new_pod(cluster, "a", optic=True)
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    port = _scalar(cluster.control_url, "SELECT p.id FROM ports p JOIN devices d ON d.id = p.device_id "
                                        "WHERE d.name = :d AND p.name = 'eth0'", d=device)
    d0 = detection_day(cluster)
    degrading_optic(cluster, device, d0, 34)
    for h in range(1, 31):
        run_shard_cycle(topology(cluster), "a", d0 + h * HOUR_MS)
        run_shard_cycle(topology(cluster), "b", d0 + h * HOUR_MS)
    run_shard_cycle(topology(cluster), "b", d0 + 31 * HOUR_MS)  # b's watermark past a's
    before = rx_state(a, port)
    assert before is not None and rx_state(b, port) is None
    assert before["base_n"] >= 15 and len(before["buckets"]) >= 12, before
    assert before["slope"] * 24 == pytest.approx(-1.5, abs=0.2)  # kept per hour: -1.5 dB a day

    report = move_pod(topology(cluster), pod, "b")
    assert report.carried_ports == 2  # eth0 and eth1
    assert rx_state(a, port) is None  # gone from the old shard with its samples
    moved = rx_state(b, port)
    assert moved is not None
    # the readings of 30h-31h that b's state had read past and a's had not were read on b, none skipped
    assert before["last_ts"] == d0 + 29 * HOUR_MS + 50 * 60_000
    assert moved.pop("last_ts") == d0 + 30 * HOUR_MS + 50 * 60_000
    assert moved == {k: v for k, v in before.items() if k != "last_ts"}

    for h in (32, 33, 34):
        run_shard_cycle(topology(cluster), "b", d0 + h * HOUR_MS)
    after = rx_state(b, port)
    assert after is not None and after["base_n"] >= before["base_n"]  # not learned again from nothing
    with cluster.engine.connect() as conn:
        found = {int(r.at.timestamp() * 1000): r.ttt for r in conn.execute(text(
            "SELECT at, (payload->>'ttt_hours')::float ttt FROM detection_findings WHERE kind = "
            "'optical_degradation' AND state = 'firing' AND payload->>'device' = :d"), {"d": device})}
    # the trend's finding goes on from b's first cycle (no warm-up), its lead time counting down from a's
    assert [h for h in (30, 32, 33, 34) if d0 + h * HOUR_MS in found] == [30, 32, 33, 34], sorted(found)
    assert 0 < found[d0 + 34 * HOUR_MS] < found[d0 + 30 * HOUR_MS]
    assert {k: after["buckets"][k] for k in before["buckets"]} == before["buckets"]  # the same history
    assert len(after["buckets"]) > len(before["buckets"])  # and the buckets since
    assert after["slope"] * 24 == pytest.approx(-1.5, abs=0.2)
    assert rx_state(a, port) is None


def test_a_move_killed_after_carrying_detection_state_is_aborted_or_run_again(cluster: Cluster) -> None:
    """Killed after the pod's detection state was committed on the new shard and before the switch: the cycle
    locks are released, the old shard keeps detecting the pod; --abort removes the carried state from the new
    shard, and a move run again carries the old shard's newer state."""
    pod, device = new_pod(cluster, "a", optic=True)
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    port = _scalar(cluster.control_url, "SELECT p.id FROM ports p JOIN devices d ON d.id = p.device_id "
                                        "WHERE d.name = :d AND p.name = 'eth0'", d=device)
    d0 = detection_day(cluster)
    degrading_optic(cluster, device, d0, 6)

    def cycles(*hours: int, shards: tuple[str, ...] = ("a", "b")) -> None:
        for h in hours:
            for shard in shards:
                run_shard_cycle(topology(cluster), shard, d0 + h * HOUR_MS)

    def killed(phase: str, done: int, total: int) -> None:
        if phase == "carrying detection state" and done == 1:
            raise KeyboardInterrupt("killed")

    cycles(1, 2, 3)
    with pytest.raises(KeyboardInterrupt):
        move_pod(topology(cluster), pod, "b", progress=killed)
    assert stored_row(cluster, pod) | {"move_cursor": None} == {
        "shard": "a", "move_to": "b", "move_cursor": None, "leftover": None, "moved_from": None}
    carried = rx_state(b, port)
    assert carried is not None and carried == rx_state(a, port)
    cycles(4, shards=("a",))  # not waiting on the killed move's locks, and going on with the pod
    now = rx_state(a, port)
    assert now is not None and now["last_ts"] == d0 + 3 * HOUR_MS + 50 * 60_000
    assert abort_move(topology(cluster), pod) == "b"
    assert rx_state(b, port) is None and rx_state(a, port) is not None
    cycles(4, shards=("b",))
    cycles(5)
    report = move_pod(topology(cluster), pod, "b")
    assert report.carried_ports == 2
    moved = rx_state(b, port)
    assert moved is not None and moved["last_ts"] == d0 + 4 * HOUR_MS + 50 * 60_000  # a's last cycle's
    assert rx_state(a, port) is None


def _cli(cluster: Cluster, *args: str) -> subprocess.CompletedProcess[str]:
    import os
    import sys

    from tests.paths import REPO

    env = {"FABRICWATCH_DATABASE_URL": cluster.control_url, "FABRICWATCH_SHARDS_URLS": json.dumps(
        cluster.settings().urls), "FABRICWATCH_SHARDS_PODS": json.dumps(PODS),
        "FABRICWATCH_SHARDS_CONNECT_TIMEOUT_S": "2"}
    return subprocess.run([sys.executable, "-m", "service.cli", "shards", *args], capture_output=True, text=True,
                          env={**os.environ, **env}, cwd=REPO, timeout=120)


def test_an_unknown_pod_or_shard_is_refused_by_name(cluster: Cluster) -> None:
    pod, _ = new_pod(cluster, "a")
    with pytest.raises(UnknownShard, match=r"unknown shard 'z' \(shards: a, b\)"):
        move_pod(topology(cluster), pod, "z")
    done = _cli(cluster, "move", "nosuchpod", "--to", "b")
    assert done.returncode == 1 and "unknown pod 'nosuchpod'" in done.stderr and "nothing changed" in done.stderr
    assert "Traceback" not in done.stderr
    done = _cli(cluster, "move", pod, "--to", "z")
    assert done.returncode == 1 and "unknown shard 'z' (shards: a, b)" in done.stderr, done.stderr
    done = _cli(cluster, "move", pod, "--to", "a")
    assert done.returncode == 1 and f"pod {pod} is on shard 'a' already" in done.stderr, done.stderr
    assert stored_row(cluster, pod)["move_to"] is None


def test_a_move_to_a_down_shard_fails_and_changes_nothing(cluster: Cluster) -> None:
    pod, device = new_pod(cluster, "a")
    a = cluster.shard_a.url("fw_shard")
    stored = history(cluster, device, "a")
    before = stored_row(cluster, pod)
    cluster.shard_b.stop()
    try:
        done = _cli(cluster, "move", pod, "--to", "b")
        assert done.returncode == 1, done.stdout + done.stderr
        assert "shard 'b' unreachable:" in done.stderr and "nothing changed" in done.stderr, done.stderr
        assert "Traceback" not in done.stderr
        with pytest.raises(MoveError, match="nothing changed"):
            move_pod(topology(cluster), pod, "b")
        assert stored_row(cluster, pod) == before
        # writes still go to shard a alone
        report = ingest_samples(control=cluster.engine, topology=topology(cluster), samples=[
            Sample("port_rx_bytes_total", 1.0, T0_MS + 7_200_000, device, "eth0")])
        assert list(report.reports) == ["a"] and not report.copies and report.errors == {}
    finally:
        cluster.shard_b.start()
    assert samples_of(a, device) == (stored + 1, stored + 1)
    # and once b is back the CLI moves it, with its summary
    done = _cli(cluster, "move", pod, "--to", "b")
    assert done.returncode == 0, done.stderr
    assert f"{pod}: moved from a to b:" in done.stdout and "4 series removed from a" in done.stdout, done.stdout
    assert samples_of(cluster.shard_b.url("fw_shard"), device) == (stored + 1, stored + 1)
    assert samples_of(a, device) == (0, 0)


def test_remote_write_and_exporter_scrapes_store_on_the_devices_shard(cluster: Cluster) -> None:
    """A remote write naming devices of two shards stores each on its own; a collection whose samples name
    another device than its endpoint's (an exporter scrape: gnmic's source, dcgm-exporter's Hostname) too."""
    import cramjam
    from fastapi.testclient import TestClient

    from service.api.app import create_app
    from service.config import load_settings
    from service.telemetry import remote_write as rw
    from service.telemetry.remote_write_pb2 import WriteRequest

    pod_b, dev_b = new_pod(cluster, "b")
    pod_a, dev_a = new_pod(cluster, "a")
    a, b = cluster.shard_a.url("fw_shard"), cluster.shard_b.url("fw_shard")
    rw.MAPPER.forget()
    req = WriteRequest()
    for dev, value in ((dev_b, 7.0), (dev_a, 9.0)):
        ts = req.timeseries.add()
        for k, v in sorted({"__name__": "ifHCInOctets", "ifName": "eth0", "ifIndex": "1", "instance": dev}.items()):
            ts.labels.add(name=k, value=v)
        ts.samples.add(timestamp=T0_MS, value=value)
    settings = load_settings(database_url=cluster.control_url, auth_required=False,
                             shards=ShardSettings(urls=cluster.settings().urls, pods=PODS).model_dump())
    r = TestClient(create_app(settings)).post(
        "/api/v1/write", content=bytes(cramjam.snappy.compress_raw(req.SerializeToString())),
        headers={"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy"})
    assert r.status_code == 204, r.text
    assert r.headers["x-fabricwatch-written"] == "2", dict(r.headers)
    assert samples_of(b, dev_b) == (1, 1) and samples_of(a, dev_b) == (0, 0)
    assert samples_of(a, dev_a) == (1, 1) and samples_of(b, dev_a) == (0, 0)
    assert _scalar(cluster.control_url, "SELECT count(*) FROM sample_rows") == 0
    # a collection of dev_a's endpoint whose samples name dev_b too
    from collectors.base import CollectResult
    from collectors.spool import PendingStore
    from collectors.tasks import store_collection

    with cluster.engine.begin() as conn:
        dev = conn.execute(text("SELECT id FROM devices WHERE name = :n"), {"n": dev_a}).scalar_one()
        ep = conn.execute(text("INSERT INTO endpoints (device_id, protocol, address, config) "
                               "VALUES (:d, 'scrape', '127.0.0.1', '{}') RETURNING id"), {"d": dev}).scalar_one()
    result = CollectResult(target=f"{dev_a}/scrape", samples=[
        Sample("port_tx_bytes_total", 5.0, T0_MS, d, "eth1") for d in (dev_a, dev_b)])
    report = store_collection(cluster.engine, PendingStore(ep, dev, "scrape", ["counters"], T0_MS, result),
                              settings=settings)
    assert report.written == 2 and report.rejected == 0
    assert samples_of(b, dev_b) == (2, 2) and samples_of(a, dev_a) == (2, 2)
