"""Security checks: auth on by default for every /api/v1 route, constant-time token comparison,
429 after repeated failures. Webhook URL policy (allow/deny lists, redirect hops) is covered by
tests/notify/test_urlpolicy.py and tests/notify/test_delivery.py::test_deny_listed_redirect_targets_are_refused.
"""

from __future__ import annotations

import ast
import inspect
import re
from typing import Any

from fastapi.testclient import TestClient

from service.api import auth as api_auth
from service.auth import service as auth_service
from service.config import load_settings
from tests.badinput import full_app


def _routes(routes: list[Any]) -> list[Any]:
    """Flatten app.routes: FastAPI >= 0.16x wraps each included router (whose routes carry its prefix)."""
    out = []
    for r in routes:
        inner = getattr(getattr(r, "original_router", None), "routes", None)
        out.extend(_routes(inner) if inner is not None else [r])
    return out


def _concrete(path: str) -> str:
    return re.sub(r"\{[^}]+\}", "1", path)


def test_every_api_route_needs_a_token_by_default(db_url: str) -> None:
    app = full_app(load_settings(database_url=db_url))  # default settings: auth_required=True
    api_auth._failures.clear()
    routes = [r for r in _routes(app.routes) if getattr(r, "methods", None) and r.path.startswith("/api/v1")]
    assert len(routes) > 20
    unprotected = []
    with TestClient(app) as client:
        for route in routes:
            for method in sorted(route.methods - {"HEAD", "OPTIONS"}):
                api_auth._failures.clear()  # stay under the failure rate limit
                r = client.request(method, _concrete(route.path), headers={"accept": "application/json"})
                if r.status_code != 401 or r.headers["content-type"] != "application/problem+json":
                    unprotected.append((method, route.path, r.status_code))
    api_auth._failures.clear()
    assert not unprotected


def test_token_hashes_are_compared_with_hmac_compare_digest() -> None:
    tree = ast.parse(inspect.getsource(auth_service.verify_token))
    calls = {ast.unparse(n.func) for n in ast.walk(tree) if isinstance(n, ast.Call)}
    assert "hmac.compare_digest" in calls
    compares = [n for n in ast.walk(tree) if isinstance(n, ast.Compare)
                and any(isinstance(op, ast.Eq | ast.NotEq) for op in n.ops)]
    assert not compares, "a token or hash compared with == leaks timing"


def test_repeated_bad_tokens_get_429_problem(db_url: str) -> None:
    app = full_app(load_settings(database_url=db_url))
    api_auth._failures.clear()
    with TestClient(app) as client:
        codes = [client.get("/api/v1/targets", headers={"authorization": "Bearer fw_wrong"}).status_code
                 for _ in range(api_auth.MAX_FAILURES + 2)]
        last = client.get("/api/v1/targets", headers={"authorization": "Bearer fw_wrong"})
    api_auth._failures.clear()
    assert codes[:api_auth.MAX_FAILURES] == [401] * api_auth.MAX_FAILURES
    assert last.status_code == 429 and last.headers["content-type"] == "application/problem+json"
