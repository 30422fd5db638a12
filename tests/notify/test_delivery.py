"""Outbox delivery to real HTTP receivers: nothing lost, same key on duplicates, leases, concurrency
per receiver with order per alert, a hung receiver delaying no one else, and the URL policy (the
request goes to the address that was checked)."""

from __future__ import annotations

import datetime as dt
import json
import os
import signal
import socket
import ssl
import subprocess
import sys
import threading
import time
from collections import defaultdict
from collections.abc import Iterator
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
import pytest
from cryptography import x509
from cryptography.hazmat.primitives import hashes, serialization
from cryptography.hazmat.primitives.asymmetric import ec
from cryptography.x509.oid import NameOID
from sqlalchemy import Engine, text

from service.alerts import service as alerts
from service.alerts.service import apply_findings
from service.notify import NotifySettings
from service.notify.outbox import deliver_due, send
from service.notify.service import create_subscription
from service.notify.urlpolicy import UrlPolicy
from tests.alerts import STEP, T0, finding
from tests.receiver import BlackHole, Receiver

FAST = NotifySettings(allow=("127.0.0.0/8",), timeout_s=1.0, backoff_base_s=0.05, backoff_max_s=0.3)


@pytest.fixture()
def receiver() -> Iterator[Receiver]:
    r = Receiver().start()
    yield r
    r.stop()


def subscribe(db: Engine, url: str, *, name: str = "noc", fmt: str = "generic", secret: str | None = None,
              **kw: Any) -> int:
    with db.begin() as conn:
        return create_subscription(conn=conn, name=name, url=url, format=fmt, secret=secret,
                                   routing_key=kw.pop("routing_key", None), filters=kw.pop("filters", {}),
                                   send_resolved=True, enabled=True, created_by="test", settings=FAST)["id"]


def open_alerts(db: Engine, n: int, cycle: int = 0) -> list[int]:
    with db.begin() as conn:
        cs = apply_findings(conn=conn, findings=[finding(port=f"Ethernet{i}") for i in range(n)],
                            at_ms=T0 + cycle * STEP)
    return cs.opened


def outbox(db: Engine) -> list[Any]:
    with db.connect() as conn:
        return list(conn.execute(text("SELECT * FROM webhook_outbox ORDER BY id")))


def drain(db: Engine, settings: NotifySettings = FAST, timeout_s: float = 15.0) -> None:
    deadline = time.monotonic() + timeout_s
    while time.monotonic() < deadline:
        deliver_due(db, settings=settings, budget_s=5)
        if all(r.status != "pending" for r in outbox(db)):
            return
        time.sleep(0.05)
    raise AssertionError("outbox not drained")


def test_receiver_down_for_a_while_gets_everything_once_back(db: Engine, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/hook", secret="s3cret-s3cret-s3cret")
    receiver.stop()  # down before anything happens
    ids = open_alerts(db, 3)
    with db.begin() as conn:
        alerts.acknowledge(conn=conn, alert_id=ids[0], actor="alice")
        alerts.resolve(conn=conn, alert_id=ids[0], actor="alice")
    for _ in range(3):  # several rounds while down: every attempt fails and is logged
        deliver_due(db, settings=FAST)
        time.sleep(0.1)
    rows = outbox(db)
    assert len(rows) == 5 and all(r.status == "pending" for r in rows)
    assert all(r.attempts >= 2 for r in rows if r.event == "firing")
    with db.connect() as conn:
        log = list(conn.execute(text("SELECT outcome, status_code, error, attempt FROM webhook_deliveries")))
    assert log and all(r.outcome == "retry" and r.status_code is None and "Connect" in r.error for r in log)
    # Order per alert: while the first message of alert 0 is pending, its ack and resolve are not tried.
    assert {r.attempts for r in rows if r.alert_id == ids[0] and r.event != "firing"} == {0}

    receiver.start()
    # Back, but flaky: one 500, and one answer so slow the client times out after the receiver took it
    # (a lost acknowledgement: the message is sent again, with the same key).
    receiver.script.extend([(500, {}), (200, {}, 1.5)])
    drain(db)
    got = receiver.bodies()
    by_key: dict[str, list[bytes]] = defaultdict(list)
    for r in got:
        by_key[r.headers["idempotency-key"]].append(r.body)
    assert set(by_key) == {r.idempotency_key for r in outbox(db)}  # none lost
    assert all(len(set(bodies)) == 1 for bodies in by_key.values())  # duplicates are byte-identical
    assert len(got) > len(by_key)  # and there was at least one duplicate
    events = [r.headers["x-fabricwatch-event"] for r in got if f"fw-alert-{ids[0]}-" in r.headers["idempotency-key"]]
    firsts = list(dict.fromkeys(events))
    assert firsts == ["firing", "acknowledged", "resolved"]
    assert all(r.status == "delivered" for r in outbox(db))


def test_several_workers_never_send_the_same_row(db: Engine, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/hook")
    open_alerts(db, 8)
    receiver.delay_s = 0.15  # rows stay locked while being sent
    threads = [threading.Thread(target=deliver_due, args=(db,), kwargs={"settings": FAST}) for _ in range(4)]
    for t in threads:
        t.start()
    for t in threads:
        t.join()
    keys = [r.headers["idempotency-key"] for r in receiver.bodies()]
    assert len(keys) == 8 and len(set(keys)) == 8
    assert receiver.max_in_flight > 1  # and they did work in parallel (not one after another, by load)
    with db.connect() as conn:
        assert conn.execute(text("SELECT count(*) FROM webhook_deliveries")).scalar() == 8


def test_deny_listed_redirect_targets_are_refused(db: Engine, receiver: Receiver) -> None:
    sub = subscribe(db, receiver.url + "/hook")
    receiver.script.extend([
        (307, {"location": "http://169.254.169.254/latest/meta-data/"}),
        (302, {"location": receiver.url + "/elsewhere"}),
        (308, {"location": "/moved"}), (200, {}),
    ])
    open_alerts(db, 1)
    deliver_due(db, settings=FAST)
    time.sleep(0.4)
    deliver_due(db, settings=FAST)
    time.sleep(0.4)
    deliver_due(db, settings=FAST)
    with db.connect() as conn:
        log = list(conn.execute(text("SELECT outcome, status_code, error FROM webhook_deliveries "
                                     "WHERE subscription_id = :s ORDER BY id"), {"s": sub}))
    assert "refused (redirect hop 1)" in log[0].error and "metadata" in log[0].error
    assert log[1].status_code == 302 and "not followed" in log[1].error
    assert log[2].outcome == "delivered"
    assert [r.path for r in receiver.bodies()] == ["/hook", "/hook", "/hook", "/moved"]


def test_policy_is_checked_again_at_delivery(db: Engine, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/hook")
    open_alerts(db, 1)
    deliver_due(db, settings=replace(FAST, allow=()))  # loopback no longer allowed
    with db.connect() as conn:
        err = conn.execute(text("SELECT error FROM webhook_deliveries")).scalar_one()
    assert err.startswith("refused:") and receiver.bodies() == []
    drain(db)
    assert len(receiver.bodies()) == 1


def test_filters_and_formats_per_subscription(db: Engine, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/pages", name="pages", filters={"severity": ["page"], "device": ["leaf-01"]})
    subscribe(db, receiver.url + "/other", name="other", filters={"pod": ["pod-z"]})
    subscribe(db, receiver.url + "/pd", name="pd", fmt="pagerduty", routing_key="R0UTING")
    subscribe(db, receiver.url + "/am", name="am", fmt="alertmanager")
    ids = open_alerts(db, 1)
    with db.begin() as conn:
        alerts.acknowledge(conn=conn, alert_id=ids[0], actor="alice")
    drain(db)
    paths = sorted(r.path for r in receiver.bodies())
    assert paths == ["/am", "/pages", "/pages", "/pd", "/pd"]  # alertmanager gets no acknowledgement
    pd = [r for r in receiver.bodies() if r.path == "/pd"]
    assert [r.headers["x-fabricwatch-event"] for r in pd] == ["firing", "acknowledged"]
    assert b'"event_action":"acknowledge"' in pd[1].body


@pytest.mark.serial
def test_a_hung_receiver_delays_no_one_else(db: Engine) -> None:
    """Old behaviour: one row at a time, so every healthy row behind a hung one waited its time-out."""
    settings = replace(FAST, timeout_s=2.0, backoff_base_s=60.0, backoff_max_s=60.0)  # one attempt each
    hole = BlackHole().start()
    healthy = [Receiver().start() for _ in range(3)]
    try:
        subscribe(db, hole.url + "/hook", name="hung")
        for i, r in enumerate(healthy):
            subscribe(db, r.url + "/hook", name=f"ok-{i}")
        open_alerts(db, 4)  # 16 rows; each alert's row for the hung receiver comes first
        t0 = time.time()
        counts = deliver_due(db, settings=settings, budget_s=20)
        took_s = time.time() - t0
    finally:
        hole.stop()
        for r in healthy:
            r.stop()
    delays = [q.at - t0 for r in healthy for q in r.bodies()]
    assert len(delays) == 12 and max(delays) < settings.timeout_s / 2, delays
    assert counts == {"attempted": 16, "delivered": 12, "retry": 4}, counts
    assert took_s < 2 * settings.timeout_s  # the hung receiver's four rows timed out side by side
    with db.connect() as conn:
        errors = conn.execute(text("SELECT d.error FROM webhook_deliveries d JOIN webhook_subscriptions s "
                                   "ON s.id = d.subscription_id WHERE s.name = 'hung'")).scalars().all()
    assert len(errors) == 4 and all(e.startswith("ReadTimeout") for e in errors), errors


def test_concurrent_per_receiver_and_in_order_per_alert(db: Engine, receiver: Receiver) -> None:
    subscribe(db, receiver.url + "/hook")
    ids = open_alerts(db, 6)
    with db.begin() as conn:
        for alert_id in ids:
            alerts.acknowledge(conn=conn, alert_id=alert_id, actor="alice")
            alerts.resolve(conn=conn, alert_id=alert_id, actor="alice")
    receiver.delay_s = 0.1
    drain(db)
    got = receiver.bodies()
    assert len(got) == 18
    for alert_id in ids:
        events = [r.headers["x-fabricwatch-event"] for r in got if f"fw-alert-{alert_id}-" in
                  r.headers["idempotency-key"]]
        assert events == ["firing", "acknowledged", "resolved"], (alert_id, events)
    assert 1 < receiver.max_in_flight <= FAST.per_receiver  # several alerts at once, capped per receiver


def test_a_worker_that_dies_mid_send_leaves_a_lease(db: Engine, db_url: str, receiver: Receiver) -> None:
    """The row is not locked while it is sent: it is leased, and sent again once the lease has run out."""
    subscribe(db, receiver.url + "/hook")
    open_alerts(db, 1)
    receiver.delay_s = 5.0  # the request arrives, the answer does not come before the kill
    env = {**os.environ, "FABRICWATCH_WEBHOOK_ALLOW": "127.0.0.1/32", "FABRICWATCH_WEBHOOK_TIMEOUT_S": "0.5",
           "FABRICWATCH_WEBHOOK_MAX_REDIRECTS": "0"}  # lease: 3 x 0.5 s x 1 hop
    code = "import sys; from service.db import get_engine; from service.notify.outbox import deliver_due; " \
           "deliver_due(get_engine(sys.argv[1]))"
    proc = subprocess.Popen([sys.executable, "-c", code, db_url], env=env)
    try:
        receiver.wait_for(1, timeout_s=30)
    finally:
        proc.send_signal(signal.SIGKILL)
        proc.wait(10)
    receiver.delay_s = 0.0
    (row,) = outbox(db)
    assert row.status == "pending" and row.attempts == 1 and row.leased_until is not None
    deliver_due(db, settings=FAST)  # the lease still holds: not sent twice at once
    assert len(receiver.bodies()) == 1
    time.sleep(max(0.0, (row.leased_until.timestamp() - time.time())) + 0.1)
    deliver_due(db, settings=FAST)
    first, again = receiver.bodies()
    assert again.headers["idempotency-key"] == first.headers["idempotency-key"] and again.body == first.body
    (row,) = outbox(db)
    assert row.status == "delivered" and row.attempts == 2 and row.leased_until is None


def test_the_request_goes_to_the_address_that_was_checked(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """DNS rebinding: the name answers 127.0.0.1 (allowed) when checked and 127.0.0.2 (refused) after.

    The old code resolved the name again in the HTTP client, and the POST went to 127.0.0.2.
    """
    good = Receiver("127.0.0.1").start()
    rogue = Receiver("127.0.0.2", port=good.port).start()
    real_getaddrinfo = socket.getaddrinfo
    answers: list[str] = []

    def rebinding(host: Any, port: Any, *args: Any, **kw: Any) -> Any:
        if host != "hooks.rebind.test":
            return real_getaddrinfo(host, port, *args, **kw)
        answers.append("127.0.0.1" if not answers else "127.0.0.2")
        return real_getaddrinfo(answers[-1], port, *args, **kw)

    try:
        subscribe(db, good.url + "/hook")  # the subscription itself names the address (no DNS yet)
        with db.begin() as conn:
            conn.execute(text("UPDATE webhook_subscriptions SET url = :u"),
                         {"u": f"http://hooks.rebind.test:{good.port}/hook"})
        open_alerts(db, 1)
        monkeypatch.setattr(socket, "getaddrinfo", rebinding)
        counts = deliver_due(db, settings=replace(FAST, allow=("127.0.0.1/32",)))
    finally:
        good.stop()
        rogue.stop()
    assert answers[0] == "127.0.0.1"
    assert rogue.bodies() == [], "the POST went to an address that was never checked"
    (req,) = good.bodies()
    assert req.headers["host"] == f"hooks.rebind.test:{good.port}" and counts["delivered"] == 1


def _localhost_cert(tmp: Path) -> tuple[Path, Path, str]:
    """A self-signed certificate for the name `localhost` only (no IP address in it)."""
    key = ec.generate_private_key(ec.SECP256R1())
    name = x509.Name([x509.NameAttribute(NameOID.COMMON_NAME, "localhost")])
    now = dt.datetime.now(dt.UTC)
    cert = (x509.CertificateBuilder().subject_name(name).issuer_name(name).public_key(key.public_key())
            .serial_number(x509.random_serial_number()).not_valid_before(now - dt.timedelta(minutes=5))
            .not_valid_after(now + dt.timedelta(hours=1))
            .add_extension(x509.SubjectAlternativeName([x509.DNSName("localhost")]), critical=False)
            .add_extension(x509.BasicConstraints(ca=True, path_length=None), critical=True)
            .sign(key, hashes.SHA256()))
    pem = cert.public_bytes(serialization.Encoding.PEM)
    (tmp / "cert.pem").write_bytes(pem)
    (tmp / "key.pem").write_bytes(key.private_bytes(serialization.Encoding.PEM, serialization.PrivateFormat.PKCS8,
                                                    serialization.NoEncryption()))
    return tmp / "cert.pem", tmp / "key.pem", pem.decode()


def test_https_to_a_name_keeps_its_host_header_sni_and_certificate_check(tmp_path: Path) -> None:
    """The POST goes to the checked address, but TLS and HTTP still speak to the name."""
    cert, key, pem = _localhost_cert(tmp_path)
    server_ctx = ssl.SSLContext(ssl.PROTOCOL_TLS_SERVER)
    server_ctx.load_cert_chain(cert, key)
    r = Receiver("127.0.0.1", ssl_context=server_ctx).start()
    policy = UrlPolicy.from_lists(allow=["localhost"])
    try:
        with httpx.Client(verify=ssl.create_default_context(cadata=pem), timeout=5) as client:
            ok = send(client, f"https://localhost:{r.port}/hook", b"{}", {}, policy, 0)
            by_ip = send(client, f"https://127.0.0.1:{r.port}/hook", b"{}", {}, UrlPolicy.from_lists(
                allow=["127.0.0.1/32"]), 0)
    finally:
        r.stop()
    assert ok.ok, ok.error
    (req,) = r.bodies()
    assert req.sni == "localhost" and req.headers["host"] == f"localhost:{r.port}"
    # the certificate names localhost only: verified against the address, it fails
    assert not by_ip.ok and "CERTIFICATE_VERIFY_FAILED" in (by_ip.error or ""), by_ip.error


def test_a_resolve_still_says_what_the_fault_was(db: Engine, receiver: Receiver) -> None:
    """The resolve's evidence is the last cycle's (clearing); the episode's worst cycle travels beside it as
    peak_* (generic) and as the evidence of the Alertmanager and PagerDuty formats."""
    from service.detection.findings import Evidence

    subscribe(db, receiver.url + "/generic")
    subscribe(db, receiver.url + "/pd", name="pd", fmt="pagerduty", routing_key="k" * 32)
    worst = [Evidence("rx_power_dbm", -12.5, baseline=-3.1, cohort=-3.0, unit="dBm")]
    quieter = [Evidence("rx_power_dbm", -4.0, baseline=-3.1, cohort=-3.0, unit="dBm")]
    with db.begin() as conn:
        (alert_id,) = apply_findings(conn=conn, findings=[finding(score=6.0, evidence=worst)], at_ms=T0).opened
    with db.begin() as conn:
        apply_findings(conn=conn, findings=[finding(score=1.5, evidence=quieter, at_ms=T0 + STEP)], at_ms=T0 + STEP)
        alerts.resolve(conn=conn, alert_id=alert_id, actor="alice")
    drain(db)
    generic = {json.loads(r.body)["event"]: json.loads(r.body) for r in receiver.bodies("/generic")}
    resolved = generic["resolved"]["alert"]
    assert resolved["evidence"][0]["value"] == -4.0 and resolved["score"] == 1.5
    assert resolved["peak_evidence"][0]["value"] == -12.5 and resolved["peak_score"] == 6.0
    assert resolved["peak_at_ms"] == T0
    (pd_trigger,) = [b for b in map(json.loads, (r.body for r in receiver.bodies("/pd")))
                     if b["event_action"] == "trigger"]
    assert pd_trigger["payload"]["custom_details"]["evidence"][0]["value"] == -12.5
