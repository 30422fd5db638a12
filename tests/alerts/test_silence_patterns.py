"""Silence patterns run on RE2: no pattern can stall the cycle that holds the alert lock, and patterns
RE2 cannot run in linear time are refused when the silence is written (a 422 naming the matcher)."""

from __future__ import annotations

import time
from collections.abc import Iterator
from datetime import UTC, datetime

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine, insert, select

from service.alerts.matchers import PatternError, compile_pattern, matcher_hits
from service.alerts.models import Alert, Silence
from service.alerts.service import apply_findings
from service.api.app import create_app
from service.config import load_settings
from tests.alerts import T0, finding

SILENCE = {"starts_at": "2020-01-01T00:00:00Z", "ends_at": "2099-01-01T00:00:00Z", "comment": "test"}


@pytest.fixture()
def client(db: Engine, db_url: str) -> Iterator[TestClient]:
    with TestClient(create_app(load_settings(database_url=db_url, auth_required=False))) as c:
        yield c


def _regex(name: str, value: str, is_equal: bool = True) -> dict[str, object]:
    return {"name": name, "value": value, "is_regex": True, "is_equal": is_equal}


@pytest.mark.serial
def test_catastrophic_pattern_does_not_stall_the_cycle(client: TestClient, db: Engine) -> None:
    # On Python's backtracking `re`, (.|.)*y against 25 x's takes seconds (it doubles per character).
    r = client.post("/api/v1/silences", json={**SILENCE, "matchers": [_regex("port", "(.|.)*y")]})
    assert r.status_code == 201, r.text
    loud = client.post("/api/v1/silences", json={**SILENCE, "matchers": [_regex("port", "(x|x)+")]})
    assert loud.status_code == 201, loud.text
    t0 = time.monotonic()
    with db.begin() as conn:
        apply_findings(conn=conn, findings=[finding(port="x" * 25), finding(port="z" * 25)], at_ms=T0)
    assert time.monotonic() - t0 < 2.0
    with db.connect() as conn:
        muted = dict(conn.execute(select(Alert.port, Alert.muted_by)).all())
    assert muted == {"x" * 25: f"silence:{loud.json()['id']}", "z" * 25: None}


@pytest.mark.parametrize(("pattern", "why"), [
    (r"(a)\1", "invalid escape sequence"),       # a backreference: Python's re takes it, RE2 cannot
    (r"leaf(?=-01)", "invalid perl operator"),   # lookahead
    ("(", "missing )"),
])
def test_patterns_re2_refuses_are_a_422_naming_the_matcher(client: TestClient, pattern: str, why: str) -> None:
    body = {**SILENCE, "matchers": [{"name": "kind", "value": "rx_power_degrading"}, _regex("device", pattern)]}
    r = client.post("/api/v1/silences", json=body)
    assert r.status_code == 422, r.text
    detail = r.json()["detail"]
    assert detail.startswith("body.matchers.1") and "matcher device=~" in detail and why in detail, detail
    assert client.get("/api/v1/silences").json() == []  # nothing written
    ok = client.post("/api/v1/silences", json={**SILENCE, "matchers": [_regex("device", "leaf-0[12]")]})
    assert ok.status_code == 201
    r = client.patch(f"/api/v1/silences/{ok.json()['id']}", json={"matchers": [_regex("port", pattern)]})
    assert r.status_code == 422 and "matcher port=~" in r.json()["detail"]


def test_a_stored_pattern_re2_refuses_mutes_nothing(db: Engine) -> None:
    """Silences written before patterns were checked against RE2 must not stop the cycle."""
    with db.begin() as conn:
        conn.execute(insert(Silence).values(matchers=[_regex("device", r"(leaf)-\1")], comment="old",
                                            starts_at=datetime(2020, 1, 1, tzinfo=UTC),
                                            ends_at=datetime(2099, 1, 1, tzinfo=UTC), created_by="test"))
    with db.begin() as conn:
        apply_findings(conn=conn, findings=[finding()], at_ms=T0)
    with db.connect() as conn:
        assert conn.execute(select(Alert.muted_by)).scalar_one() is None


def test_matcher_semantics() -> None:
    assert matcher_hits(_regex("device", "leaf-0[12]"), "leaf-01")
    assert not matcher_hits(_regex("device", "leaf-0[12]"), "leaf-011")  # anchored, as in Alertmanager
    assert matcher_hits(_regex("device", "spine.*", is_equal=False), "leaf-01")
    assert matcher_hits({"name": "device", "value": "leaf-01"}, "leaf-01")
    assert matcher_hits({"name": "device", "value": "leaf-01", "is_equal": False}, "leaf-02")
    with pytest.raises(PatternError, match="missing"):
        compile_pattern("[")
