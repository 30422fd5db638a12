"""Prometheus-text import through the real API into the real PostgreSQL, and back via /series."""

from __future__ import annotations

import gzip
import random
import re
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api.app import create_app
from service.config import load_settings
from service.telemetry import ingest
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
    # every series of the file is new and has 50 samples of one day: one block each, no rows
    assert _count(db, "sample_blocks") == 2000 and _count(db, "sample_rows") == 0

    window = {"start": str(T0), "end": str(T0 + 50 * STEP)}  # Unix ms, as the samples
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


def test_a_file_repeating_its_own_rows_stores_each_once_when_batches_are_small(db: Engine) -> None:
    # Repeats of new series' rows are staged while the rows they repeat may still wait in the
    # direct buffer; staged rows must never reach the table before those.
    from service.telemetry.service import import_prometheus

    add_hosts(db, 1)
    rows = [f'port_tx_bytes_total{{device="h-000",port="eth{p}"}} {i} {T0 + i * STEP}' for p in range(4)
            for i in range(500)]
    body = ("\n".join(rows + rows) + "\n").encode()
    report = import_prometheus(engine=db, chunks=[body], batch_rows=100)
    assert (report.written, report.duplicates) == (2000, 2000)
    assert _count(db, "samples") == 2000


def test_malformed_line_after_100k_good_ones_writes_nothing(client: TestClient, db: Engine) -> None:
    # By line 100k rows have been streamed into `samples` (and series created); the error
    # must still leave nothing behind.
    hosts = add_hosts(db, 5)
    good = [f'optic_rx_power_dbm{{device="{h}",port="eth{p}",lane="{ln}"}} -1.5 {T0 + t * STEP}'
            for t in range(625) for h in hosts for p in range(8) for ln in range(4)][:100_000]
    r = client.post("/api/v1/import/prometheus", content="\n".join([*good, "port_rx_bytes_total 1 x"]))
    assert r.status_code == 400 and r.json()["line"] == 100_001
    assert _count(db, "samples") == 0 and _count(db, "series") == 0


def test_imports_store_blocks_and_pushes_rows_and_readers_see_both(client: TestClient, db: Engine) -> None:
    """An import stores the series it creates as one block per series and day when it has enough
    samples, else as rows; later samples of those series (a push) are rows; `samples` and
    `samples_between` read both."""
    add_hosts(db, 1)
    day_end = (T0 // 86_400_000 + 1) * 86_400_000
    tx = [(ts, float(i)) for i, ts in enumerate(range(day_end - 6 * STEP, day_end + 4 * STEP, STEP))]  # 6 + 4
    rx = [(T0, 1.0), (T0 + STEP, 2.0)]  # too few for a block
    body = [f'port_tx_bytes_total{{device="h-000",port="eth1"}} {v} {ts}' for ts, v in tx]
    body += [f'port_rx_bytes_total{{device="h-000",port="eth1"}} {v} {ts}' for ts, v in rx]
    assert client.post("/api/v1/import/prometheus", content="\n".join(body)).json()["written"] == 12
    with db.connect() as conn:
        blocks = conn.execute(text("SELECT cardinality(ts), first_ts < last_ts FROM sample_blocks ORDER BY first_ts"))
        assert blocks.all() == [(6, True), (4, True)]  # split at the day boundary
        assert conn.execute(text("SELECT count(*) FROM sample_rows")).scalar_one() == 2
    push = [(day_end + 10 * STEP, 100.0), (day_end + 11 * STEP, 101.0)]
    report = client.post("/api/v1/import/prometheus", content="\n".join(
        f'port_tx_bytes_total{{device="h-000",port="eth1"}} {v} {ts}' for ts, v in [tx[-1], *push])).json()
    assert report["written"] == 2 and report["duplicates"] == 1  # the repeated one was in a block
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM sample_rows")).scalar_one() == 4
        stored = conn.execute(text(
            "SELECT (extract(epoch FROM x.ts) * 1000)::bigint, x.value FROM samples x "
            "JOIN series s ON s.id = x.series_id WHERE s.metric = 'port_tx_bytes_total' ORDER BY x.ts")).all()
        assert [tuple(r) for r in stored] == [*tx, *push]
        lo, hi = tx[4][0], push[0][0]
        between = conn.execute(text(
            "SELECT (extract(epoch FROM ts) * 1000)::bigint FROM samples_between(to_timestamp(:lo / 1000.0), "
            "to_timestamp(:hi / 1000.0)) ORDER BY ts"), {"lo": lo, "hi": hi}).scalars().all()
        assert between == [ts for ts, _ in [*tx, *push, *[(t, 0) for t, _ in rx]] if lo <= ts <= hi]
        sid = conn.execute(text("SELECT id FROM series WHERE metric = 'port_tx_bytes_total'")).scalar_one()
        last = text("SELECT (extract(epoch FROM ts) * 1000)::bigint, value FROM last_samples(:sid, :n, "
                    "COALESCE(to_timestamp(:before / 1000.0), 'infinity'))")
        assert conn.execute(last, {"sid": sid, "n": 3, "before": None}).all() == [push[1], push[0], tx[-1]]
        # before the rows: the newest samples of the blocks, across the day boundary
        assert [tuple(r) for r in conn.execute(last, {"sid": sid, "n": 6, "before": push[0][0]})] == tx[-6:][::-1]
        assert [tuple(r) for r in conn.execute(last, {"sid": sid, "n": 2, "before": tx[7][0]})] == [tx[6], tx[5]]


def test_an_import_larger_than_the_block_buffer_stores_consecutive_blocks(db: Engine,
                                                                         monkeypatch: pytest.MonkeyPatch) -> None:
    from service.telemetry.promtext import iter_blocks

    monkeypatch.setattr(ingest, "_MAX_BLOCKED_ROWS", 50)
    monkeypatch.setattr(ingest, "_BLOCK_PART_SAMPLES", 7)  # each flush sent in parts
    add_hosts(db, 1)
    lines = [f'port_tx_bytes_total{{device="h-000",port="eth{p}"}} {i * 10 + p} {T0 + i * STEP}'
             for i in range(60) for p in range(2)]
    with db.begin() as conn:
        ingestor = ingest.Ingestor(conn)

        def parsed() -> Iterator[object]:
            for k in range(0, len(lines), 20):
                yield from iter_blocks(["\n".join(lines[k:k + 20]).encode()])
                ingestor._resolve_all()  # the series are known from here on: rows wait only for blocks

        ingestor.add_prom_blocks(parsed(), 0)  # type: ignore[arg-type]
        assert ingestor.finish().written == 120
    with db.connect() as conn:
        blocks = conn.execute(text("SELECT series_id, first_ts, last_ts FROM sample_blocks ORDER BY 1, 2")).all()
        assert len(blocks) == 4 and len({b[0] for b in blocks}) == 2  # two flushes of two series
        for a, b in zip(blocks, blocks[1:], strict=False):
            assert a[0] != b[0] or a[2] < b[1]  # a series' blocks follow each other
        stored = conn.execute(text("SELECT value FROM samples x JOIN series s ON s.id = x.series_id "
                                   "JOIN ports p ON p.id = s.port_id ORDER BY p.name, x.ts")).scalars().all()
    assert stored == [i * 10 + p for p in range(2) for i in range(60)]


def test_new_series_sent_in_parts_fall_back_when_one_exists_already(db: Engine,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    # One of the series exists already, created outside this process (so no cache knows it): the
    # COPY of new series, sent in parts, fails on it in its last part, and the round goes through ON
    # CONFLICT instead. Every series resolves, the existing one keeps its id, every sample is stored.
    from service.telemetry.samples import Sample
    from service.telemetry.service import ingest_samples

    monkeypatch.setattr(ingest, "_SERIES_PART_ROWS", 2)
    (host,) = add_hosts(db, 1, ports=6)
    with db.begin() as conn:
        existing = conn.execute(text(
            "INSERT INTO series (metric, device_id, port_id, saturating) SELECT 'port_rx_bytes_total', "
            "p.device_id, p.id, false FROM ports p WHERE p.name = 'eth4' RETURNING id")).scalar_one()
    samples = [Sample("port_rx_bytes_total", float(p), T0, host, f"eth{p}") for p in range(6)]
    assert ingest_samples(engine=db, samples=samples).written == 6
    with db.connect() as conn:
        rows = conn.execute(text("SELECT p.name, s.id, x.value FROM series s JOIN ports p ON p.id = s.port_id "
                                 "JOIN samples x ON x.series_id = s.id ORDER BY p.name")).all()
    assert [(name, value) for name, _, value in rows] == [(f"eth{p}", float(p)) for p in range(6)]
    assert dict((name, sid) for name, sid, _ in rows)["eth4"] == existing


def test_remembered_series_ids_are_forgotten_when_series_is_truncated(db: Engine) -> None:
    # The process remembers the ids of series that existed before an ingest. After a TRUNCATE ..
    # RESTART IDENTITY (as between tests, or an operator's reset) an id may come back for another
    # series; a remembered id must not then take that series' samples.
    from service.telemetry.samples import Sample
    from service.telemetry.service import ingest_samples

    (host,) = add_hosts(db, 1, ports=2)

    def store(port: str, value: float) -> None:
        sample = Sample("port_rx_bytes_total", value, T0 + int(value) * STEP, host, port)
        assert ingest_samples(engine=db, samples=[sample]).written == 1

    store("eth0", 1.0)
    store("eth0", 2.0)  # that series existed before this ingest: its id is remembered
    with db.begin() as conn:
        conn.execute(text("TRUNCATE series, sample_rows, sample_blocks RESTART IDENTITY"))
        conn.execute(text("INSERT INTO series (metric, device_id, port_id, saturating) SELECT "
                          "'port_rx_bytes_total', device_id, id, false FROM ports WHERE name = 'eth1'"))
    store("eth0", 3.0)  # the remembered id is now eth1's series
    store("eth1", 4.0)
    with db.connect() as conn:
        rows = conn.execute(text("SELECT p.name, x.value FROM samples x JOIN series s ON s.id = x.series_id "
                                 "JOIN ports p ON p.id = s.port_id ORDER BY p.name")).all()
    assert [tuple(r) for r in rows] == [("eth0", 3.0), ("eth1", 4.0)]
    assert ingest._KNOWN  # the ids were remembered (and so had to be forgotten)


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


@pytest.mark.parametrize("arrow_from", [0, None], ids=["arrow", "split"])
def test_blocks_parse_like_the_line_parser(arrow_from: int | None, monkeypatch: pytest.MonkeyPatch) -> None:
    """`iter_blocks` (columns for blocks of plain lines, read by Arrow or, when small, split in
    Python; else line by line) gives what the full line parser gives, line numbers and errors
    included, however the input is cut into chunks."""
    from service.telemetry import promtext
    from service.telemetry.promtext import PromBlock, PromParseError, _parse_line, iter_blocks, parse_series

    if arrow_from is not None:
        monkeypatch.setattr(promtext, "ARROW_FROM_BYTES", arrow_from)

    lines = ['m{a="1",b="x"} 1 5', 'm{a="1",b="x"} -2.5e3 7', 'm{a="2"} 3 9', "m 4 11", 'm{a="é"} 1 2',
             'm{a="1"} NaN 3', 'm{a="1"} 1_0 3', 'm{a="1"} 1 +3', 'm{a="1"} 1e999 4', 'm{a="1"} 1 99999999999999999999',
             'x{a="b c"} 1 5', "x 1", 'x{a="1"} 2} 3', "# c 1 2", "", "x\t1 2", "x 1 2\r", " x 1 2", "x  1 2",
             "x 1 2 ", "x 1 2 3", "9x 1 2", 'x{a="1",a="2"} 1 2', "x 1 abc", "x abc 1", "x 1 1.5"]
    plain = [*lines[:5], 'm{device="d",port="p 1"} 1 5', 'm{device="d",port="p",lane="0"} 2 6']
    # three fields each, so that Arrow reads them, but numbers it and `float`/`int` may read apart
    odd_numbers = ['m{a="1"} nan(1) 3', 'm{a="1"} nan 3', 'm{a="1"} -Infinity 3', 'm{a="1"} .5 3', 'm{a="1"} 5. 3',
                   'm{a="1"} +5 3', 'm{a="1"} 1 007', 'm{a="1"} 1 -5', 'm{a="1"} 0x10 3', 'm{a="1"} 1e-400 3',
                   'm{a="1"} 1 ٣', 'm{a="1"} ٣ 3', 'm{device="d",port="p\\"} 1 3', 'm{device="d",lane="x"} 1 3',
                   # near the canonical shape (which Arrow's RE2 recognizes), some invalid
                   '9m{device="d"} 1 3', 'm{device="d"x} 1 3', 'm{device="d",} 1 3', 'm{device="d",lane="123456"} 1 3',
                   'm{device="d",gpu="1",lane="2"} 1 3', 'm{device="d"}} 1 3', 'm{device="d",port=""} 1 3']

    def reference(text: str) -> list[str]:
        out: list[str] = []
        try:
            for n, raw in enumerate(text.split("\n"), 1):
                r = _parse_line(raw, n, "body", {})
                if r is not None:
                    out.append(repr((r[0], r[1].name, r[1].labels, r[2], r[3], r[4])))
        except PromParseError as exc:
            out.append(str(exc))
        return out

    def blocks(data: bytes, cuts: list[int], block_bytes: int) -> tuple[list[str], int]:
        out: list[str] = []
        columns = 0
        chunks = [data[i:j] for i, j in zip([0, *cuts], [*cuts, len(data)], strict=True)]
        try:
            for item in iter_blocks(chunks, "body", block_bytes):
                if isinstance(item, PromBlock):
                    columns += 1
                    for i, (s, v, t) in enumerate(zip(item.series, item.values.tolist(), item.ts_ms.tolist(),
                                                      strict=True)):
                        out.append(repr((s, *parse_series(s), v, t, item.first_line + i)))
                else:
                    s, p, v, t, n = item
                    out.append(repr((s, p.name, p.labels, v, t, n)))
        except PromParseError as exc:
            out.append(str(exc))
        return out, columns

    rng = random.Random(5)
    column_blocks = 0
    for _ in range(1500):
        # a third of the inputs are all plain lines, so that blocks take the column path; a third
        # mix in lines Arrow reads but the line parser may refuse or read otherwise
        mode = rng.randrange(3)
        pool = plain if mode == 0 else [*plain, *odd_numbers] if mode == 1 else lines + odd_numbers
        text = "\n".join(rng.choice(pool) for _ in range(rng.randint(1, 12)))
        text += rng.choice(["", "\n"])
        data = text.encode()
        cuts = sorted(rng.sample(range(1, len(data)), min(3, len(data) - 1))) if len(data) > 1 else []
        got, columns = blocks(data, cuts, rng.choice([1, 16, 64, 1 << 20]))
        assert got == reference(text), text
        column_blocks += columns
    assert column_blocks > 500  # the column path was taken, not only the line-by-line one


@pytest.mark.parametrize("arrow_from", [0, None], ids=["arrow", "split"])
def test_lines_over_the_length_limit_are_refused_wherever_they_start(arrow_from: int | None,
                                                                     monkeypatch: pytest.MonkeyPatch) -> None:
    from service.telemetry import promtext
    from service.telemetry.promtext import MAX_LINE_BYTES, PromBlock, PromParseError, iter_blocks

    if arrow_from is not None:
        monkeypatch.setattr(promtext, "ARROW_FROM_BYTES", arrow_from)

    def line(length: int) -> str:  # a valid line of `length` bytes before its newline
        return 'm{a="' + "x" * (length - 11) + '"} 1 5'

    for lead in (1, 20, MAX_LINE_BYTES // 2 - 30, MAX_LINE_BYTES - 20):  # where the long line starts
        for length in (MAX_LINE_BYTES - 1, MAX_LINE_BYTES, MAX_LINE_BYTES + 1):
            text = "\n".join([line(max(lead, 12)), line(length), line(12)]) + "\n"
            try:
                items = list(iter_blocks([text.encode()]))
            except PromParseError as exc:
                assert length > MAX_LINE_BYTES and (exc.line, exc.reason) == (
                    2, f"line longer than {MAX_LINE_BYTES} bytes"), (lead, length)
                continue
            assert length <= MAX_LINE_BYTES, (lead, length)
            got = [s for item in items for s in (item.series if isinstance(item, PromBlock) else [item[0]])]
            assert [len(s) + 4 for s in got] == [max(lead, 12), length, 12]
            # up to the limit with its newline, the block is read as columns, not line by line
            assert isinstance(items[0], PromBlock) == (length < MAX_LINE_BYTES), (lead, length)


def test_plain_label_sets_parse_like_the_general_label_parser(monkeypatch: pytest.MonkeyPatch) -> None:
    from service.telemetry import promtext

    parts = ['a="1"', 'b=""', 'a="2"', 'c_1="x,y"', 'd="q\\"z"', 'e="s p"', ' f="1"', 'g="1" ', "h=1", ",", "}"]
    rng = random.Random(7)
    texts = ["m{" + ",".join(rng.choice(parts) for _ in range(rng.randint(0, 4))) + rng.choice(["", ","]) + "}"
             for _ in range(3000)]

    def parse_all() -> list[object]:
        out: list[object] = []
        for t in texts:
            try:
                out.append(promtext._parse_series(t))
            except ValueError as exc:
                out.append(str(exc))
        return out

    fast = parse_all()
    monkeypatch.setattr(promtext, "_PLAIN_BODY_RE", re.compile(r"(?!)"))  # never plain: the general parser
    assert fast == parse_all()
    assert sum(isinstance(r, tuple) for r in fast) > 300


def test_pushes_follow_the_inventory_after_a_device_is_removed_and_added_again(client: TestClient,
                                                                                 db: Engine) -> None:
    """Series ids are cached per process between pushes; a cached id whose series was deleted is not used."""
    (host,) = add_hosts(db, 1, ports=2, prefix="cache")

    def push(t: int, status: int = 200) -> dict:
        body = "\n".join(f'port_rx_bytes_total{{device="{host}",port="eth{p}"}} {1000 * t} {T0 + t * STEP}'
                         for p in range(2))
        r = client.post("/api/v1/import/prometheus", content=body)
        assert r.status_code == status, r.text
        return r.json()

    def stored() -> dict[int, int]:
        with db.connect() as conn:
            return dict(conn.execute(text(
                "SELECT s.id, count(x.ts) FROM series s JOIN devices d ON d.id = s.device_id "
                "LEFT JOIN samples x ON x.series_id = s.id WHERE d.name = :h GROUP BY s.id"), {"h": host}).all())

    assert push(1)["written"] == 2 and push(2)["written"] == 2  # the second push resolves from the cache
    texts = [f'port_rx_bytes_total{{device="{host}",port="eth{p}"}}' for p in range(2)]
    assert any(all(t in known.by_text for t in texts) for known in ingest._KNOWN.values())
    assert push(3)["written"] == 2  # adopted by text, checked alive in one probe
    before = stored()
    assert sorted(before.values()) == [3, 3]
    with db.begin() as conn:  # one port leaves: its series goes, the other's cached id stays good
        conn.execute(text("DELETE FROM ports WHERE name = 'eth1' AND device_id = "
                          "(SELECT id FROM devices WHERE name = :h)"), {"h": host})
    report = push(4)
    assert report["written"] == 1 and report["unknown_ports"] == {f"{host}:eth1": 1}
    with db.begin() as conn:  # the device leaves the inventory (its series cascade), then comes back
        conn.execute(text("DELETE FROM devices WHERE name = :h"), {"h": host})
    # rejections are never cached; a push that stores nothing says so
    assert f"2 name devices not in the inventory (load it first: fabricwatch inventory load FILE): {host}" in \
        push(5, 422)["reason"]
    add_hosts(db, 1, ports=2, prefix="cache")
    assert push(6)["written"] == 2
    after = stored()
    assert sorted(after.values()) == [1, 1] and not set(after) & set(before)  # new series, rows under them


@pytest.mark.parametrize(("ts", "says"), [
    (1_764_500_300, "looks like seconds (2025-11-30T10:58:20Z), not milliseconds"),
    (1_764_500_300_000_000, "looks like microseconds (2025-11-30T10:58:20Z)"),
    (1_764_500_300_000_000_000, "looks like nanoseconds (2025-11-30T10:58:20Z)"),
    (5, "(1970-01-01T00:00:00Z as milliseconds) is not from 2000 to 2200"),
    (-1, "is not from 2000 to 2200"),
    (7_258_118_400_000, "(2200-01-01T00:00:00Z as milliseconds) is not from 2000 to 2200"),
])
@pytest.mark.parametrize("path", ["columns", "lines"])
def test_a_timestamp_in_another_unit_is_refused_with_its_line(client: TestClient, db: Engine, ts: int, says: str,
                                                              path: str) -> None:
    """Timestamps are milliseconds from 2000 to 2200 (as the API's time parameters): one in seconds (or µs,
    ns) would be stored in 1970 (or far in the future). The import is refused, naming the line, the value
    and the unit it looks like. A comment line sends the block through the line parser instead of the
    column reader; both refuse alike."""
    add_hosts(db, 1)
    key = 'port_tx_bytes_total{device="h-000",port="eth1"}'
    lines = [f"{key} {i} {T0 + i * STEP}" for i in range(300)] + [f"{key} 300 {ts}"]
    if path == "lines":
        lines.insert(0, "# TYPE port_tx_bytes_total counter")
    r = client.post("/api/v1/import/prometheus", content="\n".join(lines))
    assert r.status_code == 400, r.text
    problem = r.json()
    assert problem["line"] == len(lines) and f"timestamp {ts} " in problem["reason"] and says in problem["reason"]
    assert _count(db, "samples") == 0 and _count(db, "series") == 0


def test_lanes_beyond_the_optic_are_refused_and_counted(client: TestClient, db: Engine) -> None:
    """A lane the port's module does not have would be stored and then never read by detection: it is
    refused and counted under `invalid`, with the reason. Ports without an optic in the inventory take
    lanes 0-15 (the inventory's limit)."""
    add_hosts(db, 1)
    with db.begin() as conn:
        conn.execute(text("INSERT INTO optics (port_id, lanes, thresholds) SELECT id, 4, '{}' FROM ports "
                          "WHERE name = 'eth0'"))
    rx = 'optic_rx_power_dbm{{device="h-000",port="{}",lane="{}"}} -2.5 {}'
    body = [rx.format(port, lane, T0 + t * STEP) for t in range(3) for port, lane in
            [("eth0", 0), ("eth0", 3), ("eth0", 4), ("eth0", 9), ("eth1", 9), ("eth1", 16)]]
    body.append(rx.format("eth0", -1, T0))
    r = client.post("/api/v1/import/prometheus", content="\n".join(body))
    assert r.status_code == 200, r.text
    report = r.json()
    assert report["written"] == 9 and report["rejected"] == 10
    assert report["invalid"] == {
        "h-000:eth0 lane 4: the port's optic has 4 lanes (0-3)": 3,
        "h-000:eth0 lane 9: the port's optic has 4 lanes (0-3)": 3,
        "h-000:eth1 lane 16: lanes are 0-15 (the port has no optic in the inventory)": 3,
        "h-000:eth0 lane -1: the port's optic has 4 lanes (0-3)": 1,
    }
    with db.connect() as conn:
        stored = conn.execute(text("SELECT p.name, s.lane FROM series s JOIN ports p ON p.id = s.port_id "
                                   "ORDER BY 1, 2")).all()
    assert [tuple(r) for r in stored] == [("eth0", 0), ("eth0", 3), ("eth1", 9)]


def test_an_import_that_stores_nothing_is_refused_with_the_likely_cause(client: TestClient, db: Engine) -> None:
    """Samples that are all refused (here: names not in the catalogue) are an error, not a 200 with
    "written": 0; the answer names the closest catalogue names. A re-import (all duplicates) and an
    empty push are not errors: the data is stored, or there was none."""
    add_hosts(db, 1)
    body = "\n".join([f'port_rx_bytes{{device="h-000",port="eth0"}} {i} {T0 + i * STEP}' for i in range(5)]
                     + [f'ifHCInOctets{{device="h-000",port="eth0"}} 1 {T0}'])
    r = client.post("/api/v1/import/prometheus", content="# from a vendor exporter\n" + body)
    assert r.status_code == 422, r.text  # well-formed, so not a 400: every sample was refused
    problem = r.json()
    assert problem["title"] == "Nothing stored"
    assert problem["report"]["received"] == 6 and problem["report"]["written"] == 0
    assert problem["line"] == 2  # the first sample line
    assert problem["reason"].startswith("nothing stored: all 6 samples were refused: 6 name metrics not in the "
                                        "catalogue")
    assert "port_rx_bytes (closest: port_rx_bytes_total or port_tx_bytes_total)" in problem["detail"]
    assert "ifHCInOctets (nothing close)" in problem["detail"]
    assert _count(db, "series") == 0
    r = client.post("/api/v1/import/prometheus", content=f'optic_rx_power_dbm{{device="ghost",port="eth0",'
                                                         f'lane="0"}} -1 {T0}')
    assert r.status_code == 422 and "1 name devices not in the inventory" in r.json()["reason"]
    assert "ghost" in r.json()["reason"]
    good = f'port_rx_bytes_total{{device="h-000",port="eth0"}} 1 {T0}'
    assert client.post("/api/v1/import/prometheus", content=good).json()["written"] == 1
    again = client.post("/api/v1/import/prometheus", content=good)
    assert again.status_code == 200 and again.json()["duplicates"] == 1
    assert client.post("/api/v1/import/prometheus", content="").status_code == 200
