"""The sharded import (service/shards/ingest.py `import_exposition`) against the single-server import of the
same exposition, on real servers (a control database, two shards, and a single-server database on the control
server): each shard stores exactly the single-server import's samples of its pods' devices, a pod being moved
on both of its shards; the reports agree line for line; a bad line is refused naming the line the single-server
import names, with nothing stored anywhere; a down shard refuses the import; and the lines reach the shards'
Ingestors as blocks, not one by one (issue #20: the sharded import cost 3.2x the CPU per sample)."""

from __future__ import annotations

from collections.abc import Iterator
from datetime import UTC, datetime
from typing import Any

import pytest
from sqlalchemy import Engine, text
from sqlalchemy.exc import OperationalError

from service.db import get_engine, session_scope
from service.inventory.models import Device, Pod, Port
from service.migrate import upgrade
from service.shards.ingest import import_exposition
from service.shards.rebalance import move_pod
from service.shards.setup import apply
from service.shards.topology import ShardSettings, Topology
from service.telemetry.ingest import Ingestor, IngestReport
from service.telemetry.promtext import PromParseError
from service.telemetry.service import import_prometheus
from tests.shards.conftest import LAYOUT, Cluster, load_inventory

pytestmark = pytest.mark.timeout(300)

T0_MS = int(datetime(2026, 11, 30, 12, 0, tzinfo=UTC).timestamp() * 1000)
DEFAULT_TS_MS = T0_MS + 86_400_000  # lines without a timestamp
PODS = {"a": list(LAYOUT["a"]), "b": [*LAYOUT["b"], "mv"]}  # mv: moved from b to a during the imports
ON_A = {"leaf1", "spine1", "mvdev"}  # spine1 has no pod: the default shard; mvdev: the move's copy
ON_B = {"leaf2", "host3", "mvdev"}
CHUNK = 64 << 10  # as a body arrives: blocks of 1 MiB (Arrow), then 2 MiB, ... and a small last one


class _Stop(Exception):
    pass


def _stop_at_copy(phase: str, done: int, total: int) -> None:
    if phase == "copying":  # the move is marked (writes go to both shards) and nothing is copied yet
        raise _Stop


@pytest.fixture(scope="module")
def setup(cluster: Cluster) -> dict[str, Any]:
    with session_scope(cluster.engine) as s:
        s.add(Pod(name="mv"))
        s.add(Device(name="mvdev", kind="switch", role="leaf", pod="mv", gpus=0,
                     ports=[Port(name="eth0"), Port(name="eth1")]))
    topology = Topology.of(cluster.control_url, ShardSettings(urls=cluster.settings().urls, pods=PODS))
    apply(topology)
    with pytest.raises(_Stop):
        move_pod(topology, "mv", "a", progress=_stop_at_copy)
    with cluster.engine.connect() as conn:
        assert conn.execute(text("SELECT shard, move_to FROM shard_pods WHERE pod = 'mv'")).one() == ("b", "a")
    single_url = cluster.control.create_database("fw_single")
    upgrade(single_url)
    single = get_engine(single_url)
    load_inventory(single)
    with session_scope(single) as s:
        s.add(Pod(name="mv"))
        s.add(Device(name="mvdev", kind="switch", role="leaf", pod="mv", gpus=0,
                     ports=[Port(name="eth0"), Port(name="eth1")]))
    return {"topology": topology, "single": single, "a": get_engine(cluster.shard_a.url("fw_shard")),
            "b": get_engine(cluster.shard_b.url("fw_shard"))}


def _series(metric: str, device: str, port: str, extra: str = "") -> str:
    return f'{metric}{{device="{device}",port="{port}"{extra}}}'


def _body(metric: str, t0: int) -> bytes:
    """About 3.2 MB: clean lines (an Arrow block, split across the shards), then a comment and lines without a
    timestamp (that block goes line by line), then clean lines with series new to the stream (a small block,
    split in Python). A refused series (lane not an integer) in the first and the last part, an unknown device
    and an unknown port throughout."""
    first = [_series(metric, d, "eth0") for d in ("leaf1", "leaf2", "host3", "spine1", "mvdev", "nosuchdevice")]
    first += [_series(metric, "host3", "eth9"), _series(metric, "leaf2", "eth0", ',lane="x"')]
    later = [*first, _series(metric, "spine1", "eth1"), _series(metric, "mvdev", "eth1"),
             _series(metric, "leaf1", "eth1")]
    out: list[str] = []
    size = 0
    t = 0
    while size < 1_100_000:  # the first block, and the start of the second
        lines = [f"{s} {t * 7 + i} {t0 + t * 10_000}\n" for i, s in enumerate(first)]
        out += lines
        size += sum(map(len, lines))
        t += 1
    out.append("# TYPE a comment: the block that holds it goes line by line\n")
    out += [f"{s} {i}.5\n" for i, s in enumerate(first[:5])]  # at DEFAULT_TS_MS
    while size < 3_250_000:
        lines = [f"{s} {t * 7 + i} {t0 + t * 10_000}\n" for i, s in enumerate(later)]
        out += lines
        size += sum(map(len, lines))
        t += 1
    return "".join(out).encode()


def _chunks(body: bytes) -> Iterator[bytes]:
    return (body[i:i + CHUNK] for i in range(0, len(body), CHUNK))


def _stored(engine: Engine, metric: str) -> set[tuple[str, str, str | None, int, float]]:
    """(device, port, lane, ts_ms, value) of every sample of the metric: rows and import blocks."""
    sql = """
    WITH x AS (
      SELECT series_id, ts, value FROM sample_rows
      UNION ALL SELECT b.series_id, u.ts, u.v FROM sample_blocks b, unnest(b.ts, b.vals) u(ts, v))
    SELECT d.name, p.name, s.lane, (extract(epoch FROM x.ts) * 1000)::bigint, x.value
    FROM x JOIN series s ON s.id = x.series_id JOIN devices d ON d.id = s.device_id
    LEFT JOIN ports p ON p.id = s.port_id WHERE s.metric = :m"""
    with engine.connect() as conn:
        return {tuple(r) for r in conn.execute(text(sql), {"m": metric})}  # type: ignore[misc]


def _sharded(cluster: Cluster, setup: dict[str, Any], body: bytes) -> tuple[IngestReport, dict[str, IngestReport]]:
    return import_exposition(control=cluster.engine, topology=setup["topology"], chunks=_chunks(body),
                             source="body", default_ts_ms=DEFAULT_TS_MS)


def _single(setup: dict[str, Any], body: bytes) -> IngestReport:
    return import_prometheus(engine=setup["single"], chunks=_chunks(body), source="body",
                             default_ts_ms=DEFAULT_TS_MS)


def test_each_shard_stores_what_the_single_server_import_stores_of_its_devices(cluster: Cluster,
                                                                              setup: dict[str, Any]) -> None:
    metric = "port_rx_bytes_total"
    body = _body(metric, T0_MS)
    want = _single(setup, body)
    got, per_shard = _sharded(cluster, setup, body)
    assert got.to_dict() == want.to_dict()
    assert want.written > 30_000 and set(want.unknown_devices) == {"nosuchdevice"}
    assert len(want.invalid) > 1000 and want.unknown_ports  # refused lines, each named by its line number
    # the pods' own shards: the merged report; the move's copy is not counted twice
    assert sorted(per_shard) == ["a", "b"] and got.written == per_shard["a"].written + per_shard["b"].written
    single = _stored(setup["single"], metric)
    a, b = _stored(setup["a"], metric), _stored(setup["b"], metric)
    assert {s[0] for s in single} == ON_A | ON_B
    assert a == {s for s in single if s[0] in ON_A}
    assert b == {s for s in single if s[0] in ON_B}
    assert any(s[3] == DEFAULT_TS_MS for s in a) and any(s[3] == DEFAULT_TS_MS for s in b)  # the line path's
    # the same again stores nothing new anywhere, as on one server
    again, _ = _sharded(cluster, setup, body)
    assert again.written == 0 and again.duplicates == want.written
    assert (_stored(setup["a"], metric), _stored(setup["b"], metric)) == (a, b)


def _bad_bodies(metric: str) -> dict[str, bytes]:
    clean = _body(metric, T0_MS + 3_600_000)
    tail = f"{_series(metric, 'leaf2', 'eth0')} 1 {T0_MS}\n".encode()
    return {
        # a malformed line at the end, after every kind of block
        "malformed": clean + f'{_series(metric, "leaf1", "eth0")[:-1]} 1 {T0_MS}\n'.encode(),
        # timestamps in seconds on a shard-b line, then on shard-a lines: the first is named
        "seconds in a block": (f"{_series(metric, 'leaf1', 'eth0')} 1 {T0_MS}\n"
                               f"{_series(metric, 'host3', 'eth0')} 1 {T0_MS // 1000}\n"
                               f"{_series(metric, 'leaf1', 'eth0')} 1 {T0_MS // 1000}\n").encode() + tail,
        # on a line of a block read line by line, before a malformed line: the timestamp is named
        "seconds on a line": (f"# comment\n{_series(metric, 'spine1', 'eth0')} 1 {T0_MS}\n"
                              f"{_series(metric, 'mvdev', 'eth0')} 2 {T0_MS // 1000}\n"
                              f"{_series(metric, 'leaf1', 'eth0')} 2 {T0_MS}\nbroken{{\n").encode(),
        # every sample refused
        "nothing stored": f'{_series(metric, "ghost", "x")} 1 {T0_MS}\n'.encode(),
    }


def test_a_bad_line_is_refused_as_on_one_server_and_nothing_is_stored(cluster: Cluster,
                                                                      setup: dict[str, Any]) -> None:
    metric = "port_tx_bytes_total"
    for name, body in _bad_bodies(metric).items():
        with pytest.raises(PromParseError) as single:
            _single(setup, body)
        with pytest.raises(PromParseError) as sharded:
            _sharded(cluster, setup, body)
        assert type(sharded.value) is type(single.value), name
        assert (sharded.value.line, str(sharded.value)) == (single.value.line, str(single.value)), name
        for engine in ("single", "a", "b"):
            assert _stored(setup[engine], metric) == set(), (name, engine)


def test_the_lines_reach_each_shard_as_blocks(cluster: Cluster, setup: dict[str, Any],
                                              monkeypatch: pytest.MonkeyPatch) -> None:
    calls = {"add_prom_sample": 0, "add_prom_block": 0}

    def counted(name: str) -> Any:
        real = getattr(Ingestor, name)

        def wrapper(self: Ingestor, *args: Any, **kwargs: Any) -> Any:
            calls[name] += 1
            return real(self, *args, **kwargs)
        return wrapper

    for name in calls:
        if hasattr(Ingestor, name):
            monkeypatch.setattr(Ingestor, name, counted(name))
    metric = "port_rx_packets_total"
    body = "".join(f"{_series(metric, d, 'eth0')} {t} {T0_MS + t * 10_000}\n"
                   for t in range(500) for d in ("leaf1", "leaf2", "mvdev")).encode()
    report, per_shard = _sharded(cluster, setup, body)
    assert report.written == 1500 and (per_shard["a"].written, per_shard["b"].written) == (500, 1000)
    # one block: to shard b (leaf2, mvdev), to shard a (leaf1) and to a again (mvdev's copy); no line alone
    assert calls == {"add_prom_sample": 0, "add_prom_block": 3}


def test_a_down_shard_refuses_the_import_and_nothing_is_stored(cluster: Cluster, setup: dict[str, Any]) -> None:
    metric = "port_tx_packets_total"
    body = "".join(f"{_series(metric, d, 'eth0')} {t} {T0_MS + t * 10_000}\n"
                   for t in range(20) for d in ("leaf1", "leaf2")).encode()
    cluster.shard_b.stop()
    try:
        with pytest.raises(OperationalError):
            _sharded(cluster, setup, body)
        # a body for shard a alone is stored all the same (each shard is reached when it has samples)
        report, per_shard = _sharded(cluster, setup, body.replace(b'"leaf2"', b'"spine1"'))
        assert report.written == 40 and list(per_shard) == ["a"]
    finally:
        cluster.shard_b.start()
        setup["b"].dispose()  # its pooled connections died with the server
    assert {s[0] for s in _stored(setup["a"], metric)} == {"leaf1", "spine1"}
    assert _stored(setup["b"], metric) == set()
