"""The NOC page shows the targets that are blind or failing, with the reason in words, above the map.

Real parts: the simulated fabric of fabric_seed in PostgreSQL, one leaf polled by the SNMP collector from
snmpsim on 127.0.0.1 serving a real Arista walk whose port names the inventory does not have (everything
refused: degraded, "nothing stored"), a spine polled at a port where nothing answers (failing), the real
API under uvicorn, and headless Chromium (the Debian `chromium` package).
"""

from __future__ import annotations

import json
import re
import time
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import pytest
from sqlalchemy import Engine, text

from collectors.tasks import run_collection
from service.auth.service import create_token
from service.config import load_settings
from tests import live_api as live
from tests.api import chromium
from tests.api.chromium import needs_chromium
from tests.api.fabric_seed import FAULTY_LEAF, make_app, seed_fabric
from tests.snmp_peers import DATA, silent_udp_socket, start_snmpsim

SPINE = "spine-01"


def _endpoint(engine: Engine, device: str, port: int, env: str) -> int:
    config = {"community": {"env": env}, "timeout_s": 1.0, "retries": 0}
    with engine.begin() as conn:
        return int(conn.execute(text(
            "INSERT INTO endpoints (device_id, protocol, address, port, config) "
            "SELECT id, 'snmp', '127.0.0.1', :port, CAST(:c AS jsonb) FROM devices WHERE name = :d "
            "ON CONFLICT (device_id, protocol) DO UPDATE SET address = EXCLUDED.address, port = EXCLUDED.port, "
            "config = EXCLUDED.config RETURNING id"),
            {"d": device, "port": port, "c": json.dumps(config)}).scalar_one())


@pytest.fixture(scope="module")
def gaps(engine: Engine, db_url: str) -> Iterator[dict[str, Any]]:
    seed_fabric(engine)
    sim = start_snmpsim({"noc": DATA / "arista_eos_4.20_dcs-7150s-24.snmprec"})
    sock, dead = silent_udp_socket()
    mp = pytest.MonkeyPatch()
    try:
        mp.setenv("FW_NOC_COMMUNITY", "noc")
        settings = load_settings(database_url=db_url)
        leaf = _endpoint(engine, FAULTY_LEAF, sim.port, "FW_NOC_COMMUNITY")
        spine = _endpoint(engine, SPINE, dead, "FW_NOC_COMMUNITY")
        assert run_collection(leaf, ["counters", "optics", "state"], settings=settings)["ok"]
        assert not run_collection(spine, ["state"], settings=settings)["ok"]
    finally:
        mp.undo()
        sock.close()
        sim.close()
    with engine.begin() as conn:
        token = create_token(conn, name="noc-gaps", scopes=["read"])
    yield {"token": token}


@pytest.fixture()
def live_url(gaps: dict[str, Any], db_url: str, monkeypatch: pytest.MonkeyPatch) -> Iterator[str]:
    monkeypatch.setattr(live, "create_app", make_app)
    with live.live_api(load_settings(database_url=db_url, auth_required=True)) as base:
        yield base


@needs_chromium
def test_degraded_and_failing_targets_are_listed_with_their_reason(live_url: str, gaps: dict[str, Any],
                                                                   tmp_path: Path) -> None:
    dom = chromium.run(f"{live_url}/?token={gaps['token']}", tmp_path, "--dump-dom")
    assert 'data-loaded="1"' in dom
    strip = re.search(r'<div id="gaps" class="gaps"[^>]*>(.*?)</div>\s*<div id="map"', dom, re.S)
    assert strip, "the collection gaps strip is hidden or missing"
    body = strip.group(1)
    assert "collection gaps · 1 degraded · 1 failing" in body
    leaf = re.search(rf'<div class="gap" data-target="{FAULTY_LEAF}/snmp" data-state="degraded" title="([^"]*)">(.*?)'
                     r'</div>', body, re.S)
    assert leaf, body
    # the reason in words: everything the leaf gave names ports the inventory does not have
    assert "nothing stored: all" in leaf.group(2)
    assert "not in the inventory (e.g. leaf-p1-r0-01:Ethernet" in leaf.group(2)
    assert "refused: " in leaf.group(1) and "refused</span>" in leaf.group(2)
    spine = re.search(rf'<div class="gap" data-target="{SPINE}/snmp" data-state="failing"[^>]*>(.*?)</div>', body, re.S)
    assert spine and "no response" in spine.group(1), body
    assert "no state</span>" in spine.group(1)   # its missing group


_LAYOUT_JS = r"""(() => {
  const vh = innerHeight, vw = innerWidth;
  const box = document.getElementById("gaps").getBoundingClientRect();
  const rows = [...document.querySelectorAll("#gaps .gap")].map((r) => { const b = r.getBoundingClientRect();
    return { h: Math.round(b.height), inside: b.top >= 0 && b.bottom <= vh && b.right <= vw + 1 }; });
  const map = document.getElementById("map").getBoundingClientRect();
  return { gaps: { top: box.top, bottom: box.bottom }, rows, mapHeight: map.height };
})()"""


@needs_chromium
def test_the_strip_is_compact_and_leaves_the_map_its_room(live_url: str, gaps: dict[str, Any], tmp_path: Path) -> None:
    with chromium.devtools(f"{live_url}/?token={gaps['token']}", tmp_path) as page:
        page.wait("document.body && document.body.dataset.loaded === '1' "
                  "&& document.querySelectorAll('#gaps .gap').length")
        time.sleep(0.3)
        got = page.eval(_LAYOUT_JS)
        page.screenshot(tmp_path, "noc-gaps.png")
    assert len(got["rows"]) == 2 and all(r["inside"] and r["h"] <= 22 for r in got["rows"]), got   # one line each
    assert got["gaps"]["bottom"] - got["gaps"]["top"] < 70 and got["mapHeight"] > 300, got
