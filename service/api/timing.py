"""Request latency for /metrics (`fabricwatch_http_request_seconds`), as pure ASGI middleware.

Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs every request through an extra task and
memory streams; profiled at 500 requests/s that was a visible share of a request's CPU, so this one only
wraps `send`. A request is timed until its response starts (headers sent), as before: an SSE stream is
not counted for as long as it stays open.
"""

from __future__ import annotations

import time

from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability import REQUEST_SECONDS


class RequestTiming:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                # The router has put the matched route in the (shared) scope by now.
                route = scope.get("route")
                REQUEST_SECONDS.labels(scope["method"], getattr(route, "path", "unmatched"),
                                       str(message["status"])).observe(time.perf_counter() - t0)
            await send(message)

        await self.app(scope, receive, timed_send)
