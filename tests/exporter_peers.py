"""Real exporters on loopback for the tests: node_exporter (Debian prometheus-node-exporter), and a tiny HTTP
server that serves captured exporter pages (dcgm-exporter, gnmic) and deliberately bad ones."""

from __future__ import annotations

import shutil
import subprocess
import threading
import time
from collections.abc import Iterator, Mapping
from contextlib import contextmanager
from http.server import BaseHTTPRequestHandler, ThreadingHTTPServer
from pathlib import Path

import httpx
import pytest

from service.telemetry.promtext import parse_lines
from tests.live_api import free_tcp_port


def binary(name: str) -> str:
    path = shutil.which(name)
    if path is None:
        pytest.fail(f"{name} not found: install the Debian package {name} (the test needs the real program)")
    return path


def start(args: list[str], log: Path) -> subprocess.Popen[bytes]:
    with log.open("wb") as fh:
        return subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT)


def wait_http(url: str, proc: subprocess.Popen[bytes], log: Path, timeout_s: float = 20) -> None:
    end = time.monotonic() + timeout_s
    while time.monotonic() < end:
        if proc.poll() is not None:
            raise RuntimeError(f"{proc.args[0]} exited: {log.read_text()[-1500:]}")
        try:
            if httpx.get(url, timeout=2).status_code < 500:
                return
        except httpx.HTTPError:
            pass
        time.sleep(0.1)
    raise RuntimeError(f"{url} did not answer: {log.read_text()[-1500:]}")


def stop(procs: list[subprocess.Popen[bytes]]) -> None:
    for p in procs:
        p.terminate()
    for p in procs:
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()


def metrics(text_: str) -> list[tuple[str, dict[str, str], float]]:
    """(name, labels, value) of every sample line of an exposition page."""
    return [(p.name, dict(p.labels), p.value) for p in parse_lines(text_.splitlines(), "metrics")]


@contextmanager
def node_exporter(work: Path) -> Iterator[str]:
    """A real node_exporter with its network collectors only; yields its /metrics URL."""
    port = free_tcp_port()
    log = work / "node_exporter.log"
    proc = start([binary("prometheus-node-exporter"), f"--web.listen-address=127.0.0.1:{port}",
                  "--collector.disable-defaults", "--collector.netdev", "--collector.netclass"], log)
    try:
        url = f"http://127.0.0.1:{port}/metrics"
        wait_http(url, proc, log)
        yield url
    finally:
        stop([proc])


@contextmanager
def page_server(pages: Mapping[str, tuple[int, bytes]]) -> Iterator[str]:
    """Serve fixed pages by path (status, body) on 127.0.0.1; yields the base URL."""

    class Handler(BaseHTTPRequestHandler):
        def do_GET(self) -> None:
            status, body = pages.get(self.path, (404, b"not found\n"))
            self.send_response(status)
            self.send_header("content-type", "text/plain; version=0.0.4")
            self.send_header("content-length", str(len(body)))
            self.end_headers()
            self.wfile.write(body)

        def log_message(self, *_: object) -> None:
            pass

    server = ThreadingHTTPServer(("127.0.0.1", 0), Handler)
    thread = threading.Thread(target=server.serve_forever, daemon=True)
    thread.start()
    try:
        yield f"http://127.0.0.1:{server.server_address[1]}"
    finally:
        server.shutdown()
        server.server_close()


@contextmanager
def snmp_exporter(work: Path, config: Path) -> Iterator[str]:
    """A real snmp_exporter with the given snmp.yml; yields its /snmp URL (add ?target=..&module=..)."""
    port = free_tcp_port()
    log = work / "snmp_exporter.log"
    proc = start([binary("prometheus-snmp-exporter"), f"--config.file={config}",
                  f"--web.listen-address=127.0.0.1:{port}"], log)
    try:
        wait_http(f"http://127.0.0.1:{port}/", proc, log)
        yield f"http://127.0.0.1:{port}/snmp"
    finally:
        stop([proc])
