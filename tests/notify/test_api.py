"""Webhook API: CRUD, write-only secrets (never returned, never logged), URL policy, test-fire, delivery log."""

from __future__ import annotations

import logging
from collections.abc import Iterator

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from tests.alerts.test_api import make_app
from tests.receiver import Receiver

SECRET = "super-secret-signing-key-4711"
ROUTING = "pd-routing-key-0815-0815"


@pytest.fixture()
def client(db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[TestClient]:
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    with TestClient(make_app(db_url, auth_required=False)) as c:
        yield c


def test_crud_secrets_are_write_only_and_never_logged(client: TestClient, caplog: pytest.LogCaptureFixture) -> None:
    caplog.set_level(logging.DEBUG)
    receiver = Receiver().start()
    try:
        r = client.post("/api/v1/webhooks", json={"name": "noc", "url": receiver.url + "/hook", "secret": SECRET,
                                                  "filters": {"severity": ["page"]}})
        assert r.status_code == 201, r.text
        wid = r.json()["id"]
        r2 = client.post("/api/v1/webhooks", json={"name": "pd", "url": receiver.url + "/pd",
                                                   "format": "pagerduty", "routing_key": ROUTING})
        assert r2.status_code == 201
        slack = client.post("/api/v1/webhooks", json={"name": "slack", "format": "slack",
                                                      "url": receiver.url + "/services/T000/B000/XXXXSECRET"})
        assert slack.json()["url"] == receiver.url + "/…"
        assert client.post("/api/v1/webhooks", json={"name": "noc", "url": receiver.url}).status_code == 409
        assert client.post("/api/v1/webhooks", json={"name": "x", "url": receiver.url,
                                                     "format": "pagerduty"}).status_code == 422
        assert client.post("/api/v1/webhooks", json={"name": "x", "url": receiver.url, "secret": "short"}
                           ).status_code == 422

        test = client.post(f"/api/v1/webhooks/{wid}/test")
        assert test.status_code == 200, test.text
        assert test.json()["outcome"] == "delivered" and test.json()["delivery"]["status_code"] == 200
        (req,) = receiver.bodies("/hook")
        assert req.headers["x-fabricwatch-event"] == "test" and req.headers["x-fabricwatch-signature"]
        assert client.post(f"/api/v1/webhooks/{r2.json()['id']}/test").json()["outcome"] == "delivered"
        assert ROUTING.encode() in receiver.bodies("/pd")[0].body  # used to send, never shown

        receiver.script.append((503, {"retry-after": "120"}))
        failed = client.post(f"/api/v1/webhooks/{wid}/test").json()
        assert failed["outcome"] == "retry" and failed["delivery"]["error"] == "HTTP 503"
        log = client.get(f"/api/v1/webhooks/{wid}/deliveries", params={"limit": 1}).json()
        assert len(log["items"]) == 1 and log["next_cursor"]
        rest = client.get(f"/api/v1/webhooks/{wid}/deliveries", params={"cursor": log["next_cursor"]}).json()
        assert [d["outcome"] for d in log["items"] + rest["items"]] == ["retry", "delivered"]
        assert log["items"][0]["message_status"] == "pending" and log["items"][0]["duration_ms"] >= 0

        r = client.patch(f"/api/v1/webhooks/{wid}", json={"filters": {"kind": ["pause_storm"]}, "enabled": False})
        assert r.json()["filters"]["kind"] == ["pause_storm"] and r.json()["has_secret"] is True
        assert client.patch(f"/api/v1/webhooks/{wid}", json={"clear_secret": True}).json()["has_secret"] is False
        everything = [client.get("/api/v1/webhooks").text, client.get(f"/api/v1/webhooks/{wid}").text,
                      r.text, r2.text, test.text, client.get(f"/api/v1/webhooks/{wid}/deliveries").text]
        for shown in everything:
            assert SECRET not in shown and ROUTING not in shown and "XXXXSECRET" not in shown
        assert '"secret"' not in everything[0] and '"routing_key"' not in everything[0]
        assert SECRET not in caplog.text and ROUTING not in caplog.text and "XXXXSECRET" not in caplog.text
        assert client.delete(f"/api/v1/webhooks/{wid}").status_code == 204
        assert client.get(f"/api/v1/webhooks/{wid}").status_code == 404
        assert client.post(f"/api/v1/webhooks/{wid}/test").status_code == 404
    finally:
        receiver.stop()


@pytest.mark.parametrize("url", ["http://169.254.169.254/latest/meta-data/", "http://10.0.0.1/hook",
                                 "http://[::ffff:a9fe:a9fe]/", "gopher://127.0.0.1/", "http://localhost.:1/x"])
def test_refused_targets(client: TestClient, url: str) -> None:
    r = client.post("/api/v1/webhooks", json={"name": "bad", "url": url})
    if url.startswith("http://localhost"):
        assert r.status_code == 201  # localhost resolves to 127.0.0.1, allowed in this test
        return
    assert r.status_code == 422 and r.headers["content-type"].startswith("application/problem+json")
    assert r.json()["title"] == "Webhook target refused"


def test_url_change_is_checked(client: TestClient) -> None:
    wid = client.post("/api/v1/webhooks", json={"name": "a", "url": "http://127.0.0.1:1/x"}).json()["id"]
    assert client.patch(f"/api/v1/webhooks/{wid}", json={"url": "http://169.254.169.254/"}).status_code == 422
