"""Bearer-token authentication and scope checks for every endpoint.

Use `Depends(require("read"|"operate"|"admin"))` on a route or router. With
`auth_required=false` (a throwaway local experiment; the demo keeps auth on) every request acts as an
anonymous admin.
Repeated invalid tokens from one client address are slowed down with 429s.
"""

from __future__ import annotations

import time
from collections import defaultdict, deque
from collections.abc import Callable
from typing import Annotated

from fastapi import Depends, Request

from service.api.problems import Problem
from service.auth.service import ANONYMOUS_ADMIN, Principal, verify_token

_FAILURE_WINDOW_S = 60.0
_MAX_FAILURES = 20
_failures: dict[str, deque[float]] = defaultdict(deque)


def _too_many_failures(client: str) -> bool:
    q = _failures[client]
    now = time.monotonic()
    while q and now - q[0] > _FAILURE_WINDOW_S:
        q.popleft()
    return len(q) >= _MAX_FAILURES


def current_principal(request: Request) -> Principal:
    if not request.app.state.settings.auth_required:
        return ANONYMOUS_ADMIN
    client = request.client.host if request.client else "unknown"
    if _too_many_failures(client):
        raise Problem(429, "Too many failed authentications", "retry later")
    header = request.headers.get("authorization", "")
    scheme, _, token = header.partition(" ")
    if scheme.lower() != "bearer" or not token:
        # No token is not a guess at one: only presented, invalid tokens count towards the limit.
        raise Problem(401, "Authentication required", "send 'Authorization: Bearer <token>'")
    with request.app.state.engine.begin() as conn:
        principal = verify_token(conn, token.strip())
    if principal is None:
        _failures[client].append(time.monotonic())
        raise Problem(401, "Invalid token", "the token is unknown or revoked")
    return principal


def require(scope: str) -> Callable[..., Principal]:
    def check(principal: Annotated[Principal, Depends(current_principal)]) -> Principal:
        if not principal.allows(scope):
            raise Problem(403, "Insufficient scope", f"this endpoint needs scope {scope!r}")
        return principal

    return check


ReadScope = Annotated[Principal, Depends(require("read"))]
OperateScope = Annotated[Principal, Depends(require("operate"))]
AdminScope = Annotated[Principal, Depends(require("admin"))]
