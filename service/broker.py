"""Which Celery broker the service uses, and a cheap reachability check."""

from __future__ import annotations

from service.config import Settings
from service.db import normalize_url


def broker_url(settings: Settings) -> str:
    """The configured Redis wins; otherwise the SQLAlchemy transport on our own PostgreSQL."""
    if settings.redis_url:
        return settings.redis_url
    if not settings.database_url:
        raise RuntimeError("no broker: set FABRICWATCH_REDIS_URL or FABRICWATCH_DATABASE_URL")
    return "sqla+" + normalize_url(settings.database_url)


def ping_broker(settings: Settings, timeout_s: float = 2.0) -> None:
    from kombu import Connection

    with Connection(broker_url(settings), connect_timeout=timeout_s) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout_s)
