"""BodyLimit skips its counting only for requests that cannot have a body: HTTP/1.x without Content-Length
or Transfer-Encoding. A chunked HTTP/1.1 body and an HTTP/2 body without Content-Length are still counted."""

from __future__ import annotations

import asyncio
from typing import Any

from starlette.types import Message, Receive, Scope, Send

from service.api.limits import JSON_MAX_BODY_BYTES, BodyLimit


class Reader:
    """An app that reads the whole body; records the receive it was given and the bytes it read."""

    def __init__(self) -> None:
        self.receive: Any = None
        self.read = 0

    async def __call__(self, scope: Scope, receive: Receive, send: Send) -> None:
        self.receive = receive
        while True:
            message = await receive()
            self.read += len(message.get("body", b""))
            if not message.get("more_body"):
                break
        await send({"type": "http.response.start", "status": 200, "headers": []})
        await send({"type": "http.response.body", "body": b"ok"})


def _run(http_version: str, headers: list[tuple[bytes, bytes]], chunks: list[bytes]) -> tuple[int, Reader, Any]:
    app = Reader()
    scope = {"type": "http", "http_version": http_version, "method": "POST", "path": "/api/v1/alerts/1/comments",
             "headers": headers}
    pending = list(chunks)

    async def receive() -> Message:
        body = pending.pop(0) if pending else b""
        return {"type": "http.request", "body": body, "more_body": bool(pending)}

    sent: list[Message] = []

    async def send(message: Message) -> None:
        sent.append(message)

    asyncio.run(BodyLimit(app, max_bytes=256 * 1024 * 1024)(scope, receive, send))
    return sent[0]["status"], app, receive


BIG = [b"x" * (256 * 1024)] * (JSON_MAX_BODY_BYTES // (256 * 1024) + 2)  # 1.5 MiB over a 1 MiB limit


def test_a_chunked_http11_body_is_still_counted() -> None:
    status, app, _ = _run("1.1", [(b"transfer-encoding", b"chunked")], BIG)
    assert status == 413
    assert app.read <= JSON_MAX_BODY_BYTES


def test_an_http2_body_without_content_length_is_still_counted() -> None:
    status, app, _ = _run("2", [], BIG)
    assert status == 413
    assert app.read <= JSON_MAX_BODY_BYTES


def test_an_http11_request_without_framing_headers_goes_through_untouched() -> None:
    status, app, receive = _run("1.1", [(b"host", b"x")], [b""])
    assert status == 200
    assert app.receive is receive  # not wrapped: nothing to count
