"""Every Celery task has a soft and a hard time limit for its kind, and a hung task is cut off.

End to end: a real worker with beat, on a private Redis, polls two GPU hosts. One host's sysfs files
are FIFOs with no writer, so reading them blocks forever inside open() (as a hung driver read does).
The poll must be cut off at its soft limit, the cut recorded as that target's error, the next poll of
it must run (and be cut again), and the healthy host must keep its schedule meanwhile.
"""

from __future__ import annotations

import importlib
import os
import shutil
import subprocess
import sys
import tempfile
import time
from collections.abc import Iterator
from pathlib import Path

import pytest
from celery import Celery
from sqlalchemy import Engine, text
from sqlalchemy.orm import Session

from service.config import SettingsError, load_settings
from service.inventory.schemas import Inventory
from service.inventory.service import upsert_inventory
from service.worker import TIME_LIMITS, WORKER_POOL, LimitedTask, celery_app, configure, time_limits
from tests.faults.peers import PrivateRedis
from tests.paths import REPO

# The modules a worker imports, which register every task on the app.
for _module in configure(Celery("limits-probe", set_as_current=False),
                         load_settings(database_url="postgresql://probe/probe")).conf.imports:
    importlib.import_module(_module)

SYSFS = REPO / "tests/data/host/sysfs_roce"
PORT = {"name": "ens1f0np0", "nic": "mlx5_0", "rail": 0, "gpu": 0}


def test_every_task_has_its_kinds_time_limits() -> None:
    ours = {n: t for n, t in celery_app.tasks.items() if n.startswith("fabricwatch.")}
    assert {n.removeprefix("fabricwatch.") for n in ours} == set(TIME_LIMITS)
    for name, task in ours.items():
        soft, hard = TIME_LIMITS[name.removeprefix("fabricwatch.")]
        assert (task.soft_time_limit, task.time_limit) == (soft, hard) and 0 < soft < hard, name


def test_time_limits_are_configured_per_kind() -> None:
    got = time_limits(load_settings(task_time_limits={"run_detection": (5, 10)}))
    assert got["run_detection"] == (5.0, 10.0) and got["collect_target"] == TIME_LIMITS["collect_target"]
    with pytest.raises(SettingsError, match="unknown task kind 'run_detect'"):
        time_limits(load_settings(task_time_limits={"run_detect": (5, 10)}))
    with pytest.raises(SettingsError, match="run_detection: the soft limit"):
        time_limits(load_settings(task_time_limits={"run_detection": (10, 5)}))
    # a task reads its app's table when it runs, whenever the app was configured
    app = Celery("t", task_cls=LimitedTask, set_as_current=False)

    @app.task(name="fabricwatch.run_detection")
    def task() -> None: ...

    app.conf.update(fabricwatch_time_limits={"run_detection": (1.0, 2.0)})
    assert (task.soft_time_limit, task.time_limit) == (1.0, 2.0)


def _hung_sysfs(root: Path) -> Path:
    """SYSFS's net tree with every file a FIFO nobody writes: open() for reading never returns."""
    net = SYSFS / "sys/class/net"
    for f in net.rglob("*"):
        dest = root / "sys/class/net" / f.relative_to(net)
        if f.is_dir():
            dest.mkdir(parents=True, exist_ok=True)
        else:
            dest.parent.mkdir(parents=True, exist_ok=True)
            os.mkfifo(dest)
    return root


def _host(name: str, sysfs: Path, queue: str) -> dict[str, object]:
    return {"name": name, "kind": "host", "role": "host", "gpus": 8, "ports": [PORT],
            "endpoints": [{"protocol": "host", "sysfs_root": str(sysfs), "queue": queue, "timeout_s": 1,
                           "intervals": {"counters": 2, "optics": 2, "state": 2}}]}


def _status(db: Engine) -> dict[str, tuple]:
    with db.connect() as conn:
        rows = conn.execute(text(
            "SELECT d.name, t.last_error, t.consecutive_failures FROM endpoints e JOIN devices d "
            "ON d.id = e.device_id LEFT JOIN target_status t ON t.endpoint_id = e.id")).all()
        polls = dict(conn.execute(text(
            "SELECT d.name, count(DISTINCT x.ts) FROM samples x JOIN series s ON s.id = x.series_id "
            "JOIN devices d ON d.id = s.device_id GROUP BY d.name")).all())
    return {r[0]: (r[1], r[2] or 0, polls.get(r[0], 0)) for r in rows}


@pytest.fixture()
def redis() -> Iterator[PrivateRedis]:
    work = Path(tempfile.mkdtemp(prefix="fw-limits-redis-"))
    r = PrivateRedis(work).start()
    try:
        yield r
    finally:
        r.stop()
        shutil.rmtree(work, ignore_errors=True)


LAUNCHERS = {
    # Celery's own command line, with the pool service/worker.py names
    "celery": lambda q, sched: [sys.executable, "-m", "celery", "-A", "service.worker", "worker", "--pool",
                                WORKER_POOL, "-Q", f"fabricwatch,{q}", "-c", "3", "--beat", "--schedule", sched,
                                "--without-gossip", "--without-mingle", "--loglevel", "WARNING"],
    # the command operators run, with its default pool
    "fabricwatch": lambda q, sched: [sys.executable, "-m", "service.cli", "worker", "--beat", "-Q",
                                     f"fabricwatch,{q}", "-c", "3"],
}


@pytest.mark.parametrize("launcher", ["celery", "fabricwatch"])
def test_a_hung_collection_is_cut_off_and_the_next_one_runs(launcher: str, db: Engine, db_url: str,
                                                             redis: PrivateRedis, tmp_path: Path) -> None:
    queue = f"limits-{os.getpid()}-{time.monotonic_ns()}"
    hung = _hung_sysfs(tmp_path / "hung")
    with Session(db) as session:
        upsert_inventory(session=session, inventory=Inventory.model_validate(
            {"devices": [_host("gpu-hung", hung, queue), _host("gpu-ok", SYSFS, queue)]}))
        session.commit()
    env = {**os.environ, "FABRICWATCH_DATABASE_URL": db_url, "FABRICWATCH_REDIS_URL": redis.url,
           "FABRICWATCH_LOG_LEVEL": "WARNING", "FABRICWATCH_TASK_TIME_LIMITS": '{"collect_target": [2, 4]}'}
    log_path = tmp_path / "worker.log"
    with log_path.open("wb") as log:
        worker = subprocess.Popen(LAUNCHERS[launcher](queue, str(tmp_path / "beat-schedule")), env=env,
                                  stdout=log, stderr=subprocess.STDOUT, cwd=REPO, start_new_session=True)
    try:
        deadline = time.monotonic() + 45
        while time.monotonic() < deadline:
            s = _status(db)
            if s["gpu-hung"][1] >= 2 and s["gpu-ok"][2] >= 3:
                break
            assert worker.poll() is None, log_path.read_text()[-3000:]
            time.sleep(1)
        error, failures, _ = s["gpu-hung"]
        assert failures >= 2 and error and "cut off at its time limit (2 s)" in error, \
            f"{s}\n{log_path.read_text()[-3000:]}"
        assert s["gpu-ok"][2] >= 3 and s["gpu-ok"][0] is None, s
    finally:
        os.killpg(worker.pid, 15)
        try:
            worker.wait(20)
        except subprocess.TimeoutExpired:
            os.killpg(worker.pid, 9)
            worker.wait(5)
