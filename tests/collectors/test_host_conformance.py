"""Conformance corpus: every real host capture in tests/data/real, parsed, with hand-checked values.

The corpus is tests/host_corpus.py. The Hosts table in docs/devices.md is checked against it:
a cell says "tested" or "partial" exactly when a row there covers that source and group.
"""

from __future__ import annotations

import re
from pathlib import Path

import pytest

from service.telemetry import catalogue
from tests.host_corpus import CASES, Case, mismatches
from tests.paths import FIXTURES, REPO


def _id(c: Case) -> str:
    source = re.sub(r"\W+", "", c.source.split(" ")[0])
    return f"{Path(c.path).name[:48]}-{source}-{c.group}"


@pytest.mark.parametrize("case", CASES, ids=_id)
def test_capture(case: Case) -> None:
    assert mismatches(case) == []


def test_every_host_capture_is_in_the_table() -> None:
    """Other host files in other/ (ethtool -i, ibnetdiscover, ...) are classified in test_host_other_fixtures."""
    dirs = ("ethtool_stats", "ethtool_module", "rdma_sysfs")
    files = {f"{d}/{p.name}" for d in dirs for p in (FIXTURES / d).iterdir()}
    files |= {f"other/{p.name}" for p in (FIXTURES / "other").iterdir() if "perfquery_extended" in p.name}
    assert files == {c.path for c in CASES}


def _hosts_table() -> tuple[list[str], dict[str, list[str]]]:
    text = (REPO / "docs" / "devices.md").read_text()
    section = text.split("\n## Hosts\n", 1)[1].split("\n## ", 1)[0]
    rows = [line for line in section.splitlines() if line.startswith("|")]
    cells = [[c.strip() for c in r.strip("|").split("|")] for r in rows]
    header, body = cells[0], cells[2:]  # cells[1] is the |---| line
    return header[1:], {c[0]: c[1:] for c in body}


def test_devices_md_hosts_table_matches_the_corpus() -> None:
    groups, table = _hosts_table()
    assert set(groups) <= {m.group for m in catalogue.METRICS.values()}, groups
    covered = {(c.source, c.group) for c in CASES}
    assert {s for s, _ in covered} <= set(table), sorted({s for s, _ in covered} - set(table))
    for source, cells in table.items():
        assert len(cells) == len(groups), source
        for group, cell in zip(groups, cells, strict=True):
            claims = re.match(r"(tested|partial)\b", cell) is not None
            assert claims == ((source, group) in covered), (source, group, cell)
