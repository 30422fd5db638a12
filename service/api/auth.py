"""Bearer-token authentication and scope checks for every endpoint.

`Authenticate` (pure ASGI middleware) checks the token of every `/api/v1` request before any body is
read: a request without a valid token is answered 401 at the cost of one indexed lookup, whatever it
was about to upload. The route then checks its scope with `Depends(require("read"|"operate"|"admin"))`.
With `auth_required=false` (a throwaway local experiment; the demo keeps auth on) every request acts as
an anonymous admin.

The same bad token presented again and again by one client (a browser tab with a stale token, a
misconfigured agent) is answered 429 with Retry-After after `MAX_FAILURES` failures in `WINDOW_S`,
without a database lookup. The throttle is keyed by the client's address and a digest of the whole
presented token, so a valid token is never refused with 429 (it has never failed), and clients behind
one proxy do not lock each other out; `FABRICWATCH_TRUSTED_PROXIES` names the proxies whose
X-Forwarded-For gives the client's address. It is per process and holds at most `MAX_KEYS` keys
(least recently failed dropped first). Guessing a token (32 random bytes) is hopeless anyway; the
throttle only stops a stuck client from costing a lookup per request for ever.

With `FABRICWATCH_AUTH_CACHE_S` > 0 (off by default: revocation is immediate), a token found valid is trusted
again without a lookup for that many seconds, per process: the lookup and its trip through the thread pool
were 0.65-0.9 CPU ms per request, more than a cached alert page costs (docs/benchmarks.md, "Reads at 500
req/s"). A revoked token then keeps working for at most that long, and `last_used_at` is written only by
the lookups. Only valid tokens are kept (a refused one is looked up, and throttled, every time), keyed by
the database and a digest of the whole token; the route still checks the principal's scope.
"""

from __future__ import annotations

import hashlib
import ipaddress
import math
import time
from collections import OrderedDict, deque
from collections.abc import Awaitable, Callable, Sequence
from typing import Annotated

from fastapi import Depends, Request, Security
from fastapi.security import HTTPAuthorizationCredentials, HTTPBearer
from sqlalchemy import Engine
from sqlalchemy.exc import OperationalError
from starlette.concurrency import run_in_threadpool
from starlette.types import ASGIApp, Receive, Scope, Send

from service.api.problems import Problem, database_unavailable, problem_response_for
from service.auth.service import ANONYMOUS_ADMIN, Principal, verify_token
from service.config import Network, Settings, networks

API_PREFIX = "/api/v1"
WINDOW_S = 60.0
MAX_FAILURES = 20
MAX_KEYS = 4096
_CHALLENGE = {"WWW-Authenticate": "Bearer"}


class FailureThrottle:
    """Failed authentications per key in a sliding window; an LRU map of at most `max_keys` keys."""

    def __init__(self, *, max_failures: int = MAX_FAILURES, window_s: float = WINDOW_S,
                 max_keys: int = MAX_KEYS) -> None:
        self.max_failures, self.window_s, self.max_keys = max_failures, window_s, max_keys
        self._keys: OrderedDict[str, deque[float]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        self._keys.clear()

    def retry_after(self, key: str) -> int | None:
        """Seconds until `key` may try again, or None when it is not throttled."""
        q = self._keys.get(key)
        if q is None:
            return None
        now = time.monotonic()
        while q and now - q[0] > self.window_s:
            q.popleft()
        if not q:
            del self._keys[key]
            return None
        if len(q) < self.max_failures:
            return None
        return max(1, math.ceil(self.window_s - (now - q[0])))

    def fail(self, key: str) -> None:
        q = self._keys.pop(key, None)
        if q is None:
            q = deque(maxlen=self.max_failures)  # only the newest max_failures times matter
        q.append(time.monotonic())
        self._keys[key] = q  # most recent last
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)


class TokenCache:
    """Principals of recently verified tokens, each until its expiry; an LRU map of at most `max_keys` keys."""

    def __init__(self, max_keys: int = MAX_KEYS) -> None:
        self.max_keys = max_keys
        self._keys: OrderedDict[tuple[str, str], tuple[float, Principal]] = OrderedDict()

    def __len__(self) -> int:
        return len(self._keys)

    def clear(self) -> None:
        self._keys.clear()

    def get(self, key: tuple[str, str]) -> Principal | None:
        hit = self._keys.get(key)
        if hit is None:
            return None
        if time.monotonic() >= hit[0]:
            self._keys.pop(key, None)
            return None
        return hit[1]

    def put(self, key: tuple[str, str], principal: Principal, ttl_s: float) -> None:
        self._keys.pop(key, None)
        self._keys[key] = (time.monotonic() + ttl_s, principal)  # most recent last
        while len(self._keys) > self.max_keys:
            self._keys.popitem(last=False)


# One per process (every app in it shares it, like the process's sockets).
_failures = FailureThrottle()
_verified = TokenCache()


def _in(address: str, networks: Sequence[Network]) -> bool:
    try:
        ip = ipaddress.ip_address(address)
    except ValueError:
        return False
    return any(ip in n for n in networks)


def client_address(peer: str, forwarded_for: str | None, trusted: Sequence[Network]) -> str:
    """The client's address: the peer, or, when the peer is a trusted proxy, the nearest address in its
    X-Forwarded-For that is not itself a trusted proxy (the rightmost entries are the ones proxies added)."""
    if not trusted or not forwarded_for or not _in(peer, trusted):
        return peer
    hops = [h.strip() for h in forwarded_for.split(",") if h.strip()]
    for hop in reversed(hops):
        if not _in(hop, trusted):
            return hop
    return hops[0] if hops else peer


def _bearer(authorization: str) -> str | None:
    scheme, _, token = authorization.partition(" ")
    token = token.strip()
    return token if scheme.lower() == "bearer" and token else None


def authenticate(*, settings: Settings, engine: Engine, trusted: Sequence[Network], authorization: str,
                 peer: str, forwarded_for: str | None) -> Principal:
    """The principal of a request's Authorization header, or a 401/429 Problem. Runs a query: call from a thread."""
    if not settings.auth_required:
        return ANONYMOUS_ADMIN
    token = _bearer(authorization)
    if token is None:
        # No token is not a guess at one: only presented, invalid tokens count towards the limit.
        raise Problem(401, "Authentication required", "send 'Authorization: Bearer <token>'", headers=_CHALLENGE)
    client = client_address(peer, forwarded_for, trusted)
    key = f"{client} {hashlib.sha256(token.encode()).hexdigest()[:16]}"
    wait = _failures.retry_after(key)
    if wait is not None:
        raise Problem(429, "Too many failed authentications",
                      f"this token was refused {_failures.max_failures} times in {_failures.window_s:.0f} s; "
                      f"retry in {wait} s, with a valid token", headers={"Retry-After": str(wait)})
    with engine.begin() as conn:
        principal = verify_token(conn, token)
    if principal is None:
        _failures.fail(key)
        raise Problem(401, "Invalid token", "the token is unknown or revoked", headers=_CHALLENGE)
    return principal


class Authenticate:
    """Authenticate `/api/v1` requests before anything reads their body; the principal goes in scope['state']."""

    def __init__(self, app: ASGIApp, settings: Settings, engine: Engine) -> None:
        self.app, self.settings, self.engine = app, settings, engine
        self.trusted = networks(settings.trusted_proxies)
        self.cache_s = settings.auth_cache_s
        self.database = engine.url.render_as_string(hide_password=True)  # a token is valid in its database

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        path = scope.get("path", "")
        if scope["type"] != "http" or not (path == API_PREFIX or path.startswith(API_PREFIX + "/")):
            await self.app(scope, receive, send)
            return
        if not self.settings.auth_required:  # no lookup to make: no trip through the thread pool either
            scope.setdefault("state", {})["principal"] = ANONYMOUS_ADMIN
            await self.app(scope, receive, send)
            return
        headers = {k.decode("latin-1").lower(): v.decode("latin-1") for k, v in scope.get("headers") or []}
        authorization = headers.get("authorization", "")
        token = _bearer(authorization) if self.cache_s > 0 else None
        key = (self.database, hashlib.sha256(token.encode()).hexdigest()) if token else None
        principal = _verified.get(key) if key else None
        if principal is None:
            peer = scope["client"][0] if scope.get("client") else "unknown"
            try:
                principal = await run_in_threadpool(
                    authenticate, settings=self.settings, engine=self.engine, trusted=self.trusted,
                    authorization=authorization, peer=peer, forwarded_for=headers.get("x-forwarded-for"))
            except Problem as problem:
                await problem_response_for(problem)(scope, receive, send)
                return
            except OperationalError:  # the token could not be looked up: 503, as when a route meets this
                await database_unavailable()(scope, receive, send)
                return
            if key:
                _verified.put(key, principal, self.cache_s)
        scope.setdefault("state", {})["principal"] = principal
        await self.app(scope, receive, send)


# Declares the Bearer scheme in the OpenAPI document (Swagger UI's "Authorize"); the check is above.
_bearer_scheme = HTTPBearer(auto_error=False, description="an API token: `fabricwatch token create`")


async def current_principal(request: Request,
                            _: Annotated[HTTPAuthorizationCredentials | None, Security(_bearer_scheme)] = None
                            ) -> Principal:
    """The principal `Authenticate` found: async, so that the usual case costs no trip through the thread pool."""
    principal = request.scope.get("state", {}).get("principal")
    if principal is not None:
        return principal
    # A route outside /api/v1 (none so far) that asks for a scope: authenticate here, the same way.
    settings = request.app.state.settings
    return await run_in_threadpool(
        authenticate, settings=settings, engine=request.app.state.engine, trusted=networks(settings.trusted_proxies),
        authorization=request.headers.get("authorization", ""),
        peer=request.client.host if request.client else "unknown",
        forwarded_for=request.headers.get("x-forwarded-for"))


def require(scope: str) -> Callable[..., Awaitable[Principal]]:
    async def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:  # no thread hop
        if not principal.allows(scope):
            raise Problem(403, "Insufficient scope", f"this endpoint needs scope {scope!r}")
        return principal

    return check


async def authorize(request: Request, scope: str) -> Principal:
    """`require(scope)` called by a route itself: the hot reads (`/alerts`, `/series`) declare no dependencies,
    each of which costs FastAPI's solving (~20 us of CPU a request); their documentation twins declare
    `ReadScope`, so the OpenAPI document still says they need it."""
    principal = await current_principal(request)
    if not principal.allows(scope):
        raise Problem(403, "Insufficient scope", f"this endpoint needs scope {scope!r}")
    return principal


ReadScope = Annotated[Principal, Depends(require("read"))]
OperateScope = Annotated[Principal, Depends(require("operate"))]
AdminScope = Annotated[Principal, Depends(require("admin"))]
