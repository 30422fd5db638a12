"""The nccl-tests parser on every real output in tests/data/real/nccl, and on damaged copies."""

from __future__ import annotations

import pytest

from service.nccl.parser import NcclParseError, parse_nccl_tests
from tests.paths import FIXTURES as REAL

FIXTURES = REAL / "nccl"

# file -> ("ok", checks) or ("rejected", line, words in the reason); SOURCES.md says why each is what it is.
EXPECTED: dict[str, tuple] = {
    "gb10-training_all_gather_2node_2xGB10_dgx_spark.txt": ("ok", {
        "test": "all_gather_perf", "tests_version": "2.18.5", "nccl_version": "2.28.9", "nranks": 2,
        "hosts": ["promaxgb10-4c75", "promaxgb10-4c99"], "avg_busbw": 22.9611, "rows": 1,
        "row": (17179869184, 374425.0, 22.94, 0, 22.98)}),
    "issue_nccl-tests_294_all_reduce_16proc_nonMPI_build_busbw0_headerless.txt": ("rejected", 1, "headerless"),
    "issue_nccl-tests_294_all_reduce_2node_16xH100_NCCL_INFO_WARN_bootstrap_failure.txt":
        ("rejected", 103, "Test NCCL failure common.cu:1057"),
    "issue_nccl-tests_309_all_reduce_2node_16xH100_HGX_mpi_xpmem_warning_interleaved.txt": ("ok", {
        "test": "all_reduce_perf", "nccl_version": "2.26.2+cuda12.8", "nranks": 16,
        "hosts": ["bm-h100-01", "bm-h100-02"], "avg_busbw": 139.56, "rows": 32,
        "row": (17179869184, 68652.0, 469.21, 0, 469.10), "env": ("NCCL_IB_GID_INDEX", "0")}),
    "issue_nccl-tests_322_all_reduce_128node_1024xH100_ranklist_cut_maxBytes_reduced_unhandled_cuda_error.txt":
        ("rejected", 116, "unhandled cuda error"),
    "issue_nccl-tests_355_alltoall_2node_16xH800_illegal_memory_access_midrow.txt":
        ("rejected", 27, "illegal memory access"),
    "issue_nccl-tests_369_all_reduce_2node_2xGH200_wrong96_FAILED.txt": ("ok", {
        "test": "all_reduce_perf", "nccl_version": "2.29.2", "nranks": 2, "hosts": ["gpu-1-1", "gpu-1-7"],
        "avg_busbw": 4.79995, "rows": 25, "wrong_total": 128, "oob_status": "FAILED",
        "row": (1048576, 477.32, 2.20, 96, 2.13)}),
    "li-plus_playground_sendrecv_1node_8xA100_g8_headerless.txt": ("rejected", 9, "no '# Avg bus bandwidth'"),
    "nccl-eBPF_all_gather_mpirun_tag-output_2rank_1xRTX5090_socket.txt": ("ok", {
        "test": "all_gather_perf", "tests_version": "2.18.0", "nranks": 2, "hosts": ["lab"],
        "avg_busbw": 1.54321, "rows": 8, "row": (134217728, 29185.2, 2.30, 0, 2.29)}),
    "unidentified_h800_broadcast_1node_8xH800_g8_NCCL_INFO_validation0.txt": ("ok", {
        "test": "broadcast_perf", "nccl_version": "2.18.3+cuda12.2", "nranks": 8, "hosts": ["nf5688m7-1"],
        "avg_busbw": 52.4049, "rows": 30, "row": (2147483648, 13018.0, 164.97, None, 165.02)}),
    "unidentified_inc_all_reduce_2node_2xRTX3090_wrong_sci_notation_FAILED.txt": ("ok", {
        "test": "all_reduce_perf", "nranks": 2, "hosts": ["worker1", "worker2"], "avg_busbw": 3.02663,
        "rows": 27, "oob_status": "FAILED", "row": (2097152, 311.5, 6.73, 1048580, 6.74)}),
    "unidentified_oci_gb300_doc_alltoall_16node_64xGB300_TRUNCATED_ranks_and_sizes.txt":
        ("rejected", 7, "rank list is elided"),
}


def test_every_fixture_is_covered() -> None:
    assert {p.name for p in FIXTURES.glob("*.txt")} == set(EXPECTED)


@pytest.mark.parametrize("name", sorted(EXPECTED))
def test_real_output(name: str) -> None:
    text = (FIXTURES / name).read_text()
    want = EXPECTED[name]
    if want[0] == "rejected":
        with pytest.raises(NcclParseError) as exc:
            parse_nccl_tests(text, name)
        assert exc.value.source == name and exc.value.line == want[1], str(exc.value)
        assert want[2] in exc.value.reason
        assert str(exc.value).startswith(f"{name}:{want[1]}: ")
        return
    checks = want[1]
    run = parse_nccl_tests(text, name)
    for key in ("test", "tests_version", "nccl_version", "nranks", "hosts", "avg_busbw", "wrong_total",
                "oob_status"):
        if key in checks:
            assert getattr(run, key) == checks[key], key
    assert len(run.rows) == checks["rows"]
    size, time_us, busbw, wrong, ip_busbw = checks["row"]
    row = next(r for r in run.rows if r.size_bytes == size)
    assert (row.oop_time_us, row.oop_busbw, row.oop_wrong, row.ip_busbw) == (time_us, busbw, wrong, ip_busbw)
    if "env" in checks:
        assert run.env[checks["env"][0]] == checks["env"][1]
    assert len(run.digest) == 64


def _gb10() -> str:
    return (FIXTURES / "gb10-training_all_gather_2node_2xGB10_dgx_spark.txt").read_text()


def test_truncated_and_garbled_copies() -> None:
    good = (FIXTURES / "issue_nccl-tests_369_all_reduce_2node_2xGH200_wrong96_FAILED.txt").read_text()
    lines = good.splitlines()
    cut = "\n".join(lines[:20])                      # cut after a few rows, before the footer
    with pytest.raises(NcclParseError, match=r"x:20: truncated"):
        parse_nccl_tests(cut, "x")
    midrow = "\n".join(lines[:19] + [lines[19][:40]])  # the last row cut in the middle
    with pytest.raises(NcclParseError, match=r"x:20: malformed result row: \d+ fields"):
        parse_nccl_tests(midrow, "x")
    garbled = good.replace("   477.32    2.20", "   477.32    2.2O")
    with pytest.raises(NcclParseError, match=r"x:29: malformed result row: out-of-place algbw '2.2O'"):
        parse_nccl_tests(garbled, "x")
    dup = good.replace("# Out of bounds", lines[11] + "\n# Out of bounds")
    with pytest.raises(NcclParseError, match="repeats line 12"):
        parse_nccl_tests(dup, "x")
    with pytest.raises(NcclParseError, match="no results table"):
        parse_nccl_tests("just some text\n", "x")
    with pytest.raises(NcclParseError, match="second run"):
        parse_nccl_tests(_gb10() + _gb10(), "x")


def test_same_run_same_digest_through_noise() -> None:
    noisy = "\n".join("[1,0]<stdout>:" + ln for ln in _gb10().splitlines()) + "\nrandom noise\n"
    assert parse_nccl_tests(noisy, "a").digest == parse_nccl_tests(_gb10(), "b").digest
