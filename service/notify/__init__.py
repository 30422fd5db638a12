"""Notifications: webhook subscriptions, payload formats, signing, and the transactional outbox."""

from __future__ import annotations

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
    concurrency: int = 16                # POSTs in flight per delivery task
    per_receiver: int = 4                # POSTs in flight per subscription, across all workers

    @property
    def lease_s(self) -> float:
        """How long a claimed row stays claimed: three time-outs per hop (connect, send, answer)."""
        return 3.0 * self.timeout_s * (self.max_redirects + 1)


def _csv(value: str) -> tuple[str, ...]:
    return tuple(p.strip() for p in value.split(",") if p.strip())


def notify_settings() -> NotifySettings:
    """This package's settings, from service.config (environment over the config file, read once)."""
    from service.config import get_settings

    cfg = get_settings()
    return NotifySettings(
        allow=_csv(cfg.webhook_allow), deny=_csv(cfg.webhook_deny), timeout_s=cfg.webhook_timeout_s,
        max_attempts=cfg.webhook_max_attempts, backoff_base_s=cfg.webhook_backoff_base_s,
        backoff_max_s=cfg.webhook_backoff_max_s, max_redirects=cfg.webhook_max_redirects,
        public_url=cfg.public_url)
