"""fabricwatch_http_request_seconds: one observation per request, labelled by route template and status."""

from __future__ import annotations

from fastapi.testclient import TestClient
from prometheus_client import REGISTRY
from sqlalchemy import Engine

from service.api.app import create_app
from service.config import load_settings


def _count(route: str, status: str) -> float:
    value = REGISTRY.get_sample_value("fabricwatch_http_request_seconds_count",
                                      {"method": "GET", "route": route, "status": status})
    return value or 0.0


def test_each_request_is_timed_once_under_its_route_and_status(db: Engine, db_url: str) -> None:
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=True))) as c:
        before = {k: _count(*k) for k in (("/api/v1/alerts/{alert_id}", "401"), ("/healthz", "200"),
                                          ("unmatched", "404"))}
        assert c.get("/api/v1/alerts/7").status_code == 401  # refused by the token check, before any route ran
        assert c.get("/healthz").status_code == 200
        assert c.get("/healthz").status_code == 200
        assert c.get("/no/such/page").status_code == 404
    # The token check answers before routing: the route is not known, and is labelled so.
    assert _count("unmatched", "401") >= 1
    assert _count("/api/v1/alerts/{alert_id}", "401") == before[("/api/v1/alerts/{alert_id}", "401")]
    assert _count("/healthz", "200") == before[("/healthz", "200")] + 2
    assert _count("unmatched", "404") == before[("unmatched", "404")] + 1
