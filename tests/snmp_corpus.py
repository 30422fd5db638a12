"""The SNMP conformance corpus: real walks with hand-checked expectations (tests/data/snmp/conformance.toml).

Shared by tests/collectors/test_snmp_conformance.py and bench/device_conformance.py: both poll
every walk through the real collector and score the result with `score`.
"""

from __future__ import annotations

import math
import re
import tomllib
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

from service.telemetry.samples import Sample

REPO = Path(__file__).resolve().parents[1]
WALKS = REPO / "tests" / "data" / "real" / "snmp"
EXPECTATIONS = REPO / "tests" / "data" / "snmp" / "conformance.toml"


@dataclass(frozen=True)
class Walk:
    file: str
    platform: str
    dialect: str
    ports: int
    expect: dict[str, list[dict[str, Any]]]
    blind_spots: list[tuple[str, str]]
    unsupported: dict[str, str]

    @property
    def path(self) -> Path:
        return WALKS / self.file

    @property
    def community(self) -> str:
        """The walk's snmpsim community (its file name, with what snmpsim would split on replaced)."""
        return re.sub(r"[^A-Za-z0-9_-]", "_", self.file.removesuffix(".snmprec"))


def load_walks() -> list[Walk]:
    raw = tomllib.loads(EXPECTATIONS.read_text())["walk"]
    return [Walk(w["file"], w["platform"], w["dialect"], w["ports"], w.get("expect", {}),
                 [(g, t) for g, t in w.get("blind_spots", [])], w.get("unsupported", {})) for w in raw]


@dataclass
class Score:
    """How a poll of one walk compares with its expectations."""

    walk: Walk
    wrong: dict[str, list[str]] = field(default_factory=dict)  # group -> what did not match
    silent: list[str] = field(default_factory=list)  # blind spots no warning reports

    @property
    def cells(self) -> dict[str, bool]:
        """(expected group) -> every hand-checked value of it came out right."""
        return {g: not self.wrong.get(g) for g in self.walk.expect}


def score(walk: Walk, samples: Sequence[Sample], warnings: Sequence[str], ports: set[str]) -> Score:
    """Compare a poll's samples and warnings with the walk's expectations."""
    out = Score(walk)
    by_key: dict[tuple[str, str | None, int | None], list[float]] = {}
    for s in samples:
        by_key.setdefault((s.metric, s.port, s.lane), []).append(s.value)
    for group, checks in walk.expect.items():
        for c in checks:
            got = by_key.get((c["metric"], c["port"], c.get("lane")), [])
            if len(got) != 1 or not math.isclose(got[0], c["value"], rel_tol=1e-12, abs_tol=1e-6):
                out.wrong.setdefault(group, []).append(
                    f"{c['metric']} {c['port']} lane={c.get('lane')}: want {c['value']}, got {got}")
    if len(ports) != walk.ports:
        out.wrong.setdefault("state", []).append(f"{len(ports)} ports, want {walk.ports}")
    for group, text in walk.blind_spots:
        if not any(w.startswith(f"{group}:") and text in w for w in warnings):
            out.silent.append(f"{group}: {text}")
    return out
