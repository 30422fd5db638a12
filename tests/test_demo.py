"""`fabricwatch demo` comes up, shows an alert with a drain recommendation, and shuts down cleanly."""

from __future__ import annotations

import os
import re
import signal
import subprocess
import sys
import time
from pathlib import Path

import httpx
import pytest

from tests.live_api import free_tcp_port
from tests.paths import REPO

pytestmark = pytest.mark.slow


def _processes_mentioning(fragment: str) -> list[str]:
    found = []
    for pid in filter(str.isdigit, os.listdir("/proc")):
        try:
            cmd = Path(f"/proc/{pid}/cmdline").read_bytes().replace(b"\0", b" ").decode(errors="replace")
        except OSError:
            continue
        if fragment in cmd:
            found.append(f"{pid}: {cmd[:200]}")
    return found


def test_demo_shows_an_alert_and_stops_cleanly(tmp_path: Path) -> None:
    port = free_tcp_port()
    env = {k: v for k, v in os.environ.items() if not k.startswith("FABRICWATCH_")}
    log = tmp_path / "demo.log"
    with log.open("wb") as out:
        demo = subprocess.Popen([sys.executable, "-m", "service.cli", "demo", "--port", str(port)], cwd=REPO,
                                env=env, stdout=out, stderr=subprocess.STDOUT)
    try:
        token = workdir = None
        alerts: list = []
        drains: list = []
        deadline = time.monotonic() + 240  # the promise is "within 2 minutes"; slack for a loaded machine
        while time.monotonic() < deadline and not (alerts and drains):
            assert demo.poll() is None, log.read_text()[-3000:]
            text = log.read_text()
            token = token or (m.group(0) if (m := re.search(r"fw_[A-Za-z0-9_-]{20,}", text)) else None)
            workdir = workdir or (m.group(0) if (m := re.search(r"/tmp/fabricwatch-demo-[a-z0-9_]+", text)) else None)
            if token:
                h = {"authorization": f"Bearer {token}"}
                try:
                    alerts = httpx.get(f"http://127.0.0.1:{port}/api/v1/alerts", headers=h).json()["items"]
                    drains = httpx.get(f"http://127.0.0.1:{port}/api/v1/drains", headers=h).json()
                except httpx.HTTPError:
                    pass
            time.sleep(3)
        assert alerts and drains, log.read_text()[-3000:]
        assert alerts[0]["action"] and alerts[0]["evidence"]
        # the KPI tab's figures are physically possible (issue #21: leaf utilisation read ~300 %)
        kpis = httpx.get(f"http://127.0.0.1:{port}/api/v1/kpis", params={"scope": "leaf", "step": 60},
                         headers=h, timeout=60).json()
        util = [p["utilization_mean"] for p in kpis["utilization"] if p["utilization_mean"] is not None]
        duty = [p[k] for p in kpis["congestion"] for k in ("pfc_rx_pause_duty", "pfc_tx_pause_duty")
                if p[k] is not None]
        assert util and max(util) > 0.05 and duty, kpis
        assert max(util) <= 1.0 and max(duty) <= 1.0, kpis
        page = httpx.get(f"http://127.0.0.1:{port}/")
        assert page.status_code == 200 and "fabricwatch" in page.text
    finally:
        demo.send_signal(signal.SIGINT)
        try:
            code = demo.wait(60)
        except subprocess.TimeoutExpired:
            demo.kill()
            raise
    assert code == 0, log.read_text()[-3000:]
    assert "everything it started is gone" in log.read_text()
    assert workdir and not Path(workdir).exists()
    assert _processes_mentioning(workdir) == []
