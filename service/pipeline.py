"""One detection cycle end to end: findings -> alerts -> incidents and drain recommendations.

`run_cycle` is what the beat-driven Celery task and `fabricwatch detect --at T` run.
`replay_alerts` is the backtest: the same detector and the same alert state machine over stored
history, with the alert tables shadowed by session-local temporary copies, so a replay changes
nothing, notifies nobody and never holds the live alert lock for longer than one cycle.
"""

from __future__ import annotations

from collections.abc import Callable, Iterator
from contextlib import contextmanager
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import ColumnElement, Connection, Engine, text

from service.alerts.service import ChangeSet, apply_findings
from service.detection.findings import Finding, Severity
from service.detection.service import backtest, detect_in
from service.detection.state import Config
from service.drains.service import recommend_isolated, withdraw_cleared
from service.drains.topology import FabricView
from service.telemetry.coverage import gap_findings

# Tables the alert state machine writes; a replay works on temporary copies of these.
_SHADOWED = ("alerts", "alert_events", "webhook_outbox")


@dataclass
class CycleOutcome:
    at_ms: int
    findings: list[Finding]
    changes: ChangeSet
    drains: list[int] = field(default_factory=list)
    withdrawn: list[int] = field(default_factory=list)   # drains withdrawn because their alert resolved
    drain_errors: dict[str, str] = field(default_factory=dict)   # fingerprint -> why its recommendation failed

    def summary(self) -> dict[str, Any]:
        return {"at_ms": self.at_ms, "findings": len(self.findings), "opened": self.changes.opened,
                "reopened": self.changes.reopened, "resolved": self.changes.resolved, "drains": self.drains,
                "withdrawn": self.withdrawn, "drain_errors": self.drain_errors}


def _drain_worthy(f: Finding) -> bool:
    """Pages only: a ticket (a slow trend) is for the next maintenance window, not for a drain now."""
    return f.state == "firing" and f.severity is Severity.PAGE


def apply_cycle(conn: Connection, findings: list[Finding], at_ms: int, *, drains: bool = True,
                scope: ColumnElement[bool] | None = None) -> CycleOutcome:
    """Alerts (and, for pages, drain recommendations) from one cycle's findings, in the caller's transaction.

    Undecided drains whose alert has resolved (this cycle, or by hand since) are withdrawn; a drain's
    reason is its alert's summary, the episode's worst cycle, not this cycle's. Each recommendation has its
    own savepoint: one that fails is noted on its alert and never takes the cycle's alerts with it.
    `scope`: the open alerts these findings are complete for (apply_findings; None: all)."""
    changes = apply_findings(conn=conn, findings=findings, at_ms=at_ms, scope=scope)
    out = CycleOutcome(at_ms, findings, changes)
    if not drains:
        return out
    at = datetime.fromtimestamp(at_ms / 1000, tz=UTC)
    out.withdrawn = withdraw_cleared(conn=conn, at=at)
    worthy = [f for f in findings if _drain_worthy(f)]
    if worthy:
        alerts = {r.fingerprint: r for r in conn.execute(text(
            "SELECT fingerprint, id, summary FROM alerts WHERE fingerprint = ANY(:f)"),
            {"f": [f.fingerprint for f in worthy]})}
        view = FabricView()  # the graph and the links down at `at`: read once for all of this cycle's pages
        for f in worthy:
            a = alerts.get(f.fingerprint)
            row, error = recommend_isolated(conn=conn, finding=f, alert_id=a.id if a else None, at=at,
                                            reason=a.summary if a else None, view=view)
            if row is not None:
                out.drains.append(int(row.id))
            if error is not None:
                out.drain_errors[f.fingerprint] = error
    return out


def run_cycle(engine: Engine, at_ms: int, *, name: str = "default", config: Config | None = None) -> CycleOutcome:
    """Live: detect at `at_ms` (new samples only), then alert and recommend, in one transaction: detector
    state, findings and alerts commit together, so a cycle that fails (or dies) anywhere keeps nothing and
    the next cycle reads the same samples again. No finding is stored without its alert."""
    with engine.begin() as conn:
        findings = detect_in(conn, at_ms, name=name, config=config)
        findings += gap_findings(conn, at_ms=at_ms)   # targets blind for N collections (live only, not replayed)
        return apply_cycle(conn, findings, at_ms)


@contextmanager
def shadowed_alerts(conn: Connection) -> Iterator[None]:
    """The alert tables shadowed by session-local temporary copies on `conn` for the block: what the alert
    state machine writes there is dropped at the end, and nobody is notified."""
    conn.execute(text("SET fabricwatch.replay = 'on'"))  # service.events.publish stays quiet
    for table in _SHADOWED:
        conn.execute(text(f"CREATE TEMP TABLE {table} (LIKE public.{table} INCLUDING ALL)"))
    # A pooled connection may hold statements psycopg prepared on the real tables; a new temp table does
    # not invalidate their plans once this session has a temp schema, so they would write the live alerts.
    conn.execute(text("DISCARD PLANS"))
    conn.commit()
    try:
        yield
    finally:
        conn.rollback()
        for table in _SHADOWED:
            conn.execute(text(f"DROP TABLE IF EXISTS pg_temp.{table}"))
        conn.execute(text("RESET fabricwatch.replay"))
        conn.commit()


def replay_alerts(engine: Engine, from_ms: int, to_ms: int, step_ms: int, *, config: Config | None = None,
                  on_cycle: Callable[[CycleOutcome], None] | None = None) -> list[CycleOutcome]:
    """Backtest: the alert changes live detection would have made over [from, to], changing nothing."""
    outcomes: list[CycleOutcome] = []
    with engine.connect() as conn, shadowed_alerts(conn):

        def cycle(at_ms: int, findings: list[Finding]) -> None:
            with conn.begin():
                outcome = apply_cycle(conn, findings, at_ms, drains=False)
            outcomes.append(outcome)
            if on_cycle is not None:
                on_cycle(outcome)

        backtest(engine, from_ms, to_ms, step_ms, config=config, on_cycle=cycle)
    return outcomes
