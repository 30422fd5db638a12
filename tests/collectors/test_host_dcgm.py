"""dcgm-exporter text, the scraper, and `dcgmi dmon` text."""

from __future__ import annotations

import csv
from pathlib import Path

import httpx
import pytest

from collectors.base import CollectError, ParseError
from collectors.host.dcgm import field_names, parse_dcgm_exporter, parse_dcgmi_dmon, scrape_dcgm
from service.telemetry import catalogue
from tests.paths import FIXTURES

DIR = FIXTURES / "dcgm"
DERIVED = Path(__file__).resolve().parents[1] / "data" / "host" / "dcgm_exporter_h100_nvlink_DERIVED.prom"

# Reference tables, not telemetry: they list DCGM field names/ids and the exporter's default
# field set. The field-id table is used below to check that every name we map is a real field.
REFERENCE_ONLY = {
    "dcgm_field_ids_from_go-dcgm_dcgm_fields_h.csv": "field name/id table from go-dcgm's header",
    "dcgm-exporter_etc_default-counters.csv": "dcgm-exporter's default field list (configuration)",
}
PARSED = {
    "vks_grid_a100-8c_vgpu_driver580.65.06_dcgm_exporter_metrics.prom",
    "cn_notes_a800-sxm4-80gb_x8_mig_driver535.129.03_dcgm_exporter_metrics_EXCERPT.prom",
    "cn_notes_dcgmi_dmon_nvlink_tx_rx_1011_1012_4gpu_8gpu.txt",  # structure only: rates, no samples
    "tmax_hypercloud_dcgm-exporter1.4.6_pod_gpu_metrics_2gpu_blank_nvlink.prom",  # NVLink fields read blank
}
REJECTED = {"cn_notes_dcgmi_dmon_nvlink_pcie_1011_1012_1009_1010_8gpu_ANNOTATED.txt"}


def vals(samples: list) -> dict[tuple[str, int], float]:
    assert all(catalogue.get(s.metric) is not None for s in samples)
    return {(s.metric, s.gpu): s.value for s in samples}


def test_every_file_is_classified() -> None:
    assert sorted(p.name for p in DIR.iterdir()) == sorted(set(REFERENCE_ONLY) | PARSED | REJECTED)


def test_dcgm_blank_is_no_reading_not_a_huge_counter() -> None:
    # dcgm-exporter 1.4.6 on 2 GPUs without NVLink: every NVLink field reads 9223372036854775794
    # (DCGM_INT64_BLANK + 2, "not supported"); the flit and data CRC fields were once summed to 1.8e19
    path = DIR / "tmax_hypercloud_dcgm-exporter1.4.6_pod_gpu_metrics_2gpu_blank_nvlink.prom"
    warnings: list[str] = []
    got = vals(parse_dcgm_exporter(path.read_text(), device="h", ts_ms=9, source=path.name, warnings=warnings))
    assert got == {("gpu_temperature_celsius", 0): 36.0, ("gpu_temperature_celsius", 1): 31.0,
                   ("gpu_last_xid", 0): 0.0, ("gpu_last_xid", 1): 0.0}
    assert len(warnings) == 1 and "no reading, DCGM reports blank" in warnings[0]
    for field in ("DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL (GPU 0, 1)",
                  "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL (GPU 0, 1)"):
        assert field in warnings[0]
    # BANDWIDTH_TOTAL is not mapped at all, so its blank is not ours to report
    assert "BANDWIDTH" not in warnings[0]


def test_vgpu_exporter_output() -> None:
    path = DIR / "vks_grid_a100-8c_vgpu_driver580.65.06_dcgm_exporter_metrics.prom"
    got = vals(parse_dcgm_exporter(path.read_text(), device="h", ts_ms=9, source=path.name))
    # XID_ERRORS{err_code="0",err_msg="No Error"} 0 is the last XID code; BANDWIDTH_TOTAL has no
    # canonical metric (both directions summed), clocks/utilisation/FB are not fabric metrics.
    assert got == {("gpu_last_xid", 0): 0.0}


def test_mig_excerpt_collapses_instances() -> None:
    path = DIR / "cn_notes_a800-sxm4-80gb_x8_mig_driver535.129.03_dcgm_exporter_metrics_EXCERPT.prom"
    samples = parse_dcgm_exporter(path.read_text(), device="h", ts_ms=9, source=path.name)
    assert sorted(s.gpu for s in samples if s.metric == "gpu_last_xid") == list(range(8))  # gpu 0 once


def test_derived_nvlink_families() -> None:
    got = vals(parse_dcgm_exporter(DERIVED.read_text(), device="h", ts_ms=9, source="d"))
    assert got[("gpu_nvlink_crc_errors_total", 0)] == 12 + 3  # flit + data
    assert got[("gpu_nvlink_replay_errors_total", 0)] == 7
    assert got[("gpu_nvlink_recovery_errors_total", 1)] == 2
    assert got[("gpu_last_xid", 1)] == 79
    assert got[("gpu_pcie_link_generation", 1)] == 4 and got[("gpu_pcie_link_width", 1)] == 8
    assert got[("gpu_temperature_celsius", 0)] == 41


def test_per_link_fields_summed_only_without_total() -> None:
    text = ('DCGM_FI_DEV_NVLINK_REPLAY_ERROR_L0_TOTAL{gpu="0"} 2\n'
            'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_L1_TOTAL{gpu="0"} 3\n'
            'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_L0_TOTAL{gpu="1"} 2\n'
            'DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL{gpu="1"} 9\n')
    got = vals(parse_dcgm_exporter(text, device="h", ts_ms=1, source="s"))
    assert got[("gpu_nvlink_replay_errors_total", 0)] == 5
    assert got[("gpu_nvlink_replay_errors_total", 1)] == 9


def test_mapped_names_are_real_dcgm_fields() -> None:
    with (DIR / "dcgm_field_ids_from_go-dcgm_dcgm_fields_h.csv").open() as f:
        known = {row["field_name"] for row in csv.DictReader(f)}
    assert field_names() <= known


@pytest.mark.parametrize(("text", "reason", "line"), [
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"} hot\n', "not a number", 1),
    ('DCGM_FI_DEV_GPU_TEMP{gpu="0"\n', "not closed", 1),
    ('# ok\nDCGM_FI_DEV_GPU_TEMP{UUID="x"} 40\n', "no numeric 'gpu' label", 2),
])
def test_garbage(text: str, reason: str, line: int) -> None:
    with pytest.raises(ParseError) as exc:
        parse_dcgm_exporter(text, device="h", ts_ms=1, source="http://x/metrics")
    assert reason in exc.value.reason and exc.value.line == line and exc.value.source == "http://x/metrics"


def test_scrape_with_mock_transport_and_timeout() -> None:
    body = DERIVED.read_text()

    def handler(request: httpx.Request) -> httpx.Response:
        assert request.url.path == "/metrics"
        return httpx.Response(200, text=body)

    with httpx.Client(transport=httpx.MockTransport(handler)) as client:
        got = scrape_dcgm("http://gpu1:9400", device="gpu1", ts_ms=3, client=client)
    assert vals(got)[("gpu_nvlink_replay_errors_total", 0)] == 7

    def slow(request: httpx.Request) -> httpx.Response:
        raise httpx.ReadTimeout("timed out", request=request)

    with httpx.Client(transport=httpx.MockTransport(slow)) as client, \
            pytest.raises(CollectError, match="no answer within 0.5 s"):
        scrape_dcgm("http://gpu1:9400/metrics", device="gpu1", ts_ms=3, timeout_s=0.5, client=client)


def test_dmon_with_header_parses_as_rates() -> None:
    path = DIR / "cn_notes_dcgmi_dmon_nvlink_tx_rx_1011_1012_4gpu_8gpu.txt"
    rows = parse_dcgmi_dmon(path.read_text(), source=path.name)
    assert (rows[0].gpu, rows[0].values) == (3, {"NVLTX": 19694075554.0, "NVLRX": 19687914629.0})
    assert len(rows) == 24 + 16 and {r.gpu for r in rows} == set(range(8))


def test_annotated_dmon_is_rejected() -> None:
    path = DIR / "cn_notes_dcgmi_dmon_nvlink_pcie_1011_1012_1009_1010_8gpu_ANNOTATED.txt"
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_dmon(path.read_text(), source=path.name)
    assert exc.value.line == 2 and "header missing" in exc.value.reason
    lines = path.read_text().splitlines()
    with_header = "\n".join([lines[0], "#Entity NVLTX NVLRX PCITX PCIRX", "ID", *lines[1:]])
    with pytest.raises(ParseError) as exc:
        parse_dcgmi_dmon(with_header, source=path.name)
    assert "(36.07GB/s)" in exc.value.reason and exc.value.line == 5
