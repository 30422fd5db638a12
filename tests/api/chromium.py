"""Headless Chromium for the NOC page tests: dump the rendered DOM, or take a screenshot."""

from __future__ import annotations

import os
import shutil
import subprocess
from pathlib import Path

import pytest

CHROMIUM = shutil.which("chromium") or shutil.which("chromium-browser")
needs_chromium = pytest.mark.skipif(CHROMIUM is None, reason="needs the Debian 'chromium' package")
DOCS_IMG = Path(__file__).resolve().parents[2] / "docs" / "img"


def run(url: str, tmp: Path, *mode: str, budget_ms: int = 5000) -> str:
    """Load `url` headless with `mode` flags (e.g. --dump-dom); returns stdout."""
    assert CHROMIUM is not None
    out = subprocess.run(
        [CHROMIUM, "--headless", "--no-sandbox", "--disable-gpu", "--disable-background-networking",
         "--disable-component-update", "--disable-sync", "--no-first-run", f"--user-data-dir={tmp / 'profile'}",
         "--window-size=1400,900", f"--virtual-time-budget={budget_ms}", *mode, url],
        capture_output=True, text=True, timeout=60)
    assert out.returncode == 0, out.stderr[-2000:]
    return out.stdout


def screenshot(url: str, tmp: Path, name: str, *mode: str, budget_ms: int = 5000) -> None:
    """Screenshot `url`; with FABRICWATCH_UPDATE_DOCS_IMG set, it replaces docs/img/`name`."""
    shot = tmp / name
    run(url, tmp, f"--screenshot={shot}", *mode, budget_ms=budget_ms)
    assert shot.stat().st_size > 20_000
    if os.environ.get("FABRICWATCH_UPDATE_DOCS_IMG"):
        DOCS_IMG.mkdir(parents=True, exist_ok=True)
        shutil.copyfile(shot, DOCS_IMG / name)
