"""`/alerts` and `/series` read their query parameters as one model (`read_query`, service/api/params.py)
instead of FastAPI's per-parameter solving: the same answers and 422s as a declared parameter gives, and
the OpenAPI document still describes them (from a documentation twin registered after the route that answers).
"""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.alerts import listcache
from tests.alerts.test_api import make_app, open_alerts


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    listcache.PAGES.clear()
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


def _problem(r: Any) -> tuple[int, list[list[Any]]]:
    return r.status_code, [e["loc"] for e in r.json()["errors"]]


@pytest.mark.parametrize(("params", "loc"), [
    ({"limit": "0"}, ["query", "limit"]),
    ({"limit": "501"}, ["query", "limit"]),
    ({"limit": ""}, ["query", "limit"]),  # a blank value is a value, as in FastAPI
    ({"limit": "ten"}, ["query", "limit"]),
    ({"sort": "newest"}, ["query", "sort"]),
    ({"state": ["firing", "sleeping"]}, ["query", "state", 1]),
    ({"severity": "loud"}, ["query", "severity", 0]),
])
def test_a_bad_alerts_parameter_is_a_422_naming_it(client: TestClient, params: dict[str, Any],
                                                   loc: list[Any]) -> None:
    r = client.get("/api/v1/alerts", params=params)
    assert _problem(r) == (422, [loc])
    assert r.headers["content-type"] == "application/problem+json"
    assert r.json()["detail"].startswith(".".join(str(p) for p in loc) + ": ")


def test_alerts_parameters_repeated_unknown_and_listed(client: TestClient, db: Engine) -> None:
    open_alerts(db, 4)
    everything = client.get("/api/v1/alerts").json()["items"]
    assert len(everything) == 4
    # A list parameter takes every value; a plain one the last (FastAPI's rule); unknown ones are ignored.
    ports = [a["port"] for a in everything]
    two = client.get("/api/v1/alerts", params=[("limit", "3"), ("limit", "2"), ("nonsense", "1")]).json()
    assert [a["port"] for a in two["items"]] == ports[:2] and two["next_cursor"]
    picked = client.get("/api/v1/alerts", params=[("state", "firing"), ("state", "resolved"),
                                                  ("kind", everything[0]["kind"])]).json()["items"]
    assert len(picked) == 4
    none = client.get("/api/v1/alerts", params={"state": "resolved"}).json()["items"]
    assert none == []


@pytest.mark.parametrize(("params", "status", "loc"), [
    ({}, 422, ["query", "metric"]),  # required
    ({"metric": "port_rx_bytes_total", "lane": "-1"}, 422, ["query", "lane"]),
    ({"metric": "port_rx_bytes_total", "step": "0"}, 422, ["query", "step"]),
    ({"metric": "port_rx_bytes_total", "raw": "maybe"}, 422, ["query", "raw"]),
    ({"metric": "port_rx_bytes_total", "start": "yesterday"}, 422, ["query", "start"]),  # time_range's own
])
def test_a_bad_series_parameter_is_a_422_naming_it(client: TestClient, params: dict[str, Any], status: int,
                                                   loc: list[Any]) -> None:
    assert _problem(client.get("/api/v1/series", params=params)) == (status, [loc])


def test_series_answers_through_the_model(client: TestClient) -> None:
    r = client.get("/api/v1/series", params=[("metric", "nope"), ("metric", "port_rx_bytes_total"),
                                             ("raw", "true"), ("step", "60")])
    assert r.status_code == 200, r.text
    assert r.json()["metric"] == "port_rx_bytes_total" and r.json()["step"] == 60.0
    assert client.get("/api/v1/series", params={"metric": "nope"}).status_code == 404


def test_the_openapi_document_still_declares_each_parameter(client: TestClient) -> None:
    spec = client.get("/openapi.json").json()
    declared = {path: [(p["name"], p["in"], p.get("required", False)) for p in spec["paths"][path]["get"]["parameters"]]
                for path in ("/api/v1/alerts", "/api/v1/series")}
    assert declared["/api/v1/alerts"] == [(n, "query", False) for n in (
        "state", "severity", "kind", "device", "pod", "cause", "sort", "limit", "cursor")]
    assert declared["/api/v1/series"] == [("metric", "query", True)] + [(n, "query", False) for n in (
        "device", "port", "lane", "priority", "gpu", "start", "end", "step", "raw")]
    limit = next(p for p in spec["paths"]["/api/v1/alerts"]["get"]["parameters"] if p["name"] == "limit")
    assert limit["schema"]["minimum"] == 1 and limit["schema"]["maximum"] == 500
    ops = spec["paths"]["/api/v1/alerts"]["get"]
    assert ops["operationId"] == "list_alerts_api_v1_alerts_get" and "304" in ops["responses"]
    assert spec["paths"]["/api/v1/series"]["get"]["operationId"] == "get_series_api_v1_series_get"
