"""schemathesis against the service's own OpenAPI, in-process (ASGI), auth disabled:
no 5xx anywhere, and every 4xx is application/problem+json. Bounded: 6 examples per operation.
Time parameters (free strings to schemathesis) get their own hypothesis strategy of numbers and dates.

(The schemathesis pytest plugin does not load under this pytest, so operations are iterated here
and each one's schemathesis strategy is run with hypothesis directly.)
"""

from __future__ import annotations

from datetime import datetime, timedelta, timezone

import schemathesis
from fastapi.testclient import TestClient
from hypothesis import HealthCheck, given, settings
from hypothesis import strategies as st

from service.api.params import TIME_MAX, TIME_MIN, parse_time
from service.api.problems import Problem
from service.config import load_settings
from tests.badinput import full_app


def test_no_5xx_and_every_4xx_is_problem_json(db_url: str) -> None:
    app = full_app(load_settings(database_url=db_url, auth_required=False, max_body_bytes=1024 * 1024))
    schema = schemathesis.openapi.from_asgi("/openapi.json", app)
    failures: list[str] = []
    operations = 0
    for result in schema.get_all_operations():
        op = result.ok()
        if "events" in op.path or op.path.endswith("/stream"):
            continue  # server-sent event streams never end
        operations += 1

        @given(case=op.as_strategy())
        @settings(max_examples=6, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(case) -> None:  # type: ignore[no-untyped-def]
            try:
                r = case.call()
            except Exception as exc:  # the in-process client re-raises what would be a 500
                first = str(exc).splitlines()[0][:120]
                failures.append(f"{case.method} {case.path} -> 500 {type(exc).__name__}: {first}")
                return
            ctype = r.headers.get("content-type", "")
            ctype = ctype[0] if isinstance(ctype, list) else ctype
            if r.status_code >= 500 or (400 <= r.status_code < 500 and not ctype.startswith("application/problem")):
                failures.append(f"{case.method} {case.path} -> {r.status_code} {ctype} {r.text[:120]!r}")

        check()
    assert operations > 20
    assert not failures, "\n".join(sorted(set(failures))[:30])


_OFFSETS = st.timedeltas(min_value=-timedelta(hours=23, minutes=59), max_value=timedelta(hours=23, minutes=59))
_TIMES = st.one_of(
    st.integers(min_value=-(10**40), max_value=10**40).map(str),   # ms, seconds, µs, and far past any range
    st.floats().map(str),                                           # nan, inf, 1e+300, fractions
    st.datetimes(timezones=st.none() | st.builds(timezone, _OFFSETS)).map(datetime.isoformat),  # years 1..9999
    st.text(st.characters(blacklist_categories=("Cs",)), max_size=40),
)
# One endpoint per way a time parameter is read: a range's start, a range's end, a single instant.
_TIME_CALLS = [("/api/v1/series", "start", {"metric": "port_oper_up"}), ("/api/v1/kpis/recovery", "end", {}),
               ("/api/v1/incidents/1/soak", "at", {})]


def test_any_time_parameter_is_a_time_in_range_or_a_422_naming_it(db_url: str) -> None:
    """#17: `start=99999999999999999` was a 500 (OSError), `end=0001-01-01T00:00:00` one too (OverflowError)."""
    app = full_app(load_settings(database_url=db_url, auth_required=False))
    failures: list[str] = []
    with TestClient(app, raise_server_exceptions=False) as client:

        @given(value=_TIMES)
        @settings(max_examples=150, deadline=None, derandomize=True, database=None,
                  suppress_health_check=list(HealthCheck))
        def check(value: str) -> None:
            try:
                parsed = parse_time(value, "t")
                assert TIME_MIN <= parsed < TIME_MAX and parsed.tzinfo is not None
            except Problem as exc:
                assert exc.status == 422 and exc.extra["errors"][0]["loc"] == ["query", "t"]
            for path, name, extra in _TIME_CALLS:
                r = client.get(path, params={**extra, name: value})
                ok = r.status_code in (200, 404) or (
                    r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
                    and r.json()["errors"][0]["loc"] == ["query", name])
                if not ok:
                    failures.append(f"{path}?{name}={value!r} -> {r.status_code} {r.text[:120]}")

        check()
    assert not failures, "\n".join(sorted(set(failures))[:20])
