import gzip
import json
import textwrap

import pytest
from typer.testing import CliRunner

from service.inventory.schemas import Inventory
from service.telemetry.catalogue import METRICS
from service.telemetry.promtext import parse_lines
from simulator.cli import app
from simulator.generate import generate
from simulator.scenarios import ScenarioError, load_scenario
from simulator.telemetry import simulate
from simulator.topology import TopologyParams, build_topology, read_inventory

SCENARIO = """\
name: small
seed: 1
topology: {hosts: 2, spines: 2}
start: "2025-01-01T00:00:00Z"
artefacts: {missing_fraction: 0.02}
faults:
  - {id: dc, type: dirty_connector, device: leaf-p1-r0-01, port: Ethernet1/1, lanes: [0, 2], at: 10m}
  - {type: counter_wrap, device: leaf-p1-r1-01}
"""


def test_generate_writes_all_three(tmp_path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    r = generate(sc, end="30m", step="60s", out_dir=tmp_path / "out", compress_gz=True)
    assert r.steps == 30 and r.samples > 0
    with gzip.open(r.metrics_file, "rt") as f:
        lines = list(parse_lines(f, "metrics"))
    assert len(lines) == r.samples
    assert {x.name for x in lines} <= set(METRICS)
    assert all(x.ts_ms and x.ts_ms % 60_000 == 0 for x in lines)
    truth = json.loads(r.ground_truth_file.read_text())
    ev = truth["events"][0]
    assert ev["id"] == "dc" and ev["lanes"] == [0, 2] and ev["onset"] == "2025-01-01T00:10:00.000Z"
    assert ev["peer"] == "host-p1-00001:eth0" and ev["cause"] == "physical-contamination"
    assert isinstance(read_inventory(r.inventory_file), Inventory)


def test_bulk_text_matches_sample_path(tmp_path) -> None:
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO.replace("missing_fraction: 0.02", "missing_fraction: 0.0"))
    r = generate(sc, end="3m", out_dir=tmp_path / "o")
    bulk = {(x.name, x.labels, x.ts_ms): x.value for x in parse_lines(r.metrics_file.open())}
    s = load_scenario(sc)
    t0 = 1_735_689_600.0
    n = 0
    for samples in simulate(None, s, t0, t0 + 180, 60):
        for x in samples:
            labels = [("device", x.device)] + ([("port", x.port)] if x.port else []) + \
                ([("lane", str(x.lane))] if x.lane is not None else []) + \
                ([("priority", str(x.priority))] if x.priority is not None else []) + \
                ([("gpu", str(x.gpu))] if x.gpu is not None else [])
            v = bulk[(x.metric, tuple(labels), x.ts_ms)]
            assert v == pytest.approx(x.value, rel=1e-5, abs=1e-6)
            n += 1
    assert n == len(bulk)


@pytest.mark.parametrize("body, path, line, reason", [
    ("name: x\nfaults:\n  - type: dirty_connector\n    device: d\n    port: p\n    drop_db: -2\n",
     "faults.0.drop_db", 6, "greater than 0"),
    ("name: x\nfaults:\n  - {type: no_such_fault, device: d}\n", "faults.0", 3, "does not match any"),
    ("name: x\ntopology:\n  hosts: 4\n  shapes: ring\n", "topology.shapes", 4, "Extra inputs"),
    ("name: x\nfaults:\n  - {type: flap_storm, device: d, port: p, at: soon}\n", "faults.0.at", 3, "offset"),
    ("name: x\nfaults: [\n", "<yaml>", None, ""),
])
def test_malformed_scenario_errors(tmp_path, body, path, line, reason) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(body)
    with pytest.raises(ScenarioError) as ei:
        load_scenario(f)
    e = ei.value
    assert e.file == str(f) and e.path == path and reason in e.reason
    if line:
        assert e.line == line and f"{f}:{line}: {path}:" in str(e)


def test_unknown_place_is_named(tmp_path) -> None:
    f = tmp_path / "bad.yaml"
    f.write_text(textwrap.dedent("""\
        name: x
        topology: {hosts: 2}
        faults:
          - {type: dirty_connector, device: leaf-p1-r0-01, port: Ethernet1/1}
          - {type: dirty_connector, device: leaf-p1-r0-01, port: Ethernet9/9}
        """))
    with pytest.raises(ScenarioError, match=r"bad.yaml:5: faults.1: leaf-p1-r0-01:Ethernet9/9 is not"):
        generate(f, end="2m", out_dir=tmp_path / "o")


def test_cli(tmp_path) -> None:
    runner = CliRunner()
    inv = tmp_path / "inv.yaml"
    res = runner.invoke(app, ["topology", "--hosts", "4", "--shape", "three-tier", "--pods", "2", "--out", str(inv),
                              "--validate"])
    assert res.exit_code == 0, res.output
    assert "wrote" in res.output and read_inventory(inv).devices
    sc = tmp_path / "s.yaml"
    sc.write_text(SCENARIO)
    res = runner.invoke(app, ["generate", "--scenario", str(sc), "--to", "5m", "--out", str(tmp_path / "o")])
    assert res.exit_code == 0, res.output
    assert "ground_truth.json" in res.output
    sc.write_text("name: x\nstep: -1\nfaults: 3\n")
    res = runner.invoke(app, ["generate", "--scenario", str(sc), "--out", str(tmp_path / "o2")])
    assert res.exit_code == 2 and "scenario error" in res.output


def test_inventory_inputs_agree() -> None:
    p = TopologyParams(hosts=2)
    a = [len(s) for s in simulate(p, None, 0, 180, 60)]
    b = [len(s) for s in simulate(build_topology(p), None, 0, 180, 60)]
    assert a == b
