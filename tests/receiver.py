"""A real HTTP webhook receiver on 127.0.0.1 for tests: records every request, answers as scripted.

`stop()` closes the listening socket (clients get connection refused, like a receiver that is down);
`start()` listens again on the same port. `script` holds (status, headers[, delay_s]) answers used in
order before falling back to 200; `delay_s` slows every answer (to hold rows locked during delivery).
A request is recorded before it is answered, so a slow answer that times out the client still
counts as received (a lost acknowledgement).
"""

from __future__ import annotations

import threading
import time
from collections import deque
from dataclasses import dataclass, field
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from typing import Any


@dataclass
class Received:
    method: str
    path: str
    headers: dict[str, str]
    body: bytes
    at: float = field(default_factory=time.time)


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is part of the tests, not an error


class Receiver:
    def __init__(self, host: str = "127.0.0.1") -> None:
        self.host, self.port = host, 0
        self.requests: list[Received] = []
        self.script: deque[tuple[Any, ...]] = deque()
        self.delay_s = 0.0
        self._lock = threading.Lock()
        self._server: _Server | None = None
        self._thread: threading.Thread | None = None

    def _handler(self) -> type[BaseHTTPRequestHandler]:
        receiver = self

        class Handler(BaseHTTPRequestHandler):
            def do_POST(self) -> None:
                body = self.rfile.read(int(self.headers.get("content-length") or 0))
                with receiver._lock:
                    receiver.requests.append(Received("POST", self.path, {k.lower(): v for k, v in
                                                                          self.headers.items()}, body))
                    status, headers, *delay = receiver.script.popleft() if receiver.script else (200, {})
                if delay or receiver.delay_s:
                    time.sleep(delay[0] if delay else receiver.delay_s)
                self.send_response(status)
                for k, v in headers.items():
                    self.send_header(k, v)
                self.send_header("content-length", "2")
                self.end_headers()
                self.wfile.write(b"ok")

            def log_message(self, *_: Any) -> None:
                pass

        return Handler

    def start(self) -> Receiver:
        self._server = _Server((self.host, self.port), self._handler())
        self.port = self._server.server_address[1]
        self._thread = threading.Thread(target=self._server.serve_forever, kwargs={"poll_interval": 0.05},
                                        daemon=True)
        self._thread.start()
        return self

    def stop(self) -> None:
        if self._server is not None:
            self._server.shutdown()
            self._server.server_close()
            self._server = None

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"

    def bodies(self, path: str | None = None) -> list[Received]:
        with self._lock:
            return [r for r in self.requests if path is None or r.path == path]

    def wait_for(self, n: int, timeout_s: float = 10.0, path: str | None = None) -> list[Received]:
        deadline = time.monotonic() + timeout_s
        while time.monotonic() < deadline:
            got = self.bodies(path)
            if len(got) >= n:
                return got
            time.sleep(0.02)
        raise AssertionError(f"receiver got {len(self.bodies(path))} requests, expected {n}")
