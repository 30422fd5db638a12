"""Request latency for /metrics (`fabricwatch_http_request_seconds`), as pure ASGI middleware.

Starlette's `@app.middleware("http")` (BaseHTTPMiddleware) runs every request through an extra task and
memory streams; profiled at 500 requests/s that was a visible share of a request's CPU, so this one only
wraps `send`. A request is timed until its response starts (headers sent), as before: an SSE stream is
not counted for as long as it stays open. Each (method, route, status) histogram child is looked up once per
process and kept: `Histogram.labels()` takes a lock and checks the label values on every call.
"""

from __future__ import annotations

import time

from prometheus_client.metrics import Histogram
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.observability import REQUEST_SECONDS


class RequestTiming:
    def __init__(self, app: ASGIApp) -> None:
        self.app = app
        # Bounded: methods x route templates (or "unmatched") x statuses the app sends.
        self._children: dict[tuple[str, str, int], Histogram] = {}

    def _child(self, method: str, route: str, status: int) -> Histogram:
        key = (method, route, status)
        child = self._children.get(key)
        if child is None:
            child = self._children[key] = REQUEST_SECONDS.labels(method, route, str(status))
        return child

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        t0 = time.perf_counter()

        async def timed_send(message: Message) -> None:
            if message["type"] == "http.response.start":
                # The router has put the matched route in the (shared) scope by now.
                route = scope.get("route")
                self._child(scope["method"], getattr(route, "path", "unmatched"),
                            message["status"]).observe(time.perf_counter() - t0)
            await send(message)

        await self.app(scope, receive, timed_send)
