"""Time parameters, on every endpoint that takes one: RFC 3339 or Unix milliseconds in one documented
range; out of range, malformed or plausibly Unix seconds is a 422 problem naming the parameter."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.api.params import TIME_DOC
from service.config import load_settings

# (method, path, parameter, other parameters the call needs). Every time parameter of the API is here
# (test_every_time_parameter_is_listed walks the OpenAPI document to keep it so).
TIME_PARAMS = [
    ("GET", "/api/v1/series", "start", {"metric": "port_oper_up"}),
    ("GET", "/api/v1/series", "end", {"metric": "port_oper_up"}),
    ("GET", "/api/v1/kpis", "start", {}),
    ("GET", "/api/v1/kpis", "end", {}),
    ("GET", "/api/v1/kpis/recovery", "start", {}),
    ("GET", "/api/v1/kpis/recovery", "end", {}),
    ("GET", "/api/v1/incidents/{incident_id}/soak", "at", {}),
    ("POST", "/api/v1/nccl", "run_at", {}),
]
IDS = [f"{m} {p} {name}" for m, p, name, _ in TIME_PARAMS]
# Names a new time parameter would likely have; any query parameter so named must use the shared parser.
TIME_NAMES = {"start", "end", "at", "run_at", "since", "until", "from", "to", "before", "after", "time"}


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


def _call(client: TestClient, method: str, path: str, params: dict[str, Any]) -> Any:
    return client.request(method, path.replace("{incident_id}", "999999"), params=params)


def _refused(r: Any, name: str) -> str:
    assert r.status_code == 422, r.text
    assert r.headers["content-type"] == "application/problem+json"
    body = r.json()
    assert body["errors"] == [{"loc": ["query", name], "msg": body["detail"].removeprefix(f"query.{name}: ")}]
    assert body["detail"].startswith(f"query.{name}: ")
    return body["detail"]


@pytest.mark.parametrize(("method", "path", "name", "extra"), TIME_PARAMS, ids=IDS)
def test_out_of_range_names_the_parameter_and_the_range(client: TestClient, method: str, path: str, name: str,
                                                        extra: dict[str, Any]) -> None:
    for value in ("99999999999999999", "-1", "0001-01-01T00:00:00Z", "9999-12-31T23:59:59-05:00",
                  "1999-12-31T23:59:59Z", "9" * 400):
        detail = _refused(_call(client, method, path, {**extra, name: value}), name)
        assert "out of range" in detail
        assert "2000-01-01T00:00:00Z (946684800000)" in detail and "2200-01-01T00:00:00Z (7258118400000" in detail


@pytest.mark.parametrize(("method", "path", "name", "extra"), TIME_PARAMS, ids=IDS)
def test_unix_seconds_are_refused_with_a_hint(client: TestClient, method: str, path: str, name: str,
                                              extra: dict[str, Any]) -> None:
    for value, as_ms in (("1764500000", "1764500000000"), ("1764500000.5", "1764500000500")):
        detail = _refused(_call(client, method, path, {**extra, name: value}), name)
        assert "looks like Unix seconds (2025-11-30T10:53:20Z)" in detail and f"milliseconds ({as_ms})" in detail


@pytest.mark.parametrize(("method", "path", "name", "extra"), TIME_PARAMS, ids=IDS)
def test_malformed_is_refused(client: TestClient, method: str, path: str, name: str, extra: dict[str, Any]) -> None:
    for value in ("yesterday", "2026-13-01T00:00:00Z", "1e12", "nan", ""):
        detail = _refused(_call(client, method, path, {**extra, name: value}), name)
        assert "neither RFC 3339" in detail and "nor Unix milliseconds" in detail


@pytest.mark.parametrize(("method", "path", "name", "extra"), TIME_PARAMS, ids=IDS)
def test_milliseconds_and_rfc3339_are_accepted(client: TestClient, method: str, path: str, name: str,
                                               extra: dict[str, Any]) -> None:
    for value in ("1764500000000", "2025-11-30T10:53:20Z", "2025-11-30T10:53:20.000Z", "2025-11-30T10:53:20"):
        r = _call(client, method, path, {**extra, name: value})
        # Whatever else the call lacks (an incident, a body), the time itself is not what is refused.
        assert r.status_code < 500 and name not in str(r.json().get("errors", "")), r.text


def test_milliseconds_mean_milliseconds(client: TestClient) -> None:
    r = client.get("/api/v1/series", params={"metric": "port_oper_up", "start": "1764500000000",
                                              "end": "2025-11-30T12:53:20+01:00"})
    assert r.status_code == 200, r.text
    assert (r.json()["start"], r.json()["end"]) == ("2025-11-30T10:53:20+00:00", "2025-11-30T11:53:20+00:00")
    r = client.get("/api/v1/kpis/recovery", params={"start": "1764500000000", "end": "1764500000001"})
    assert (r.json()["start"], r.json()["end"]) == ("2025-11-30T10:53:20+00:00", "2025-11-30T10:53:20.001000+00:00")


def test_start_after_end_is_refused(client: TestClient) -> None:
    for path, extra in (("/api/v1/series", {"metric": "port_oper_up"}), ("/api/v1/kpis", {}),
                        ("/api/v1/kpis/recovery", {})):
        detail = _refused(client.get(path, params={**extra, "start": "1764500000001", "end": "1764500000000"}),
                          "start")
        assert "is after end" in detail


def test_an_open_ended_range_near_the_lower_bound_does_not_overflow(client: TestClient) -> None:
    r = client.get("/api/v1/kpis/recovery", params={"end": "2000-01-01T00:00:00Z"})
    assert r.status_code == 200 and r.json()["start"] == "1999-12-02T00:00:00+00:00"


def test_every_time_parameter_is_listed_and_documented_alike(client: TestClient) -> None:
    found = set()
    for path, ops in client.get("/openapi.json").json()["paths"].items():
        for method, op in ops.items():
            for p in op.get("parameters", []):
                if p["in"] != "query":
                    continue
                dated = any(s.get("format") in ("date-time", "date") for s in p["schema"].get("anyOf", [p["schema"]]))
                if p["name"] in TIME_NAMES or dated:
                    found.add((method.upper(), path, p["name"]))
                    assert TIME_DOC in p.get("description", ""), (method, path, p["name"])
    assert found == {(m, p, n) for m, p, n, _ in TIME_PARAMS}
