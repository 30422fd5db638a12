"""Each payload format has its documented shape (docs/webhooks.md) and renders deterministically."""

from __future__ import annotations

import json
import re
from typing import Any

import pytest

from service.notify import payloads

ALERT: dict[str, Any] = {
    "id": 41, "fingerprint": "rx_power_degrading/leaf-01:Ethernet1/1", "kind": "rx_power_degrading",
    "scope": "port", "state": "firing", "severity": "page", "cause": "connector_contamination",
    "action": "clean_connectors", "end": "local", "device": "leaf-01", "port": "Ethernet1/1", "lane": None,
    "peer_device": "spine-01", "peer_port": "Ethernet7/1", "pod": "pod-a",
    "summary": "rx power <down> 6.4 dB & falling", "score": 3.0,
    "evidence": [{"feature": "rx_power_dbm", "value": -9.5, "baseline": -3.1}], "members": [],
    "episode": 1, "opened_at_ms": 1_790_000_000_000, "resolved_at_ms": None,
}
ISO = re.compile(r"^\d{4}-\d\d-\d\dT\d\d:\d\d:\d\d(\.\d+)?Z$")


def msg(event: str = "firing", change: str = "opened", **alert: Any) -> dict[str, Any]:
    return payloads.message(event=event, change=change, change_id=812, key=payloads.idempotency_key(41, 812),
                            at_ms=1_790_000_060_000, actor="detector", alert={**ALERT, **alert})


def body(fmt: str, m: dict[str, Any], **kw: Any) -> dict[str, Any]:
    return json.loads(payloads.render(fmt, m, **kw))


def test_generic_v1() -> None:
    b = body("generic", msg(), public_url="https://fw.example/")
    assert b["schema"] == "fabricwatch.alert.v1" and b["event"] == "firing" and b["change"] == "opened"
    assert b["idempotency_key"] == "fw-alert-41-change-812" and b["change_id"] == 812
    assert ISO.match(b["at"]) and b["links"]["alert"] == "https://fw.example/api/v1/alerts/41"
    assert set(b["alert"]) == set(payloads.ALERT_FIELDS)
    assert b["alert"]["evidence"][0]["feature"] == "rx_power_dbm"


def test_rendering_is_canonical_and_deterministic() -> None:
    a, b = payloads.render("generic", msg()), payloads.render("generic", msg())
    canonical = json.dumps(json.loads(a), sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
    assert a == b == canonical


@pytest.mark.parametrize("event", ["firing", "resolved"])
def test_alertmanager_v4(event: str) -> None:
    m = msg(event, "opened" if event == "firing" else "resolved",
            resolved_at_ms=1_790_000_120_000 if event == "resolved" else None)
    b = body("alertmanager", m, receiver="noc")
    assert set(b) == {"version", "groupKey", "truncatedAlerts", "status", "receiver", "groupLabels", "commonLabels",
                      "commonAnnotations", "externalURL", "alerts"}
    assert b["version"] == "4" and b["status"] == event and b["receiver"] == "noc" and b["truncatedAlerts"] == 0
    (a,) = b["alerts"]
    assert set(a) == {"status", "labels", "annotations", "startsAt", "endsAt", "generatorURL", "fingerprint"}
    assert a["labels"]["alertname"] == "rx_power_degrading" and a["labels"]["device"] == "leaf-01"
    assert all(isinstance(v, str) for v in [*a["labels"].values(), *a["annotations"].values()])
    assert ISO.match(a["startsAt"]) and re.fullmatch(r"[0-9a-f]{16}", a["fingerprint"])
    assert (a["endsAt"] == "0001-01-01T00:00:00Z") == (event == "firing") and ISO.match(a["endsAt"])
    assert b["groupKey"] == '{}:{alertname="rx_power_degrading", device="leaf-01"}'


def test_pagerduty_v2_trigger_ack_resolve() -> None:
    t = body("pagerduty", msg(), routing_key="R0UTING")
    assert t["event_action"] == "trigger" and t["routing_key"] == "R0UTING" and t["dedup_key"] == "fabricwatch-alert-41"
    p = t["payload"]
    assert p["summary"] == ALERT["summary"] and p["source"] == "leaf-01" and p["severity"] == "critical"
    assert p["severity"] in {"critical", "error", "warning", "info"} and ISO.match(p["timestamp"])
    assert p["component"] == "Ethernet1/1" and p["group"] == "pod-a" and p["class"] == "rx_power_degrading"
    assert p["custom_details"]["cause"] == "connector_contamination"
    assert body("pagerduty", msg(severity="ticket"), routing_key="k")["payload"]["severity"] == "warning"
    assert len(body("pagerduty", msg(summary="x" * 5000), routing_key="k")["payload"]["summary"]) == 1024
    for event, action in (("acknowledged", "acknowledge"), ("resolved", "resolve")):
        b = body("pagerduty", msg(event, event), routing_key="R0UTING")
        assert b == {"routing_key": "R0UTING", "event_action": action, "dedup_key": "fabricwatch-alert-41"}


def test_slack_text_and_blocks() -> None:
    b = body("slack", msg(), public_url="https://fw.example")
    assert set(b) == {"text", "blocks"} and b["text"].startswith("[FIRING] PAGE rx_power_degrading")
    assert "&lt;down&gt;" in b["text"] and "&amp; falling" in b["text"] and "<down>" not in b["text"]
    types = [blk["type"] for blk in b["blocks"]]
    assert types == ["header", "section", "context"]
    assert b["blocks"][0]["text"]["type"] == "plain_text" and len(b["blocks"][0]["text"]["text"]) <= 150
    assert b["blocks"][1]["text"]["type"] == "mrkdwn" and "<https://fw.example/api/v1/alerts/41|" in \
        b["blocks"][1]["text"]["text"]
    assert all(f["type"] == "mrkdwn" for f in b["blocks"][1]["fields"])
    assert body("slack", msg("resolved", "resolved"))["text"].startswith("[RESOLVED]")


def test_which_formats_want_which_events() -> None:
    assert not payloads.wants("alertmanager", "acknowledged", True)
    assert payloads.wants("pagerduty", "acknowledged", True)
    assert not payloads.wants("generic", "resolved", False) and payloads.wants("slack", "resolved", True)
