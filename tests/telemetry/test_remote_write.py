"""POST /api/v1/write: Prometheus remote write 1.0 through the real API into the real PostgreSQL.

Requests are built with the generated protobuf classes and cramjam's snappy, as Prometheus builds
them; tests/telemetry/test_remote_write_live.py has a real Prometheus sending.
"""

from __future__ import annotations

import os
from collections.abc import Iterator

import cramjam
import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from service.api.app import create_app
from service.auth.service import create_token
from service.config import load_settings
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.telemetry import remote_write as rw
from service.telemetry.remote_write_pb2 import Sample, WriteRequest

TS = 1_796_040_000_000
HEADERS = {"Content-Type": "application/x-protobuf", "Content-Encoding": "snappy",
           "X-Prometheus-Remote-Write-Version": "0.1.0"}
INVENTORY = {"devices": [
    {"name": "gpu-a01", "kind": "host", "role": "host", "mgmt_address": "10.0.1.1", "gpus": 8,
     "ports": [{"name": "eth0", "nic": "mlx5_0", "optic": {"type": "400G-DR4"}}, {"name": "eth1", "nic": "mlx5_1"}]},
    {"name": "leaf1", "kind": "switch", "role": "leaf", "mgmt_address": "10.0.0.2", "ports": [{"name": "Ethernet1/1"}]},
]}


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate(INVENTORY))
        session.commit()
    rw.MAPPER.forget()  # the database was emptied and refilled under the process-wide mapper
    settings = load_settings(auth_required=False, database_url=db_url, max_body_bytes=8 * 1024 * 1024)
    yield TestClient(create_app(settings))


def request(*series: tuple[dict[str, str], list[tuple[int, float]]]) -> WriteRequest:
    req = WriteRequest()
    for labels, samples in series:
        ts = req.timeseries.add()
        for k in sorted(labels):
            ts.labels.add(name=k, value=labels[k])
        for t, v in samples:
            ts.samples.add(timestamp=t, value=v)
    return req


def body(req: WriteRequest | bytes) -> bytes:
    raw = req if isinstance(req, bytes) else req.SerializeToString()
    return bytes(cramjam.snappy.compress_raw(raw))


def _count(db: Engine, sql: str = "SELECT count(*) FROM samples") -> int:
    with db.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def _stored(db: Engine) -> set[tuple]:
    with db.connect() as conn:
        return set(conn.execute(text(
            "SELECT s.metric, d.name, p.name, s.lane, s.priority, s.gpu, (extract(epoch FROM x.ts) * 1000)::bigint, "
            "x.value FROM samples x JOIN series s ON s.id = x.series_id JOIN devices d ON d.id = s.device_id "
            "LEFT JOIN ports p ON p.id = s.port_id")).all())


NODE = {"instance": "10.0.1.1:9100", "job": "node"}


def test_mapped_series_are_stored_the_rest_counted(client: TestClient, db: Engine) -> None:
    req = request(
        ({"__name__": "node_network_receive_bytes_total", "device": "eth1", **NODE}, [(TS, 10.0), (TS + 15_000, 25.0)]),
        ({"__name__": "node_infiniband_port_transmit_wait_total", "device": "mlx5_0", "port": "1", **NODE},
         [(TS, 7.0)]),
        ({"__name__": "DCGM_FI_DEV_GPU_TEMP", "gpu": "3", "Hostname": "gpu-a01", "instance": "10.244.1.7:9400"},
         [(TS, 41.0)]),
        ({"__name__": "ifHCInOctets", "ifName": "Ethernet1/1", "ifIndex": "1", "instance": "10.0.0.2"}, [(TS, 99.0)]),
        ({"__name__": "node_cpu_seconds_total", "cpu": "0", "mode": "idle", **NODE}, [(TS, 1.0)]),
        ({"__name__": "node_network_receive_bytes_total", "device": "docker0", **NODE}, [(TS, 1.0)]),
        ({"__name__": "up", "instance": "10.9.9.9:9100", "job": "node"}, [(TS, 1.0)]),
    )
    r = client.post("/api/v1/write", content=body(req), headers=HEADERS)
    assert r.status_code == 204, r.text
    assert r.content == b""
    assert r.headers["x-fabricwatch-written"] == "5" and r.headers["x-fabricwatch-samples"] == "8"
    assert r.headers["x-fabricwatch-unmapped"] == "unknown_port=1, unmapped_metric=2"
    assert _stored(db) == {
        ("port_rx_bytes_total", "gpu-a01", "eth1", None, None, None, TS, 10.0),
        ("port_rx_bytes_total", "gpu-a01", "eth1", None, None, None, TS + 15_000, 25.0),
        ("port_xmit_wait_ticks_total", "gpu-a01", "eth0", None, None, None, TS, 7.0),
        ("gpu_temperature_celsius", "gpu-a01", None, None, None, 3, TS, 41.0),
        ("port_rx_bytes_total", "leaf1", "Ethernet1/1", None, None, None, TS, 99.0),
    }
    # counter widths reach the series: the IB PMA counter is 32-bit and saturates, ifHC* 64-bit
    assert _count(db, "SELECT count(*) FROM series WHERE metric = 'port_xmit_wait_ticks_total' "
                      "AND counter_bits = 32 AND saturating") == 1
    status = client.get("/api/v1/write/status").json()
    assert status["unmapped"]["unmapped_metric"] >= 2
    assert status["unmapped_detail"]["unknown_port"]["gpu-a01:docker0"] >= 1
    metrics = client.get("/metrics").text
    assert 'fabricwatch_remote_write_samples_total{outcome="unknown_port"}' in metrics
    # Prometheus resends after a timeout: nothing new, not an error
    r = client.post("/api/v1/write", content=body(req), headers=HEADERS)
    assert r.status_code == 204 and r.headers["x-fabricwatch-duplicates"] == "5"
    assert _count(db) == 5
    # the next scrape: series with a counter width, now known, take the block way and keep their width
    nxt = request(({"__name__": "node_infiniband_port_transmit_wait_total", "device": "mlx5_0", "port": "1",
                    **NODE}, [(TS + 30_000, 9.0)]),
                  ({"__name__": "ifHCInOctets", "ifName": "Ethernet1/1", "ifIndex": "1", "instance": "10.0.0.2"},
                   [(TS + 30_000, 150.0)]))
    assert client.post("/api/v1/write", content=body(nxt), headers=HEADERS).headers["x-fabricwatch-written"] == "2"
    assert _count(db, "SELECT count(*) FROM series") == 4
    assert _count(db, "SELECT count(*) FROM series WHERE (metric, counter_bits, saturating) IN "
                      "(('port_xmit_wait_ticks_total', 32, true), ('port_rx_bytes_total', 64, false))") == 2


def _refused(client: TestClient, db: Engine, content: bytes, headers: dict[str, str], status: int) -> str:
    r = client.post("/api/v1/write", content=content, headers=headers)
    assert r.status_code == status, r.text
    assert r.headers["content-type"] == "application/problem+json"
    assert _count(db) == 0 and _count(db, "SELECT count(*) FROM series") == 0
    return r.json()["detail"]


GOOD = request(({"__name__": "node_network_up", "device": "eth0", **NODE}, [(TS, 1.0)]))


def test_bad_input_is_a_clear_4xx_and_nothing_is_written(client: TestClient, db: Engine) -> None:
    good = body(GOOD)
    # corrupt snappy: a valid length header, then garbage
    detail = _refused(client, db, good[:3] + b"\xff" * 40, HEADERS, 400)
    assert detail.startswith("snappy:")
    # gzip, or an uncompressed protobuf
    assert "Content-Encoding" in _refused(client, db, good, {**HEADERS, "Content-Encoding": "gzip"}, 415)
    assert "snappy" in _refused(client, db, GOOD.SerializeToString(), {**HEADERS, "Content-Encoding": ""}, 415)
    # wrong content type: the text exposition sent here
    assert "application/x-protobuf" in _refused(client, db, good, {**HEADERS, "Content-Type": "text/plain"}, 415)
    # remote write 2.0
    detail = _refused(client, db, good, {**HEADERS, "Content-Type":
                                         "application/x-protobuf;proto=io.prometheus.write.v2.Request"}, 415)
    assert "protobuf_message: prometheus.WriteRequest" in detail
    # a protobuf of another message: a bare Sample (field 1 a double) is no WriteRequest
    detail = _refused(client, db, body(Sample(value=1.0, timestamp=TS)), HEADERS, 400)
    assert "not a Prometheus remote-write 1.0 WriteRequest: the request has field 1 (64-bit)" in detail
    # a remote-write 2.0 Request (symbols: field 4, timeseries: field 5) sent as 1.0
    rw2 = b"\x22\x08__name__" + b"\x2a\x04\x0a\x02\x00\x01"
    assert "has field 4" in _refused(client, db, body(rw2), HEADERS, 400)
    # the usual layout, but a label with a field Label does not have (read as columns, checked when decoded)
    sample = Sample(value=1.0, timestamp=TS).SerializeToString()
    label = b"\x0a\x08__name__\x12\x0fnode_network_up" + b"\x18\x01"
    series = b"\x0a" + bytes([len(label)]) + label + b"\x12" + bytes([len(sample)]) + sample
    assert "a label has field 3" in _refused(client, db, body(b"\x0a" + bytes([len(series)]) + series), HEADERS, 400)
    # not protobuf at all
    assert _refused(client, db, body(b"\xff\xff\xff\xff"), HEADERS, 400).startswith("protobuf:")
    # a timestamp in seconds, a series without a name
    sec = request(({"__name__": "node_network_up", "device": "eth0", **NODE}, [(TS // 1000, 1.0)]))
    assert "looks like seconds" in _refused(client, db, body(sec), HEADERS, 400)
    assert "without __name__" in _refused(client, db, body(request(({"device": "eth0"}, [(TS, 1.0)]))), HEADERS, 400)


def test_a_100_mb_write_is_refused_before_it_is_read(client: TestClient, db: Engine) -> None:
    big = WriteRequest()
    for i in range(400_000):  # ~100 MB of series, 250 bytes each
        ts = big.timeseries.add()
        ts.labels.add(name="__name__", value="node_network_receive_bytes_total")
        ts.labels.add(name="device", value=f"eth{i}" + "x" * 150)
        ts.labels.add(name="instance", value="10.0.1.1:9100")
        ts.samples.add(timestamp=TS, value=float(i))
    raw = big.SerializeToString()
    assert len(raw) >= 100_000_000
    # compressed it is small enough for the body limit; it says how large it is, and that is refused
    detail = _refused(client, db, body(raw), HEADERS, 413)
    assert "exceeds the limit of 8388608 bytes" in detail
    # and a body over the limit as sent
    assert "exceeds the limit of 8388608 bytes" in _refused(client, db, os.urandom(9 << 20), HEADERS, 413)


def test_the_store_away_is_a_5xx_the_sender_retries(db: Engine) -> None:
    rw.MAPPER.forget()
    settings = load_settings(auth_required=False, database_url="postgresql://postgres@127.0.0.1:1/none")
    r = TestClient(create_app(settings)).post("/api/v1/write", content=body(GOOD), headers=HEADERS)
    assert r.status_code == 503, r.text
    assert r.headers.get("retry-after")


def test_it_needs_a_token_with_the_ingest_scope(db: Engine, db_url: str) -> None:
    client = TestClient(create_app(load_settings(database_url=db_url)))
    with db.begin() as conn:
        read = create_token(conn, name="r", scopes=["read"])
        ingest = create_token(conn, name="i", scopes=["ingest"])
    assert client.post("/api/v1/write", content=body(GOOD), headers=HEADERS).status_code == 401
    auth = {**HEADERS, "Authorization": f"Bearer {read}"}
    assert client.post("/api/v1/write", content=body(GOOD), headers=auth).status_code == 403
    rw.MAPPER.forget()
    auth = {**HEADERS, "Authorization": f"Bearer {ingest}"}
    assert client.post("/api/v1/write", content=body(GOOD), headers=auth).status_code == 204


def test_columnar_reader_reads_what_protobuf_reads() -> None:
    """remote_write_columns reads the usual layout as protobuf does, edge cases included, and declines the rest."""
    import numpy as np

    from service.telemetry import remote_write_columns as columns
    from service.telemetry.remote_write_pb2 import LabelSet, RawWriteRequest

    req = request(
        ({"__name__": "a", "device": "eth0"}, [(5, 0.0), (0, 2.5), (TS, -1.0)]),  # zero value, zero time omitted
        ({"__name__": "b"}, []),
        ({"__name__": "c", "x": "é" * 200}, [(TS, float("nan")), (TS + 1, 1e300)]),  # 2-byte label lengths
        *[({"__name__": "n", "i": str(i)}, [(TS + i, float(i))]) for i in range(300)],
    )
    raw = req.SerializeToString()
    got = columns.read(raw)
    parsed = RawWriteRequest.FromString(raw)
    assert got is not None
    assert got.keys == [LabelSet(labels=list(ts.labels)).SerializeToString() for ts in req.timeseries]
    assert got.counts.tolist() == [len(ts.samples) for ts in parsed.timeseries]
    assert got.ts_ms.tolist() == [s.timestamp for ts in parsed.timeseries for s in ts.samples]
    assert np.array_equal(got.values, [s.value for ts in parsed.timeseries for s in ts.samples], equal_nan=True)
    # a histogram or an exemplar: another layout, read message by message
    req.timeseries[0].histograms.add(count_int=3, timestamp=TS)
    assert columns.read(req.SerializeToString()) is None


def test_histograms_and_exemplars_take_the_message_path(client: TestClient, db: Engine) -> None:
    req = request(({"__name__": "node_network_up", "device": "eth0", **NODE}, [(TS, 1.0)]),
                  ({"__name__": "node_network_up", "device": "eth1", **NODE}, [(TS, 0.0)]))
    req.timeseries[0].exemplars.add(value=1.0, timestamp=TS)
    hist = req.timeseries.add()
    hist.labels.add(name="__name__", value="rpc_seconds")
    hist.histograms.add(count_int=3, sum=0.5, timestamp=TS)
    r = client.post("/api/v1/write", content=body(req), headers=HEADERS)
    assert r.status_code == 204, r.text
    assert r.headers["x-fabricwatch-unmapped"] == "histogram=1"
    assert _stored(db) == {("port_oper_up", "gpu-a01", "eth0", None, None, None, TS, 1.0),
                           ("port_oper_up", "gpu-a01", "eth1", None, None, None, TS, 0.0)}
