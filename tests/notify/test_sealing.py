"""Webhook secrets and routing keys are sealed at rest: no plaintext in the table, rotation with
`fabricwatch secrets rotate`, plaintext rows from before sealed by the next delivery round, and a
wrong or missing key is a clear error (in the delivery log, the API and the command), never a crash."""

from __future__ import annotations

import os
import subprocess
import sys
from collections.abc import Iterator
from pathlib import Path

import httpx
import pytest
from cryptography.fernet import Fernet, MultiFernet
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.config import get_settings
from service.notify import signing
from service.notify.outbox import deliver_due
from service.notify.sealing import PREFIX, Sealer, SealError
from tests.alerts.test_api import make_app
from tests.notify.test_delivery import FAST, open_alerts, subscribe
from tests.receiver import Received, Receiver

SECRET = "plain-signing-secret-4711"
ROUTING = "pd-routing-key-0815-0815"
KEY_A, KEY_B, KEY_C = (Fernet.generate_key().decode() for _ in range(3))


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


@pytest.fixture()
def key_a(monkeypatch: pytest.MonkeyPatch) -> str:
    monkeypatch.setenv("FABRICWATCH_SECRETS_KEY", KEY_A)
    return KEY_A


def stored(db: Engine) -> dict[str, tuple[str | None, str | None]]:
    with db.connect() as conn:
        return {r.name: (r.secret, r.routing_key) for r in
                conn.execute(text("SELECT name, secret, routing_key FROM webhook_subscriptions"))}


def whole_table(db: Engine) -> str:
    with db.connect() as conn:
        return "\n".join(conn.execute(text("SELECT t::text FROM webhook_subscriptions t")).scalars())


def rotate(db_url: str, **env: str) -> subprocess.CompletedProcess[str]:
    clean = {k: v for k, v in os.environ.items() if not k.startswith("FABRICWATCH_SECRETS_KEY")}
    return subprocess.run([sys.executable, "-m", "service.cli", "secrets", "rotate"], capture_output=True, text=True,
                          timeout=60, env={**clean, "FABRICWATCH_DATABASE_URL": db_url, **env})


def verified(req: Received, secret: str) -> bool:
    h = httpx.Headers(req.headers)
    return signing.verify(secret, h["x-fabricwatch-timestamp"], h["x-fabricwatch-signature"], req.body)


def test_the_table_holds_no_plaintext_and_delivery_opens_it(db: Engine, db_url: str, key_a: str,
                                                            receiver: Receiver,
                                                            monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    with TestClient(make_app(db_url, auth_required=False)) as client:
        assert client.post("/api/v1/webhooks", json={"name": "noc", "url": receiver.url + "/hook",
                                                     "secret": SECRET}).status_code == 201
        made = client.post("/api/v1/webhooks", json={"name": "pd", "url": receiver.url + "/pd", "format": "pagerduty",
                                                     "routing_key": ROUTING})
        assert made.status_code == 201 and made.json()["has_routing_key"]
        patched = client.patch(f"/api/v1/webhooks/{made.json()['id']}", json={"secret": SECRET + "-pd"})
        assert patched.status_code == 200 and patched.json()["has_secret"]
    table = whole_table(db)
    assert SECRET not in table and ROUTING not in table
    values = stored(db)
    assert all(v.startswith(PREFIX) for v in (values["noc"][0], *values["pd"]))
    sealer = Sealer.from_settings()
    assert sealer.open(values["noc"][0]) == SECRET and sealer.open(values["pd"][1]) == ROUTING

    open_alerts(db, 1)
    deliver_due(db, settings=FAST)
    (noc,) = receiver.bodies("/hook")
    (pd,) = receiver.bodies("/pd")
    assert verified(noc, SECRET) and verified(pd, SECRET + "-pd")
    assert f'"routing_key":"{ROUTING}"'.encode() in pd.body


def test_rotate_reseals_with_the_new_key_and_seals_plaintext_rows(db: Engine, db_url: str, key_a: str,
                                                                  receiver: Receiver, tmp_path: Path,
                                                                  monkeypatch: pytest.MonkeyPatch) -> None:
    subscribe(db, receiver.url + "/hook", secret=SECRET)
    subscribe(db, receiver.url + "/pd", name="pd", fmt="pagerduty", routing_key=ROUTING)
    subscribe(db, receiver.url + "/old", name="old")
    with db.begin() as conn:  # a row written before sealing existed
        conn.execute(text("UPDATE webhook_subscriptions SET secret = :s WHERE name = 'old'"), {"s": SECRET + "-old"})
    before = stored(db)

    keys = tmp_path / "secrets.key"
    keys.write_text(f"{KEY_B}\n{KEY_A}\n")  # the new key first; the old one still opens
    done = rotate(db_url, FABRICWATCH_SECRETS_KEY_FILE=str(keys))
    assert done.returncode == 0, done.stderr
    assert "3 webhook subscription(s)" in done.stderr and "(1 were plaintext)" in done.stderr, done.stderr
    after = stored(db)
    assert all(after[n][0] != before[n][0] for n in ("noc", "old")) and after["pd"][1] != before["pd"][1]
    assert SECRET not in whole_table(db)

    only_b = Sealer(MultiFernet([Fernet(KEY_B)]))
    assert only_b.open(after["noc"][0]) == SECRET and only_b.open(after["old"][0]) == SECRET + "-old"
    assert only_b.open(after["pd"][1]) == ROUTING
    with pytest.raises(SealError, match="'noc' was sealed with a key that is not in"):
        Sealer.from_settings().open(after["noc"][0], subscription="noc")  # key A alone no longer opens it

    monkeypatch.setenv("FABRICWATCH_SECRETS_KEY", KEY_B)  # the old key dropped
    get_settings.cache_clear()  # settings are read once per process: as if restarted
    open_alerts(db, 1)
    deliver_due(db, settings=FAST)
    assert verified(receiver.bodies("/hook")[0], SECRET) and verified(receiver.bodies("/old")[0], SECRET + "-old")


def test_plaintext_rows_are_sealed_by_the_next_delivery_round(db: Engine, key_a: str, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/hook")
    with db.begin() as conn:
        conn.execute(text("UPDATE webhook_subscriptions SET secret = :s"), {"s": SECRET})
    open_alerts(db, 1)
    deliver_due(db, settings=FAST)
    assert SECRET not in whole_table(db)
    assert verified(receiver.bodies()[0], SECRET)


@pytest.mark.serial
def test_a_wrong_or_malformed_key_is_a_clear_error_not_a_crash(db: Engine, db_url: str, key_a: str,
                                                                receiver: Receiver,
                                                                monkeypatch: pytest.MonkeyPatch) -> None:
    subscribe(db, receiver.url + "/signed", name="signed", secret=SECRET)
    subscribe(db, receiver.url + "/plain", name="plain")  # no secret: needs no key
    before = stored(db)
    open_alerts(db, 1)

    monkeypatch.setenv("FABRICWATCH_SECRETS_KEY", KEY_C)  # a valid key, but not the one that sealed
    get_settings.cache_clear()  # settings are read once per process: as if restarted
    counts = deliver_due(db, settings=FAST)
    assert counts == {"attempted": 2, "delivered": 1, "retry": 1}, counts
    assert receiver.bodies("/signed") == [] and len(receiver.bodies("/plain")) == 1
    with db.connect() as conn:
        error = conn.execute(text("SELECT error FROM webhook_deliveries WHERE outcome = 'retry'")).scalar_one()
    assert error == ("the secret of webhook subscription 'signed' was sealed with a key that is not in "
                     "FABRICWATCH_SECRETS_KEY; put that key after the new one")

    wrong = rotate(db_url, FABRICWATCH_SECRETS_KEY=f"{KEY_C},{KEY_B}")
    assert wrong.returncode == 1 and "'signed'" in wrong.stderr and "nothing was changed" in wrong.stderr
    assert "Traceback" not in wrong.stderr and stored(db) == before

    malformed = rotate(db_url, FABRICWATCH_SECRETS_KEY="not-a-fernet-key")
    assert malformed.returncode == 2 and "Traceback" not in malformed.stderr
    assert "FABRICWATCH_SECRETS_KEY: key 1 of 1 is not a Fernet key" in malformed.stderr, malformed.stderr
    assert rotate(db_url, FABRICWATCH_SECRETS_KEY_FILE="/nonexistent/fw.key").stderr.startswith(
        "error: FABRICWATCH_SECRETS_KEY_FILE (/nonexistent/fw.key): secret file:/nonexistent/fw.key: cannot read")

    monkeypatch.setenv("FABRICWATCH_SECRETS_KEY", "not-a-fernet-key")
    get_settings.cache_clear()  # settings are read once per process: as if restarted
    with db.begin() as conn:
        conn.execute(text("UPDATE webhook_outbox SET next_attempt_at = now()"))
    assert deliver_due(db, settings=FAST) == {"attempted": 1, "retry": 1}
    monkeypatch.setenv("FABRICWATCH_SECRETS_KEY", f"{KEY_C},{KEY_A}")  # the old key put back: delivered
    get_settings.cache_clear()  # settings are read once per process: as if restarted
    with db.begin() as conn:
        conn.execute(text("UPDATE webhook_outbox SET next_attempt_at = now()"))
    assert deliver_due(db, settings=FAST) == {"attempted": 1, "delivered": 1}
    assert verified(receiver.bodies("/signed")[0], SECRET)


def test_without_a_key_a_secret_is_refused_not_stored(db: Engine, db_url: str, receiver: Receiver,
                                                      monkeypatch: pytest.MonkeyPatch) -> None:
    monkeypatch.setenv("FABRICWATCH_WEBHOOK_ALLOW", "127.0.0.1/32")
    monkeypatch.delenv("FABRICWATCH_SECRETS_KEY")
    with TestClient(make_app(db_url, auth_required=False)) as client:
        r = client.post("/api/v1/webhooks", json={"name": "noc", "url": receiver.url, "secret": SECRET})
        assert r.status_code == 503 and "FABRICWATCH_SECRETS_KEY" in r.json()["detail"], r.text
        assert client.post("/api/v1/webhooks", json={"name": "plain", "url": receiver.url}).status_code == 201
    assert list(stored(db)) == ["plain"]
