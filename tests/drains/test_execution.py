"""A drain runs at most once, outside any request transaction (issue #17, item 2).

Approval commits `approved` and a queued execution (202); a worker claims it and runs the command with
no transaction open and no lock held but its own execution's. Real parts: PostgreSQL, the API app, real
subprocess commands that write a marker line per run, a webhook receiver on 127.0.0.1 and, for the kill,
a real Celery prefork worker on Redis whose pool process is SIGKILLed mid-command.
"""

from __future__ import annotations

import contextlib
import json
import os
import signal
import subprocess
import sys
import time
import uuid
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pytest
from celery import Celery
from fastapi.testclient import TestClient
from sqlalchemy import Engine, text

from service.api import auth
from service.auth.service import create_token
from service.config import load_settings
from service.drains import service
from service.drains.execution import execute_due
from service.drains.schemas import Target, TargetKind, drain_settings
from service.worker import configure
from tests.drains import SMALL, load_fabric, settings
from tests.drains.test_api import make_app
from tests.receiver import Receiver

# The "drain command": one marker line per run (its pid, its parent's pid, the host), then it sleeps as long
# as <marker>.sleep says and exits with <marker>.rc (0 when absent).
SCRIPT = """import os, sys, time
marker, host = sys.argv[1], sys.argv[2]
with open(marker, "a") as f:
    f.write(f"{os.getpid()} {os.getppid()} {host}\\n")
print(f"drained {host}", flush=True)
time.sleep(float(open(marker + ".sleep").read()) if os.path.exists(marker + ".sleep") else 0)
sys.exit(int(open(marker + ".rc").read()) if os.path.exists(marker + ".rc") else 0)
"""
HOST = "host-p1-00001"


class Command:
    """The marker command as a drain template, and what it recorded."""

    def __init__(self, tmp: Path) -> None:
        self.script, self.marker = tmp / "drain_cmd.py", tmp / "marker"
        self.script.write_text(SCRIPT)
        self.template = [sys.executable, str(self.script), str(self.marker), "{host}"]

    def runs(self) -> list[tuple[int, int, str]]:
        if not self.marker.exists():
            return []
        return [(int(a), int(b), h) for a, b, h in (line.split() for line in self.marker.read_text().splitlines())]

    def behave(self, *, sleep_s: float = 0, rc: int = 0) -> None:
        Path(f"{self.marker}.sleep").write_text(str(sleep_s))
        Path(f"{self.marker}.rc").write_text(str(rc))


@pytest.fixture()
def cmd(tmp_path: Path, monkeypatch: pytest.MonkeyPatch) -> Command:
    c = Command(tmp_path)
    monkeypatch.setenv("FABRICWATCH_DRAIN_EXECUTOR", "command")
    monkeypatch.setenv("FABRICWATCH_DRAIN_COMMAND_SLURM_DRAIN", json.dumps(c.template))
    return c


@pytest.fixture()
def client(db: Engine, db_url: str, cmd: Command) -> TestClient:
    auth._failures.clear()
    return TestClient(make_app(db_url))


def _h(db: Engine, scope: str) -> dict[str, str]:
    with db.begin() as conn:
        return {"authorization": f"Bearer {create_token(conn, name=f'{scope}-user', scopes=[scope])}"}


def _pending(db: Engine, host: str = HOST) -> int:
    load_fabric(db, **SMALL)
    with db.begin() as conn:
        return service.recommend(conn=conn, target=Target(kind=TargetKind.HOST, device=host), reason="NIC errors",
                                 settings=settings(**drain_settings().model_dump(include={
                                     "executor", "command_slurm_drain", "webhook_url"}))).id


def _executions(client: TestClient, db: Engine, drain_id: int) -> list[dict[str, Any]]:
    r = client.get(f"/api/v1/drains/{drain_id}/executions", headers=_h(db, "read"))
    assert r.status_code == 200, r.text
    return r.json()


def test_approve_answers_202_and_a_worker_runs_the_drain_once(client: TestClient, db: Engine, cmd: Command) -> None:
    drain_id = _pending(db)
    op = _h(db, "operate")
    r = client.post(f"/api/v1/drains/{drain_id}/approve", json={"note": "go"}, headers=op)
    assert r.status_code == 202, r.text
    body = r.json()
    assert body["status"] == "approved" and body["execution"]["state"] == "queued"
    assert body["execution"]["idempotency_key"] == f"drain-{drain_id}-1"
    assert r.headers["location"] == f"/api/v1/drains/{drain_id}/executions"
    assert cmd.runs() == []   # nothing ran in the request
    assert execute_due(db) == {"succeeded": 1}
    assert execute_due(db) == {}   # and nothing runs twice
    assert [h for *_, h in cmd.runs()] == [HOST]
    drain = client.get(f"/api/v1/drains/{drain_id}", headers=_h(db, "read")).json()
    assert drain["status"] == "done" and drain["done_by"] == "operate-user via command executor"
    assert drain["execution"]["state"] == "succeeded" and drain["execution"]["result"]["rc"] == 0
    (ex,) = _executions(client, db, drain_id)
    assert ex["state"] == "succeeded" and ex["requested_by"] == "operate-user" and ex["seq"] == 1
    assert ex["started_at"] <= ex["finished_at"] and ex["worker"].endswith(f":{os.getpid()}")
    (step,) = ex["steps"]
    assert step["argv"][-1] == HOST and step["rc"] == 0 and step["stdout"] == f"drained {HOST}\n"
    inc = client.get(f"/api/v1/incidents/{drain['incident_id']}", headers=_h(db, "read")).json()
    assert inc["state"] == "drained"


def test_a_failed_execution_waits_for_a_person_who_may_retry(client: TestClient, db: Engine, cmd: Command) -> None:
    drain_id = _pending(db)
    op = _h(db, "operate")
    cmd.behave(rc=3)
    assert client.post(f"/api/v1/drains/{drain_id}/approve", headers=op).status_code == 202
    assert execute_due(db) == {"failed": 1}
    drain = client.get(f"/api/v1/drains/{drain_id}", headers=op).json()
    assert drain["status"] == "execution_failed" and drain["execution"]["result"]["rc"] == 3
    assert execute_due(db) == {} and len(cmd.runs()) == 1   # never retried on its own
    again = client.post(f"/api/v1/drains/{drain_id}/approve", headers=op)
    assert again.status_code == 409 and again.json()["current"] == "execution_failed"
    cmd.behave(rc=0)
    r = client.post(f"/api/v1/drains/{drain_id}/retry", json={"note": "fixed slurmctld"}, headers=op)
    assert r.status_code == 202 and r.json()["execution"]["idempotency_key"] == f"drain-{drain_id}-2"
    assert client.post(f"/api/v1/drains/{drain_id}/retry", headers=op).status_code == 409   # one live execution
    assert execute_due(db) == {"succeeded": 1}
    assert [(e["seq"], e["state"]) for e in _executions(client, db, drain_id)] == [(1, "failed"), (2, "succeeded")]
    assert client.get(f"/api/v1/drains/{drain_id}", headers=op).json()["status"] == "done" and len(cmd.runs()) == 2


def test_an_execution_not_started_when_the_drain_was_done_by_hand_is_cancelled(
        client: TestClient, db: Engine, cmd: Command) -> None:
    drain_id = _pending(db)
    op = _h(db, "operate")
    assert client.post(f"/api/v1/drains/{drain_id}/approve", headers=op).status_code == 202
    assert client.post(f"/api/v1/drains/{drain_id}/done", json={"note": "did it myself"}, headers=op).json()[
        "status"] == "done"
    assert execute_due(db) == {}
    (ex,) = _executions(client, db, drain_id)
    assert ex["state"] == "cancelled" and "'done'" in ex["result"]["note"] and ex["started_at"] is None
    assert cmd.runs() == []


def test_the_webhook_executor_posts_once_signed_with_the_execution_key(
        db: Engine, db_url: str, monkeypatch: pytest.MonkeyPatch) -> None:
    receiver = Receiver().start()
    monkeypatch.setenv("FABRICWATCH_DRAIN_EXECUTOR", "webhook")
    monkeypatch.setenv("FABRICWATCH_DRAIN_WEBHOOK_URL", receiver.url + "/drain")
    monkeypatch.setenv("FABRICWATCH_DRAIN_WEBHOOK_SECRET_ENV", "FW_TEST_DRAIN_SECRET")
    monkeypatch.setenv("FW_TEST_DRAIN_SECRET", "0123456789abcdef")
    try:
        drain_id = _pending(db)
        auth._failures.clear()
        client = TestClient(make_app(db_url))
        assert client.post(f"/api/v1/drains/{drain_id}/approve", headers=_h(db, "operate")).status_code == 202
        assert receiver.requests == []
        assert execute_due(db) == {"succeeded": 1} and execute_due(db) == {}
        (req,) = receiver.requests
    finally:
        receiver.stop()
    assert req.headers["idempotency-key"] == f"drain-{drain_id}-1"
    assert req.headers["x-fabricwatch-signature"].startswith("v1=") and "x-fabricwatch-timestamp" in req.headers
    (ex,) = _executions(client, db, drain_id)
    assert ex["state"] == "succeeded" and ex["steps"][0]["status"] == 200 and ex["result"]["status"] == 200


def _wait(pred: Callable[[], Any], timeout_s: float, what: str, worker: subprocess.Popen[bytes]) -> Any:
    deadline = time.monotonic() + timeout_s
    while not (got := pred()):
        assert worker.poll() is None, f"the worker exited waiting for {what}"
        assert time.monotonic() < deadline, f"{what}: not within {timeout_s} s"
        time.sleep(0.2)
    return got


def _state(db: Engine, drain_id: int) -> tuple[str, str | None]:
    with db.connect() as conn:
        row = conn.execute(text("SELECT d.status, e.state FROM drain_recommendations d LEFT JOIN drain_executions e "
                                "ON e.drain_id = d.id WHERE d.id = :d ORDER BY e.id DESC LIMIT 1"),
                           {"d": drain_id}).one()
    return row.status, row.state


@pytest.mark.slow
@pytest.mark.timeout(180)
def test_a_worker_killed_mid_command_never_runs_the_drain_again(
        client: TestClient, db: Engine, db_url: str, broker_url: str, cmd: Command) -> None:
    """The pool process running the drain command is SIGKILLed while the command sleeps. Celery redelivers
    the task (acks_late, reject_on_worker_lost) and more are sent; none runs the command again. The
    execution says `unknown`: started when, on which worker, which command was in flight, no end; the
    drain says `execution_unknown` until an operator confirms it (done). Before: approve ran the command in
    the request's transaction, a crash left the drain `pending`, and the second approve ran it again."""
    drain_id = _pending(db)
    cmd.behave(sleep_s=60)
    queue = f"fw-test-drains-{uuid.uuid4().hex[:8]}"   # private: no other worker on this broker takes it
    redis = broker_url if broker_url.startswith("redis") else None
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "PYTHONUNBUFFERED": "1"}
    if redis:
        env["FABRICWATCH_REDIS_URL"] = redis
    worker = subprocess.Popen(
        [sys.executable, "-m", "celery", "-A", "service.worker", "worker", "-I", "service.drains.tasks", "-Q", queue,
         "-P", "prefork", "-c", "1", "--without-gossip", "--without-mingle", "--without-heartbeat", "-l", "INFO"],
        env=env, stdout=subprocess.DEVNULL, stderr=subprocess.PIPE)
    orphans: list[int] = []
    op = _h(db, "operate")
    assert client.get(f"/api/v1/drains/{drain_id}", headers=op).json()["status"] == "pending"   # the app is up
    try:
        t0 = time.monotonic()
        r = client.post(f"/api/v1/drains/{drain_id}/approve", headers=op)
        answered_s = time.monotonic() - t0
        assert answered_s < 5   # it does not wait for the 60 s command
        assert r.status_code == 202 and r.json()["execution"]["state"] == "queued", r.text
        sender = configure(Celery("fw-test-client"), load_settings(database_url=db_url, redis_url=redis))
        sender.send_task("fabricwatch.execute_drains", queue=queue)
        pid, pool_pid, _ = _wait(lambda: cmd.runs() and cmd.runs()[0], 60, "the drain command to start", worker)
        orphans.append(pid)
        assert _state(db, drain_id) == ("approved", "running")
        # While it runs: no transaction open for it, and the drain safety lock is free (a recommendation,
        # as detection makes under the alert lock, goes through at once)
        with db.begin() as conn:
            conn.execute(text("SET LOCAL lock_timeout = '2s'"))
            idle_in_tx = conn.execute(text(
                "SELECT count(*) FROM pg_stat_activity WHERE datname = current_database() "
                "AND state LIKE 'idle in transaction%' AND pid <> pg_backend_pid()")).scalar()
            other = service.recommend(conn=conn, target=Target(kind=TargetKind.HOST, device="host-p1-00002"),
                                      reason="x", settings=settings())
        assert idle_in_tx == 0 and other.status == "pending"
        os.kill(pool_pid, signal.SIGKILL)   # the worker's pool process, mid-command
        status, state = _wait(lambda: _state(db, drain_id)[1] == "unknown" and _state(db, drain_id), 60,
                              "the lost execution to be marked unknown", worker)
        for _ in range(2):
            sender.send_task("fabricwatch.execute_drains", queue=queue)
        time.sleep(5)
        assert worker.poll() is None
    finally:
        for p in orphans:   # the killed worker's command is still sleeping: it was never told to stop
            with contextlib.suppress(ProcessLookupError):
                os.kill(p, signal.SIGKILL)
        worker.terminate()
        try:
            _, err = worker.communicate(timeout=20)
        except subprocess.TimeoutExpired:
            worker.kill()
            _, err = worker.communicate()
    runs = cmd.runs()
    print(f"\nkilled mid-command: approve answered in {answered_s:.2f} s; command runs {len(runs)}; drain {status}, "
          f"execution {state}")
    assert len(runs) == 1 and status == "execution_unknown" and _state(db, drain_id) == (status, state)
    read = _h(db, "read")
    (ex,) = _executions(client, db, drain_id)
    assert ex["started_at"] and ex["finished_at"] is None and ex["worker"]
    (step,) = ex["steps"]
    assert step["argv"][-1] == HOST and "started_at" in step and "rc" not in step
    res = ex["result"]
    assert res["known"] is False and res["step_in_flight"]["argv"] == step["argv"]
    assert "never recorded an end" in res["note"] and f"/api/v1/drains/{drain_id}/done" in res["note"]
    again = client.post(f"/api/v1/drains/{drain_id}/approve", headers=op)
    assert again.status_code == 409 and again.json()["current"] == "execution_unknown"
    drain = client.get(f"/api/v1/drains/{drain_id}", headers=read).json()
    assert drain["execution"]["state"] == "unknown"
    # the operator checks the node, finds it drained and says so
    done = client.post(f"/api/v1/drains/{drain_id}/done", json={"note": "checked: node drained"}, headers=op).json()
    assert done["status"] == "done" and done["done_by"] == "operate-user"
    assert len(cmd.runs()) == 1
    log = err.decode(errors="replace")
    # Celery saw its pool process die mid-task and redelivered the task; that run only marked the execution
    assert "WorkerLostError" in log and "succeeded in" in log and "{'unknown': 1}" in log, log[-3000:]
    assert "ERROR/ForkPoolWorker" not in log and "raised unexpected" not in log, log[-3000:]
