"""Runs, baselines and the one regression alert, on real PostgreSQL, through the service, CLI and API."""

from __future__ import annotations

from datetime import UTC, datetime

import pytest
from sqlalchemy import Engine, text

from service.nccl.parser import parse_nccl_tests
from service.nccl.service import NcclImportError, compare, import_run, list_baselines, set_baseline
from tests.paths import FIXTURES as REAL

FIXTURES = REAL / "nccl"
H100 = "issue_nccl-tests_309_all_reduce_2node_16xH100_HGX_mpi_xpmem_warning_interleaved.txt"
AT = datetime(2026, 1, 2, 12, tzinfo=UTC)


def _degraded(text_: str, factor: float = 0.8, min_size: int = 1 << 30) -> str:
    """The same run with busbw (and algbw) scaled down for sizes >= min_size: a fabric regression."""
    out = []
    for line in text_.splitlines():
        toks = line.split()
        if toks and toks[0].isdigit() and int(toks[0]) >= min_size:
            for i in (6, 7, 10, 11):
                toks[i] = f"{float(toks[i]) * factor:.2f}"
            line = "  ".join(toks)
        out.append(line)
    return "\n".join(out)


def _alerts(conn) -> list:  # type: ignore[no-untyped-def]
    return conn.execute(text("SELECT id, kind, device, state, severity, cause, evidence FROM alerts "
                             "WHERE kind = 'nccl_regression'")).all()


def test_regression_raises_exactly_one_alert_linked_to_fabric_alerts(db: Engine) -> None:
    base_text = (FIXTURES / H100).read_text()
    with db.begin() as conn:
        first = import_run(conn=conn, run=parse_nccl_tests(base_text, "base"), actor="t", run_at=AT)
        assert first.created and first.baseline_set and first.alert_id is None
        # a fabric alert open on one of the hosts at the run's time
        ms = int(AT.timestamp() * 1000) - 60_000
        conn.execute(text(
            "INSERT INTO alerts (fingerprint, kind, scope, device, port, state, severity, cause, action, "
            "first_opened_at_ms, opened_at_ms, last_seen_ms) VALUES ('pause_storm/bm-h100-02:eth3', 'pause_storm', "
            "'port', 'bm-h100-02', 'eth3', 'firing', 'page', 'nic_pause_storm', 'drain_host', :ms, :ms, :ms)"),
            {"ms": ms})
    bad = parse_nccl_tests(_degraded(base_text), "bad")
    with db.begin() as conn:
        res = import_run(conn=conn, run=bad, actor="t", run_at=AT, job="slurm-42")
        again = import_run(conn=conn, run=parse_nccl_tests(_degraded(base_text), "bad-again"), actor="t", run_at=AT)
        alerts = _alerts(conn)
    assert res.created and not again.created and again.run_id == res.run_id
    assert res.comparison["regressed"] and "busbw below baseline" in res.comparison["reasons"][0]
    assert {s["size_bytes"] for s in res.comparison["sizes"] if s["regressed"]} == {1 << k for k in range(30, 35)}
    assert len(alerts) == 1 and alerts[0].id == res.alert_id
    assert alerts[0].device == "bm-h100-01" and alerts[0].state == "firing" and alerts[0].severity == "ticket"
    assert alerts[0].cause == "nic_pause_storm"            # inherited from the linked fabric alert
    assert len(res.linked_alert_ids) == 1
    assert any(e["feature"] == "linked_alert" for e in alerts[0].evidence)
    # a run within tolerance on the same hosts clears it
    fine = parse_nccl_tests(_degraded(base_text, factor=0.95), "fine")
    with db.begin() as conn:
        ok = import_run(conn=conn, run=fine, actor="t", run_at=AT)
        assert not ok.comparison["regressed"]
        assert [a.state for a in _alerts(conn)] == ["resolved"]


def test_wrong_values_alert_and_cannot_be_baseline(db: Engine) -> None:
    run = parse_nccl_tests((FIXTURES / "issue_nccl-tests_369_all_reduce_2node_2xGH200_wrong96_FAILED.txt")
                           .read_text(), "gh200")
    with db.begin() as conn:
        res = import_run(conn=conn, run=run, actor="t", run_at=AT)
        assert not res.baseline_set and res.alert_id is not None
        row = _alerts(conn)[0]
        assert row.severity == "page" and row.cause == "host_side"
        assert "128 wrong values" in res.comparison["reasons"][0]
        with pytest.raises(NcclImportError, match="cannot be a baseline"):
            set_baseline(conn=conn, run_id=res.run_id, actor="t")
        assert list_baselines(conn=conn) == []


def test_pinned_baseline_and_compare(db: Engine) -> None:
    base_text = (FIXTURES / H100).read_text()
    with db.begin() as conn:
        a = import_run(conn=conn, run=parse_nccl_tests(base_text, "a"), actor="t", run_at=AT)
        b = import_run(conn=conn, run=parse_nccl_tests(_degraded(base_text, 1.3), "b"), actor="t", run_at=AT)
        assert not b.comparison["regressed"]
        set_baseline(conn=conn, run_id=b.run_id, actor="t", reason="new firmware")
        cmp = compare(conn=conn, run_id=a.run_id)
        assert cmp.baseline_run_id == b.run_id and cmp.regressed
        assert [x["scope"] for x in list_baselines(conn=conn)] == ["2n16g"]
        with pytest.raises(NcclImportError, match="hosts are unknown"):
            headerless = "\n".join(ln for ln in base_text.splitlines() if "Rank" not in ln)
            import_run(conn=conn, run=parse_nccl_tests(headerless, "h"), actor="t")


def test_api_and_cli(db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    from fastapi.testclient import TestClient
    from typer.testing import CliRunner

    from service.api.app import create_app
    from service.config import Settings
    from service.nccl.cli import app as nccl_cli

    monkeypatch.setenv("FABRICWATCH_DATABASE_URL", db_url)
    r = CliRunner().invoke(nccl_cli, ["import", str(FIXTURES / H100), "--job", "j1", "--at", AT.isoformat()])
    assert r.exit_code == 0, r.output
    bad = CliRunner().invoke(nccl_cli, ["import", str(FIXTURES / "li-plus_playground_sendrecv_1node_8xA100_g8_"
                                                               "headerless.txt")])
    assert bad.exit_code == 1 and "truncated" in bad.output
    client = TestClient(create_app(Settings(database_url=db_url, auth_required=False)))
    runs = client.get("/api/v1/nccl/runs").json()["items"]
    assert len(runs) == 1 and runs[0]["job"] == "j1" and runs[0]["scope"] == "2n16g"
    post = client.post("/api/v1/nccl", params={"source": "x", "run_at": AT.isoformat()},
                       content=_degraded((FIXTURES / H100).read_text()))
    assert post.status_code == 200 and post.json()["comparison"]["regressed"] and post.json()["alert_id"]
    cmp = client.get(f"/api/v1/nccl/runs/{post.json()['run_id']}/compare").json()
    assert cmp["baseline_run_id"] == runs[0]["id"]
    assert client.get("/api/v1/nccl/baselines").json()["items"][0]["run_id"] == runs[0]["id"]
    rej = client.post("/api/v1/nccl", content="garbage\n")
    assert rej.status_code == 422 and rej.json()["line"] == 1
    assert client.get("/api/v1/nccl/runs/999/compare").status_code == 404


def test_detection_cycles_do_not_age_out_a_regression_alert(db: Engine) -> None:
    """An NCCL regression is cleared by a clean run, not by detection cycles that never raise that kind."""
    from service.pipeline import apply_cycle

    base_text = (FIXTURES / H100).read_text()
    with db.begin() as conn:
        import_run(conn=conn, run=parse_nccl_tests(base_text, "base"), actor="t", run_at=AT)
        res = import_run(conn=conn, run=parse_nccl_tests(_degraded(base_text), "bad"), actor="t", run_at=AT)
    at = int(AT.timestamp() * 1000)
    for i in range(1, 13):  # an hour of 5-minute cycles, well past any clear_cycles and hold-down
        with db.begin() as conn:
            apply_cycle(conn, [], at + i * 300_000, drains=False)
    with db.connect() as conn:
        assert [(a.id, a.state) for a in _alerts(conn)] == [(res.alert_id, "firing")]
