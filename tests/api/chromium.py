"""Headless Chromium for the NOC page tests: dump the rendered DOM, take a screenshot, or drive a page over
the DevTools protocol (on loopback) to measure its layout."""

from __future__ import annotations

import base64
import itertools
import json
import os
import shutil
import subprocess
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

import httpx
import pytest
from websockets.sync.client import connect

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian 'chromium' package")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"
WIDTH, HEIGHT = 1600, 1000   # the NOC screen the layout is judged on
FLAGS = ("--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking", "--disable-component-update",
         "--disable-sync", "--no-first-run", "--hide-scrollbars", f"--window-size={WIDTH},{HEIGHT}")


def run(url: str, tmp: Path, *mode: str, budget_ms: int = 5000) -> str:
    """Load `url` headless with `mode` flags (e.g. --dump-dom); returns stdout."""
    assert CHROMIUM is not None
    out = subprocess.run(
        [CHROMIUM, *FLAGS, f"--user-data-dir={tmp / 'profile'}", f"--virtual-time-budget={budget_ms}", *mode, url],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def screenshot(url: str, tmp: Path, name: str, *mode: str, budget_ms: int = 5000) -> None:
    """Screenshot `url`; with FABRICWATCH_UPDATE_DOCS_IMG set, it replaces docs/img/`name`."""
    shot = tmp / name
    run(url, tmp, f"--screenshot={shot}", *mode, budget_ms=budget_ms)
    _keep(shot, name)


def _keep(shot: Path, name: str) -> None:
    assert shot.stat().st_size > 20_000
    if os.environ.get("FABRICWATCH_UPDATE_DOCS_IMG"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)


class Page:
    """One tab, driven over the DevTools protocol: evaluate JavaScript, wait for a condition, screenshot."""

    def __init__(self, ws: Any) -> None:
        self._ws, self._ids = ws, itertools.count(1)

    def call(self, method: str, **params: Any) -> dict[str, Any]:
        n = next(self._ids)
        self._ws.send(json.dumps({"id": n, "method": method, "params": params}))
        while True:   # events arrive in between; the answer carries our id
            msg = json.loads(self._ws.recv(timeout=30))
            if msg.get("id") == n:
                assert "error" not in msg, msg["error"]
                return msg["result"]

    def eval(self, expression: str) -> Any:
        res = self.call("Runtime.evaluate", expression=expression, returnByValue=True, awaitPromise=True)
        assert "exceptionDetails" not in res, res["exceptionDetails"]
        return res["result"].get("value")

    def wait(self, expression: str, timeout_s: float = 20.0) -> Any:
        deadline = time.monotonic() + timeout_s
        while not (value := self.eval(expression)):
            assert time.monotonic() < deadline, f"timed out waiting for {expression}"
            time.sleep(0.1)
        return value

    def screenshot(self, tmp: Path, name: str) -> Path:
        """A PNG of the viewport; with FABRICWATCH_UPDATE_DOCS_IMG set, it replaces docs/img/`name`."""
        shot = tmp / name
        shot.write_bytes(base64.b64decode(self.call("Page.captureScreenshot", format="png")["data"]))
        _keep(shot, name)
        return shot


@contextmanager
def devtools(url: str, tmp: Path) -> Iterator[Page]:
    """Open `url` in headless Chromium, a WIDTH x HEIGHT viewport, with DevTools on a loopback port it picks."""
    assert CHROMIUM is not None
    profile = tmp / "devtools-profile"
    proc = subprocess.Popen([CHROMIUM, *FLAGS, f"--user-data-dir={profile}", "--remote-debugging-address=127.0.0.1",
                             "--remote-debugging-port=0", "about:blank"], stdout=subprocess.DEVNULL,
                            stderr=subprocess.DEVNULL)
    try:
        active = profile / "DevToolsActivePort"
        deadline = time.monotonic() + 30
        while not (active.is_file() and active.read_text().strip()):
            assert proc.poll() is None and time.monotonic() < deadline, "Chromium did not open DevTools"
            time.sleep(0.05)
        port = int(active.read_text().split()[0])
        while not (pages := [t for t in httpx.get(f"http://127.0.0.1:{port}/json/list").json() if t["type"] == "page"]):
            assert time.monotonic() < deadline, "Chromium opened no page"
            time.sleep(0.05)
        page = pages[0]
        with connect(page["webSocketDebuggerUrl"], max_size=None) as ws:
            tab = Page(ws)
            # The window's frame takes some of --window-size: set the viewport itself, then load.
            tab.call("Emulation.setDeviceMetricsOverride", width=WIDTH, height=HEIGHT, deviceScaleFactor=1,
                     mobile=False)
            tab.call("Page.navigate", url=url)
            yield tab
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait()
