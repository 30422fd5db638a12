"""Rendered alert-list pages: cached per process, validated by `alerts_version` (ETag, If-None-Match).

Alert lists change only when something writes alerts: a detection cycle, an ack, a resolve. Every such
transaction moves `alerts_version` as it commits (a trigger, migration 0210), whoever wrote it and in
whichever process. A list request reads the version (one indexed row), and:

- answers 304 Not Modified when the client's If-None-Match holds the ETag of this version and query;
- else serves the page this process rendered for the same version and query, if it has it;
- else renders it (on the thread pool: the two cases above are answered on the event loop, the version
  read on an async connection), in the same REPEATABLE READ snapshot as the version it read, so a page is always
  exactly the alerts of its version: two processes give the same bytes under the same ETag, and a page
  can never be older than its version (an ack commits its alert and the new version together).

A version that is gone (the row deleted) disables caching until the next alert write recreates it.
Profiled before this (bench/load.py, docs/benchmarks.md): a 100-alert page cost ~3 ms of CPU to fetch
and render, mostly row and JSON decoding; a cached one costs the version read.
"""

from __future__ import annotations

import hashlib
import json
import threading
import uuid
from collections.abc import Hashable
from dataclasses import dataclass

from cachetools import LRUCache
from sqlalchemy import Connection, text

from service.alerts.schemas import AlertPage
from service.db import AsyncReads

# Part of every ETag: a release that renders pages differently never answers 304 to an old page.
_FORMAT = hashlib.blake2b(json.dumps(AlertPage.model_json_schema(), sort_keys=True).encode(),
                          digest_size=4).hexdigest()
CACHE_CONTROL = "private, no-cache"  # a browser keeps the page but asks again each time (with If-None-Match)
MAX_BYTES = 32 * 1024 * 1024


@dataclass(frozen=True)
class Version:
    epoch: uuid.UUID
    n: int


_VERSION = "SELECT epoch, n FROM alerts_version WHERE id = 1"


def read_version(conn: Connection) -> Version | None:
    row = conn.execute(text(_VERSION)).first()
    return Version(row[0], row[1]) if row else None


async def read_version_async(reads: AsyncReads) -> Version | None:
    """The same read from an async route: a cached page or its 304 needs no thread (views.list_alerts)."""
    row = await reads.fetchone(_VERSION)
    return Version(row[0], row[1]) if row else None


def etag(version: Version, key: Hashable) -> str:
    query = hashlib.blake2b(repr(key).encode(), digest_size=8).hexdigest()
    return f'"{version.epoch.hex[:12]}.{version.n}.{query}.{_FORMAT}"'


def matches(if_none_match: str | None, tag: str) -> bool:
    """RFC 9110 If-None-Match: '*' or a list of entity tags, compared weakly (W/ ignored)."""
    if not if_none_match:
        return False
    for candidate in if_none_match.split(","):
        c = candidate.strip()
        if c == "*" or c.removeprefix("W/") == tag:
            return True
    return False


class PageCache:
    """Rendered pages of one version; a newer version empties it. Bounded in bytes, least recently used
    first out. Thread-safe: sync routes run in a thread pool."""

    def __init__(self, max_bytes: int = MAX_BYTES) -> None:
        self._lock = threading.Lock()
        self._version: Version | None = None
        self._pages: LRUCache[Hashable, bytes] = LRUCache(maxsize=max_bytes, getsizeof=len)

    def __len__(self) -> int:
        return len(self._pages)

    def has(self, key: Hashable) -> bool:
        """Whether a page of this query is held, of whichever version (then it is worth asking the version alone)."""
        with self._lock:
            return key in self._pages

    def get(self, version: Version, key: Hashable) -> bytes | None:
        with self._lock:
            return self._pages.get(key) if version == self._version else None

    def put(self, version: Version, key: Hashable, body: bytes) -> None:
        with self._lock:
            if version != self._version:
                # A request that read an older version (it raced a commit) must not throw away newer pages.
                if self._version is not None and version.epoch == self._version.epoch and \
                        version.n < self._version.n:
                    return
                self._version = version
                self._pages.clear()
            if len(body) <= self._pages.maxsize:
                self._pages[key] = body

    def clear(self) -> None:
        with self._lock:
            self._version = None
            self._pages.clear()


PAGES = PageCache()
