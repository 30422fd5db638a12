"""A real HTTP webhook receiver on 127.0.0.1 for tests: records every request, answers as scripted.

`stop()` closes the listening socket (clients get connection refused, like a receiver that is down);
`start()` listens again on the same port. `script` holds (status, headers[, delay_s]) answers used in
order before falling back to 200; `delay_s` slows every answer (to hold rows locked during delivery).
A request is recorded before it is answered, so a slow answer that times out the client still
counts as received (a lost acknowledgement). With an `ssl_context` it serves HTTPS and records the
TLS server name (SNI) each client asked for. `BlackHole` accepts connections and never answers.
"""

from __future__ import annotations

import socket
import ssl
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
    sni: str | None = None


class _Server(ThreadingHTTPServer):
    allow_reuse_address = True
    daemon_threads = True

    def handle_error(self, request: Any, client_address: Any) -> None:
        pass  # a client that timed out and hung up is part of the tests, not an error


class Receiver:
    def __init__(self, host: str = "127.0.0.1", port: int = 0, ssl_context: ssl.SSLContext | None = None) -> None:
        self.host, self.port, self.ssl_context = host, port, ssl_context
        self.server_names: list[str | None] = []  # SNI of every TLS handshake
        self.in_flight = self.max_in_flight = 0  # requests being answered at once
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
                sni = getattr(self.connection, "fw_sni", None)
                with receiver._lock:
                    receiver.requests.append(Received("POST", self.path, {k.lower(): v for k, v in
                                                                          self.headers.items()}, body, sni=sni))
                    status, headers, *delay = receiver.script.popleft() if receiver.script else (200, {})
                    receiver.in_flight += 1
                    receiver.max_in_flight = max(receiver.max_in_flight, receiver.in_flight)
                try:
                    if delay or receiver.delay_s:
                        time.sleep(delay[0] if delay else receiver.delay_s)
                finally:
                    with receiver._lock:
                        receiver.in_flight -= 1
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
        if self.ssl_context is not None:
            def on_sni(sock: ssl.SSLSocket, name: str | None, _: ssl.SSLContext) -> None:
                sock.fw_sni = name  # type: ignore[attr-defined]
                with self._lock:
                    self.server_names.append(name)

            self.ssl_context.sni_callback = on_sni
            self._server.socket = self.ssl_context.wrap_socket(self._server.socket, server_side=True)
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
        return f"{'https' if self.ssl_context else 'http'}://{self.host}:{self.port}"

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


class BlackHole:
    """A TCP listener on 127.0.0.1 that accepts every connection and never answers (a hung receiver)."""

    def __init__(self, host: str = "127.0.0.1") -> None:
        self.sock = socket.create_server((host, 0), backlog=128)
        self.host, self.port = host, self.sock.getsockname()[1]
        self.held: list[socket.socket] = []
        self._thread = threading.Thread(target=self._accept, daemon=True)

    def _accept(self) -> None:
        while True:
            try:
                conn, _ = self.sock.accept()
            except OSError:  # closed
                return
            self.held.append(conn)  # kept open and never read: the client waits for its read time-out

    def start(self) -> BlackHole:
        self._thread.start()
        return self

    def stop(self) -> None:
        self.sock.close()
        for conn in self.held:
            conn.close()

    @property
    def url(self) -> str:
        return f"http://{self.host}:{self.port}"
