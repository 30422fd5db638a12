"""Token creation and verification. Scopes: read < operate < admin; ingest stands alone."""

from __future__ import annotations

import hashlib
import hmac
import secrets
from dataclasses import dataclass
from datetime import UTC, datetime, timedelta

from sqlalchemy import Connection, text

SCOPES = ("read", "operate", "admin", "ingest")
# What each scope also grants. `ingest` (for host agents pushing samples) grants nothing else,
# so a token on every GPU host cannot acknowledge alerts or approve drains.
_IMPLIES = {"read": {"read"}, "operate": {"read", "operate"}, "admin": {"read", "operate", "admin", "ingest"},
            "ingest": {"ingest"}}
TOKEN_PREFIX = "fw_"
# last_used_at is written at most this often per token: a read request should not cost a write (and a WAL flush).
LAST_USED_RESOLUTION = timedelta(minutes=1)


@dataclass(frozen=True, slots=True)
class Principal:
    name: str
    scopes: tuple[str, ...]

    def allows(self, scope: str) -> bool:
        return any(scope in _IMPLIES.get(s, ()) for s in self.scopes)


ANONYMOUS_ADMIN = Principal("anonymous (auth disabled)", ("admin",))


def _hash(token: str) -> str:
    # Tokens are 32 random bytes, so a fast hash is safe; no password stretching is needed.
    return hashlib.sha256(token.encode()).hexdigest()


def create_token(conn: Connection, *, name: str, scopes: list[str]) -> str:
    """Create a token and return it; only its hash is stored."""
    bad = [s for s in scopes if s not in _IMPLIES]
    if bad or not scopes:
        raise ValueError(f"unknown scope(s) {bad}; choose from {', '.join(SCOPES)}")
    token = TOKEN_PREFIX + secrets.token_urlsafe(32)
    conn.execute(text("INSERT INTO api_tokens (name, prefix, token_hash, scopes) VALUES (:n, :p, :h, :s)"),
                 {"n": name, "p": token[:12], "h": _hash(token), "s": sorted(set(scopes), key=SCOPES.index)})
    return token


def verify_token(conn: Connection, token: str) -> Principal | None:
    """The principal for a presented token, or None. The hash is compared in constant time."""
    row = conn.execute(text("SELECT id, name, token_hash, scopes, last_used_at FROM api_tokens "
                            "WHERE prefix = :p AND revoked_at IS NULL"), {"p": token[:12]}).first()
    if row is None:
        hmac.compare_digest(_hash(token), _hash("decoy"))  # same work whether or not the prefix exists
        return None
    if not hmac.compare_digest(row.token_hash, _hash(token)):
        return None
    now = datetime.now(UTC)
    if row.last_used_at is None or now - row.last_used_at >= LAST_USED_RESOLUTION:
        conn.execute(text("UPDATE api_tokens SET last_used_at = :t WHERE id = :i"), {"t": now, "i": row.id})
    return Principal(row.name, tuple(row.scopes))


def revoke_token(conn: Connection, *, name: str) -> int:
    return conn.execute(text("UPDATE api_tokens SET revoked_at = now() WHERE name = :n AND revoked_at IS NULL"),
                        {"n": name}).rowcount
