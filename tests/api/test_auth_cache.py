"""FABRICWATCH_AUTH_CACHE_S: a token found valid is trusted again, by the same API process, without a lookup
for that many seconds; a refused token is looked up (and throttled) every time; scopes are still checked;
a revoked token is refused once its time is up, and at once with 0 (service/api/auth.py)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, event, text

from service.api import auth
from service.api.app import create_app
from service.auth.service import create_token
from service.config import load_settings


class Lookups:
    """Token lookups (statements reading api_tokens) the app's engine runs."""

    def __init__(self, engine: Engine) -> None:
        self.engine, self.n = engine, 0
        event.listen(engine, "before_cursor_execute", self._seen)

    def _seen(self, conn: Any, cursor: Any, statement: str, *_: Any) -> None:
        if "FROM api_tokens" in statement:
            self.n += 1

    def remove(self) -> None:
        event.remove(self.engine, "before_cursor_execute", self._seen)


@pytest.fixture()
def fresh() -> Iterator[None]:
    auth._failures.clear()
    auth._verified.clear()
    yield
    auth._verified.clear()


def _app(db_url: str, cache_s: float) -> Any:
    return create_app(load_settings(database_url=db_url, auth_required=True, auth_cache_s=cache_s))


def _token(db: Engine, *scopes: str) -> str:
    with db.begin() as conn:
        return create_token(conn, name=f"t-{'-'.join(scopes)}-{time.monotonic_ns()}", scopes=list(scopes))


def _revoke_all(db: Engine) -> None:
    with db.begin() as conn:
        conn.execute(text("UPDATE api_tokens SET revoked_at = now()"))


def test_a_valid_token_is_looked_up_once_and_its_scope_still_checked(db: Engine, db_url: str, fresh: None) -> None:
    app = _app(db_url, 10)
    lookups = Lookups(app.state.engine)
    try:
        client = TestClient(app)
        hdrs = {"authorization": f"Bearer {_token(db, 'read')}"}
        assert [client.get("/api/v1/targets", headers=hdrs).status_code for _ in range(5)] == [200] * 5
        assert lookups.n == 1  # before: one lookup per request
        # The cached principal is a read token: an ingest endpoint still refuses it.
        assert client.post("/api/v1/import/prometheus", content="", headers=hdrs).status_code == 403
        assert lookups.n == 1
    finally:
        lookups.remove()


def test_a_refused_token_is_never_cached(db: Engine, db_url: str, fresh: None) -> None:
    app = _app(db_url, 10)
    lookups = Lookups(app.state.engine)
    try:
        client = TestClient(app)
        bad = {"authorization": "Bearer fw_not_a_token_at_all"}
        assert [client.get("/api/v1/targets", headers=bad).status_code for _ in range(3)] == [401] * 3
        assert lookups.n == 3 and len(auth._verified) == 0
    finally:
        lookups.remove()


def test_a_revoked_token_is_refused_when_its_time_is_up(db: Engine, db_url: str, fresh: None) -> None:
    client = TestClient(_app(db_url, 0.5))
    hdrs = {"authorization": f"Bearer {_token(db, 'read')}"}
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 200
    _revoke_all(db)
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 200  # the documented window
    time.sleep(0.6)
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 401


def test_with_no_cache_a_revoked_token_is_refused_at_once(db: Engine, db_url: str, fresh: None) -> None:
    client = TestClient(_app(db_url, 0))
    hdrs = {"authorization": f"Bearer {_token(db, 'read')}"}
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 200
    _revoke_all(db)
    assert client.get("/api/v1/targets", headers=hdrs).status_code == 401


def test_a_token_is_trusted_only_in_the_database_that_verified_it() -> None:
    cache = auth.TokenCache(max_keys=2)
    p = auth.ANONYMOUS_ADMIN
    cache.put(("db-a", "t1"), p, 10)
    assert cache.get(("db-a", "t1")) is p and cache.get(("db-b", "t1")) is None
    cache.put(("db-a", "t2"), p, 10)
    cache.put(("db-a", "t3"), p, 10)  # over max_keys: the least recently verified goes
    assert cache.get(("db-a", "t1")) is None and len(cache) == 2
    cache.put(("db-a", "t4"), p, -1)  # already expired
    assert cache.get(("db-a", "t4")) is None
