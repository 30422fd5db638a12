"""Database engine and sessions (SQLAlchemy 2 on psycopg 3)."""

from __future__ import annotations

from collections.abc import Iterator
from contextlib import contextmanager

from sqlalchemy import Engine, create_engine
from sqlalchemy.orm import DeclarativeBase, Session, sessionmaker


class Base(DeclarativeBase):
    pass


def normalize_url(url: str) -> str:
    """Point plain postgresql:// URLs at the psycopg 3 driver."""
    for prefix in ("postgresql://", "postgres://"):
        if url.startswith(prefix):
            return "postgresql+psycopg://" + url[len(prefix):]
    return url


_engines: dict[str, Engine] = {}


def get_engine(url: str) -> Engine:
    """One pooled engine per URL for the life of the process."""
    url = normalize_url(url)
    engine = _engines.get(url)
    if engine is None:
        engine = create_engine(url, pool_pre_ping=True, pool_size=5, max_overflow=10)
        _engines[url] = engine
    return engine


def forget_engines_after_fork() -> None:
    """In a forked child: empty pools of its own; the pooled connections stay the parent's, unclosed."""
    for engine in _engines.values():
        engine.dispose(close=False)


def dispose_engines() -> None:
    for engine in _engines.values():
        engine.dispose()
    _engines.clear()


@contextmanager
def session_scope(engine: Engine) -> Iterator[Session]:
    """A session that commits on success and rolls back on any error."""
    session = sessionmaker(bind=engine, expire_on_commit=False)()
    try:
        yield session
        session.commit()
    except BaseException:
        session.rollback()
        raise
    finally:
        session.close()
