"""The NOC page's KPI view in headless Chromium, against a live API holding a simulated fabric, two real
nccl-tests outputs (one slowed into a regression) and a scripted incident timeline: the leaf x rail
heatmaps, the recovery table and the NCCL chart must show the seeded values."""

from __future__ import annotations

import html
import re
from collections.abc import Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi.testclient import TestClient
from sqlalchemy import Engine

from service.auth.service import create_token
from service.config import load_settings
from tests import live_api as live
from tests.api import chromium
from tests.api.chromium import needs_chromium
from tests.api.fabric_seed import (
    INCIDENT_SCRIPT,
    NCCL_SLOW_FROM,
    NcclSeeded,
    Seeded,
    make_app,
    seed_fabric,
    seed_incident_timeline,
    seed_nccl_runs,
)


@pytest.fixture(scope="module")
def seeded(engine: Engine) -> dict[str, Any]:
    fabric = seed_fabric(engine)
    incidents = seed_incident_timeline(engine)
    nccl = seed_nccl_runs(engine, fabric.end_s)
    return {"fabric": fabric, "incidents": incidents, "nccl": nccl}


@pytest.fixture()
def live_url(seeded: dict[str, Any], db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        yield base


def _api(db_url: str, path: str, **params: Any) -> Any:
    c = TestClient(make_app(load_settings(database_url=db_url, auth_required=False)))
    r = c.get(path, params=params)
    assert r.status_code == 200, r.text
    return r.json()


def _attr(dom: str, tag_attrs: str, name: str) -> str:
    """The value of attribute `name` on the first element whose attributes contain `tag_attrs`."""
    m = re.search(rf"<[a-z]+ [^>]*{re.escape(tag_attrs)}[^>]*>", dom)
    assert m, f"no element with {tag_attrs}"
    v = re.search(rf'\b{name}="([^"]*)"', m.group(0))
    assert v, f"{tag_attrs} has no {name}"
    return html.unescape(v.group(1))


def test_kpi_apis_hold_the_seeded_story(seeded: dict[str, Any], db_url: str) -> None:
    """What the page will draw, checked at the API first so a page failure points at the page."""
    end = datetime.fromtimestamp(seeded["fabric"].end_s, tz=UTC)
    rec = _api(db_url, "/api/v1/kpis/recovery", start="2025-12-01T00:00:00Z", end=end.isoformat())
    assert sorted(rec["by_cause"]) == sorted({f.cause for f in INCIDENT_SCRIPT})
    assert rec["by_cause"]["connector_contamination"]["mitigate"]["p50"] == 180.0
    nccl: NcclSeeded = seeded["nccl"]
    cmp = _api(db_url, f"/api/v1/nccl/runs/{nccl.latest_run_id}/compare")
    assert cmp["baseline_run_id"] == nccl.baseline_run_id and cmp["regressed"]
    assert {s["size_bytes"] for s in cmp["sizes"] if s["regressed"]} == \
        {s["size_bytes"] for s in cmp["sizes"] if s["size_bytes"] >= NCCL_SLOW_FROM}


@needs_chromium
def test_chromium_renders_heatmap_recovery_and_nccl(live_url: str, engine: Engine, seeded: dict[str, Any],
                                                     db_url: str, tmp_path: Path) -> None:
    fabric: Seeded = seeded["fabric"]
    nccl: NcclSeeded = seeded["nccl"]
    with engine.begin() as conn:
        token = create_token(conn, name="noc-kpis", scopes=["read"])
    url = f"{live_url}/?token={token}#kpis"
    dom = chromium.run(url, tmp_path, "--dump-dom", "--hide-scrollbars", budget_ms=8000)
    assert 'data-kpis-loaded="1"' in dom

    # Heatmaps: one cell per leaf and metric, holding what /kpis?scope=leaf says for the page's window
    # (the hour before the newest optic reading, the simulated fabric's last sample).
    end = datetime.fromtimestamp(fabric.end_s, tz=UTC)
    start = datetime.fromtimestamp(fabric.end_s - 3600, tz=UTC)
    leaf = _api(db_url, "/api/v1/kpis", scope="leaf", start=start.isoformat(), end=end.isoformat(), step=3600)
    util = {p["group"]: p["utilization_mean"] for p in leaf["utilization"]}
    ecn = {p["group"]: p["ecn_marked_per_s"] for p in leaf["congestion"]}
    assert len(util) == 4
    for name, value in util.items():
        shown = float(_attr(dom, f'data-leaf="{name}" data-rail', "data-value"))
        assert shown == pytest.approx(value, rel=1e-9), name
        assert float(_attr(dom, f'data-leaf="{name}" data-rail="{name[-4]}" data-metric="ecn_marked_per_s"',
                           "data-value")) == pytest.approx(ecn[name], rel=1e-9)
    assert len(re.findall(r'data-metric="pfc_rx_pause_duty"', dom)) == 4 + 2   # 4 leaves + 2 rail totals
    assert len(re.findall(r"data-rail-total=", dom)) == 4 * 2       # utilization, pause, ECN, availability
    assert dom.count('class="ramp" data-legend=') == 4
    avail = {p["group"]: p["availability"] for p in leaf["availability"]}
    shown = float(_attr(dom, 'data-leaf="leaf-p1-r0-01" data-rail="0" data-metric="availability"', "data-value"))
    assert shown == pytest.approx(avail["leaf-p1-r0-01"]) and shown < 1.0   # the dirty connector's link went down

    # Recovery: the scripted percentiles (seconds), per cause, formatted for people.
    row = re.search(r'<tr class="" data-cause="connector_contamination">.*?</tr>', dom, re.S)
    assert row, "no recovery row for connector_contamination"
    assert 'data-detect-p50="60"' in row.group(0) and 'data-mitigate-p50="180"' in row.group(0)
    assert 'data-mitigate-p90="348"' in row.group(0) and 'data-restore-p50="990"' in row.group(0)
    assert ">3m<" in row.group(0) and ">5m 48s<" in row.group(0) and ">67%<" in row.group(0)
    flap = re.search(r'data-cause="flap_storm">.*?</tr>', dom, re.S)
    assert flap and 'data-detect-p50="22.5"' in flap.group(0) and ">100%<" in flap.group(0)
    assert 'data-cause="transmitter_wearout"' in dom and 'data-cause="all causes"' in dom
    assert re.search(r'data-pod="p2">.*?data-mitigate-p50="135"', dom)   # p2: 90, 180, 60, 600 s

    # NCCL: baseline and latest lines, every size plotted, regressed sizes marked, the verdict shown.
    assert f'class="line baseline" data-run="{nccl.baseline_run_id}"' in dom
    assert f'class="line latest" data-run="{nccl.latest_run_id}"' in dom
    latest = re.findall(r'class="pt latest( regressed)?" data-size="(\d+)" data-busbw="([\d.]+)"', dom)
    assert len(latest) == 32
    regressed = {int(size) for flag, size, _ in latest if flag}
    assert regressed and min(regressed) == NCCL_SLOW_FROM
    assert ("", "67108864", "210.58") not in latest and (" regressed", "67108864", "210.58") in latest
    assert len(re.findall(r'class="pt baseline"', dom)) == 32
    assert 'data-verdict="bad"' in dom and "REGRESSED" in dom and "-22.0%" in dom


@needs_chromium
def test_detect_time_without_an_onset_is_a_dash_with_the_reason(live_url: str, engine: Engine,
                                                                seeded: dict[str, Any], db_url: str,
                                                                tmp_path: Path) -> None:
    """An incident as the detection pipeline opens it, together with its alert: no onset was recorded, so the
    recovery table shows detect "—" and says why, where it used to show "0s" (runs after the test above)."""
    from service.detection.findings import Action, Cause, Finding, Severity
    from service.pipeline import apply_cycle

    at_ms = int((seeded["fabric"].end_s - 600) * 1000)
    finding = Finding(kind="post_fec_errors", scope="port", device="host-p1-00002", port="eth0", lane=None,
                      cause=Cause.POST_FEC, severity=Severity.PAGE, action=Action.REPLACE_CABLE, state="firing",
                      score=2.0, at_ms=at_ms, summary="post-FEC errors on host-p1-00002:eth0",
                      peer_device="leaf-p1-r0-01", peer_port="Ethernet1/2", end="local")
    with engine.begin() as conn:
        assert apply_cycle(conn, [finding], at_ms).drains   # alert, incident and drain, as live
    end = datetime.fromtimestamp(seeded["fabric"].end_s, tz=UTC)
    rec = _api(db_url, "/api/v1/kpis/recovery", start="2025-12-01T00:00:00Z", end=end.isoformat())
    assert rec["by_cause"]["post_fec_errors"]["detect"]["p50"] is None
    assert rec["by_cause"]["connector_contamination"]["detect"]["p50"] == 60.0   # scripted onsets still count

    with engine.begin() as conn:
        token = create_token(conn, name="noc-kpis-detect", scopes=["read"])
    url = f"{live_url}/?token={token}#kpis"
    dom = chromium.run(url, tmp_path, "--dump-dom", budget_ms=8000)
    row = re.search(r'<tr class="" data-cause="post_fec_errors">.*?</tr>', dom, re.S)
    assert row, "no recovery row for post_fec_errors"
    detect = re.search(r'<td class="num nm-why" title="([^"]*)">—</td>', row.group(0))
    assert detect and "no fault onset before the alert" in detect.group(1)
    assert "data-detect-p50" not in row.group(0) and ">0s<" not in row.group(0)
    assert "detect — : not measured" in dom
    chromium.screenshot(url, tmp_path, "noc-kpis.png", budget_ms=8000)


@needs_chromium
def test_kpi_view_without_nccl_runs_or_incidents(engine: Engine, db_url: str, tmp_path: Path,
                                                 monkeypatch: pytest.MonkeyPatch) -> None:
    """A fabric with telemetry but no NCCL runs and no incidents: the panels say so instead of failing."""
    seed_fabric(engine)   # empties the database first
    monkeypatch.setattr(live, "create_app", make_app)
    with engine.begin() as conn:
        token = create_token(conn, name="noc-kpis-empty", scopes=["read"])
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        dom = chromium.run(f"{base}/?token={token}#kpis", tmp_path, "--dump-dom", "--hide-scrollbars", budget_ms=8000)
    assert 'data-kpis-loaded="1"' in dom
    assert "no NCCL runs yet" in dom and "no incidents in the last 30 days of data" in dom
    assert len(re.findall(r'data-leaf="leaf-p\d-r\d-01" data-rail="\d" data-metric="utilization_mean"', dom)) == 4
