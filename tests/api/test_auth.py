"""Tokens: hashed at rest, scopes enforced, 401 without a valid token, 403 with the wrong scope."""

from __future__ import annotations

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api import auth
from service.api.app import create_app
from service.auth.service import create_token
from service.config import load_settings


@pytest.fixture()
def client(db: Engine, db_url: str) -> TestClient:
    auth._failures.clear()
    return TestClient(create_app(load_settings(database_url=db_url)))


def _token(db: Engine, *scopes: str) -> str:
    with db.begin() as conn:
        return create_token(conn, name=f"t-{'-'.join(scopes)}", scopes=list(scopes))


def test_token_is_stored_only_as_a_hash(db: Engine) -> None:
    token = _token(db, "read")
    with db.connect() as conn:
        row = conn.execute(text("SELECT * FROM api_tokens")).mappings().one()
    assert token not in {str(v) for v in row.values()}
    assert row["token_hash"] != token and len(row["token_hash"]) == 64


def test_missing_bad_and_wrong_scope(client: TestClient, db: Engine) -> None:
    r = client.get("/api/v1/targets")
    assert r.status_code == 401 and r.headers["content-type"].startswith("application/problem+json")
    assert client.get("/api/v1/targets", headers={"authorization": "Bearer fw_nope"}).status_code == 401
    read = _token(db, "read")
    assert client.get("/api/v1/targets", headers={"authorization": f"Bearer {read}"}).status_code == 200
    r = client.post("/api/v1/import/prometheus", content="", headers={"authorization": f"Bearer {read}"})
    assert r.status_code == 403 and "ingest" in r.json()["detail"]
    ingest = _token(db, "ingest")
    assert client.post("/api/v1/import/prometheus", content="",
                       headers={"authorization": f"Bearer {ingest}"}).status_code == 200
    assert client.get("/api/v1/targets", headers={"authorization": f"Bearer {ingest}"}).status_code == 403
    admin = _token(db, "admin")
    assert client.get("/api/v1/targets", headers={"authorization": f"Bearer {admin}"}).status_code == 200


def test_revoked_token_is_refused(client: TestClient, db: Engine) -> None:
    token = _token(db, "read")
    with db.begin() as conn:
        conn.execute(text("UPDATE api_tokens SET revoked_at = now()"))
    assert client.get("/api/v1/targets", headers={"authorization": f"Bearer {token}"}).status_code == 401


def test_repeated_failures_are_rate_limited(client: TestClient) -> None:
    codes = [client.get("/api/v1/targets", headers={"authorization": "Bearer fw_x"}).status_code
             for _ in range(25)]
    assert codes[:20] == [401] * 20 and set(codes[20:]) == {429}


def test_health_needs_no_token(client: TestClient) -> None:
    assert client.get("/healthz").json() == {"status": "ok"}


def test_last_used_is_written_at_most_once_a_minute(client: TestClient, db: Engine) -> None:
    """A read request should not cost a write: last_used_at moves only when it is a minute old."""
    token = _token(db, "read")
    hdrs = {"authorization": f"Bearer {token}"}

    def last_used():  # type: ignore[no-untyped-def]
        with db.connect() as conn:
            return conn.execute(text("SELECT last_used_at FROM api_tokens")).scalar_one()

    assert last_used() is None
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 200
    first = last_used()
    assert first is not None
    for _ in range(3):
        assert client.get("/api/v1/targets", headers=hdrs).status_code == 200
    assert last_used() == first
    with db.begin() as conn:
        conn.execute(text("UPDATE api_tokens SET last_used_at = last_used_at - interval '61 seconds'"))
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 200
    assert last_used() > first
