"""`fabricwatch host collect --push`: a host without a worker pushes its samples over real HTTP."""

from __future__ import annotations

import os
import shutil
import subprocess
import sys
from pathlib import Path

from sqlalchemy import Engine, text

from service.auth.service import create_token
from service.config import load_settings
from tests.factories import add_hosts
from tests.live_api import live_api
from tests.paths import REPO

SYSFS = REPO / "tests/data/host/sysfs_roce"
RDMA_STAT = REPO / "tests/data/real/rdma_sysfs/cn_notes_mlx5_rdma_statistic_show_4links_nonzero_cqe_errors.txt"


def test_host_agent_pushes_to_the_api(db: Engine, db_url: str) -> None:
    with db.begin() as conn:
        dev = conn.execute(text("INSERT INTO devices (name, kind, role, gpus) VALUES ('gpu-007', 'host', 'host', 8) "
                                "RETURNING id")).scalar_one()
        conn.execute(text("INSERT INTO ports (device_id, name, nic) VALUES (:d, 'ens1f0np0', 'mlx5_0')"), {"d": dev})
        token = create_token(conn, name="agent", scopes=["ingest"])
    add_hosts(db, 1)  # an unrelated host, untouched by the push
    with live_api(load_settings(database_url=db_url)) as url:
        cmd = [sys.executable, "-m", "service.cli", "host", "collect", "--push", url, "--device", "gpu-007",
               "--sysfs-root", str(SYSFS)]
        env = {**os.environ, "FABRICWATCH_TOKEN": token}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
        assert "pushed" in done.stderr
        refused = subprocess.run(cmd, env={**os.environ, "FABRICWATCH_TOKEN": "fw_wrong"}, capture_output=True,
                                 text=True, timeout=60, cwd=REPO)
        assert refused.returncode == 1 and "401" in refused.stderr
    with db.connect() as conn:
        cnp = conn.execute(text(
            "SELECT x.value FROM samples x JOIN series s ON s.id = x.series_id JOIN devices d ON d.id = s.device_id "
            "WHERE d.name = 'gpu-007' AND s.metric = 'port_cnp_sent_total'")).scalar_one()
    assert cnp == 1052612505  # np_cnp_sent of the real mlx5 hw_counters dump in the tree


def test_host_agent_runs_rdma_statistic_when_asked(db: Engine, db_url: str, tmp_path: Path) -> None:
    """`--rdma-statistic` runs the real `rdma` found on PATH (here a script printing a real capture)."""
    with db.begin() as conn:
        dev = conn.execute(text("INSERT INTO devices (name, kind, role, gpus) VALUES ('gpu-008', 'host', 'host', 8) "
                                "RETURNING id")).scalar_one()
        conn.execute(text("INSERT INTO ports (device_id, name, nic) VALUES (:d, 'ens1f0np0', 'mlx5_0')"), {"d": dev})
        token = create_token(conn, name="agent", scopes=["ingest"])
    root = tmp_path / "root"
    shutil.copytree(SYSFS, root)
    # this kernel's sysfs lacks resp_cqe_error: only `rdma statistic` has it (mlx5_0/1 -> ens1f0np0 by gid_attrs)
    (root / "sys/class/infiniband/mlx5_0/ports/1/hw_counters/resp_cqe_error").unlink()
    bin_dir = tmp_path / "bin"
    bin_dir.mkdir()
    (bin_dir / "rdma").write_text(f"#!/bin/sh\n[ \"$*\" = 'statistic show' ] && exec cat '{RDMA_STAT}'\nexit 2\n")
    (bin_dir / "rdma").chmod(0o755)
    with live_api(load_settings(database_url=db_url)) as url:
        cmd = [sys.executable, "-m", "service.cli", "host", "collect", "--push", url, "--device", "gpu-008",
               "--sysfs-root", str(root), "--rdma-statistic"]
        env = {**os.environ, "FABRICWATCH_TOKEN": token, "PATH": f"{bin_dir}:{os.environ['PATH']}"}
        done = subprocess.run(cmd, env=env, capture_output=True, text=True, timeout=60, cwd=REPO)
        assert done.returncode == 0, done.stderr
    with db.connect() as conn:
        got = dict(conn.execute(text(
            "SELECT s.metric, x.value FROM samples x JOIN series s ON s.id = x.series_id "
            "JOIN devices d ON d.id = s.device_id WHERE d.name = 'gpu-008' "
            "AND s.metric IN ('port_responder_cqe_errors_total', 'port_requester_cqe_errors_total')")).all())
    assert got == {"port_responder_cqe_errors_total": 1009,  # from `rdma statistic`
                   "port_requester_cqe_errors_total": 0}  # sysfs wins where both have it (its req_cqe_error is 0)
