"""Every list endpoint validates its filters: a value outside a closed set (alert states, severities,
causes, device roles, protocols, scopes...) is a 422 problem+json that names the allowed values,
never an empty 200 that looks like "nothing matches"."""

from __future__ import annotations

from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient

from service.api.app import create_app
from service.config import load_settings

# (path, query parameter with a closed set of values, one allowed value). Walked below; the OpenAPI
# walk keeps this table complete.
ENUM_FILTERS = [
    ("/api/v1/alerts", "state", "firing"),
    ("/api/v1/alerts", "severity", "page"),
    ("/api/v1/alerts", "cause", "fiber_damage"),
    ("/api/v1/alerts", "sort", "-updated"),
    ("/api/v1/drains", "status", "pending"),
    ("/api/v1/incidents", "state", "suspect"),
    ("/api/v1/incidents", "cause", "flap_storm"),
    ("/api/v1/devices", "role", "leaf"),
    ("/api/v1/devices", "kind", "switch"),
    ("/api/v1/targets", "protocol", "snmp"),
    ("/api/v1/targets", "state", "degraded"),
    ("/api/v1/kpis", "scope", "leaf"),
]
# Numeric filters that cannot be negative: lanes, priorities, GPUs and rails count from 0.
NUMERIC_FILTERS = [
    ("/api/v1/series", "lane", {"metric": "optic_rx_power_dbm"}),
    ("/api/v1/series", "priority", {"metric": "port_pfc_rx_pause_frames_total"}),
    ("/api/v1/series", "gpu", {"metric": "port_oper_up"}),
    ("/api/v1/ports", "rail", {}),
]


@pytest.fixture(scope="module")
def client(db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


@pytest.fixture(scope="module")
def openapi(client: TestClient) -> dict[str, Any]:
    return client.get("/openapi.json").json()


def _enum(schema: dict[str, Any], components: dict[str, Any]) -> list[str] | None:
    """The allowed values of a parameter's schema (through anyOf, arrays and $refs), or None."""
    if "$ref" in schema:
        return _enum(components[schema["$ref"].rsplit("/", 1)[1]], components)
    if "enum" in schema:
        return schema["enum"]
    if schema.get("type") == "array":
        return _enum(schema["items"], components)
    for option in schema.get("anyOf", []):
        if (found := _enum(option, components)) is not None:
            return found
    return None


def _allowed(openapi: dict[str, Any], path: str, name: str) -> list[str]:
    params = {p["name"]: p for p in openapi["paths"][path]["get"]["parameters"]}
    allowed = _enum(params[name]["schema"], openapi["components"]["schemas"])
    assert allowed, f"{path}?{name} has no closed set of values in the OpenAPI document"
    return allowed


@pytest.mark.parametrize(("path", "name", "good"), ENUM_FILTERS, ids=[f"{p}?{n}" for p, n, _ in ENUM_FILTERS])
def test_unknown_filter_values_are_refused_with_the_allowed_ones(client: TestClient, openapi: dict[str, Any],
                                                                 path: str, name: str, good: str) -> None:
    allowed = _allowed(openapi, path, name)
    assert good in allowed
    for bogus in ("bogus", "critical", good.upper(), ""):
        r = client.get(path, params={name: bogus})
        assert r.status_code == 422, f"{path}?{name}={bogus} -> {r.status_code} {r.text[:200]}"
        assert r.headers["content-type"] == "application/problem+json"
        body = r.json()
        assert body["errors"][0]["loc"][:2] == ["query", name]
        assert all(f"'{v}'" in body["detail"] for v in allowed), body["detail"]
    assert client.get(path, params={name: good}).status_code == 200


@pytest.mark.parametrize(("path", "name", "extra"), NUMERIC_FILTERS, ids=[f"{p}?{n}" for p, n, _ in NUMERIC_FILTERS])
def test_negative_indexes_are_refused(client: TestClient, path: str, name: str, extra: dict[str, Any]) -> None:
    r = client.get(path, params={**extra, name: -1})
    assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json"
    assert r.json()["errors"][0]["loc"] == ["query", name] and "greater than or equal to 0" in r.json()["detail"]
    assert client.get(path, params={**extra, name: 0}).status_code == 200


def test_alert_filters_still_filter(client: TestClient) -> None:
    r = client.get("/api/v1/alerts", params=[("state", "firing"), ("state", "acknowledged"), ("severity", "page"),
                                             ("cause", "fiber_damage"), ("cause", "flap_storm")])
    assert r.status_code == 200 and r.json() == {"items": [], "next_cursor": None}


def test_every_closed_filter_of_every_list_endpoint_is_walked(openapi: dict[str, Any]) -> None:
    components = openapi["components"]["schemas"]
    closed = {(path, p["name"]) for path, ops in openapi["paths"].items() if "get" in ops
              for p in ops["get"].get("parameters", [])
              if p["in"] == "query" and _enum(p["schema"], components) is not None}
    assert closed == {(p, n) for p, n, _ in ENUM_FILTERS}
