"""The drain-execution outbox: an approved drain runs at most once, from a worker, outside any transaction.

- `queue` (in the approving transaction) writes an execution row: `queued`, with the drain as approved
  (`request`: what will run) and an idempotency key `drain-<id>-<seq>`. Nothing runs if it rolls back.
- `execute_due` (the `execute_drains` task) claims queued rows and runs each with no transaction open.
  A claim first takes a session advisory lock on the execution, on a connection that stays idle
  (autocommit) while the executor runs, then commits `running` with started_at and the worker. Each
  step (command) is recorded before it starts and when it ends; the end (`succeeded` or `failed`, with
  the exit or HTTP status and output tails) is committed before the lock is let go.
- A worker that dies mid-execution (SIGKILL, out of memory, the hard time limit) drops its connection,
  and PostgreSQL drops its lock: the next sweep finds the row `running` with no holder and marks it
  `unknown` with what is known (which step had started, when, on which worker). It is never run
  again on its own; the drain says `execution_unknown` until a person marks it done or asks for a retry.
- A redelivered task message (acks_late after a lost worker) finds no queued row to claim: the claim is
  one conditional UPDATE, so two workers or two deliveries never both start an execution.
"""

from __future__ import annotations

import json
import logging
import os
import socket
import time
from collections import Counter
from datetime import datetime
from typing import Any

from sqlalchemy import Connection, Engine, Row, text

from service.drains.executors import TemplateError, get_executor, outcome
from service.drains.schemas import DrainSettings, DrainStatus, ExecutionState, drain_settings

log = logging.getLogger(__name__)

_EXEC_LOCK = 74_201_301   # pg_advisory_lock(_EXEC_LOCK, execution id): held by the worker running it
_COLUMNS = ("id", "seq", "state", "executor", "idempotency_key", "requested_by", "created_at", "started_at",
            "finished_at", "worker", "result")
_UNKNOWN = ("the executor on {worker} started this execution at {started} and never recorded an end (the worker "
            "was killed, or lost its database connection); its commands may have run in part, in full or not at "
            "all, and it is not run again on its own: check the target, then POST /api/v1/drains/{drain}/done "
            "if the drain is in place, or /api/v1/drains/{drain}/retry to run it again")


def _json(value: Any) -> str:
    return json.dumps(value, default=str, sort_keys=True)


def _mirror(conn: Connection, ex: Row[Any]) -> None:
    """The drain's `execution` field: its latest execution, summed up (the API's drain shows it)."""
    summary = {k: getattr(ex, k) for k in _COLUMNS}
    conn.execute(text("UPDATE drain_recommendations SET execution = CAST(:e AS jsonb) WHERE id = :d"),
                 {"e": _json(summary), "d": ex.drain_id})


def queue(*, conn: Connection, drain: Row[Any], executor: str, actor: str, at: datetime) -> Row[Any]:
    """Queue one execution of an approved drain, in the caller's (approving) transaction."""
    request = {k: v for k, v in drain._asdict().items() if k not in ("execution", "alert_state")}
    seq = conn.execute(text("SELECT count(*) + 1 FROM drain_executions WHERE drain_id = :d"),
                       {"d": drain.id}).scalar_one()
    ex = conn.execute(text(
        "INSERT INTO drain_executions (drain_id, seq, idempotency_key, executor, state, request, requested_by, "
        "created_at) VALUES (:d, :seq, :key, :ex, 'queued', CAST(:req AS jsonb), :by, :at) RETURNING *"),
        {"d": drain.id, "seq": seq, "key": f"drain-{drain.id}-{seq}", "ex": executor, "req": _json(request),
         "by": actor, "at": at}).one()
    _mirror(conn, ex)
    return ex


def list_executions(*, conn: Connection, drain_id: int) -> list[Row[Any]]:
    return list(conn.execute(text("SELECT * FROM drain_executions WHERE drain_id = :d ORDER BY seq"),
                             {"d": drain_id}))


def _try_lock(lock_conn: Connection, execution_id: int) -> bool:
    return bool(lock_conn.execute(text("SELECT pg_try_advisory_lock(:k, :i)"),
                                  {"k": _EXEC_LOCK, "i": execution_id}).scalar_one())


def _unlock(lock_conn: Connection, execution_id: int) -> None:
    lock_conn.execute(text("SELECT pg_advisory_unlock(:k, :i)"), {"k": _EXEC_LOCK, "i": execution_id})


def _drain_event(conn: Connection, ex: Row[Any], kind: str, note: str) -> None:
    from service.incidents import service as incidents  # drains.service imports this module

    inc = conn.execute(text("SELECT incident_id FROM drain_recommendations WHERE id = :d"),
                       {"d": ex.drain_id}).scalar()
    if inc is not None:
        incidents.add_event(conn=conn, incident_id=inc, actor=f"{ex.requested_by} via {ex.executor} executor",
                            kind=kind, at=None, text_=note, data={"drain_id": ex.drain_id, "execution_id": ex.id})


def _settle(conn: Connection, ex: Row[Any]) -> None:
    """Move the drain on from an execution that ended, if the drain is still waiting on this execution."""
    from service.drains import service as drains

    drain = conn.execute(text("SELECT status, execution FROM drain_recommendations WHERE id = :d FOR UPDATE"),
                         {"d": ex.drain_id}).one()
    waiting = drain.status in (DrainStatus.APPROVED, DrainStatus.EXECUTION_UNKNOWN)
    if not waiting or (drain.execution or {}).get("id") != ex.id:
        return   # a person decided meanwhile (done, a retry): this execution's record is all that changes
    what = f"drain {ex.drain_id}: execution {ex.id} ({ex.idempotency_key})"
    if ex.state == ExecutionState.SUCCEEDED:
        drains.mark_done(conn=conn, drain_id=ex.drain_id, actor=f"{ex.requested_by} via {ex.executor} executor",
                         note=f"execution {ex.id} succeeded")
        return
    status = DrainStatus.EXECUTION_FAILED if ex.state == ExecutionState.FAILED else DrainStatus.EXECUTION_UNKNOWN
    conn.execute(text("UPDATE drain_recommendations SET status = :s, updated_at = clock_timestamp() WHERE id = :d"),
                 {"s": status.value, "d": ex.drain_id})
    detail = (ex.result or {}).get("error") or (ex.result or {}).get("note") or ""
    _drain_event(conn, ex, f"drain_{status.value}", f"{what} {ex.state}" + (f": {detail}" if detail else ""))


def _claim(engine: Engine, lock_conn: Connection, worker: str) -> Row[Any] | None:
    """Lock and start the oldest queued execution; cancel one whose drain is no longer approved."""
    ids = lock_conn.execute(text("SELECT id FROM drain_executions WHERE state = 'queued' ORDER BY id LIMIT 20"))
    for ex_id in list(ids.scalars()):
        if not _try_lock(lock_conn, ex_id):
            continue   # another worker is claiming it right now
        with engine.begin() as conn:
            row = conn.execute(text(
                "SELECT d.status FROM drain_executions e JOIN drain_recommendations d ON d.id = e.drain_id "
                "WHERE e.id = :i AND e.state = 'queued' FOR UPDATE OF e, d"), {"i": ex_id}).first()
            ex = None
            if row is not None and row.status == DrainStatus.APPROVED:
                ex = conn.execute(text(
                    "UPDATE drain_executions SET state = 'running', started_at = clock_timestamp(), worker = :w "
                    "WHERE id = :i RETURNING *"), {"i": ex_id, "w": worker}).one()
                _mirror(conn, ex)
            elif row is not None:   # done by hand, released or reset before a worker came to it
                gone = conn.execute(text(
                    "UPDATE drain_executions SET state = 'cancelled', finished_at = clock_timestamp(), "
                    "result = CAST(:r AS jsonb) WHERE id = :i RETURNING *"),
                    {"i": ex_id, "r": _json(outcome("none", False, note=f"not started: the drain was "
                                                    f"'{row.status}' when a worker came to it"))}).one()
                _mirror(conn, gone)
        if ex is not None:
            return ex
        _unlock(lock_conn, ex_id)
    return None


def _finish(engine: Engine, ex: Row[Any], result: dict[str, Any]) -> Row[Any]:
    state = (ExecutionState.SUCCEEDED if result["ok"] else
             ExecutionState.FAILED if result.get("known", True) else ExecutionState.UNKNOWN)
    with engine.begin() as conn:
        # `unknown` too: a worker whose lock went with a dropped connection still knows how it ended
        done = conn.execute(text(
            "UPDATE drain_executions SET state = :s, finished_at = clock_timestamp(), result = CAST(:r AS jsonb) "
            "WHERE id = :i AND state IN ('running', 'unknown') AND finished_at IS NULL RETURNING *"),
            {"s": state.value, "r": _json(result), "i": ex.id}).one()
        _mirror(conn, done)
        _settle(conn, done)
    return done


def _run(engine: Engine, ex: Row[Any], settings: DrainSettings) -> str:
    """Run one claimed execution (no transaction open meanwhile) and record how it ended."""
    def progress(steps: list[dict[str, Any]]) -> None:
        with engine.begin() as conn:
            conn.execute(text("UPDATE drain_executions SET steps = CAST(:s AS jsonb) WHERE id = :i"),
                         {"s": _json(steps), "i": ex.id})

    request = {**ex.request, "execution_id": ex.id, "idempotency_key": ex.idempotency_key}
    try:
        executor = get_executor(settings, ex.executor)
    except TemplateError as exc:   # misconfigured here: nothing was run
        result = outcome(ex.executor, False, error=str(exc))
    else:
        try:
            result = executor.execute(request, progress)
        except Exception as exc:   # the soft time limit, or a bug, part-way through: what ran is not known
            log.exception("drain execution %s stopped part-way", ex.id)
            result = outcome(ex.executor, False, known=False, error=f"stopped part-way: {type(exc).__name__}: {exc}")
    done = _finish(engine, ex, result)
    log.info("drain %s execution %s (%s): %s", ex.drain_id, ex.id, ex.idempotency_key, done.state)
    return str(done.state)


def sweep(engine: Engine, lock_conn: Connection) -> int:
    """Mark `unknown` every running execution whose worker is gone (its lock is free). Never re-runs one."""
    n = 0
    for ex_id in list(lock_conn.execute(text("SELECT id FROM drain_executions WHERE state = 'running'")).scalars()):
        if not _try_lock(lock_conn, ex_id):
            continue   # its executor is alive and holds it
        try:
            with engine.begin() as conn:
                ex = conn.execute(text("SELECT * FROM drain_executions WHERE id = :i AND state = 'running' "
                                       "FOR UPDATE"), {"i": ex_id}).first()
                if ex is None:
                    continue   # it ended between the two reads
                steps = ex.steps or []
                open_steps = [s for s in steps if "finished_at" not in s]
                note = _UNKNOWN.format(worker=ex.worker, started=ex.started_at.isoformat(), drain=ex.drain_id)
                result = outcome(ex.executor, False, known=False, error="no end recorded", note=note,
                                 steps_started=len(steps), step_in_flight=open_steps[0] if open_steps else None)
                lost = conn.execute(text(
                    "UPDATE drain_executions SET state = 'unknown', result = CAST(:r AS jsonb) WHERE id = :i "
                    "RETURNING *"), {"r": _json(result), "i": ex_id}).one()
                _mirror(conn, lost)
                _settle(conn, lost)
                n += 1
            log.warning("drain %s execution %s: started on %s, no end recorded: execution_unknown",
                        lost.drain_id, ex_id, ex.worker)
        finally:
            _unlock(lock_conn, ex_id)
    return n


def execute_due(engine: Engine, *, settings: DrainSettings | None = None, budget_s: float = 60.0) -> dict[str, int]:
    """Sweep lost executions, then run queued ones one by one until none is left or `budget_s` has passed."""
    settings = settings or drain_settings()
    worker = f"{socket.gethostname()}:{os.getpid()}"
    counts: Counter[str] = Counter()
    deadline = time.monotonic() + budget_s
    # Autocommit: this connection holds the session lock of the execution being run, and no transaction.
    with engine.connect().execution_options(isolation_level="AUTOCOMMIT") as lock_conn:
        try:
            counts["unknown"] += sweep(engine, lock_conn)
            while time.monotonic() < deadline and (ex := _claim(engine, lock_conn, worker)) is not None:
                try:
                    counts[_run(engine, ex, settings)] += 1
                finally:
                    _unlock(lock_conn, ex.id)
        finally:
            lock_conn.execute(text("SELECT pg_advisory_unlock_all()"))   # the pool gets it back clean
    return {k: v for k, v in counts.items() if v}
