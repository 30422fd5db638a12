"""Notifications: webhook subscriptions, payload formats, signing, and the transactional outbox.

`notify_settings()` is the one place that reads this package's settings (FABRICWATCH_WEBHOOK_*
and FABRICWATCH_PUBLIC_URL) until they move into service.config.Settings.
"""

from __future__ import annotations

import os
from dataclasses import dataclass


@dataclass(frozen=True, slots=True)
class NotifySettings:
    allow: tuple[str, ...] = ()          # CIDRs / hosts exempt from the private-range rule
    deny: tuple[str, ...] = ()           # CIDRs / hosts always refused (on top of the built-in metadata deny)
    timeout_s: float = 10.0              # per HTTP request
    max_attempts: int = 20               # then the message is marked dead (still visible in the API)
    backoff_base_s: float = 5.0          # first retry after ~base, doubling up to backoff_max_s
    backoff_max_s: float = 3600.0
    max_redirects: int = 3               # 307/308 hops, each checked against allow/deny
    public_url: str | None = None        # base URL for links back to fabricwatch in payloads


def _csv(name: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in os.environ.get(name, "").split(",") if p.strip())


def notify_settings() -> NotifySettings:
    """Read FABRICWATCH_WEBHOOK_* from the environment (to be replaced by service.config fields)."""
    env, d = os.environ.get, NotifySettings()
    return NotifySettings(
        allow=_csv("FABRICWATCH_WEBHOOK_ALLOW"),
        deny=_csv("FABRICWATCH_WEBHOOK_DENY"),
        timeout_s=float(env("FABRICWATCH_WEBHOOK_TIMEOUT_S", d.timeout_s)),
        max_attempts=int(env("FABRICWATCH_WEBHOOK_MAX_ATTEMPTS", d.max_attempts)),
        backoff_base_s=float(env("FABRICWATCH_WEBHOOK_BACKOFF_BASE_S", d.backoff_base_s)),
        backoff_max_s=float(env("FABRICWATCH_WEBHOOK_BACKOFF_MAX_S", d.backoff_max_s)),
        max_redirects=int(env("FABRICWATCH_WEBHOOK_MAX_REDIRECTS", d.max_redirects)),
        public_url=env("FABRICWATCH_PUBLIC_URL") or None,
    )
