"""The host collector: ethtool, RDMA and net sysfs, DCGM or NVML on one GPU host -> one result.

Every source is independent. One that fails (garbled output, a command that times out, a
missing file) becomes a warning naming the source and the reason, and the others still
return samples; only when every source fails is the result an error. Where two sources give
the same series (ethtool's physical-port bytes and the netdev bytes of the same interface,
say) the earlier source in this order wins: ethtool -S, ethtool -m, RDMA sysfs, `rdma
statistic`, net sysfs, DCGM, NVML. So each series has one meaning, and the more complete
counter is the one kept. One exception: receive drops for lack of a posted buffer
(`port_out_of_buffer_total`) are counted by mlx5 in two disjoint halves, the netdev's queues
(ethtool `rx_out_of_buffer`) and the RDMA QPs (hw_counters `out_of_buffer`); on a RoCE port
both land on one series, so that series is their sum (with no counter width: a sum of two
32-bit counters does not wrap at 2^32). The two RDMA sources count the same QPs and are
never added together.

Target params: `interfaces` (list of netdevs, or {netdev: port label}), `port_names`
({"mlx5_0/1": label}; default: discovered from sysfs gid_attrs), `sysfs_root`, `dcgm_url`,
`nvml` (bool), `module_json` (bool: use `ethtool --json -m`), `rdma_statistic` (bool: also
run `rdma statistic show`, for hosts where the agent cannot read /sys/class/infiniband),
`ethtool` / `rdma` (the command to run: a path or a wrapper), `budget_s` (whole-poll budget).
"""

from __future__ import annotations

import io
import subprocess
import time
from collections.abc import Callable, Iterable
from dataclasses import replace
from pathlib import Path
from typing import Any

import httpx
from tenacity import retry, retry_if_exception, stop_after_attempt, wait_exponential

from collectors.base import CollectError, CollectResult, ParseError, Target, register
from collectors.host.dcgm import scrape_dcgm
from collectors.host.ethtool_module import parse_ethtool_module
from collectors.host.ethtool_stats import parse_ethtool_stats
from collectors.host.net_sysfs import read_net_sysfs
from collectors.host.nvml import collect_nvml
from collectors.host.rdma_sysfs import discover_port_names, parse_rdma_stat, read_rdma_sysfs
from collectors.host.sysfs import sysfs_class_dir
from service.telemetry.promtext import write_samples
from service.telemetry.samples import Sample

Runner = Callable[[list[str], float], str]
IMPORT_PATH = "/api/v1/import/prometheus"


def run_command(cmd: list[str], timeout_s: float) -> str:
    """Run a command, return stdout; non-zero exit raises CollectError, time-out TimeoutExpired."""
    proc = subprocess.run(cmd, capture_output=True, text=True, timeout=timeout_s, check=False)
    if proc.returncode != 0:
        err = (proc.stderr or proc.stdout).strip().splitlines()
        raise CollectError(f"exit status {proc.returncode}: {err[-1][:200] if err else 'no output'}")
    return proc.stdout


def _interfaces(params: dict[str, Any]) -> dict[str, str]:
    raw = params.get("interfaces") or {}
    if isinstance(raw, dict):
        return {str(k): str(v) for k, v in raw.items()}
    return {str(name): str(name) for name in raw}


def _rdma_port_names(params: dict[str, Any], root: Path, ifs: dict[str, str]) -> dict[tuple[str, int], str]:
    given = params.get("port_names")
    if given:
        out = {}
        for key, label in given.items():
            dev, _, num = str(key).partition("/")
            if num.isdigit():
                out[(dev, int(num))] = str(label)
        return out
    # RoCE ports name their netdev; label them like that netdev so both views share a port.
    return {k: ifs.get(nd, nd) for k, nd in discover_port_names(root).items()}


def _key(s: Sample) -> tuple[str, str | None, int | None, int | None, int | None]:
    return (s.metric, s.port, s.lane, s.priority, s.gpu)


# Series whose netdev half and RDMA half are disjoint counts, added up (see the module doc).
_NETDEV_PLUS_RDMA = frozenset({"port_out_of_buffer_total"})
_RDMA_SOURCES = ("rdma sysfs", "rdma statistic")


@register("host")
def collect_host(
    target: Target,
    *,
    now_ms: int,
    run: Runner | None = None,
    sysfs_root: Path | None = None,
) -> CollectResult:
    """Poll one GPU host: every configured source, each failure a warning, all failed an error."""
    t0 = time.monotonic()
    params = target.params
    runner = run or run_command
    root = Path(sysfs_root if sysfs_root is not None else params.get("sysfs_root", "/"))
    ifs = _interfaces(params)
    budget_s = float(params.get("budget_s", max(30.0, 4 * target.timeout_s)))
    dev, ts = target.device, now_ms
    warnings: list[str] = []
    ethtool = str(params.get("ethtool") or "ethtool")  # a path or wrapper (sudo, a simulator shim)

    def ethtool_stats(ifname: str, label: str) -> Callable[[], list[Sample]]:
        return lambda: parse_ethtool_stats(runner([ethtool, "-S", ifname], target.timeout_s), device=dev,
                                           port=label, ts_ms=ts, source=f"ethtool -S {ifname}")

    def ethtool_module(ifname: str, label: str) -> Callable[[], list[Sample]]:
        cmd = [ethtool, "--json", "-m", ifname] if params.get("module_json") else [ethtool, "-m", ifname]

        def go() -> list[Sample]:
            reading = parse_ethtool_module(runner(cmd, target.timeout_s), device=dev, port=label, ts_ms=ts,
                                           source=" ".join(cmd))
            warnings.extend(f"{' '.join(cmd)}: {w}" for w in reading.warnings)
            return reading.samples

        return go

    sources: list[tuple[str, Callable[[], list[Sample]]]] = []
    sources += [(f"ethtool -S {i}", ethtool_stats(i, lb)) for i, lb in ifs.items()]
    sources += [(f"ethtool -m {i}", ethtool_module(i, lb)) for i, lb in ifs.items()]
    if sysfs_class_dir(root, "infiniband").is_dir():
        sources.append(("rdma sysfs", lambda: read_rdma_sysfs(
            root, device=dev, ts_ms=ts, port_names=_rdma_port_names(params, root, ifs), warnings=warnings)))
    if params.get("rdma_statistic"):
        rdma_cmd = [str(params.get("rdma") or "rdma"), "statistic", "show"]
        sources.append(("rdma statistic", lambda: parse_rdma_stat(
            runner(rdma_cmd, target.timeout_s), device=dev, ts_ms=ts, source=" ".join(rdma_cmd),
            port_names=_rdma_port_names(params, root, ifs))))
    sources.append(("net sysfs", lambda: read_net_sysfs(
        root, device=dev, ts_ms=ts, interfaces=list(ifs) or None, port_names=ifs, warnings=warnings)))
    if params.get("dcgm_url"):
        url = str(params["dcgm_url"])
        sources.append((f"dcgm {url}", lambda: scrape_dcgm(url, device=dev, ts_ms=ts, timeout_s=target.timeout_s,
                                                                warnings=warnings)))
    if params.get("nvml"):
        sources.append(("nvml", lambda: collect_nvml(device=dev, ts_ms=ts, warnings=warnings)))

    samples: list[Sample] = []
    seen: dict[tuple, tuple[int, set[bool]]] = {}  # series -> (index in samples, halves: is it RDMA?)
    ok = 0
    for name, fetch in sources:
        if time.monotonic() - t0 > budget_s:
            warnings.append(f"{name}: skipped, the host poll used up its {budget_s:g} s budget")
            continue
        try:
            got = fetch()
        except (subprocess.TimeoutExpired, TimeoutError):
            warnings.append(f"{name}: timed out after {target.timeout_s:g} s")
            continue
        except FileNotFoundError as exc:
            warnings.append(f"{name}: not found: {exc.filename or exc}")
            continue
        except (ParseError, CollectError, OSError) as exc:
            msg = str(exc)  # a ParseError already starts with its source (and line)
            warnings.append(msg if msg.startswith(name) else f"{name}: {msg}")
            continue
        ok += 1
        rdma = name in _RDMA_SOURCES
        for s in got:
            k = _key(s)
            if k not in seen:
                seen[k] = (len(samples), {rdma})
                samples.append(s)
            elif s.metric in _NETDEV_PLUS_RDMA and rdma not in seen[k][1]:
                i, halves = seen[k]
                halves.add(rdma)
                samples[i] = replace(samples[i], value=samples[i].value + s.value, counter_bits=None,
                                     saturating=False)
    error = None
    if ok == 0:
        error = f"all {len(sources)} host sources failed: " + "; ".join(warnings)
    return CollectResult(target=target.name, samples=samples, error=error, warnings=warnings,
                         duration_s=time.monotonic() - t0)


# ----------------------------------------------------------------------------- push


class PushError(RuntimeError):
    """The ingest endpoint refused the samples or could not be reached."""


class _Retryable(Exception):
    pass


def _retryable(exc: BaseException) -> bool:
    return isinstance(exc, _Retryable | httpx.TransportError)


def push_samples(
    samples: Iterable[Sample],
    url: str,
    token: str | None = None,
    timeout: float = 10.0,
    *,
    attempts: int = 4,
    backoff_s: float = 0.5,
    transport: httpx.BaseTransport | None = None,
) -> int:
    """POST samples as Prometheus text to <url>/api/v1/import/prometheus; returns how many.

    Connection errors, 429 and 5xx are retried with exponential backoff; other 4xx are not
    (resending the same body cannot help).
    """
    buf = io.StringIO()
    n = write_samples(samples, buf)
    body = buf.getvalue().encode()
    endpoint = url if url.rstrip("/").endswith(IMPORT_PATH) else url.rstrip("/") + IMPORT_PATH
    headers = {"Content-Type": "text/plain; version=0.0.4"}
    if token:
        headers["Authorization"] = f"Bearer {token}"

    @retry(stop=stop_after_attempt(max(1, attempts)), wait=wait_exponential(multiplier=backoff_s, max=30),
           retry=retry_if_exception(_retryable), reraise=True)
    def send(client: httpx.Client) -> None:
        resp = client.post(endpoint, content=body, headers=headers)
        if resp.status_code == 429 or resp.status_code >= 500:
            raise _Retryable(f"HTTP {resp.status_code}: {resp.text[:200]}")
        if resp.status_code >= 400:
            raise PushError(f"{endpoint}: HTTP {resp.status_code}: {resp.text[:200]}")

    with httpx.Client(timeout=timeout, transport=transport) as client:
        try:
            send(client)
        except _Retryable as exc:
            raise PushError(f"{endpoint}: gave up after {attempts} attempts: {exc}") from None
        except httpx.TransportError as exc:
            raise PushError(f"{endpoint}: gave up after {attempts} attempts: {exc!r}") from None
    return n
