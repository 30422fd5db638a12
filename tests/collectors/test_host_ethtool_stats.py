"""ethtool -S text parser: every real capture parsed with spot-checked values; garbage -> ParseError."""

from __future__ import annotations

import contextlib
from pathlib import Path

import pytest
from hypothesis import given, settings
from hypothesis import strategies as st

from collectors.base import ParseError
from collectors.host.ethtool_stats import parse_ethtool_stats
from service.telemetry import catalogue
from tests.paths import FIXTURES

DIR = FIXTURES / "ethtool_stats"
DATA = Path(__file__).resolve().parents[1] / "data" / "host"


def parse(path: Path) -> dict[tuple[str, int | None, int | None], float]:
    samples = parse_ethtool_stats(path.read_text(), device="h1", port="p1", ts_ms=1000, source=path.name)
    assert all(catalogue.get(s.metric) is not None for s in samples)
    assert all((s.device, s.port, s.ts_ms) == ("h1", "p1", 1000) for s in samples)
    out = {(s.metric, s.priority, s.lane): s.value for s in samples}
    assert len(out) == len(samples), "one sample per series"
    return out


# Every real capture's values are checked in test_host_conformance; these are parser behaviours.


def test_mlx5_per_priority_pause_and_durations_in_seconds() -> None:
    got = parse(DATA / "mlx5_100G_with_prio3_pause_ethtool_S.txt")
    assert got[("port_pfc_rx_pause_frames_total", 3, None)] == 123456
    assert got[("port_pfc_rx_pause_seconds_total", 3, None)] == pytest.approx(2.5)  # 2500000 us
    assert got[("port_pfc_tx_pause_frames_total", 3, None)] == 4321
    assert got[("port_pfc_tx_pause_seconds_total", 3, None)] == pytest.approx(0.015)
    assert got[("port_pfc_rx_pause_frames_total", 0, None)] == 0
    assert got[("port_tx_pause_frames_total", None, None)] == 0  # tx_global_pause beats tx_pause_ctrl_phy=2


def test_mlx5_global_pause_duration_and_out_of_buffer() -> None:
    text = ("NIC statistics:\n     rx_global_pause: 10\n     rx_global_pause_duration: 2500000\n"
            "     tx_global_pause_duration: 15000\n     rx_out_of_buffer: 7\n")
    got = {(s.metric, s.value) for s in parse_ethtool_stats(text, device="h", port="p", ts_ms=1, source="s")}
    assert got == {("port_rx_pause_frames_total", 10), ("port_rx_pause_seconds_total", 2.5),
                   ("port_tx_pause_seconds_total", 0.015), ("port_out_of_buffer_total", 7)}


def test_bnxt_fec_blocks() -> None:
    text = "NIC statistics:\n     rx_fec_corrected_blocks: 99\n     rx_fec_uncorrectable_blocks: 1\n"
    got = parse_ethtool_stats(text, device="h", port="p", ts_ms=1, source="s")
    assert {(s.metric, s.value) for s in got} == {
        ("port_fec_corrected_codewords_total", 99), ("port_fec_uncorrectable_codewords_total", 1)}


def test_unknown_counters_are_ignored() -> None:
    text = "NIC statistics:\n     some_vendor_thing: 5\n     rx_bytes_phy: 10\n"
    got = parse_ethtool_stats(text, device="h", port="p", ts_ms=1, source="s")
    assert [(s.metric, s.value) for s in got] == [("port_rx_bytes_total", 10)]


@pytest.mark.parametrize(
    ("text", "line", "reason"),
    [
        ("     rx_bytes: 1\n", 1, "header"),
        ("", None, "no 'NIC statistics:' header"),
        ("NIC statistics:\n     rx_bytes: 1\n     tx_bytes: lots\n", 3, "non-integer"),
        ("NIC statistics:\n     rx_bytes: 1\n     tx_byt", 3, "not a 'name: value'"),
        ("NIC statistics:\n     rx_bytes: -1\n", 2, "non-integer"),
    ],
)
def test_garbled_output_names_source_and_line(text: str, line: int | None, reason: str) -> None:
    with pytest.raises(ParseError) as exc:
        parse_ethtool_stats(text, device="h", port="p", ts_ms=1, source="ethtool -S eth9")
    assert exc.value.source == "ethtool -S eth9"
    assert exc.value.line == line
    assert reason in exc.value.reason


def test_truncated_real_capture() -> None:
    text = (DIR / "showmax_i40e_fw8.60_rhel8_sfp10gsr_ethtool_S.txt").read_text()
    cut = text[: text.index("port.rx_crc_errors") + len("port.rx_crc")]
    with pytest.raises(ParseError) as exc:
        parse_ethtool_stats(cut, device="h", port="p", ts_ms=1, source="cut")
    assert exc.value.line == cut.count("\n") + 1


@settings(max_examples=300, deadline=None)
@given(st.text(max_size=400))
def test_arbitrary_text_only_raises_parse_error(text: str) -> None:
    for candidate in (text, "NIC statistics:\n" + text):
        with contextlib.suppress(ParseError):
            parse_ethtool_stats(candidate, device="h", port="p", ts_ms=1, source="fuzz")


@settings(max_examples=200, deadline=None)
@given(st.lists(st.tuples(st.from_regex(r"[a-z_]{1,20}", fullmatch=True),
                          st.integers(min_value=0, max_value=2**64 - 1)), max_size=30))
def test_well_formed_lines_never_fail(pairs: list[tuple[str, int]]) -> None:
    text = "NIC statistics:\n" + "".join(f"     {n}: {v}\n" for n, v in pairs)
    for s in parse_ethtool_stats(text, device="h", port="p", ts_ms=1, source="fuzz"):
        assert catalogue.get(s.metric) is not None
