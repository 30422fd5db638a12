"""Storage maintenance with telemetry shards: the beat tasks (partitions, compression, rollups, rollup retention)
run on every shard, where the samples are, not on the control database, which holds none; a shard that is down
does not stop the others' maintenance, and the task fails naming it."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

import pytest
from sqlalchemy import text

from service.db import get_engine
from service.shards.ingest import ingest_samples
from service.shards.setup import apply
from service.shards.topology import ShardsUnavailable
from service.telemetry.samples import Sample
from service.telemetry.tasks import compress_samples, compute_rollups, maintain_partitions, maintain_rollups
from tests.shards.conftest import Cluster

pytestmark = pytest.mark.timeout(300)

T0 = datetime.now(UTC).replace(minute=0, second=0, microsecond=0) - timedelta(hours=6)  # well past the hot hour
T0_MS = int(T0.timestamp() * 1000)


def _scalar(url: str, sql: str) -> object:
    with get_engine(url).connect() as conn:
        return conn.execute(text(sql)).scalar()


def _samples(start_ms: int, devices: tuple[str, ...]) -> list[Sample]:
    return [Sample("port_rx_bytes_total", 1000.0 * i, start_ms + i * 60_000, dev, "eth0")
            for dev in devices for i in range(60)]


@pytest.fixture()
def sharded_env(cluster: Cluster, monkeypatch: pytest.MonkeyPatch) -> Cluster:
    apply(cluster.topology())
    settings = cluster.settings()
    monkeypatch.setenv("FABRICWATCH_DATABASE_URL", cluster.control_url)
    monkeypatch.setenv("FABRICWATCH_SHARDS_URLS", settings.model_dump_json(include={"urls"})[8:-1])
    monkeypatch.setenv("FABRICWATCH_SHARDS_PODS", settings.model_dump_json(include={"pods"})[8:-1])
    monkeypatch.setenv("FABRICWATCH_COMPRESS_AFTER_S", "3600")
    return cluster


def test_each_shard_is_maintained_and_a_down_one_stops_only_its_own(sharded_env: Cluster) -> None:
    """Shard b down: shard a's samples are rolled up and compressed, and each task fails naming b. Back up, b's
    are too. The control database holds no samples and gets none of it."""
    c = sharded_env
    a, b = c.shard_a.url("fw_shard"), c.shard_b.url("fw_shard")
    c.shard_b.stop()
    try:
        report = ingest_samples(control=c.engine, topology=c.topology(), samples=_samples(T0_MS, ("leaf1",)))
        assert report.reports["a"].written == 60
        for task in (maintain_partitions, compute_rollups, compress_samples, maintain_rollups):
            with pytest.raises(ShardsUnavailable, match="shard 'b' unreachable"):
                task.apply(throw=True).get()
        assert _scalar(a, "SELECT count(*) FROM rollup_5m") == 12  # the hour's 5-minute buckets
        assert _scalar(a, "SELECT count(*) FROM sample_rows") == 0
        assert _scalar(a, "SELECT count(*) FROM sample_chunks") == 1
    finally:
        c.shard_b.start()
    report = ingest_samples(control=c.engine, topology=c.topology(), samples=_samples(T0_MS, ("leaf2",)))
    assert report.errors == {} and report.reports["b"].written == 60
    assert set(maintain_partitions.apply().get()["shards"]) == {"a", "b"}
    rolled = compute_rollups.apply().get()  # first, as in steady state: compression stays behind the rollups
    assert set(rolled["shards"]) == {"a", "b"}
    got = compress_samples.apply().get()
    assert {name: run["samples"] for name, run in got["shards"].items()} == {"a": 0, "b": 60}
    assert set(maintain_rollups.apply().get()["shards"]) == {"a", "b"}
    for url in (a, b):
        assert _scalar(url, "SELECT count(*) FROM rollup_5m") == 12
        assert _scalar(url, "SELECT count(*) FROM sample_rows") == 0
        assert _scalar(url, "SELECT count(*) FROM sample_chunks") == 1
    assert _scalar(c.control_url, "SELECT count(*) FROM rollup_5m") == 0
