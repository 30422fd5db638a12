"""The real Prometheus (Debian's prometheus) scrapes fabricwatch's /api/v1/metrics with a read token, as
docs/alertmanager.md configures it, and evaluates the example rules (examples/prometheus/) on what it got:
the recorded series carry fabricwatch's numbers, and an alerting rule on a down Alertmanager goes pending."""

from __future__ import annotations

import shutil
import subprocess
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import httpx
import pytest
import yaml
from sqlalchemy import Engine

from service.alerts.service import apply_findings
from service.auth.service import create_token
from service.config import load_settings
from service.detection.findings import Severity
from service.notify import NotifySettings, alertmanager
from service.notify.destinations import create_destination
from service.notify.schemas import AlertmanagerSettings
from tests.alerts import T0, finding
from tests.live_api import free_tcp_port, live_api
from tests.paths import REPO

PROMETHEUS = shutil.which("prometheus")
RULES = REPO / "examples" / "prometheus" / "fabricwatch.rules.yml"
pytestmark = pytest.mark.skipif(PROMETHEUS is None, reason="prometheus is not installed (Debian package prometheus)")


def _rules_every_second(dst: Path) -> None:
    """The example rules, evaluated every second instead of every minute (the test cannot wait minutes)."""
    rules = yaml.safe_load(RULES.read_text())
    for group in rules["groups"]:
        group["interval"] = "1s"
    dst.write_text(yaml.safe_dump(rules))


@pytest.fixture()
def prometheus_for(tmp_path: Path) -> Iterator[Any]:
    procs: list[subprocess.Popen[bytes]] = []

    def start(api_url: str, token: str) -> str:
        assert PROMETHEUS is not None
        (tmp_path / "token").write_text(token)
        _rules_every_second(tmp_path / "rules.yml")
        host = api_url.removeprefix("http://")
        (tmp_path / "prometheus.yml").write_text(yaml.safe_dump({
            "global": {"scrape_interval": "1s", "evaluation_interval": "1s"},
            "rule_files": ["rules.yml"],
            "scrape_configs": [{   # as docs/alertmanager.md says
                "job_name": "fabricwatch", "metrics_path": "/api/v1/metrics",
                "authorization": {"type": "Bearer", "credentials_file": str(tmp_path / "token")},
                "static_configs": [{"targets": [host]}]}]}))
        port = free_tcp_port()
        procs.append(subprocess.Popen(
            [PROMETHEUS, f"--config.file={tmp_path / 'prometheus.yml'}", f"--storage.tsdb.path={tmp_path / 'tsdb'}",
             f"--web.listen-address=127.0.0.1:{port}", "--log.level=warn"],
            stdout=(tmp_path / "prometheus.log").open("wb"), stderr=subprocess.STDOUT))
        return f"http://127.0.0.1:{port}"

    yield start
    for p in procs:
        p.terminate()
        try:
            p.wait(10)
        except subprocess.TimeoutExpired:
            p.kill()
            p.wait()


def query(prom: str, expr: str, pred: Any, timeout_s: float = 30.0) -> list[dict[str, Any]]:
    deadline = time.monotonic() + timeout_s
    got: list[dict[str, Any]] = []
    while time.monotonic() < deadline:
        try:
            r = httpx.get(prom + "/api/v1/query", params={"query": expr}, timeout=5)
            if r.status_code == 200:
                got = r.json()["data"]["result"]
                if pred(got):
                    return got
        except httpx.HTTPError:
            pass   # still starting
        time.sleep(0.25)
    raise AssertionError(f"{expr}: {got}")


def test_prometheus_scrapes_the_fabric_series_and_the_example_rules_work(
        db: Engine, db_url: str, prometheus_for: Any) -> None:
    fast = NotifySettings(allow=("127.0.0.0/8",), timeout_s=1.0)
    with db.begin() as conn:
        apply_findings(conn=conn, at_ms=T0, findings=[
            finding(device="leaf-01", port="Ethernet1/1"), finding(device="leaf-01", port="Ethernet2/1"),
            finding(device="leaf-02", port="Ethernet1/1", severity=Severity.TICKET)])
        token = create_token(conn, name="prometheus", scopes=["read"])
        create_destination(conn=conn, name="am-down", url=f"http://127.0.0.1:{free_tcp_port()}", filters={},
                           enabled=True, created_by="t", settings=fast)
    alertmanager.deliver(db, settings=AlertmanagerSettings(timeout_s=1), notify=fast, budget_s=5)   # it fails

    with live_api(load_settings(database_url=db_url, auth_required=True)) as api:
        prom = prometheus_for(api, token)
        # The token is accepted: a 401 keeps up at 0. Waited for, not read once: a scrape times out after its
        # 1 s interval, which a loaded machine's first /metrics can take (up 0 for that one scrape).
        up = query(prom, 'up{job="fabricwatch"}', lambda r: bool(r) and r[0]["value"][1] == "1")
        assert len(up) == 1
        sev = query(prom, "fabricwatch:alerts_open:sum_by_severity", lambda r: len(r) == 3)
        assert {s["metric"]["severity"]: s["value"][1] for s in sev} == {"page": "2", "ticket": "1", "info": "0"}
        ports = query(prom, "fabricwatch:faulty_ports:count_by_pod_cause", lambda r: bool(r))
        assert [(p["metric"]["cause"], p["value"][1]) for p in ports] == [("connector_contamination", "3")]
        pending = query(prom, 'ALERTS{alertname="FabricwatchAlertmanagerUnreachable"}', lambda r: bool(r))
        assert pending[0]["metric"]["alertstate"] == "pending" and pending[0]["metric"]["receiver"] == "am-down"
