"""NCCL baselines: store a parsed run, compare it per message size with the (test, scope) baseline, and
raise one `nccl_regression` alert through the alerts domain when busbw drops or #wrong > 0.

Plain keyword-only functions on a Connection inside the caller's transaction.
"""

from __future__ import annotations

from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, insert, select, text, update

from service.detection.findings import Action, Cause, Evidence, Finding, Severity
from service.nccl.models import NcclBaseline, NcclResultRow, NcclRunRow
from service.nccl.parser import NcclRun

RUNS = NcclRunRow.__table__
RESULTS = NcclResultRow.__table__
BASELINES = NcclBaseline.__table__

KIND = "nccl_regression"
DEFAULT_TOLERANCE = 0.10
# busbw is printed with 2 decimals: below ~1 GB/s the rounding alone moves it by >1 %, and these
# latency-bound sizes say little about the fabric. Compare only sizes whose baseline busbw reaches this.
DEFAULT_MIN_BUSBW = 1.0
_RESULT_COLS = ("size_bytes", "count", "dtype", "redop", "root", "oop_time_us", "oop_algbw", "oop_busbw",
                "oop_wrong", "ip_time_us", "ip_algbw", "ip_busbw", "ip_wrong")


class NcclImportError(ValueError):
    """A parsed run that cannot be stored (e.g. its hosts or test are unknown)."""


@dataclass
class SizeDelta:
    size_bytes: int
    baseline_busbw: float
    busbw: float
    change: float           # busbw / baseline - 1 (negative is a drop)
    regressed: bool


@dataclass
class Comparison:
    run_id: int
    baseline_run_id: int | None
    tolerance: float
    sizes: list[SizeDelta] = field(default_factory=list)
    wrong_total: int = 0
    regressed: bool = False
    reasons: list[str] = field(default_factory=list)
    notes: list[str] = field(default_factory=list)

    def to_dict(self) -> dict[str, Any]:
        return {"run_id": self.run_id, "baseline_run_id": self.baseline_run_id, "tolerance": self.tolerance,
                "regressed": self.regressed, "wrong_total": self.wrong_total, "reasons": self.reasons,
                "notes": self.notes, "sizes": [vars(s) for s in self.sizes]}


@dataclass
class ImportResult:
    run_id: int
    created: bool           # False: the same run was imported before (nothing else happened)
    comparison: dict[str, Any]
    baseline_set: bool
    alert_id: int | None
    linked_alert_ids: list[int]


def scope_key(nodes: int, gpus: int) -> str:
    return f"{nodes}n{gpus}g"


def _ms(t: datetime) -> int:
    return int(t.timestamp() * 1000)


def _alerts_exist(conn: Connection) -> bool:
    return conn.execute(text("SELECT to_regclass('alerts') IS NOT NULL")).scalar_one()


def import_run(*, conn: Connection, run: NcclRun, actor: str, run_at: datetime | None = None,
               job: str | None = None, hosts: list[str] | None = None, tolerance: float = DEFAULT_TOLERANCE,
               min_busbw: float = DEFAULT_MIN_BUSBW) -> ImportResult:
    """Store a run (idempotent on its digest), compare it with its baseline, and alert on a regression."""
    existing = conn.execute(select(RUNS).where(RUNS.c.digest == run.digest)).mappings().first()
    if existing is not None:
        return ImportResult(existing["id"], False, existing["verdict"], False, existing["alert_id"],
                            list(existing["linked_alert_ids"]))
    if not run.test:
        raise NcclImportError(f"{run.source}: the test is unknown (no 'Collective test starting' line, command "
                              "or file name names it); give it explicitly")
    host_list = list(hosts) if hosts else run.hosts
    if not host_list:
        raise NcclImportError(f"{run.source}: the hosts are unknown (no '# Using devices' list); give --hosts")
    gpus = run.nranks or int(run.header.get("nGpus", "0") or 0) * len(host_list)
    if gpus <= 0:
        raise NcclImportError(f"{run.source}: the GPU count is unknown")
    when = run_at or datetime.now(UTC)
    scope = scope_key(len(host_list), gpus)
    run_id = conn.execute(insert(RUNS).values(
        digest=run.digest, test=run.test, scope=scope, nodes=len(host_list), gpus=gpus, hosts=host_list,
        gpu_model=run.gpu_model, job=job, nccl_version=run.nccl_version, tests_version=run.tests_version,
        env=run.env, header=run.header, warnings=run.warnings + run.nccl_warnings[:20], avg_busbw=run.avg_busbw,
        wrong_total=run.wrong_total, oob_status=run.oob_status, source=run.source[:512], run_at=when,
        imported_by=actor).returning(RUNS.c.id)).scalar_one()
    conn.execute(insert(RESULTS), [{"run_id": run_id, **{c: getattr(r, c) for c in _RESULT_COLS}}
                                   for r in run.rows])
    baseline_set = False
    base = get_baseline(conn=conn, test=run.test, scope=scope)
    if base is None and not run.failed:
        # The first clean run of a (test, scope) becomes its baseline; later ones move only when pinned.
        set_baseline(conn=conn, run_id=run_id, actor=actor, reason="first clean run")
        baseline_set = True
    cmp = compare(conn=conn, run_id=run_id, tolerance=tolerance, min_busbw=min_busbw)
    linked = _active_alerts(conn, host_list, _ms(when))
    alert_id = _raise_or_clear(conn, run_id, run.test, scope, host_list, cmp, linked, when, actor)
    conn.execute(update(RUNS).where(RUNS.c.id == run_id).values(
        verdict=cmp.to_dict(), alert_id=alert_id, linked_alert_ids=linked))
    return ImportResult(run_id, True, cmp.to_dict(), baseline_set, alert_id, linked)


def get_baseline(*, conn: Connection, test: str, scope: str) -> dict[str, Any] | None:
    row = conn.execute(select(BASELINES).where(BASELINES.c.test == test, BASELINES.c.scope == scope)).mappings()
    first = row.first()
    return dict(first) if first else None


def set_baseline(*, conn: Connection, run_id: int, actor: str, reason: str = "") -> dict[str, Any]:
    """Pin a run as the baseline of its (test, scope); a run with #wrong > 0 cannot be one."""
    run = get_run(conn=conn, run_id=run_id)
    if run is None:
        raise LookupError(f"nccl run {run_id} does not exist")
    if run["wrong_total"] > 0:
        raise NcclImportError(f"run {run_id} has {run['wrong_total']} wrong values; it cannot be a baseline")
    stmt = text("""
        INSERT INTO nccl_baselines (test, scope, run_id, set_by, reason) VALUES (:t, :s, :r, :by, :why)
        ON CONFLICT ON CONSTRAINT nccl_baseline_test_scope
        DO UPDATE SET run_id = EXCLUDED.run_id, set_by = EXCLUDED.set_by, reason = EXCLUDED.reason, set_at = now()
        RETURNING *""")
    return dict(conn.execute(stmt, {"t": run["test"], "s": run["scope"], "r": run_id, "by": actor,
                                    "why": reason}).mappings().one())


def list_baselines(*, conn: Connection) -> list[dict[str, Any]]:
    q = text("""SELECT b.*, r.nccl_version, r.hosts, r.avg_busbw, r.run_at
                FROM nccl_baselines b JOIN nccl_runs r ON r.id = b.run_id ORDER BY b.test, b.scope""")
    return [dict(r) for r in conn.execute(q).mappings()]


def get_run(*, conn: Connection, run_id: int, with_results: bool = False) -> dict[str, Any] | None:
    row = conn.execute(select(RUNS).where(RUNS.c.id == run_id)).mappings().first()
    if row is None:
        return None
    out = dict(row)
    if with_results:
        out["results"] = _results(conn, run_id)
    return out


def list_runs(*, conn: Connection, test: str | None = None, scope: str | None = None, host: str | None = None,
              limit: int = 100) -> list[dict[str, Any]]:
    q = select(RUNS).order_by(RUNS.c.run_at.desc(), RUNS.c.id.desc()).limit(limit)
    if test:
        q = q.where(RUNS.c.test == test)
    if scope:
        q = q.where(RUNS.c.scope == scope)
    if host:
        q = q.where(RUNS.c.hosts.contains([host]))
    return [dict(r) for r in conn.execute(q).mappings()]


def _results(conn: Connection, run_id: int) -> list[dict[str, Any]]:
    q = select(RESULTS).where(RESULTS.c.run_id == run_id).order_by(RESULTS.c.size_bytes)
    return [{k: v for k, v in r.items() if k != "run_id"} for r in conn.execute(q).mappings()]


def compare(*, conn: Connection, run_id: int, tolerance: float = DEFAULT_TOLERANCE,
            min_busbw: float = DEFAULT_MIN_BUSBW, baseline_run_id: int | None = None) -> Comparison:
    """Per message size: out-of-place busbw against the baseline run's (in-place is often N/A-validated)."""
    run = get_run(conn=conn, run_id=run_id)
    if run is None:
        raise LookupError(f"nccl run {run_id} does not exist")
    if baseline_run_id is None:
        base = get_baseline(conn=conn, test=run["test"], scope=run["scope"])
        baseline_run_id = base["run_id"] if base else None
    cmp = Comparison(run_id=run_id, baseline_run_id=baseline_run_id, tolerance=tolerance,
                     wrong_total=run["wrong_total"])
    if run["wrong_total"] > 0:
        cmp.reasons.append(f"{run['wrong_total']} wrong values (#wrong > 0): results are corrupt")
    if baseline_run_id is not None and baseline_run_id != run_id:
        base_run = get_run(conn=conn, run_id=baseline_run_id) or {}
        if base_run.get("nccl_version") != run["nccl_version"]:
            cmp.notes.append(f"NCCL version differs: baseline {base_run.get('nccl_version')}, "
                             f"this run {run['nccl_version']}")
        base_rows = {r["size_bytes"]: r for r in _results(conn, baseline_run_id)}
        for r in _results(conn, run_id):
            b = base_rows.get(r["size_bytes"])
            if b is None or b["oop_busbw"] < min_busbw or b["oop_busbw"] <= 0:
                continue  # nothing to compare with (min_busbw=0 lets a zero baseline through)
            change = r["oop_busbw"] / b["oop_busbw"] - 1
            bad = change < -tolerance
            cmp.sizes.append(SizeDelta(r["size_bytes"], b["oop_busbw"], r["oop_busbw"], round(change, 6), bad))
        worst = min(cmp.sizes, key=lambda s: s.change, default=None)
        n_bad = sum(s.regressed for s in cmp.sizes)
        if n_bad and worst is not None:
            cmp.reasons.append(f"busbw below baseline by more than {tolerance:.0%} at {n_bad} of {len(cmp.sizes)} "
                               f"sizes; worst {worst.size_bytes} B: {worst.busbw:g} vs {worst.baseline_busbw:g} "
                               f"GB/s ({worst.change:+.1%})")
    elif baseline_run_id is None:
        cmp.notes.append("no baseline yet for this test and scope")
    cmp.regressed = bool(cmp.reasons)
    return cmp


def _active_alerts(conn: Connection, hosts: list[str], at_ms: int) -> list[int]:
    """Fabric alerts open at the run's time on its hosts (either end of a link), to explain a regression."""
    if not _alerts_exist(conn):
        return []
    q = text("""
        SELECT id FROM alerts
        WHERE kind <> :kind AND (device = ANY(:h) OR peer_device = ANY(:h))
          AND opened_at_ms <= :t AND (resolved_at_ms IS NULL OR resolved_at_ms >= :t)
        ORDER BY id""")
    return [r[0] for r in conn.execute(q, {"kind": KIND, "h": hosts, "t": at_ms})]


def _raise_or_clear(conn: Connection, run_id: int, test: str, scope: str, hosts: list[str], cmp: Comparison,
                    linked: list[int], when: datetime, actor: str) -> int | None:
    if not _alerts_exist(conn):
        return None
    from service.alerts import service as alerts  # lazy: alerts is another domain's module

    device = sorted(hosts)[0]
    fingerprint = f"{KIND}/{device}"
    if not cmp.regressed:
        # A clean run on the same hosts clears their regression alert.
        row = conn.execute(text("SELECT id FROM alerts WHERE fingerprint = :f AND state <> 'resolved'"),
                           {"f": fingerprint}).first()
        if row is not None:
            alerts.resolve(conn=conn, alert_id=row[0], actor=actor, at_ms=_ms(when),
                           comment=f"nccl run {run_id} ({test} {scope}) is back within tolerance")
        return None
    causes = [r[0] for r in conn.execute(text(
        "SELECT cause FROM alerts WHERE id = ANY(:ids) ORDER BY CASE severity WHEN 'page' THEN 0 "
        "WHEN 'ticket' THEN 1 ELSE 2 END, id"), {"ids": linked})]
    cause = Cause(causes[0]) if causes and causes[0] in Cause._value2member_map_ else Cause.HOST_SIDE
    worst = min(cmp.sizes, key=lambda s: s.change, default=None)
    evidence = [Evidence(feature="nccl_run", value=float(run_id), note=f"{test} {scope}")]
    if worst is not None:
        evidence.append(Evidence(feature="busbw_gbps", value=worst.busbw, baseline=worst.baseline_busbw, unit="GB/s",
                                 note=f"size {worst.size_bytes} B"))
    if cmp.wrong_total:
        evidence.append(Evidence(feature="wrong_values", value=float(cmp.wrong_total), baseline=0.0))
    evidence += [Evidence(feature="linked_alert", value=float(i)) for i in linked]
    finding = Finding(
        kind=KIND, scope="host", device=device, port=None, lane=None, cause=cause,
        severity=Severity.PAGE if cmp.wrong_total else Severity.TICKET, action=Action.NONE, state="firing",
        score=max([-s.change for s in cmp.sizes if s.regressed] + [1.0 if cmp.wrong_total else 0.0]),
        at_ms=_ms(when), summary=f"NCCL {test} on {scope} ({', '.join(hosts[:4])}{'...' if len(hosts) > 4 else ''}):"
                                 f" {'; '.join(cmp.reasons)}"[:1000],
        evidence=evidence)
    # kinds=[]: this is not a complete detection cycle, so no other alert may be aged or resolved by it.
    alerts.apply_findings(conn=conn, findings=[finding], at_ms=_ms(when), actor=actor, kinds=[])
    return conn.execute(text("SELECT id FROM alerts WHERE fingerprint = :f"), {"f": fingerprint}).scalar_one()
