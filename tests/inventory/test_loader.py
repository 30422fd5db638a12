"""Bad inventories: each gives one precise error naming the file, the line and the field."""

from __future__ import annotations

import textwrap
from pathlib import Path

import pytest

from service.inventory.loader import (
    InventoryError,
    dump_inventory_yaml,
    load_inventory_file,
    load_inventory_text,
)
from service.inventory.schemas import Optic
from tests.paths import REPO

EXAMPLE = REPO / "examples" / "inventory" / "small-fabric.yaml"

# A valid base: line numbers below refer to this text (line 1 is 'version: 1').
BASE = """\
version: 1
pods:
  - name: pod1
devices:
  - name: leaf1
    kind: switch
    role: leaf
    pod: pod1
    ports:
      - name: swp1
        rail: 0
      - name: swp2
    endpoints:
      - protocol: snmp
        community: {env: SNMP_COMMUNITY}
  - name: host1
    kind: host
    role: host
    pod: pod1
    gpus: 8
    ports:
      - name: eth0
        rail: 0
        gpu: 0
        optic:
          thresholds:
            rx_power_dbm: {low_alarm: -10, high_alarm: 5}
links:
  - a: host1:eth0
    b: leaf1:swp1
"""


def errors_of(text: str, source: str = "fabric.yaml") -> list:
    with pytest.raises(InventoryError) as info:
        load_inventory_text(text, source)
    return info.value.errors


def one_error(text: str) -> tuple[int | None, str, str]:
    errs = errors_of(text)
    assert len(errs) == 1, [str(e) for e in errs]
    return errs[0].line, errs[0].field, errs[0].reason


def edit(old: str, new: str) -> str:
    assert BASE.count(old) == 1, old
    return BASE.replace(old, new)


def test_base_and_example_are_valid() -> None:
    inv = load_inventory_text(BASE)
    assert [d.name for d in inv.devices] == ["leaf1", "host1"]
    ex = load_inventory_file(EXAMPLE)
    assert {ep.protocol for d in ex.devices for ep in d.endpoints} == {"snmp", "gnmi", "host"}
    assert {ep.version for d in ex.devices for ep in d.endpoints if ep.protocol == "snmp"} == {"2c", "3"}
    # the YAML the service writes reads back to the same inventory
    assert load_inventory_text(dump_inventory_yaml(ex)) == ex


@pytest.mark.parametrize(("optic", "lanes"), [
    ({"type": "800G-DR8", "form_factor": "OSFP"}, 8), ({"type": "800G-2xFR4"}, 8), ({"type": "400G-DR4"}, 4),
    ({"type": "10G-SR"}, 1), ({"type": "AOC", "form_factor": "QSFP28"}, 4), ({"form_factor": "QSFP-DD"}, 8),
    ({"type": "DAC"}, 4), ({"type": "800G-DR8", "lanes": 4}, 4),  # said outright wins
])
def test_optic_lanes_follow_the_type_or_form_factor(optic: dict[str, object], lanes: int) -> None:
    """An 800G-DR8 left at the old default of 4 lanes had lanes 4-7 refused at import."""
    assert Optic.model_validate(optic).lanes == lanes


def test_example_dr8_optics_have_eight_lanes() -> None:
    ex = load_inventory_file(EXAMPLE)
    dr8 = [p.optic for d in ex.devices for p in d.ports if p.optic and p.optic.type == "800G-DR8"]
    assert dr8 and all(o.lanes == 8 for o in dr8)


def test_yaml_syntax_error_has_line() -> None:
    line, field, reason = one_error(edit("      - name: swp2\n", "      - name: [swp2\n"))
    assert line in (12, 13) and field == "" and reason.startswith("YAML syntax error")


def test_duplicate_yaml_key_rejected() -> None:
    line, field, reason = one_error(edit("    role: leaf\n", "    role: leaf\n    role: spine\n"))
    assert (line, field) == (8, "devices[0].role")
    assert "duplicate key 'role'" in reason and "line 7" in reason


def test_not_a_mapping_and_empty() -> None:
    assert one_error("- a\n- b\n") == (1, "", "the inventory must be a mapping with 'devices', 'links' "
                                               "and 'pods' keys, not a list")
    assert "empty" in one_error("# nothing\n")[2]


def test_wrong_type_deep_field() -> None:
    line, field, reason = one_error(edit("{low_alarm: -10, high_alarm: 5}", "{low_alarm: -10, high_alarm: hot}"))
    assert (line, field) == (27, "devices[1].ports[0].optic.thresholds.rx_power_dbm.high_alarm")
    assert "valid number" in reason and "'hot'" in reason


def test_threshold_order_names_the_block() -> None:
    line, field, reason = one_error(edit("{low_alarm: -10, high_alarm: 5}", "{low_alarm: 10, high_alarm: 5}"))
    assert (line, field) == (27, "devices[1].ports[0].optic.thresholds.rx_power_dbm")
    assert "low_alarm <= " in reason


def test_unknown_field_suggests() -> None:
    line, field, reason = one_error(edit("        rail: 0\n        gpu: 0\n",
                                         "        rail: 0\n        gpus: 0\n"))
    assert (line, field) == (24, "devices[1].ports[0].gpus")
    assert reason == "unknown field 'gpus'; did you mean 'gpu'?"


def test_missing_field_points_at_the_item() -> None:
    line, field, reason = one_error(edit("    kind: host\n", ""))
    assert (line, field, reason) == (16, "devices[1].kind", "required field is missing")


def test_link_to_missing_port() -> None:
    line, field, reason = one_error(edit("    b: leaf1:swp1\n", "    b: leaf1:swp9\n"))
    assert (line, field) == (30, "links[0].b")
    assert reason == "'leaf1:swp9' does not name an existing port: device 'leaf1' has no port 'swp9'"
    line, field, reason = one_error(edit("    b: leaf1:swp1\n", "    b: leaf7:swp1\n"))
    assert (line, field) == (30, "links[0].b") and "no device named 'leaf7'" in reason


def test_port_in_two_links_and_self_link() -> None:
    two = BASE + "  - a: leaf1:swp2\n    b: host1:eth0\n"
    line, field, reason = one_error(two)
    assert (line, field) == (32, "links[1].b")
    assert reason == "port 'host1:eth0' is already used by links[0].a"
    self_link = BASE + "  - a: leaf1:swp2\n    b: leaf1:swp2\n"
    line, field, reason = one_error(self_link)
    assert (line, field) == (32, "links[1].b") and "must not join a port to itself" in reason


def test_duplicate_device_name() -> None:
    text = BASE.replace("  - name: host1\n", "  - name: leaf1\n").replace("host1:eth0", "leaf1:swp2")
    errs = errors_of(text)
    assert (errs[0].line, errs[0].field) == (16, "devices[1].name")
    assert "device 'leaf1' already declared (devices[0], line 5)" in errs[0].reason


def test_undeclared_pod() -> None:
    line, field, reason = one_error(edit("    pod: pod1\n    gpus: 8\n", "    pod: pod2\n    gpus: 8\n"))
    assert (line, field) == (19, "devices[1].pod")
    assert reason == "pod 'pod2' is not declared in 'pods' (declared: pod1)"


def test_gpu_and_rail_sanity() -> None:
    line, field, reason = one_error(edit("        gpu: 0\n", "        gpu: 8\n"))
    assert (line, field) == (24, "devices[1].ports[0].gpu") and "gpus: 8" in reason
    line, field, reason = one_error(edit("        rail: 0\n      - name: swp2", "        rail: 1\n      - name: swp2"))
    assert (line, field) == (29, "links[0]")
    assert reason == "rail mismatch: 'host1:eth0' is on rail 0, 'leaf1:swp1' on rail 1"
    line, field, _ = one_error(edit("        rail: 0\n      - name: swp2", "        gpu: 0\n      - name: swp2"))
    assert (line, field) == (11, "devices[0].ports[0].gpu")


def test_endpoint_per_protocol() -> None:
    text = edit("        community: {env: SNMP_COMMUNITY}\n",
                "        community: {env: SNMP_COMMUNITY}\n      - protocol: snmp\n        community: {env: B}\n")
    line, field, reason = one_error(text)
    assert (line, field) == (16, "devices[0].endpoints[1].protocol") and "one endpoint per protocol" in reason


def test_secret_refs_and_inline_secret_never_echoed() -> None:
    line, field, reason = one_error(edit("{env: SNMP_COMMUNITY}", "s3cr3t-community"))
    assert (line, field) == (15, "devices[0].endpoints[0].community")
    assert "secret reference" in reason and "s3cr3t" not in reason
    line, field, reason = one_error(edit("{env: SNMP_COMMUNITY}", "{env: A, file: /x}"))
    assert (line, field) == (15, "devices[0].endpoints[0].community") and "exactly one" in reason
    line, field, reason = one_error(edit("{env: SNMP_COMMUNITY}", "{file: secrets/community}"))
    assert (line, field) == (15, "devices[0].endpoints[0].community.file") and "absolute" in reason
    line, field, reason = one_error(edit("{env: SNMP_COMMUNITY}", "{env: 'SNMP COMMUNITY'}"))
    assert field == "devices[0].endpoints[0].community.env" and "environment variable name" in reason


def test_quoted_version_hint() -> None:
    line, field, reason = one_error(edit("      - protocol: snmp\n", "      - protocol: snmp\n        version: 3\n"))
    assert (line, field) == (15, "devices[0].endpoints[0].version")
    assert "quote the value" in reason


def test_several_errors_reported_together_in_line_order(tmp_path: Path) -> None:
    path = tmp_path / "bad.yaml"
    text = edit("    b: leaf1:swp1\n", "    b: leaf1:swp9\n")
    path.write_text(text.replace("pod: pod1\n    gpus", "pod: p2\n    gpus"))
    with pytest.raises(InventoryError) as info:
        load_inventory_file(path)
    lines = str(info.value).splitlines()
    assert lines == [
        f"{path}:19: devices[1].pod: pod 'p2' is not declared in 'pods' (declared: pod1)",
        f"{path}:30: links[0].b: 'leaf1:swp9' does not name an existing port: device 'leaf1' has no port 'swp9'",
    ]


def test_missing_file_and_long_string(tmp_path: Path) -> None:
    with pytest.raises(InventoryError, match="nope.yaml: file not found"):
        load_inventory_file(tmp_path / "nope.yaml")
    line, field, reason = one_error(edit("    role: leaf\n", f"    role: leaf\n    vendor: {'x' * 200}\n"))
    assert (line, field, reason) == (8, "devices[0].vendor", "is 200 characters long; the limit is 128")


def test_port_names_with_colons_link() -> None:
    text = textwrap.dedent("""\
        devices:
          - {name: a, kind: switch, role: leaf, ports: [{name: "1:1"}]}
          - {name: b, kind: switch, role: spine, ports: [{name: "x:y:z"}]}
        links:
          - {a: "a:1:1", b: "b:x:y:z"}
        """)
    assert len(load_inventory_text(text).links) == 1


def test_docs_example_is_valid() -> None:
    doc = (REPO / "docs" / "inventory.md").read_text()
    example = doc.split("## Example\n\n```yaml\n", 1)[1].split("```", 1)[0]
    inv = load_inventory_text(example, "docs/inventory.md")
    assert [d.name for d in inv.devices] == ["leaf1", "gpu-a01"] and len(inv.links) == 1
