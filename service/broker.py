"""Which Celery broker the service uses, and a cheap reachability check."""

from __future__ import annotations

from typing import Any

from service.config import Settings


def broker_url(settings: Settings) -> str:
    """The configured Redis wins; otherwise kombu's SQLAlchemy transport on our own PostgreSQL."""
    if settings.redis_url:
        return settings.redis_url
    if not settings.database_url:
        raise RuntimeError("no broker: set FABRICWATCH_REDIS_URL or FABRICWATCH_DATABASE_URL")
    from service.embedded import broker_url_for

    return broker_url_for(settings.database_url)


def transport_class(settings: Settings) -> str | None:
    """Our Redis transport (one kombu crash on broker loss fixed); None keeps the URL's own."""
    if settings.redis_url:
        from service.redis_transport import TRANSPORT

        return TRANSPORT
    return None


def transport_options(settings: Settings) -> dict[str, Any]:
    if settings.redis_url:
        return {"visibility_timeout": 3600}
    from service.embedded import celery_transport_options

    return celery_transport_options()


def ping_broker(settings: Settings, timeout_s: float = 2.0) -> None:
    from kombu import Connection

    with Connection(broker_url(settings), transport=transport_class(settings), connect_timeout=timeout_s,
                    transport_options=transport_options(settings)) as conn:
        conn.ensure_connection(max_retries=1, timeout=timeout_s)
