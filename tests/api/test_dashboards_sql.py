"""Every panel query of our Grafana dashboards runs against real PostgreSQL holding simulated data
and returns rows. Grafana's macros are expanded by `expand` below, the way Grafana's PostgreSQL
data source expands them (see docs/dashboards.md); panels on the alerts, drains, incidents and NCCL tables
get rows through those domains' own service functions. Every query runs as `fabricwatch_grafana`, the
read-only role Grafana connects as (migration 0150), which can write nothing. Template variables that
are queries (kpis.json's $test and $scope) are answered by the database, as Grafana would, and the first
value is used."""

from __future__ import annotations

import json
import re
from collections.abc import Iterator
from contextlib import contextmanager
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import psycopg
import pytest
import yaml
from sqlalchemy import Engine

from service.events import libpq_url
from tests.api.fabric_seed import (
    FAULTY_LEAF,
    FAULTY_PORT,
    START,
    Seeded,
    seed_alerts,
    seed_drain,
    seed_fabric,
    seed_incident_timeline,
    seed_nccl_runs,
)

DASHBOARDS = Path(__file__).resolve().parents[2] / "dashboards"
OURS = ("fabric-overview", "optics", "congestion", "alerts", "drains", "kpis")
DATASOURCE_UID = "fabricwatch-pg"
GRAFANA_ROLE = "fabricwatch_grafana"
BASE_VARIABLES = {"pod": ["p1", "p2"], "device": [FAULTY_LEAF], "port": [FAULTY_PORT]}

_UNITS = {"ms": 0.001, "s": 1, "m": 60, "h": 3600, "d": 86400}


def seconds(interval: str) -> float:
    """A Grafana interval ('30s', '1m', '1h') or a bare number of seconds."""
    m = re.fullmatch(r"'?\s*(\d+(?:\.\d+)?)\s*(ms|s|m|h|d)?\s*'?", interval.strip())
    if not m:
        raise ValueError(f"not an interval: {interval!r}")
    return float(m.group(1)) * _UNITS[m.group(2) or "s"]


def _args(text: str, start: int) -> tuple[list[str], int]:
    """Split a macro's comma-separated arguments, honouring nested parentheses; returns (args, end)."""
    depth, args, cur, i = 0, [], "", start
    while i < len(text):
        ch = text[i]
        if ch == "(":
            depth += 1
        elif ch == ")":
            if depth == 0:
                args.append(cur.strip())
                return args, i + 1
            depth -= 1
        elif ch == "," and depth == 0:
            args.append(cur.strip())
            cur = ""
            i += 1
            continue
        cur += ch
        i += 1
    raise ValueError("unbalanced macro")


def expand(sql: str, *, start: datetime, end: datetime, interval: str, variables: dict[str, list[str]]) -> str:
    """Grafana's PostgreSQL macros and template variables, as plain SQL.

    $__timeFilter(x)            -> x BETWEEN 'start' AND 'end'
    $__timeFrom() / $__timeTo() -> 'start' / 'end'
    $__timeGroup(x, iv)         -> floor(extract(epoch from x)/s)*s   (s = iv in seconds)
    $__timeGroupAlias(x, iv)    -> the same AS "time"
    $__interval / $__interval_ms -> the interval ('1m') / its milliseconds
    $var, ${var}                -> one value as is; several values quoted and comma-separated
    """
    f, t = f"'{start.isoformat()}'", f"'{end.isoformat()}'"
    sql = sql.replace("$__interval_ms", str(int(seconds(interval) * 1000))).replace("$__interval", interval)
    sql = sql.replace("$__timeFrom()", f).replace("$__timeTo()", t)
    for macro in ("$__timeGroupAlias(", "$__timeGroup(", "$__timeFilter("):
        while macro in sql:
            i = sql.index(macro)
            args, j = _args(sql, i + len(macro))
            if macro == "$__timeFilter(":
                rep = f"{args[0]} BETWEEN {f} AND {t}"
            else:
                s = seconds(args[1])
                rep = f"floor(extract(epoch from {args[0]})/{s:g})*{s:g}"
                if macro == "$__timeGroupAlias(":
                    rep += ' AS "time"'
            sql = sql[:i] + rep + sql[j:]
    for name in sorted(variables, key=len, reverse=True):
        vals = variables[name]
        value = vals[0] if len(vals) == 1 else ",".join("'" + v.replace("'", "''") + "'" for v in vals)
        sql = sql.replace("${" + name + "}", value).replace("$" + name, value)
    assert "$" not in sql.replace("$$", ""), f"unexpanded macro or variable in: {sql}"
    return sql


def test_expand_macros() -> None:
    s = expand("SELECT $__timeGroupAlias(to_timestamp(a / 1000.0), $__interval), 1 FROM t "
               "WHERE $__timeFilter(ts) AND pod IN ($pod) AND d = '$device' AND $__interval_ms > 0",
               start=datetime(2026, 1, 1, tzinfo=UTC), end=datetime(2026, 1, 2, tzinfo=UTC), interval="5m",
               variables={"pod": ["p1", "p2"], "device": ["leaf-1"]})
    assert 'floor(extract(epoch from to_timestamp(a / 1000.0))/300)*300 AS "time"' in s
    assert "ts BETWEEN '2026-01-01T00:00:00+00:00' AND '2026-01-02T00:00:00+00:00'" in s
    assert "pod IN ('p1','p2')" in s and "d = 'leaf-1'" in s and "300000 > 0" in s


def _panels(dashboard: dict[str, Any]) -> list[dict[str, Any]]:
    out = []
    for p in dashboard["panels"]:
        out += _panels(p) if "panels" in p else [p]
    return out


def _cases() -> list[Any]:
    cases = []
    for name in OURS:
        d = json.loads((DASHBOARDS / f"{name}.json").read_text())
        for p in _panels(d):
            for t in p["targets"]:
                cases.append(pytest.param(name, p["title"], t["rawSql"], id=f"{name}:{p['id']}"))
    return cases


def _range(fabric: Seeded) -> dict[str, datetime]:
    return {"start": datetime.fromtimestamp(START, tz=UTC), "end": datetime.fromtimestamp(fabric.end_s, tz=UTC)}


def _variables(dashboard: str, conn: psycopg.Connection[Any], fabric: Seeded) -> dict[str, list[str]]:
    """The fixed test values, plus each query variable answered in order (later ones may use earlier ones)."""
    values = dict(BASE_VARIABLES)
    d = json.loads((DASHBOARDS / f"{dashboard}.json").read_text())
    for v in d.get("templating", {}).get("list", []):
        if v.get("type") == "query" and v["name"] not in values:
            sql = expand(v["query"], interval="1m", variables=values, **_range(fabric))
            rows = conn.execute(sql).fetchall()
            assert rows, f"{dashboard}: variable ${v['name']} has no values"
            values[v["name"]] = [str(rows[0][0])]
    return values


@pytest.fixture(scope="module")
def seeded(engine: Engine) -> dict[str, Any]:
    fabric: Seeded = seed_fabric(engine)
    seed_alerts(engine, int(fabric.end_s * 1000))
    seed_drain(engine, fabric.end_s)
    seed_incident_timeline(engine)
    seed_nccl_runs(engine, fabric.end_s)
    return {"fabric": fabric}


@contextmanager
def as_grafana(db_url: str) -> Iterator[psycopg.Connection[Any]]:
    """A connection with Grafana's rights: the read-only role, as the data source logs in."""
    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        conn.execute(f"SET ROLE {GRAFANA_ROLE}")
        conn.execute("SET statement_timeout = '10s'")
        yield conn


def test_dashboards_are_provisionable() -> None:
    uids = set()
    for name in OURS:
        d = json.loads((DASHBOARDS / f"{name}.json").read_text())
        assert d["uid"] not in uids and d["title"].startswith("fabricwatch")
        uids.add(d["uid"])
        for p in _panels(d):
            assert p["datasource"]["uid"] == DATASOURCE_UID and p["targets"], p["title"]
    prov = (DASHBOARDS / "provisioning" / "datasources" / "fabricwatch.yaml").read_text()
    assert f"uid: {DATASOURCE_UID}" in prov


@pytest.mark.parametrize(("dashboard", "title", "raw"), _cases())
def test_panel_sql_returns_rows(dashboard: str, title: str, raw: str, seeded: dict[str, Any], db_url: str) -> None:
    fabric: Seeded = seeded["fabric"]
    with as_grafana(db_url) as conn:
        sql = expand(raw, interval="1m", variables=_variables(dashboard, conn, fabric), **_range(fabric))
        rows = conn.execute(sql).fetchall()
    assert rows, f"{dashboard} / {title} returned no rows"


def _kpi_panel(title_start: str) -> str:
    d = json.loads((DASHBOARDS / "kpis.json").read_text())
    return next(p["targets"][0]["rawSql"] for p in _panels(d) if p["title"].startswith(title_start))


def test_kpi_panels_agree_with_the_kpi_api(seeded: dict[str, Any], db_url: str, engine: Engine) -> None:
    """The Grafana KPI panels and the NOC page (which reads the API) must show the same numbers."""
    from service.kpis.service import Scope, congestion, load_timelines, recovery_times, utilization

    fabric: Seeded = seeded["fabric"]
    rng = _range(fabric)
    step = (rng["end"] - rng["start"]).total_seconds()
    with engine.connect() as c:
        # Buckets are aligned to the step: START (00:00) starts one, so the whole range is one bucket.
        util = {p.group: p.values["utilization_mean"] for p in utilization(conn=c, scope=Scope.LEAF, step_s=step,
                                                                           **rng)}
        ecn = {p.group: p.values["ecn_marked_per_s"] for p in congestion(conn=c, scope=Scope.LEAF, step_s=step, **rng)}
        rec = recovery_times(load_timelines(conn=c, start=rng["start"], end=rng["end"] + timedelta(seconds=1)))
    with as_grafana(db_url) as conn:
        run = lambda title: conn.execute(  # noqa: E731
            expand(_kpi_panel(title), interval="1m", variables=BASE_VARIABLES, **rng)).fetchall()
        for panel, api in (("Utilization", util), ("ECN", ecn)):
            got = {leaf: value for leaf, _, value in run(panel)}
            assert got.keys() == api.keys() and all(got[k] == pytest.approx(api[k]) for k in api), panel
        for cause, n, d50, d90, m50, m90, _, r50, r90 in run("Recovery"):
            g = rec.by_cause[cause]
            assert (n, d50, d90, m50, m90, r50, r90) == (
                g.incidents, g.detect.p50, g.detect.p90, g.mitigate.p50, g.mitigate.p90, g.restore.p50, g.restore.p90
            ), cause


# Tables holding secrets or credentials: Grafana has no business reading them.
SECRET_TABLES = ("api_tokens", "webhook_subscriptions", "webhook_outbox", "endpoints")


def test_grafana_role_reads_only_and_writes_nothing(seeded: dict[str, Any], db_url: str) -> None:
    with psycopg.connect(libpq_url(db_url), autocommit=True) as conn:
        found = conn.execute(
            "SELECT c.relname, c.relispartition FROM pg_class c JOIN pg_namespace n ON n.oid = c.relnamespace "
            "WHERE n.nspname = 'public' AND c.relkind IN ('r', 'p') ORDER BY 1").fetchall()
        tables = [t for t, _ in found]
        cols = dict(conn.execute(
            "SELECT table_name, min(column_name) FROM information_schema.columns WHERE table_schema = 'public' "
            "GROUP BY table_name").fetchall())
    assert {"sample_rows", "alerts", "api_tokens"} <= set(tables) and any(part for _, part in found)
    writes = {"INSERT": "INSERT INTO {t} SELECT * FROM {t} WHERE false",
              "UPDATE": 'UPDATE {t} SET "{c}" = "{c}" WHERE false',
              "DELETE": "DELETE FROM {t} WHERE false", "TRUNCATE": "TRUNCATE {t}"}
    with as_grafana(db_url) as conn:
        for t in tables:
            for verb, sql in writes.items():
                with pytest.raises(psycopg.errors.InsufficientPrivilege):
                    conn.execute(sql.format(t=t, c=cols[t]))
                    pytest.fail(f"{GRAFANA_ROLE} may {verb} {t}")
        for t in SECRET_TABLES:
            with pytest.raises(psycopg.errors.InsufficientPrivilege):
                conn.execute(f"SELECT 1 FROM {t} LIMIT 1")
        with pytest.raises(psycopg.errors.InsufficientPrivilege):
            conn.execute("CREATE TABLE grafana_was_here (x int)")
        # partitions made after the grants (seeding made today's) are read through their parent
        assert conn.execute("SELECT count(*) FROM sample_rows").fetchone()[0] > 0  # type: ignore[index]


def test_compose_grafana_logs_in_as_the_read_only_role() -> None:
    repo = DASHBOARDS.parent
    services = yaml.safe_load((repo / "docker-compose.yml").read_text())["services"]
    env = services["grafana"]["environment"]
    assert env["FABRICWATCH_GRAFANA_PG_USER"] == GRAFANA_ROLE
    assert env["FABRICWATCH_GRAFANA_PG_PASSWORD"] == services["postgres"]["environment"][
        "FABRICWATCH_GRAFANA_DB_PASSWORD"] != services["postgres"]["environment"]["POSTGRES_PASSWORD"]
    init = next(v for v in services["postgres"]["volumes"] if v.split(":")[1] == "/docker-entrypoint-initdb.d")
    script = (repo / init.split(":")[0]).glob("*.sh")
    assert any(f"CREATE ROLE {GRAFANA_ROLE} LOGIN" in p.read_text() for p in script)
