"""Request body limits per route, enforced before and while a body is read: 413 problem+json.

- The import endpoints (`LARGE_BODY_PATHS`: Prometheus text, remote write and nccl-tests output) take up to
  `FABRICWATCH_MAX_BODY_BYTES` (256 MiB by default). The Prometheus import and remote write also limit their
  gzip- or snappy-decompressed size to the same number (service/telemetry/views.py, remote_write.py).
- Every other endpoint (JSON bodies, or none) takes up to `JSON_MAX_BODY_BYTES` (1 MiB), or
  `FABRICWATCH_MAX_BODY_BYTES` where that is smaller.

A declared Content-Length over the limit is refused before a byte of the body is read. A body without one
(chunked) is counted as it streams and refused at the first chunk past the limit, so a request never holds
more than the limit plus one chunk. Authentication (service/api/auth.py) runs before this, so a client
without a valid token gets its 401 without any of its body being read.
"""

from __future__ import annotations

from starlette.exceptions import HTTPException
from starlette.types import ASGIApp, Message, Receive, Scope, Send

from service.api.problems import problem_response

JSON_MAX_BODY_BYTES = 1024 * 1024
LARGE_BODY_PATHS = frozenset({"/api/v1/import/prometheus", "/api/v1/nccl", "/api/v1/write"})
# HTTP versions whose requests carry a body only with Content-Length or Transfer-Encoding (HTTP/2 may send
# DATA frames with neither, so an HTTP/2 request is always counted).
_NO_FRAMING_NO_BODY = frozenset({"1.0", "1.1"})


class BodyTooLarge(HTTPException):
    """Raised from the counting receive; an HTTPException so FastAPI's body parsing passes it on as is."""

    title = "Body too large"

    def __init__(self, limit: int, declared: int | None = None) -> None:
        size = "body" if declared is None else f"body of {declared} bytes"
        detail = f"{size} exceeds the limit of {limit} bytes for this endpoint"
        super().__init__(413, detail)


def body_limit(path: str, max_body_bytes: int) -> int:
    """The largest body `path` accepts."""
    if path.rstrip("/") in LARGE_BODY_PATHS:
        return max_body_bytes
    return min(JSON_MAX_BODY_BYTES, max_body_bytes)


class BodyLimit:
    def __init__(self, app: ASGIApp, max_bytes: int) -> None:
        self.app, self.max_bytes = app, max_bytes

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        if scope["type"] != "http":
            await self.app(scope, receive, send)
            return
        limit = body_limit(scope.get("path", ""), self.max_bytes)
        headers = dict(scope.get("headers") or [])
        declared = headers.get(b"content-length")
        unframed = declared is None and b"transfer-encoding" not in headers
        if unframed and scope.get("http_version") in _NO_FRAMING_NO_BODY:
            # HTTP/1.x without Content-Length or Transfer-Encoding has no body (RFC 9112 6.3): nothing to count,
            # and no wrapped receive and send for the most common request there is, a GET.
            await self.app(scope, receive, send)
            return
        if declared and declared.isdigit() and int(declared) > limit:
            await self._refuse(scope, receive, send, BodyTooLarge(limit, int(declared)))
            return
        seen = 0
        started = False

        async def counting_receive() -> Message:
            nonlocal seen
            message = await receive()
            if message["type"] == "http.request":
                seen += len(message.get("body", b""))
                if seen > limit:
                    raise BodyTooLarge(limit)
            return message

        async def tracking_send(message: Message) -> None:
            nonlocal started
            started = started or message["type"] == "http.response.start"
            await send(message)

        try:
            await self.app(scope, counting_receive, tracking_send)
        except BodyTooLarge as exc:  # the app's own handlers answer it first; this is for those that do not
            if not started:
                await self._refuse(scope, receive, send, exc)

    @staticmethod
    async def _refuse(scope: Scope, receive: Receive, send: Send, exc: BodyTooLarge) -> None:
        await problem_response(413, exc.title, exc.detail)(scope, receive, send)
