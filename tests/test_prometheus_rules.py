"""The example Prometheus rules (examples/prometheus/) are valid for the real promtool, pass their unit tests,
and name only series that fabricwatch's /api/v1/metrics really exposes (so the example cannot drift from the code)."""

from __future__ import annotations

import re
import shutil
import subprocess
from pathlib import Path

import pytest
import yaml
from fastapi.testclient import TestClient
from prometheus_client.parser import text_string_to_metric_families
from sqlalchemy import Engine, text

from service.alerts.service import apply_findings
from service.notify import NotifySettings, alertmanager
from service.notify.destinations import create_destination
from service.notify.schemas import AlertmanagerSettings
from service.notify.service import create_subscription
from tests.alerts import T0, finding
from tests.alerts.test_api import make_app
from tests.live_api import free_tcp_port
from tests.paths import REPO

RULES = REPO / "examples" / "prometheus" / "fabricwatch.rules.yml"
RULE_TESTS = REPO / "examples" / "prometheus" / "fabricwatch.rules.test.yml"
# a sharded deployment's rules, on top of those (their series: tests/shards/test_sharded_views.py)
SHARD_RULES = REPO / "examples" / "prometheus" / "fabricwatch-shards.rules.yml"
SHARD_RULE_TESTS = REPO / "examples" / "prometheus" / "fabricwatch-shards.rules.test.yml"
PROMTOOL = shutil.which("promtool")
pytestmark = pytest.mark.skipif(PROMTOOL is None, reason="promtool is not installed (Debian package prometheus)")


def promtool(*args: str, cwd: Path) -> subprocess.CompletedProcess[str]:
    assert PROMTOOL is not None
    return subprocess.run([PROMTOOL, *args], cwd=cwd, capture_output=True, text=True, timeout=60)


@pytest.mark.parametrize(("rules", "tests"), [(RULES, RULE_TESTS), (SHARD_RULES, SHARD_RULE_TESTS)])
def test_promtool_checks_the_rules_and_runs_their_unit_tests(rules: Path, tests: Path) -> None:
    check = promtool("check", "rules", str(rules), cwd=rules.parent)
    assert check.returncode == 0 and "SUCCESS" in check.stdout, check.stdout + check.stderr
    unit = promtool("test", "rules", str(tests), cwd=rules.parent)
    assert unit.returncode == 0 and "SUCCESS" in unit.stdout, unit.stdout + unit.stderr


def test_promtool_refuses_a_broken_rule(tmp_path: Path) -> None:
    """The check above could fail: a typo in an expression is refused."""
    bad = yaml.safe_load(RULES.read_text())
    bad["groups"][0]["rules"][0]["expr"] = "sum by (severity (fabricwatch_alerts_open)"
    (tmp_path / "bad.yml").write_text(yaml.safe_dump(bad))
    assert promtool("check", "rules", "bad.yml", cwd=tmp_path).returncode != 0


def _names_in(path: Path) -> set[str]:
    return set(re.findall(r"\b(fabricwatch_[a-z_]+)", path.read_text()))


def test_every_series_the_rules_read_is_exposed(db: Engine, db_url: str) -> None:
    fast = NotifySettings(allow=("127.0.0.0/8",), timeout_s=1.0)
    dead = f"http://127.0.0.1:{free_tcp_port()}"
    with db.begin() as conn:   # enough state that every family has series: an alert, receivers, the detector
        conn.execute(text("INSERT INTO detector_state (name, watermark_ms, last_cycle_ms, ports, blob) "
                          "VALUES ('default', :t, :t, 1, '')"), {"t": T0})
        create_subscription(conn=conn, name="noc", url=dead, format="generic", secret=None, routing_key=None,
                            filters={}, send_resolved=True, enabled=True, created_by="t", settings=fast)
        create_destination(conn=conn, name="am", url=dead, filters={}, enabled=True, created_by="t", settings=fast)
        apply_findings(conn=conn, findings=[finding()], at_ms=T0)
    alertmanager.deliver(db, settings=AlertmanagerSettings(timeout_s=1), notify=fast, budget_s=5)
    with TestClient(make_app(db_url, auth_required=False)) as client:
        body = client.get("/api/v1/metrics").text
    exposed = {s.name for fam in text_string_to_metric_families(body) for s in fam.samples}
    wanted = _names_in(RULES) | _names_in(RULE_TESTS)
    assert wanted and wanted <= exposed, sorted(wanted - exposed)
