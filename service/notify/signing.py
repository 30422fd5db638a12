"""Webhook signatures: HMAC-SHA256 over "<timestamp>.<body>", sent as `v1=<hex>` (docs/webhooks.md)."""

from __future__ import annotations

import hashlib
import hmac
import time

TIMESTAMP_HEADER = "X-Fabricwatch-Timestamp"
SIGNATURE_HEADER = "X-Fabricwatch-Signature"
IDEMPOTENCY_HEADER = "Idempotency-Key"
EVENT_HEADER = "X-Fabricwatch-Event"
DELIVERY_HEADER = "X-Fabricwatch-Delivery"
VERSION = "v1"
DEFAULT_TOLERANCE_S = 300


def signature(secret: str, timestamp: int, body: bytes) -> str:
    """The header value for one request: `v1=` and the hex HMAC-SHA256 of b"<timestamp>." + body."""
    mac = hmac.new(secret.encode(), f"{timestamp}.".encode() + body, hashlib.sha256)
    return f"{VERSION}={mac.hexdigest()}"


def sign_headers(secret: str | None, body: bytes, now: float | None = None) -> dict[str, str]:
    """Timestamp and signature headers; a fresh timestamp per attempt, so replays age out."""
    ts = int(time.time() if now is None else now)
    headers = {TIMESTAMP_HEADER: str(ts)}
    if secret:
        headers[SIGNATURE_HEADER] = signature(secret, ts, body)
    return headers


def verify(secret: str, timestamp: str, signature_header: str, body: bytes,
           tolerance_s: int = DEFAULT_TOLERANCE_S, now: float | None = None) -> bool:
    """True if any `v1=` signature in the header matches and the timestamp is fresh."""
    try:
        ts = int(timestamp)
    except ValueError:
        return False
    if abs((time.time() if now is None else now) - ts) > tolerance_s:
        return False
    expected = signature(secret, ts, body)
    return any(hmac.compare_digest(expected, part.strip()) for part in signature_header.split(","))
