"""What schemathesis found (tests/badinput/test_api_schemathesis.py), each fixed at its root and kept here
as a fast test that failed before the fix."""

from __future__ import annotations

from datetime import UTC, datetime, timedelta

from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.config import load_settings
from tests.api import fabric_seed
from tests.badinput import full_app


def test_patch_with_null_times_keeps_them(db: Engine, db_url: str) -> None:
    """PATCH {"starts_at": null} compared None with a datetime: a 500. null now means unchanged, as the
    service already treated it."""
    client = TestClient(full_app(load_settings(database_url=db_url, auth_required=False)))
    until = (datetime.now(UTC) + timedelta(hours=2)).isoformat()
    silence = client.post("/api/v1/silences", json={"matchers": [{"name": "device", "value": "leaf-1"}],
                                                      "ends_at": until, "comment": "c"}).json()
    window = client.post("/api/v1/maintenance", json={"device": "leaf-1", "ends_at": until}).json()
    for path, before in ((f"/api/v1/silences/{silence['id']}", silence),
                         (f"/api/v1/maintenance/{window['id']}", window)):
        for body in ({"starts_at": None}, {"ends_at": None}, {"starts_at": None, "ends_at": None, "comment": None}):
            r = client.patch(path, json=body)
            assert r.status_code == 200, (path, body, r.text)
            assert (r.json()["starts_at"], r.json()["ends_at"]) == (before["starts_at"], before["ends_at"])
        r = client.patch(path, json={"ends_at": before["starts_at"]})
        assert r.status_code == 422 and "ends_at must be after starts_at" in r.text


def test_nccl_compare_with_min_busbw_zero(db: Engine, db_url: str) -> None:
    """?min_busbw=0 let sizes whose baseline busbw is 0.00 (small messages) in: ZeroDivisionError, a 500."""
    nccl = fabric_seed.seed_nccl_runs(db, fabric_seed.START + 1800)
    client = TestClient(full_app(load_settings(database_url=db_url, auth_required=False)))
    r = client.get(f"/api/v1/nccl/runs/{nccl.latest_run_id}/compare", params={"min_busbw": 0})
    assert r.status_code == 200, r.text
    sizes = r.json()["sizes"]
    assert sizes and all(s["baseline_busbw"] > 0 for s in sizes)
    everything = client.get(f"/api/v1/nccl/runs/{nccl.latest_run_id}/compare", params={"min_busbw": 1}).json()
    assert len(sizes) >= len(everything["sizes"])
