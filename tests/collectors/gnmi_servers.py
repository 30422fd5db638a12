"""Third-party gNMI servers on 127.0.0.1 for the collector's tests, fed openconfig leaves.

Splice (PyPI `splice-gnmi`, AGPL-3.0-or-later, a NETCONF-to-gNMI bridge by Trinity College
Dublin) serves from a cache of `path -> value`. Its matching is what real caching targets do
and our simulator does not: a request path matches only as an exact prefix of a stored path
(`/interfaces/interface` matches `/interfaces/interface[name=x]/...`, the key-less
`/interfaces/interface/state/counters` matches nothing), streams are SAMPLE or ON_CHANGE for the
whole subscription list, it sends an empty notification as a heartbeat, and floats go out as
float_val. It runs in its own process (`python tests/collectors/gnmi_servers.py splice PORT
DATA`): its gnmi_pb2 and pygnmi's cannot share one protobuf registry. DATA is a JSON file of
`{path: value}`, read again whenever it changes, so a test can move a value between samples.

Values come from real captures (tests/data/real/gnmi/, SOURCES.md); `leaves_of` flattens them.

The second server is finsy's (PyPI `finsy`, Apache-2.0, a P4Runtime/gNMI client library by Bill
Fisher): `finsy.test.gnmi_server.GNMIServer`, a test gNMI server whose answers are Stratum's
(ONF's NOS, on a bmv2 switch with ports `s1-eth1`, `s1-eth2`) as its author recorded them.
It is not configurable: every Get answers the two ports' `state/ifindex` whatever the path,
Capabilities advertise `openconfig-interfaces-stratum` and PROTO only, and a Subscribe whose
first subscription is SAMPLE gets five `state/counters/in-octets` notifications 0.1 s apart
(1196 each, no sync_response) and then nothing, with the stream held open.
It also runs in its own process (`python tests/collectors/gnmi_servers.py stratum PORT`):
finsy's gnmi_pb2 registers the same `gnmi` package as pygnmi's.
"""

from __future__ import annotations

import json
import os
import socket
import subprocess
import sys
import time
from collections.abc import Iterator
from contextlib import contextmanager
from pathlib import Path
from typing import Any

REAL = Path(__file__).resolve().parents[1] / "data" / "real" / "gnmi"

# What SR Linux 24.10 advertises for the openconfig models we read (its Capabilities, see SOURCES.md)
OPENCONFIG_MODELS = (
    ("openconfig-interfaces", "OpenConfig working group", "3.7.1"),
    ("openconfig-if-ethernet", "OpenConfig working group", "2.13.0"),
    ("openconfig-platform", "OpenConfig working group", "0.24.0"),
    ("openconfig-platform-port", "OpenConfig working group", "1.0.1"),
    ("openconfig-platform-transceiver", "OpenConfig working group", "0.14.0"),
)


def leaves_of(name: str) -> dict[str, Any]:
    """A real capture as `{leaf path: value}` (gnmic Get JSON or pygnmi Get JSON)."""
    from collectors.gnmi_decode import flatten, format_path, json_leaves, normalize, parse_path

    text = (REAL / name).read_text()
    doc = json.loads(text)
    out: dict[str, Any] = {}
    if isinstance(doc, dict) and "notification" in doc:  # pygnmi's get() rendering
        for note in doc["notification"]:
            for u in note["update"]:
                for p, v in flatten(normalize(parse_path(u["path"])), u["val"]):
                    out[format_path(normalize(list(p)))] = v
        return out
    groups, _ = json_leaves(text, source=name)
    for leaves in groups:
        for leaf in leaves:
            out[leaf.text()] = leaf.value
    return out


def splice_data(values: dict[str, Any]) -> dict[str, Any]:
    """Our leaf paths in Splice's cache form: key values percent-encoded (`ethernet-1%2F31`)."""
    from urllib.parse import quote

    from collectors.gnmi_decode import parse_path

    out = {}
    for path, v in values.items():
        elems = parse_path(path)
        out["/" + "/".join(e.name + "".join(f"[{k}={quote(x, safe='')}]" for k, x in e.keys) for e in elems)] = v
    return out


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return s.getsockname()[1]


@contextmanager
def _server_process(name: str, *args: str) -> Iterator[int]:
    """Run `python gnmi_servers.py NAME PORT ARGS...` on a free 127.0.0.1 port; yields the port."""
    port = free_port()
    proc = subprocess.Popen([sys.executable, __file__, name, str(port), *args],
                            stdout=subprocess.PIPE, stderr=subprocess.STDOUT)
    try:
        deadline = time.monotonic() + 20
        while time.monotonic() < deadline:
            assert proc.poll() is None, proc.stdout.read().decode() if proc.stdout else f"{name} exited"
            with socket.socket() as s:
                if s.connect_ex(("127.0.0.1", port)) == 0:
                    break
            time.sleep(0.1)
        else:
            raise TimeoutError(f"{name} did not listen within 20 s")
        yield port
    finally:
        proc.terminate()
        try:
            proc.wait(10)
        except subprocess.TimeoutExpired:
            proc.kill()


@contextmanager
def splice_server(data_file: Path, *, heartbeat_s: int = 1) -> Iterator[int]:
    """Run Splice's gNMI server on 127.0.0.1 serving `data_file`; yields its port."""
    with _server_process("splice", str(data_file), str(heartbeat_s)) as port:
        yield port


@contextmanager
def stratum_server() -> Iterator[int]:
    """Run finsy's test gNMI server (Stratum's recorded answers) on 127.0.0.1; yields its port."""
    with _server_process("stratum") as port:
        yield port


def _run_stratum(port: int) -> None:
    import asyncio

    from finsy.test.gnmi_server import GNMIServer

    async def main() -> None:
        async with GNMIServer(f"127.0.0.1:{port}").run():
            await asyncio.Event().wait()  # until terminated

    asyncio.run(main())


def _run_splice(port: int, data_file: str, heartbeat_s: int) -> None:
    import splice.gnmi_pb2 as pb
    from splice.gnmi_server import CacheView, serve

    class FileView(CacheView):  # type: ignore[misc]
        """Splice's own view over a cache that follows the data file."""

        def __init__(self) -> None:
            self._mtime = -1.0
            super().__init__({}, {})
            self._reload()

        def _reload(self) -> None:
            mtime = os.stat(data_file).st_mtime
            if mtime != self._mtime:
                with open(data_file) as fh:
                    data = json.load(fh)
                self._canonical_map = {p: {"path": p, "value": v} for p, v in data.items()}
                self._mtime = mtime

        def match_prefix(self, prefix: str) -> list[dict[str, object]]:
            self._reload()
            return super().match_prefix(prefix)

    models = [pb.ModelData(name=n, organization=o, version=v) for n, o, v in OPENCONFIG_MODELS]
    server = serve(FileView(), bind="127.0.0.1", port=port, heartbeat_sec=heartbeat_s, supported_models=models)
    server.wait_for_termination()


if __name__ == "__main__":
    if sys.argv[1] == "splice":
        _run_splice(int(sys.argv[2]), sys.argv[3], int(sys.argv[4]))
    elif sys.argv[1] == "stratum":
        _run_stratum(int(sys.argv[2]))
