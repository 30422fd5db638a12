"""Signatures verify with the recipe printed in docs/webhooks.md, on requests a receiver really got."""

from __future__ import annotations

import re
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import httpx
from sqlalchemy import Engine

from service.alerts.service import apply_findings
from service.notify import signing
from service.notify.outbox import deliver_due
from tests.alerts import T0, finding
from tests.notify.test_delivery import FAST, subscribe
from tests.receiver import Receiver

DOC = Path(__file__).resolve().parents[2] / "docs" / "webhooks.md"
SECRET = "whsec-0123456789abcdef"


def documented_verifier() -> Callable[..., bool]:
    text = DOC.read_text()
    section = text.split("## Verifying signatures", 1)[1]
    code = re.search(r"```python\n(.*?)```", section, re.S)
    assert code, "docs/webhooks.md lost its verification recipe"
    namespace: dict[str, Any] = {}
    exec(compile(code.group(1), str(DOC), "exec"), namespace)  # the doc's own code, as a user would paste it
    return namespace["verify_fabricwatch_signature"]


def test_documented_recipe_verifies_real_deliveries(db: Engine) -> None:
    verify = documented_verifier()
    receiver = Receiver().start()
    try:
        subscribe(db, receiver.url + "/hook", secret=SECRET)
        subscribe(db, receiver.url + "/unsigned", name="unsigned")
        with db.begin() as conn:
            apply_findings(conn=conn, findings=[finding()], at_ms=T0)
        deliver_due(db, settings=FAST)
        (req,) = receiver.bodies("/hook")
        (unsigned,) = receiver.bodies("/unsigned")
    finally:
        receiver.stop()
    headers = httpx.Headers(req.headers)  # case-insensitive, like any web framework's
    assert headers["x-fabricwatch-signature"].startswith("v1=")
    assert verify(SECRET, headers, req.body)
    assert signing.verify(SECRET, headers["x-fabricwatch-timestamp"], headers["x-fabricwatch-signature"], req.body)
    assert not verify(SECRET, headers, req.body.replace(b"leaf-01", b"leaf-02"))  # tampered body
    assert not verify("another-secret-value", headers, req.body)
    assert "x-fabricwatch-signature" not in unsigned.headers and "x-fabricwatch-timestamp" in unsigned.headers


def test_stale_timestamps_and_rotation() -> None:
    verify = documented_verifier()
    body = b'{"schema":"fabricwatch.alert.v1"}'
    old = int(time.time()) - 3600
    stale = {"X-Fabricwatch-Timestamp": str(old), "X-Fabricwatch-Signature": signing.signature(SECRET, old, body)}
    assert not verify(SECRET, httpx.Headers(stale), body)
    now = int(time.time())
    rotated = {"X-Fabricwatch-Timestamp": str(now),
               "X-Fabricwatch-Signature": f"{signing.signature('old-key-xxxxxxxxxxx', now, body)}, "
                                          f"{signing.signature(SECRET, now, body)}"}
    assert verify(SECRET, httpx.Headers(rotated), body)
    assert signing.sign_headers(SECRET, body, now=now)[signing.SIGNATURE_HEADER] == signing.signature(SECRET, now,
                                                                                                        body)
