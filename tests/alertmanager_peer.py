"""The real Alertmanager (Debian's prometheus-alertmanager) on 127.0.0.1 for tests.

One process per test with its own config (routing everything to a webhook receiver on loopback, grouped
per alertname and device, waiting only 100 ms to group), storage in a temp dir, clustering off. `stop()`
ends it (clients get connection refused), `start()` runs it again on the same port and storage.
"""

from __future__ import annotations

import shutil
import subprocess
import time
from datetime import UTC, datetime, timedelta
from pathlib import Path
from typing import Any

import httpx
import pytest

from tests.live_api import free_tcp_port

BINARY = shutil.which("prometheus-alertmanager") or "/usr/bin/prometheus-alertmanager"

CONFIG = """\
route:
  receiver: hook
  group_by: [alertname, device]
  group_wait: 100ms
  group_interval: 300ms
  repeat_interval: 1h
receivers:
  - name: hook
    webhook_configs:
      - url: {hook}
        send_resolved: true
"""


def require_alertmanager() -> None:
    if not Path(BINARY).exists():
        pytest.skip("prometheus-alertmanager is not installed (Debian package prometheus-alertmanager)")


class Alertmanager:
    """`basic_auth` (user, password, its bcrypt hash) turns on Alertmanager's own basic auth (--web.config.file)."""

    def __init__(self, workdir: Path, hook_url: str, basic_auth: tuple[str, str, str] | None = None) -> None:
        self.workdir = workdir
        self.port = free_tcp_port()
        (workdir / "alertmanager.yml").write_text(CONFIG.format(hook=hook_url))
        self.auth = basic_auth[:2] if basic_auth else None
        if basic_auth:
            (workdir / "web.yml").write_text(f"basic_auth_users:\n  {basic_auth[0]}: '{basic_auth[2]}'\n")
        self.proc: subprocess.Popen[bytes] | None = None

    @property
    def url(self) -> str:
        return f"http://127.0.0.1:{self.port}"

    def start(self) -> Alertmanager:
        log = (self.workdir / "alertmanager.log").open("ab")
        self.proc = subprocess.Popen(
            [BINARY, f"--config.file={self.workdir / 'alertmanager.yml'}",
             f"--storage.path={self.workdir / 'data'}", f"--web.listen-address=127.0.0.1:{self.port}",
             "--cluster.listen-address=", "--log.level=debug",
             *([f"--web.config.file={self.workdir / 'web.yml'}"] if self.auth else [])],
            stdout=log, stderr=subprocess.STDOUT)
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            if self.proc.poll() is not None:
                raise RuntimeError(f"alertmanager exited: {self.log()[-2000:]}")
            try:
                if httpx.get(self.url + "/-/ready", timeout=1, auth=self.auth).status_code == 200:
                    return self
            except httpx.HTTPError:
                pass
            time.sleep(0.1)
        raise RuntimeError(f"alertmanager not ready: {self.log()[-2000:]}")

    def stop(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.terminate()
            try:
                self.proc.wait(10)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait()
        self.proc = None

    def log(self) -> str:
        return (self.workdir / "alertmanager.log").read_text(errors="replace")

    # --- its own API ---------------------------------------------------------------------------

    def alerts(self, **params: Any) -> list[dict[str, Any]]:
        """GET /api/v2/alerts (active, silenced, inhibited, unprocessed by default, as Alertmanager answers)."""
        r = httpx.get(self.url + "/api/v2/alerts", params=params, timeout=5, auth=self.auth)
        r.raise_for_status()
        return list(r.json())

    def silence(self, matchers: dict[str, str], *, minutes: float = 60, comment: str = "test") -> str:
        now = datetime.now(UTC)
        body = {"matchers": [{"name": k, "value": v, "isRegex": False, "isEqual": True} for k, v in matchers.items()],
                "startsAt": now.isoformat(), "endsAt": (now + timedelta(minutes=minutes)).isoformat(),
                "createdBy": "tests", "comment": comment}
        r = httpx.post(self.url + "/api/v2/silences", json=body, timeout=5, auth=self.auth)
        r.raise_for_status()
        return str(r.json()["silenceID"])

    def wait_alerts(self, pred: Any, timeout_s: float = 10.0, **params: Any) -> list[dict[str, Any]]:
        deadline = time.monotonic() + timeout_s
        got: list[dict[str, Any]] = []
        while time.monotonic() < deadline:
            got = self.alerts(**params)
            if pred(got):
                return got
            time.sleep(0.05)
        raise AssertionError(f"alertmanager alerts never matched: {got}")
