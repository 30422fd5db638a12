"""`sim generate --store`: a scenario straight into the store as chunks (rows in the hot window), the same
samples as the text output imported; the estimate first; large runs ask; bad input is one line."""

from __future__ import annotations

from datetime import UTC, datetime
from pathlib import Path

import psycopg
import pytest
from sqlalchemy import Engine, make_url, text
from typer.testing import CliRunner

from service.telemetry.ingest import Ingestor
from service.telemetry.store import read_samples
from simulator import cli
from simulator.generate import generate
from simulator.store_writer import StoreEstimate, generate_into_store

# 23:00 to 01:30 the next day; with `now` at 02:40 the hot window starts at 01:00 (the last whole hour
# before now - 1 h): 23:00-01:00 become chunks of two UTC days, 01:00-01:30 rows.
SCENARIO = """\
name: small-store
seed: 7
topology: {hosts: 2, spines: 2}
start: "2025-01-01T23:00:00Z"
end: 2h30m
step: 60s
artefacts: {missing_fraction: 0.02, jitter_ms: 300}
faults:
  - {id: f1, type: dirty_connector, device: leaf-p1-r0-01, port: Ethernet1/1, at: 30m}
  - {id: f2, type: nan_run, device: leaf-p1-r1-01, at: 20m, until: 50m}
  - {id: f3, type: missing, device: host-p1-00001, fraction: 0.5, at: 1h30m, until: 2h}
"""
NOW = datetime(2025, 1, 2, 2, 40, tzinfo=UTC)
HOT_FROM = datetime(2025, 1, 2, 1, 0, tzinfo=UTC)
LO, HI = datetime(2025, 1, 1, tzinfo=UTC), datetime(2025, 1, 3, tzinfo=UTC)
_KEYS = """SELECT s.id, s.metric, d.name, p.name, s.lane, s.priority, s.gpu FROM series s
JOIN devices d ON d.id = s.device_id LEFT JOIN ports p ON p.id = s.port_id"""
_SAMPLE_TABLES = "series, sample_rows, sample_blocks, sample_chunks"


@pytest.fixture()
def scenario(tmp_path: Path) -> Path:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    return sc


def _stored(db: Engine) -> set[tuple[object, ...]]:
    """Every stored sample as (series identity, time, value): ids differ between two loads."""
    with db.connect() as conn:
        keys = {r[0]: tuple(r[1:]) for r in conn.execute(text(_KEYS))}
        got = read_samples(conn, LO, HI)
    out = {(keys[s], t, v) for s, t, v in zip(got.sid.tolist(), got.ts_ms.tolist(), got.value.tolist(), strict=True)}
    assert len(out) == len(got)
    return out


def _count(db: Engine, sql: str) -> int:
    with db.connect() as conn:
        return conn.execute(text(sql)).scalar_one()


def test_the_store_holds_what_the_text_output_imported_holds(db: Engine, scenario: Path, tmp_path: Path) -> None:
    seen: list[StoreEstimate] = []
    r = generate_into_store(db, scenario, now=NOW, confirm=lambda e: seen.append(e) or True)
    stored = _stored(db)
    assert r.samples == len(stored) > 10_000 and r.duplicates == 0
    # chunks before the hot window, one per series and UTC day; rows from it on
    hot_ms = int(HOT_FROM.timestamp() * 1000)
    assert r.row_samples == sum(1 for _, t, _ in stored if t >= hot_ms) > 0
    assert _count(db, "SELECT count(*) FROM sample_rows") == r.row_samples
    assert _count(db, "SELECT min(ts) >= '2025-01-02T01:00Z' FROM sample_rows")
    assert _count(db, "SELECT max(last_ts) < '2025-01-02T01:00Z' FROM sample_chunks")
    assert _count(db, "SELECT sum(n) FROM sample_chunks") == r.chunk_samples
    assert _count(db, "SELECT count(*) FROM (SELECT series_id, date_trunc('day', first_ts AT TIME ZONE 'UTC') "
                      "FROM sample_chunks GROUP BY 1, 2 HAVING count(*) > 1) x") == 0
    assert _count(db, "SELECT count(DISTINCT date_trunc('day', first_ts AT TIME ZONE 'UTC')) FROM sample_chunks") == 2
    assert r.days == [datetime(2025, 1, 1).date(), datetime(2025, 1, 2).date()]

    # the text output for the same scenario and seed, imported into an emptied store
    out = generate(scenario, out_dir=tmp_path / "text")
    with db.begin() as conn:
        conn.execute(text(f"TRUNCATE {_SAMPLE_TABLES}"))
    with db.begin() as conn:
        Ingestor(conn).import_exposition([out.metrics_file.read_bytes()], "metrics.prom", 0)
    imported = _stored(db)
    assert _count(db, "SELECT count(*) FROM sample_chunks") == 0  # the import wrote rows and blocks
    assert stored == imported

    (e,) = seen  # the estimate, from the first steps
    assert e.steps == r.steps == 150 and e.series == r.series and e.hot_from == HOT_FROM
    assert e.samples == pytest.approx(r.samples, rel=0.1)  # missing samples and faults vary by step
    assert e.text_bytes == pytest.approx(out.metrics_file.stat().st_size, rel=0.1)


def test_a_second_run_keeps_what_is_stored(db: Engine, scenario: Path) -> None:
    first = generate_into_store(db, scenario, end="40m", now=NOW, groups={"traffic", "optics"})
    again = generate_into_store(db, scenario, end="1h20m", now=NOW, groups={"traffic", "optics"})
    stored = _stored(db)
    assert again.duplicates == first.samples  # the first 40 minutes again: kept, not doubled
    assert len(stored) == first.samples + again.samples
    assert _count(db, "SELECT count(*) FROM (SELECT series_id, first_ts FROM sample_chunks c WHERE EXISTS ("
                      "SELECT 1 FROM sample_chunks o WHERE o.series_id = c.series_id AND o.first_ts <> c.first_ts "
                      "AND o.first_ts <= c.last_ts AND o.last_ts >= c.first_ts)) x") == 0  # no overlapping chunks


def _run(db_url: str, *args: str) -> tuple[int, str]:
    res = CliRunner().invoke(cli.app, ["generate", "--store", *args], env={"FABRICWATCH_DATABASE_URL": db_url})
    return res.exit_code, res.output


def test_cli_prints_the_estimate_then_stores(db: Engine, db_url: str, scenario: Path) -> None:
    code, output = _run(db_url, "--scenario", str(scenario), "--to", "1h")
    assert code == 0, output
    lines = output.splitlines()
    assert lines[0].startswith("about ") and " on disk (" in lines[0] and "60 steps" in lines[0]
    assert "as text: " in lines[0]
    assert lines[-1].startswith("stored ") and "samples/s" in lines[-1]
    assert _count(db, "SELECT sum(n) FROM sample_chunks") > 10_000


def test_large_runs_ask_or_want_yes(db: Engine, db_url: str, scenario: Path, tmp_path: Path,
                                    monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setattr(cli, "CONFIRM_ABOVE_BYTES", 1000)
    code, output = _run(db_url, "--scenario", str(scenario), "--to", "1h")  # not on a terminal
    assert code == 2 and "pass --yes to store it" in output
    assert _count(db, "SELECT count(*) FROM series") == 0 and _count(db, "SELECT count(*) FROM devices") == 0
    monkeypatch.setattr(cli, "_interactive", lambda: True)
    res = CliRunner().invoke(cli.app, ["generate", "--store", "--scenario", str(scenario), "--to", "1h"],
                             env={"FABRICWATCH_DATABASE_URL": db_url}, input="n\n")
    assert res.exit_code == 1 and "store it?" in res.output and "nothing written" in res.output
    assert _count(db, "SELECT count(*) FROM series") == 0
    code, output = _run(db_url, "--scenario", str(scenario), "--to", "1h", "--yes")
    assert code == 0 and _count(db, "SELECT count(*) FROM sample_chunks") > 0
    # the text output, when large, points at --store
    monkeypatch.setattr(cli, "_interactive", lambda: False)
    res = CliRunner().invoke(cli.app, ["generate", "--scenario", str(scenario), "--to", "10m",
                                       "--out", str(tmp_path / "t")])
    assert res.exit_code == 2 and "--store would keep these samples in the database" in res.output


def test_bad_input_is_one_line_and_writes_nothing(db: Engine, db_url: str, scenario: Path, tmp_path: Path) -> None:
    missing = make_url(db_url).set(database="fw_no_such_database").render_as_string(hide_password=False)
    code, output = _run(missing, "--scenario", str(scenario), "--to", "1h")
    assert code == 1 and output.startswith("error: database: ") and "fw_no_such_database" in output
    assert len(output.strip().splitlines()) == 1

    bad = tmp_path / "bad.yaml"
    bad.write_text(SCENARIO.replace("at: 30m}", "at: 30m, drop_db: -1}"))
    code, output = _run(db_url, "--scenario", str(bad), "--to", "1h")
    assert code == 2 and output.startswith("scenario error: ") and "drop_db" in output
    assert len(output.strip().splitlines()) == 1

    code, output = _run(db_url, "--scenario", str(tmp_path / "none.yaml"))
    assert code == 2 and output.startswith("error: ") and "none.yaml: No such file or directory" in output
    assert len(output.strip().splitlines()) == 1

    code, output = _run(db_url, "--scenario", str(scenario), "--to", "30s")
    assert code == 2 and output.startswith("error: the range holds no step") and "nothing was written" in output

    code, output = _run("", "--scenario", str(scenario))
    assert code == 2 and "--store needs FABRICWATCH_DATABASE_URL" in output

    # telemetry shards configured: the samples would land on the control database, which holds none
    res = CliRunner().invoke(cli.app, ["generate", "--store", "--scenario", str(scenario), "--to", "1h"],
                             env={"FABRICWATCH_DATABASE_URL": db_url,
                                  "FABRICWATCH_SHARDS_URLS": '{"a": "postgresql://127.0.0.1:1/fw_a"}'})
    assert res.exit_code == 2 and "telemetry shards are configured" in res.output, res.output
    assert "fabricwatch import" in res.output and "nothing was written" in res.output

    # a database without the schema
    plain = make_url(db_url).set(drivername="postgresql", database="postgres").render_as_string(hide_password=False)
    name = "fw_store_no_schema"
    with psycopg.connect(plain, autocommit=True) as conn:
        conn.execute(f"DROP DATABASE IF EXISTS {name}")
        conn.execute(f"CREATE DATABASE {name}")
    try:
        empty = make_url(db_url).set(database=name).render_as_string(hide_password=False)
        code, output = _run(empty, "--scenario", str(scenario), "--to", "1h")
        assert code == 2 and "run `fabricwatch db upgrade` first" in output and "nothing was written" in output
    finally:
        from service.db import dispose_engines

        dispose_engines()
        with psycopg.connect(plain, autocommit=True) as conn:
            conn.execute(f"DROP DATABASE IF EXISTS {name} WITH (FORCE)")
    assert _count(db, "SELECT count(*) FROM series") == 0


def test_memory_bound_splits_a_day_into_spans(db: Engine, scenario: Path) -> None:
    r = generate_into_store(db, scenario, end="50m", now=NOW, memory_bytes=8 * 3000 * 15,  # ~15 steps a span
                            groups={"state", "optics", "traffic", "phy"})
    cap = 8 * 3000 * 15 // (8 * r.series)  # steps a span
    assert cap < 25 and _count(db, "SELECT max(n) FROM sample_chunks") <= cap
    assert r.chunks >= r.series * -(-50 // cap)  # 50 steps in spans of at most `cap`
    with db.connect() as conn:
        got = read_samples(conn, LO, HI)
    assert len(got) == r.samples


def test_days_are_one_chunk_each_over_many_days(db: Engine, scenario: Path) -> None:
    # a buffer holds a day and a step: the step that opens each day must not push the day's first
    # samples into a chunk of their own
    r = generate_into_store(db, scenario, start="2025-01-01T00:00:00Z", end="3d", step="30m",
                            now=datetime(2025, 2, 1, tzinfo=UTC), groups={"optics"})
    per_day = _count(db, "SELECT max(c) FROM (SELECT count(*) AS c FROM sample_chunks GROUP BY series_id, "
                         "date_trunc('day', first_ts AT TIME ZONE 'UTC')) x")
    assert per_day == 1 and r.chunks == _count(db, "SELECT count(*) FROM sample_chunks")
    # 3 days, and the step at midnight closing the third: its samples stamped (jitter) after midnight
    assert r.series * 3 < r.chunks < r.series * 4
    with db.connect() as conn:
        assert len(read_samples(conn, LO, LO + (HI - LO) * 2)) == r.samples


def test_the_rollup_task_rolls_up_what_the_store_run_wrote(db: Engine, scenario: Path) -> None:
    """Chunks are history the rollup watermark never reads: the run marks its hours, and the rollup
    task's 5m and 1h rows then match the stored samples (chunks and hot rows alike)."""
    from service.telemetry.rollups import run_rollups

    generate_into_store(db, scenario, now=NOW, groups={"traffic", "optics"})
    assert _count(db, "SELECT count(*) FROM rollup_backfill") == 4  # 23:00 to 01:00, and 02:00 after them
    runs = run_rollups(db, now=NOW, max_chunks=100)
    assert [r.backfill_left for r in runs] == [False, False] and _count(db, "SELECT count(*) FROM rollup_backfill") == 0
    with db.connect() as conn:
        got = read_samples(conn, LO, HI)
        for table, width in (("rollup_5m", 300_000), ("rollup_1h", 3_600_000)):
            bucket = got.ts_ms // width * width
            want: dict[tuple[int, int], tuple[int, float, float, float]] = {}
            for s, b, v in zip(got.sid.tolist(), bucket.tolist(), got.value.tolist(), strict=True):
                n, mn, mx, _ = want.get((s, b), (0, v, v, v))
                want[(s, b)] = (n + 1, min(mn, v), max(mx, v), v)  # sorted by series and time: v is the last
            rows = conn.execute(text(f"SELECT series_id, (extract(epoch FROM bucket) * 1000)::bigint, n, min, max, "
                                     f"last FROM {table}")).all()
            assert {(r[0], r[1]): tuple(r[2:]) for r in rows} == want, table
