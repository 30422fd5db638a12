"""schemathesis against the service's own OpenAPI, in-process (ASGI), auth disabled:
no 5xx anywhere, and every 4xx is application/problem+json. Bounded: 6 examples per operation.

(The schemathesis pytest plugin does not load under this pytest, so operations are iterated here
and each one's schemathesis strategy is run with hypothesis directly.)
"""

from __future__ import annotations

import schemathesis
from hypothesis import HealthCheck, given, settings

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
