"""Prometheus-text import through the real API into the real PostgreSQL, and back via /series."""

from __future__ import annotations

import gzip
import random

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from tests.factories import add_hosts

T0 = 1_764_500_000_000  # 2025-11-30T10:53:20Z, in ms
STEP = 10_000


@pytest.fixture()
def client(db: Engine, db_url: str) -> TestClient:
    settings = load_settings(auth_required=False, database_url=db_url, max_body_bytes=64 * 1024 * 1024)
    return TestClient(create_app(settings))


def _count(engine: Engine, table: str) -> int:
    with engine.connect() as conn:
        return conn.execute(text(f"SELECT count(*) FROM {table}")).scalar_one()


def test_100k_samples_round_trip(client: TestClient, db: Engine) -> None:
    hosts = add_hosts(db, 50)
    rng = random.Random(7)
    power: dict[tuple[str, str, int], list[float]] = {}
    octets: dict[tuple[str, str], list[int]] = {}
    lines = []
    for t in range(50):
        ts = T0 + t * STEP
        for h in hosts:
            for p in range(8):
                port = f"eth{p}"
                for lane in range(4):
                    v = round(rng.uniform(-6.0, 2.0), 3)
                    power.setdefault((h, port, lane), []).append(v)
                    lines.append(f'optic_rx_power_dbm{{device="{h}",port="{port}",lane="{lane}"}} {v} {ts}')
                prev = octets.get((h, port), [rng.randrange(10**12)])[-1]
                cur = prev + rng.randrange(10**9)
                octets.setdefault((h, port), []).append(cur)
                lines.append(f'port_rx_bytes_total{{device="{h}",port="{port}",job="x"}} {cur} {ts}')
    assert len(lines) == 100_000
    r = client.post("/api/v1/import/prometheus", content="\n".join(lines))
    assert r.status_code == 200, r.text
    assert r.json()["written"] == 100_000 and r.json()["rejected"] == 0

    window = {"start": str(T0 / 1000), "end": str((T0 + 50 * STEP) / 1000)}
    for h in hosts:
        got = client.get("/api/v1/series", params={"metric": "optic_rx_power_dbm", "device": h, **window}).json()
        assert len(got["series"]) == 32
        for s in got["series"]:
            key = (h, s["labels"]["port"], s["labels"]["lane"])
            assert [v for _, v in s["points"]] == power[key]
        raw = client.get("/api/v1/series", params={"metric": "port_rx_bytes_total", "device": h, "raw": "true",
                                                   **window}).json()
        for s in raw["series"]:
            assert [int(v) for _, v in s["points"]] == octets[(h, s["labels"]["port"])]
    # Counters come back as per-second rates by default.
    h, port = hosts[3], "eth5"
    rated = client.get("/api/v1/series", params={"metric": "port_rx_bytes_total", "device": h, "port": port,
                                                 **window}).json()["series"][0]
    expected = [(b - a) / (STEP / 1000) for a, b in zip(octets[(h, port)], octets[(h, port)][1:], strict=False)]
    assert [v for _, v in rated["points"]] == pytest.approx(expected)
    assert rated["unit"] == "1/s"


def test_malformed_import_writes_nothing(client: TestClient, db: Engine) -> None:
    add_hosts(db, 1)
    good = [f'optic_rx_power_dbm{{device="h-000",port="eth0",lane="0"}} -1.5 {T0 + i * STEP}' for i in range(500)]
    body = "\n".join([*good, 'optic_rx_power_dbm{device="h-000",port="eth0",lane="0" -1.5', *good])
    r = client.post("/api/v1/import/prometheus", content=body)
    assert r.status_code == 400
    problem = r.json()
    assert r.headers["content-type"].startswith("application/problem+json")
    assert problem["line"] == 501
    assert "label set is not closed" in problem["reason"]
    assert _count(db, "samples") == 0 and _count(db, "series") == 0


@pytest.mark.parametrize(("line", "reason"), [
    ("port_rx_bytes_total{device=\"h-000\",port=\"eth0\"} abc", "is not a number"),
    ("port_rx_bytes_total{device=\"h-000\",port=\"eth0\"} 1 12.5", "not integer milliseconds"),
    ("9bad{device=\"h-000\"} 1", "invalid metric name"),
    ("port_rx_bytes_total{device=\"h-000\",device=\"x\"} 1", "repeats"),
    ("port_rx_bytes_total", "missing value"),
])
def test_each_malformed_line_is_named(client: TestClient, db: Engine, line: str, reason: str) -> None:
    r = client.post("/api/v1/import/prometheus", content=f"# TYPE x counter\n{line}\n")
    assert r.status_code == 400
    assert r.json()["line"] == 2 and reason in r.json()["reason"]


def test_unknowns_are_reported_not_dropped_silently(client: TestClient, db: Engine) -> None:
    add_hosts(db, 1)
    body = "\n".join([
        f'optic_rx_power_dbm{{device="h-000",port="eth0",lane="0"}} -1 {T0}',
        f'optic_rx_power_dbm{{device="ghost",port="eth0",lane="0"}} -1 {T0}',
        f'optic_rx_power_dbm{{device="h-000",port="eth99",lane="0"}} -1 {T0}',
        f'vendor_magic{{device="h-000"}} 1 {T0}',
        f'optic_rx_power_dbm{{device="h-000",port="eth0"}} -1 {T0}',
        f'optic_rx_power_dbm{{device="h-000",port="eth0",lane="x"}} -1 {T0}',
    ])
    report = client.post("/api/v1/import/prometheus", content=body).json()
    assert report["written"] == 1
    assert report["unknown_devices"] == {"ghost": 1}
    assert report["unknown_ports"] == {"h-000:eth99": 1}
    assert report["unknown_metrics"] == {"vendor_magic": 1}
    assert any("missing label 'lane'" in k for k in report["invalid"])
    assert any("lane='x' is not an integer" in k for k in report["invalid"])
    assert report["rejected"] == 5


def test_reimport_is_idempotent(client: TestClient, db: Engine) -> None:
    add_hosts(db, 1)
    body = "\n".join(f'port_tx_bytes_total{{device="h-000",port="eth1"}} {i * 100} {T0 + i * STEP}'
                     for i in range(100))
    assert client.post("/api/v1/import/prometheus", content=body).json()["written"] == 100
    again = client.post("/api/v1/import/prometheus", content=body).json()
    assert again["written"] == 0 and again["duplicates"] == 100
    assert _count(db, "samples") == 100


def test_gzip_body_and_size_limit(db: Engine, db_url: str) -> None:
    add_hosts(db, 1)
    small = TestClient(create_app(load_settings(auth_required=False, database_url=db_url, max_body_bytes=4096)))
    body = "\n".join(f'port_tx_bytes_total{{device="h-000",port="eth1"}} {i} {T0 + i * STEP}' for i in range(40))
    r = small.post("/api/v1/import/prometheus", content=gzip.compress(body.encode()),
                   headers={"content-encoding": "gzip"})
    assert r.status_code == 200 and r.json()["written"] == 40
    big = "x" * 5000
    r = small.post("/api/v1/import/prometheus", content=big)
    assert r.status_code == 413 and "exceeds the limit" in r.json()["detail"]
    assert _count(db, "samples") == 40


def test_duplicates_inside_one_file_are_stored_once(client: TestClient, db: Engine) -> None:
    # A new series goes straight into `samples` by COPY only while its timestamps increase;
    # a repeated or older timestamp takes the ON CONFLICT route and counts as a duplicate.
    add_hosts(db, 1)
    key = 'port_tx_bytes_total{device="h-000",port="eth1"}'
    body = "\n".join([f"{key} 1 {T0}", f"{key} 2 {T0 + STEP}", f"{key} 9 {T0}",  # repeat of T0
                      f"{key} 3 {T0 - STEP}",  # older, not a duplicate
                      f"{key} 4 {T0 + 2 * STEP}", f"{key} 4 {T0 + 2 * STEP}"])
    report = client.post("/api/v1/import/prometheus", content=body).json()
    assert report["written"] == 4 and report["duplicates"] == 2
    with db.connect() as conn:
        rows = conn.execute(text("SELECT value FROM samples ORDER BY ts")).scalars().all()
    assert rows == [3.0, 1.0, 2.0, 4.0]  # the first value of a repeated timestamp wins


def test_malformed_line_after_100k_good_ones_writes_nothing(client: TestClient, db: Engine) -> None:
    # By line 100k rows have been streamed into `samples` (and series created); the error
    # must still leave nothing behind.
    hosts = add_hosts(db, 5)
    good = [f'optic_rx_power_dbm{{device="{h}",port="eth{p}",lane="{ln}"}} -1.5 {T0 + t * STEP}'
            for t in range(625) for h in hosts for p in range(8) for ln in range(4)][:100_000]
    r = client.post("/api/v1/import/prometheus", content="\n".join([*good, "port_rx_bytes_total 1 x"]))
    assert r.status_code == 400 and r.json()["line"] == 100_001
    assert _count(db, "samples") == 0 and _count(db, "series") == 0


def test_reimport_of_overlapping_data(client: TestClient, db: Engine) -> None:
    # Existing series take the ON CONFLICT route: the overlap counts as duplicates, the
    # rest is stored, and new series in the same file still go straight in.
    add_hosts(db, 1)
    first = [f'port_tx_bytes_total{{device="h-000",port="eth1"}} {i} {T0 + i * STEP}' for i in range(100)]
    assert client.post("/api/v1/import/prometheus", content="\n".join(first)).json()["written"] == 100
    second = [f'port_tx_bytes_total{{device="h-000",port="eth1"}} {i} {T0 + i * STEP}' for i in range(50, 150)]
    second += [f'port_rx_bytes_total{{device="h-000",port="eth1"}} {i} {T0 + i * STEP}' for i in range(10)]
    report = client.post("/api/v1/import/prometheus", content="\n".join(second)).json()
    assert report["written"] == 60 and report["duplicates"] == 50
    assert _count(db, "samples") == 160


def test_fast_path_parses_like_the_full_parser() -> None:
    from service.telemetry.promtext import PromParseError, _parse_line, iter_samples

    lines = ['x{a="b c"} 1\n', 'x{a="b c"} 1 5\n', "x 1\n", "x 1 2\n", 'x{a="1",b="} 2"} 5 6\n',
             'x{a="1"} 2} 3\n', 'x{a="1"} NaN 3\n', 'x{a="1"} +Inf 3\r\n', " x 1 2\n", "x  1 2\n", "x 1 2 \n",
             'x{a="q\\"} z"} 1 2\n', 'x{a="q\\"} z"} 1\n', "# x 1 2\n", "\n", "x\t1\t2\n", "x{} 1\n", "x 1 2 3\n"]

    def run(fast: bool, ls: list[str]) -> list[str]:
        out, cache = [], {}
        try:
            if fast:
                for s, p, v, t, n in iter_samples(ls):
                    out.append(repr((s, p.name, p.labels, v, t, n)))
            else:
                for n, raw in enumerate(ls, 1):
                    r = _parse_line(raw, n, "body", cache)
                    if r is not None:
                        out.append(repr((r[0], r[1].name, r[1].labels, *r[2:])))
        except PromParseError as exc:
            out.append(str(exc))
        return out

    rng = random.Random(3)
    for _ in range(3000):
        ls = [rng.choice(lines) for _ in range(6)]
        assert run(True, ls) == run(False, ls), ls


def test_pushes_follow_the_inventory_after_a_device_is_removed_and_added_again(client: TestClient,
                                                                                 db: Engine) -> None:
    """Series ids are cached per process between pushes; a cached id whose series was deleted is not used."""
    (host,) = add_hosts(db, 1, ports=2, prefix="cache")

    def push(t: int) -> dict:
        body = "\n".join(f'port_rx_bytes_total{{device="{host}",port="eth{p}"}} {1000 * t} {T0 + t * STEP}'
                         for p in range(2))
        r = client.post("/api/v1/import/prometheus", content=body)
        assert r.status_code == 200, r.text
        return r.json()

    def stored() -> dict[int, int]:
        with db.connect() as conn:
            return dict(conn.execute(text(
                "SELECT s.id, count(x.ts) FROM series s JOIN devices d ON d.id = s.device_id "
                "LEFT JOIN samples x ON x.series_id = s.id WHERE d.name = :h GROUP BY s.id"), {"h": host}).all())

    assert push(1)["written"] == 2 and push(2)["written"] == 2  # the second push resolves from the cache
    before = stored()
    assert sorted(before.values()) == [2, 2]
    with db.begin() as conn:  # the device leaves the inventory (its series cascade), then comes back
        conn.execute(text("DELETE FROM devices WHERE name = :h"), {"h": host})
    assert push(3)["unknown_devices"] == {host: 2}  # rejections are never cached
    add_hosts(db, 1, ports=2, prefix="cache")
    assert push(4)["written"] == 2
    after = stored()
    assert sorted(after.values()) == [1, 1] and not set(after) & set(before)  # new series, rows under them
