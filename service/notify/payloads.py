"""Render an outbox message into each receiver's format. Pure functions: same message, same bytes.

The message (format-neutral, built by `message()`) is the generic `fabricwatch.alert.v1` payload;
the other formats are views of it: Alertmanager webhook v4, PagerDuty Events API v2, Slack.
"""

from __future__ import annotations

import hashlib
import json
from datetime import UTC, datetime
from typing import Any

SCHEMA = "fabricwatch.alert.v1"
EVENTS = ("firing", "acknowledged", "resolved", "test")
ALERT_FIELDS = ("id", "fingerprint", "kind", "scope", "state", "severity", "cause", "action", "end", "device", "port",
                "lane", "peer_device", "peer_port", "pod", "summary", "score", "ttt_hours", "evidence", "peak_score",
                "peak_evidence", "peak_at_ms", "members", "parent_id", "episode", "muted_by", "opened_at_ms",
                "first_opened_at_ms", "last_seen_ms", "resolved_at_ms", "resolved_by", "acknowledged_at_ms",
                "acknowledged_by")
PD_SEVERITY = {"page": "critical", "ticket": "warning", "info": "info"}
_AM_ZERO_TIME = "0001-01-01T00:00:00Z"  # what Alertmanager sends as endsAt for a firing alert


def snapshot(alert: dict[str, Any]) -> dict[str, Any]:
    """The alert fields a notification carries (JSON-safe)."""
    return {k: alert.get(k) for k in ALERT_FIELDS}


def strongest_evidence(alert: dict[str, Any]) -> list[dict[str, Any]]:
    """The episode's worst cycle's evidence: a resolve (or a quieter cycle) still says what the fault was."""
    return alert.get("peak_evidence") or alert.get("evidence") or []


def idempotency_key(alert_id: int, change_id: int) -> str:
    """Stable per alert change: every retry and every duplicate of one change carries the same key."""
    return f"fw-alert-{alert_id}-change-{change_id}"


def message(*, event: str, change: str, change_id: int | None, key: str, at_ms: int, actor: str,
            alert: dict[str, Any], comment: str | None = None) -> dict[str, Any]:
    """The generic payload (schema fabricwatch.alert.v1) and the source of every other format."""
    return {"schema": SCHEMA, "event": event, "change": change, "change_id": change_id, "idempotency_key": key,
            "at_ms": at_ms, "at": iso(at_ms), "actor": actor, "comment": comment, "alert": snapshot(alert)}


def iso(ms: int | None) -> str | None:
    if ms is None:
        return None
    return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="milliseconds").replace("+00:00", "Z")


def _link(public_url: str | None, alert_id: Any) -> str:
    if not public_url or alert_id is None:
        return ""
    return f"{public_url.rstrip('/')}/api/v1/alerts/{alert_id}"


def _entity(a: dict[str, Any]) -> str:
    parts = [str(a[k]) for k in ("device", "port") if a.get(k) is not None]
    if a.get("lane") is not None:
        parts.append(f"lane {a['lane']}")
    return " ".join(parts) if parts else "?"


def generic(msg: dict[str, Any], *, public_url: str | None = None, **_: Any) -> dict[str, Any]:
    body = dict(msg)
    body["links"] = {"alert": _link(public_url, msg["alert"].get("id"))}
    return body


def _am_labels(a: dict[str, Any]) -> dict[str, str]:
    labels = {"alertname": str(a.get("kind") or "fabricwatch_test")}
    for k in ("device", "port", "lane", "peer_device", "peer_port", "pod", "severity", "cause", "scope"):
        if a.get(k) is not None:
            labels[k] = str(a[k])
    return labels


def alertmanager(msg: dict[str, Any], *, receiver: str = "", public_url: str | None = None,
                 **_: Any) -> dict[str, Any]:
    """Alertmanager webhook payload version 4, one alert per notification."""
    a = msg["alert"]
    status = "resolved" if msg["event"] == "resolved" else "firing"
    labels = _am_labels(a)
    annotations = {"summary": str(a.get("summary") or ""), "action": str(a.get("action") or ""),
                   "fabricwatch_fingerprint": str(a.get("fingerprint") or ""),
                   "evidence": json.dumps(strongest_evidence(a), sort_keys=True)}
    if a.get("end"):
        annotations["end"] = str(a["end"])
    group_labels = {k: labels[k] for k in ("alertname", "device") if k in labels}
    group_key = "{}:{" + ", ".join(f'{k}="{v}"' for k, v in sorted(group_labels.items())) + "}"
    ends = iso(a.get("resolved_at_ms")) if status == "resolved" else _AM_ZERO_TIME
    return {
        "version": "4",
        "groupKey": group_key,
        "truncatedAlerts": 0,
        "status": status,
        "receiver": receiver,
        "groupLabels": group_labels,
        "commonLabels": labels,
        "commonAnnotations": annotations,
        "externalURL": (public_url or "").rstrip("/"),
        "alerts": [{
            "status": status,
            "labels": labels,
            "annotations": annotations,
            "startsAt": iso(a.get("opened_at_ms") or msg["at_ms"]),
            "endsAt": ends or iso(msg["at_ms"]),
            "generatorURL": _link(public_url, a.get("id")),
            "fingerprint": hashlib.sha256(str(a.get("fingerprint")).encode()).hexdigest()[:16],
        }],
    }


def pagerduty(msg: dict[str, Any], *, routing_key: str | None = None, public_url: str | None = None,
              **_: Any) -> dict[str, Any]:
    """PagerDuty Events API v2: trigger / acknowledge / resolve, deduplicated per alert."""
    a = msg["alert"]
    action = {"firing": "trigger", "test": "trigger", "acknowledged": "acknowledge"}.get(msg["event"], "resolve")
    dedup = f"fabricwatch-alert-{a['id']}" if a.get("id") is not None else f"fabricwatch-{msg['idempotency_key']}"
    body: dict[str, Any] = {"routing_key": routing_key or "", "event_action": action, "dedup_key": dedup}
    if action != "trigger":
        return body  # PagerDuty needs only the dedup_key to acknowledge or resolve
    summary = str(a.get("summary") or f"{a.get('kind')} on {_entity(a)}")
    details = {k: a.get(k) for k in ("fingerprint", "kind", "cause", "action", "end", "score", "members",
                                     "peer_device", "peer_port", "ttt_hours")
               if a.get(k) not in (None, [], "")}
    if evidence := strongest_evidence(a):
        details["evidence"] = evidence
    details["change"] = msg["change"]
    payload = {"summary": summary[:1024], "source": str(a.get("device") or "fabricwatch"),
               "severity": PD_SEVERITY.get(str(a.get("severity")), "warning"), "timestamp": msg["at"],
               "component": str(a.get("port") or a.get("device") or ""), "group": str(a.get("pod") or ""),
               "class": str(a.get("kind") or ""), "custom_details": details}
    body["payload"] = {k: v for k, v in payload.items() if v not in ("", None)}
    body["client"] = "fabricwatch"
    link = _link(public_url, a.get("id"))
    if link:
        body["client_url"] = link
    return body


def _esc(s: Any) -> str:
    """Slack mrkdwn needs &, < and > escaped; nothing else."""
    return str(s).replace("&", "&amp;").replace("<", "&lt;").replace(">", "&gt;")


def slack(msg: dict[str, Any], *, public_url: str | None = None, **_: Any) -> dict[str, Any]:
    """Slack incoming webhook: `text` (notification fallback) and Block Kit `blocks`."""
    a = msg["alert"]
    tag = {"firing": "FIRING", "acknowledged": "ACK", "resolved": "RESOLVED", "test": "TEST"}[msg["event"]]
    sev = str(a.get("severity") or "").upper()
    title = f"[{tag}] {sev} {a.get('kind')} on {_entity(a)}"
    fields = [f"*Cause:* {_esc(a.get('cause'))}", f"*Action:* {_esc(a.get('action'))}",
              f"*Pod:* {_esc(a.get('pod') or '-')}", f"*End at fault:* {_esc(a.get('end') or '-')}"]
    context = f"{_esc(msg['change'])} by {_esc(msg['actor'])} at {msg['at']}"
    if msg.get("comment"):
        context += f" — {_esc(msg['comment'])}"
    link = _link(public_url, a.get("id"))
    section = _esc(a.get("summary") or "") + (f"\n<{link}|alert {a.get('id')}>" if link else "")
    return {
        "text": _esc(f"{title}: {a.get('summary') or ''}")[:3000],
        "blocks": [
            {"type": "header", "text": {"type": "plain_text", "text": title[:150]}},
            {"type": "section", "text": {"type": "mrkdwn", "text": section[:3000] or " "},
             "fields": [{"type": "mrkdwn", "text": f} for f in fields]},
            {"type": "context", "elements": [{"type": "mrkdwn", "text": context[:3000]}]},
        ],
    }


RENDERERS = {"generic": generic, "alertmanager": alertmanager, "pagerduty": pagerduty, "slack": slack}


def wants(fmt: str, event: str, send_resolved: bool) -> bool:
    """Whether a receiver of this format gets this event (Alertmanager has no acknowledgement)."""
    if event == "resolved":
        return send_resolved
    return not (event == "acknowledged" and fmt == "alertmanager")


def render(fmt: str, msg: dict[str, Any], *, receiver: str = "", routing_key: str | None = None,
           public_url: str | None = None) -> bytes:
    """The exact request body: canonical JSON (sorted keys, no spaces), so retries are byte-identical."""
    body = RENDERERS[fmt](msg, receiver=receiver, routing_key=routing_key, public_url=public_url)
    return json.dumps(body, sort_keys=True, separators=(",", ":"), ensure_ascii=False).encode()
