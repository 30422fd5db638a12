"""The NOC page: served with a strict CSP, assets from a fixed list, and rendered by headless Chromium against
a live API with seeded alerts and drains (needs the Debian `chromium` package). The layout is judged on a
1600x1000 screen: compact alert rows, labelled devices, names that never wrap, buttons only for tokens that
may use them, and no retrying after a 401."""

from __future__ import annotations

import re
import time
from collections.abc import Callable, Iterator
from datetime import UTC, datetime
from pathlib import Path
from typing import Any

import pytest
from fastapi import FastAPI, Request, Response
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api import auth as api_auth
from service.auth.service import create_token
from service.config import load_settings
from tests import live_api as live
from tests.api import chromium
from tests.api.chromium import needs_chromium
from tests.api.fabric_seed import FAULTY_LEAF, Seeded, make_app, seed_alerts, seed_drain, seed_fabric

# What a NOC sees on a bad day: pages, tickets and an info, on links and hosts of both pods.
EXTRA = (  # kind, device, port, lane, peer, cause, severity, action, evidence (feature, value, baseline, unit), ttt h
    ("post_fec_errors", "host-p1-00002", "eth0", None, ("leaf-p1-r0-01", "Ethernet1/2"), "post_fec_errors", "page",
     "replace_cable", ("post_fec_errors_per_s", 12.5, 0.0, "1/s"), None),
    ("link_flaps", "leaf-p2-r0-01", "Ethernet1/5", None, ("spine-01", "Ethernet1/3"), "flap_storm", "page",
     "reseat_module", ("link_down_events", 14.0, 0.0, ""), None),
    ("tx_bias_high", "host-p2-00008", "eth1", 2, ("leaf-p2-r1-01", "Ethernet1/4"), "transmitter_wearout", "ticket",
     "replace_local_module", ("tx_bias_ma", 71.2, 44.0, "mA"), 38.5),
    ("pause_storm", "host-p1-00003", "eth0", None, ("leaf-p1-r0-01", "Ethernet1/3"), "nic_pause_storm", "ticket",
     "drain_host", ("pfc_tx_pause_duty", 0.31, 0.002, ""), None),
    ("rx_power_degrading", "leaf-p2-r1-01", "Ethernet1/2", 3, ("host-p2-00006", "eth1"), "connector_contamination",
     "ticket", "clean_connectors", ("rx_power_dbm", -4.8, -1.2, "dBm"), 52.0),
    ("module_temperature_high", "host-p2-00007", "eth0", None, ("leaf-p2-r0-01", "Ethernet1/3"), "module_alarm",
     "info", "escalate_device", ("module_temperature_celsius", 71.0, 48.0, "°C"), None),
)


def seed_more_alerts(engine: Engine, at_ms: int) -> list[int]:
    from service.alerts.service import apply_findings
    from service.detection.findings import Action, Cause, Evidence, Finding, Severity

    findings = [Finding(kind=k, scope="lane" if lane is not None else "port", device=d, port=p, lane=lane,
                        cause=Cause(c), severity=Severity(sev), action=Action(act), state="firing", score=3.0,
                        at_ms=at_ms, summary=f"{k.replace('_', ' ')} on {d}:{p}", peer_device=peer[0],
                        peer_port=peer[1], end="local", ttt_hours=ttt,
                        evidence=[Evidence(ev[0], ev[1], baseline=ev[2], unit=ev[3])])
                for k, d, p, lane, peer, c, sev, act, ev, ttt in EXTRA]
    with engine.begin() as conn:
        return apply_findings(conn=conn, findings=findings, at_ms=at_ms, kinds=[f.kind for f in findings]).opened


def alert_id(engine: Engine, kind: str) -> int:
    with engine.connect() as conn:
        return int(conn.execute(text("SELECT id FROM alerts WHERE kind = :k"), {"k": kind}).scalar_one())


def seed_flap_drain(engine: Engine, at_s: float) -> int:
    """A drain for the flapping spine uplink, from its alert, which a person has acknowledged."""
    from service.alerts.service import acknowledge
    from service.drains.schemas import DrainSettings, Target, TargetKind
    from service.drains.service import recommend

    flaps = alert_id(engine, "link_flaps")
    with engine.begin() as conn:
        acknowledge(conn=conn, alert_id=flaps, actor="noc", comment="looking", at_ms=int(at_s * 1000))
        target = Target(kind=TargetKind.LINK, device="leaf-p2-r0-01", port="Ethernet1/5")
        return int(recommend(conn=conn, target=target, reason="14 link flaps in 10 min on a spine uplink",
                             cause="flap_storm", at=datetime.fromtimestamp(at_s, tz=UTC), settings=DrainSettings(),
                             alert_id=flaps).id)


@pytest.fixture(scope="module")
def fabric(engine: Engine) -> Seeded:
    return seed_fabric(engine)


@pytest.fixture(scope="module")
def seeded(fabric: Seeded, engine: Engine) -> dict[str, Any]:
    at_ms = int(fabric.end_s * 1000)
    opened = seed_alerts(engine, at_ms)
    alerts = opened + seed_more_alerts(engine, at_ms)
    drains = [seed_drain(engine, fabric.end_s, alert_id(engine, "rx_power_low")), seed_flap_drain(engine, fabric.end_s)]
    with engine.begin() as conn:
        tokens = {s: create_token(conn, name=f"noc-{s}", scopes=[s]) for s in ("read", "operate")}
    return {"alerts": alerts, "drains": drains, "tokens": tokens}


def test_page_and_assets(fabric: Seeded, db_url: str) -> None:
    c = TestClient(make_app(load_settings(database_url=db_url, auth_required=True)))
    r = c.get("/")   # the page holds no data, so it needs no token; the API calls it makes do
    assert r.status_code == 200 and r.headers["content-type"].startswith("text/html")
    assert "script-src 'self'" in r.headers["content-security-policy"]
    assert '<script src="/noc/app.js"' in r.text and "http" not in r.text.split("<body>")[1]  # no CDN
    assert c.get("/noc/app.js").headers["content-type"].startswith("text/javascript")
    assert c.get("/noc/style.css").status_code == 200
    for bad in ("/noc/index.html", "/noc/..%2fviews.py", "/noc/views.py"):
        assert c.get(bad).status_code == 404, bad


def test_whoami_reports_the_tokens_scopes(seeded: dict[str, Any], db_url: str) -> None:
    c = TestClient(make_app(load_settings(database_url=db_url, auth_required=True)))
    me = lambda tok: c.get("/api/v1/auth/whoami", headers={"authorization": f"Bearer {tok}"})  # noqa: E731
    r = me(seeded["tokens"]["read"])
    assert r.status_code == 200
    assert r.json() == {"name": "noc-read", "scopes": ["read"],
                        "allows": {"read": True, "operate": False, "admin": False, "ingest": False}}
    assert me(seeded["tokens"]["operate"]).json()["allows"] == {"read": True, "operate": True, "admin": False,
                                                               "ingest": False}
    assert c.get("/api/v1/auth/whoami").status_code == 401
    bad = me("fw_not-a-token")
    assert bad.status_code == 401 and bad.json()["title"] == "Invalid token"
    api_auth._failures.clear()
    open_ = TestClient(make_app(load_settings(database_url=db_url, auth_required=False)))
    assert open_.get("/api/v1/auth/whoami").json()["allows"]["operate"] is True   # the embedded demo


@pytest.fixture()
def live_url(seeded: dict[str, Any], db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        yield base


# the statuses the page's drain queue shows (app.js)
QUEUE = "&".join(f"status={s}" for s in ("pending", "blocked", "approved", "execution_failed", "execution_unknown"))


def _api(db_url: str, path: str) -> Any:
    r = TestClient(make_app(load_settings(database_url=db_url, auth_required=False))).get(path)
    assert r.status_code == 200, r.text
    return r.json()


@needs_chromium
def test_chromium_renders_alerts_map_and_drains(live_url: str, seeded: dict[str, Any], db_url: str,
                                                tmp_path: Path) -> None:
    dom = chromium.run(f"{live_url}/?token={seeded['tokens']['read']}", tmp_path, "--dump-dom")
    assert 'data-loaded="1"' in dom
    rows = re.findall(r'class="click alert-row" data-alert-id="(\d+)"', dom)
    assert sorted(int(x) for x in rows) == sorted(seeded["alerts"])
    assert "Rx power on lane 1 fell 6 dB in one step" in dom and "clean connectors" in dom
    assert "rx_power_dbm" in dom  # evidence chips

    # The map: every device a tile labelled with its name; the bad links listed with both ends.
    topo = _api(db_url, "/api/v1/topology")
    for node in topo["nodes"]:
        assert re.search(rf'data-device="{node["id"]}" data-health="{node["health"]}"[^>]*>{node["id"]}<', dom), \
            node["id"]
    assert re.search(rf'data-device="{FAULTY_LEAF}" data-health="critical"', dom)
    bad = [e for e in topo["edges"] if e["health"] in ("critical", "down", "warning")]
    assert bad and any({e["source"], e["target"]} == {FAULTY_LEAF, "host-p1-00001"} for e in bad)
    for e in bad:
        row = re.search(rf'<div class="blink" data-link-id="{e["id"]}" data-health="{e["health"]}".*?</div>', dom, re.S)
        assert row and f'{e["source"]}:{e["source_port"]}' in row.group(0) \
            and f'{e["target"]}:{e["target_port"]}' in row.group(0), e

    # The drain queue: each drain's reason, its safety verdict, and its alert's state where the API gives it.
    drains = {d["id"]: d for d in _api(db_url, f"/api/v1/drains?{QUEUE}")}
    assert set(drains) == set(seeded["drains"])
    for d in drains.values():
        row = re.search(rf'data-drain-id="{d["id"]}".*?</tr>', dom, re.S)
        assert row and d["reason"] in row.group(0) and ("SAFE" in row.group(0) or "BLOCKED" in row.group(0))
        if "alert_state" in d:
            assert f'data-alert-state="{d["alert_state"] or ""}"' in row.group(0)


_BUTTONS = re.compile(r"<button[^>]*>(ack|approve)</button>")


@needs_chromium
def test_drain_queue_shows_executions_a_person_must_settle(live_url: str, seeded: dict[str, Any], engine: Engine,
                                                           tmp_path: Path) -> None:
    """A drain whose execution never recorded an end waits for a person: it stays in the queue, marked."""
    drain_id = seeded["drains"][-1]
    with engine.begin() as conn:  # the module's seeded data, not an emptied database
        before = conn.execute(text("SELECT status FROM drain_recommendations WHERE id = :i"), {"i": drain_id}).scalar()
        conn.execute(text("UPDATE drain_recommendations SET status = 'execution_unknown' WHERE id = :i"),
                     {"i": drain_id})
    try:
        dom = chromium.run(f"{live_url}/?token={seeded['tokens']['read']}", tmp_path, "--dump-dom")
        row = re.search(rf'data-drain-id="{drain_id}".*?</tr>', dom, re.S)
        assert row and '<div class="state execution_unknown">execution unknown</div>' in row.group(0)
    finally:
        with engine.begin() as conn:
            conn.execute(text("UPDATE drain_recommendations SET status = :s WHERE id = :i"),
                         {"s": before, "i": drain_id})


@needs_chromium
def test_read_only_token_sees_no_action_buttons(live_url: str, seeded: dict[str, Any], db_url: str,
                                                tmp_path: Path) -> None:
    ro = chromium.run(f"{live_url}/?token={seeded['tokens']['read']}", tmp_path / "ro", "--dump-dom")
    assert 'data-loaded="1"' in ro and 'data-alert-id="' in ro and 'data-drain-id="' in ro
    assert _BUTTONS.findall(ro) == []
    assert re.search(r'<span id="who" class="who ro"[^>]*>noc-read · read only</span>', ro)
    # The same page with an operate token: one ack per firing alert, one approve per pending drain.
    op = chromium.run(f"{live_url}/?token={seeded['tokens']['operate']}", tmp_path / "op", "--dump-dom")
    drains = _api(db_url, f"/api/v1/drains?{QUEUE}")
    shown = _BUTTONS.findall(op)
    firing = _api(db_url, "/api/v1/alerts?state=firing&limit=500")["items"]
    assert shown.count("ack") == len(firing) == len(seeded["alerts"]) - 1   # the acknowledged one has none
    assert shown.count("approve") == sum(d["status"] == "pending" for d in drains) >= 1


class Counted:
    """The app, counting the API requests it answers (path and status), to see the page's polling."""

    def __init__(self) -> None:
        self.seen: list[tuple[str, int]] = []

    def __call__(self, settings: Any) -> FastAPI:
        app = make_app(settings)

        @app.middleware("http")
        async def count(request: Request, call_next: Callable[[Request], Any]) -> Response:
            response = await call_next(request)
            if request.url.path.startswith("/api/"):
                self.seen.append((request.url.path, response.status_code))
            return response

        return app


@needs_chromium
@pytest.mark.parametrize("query, message", [("?token=fw_wrong-token", "The token was refused (the token is unknown"),
                                            ("", "This page needs a token")])
def test_a_401_stops_polling_and_says_the_token_is_wrong(seeded: dict[str, Any], db_url: str, tmp_path: Path,
                                                         monkeypatch: pytest.MonkeyPatch, query: str,
                                                         message: str) -> None:
    counted = Counted()
    monkeypatch.setattr(live, "create_app", counted)
    api_auth._failures.clear()
    try:
        with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
            # 3 minutes of virtual time: three 60 s refreshes and many event-stream reconnects if it kept trying.
            dom = chromium.run(f"{base}/{query}", tmp_path, "--dump-dom", budget_ms=180_000)
            time.sleep(0.5)   # requests still in flight reach the counter
    finally:
        api_auth._failures.clear()
    banner = re.search(r'<div id="auth" class="([^"]*)">\s*<span id="auth-msg">([^<]*)</span>', dom)
    assert banner and "hidden" not in banner.group(1) and message in banner.group(2), banner
    assert counted.seen == [("/api/v1/auth/whoami", 401)]   # one question, then silence
    assert '<span id="live" class="live off"' in dom and "no access" in dom


_LAYOUT_JS = r"""(() => {
  const vw = innerWidth, vh = innerHeight;
  const inside = (r, box) => r.top >= box.top - 1 && r.bottom <= box.bottom + 1 && r.left >= box.left - 1
    && r.right <= box.right + 1;
  const view = { top: 0, left: 0, bottom: vh, right: vw };
  const rows = [...document.querySelectorAll("tr.alert-row")];
  const scroller = rows.length ? rows[0].closest("div") : null;
  const sbox = scroller ? scroller.getBoundingClientRect() : view;
  const visibleAlerts = rows.filter((tr) => { const r = tr.getBoundingClientRect();
    return inside(r, view) && inside(r, sbox); }).length;
  // Every device or port name in visible text must sit on one line.
  const NAME = /\b(?:leaf|spine|core|host)-[A-Za-z0-9-]*[A-Za-z0-9](?::[A-Za-z0-9/._-]*[A-Za-z0-9])?/g;
  const walker = document.createTreeWalker(document.getElementById("ops-view"), NodeFilter.SHOW_TEXT);
  const wrapped = [];
  let names = 0;
  for (let n = walker.nextNode(); n; n = walker.nextNode()) {
    for (const m of n.data.matchAll(NAME)) {
      const range = document.createRange();
      range.setStart(n, m.index); range.setEnd(n, m.index + m[0].length);
      const tops = new Set([...range.getClientRects()].filter((r) => r.width > 0 && r.height > 0)
        .map((r) => Math.round(r.top)));
      if (tops.size) names++;
      if (tops.size > 1) wrapped.push(m[0]);
    }
  }
  // Map tiles: labelled with the whole name, on screen.
  const tiles = [...document.querySelectorAll("[data-device]")].map((t) => { const r = t.getBoundingClientRect();
    return { id: t.dataset.device, text: t.textContent, clipped: t.scrollWidth > t.clientWidth + 1,
             onscreen: inside(r, view) }; });
  return { vw, vh, alertRows: rows.length, visibleAlerts, names, wrapped, tiles };
})()"""


@needs_chromium
def test_layout_at_1600x1000(live_url: str, seeded: dict[str, Any], db_url: str, tmp_path: Path) -> None:
    with chromium.devtools(f"{live_url}/?token={seeded['tokens']['operate']}", tmp_path) as page:
        page.wait("document.body && document.body.dataset.loaded === '1' "
                  "&& document.querySelectorAll('canvas.plot').length >= 2")
        time.sleep(0.5)   # the second end's table
        got = page.eval(_LAYOUT_JS)
        page.screenshot(tmp_path, "noc.png")
    assert (got["vw"], got["vh"]) == (chromium.WIDTH, chromium.HEIGHT)
    assert got["alertRows"] == len(seeded["alerts"]) == 8
    # Compact rows: all eight fit without scrolling (the old three-to-four-line rows showed four of them).
    assert got["visibleAlerts"] == 8, got["visibleAlerts"]
    assert got["names"] > 30 and got["wrapped"] == [], got["wrapped"]
    topo = _api(db_url, "/api/v1/topology")
    tiles = {t["id"]: t for t in got["tiles"]}
    assert set(tiles) == {n["id"] for n in topo["nodes"]}
    for t in tiles.values():
        assert t["text"].startswith(t["id"]) and not t["clipped"] and t["onscreen"], t
