"""Real SNMP peers on 127.0.0.1 for tests and benchmarks: snmpsim, net-snmp snmpd, a silent socket.

Nothing here mocks SNMP. A missing peer binary fails loudly with the package to install.
"""

from __future__ import annotations

import os
import shutil
import signal
import socket
import subprocess
import sys
import tempfile
import time
from collections.abc import Mapping
from dataclasses import dataclass, field, replace
from pathlib import Path

from service.telemetry.samples import Sample

REPO = Path(__file__).resolve().parents[1]
DATA = REPO / "tests" / "data" / "snmp"
VENV_BIN = Path(sys.executable).parent


class PeerMissing(RuntimeError):
    """A peer binary is not installed; the message names the Debian/pip package."""


def require(binary: str, package: str) -> str:
    """Absolute path of `binary`, looked up in the venv first, then PATH."""
    local = VENV_BIN / binary
    if local.exists():
        return str(local)
    found = shutil.which(binary) or shutil.which(binary, path="/usr/sbin:/sbin")
    if not found:
        raise PeerMissing(f"{binary} not found: install {package} (tests need a real SNMP peer)")
    return found


def free_udp_port() -> int:
    with socket.socket(socket.AF_INET, socket.SOCK_DGRAM) as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def _udp_bound(port: int) -> bool:
    want = f"0100007F:{port:04X}"
    try:
        rows = Path("/proc/net/udp").read_text().splitlines()[1:]
    except OSError:
        return False
    return any(r.split()[1] == want for r in rows if len(r.split()) > 1)


@dataclass
class Peer:
    name: str
    port: int
    proc: subprocess.Popen[bytes] | None
    workdir: Path
    log: Path
    extra: dict[str, str] = field(default_factory=dict)

    def wait_ready(self, timeout_s: float = 90.0) -> None:  # snmpsim indexes its walks first: slow on a busy box
        end = time.monotonic() + timeout_s
        while time.monotonic() < end:
            if self.proc is not None and self.proc.poll() is not None:
                raise RuntimeError(f"{self.name} exited with {self.proc.returncode}: {self.tail()}")
            if _udp_bound(self.port):
                return
            time.sleep(0.05)
        raise RuntimeError(f"{self.name} did not bind 127.0.0.1:{self.port} in {timeout_s}s: {self.tail()}")

    def tail(self) -> str:
        try:
            return self.log.read_text(errors="replace")[-1500:]
        except OSError:
            return "(no log)"

    def close(self) -> None:
        if self.proc is not None and self.proc.poll() is None:
            self.proc.send_signal(signal.SIGTERM)
            try:
                self.proc.wait(5)
            except subprocess.TimeoutExpired:
                self.proc.kill()
                self.proc.wait(5)
        shutil.rmtree(self.workdir, ignore_errors=True)


def _workdir(prefix: str) -> Path:
    # Under /tmp, world-readable: snmpsim and snmpd must read it whatever user they run as.
    d = Path(tempfile.mkdtemp(prefix=prefix, dir="/tmp"))
    d.chmod(0o755)
    return d


def start_snmpsim(recordings: Mapping[str, str | Path], *, max_var_binds: int = 256) -> Peer:
    """Serve each recording under its community name (the key), v1/v2c, on a free port."""
    exe = require("snmpsim-command-responder", "the pip package snmpsim (project dev extra)")
    work = _workdir("fw-snmpsim-")
    data, cache = work / "data", work / "cache"
    data.mkdir(mode=0o755)
    cache.mkdir(mode=0o777)
    for community, src in recordings.items():
        dst = data / f"{community}.snmprec"
        shutil.copyfile(src, dst)
        dst.chmod(0o644)
    port = free_udp_port()
    log = work / "snmpsim.log"
    env = dict(os.environ)
    args = [exe, f"--data-dir={data}", f"--cache-dir={cache}", f"--agent-udpv4-endpoint=127.0.0.1:{port}",
            f"--max-var-binds={max_var_binds}", "--log-level=error"]
    if os.getuid() == 0:
        # snmpsim refuses to run as root unless told. Dropping to nobody does not work
        # here: the interpreter's stdlib lives under /root (pyenv) and snmpsim imports
        # dbm lazily after the drop. The agent only binds 127.0.0.1 and lives for one test run.
        env["SNMPSIM_ALLOW_ROOT"] = "true"
    with log.open("wb") as fh:
        proc = subprocess.Popen(args, stdout=fh, stderr=subprocess.STDOUT, env=env, cwd=work)
    peer = Peer("snmpsim", port, proc, work, log)
    try:
        peer.wait_ready()
    except Exception:
        peer.close()
        raise
    return peer


def start_snmpd(*, user: str, auth_key: str, priv_key: str, auth: str = "SHA-256", priv: str = "AES") -> Peer:
    """net-snmp snmpd with one v3 authPriv user, a private config and persistent dir."""
    exe = require("snmpd", "the Debian package snmpd")
    work = _workdir("fw-snmpd-")
    port = free_udp_port()
    conf, log = work / "snmpd.conf", work / "snmpd.log"
    conf.write_text(
        f'createUser {user} {auth} "{auth_key}" {priv} "{priv_key}"\n'
        f"rouser {user} priv\n"
    )
    env = dict(os.environ, SNMP_PERSISTENT_DIR=str(work / "persist"), MIBS="", MIBDIRS=str(work))
    args = [exe, "-f", "-C", "-c", str(conf), "-Lf", str(log), "-p", str(work / "snmpd.pid"),
            f"udp:127.0.0.1:{port}"]
    proc = subprocess.Popen(args, stdout=subprocess.DEVNULL, stderr=subprocess.DEVNULL, env=env, cwd=work)
    peer = Peer("snmpd", port, proc, work, log, extra={"user": user})
    try:
        peer.wait_ready()
    except Exception:
        peer.close()
        raise
    return peer


def silent_udp_socket() -> tuple[socket.socket, int]:
    """A bound UDP socket that never answers: the shape of a hung agent."""
    s = socket.socket(socket.AF_INET, socket.SOCK_DGRAM)
    s.bind(("127.0.0.1", 0))
    return s, int(s.getsockname()[1])


def unstamped(sample: Sample) -> str:
    """A sample without its time, to compare a live poll (stamped when the agent answered) with a recording."""
    return repr(replace(sample, ts_ms=0))
