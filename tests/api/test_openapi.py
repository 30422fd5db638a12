"""#17 item 9: the OpenAPI document says what incident tooling will receive, and how to authenticate.

- Every operation has a typed 2xx response (a model, an array of models, text): none is a bare object.
- The Bearer scheme is declared and every /api/v1 operation requires it (Swagger UI's "Authorize").
- `GET /api/v1/events?kinds=` refuses unknown kinds with a 422 naming the allowed ones.
"""

from __future__ import annotations

from typing import Any, get_args

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.auth.service import create_token
from service.config import load_settings
from service.events import KINDS, parse_kinds
from service.fleet import service as fleet_service
from service.fleet.schemas import Health
from tests.badinput import full_app


@pytest.fixture(scope="module")
def spec(db_url: str) -> dict[str, Any]:
    return TestClient(full_app(load_settings(database_url=db_url))).get("/openapi.json").json()


def _resolve(spec: dict[str, Any], schema: dict[str, Any]) -> dict[str, Any]:
    while "$ref" in schema:
        schema = spec["components"]["schemas"][schema["$ref"].rsplit("/", 1)[1]]
    return schema


def _untyped(spec: dict[str, Any], schema: dict[str, Any]) -> str | None:
    """Why a response schema says nothing about its content, or None when it is typed."""
    schema = _resolve(spec, schema)
    if not schema:
        return "empty schema"
    if schema.get("type") == "array":
        return _untyped(spec, schema.get("items") or {})
    if schema.get("type") == "object" or "additionalProperties" in schema:
        extra = schema.get("additionalProperties")
        if not schema.get("properties") and extra in (None, True, {}):
            return "object without properties"
    return None


def test_every_operation_has_a_typed_2xx_response(spec: dict[str, Any]) -> None:
    bad, operations = [], 0
    for path, ops in spec["paths"].items():
        for method, op in ops.items():
            operations += 1
            ok = {code: r for code, r in op["responses"].items() if code.startswith("2")}
            if not ok:
                bad.append(f"{method.upper()} {path}: no 2xx response")
            for code, response in ok.items():
                content = response.get("content")
                if not content:
                    if code != "204":
                        bad.append(f"{method.upper()} {path} {code}: no content described")
                    continue
                for media, body in content.items():
                    why = _untyped(spec, body.get("schema") or {})
                    if why:
                        bad.append(f"{method.upper()} {path} {code} {media}: {why}")
    assert operations >= 59
    assert not bad, "\n".join(bad)


def test_bearer_scheme_is_declared_for_every_api_operation(spec: dict[str, Any]) -> None:
    schemes = spec["components"]["securitySchemes"]
    assert schemes == {"HTTPBearer": {"type": "http", "scheme": "bearer", "description": schemes["HTTPBearer"]
                                      ["description"]}}
    missing = [f"{m.upper()} {p}" for p, ops in spec["paths"].items() for m, op in ops.items()
               if p.startswith("/api/v1") and {"HTTPBearer": []} not in op.get("security", [])]
    assert not missing
    open_ = [p for p, ops in spec["paths"].items() for op in ops.values()
             if not p.startswith("/api/v1") and op.get("security")]
    assert not open_  # /healthz, /readyz, /metrics stay open (docs/api.md)


def test_import_bodies_are_described_as_text(spec: dict[str, Any]) -> None:
    for path in ("/api/v1/import/prometheus", "/api/v1/nccl"):
        body = spec["paths"][path]["post"]["requestBody"]
        assert body["required"] and body["content"]["text/plain"]["schema"]["type"] == "string"


def test_health_literal_matches_the_fleet_service() -> None:
    assert get_args(Health) == fleet_service.HEALTH


def test_event_kinds_outside_the_known_ones_are_a_422_naming_them(db: Engine, db_url: str) -> None:
    with db.begin() as conn:
        token = create_token(conn, name="sse-kinds", scopes=["read"])
    client = TestClient(full_app(load_settings(database_url=db_url)))
    for bad in ("alert,bogus", "Alert", ",", ""):
        r = client.get("/api/v1/events", params={"kinds": bad}, headers={"authorization": f"Bearer {token}"})
        assert r.status_code == 422 and r.headers["content-type"] == "application/problem+json", (bad, r.text)
        assert r.json()["errors"][0]["loc"] == ["query", "kinds"]
        assert all(k in r.json()["detail"] for k in KINDS), r.json()["detail"]
    assert "'bogus'" in client.get("/api/v1/events", params={"kinds": "bogus"},
                                   headers={"authorization": f"Bearer {token}"}).json()["detail"]
    assert parse_kinds(None) is None and parse_kinds(" drain , alert") == {"alert", "drain"}
