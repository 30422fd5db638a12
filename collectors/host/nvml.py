"""NVML (nvidia-ml-py) -> NVLink error counters, PCIe link, temperature and XIDs per GPU.

Used where dcgm-exporter is not deployed. pynvml is imported lazily so that hosts without
the NVIDIA driver can still import the host collector; tests inject a fake module.

- NVLink error counters are read per link (nvmlDeviceGetNvLinkErrorCounter) and summed per
  GPU: CRC = DL_CRC_FLIT + DL_CRC_DATA, replay = DL_REPLAY, recovery = DL_RECOVERY. Links or
  counters that NVML does not support (NVML_ERROR_NOT_SUPPORTED, or INVALID_ARGUMENT for a
  link index the GPU lacks) are skipped; a GPU with none gives no NVLink samples.
- XIDs come from an NVML event set registered for nvmlEventTypeXidCriticalError and drained
  with a zero timeout on every call. An event set only sees events after it is registered,
  so it is kept for the life of the process: `gpu_xid_errors_total` counts XIDs seen since
  the collector started (a counter that resets on restart, which delta logic handles) and
  `gpu_last_xid` is the last code seen (0 if none yet).
"""

from __future__ import annotations

import contextlib
import importlib
from dataclasses import dataclass, field
from types import ModuleType
from typing import Any

from collectors.base import CollectError
from service.telemetry.samples import Sample

_MAX_EVENTS_PER_CALL = 1024  # bound the drain loop if a GPU is spewing XIDs


@dataclass(slots=True)
class _XidWatch:
    event_set: Any
    counts: dict[int, int] = field(default_factory=dict)
    last: dict[int, int] = field(default_factory=dict)


@dataclass(slots=True)
class _State:
    xid: _XidWatch | None = None


_STATES: dict[int, _State] = {}  # id(nvml module) -> state kept across calls


def _load() -> ModuleType:
    try:
        return importlib.import_module("pynvml")
    except ImportError as exc:  # pragma: no cover - nvidia-ml-py is a dependency
        raise CollectError(f"nvml: nvidia-ml-py is not installed ({exc})") from None


def _code(nvml: Any, exc: BaseException) -> int | None:
    return getattr(exc, "value", None) if isinstance(exc, nvml.NVMLError) else None


def _skippable(nvml: Any, exc: BaseException) -> bool:
    skip = {nvml.NVML_ERROR_NOT_SUPPORTED, nvml.NVML_ERROR_INVALID_ARGUMENT,
            getattr(nvml, "NVML_ERROR_FUNCTION_NOT_FOUND", -1), getattr(nvml, "NVML_ERROR_NO_PERMISSION", -1)}
    return _code(nvml, exc) in skip


def _start_xid_watch(nvml: Any, handles: list[Any], warnings: list[str]) -> _XidWatch | None:
    try:
        es = nvml.nvmlEventSetCreate()
    except nvml.NVMLError as exc:
        warnings.append(f"nvml: XID events unavailable: {exc}")
        return None
    registered = 0
    for i, h in enumerate(handles):
        try:
            nvml.nvmlDeviceRegisterEvents(h, nvml.nvmlEventTypeXidCriticalError, es)
            registered += 1
        except nvml.NVMLError as exc:
            if not _skippable(nvml, exc):
                warnings.append(f"nvml: gpu {i}: XID event registration failed: {exc}")
    if not registered:
        with contextlib.suppress(nvml.NVMLError):
            nvml.nvmlEventSetFree(es)
        return None
    return _XidWatch(es)


def _drain_xids(nvml: Any, watch: _XidWatch, index_of: dict[int, int]) -> None:
    for _ in range(_MAX_EVENTS_PER_CALL):
        try:
            data = nvml.nvmlEventSetWait_v2(watch.event_set, 0)  # 0 ms: never block the poll
        except nvml.NVMLError as exc:
            if _code(nvml, exc) == nvml.NVML_ERROR_TIMEOUT:
                return  # no more pending events
            raise
        if not data.eventType & nvml.nvmlEventTypeXidCriticalError:
            continue
        try:
            gpu = nvml.nvmlDeviceGetIndex(data.device)
        except nvml.NVMLError:
            gpu = index_of.get(id(data.device), -1)
        if gpu < 0:
            continue
        watch.counts[gpu] = watch.counts.get(gpu, 0) + 1
        watch.last[gpu] = int(data.eventData)


def collect_nvml(*, device: str, ts_ms: int, nvml: Any = None, warnings: list[str] | None = None) -> list[Sample]:
    """One poll of every GPU through NVML. Fatal problems (no driver) raise CollectError."""
    nvml = nvml if nvml is not None else _load()
    warn: list[str] = warnings if warnings is not None else []
    state = _STATES.setdefault(id(nvml), _State())
    try:
        nvml.nvmlInit()  # reference-counted by NVML; cheap when already initialised
        count = nvml.nvmlDeviceGetCount()
        handles = [nvml.nvmlDeviceGetHandleByIndex(i) for i in range(count)]
    except nvml.NVMLError as exc:
        raise CollectError(f"nvml: cannot initialise or enumerate GPUs: {exc}") from None

    out: list[Sample] = []

    def add(metric: str, gpu: int, value: float, bits: int | None = None) -> None:
        out.append(Sample(metric=metric, value=float(value), ts_ms=ts_ms, device=device, gpu=gpu,
                          counter_bits=bits))

    def read(gpu: int, what: str, fn: Any, *args: Any) -> Any:
        try:
            return fn(*args)
        except nvml.NVMLError as exc:
            if not _skippable(nvml, exc):
                warn.append(f"nvml: gpu {gpu}: {what}: {exc}")
            return None

    kinds = {
        "gpu_nvlink_crc_errors_total": (nvml.NVML_NVLINK_ERROR_DL_CRC_FLIT, nvml.NVML_NVLINK_ERROR_DL_CRC_DATA),
        "gpu_nvlink_replay_errors_total": (nvml.NVML_NVLINK_ERROR_DL_REPLAY,),
        "gpu_nvlink_recovery_errors_total": (nvml.NVML_NVLINK_ERROR_DL_RECOVERY,),
    }
    for gpu, h in enumerate(handles):
        temp = read(gpu, "temperature", nvml.nvmlDeviceGetTemperature, h, nvml.NVML_TEMPERATURE_GPU)
        if temp is not None:
            add("gpu_temperature_celsius", gpu, temp)
        gen = read(gpu, "PCIe generation", nvml.nvmlDeviceGetCurrPcieLinkGeneration, h)
        if gen is not None:
            add("gpu_pcie_link_generation", gpu, gen)
        width = read(gpu, "PCIe width", nvml.nvmlDeviceGetCurrPcieLinkWidth, h)
        if width is not None:
            add("gpu_pcie_link_width", gpu, width)
        totals: dict[str, int] = {}
        for link in range(nvml.NVML_NVLINK_MAX_LINKS):
            if read(gpu, f"nvlink {link} state", nvml.nvmlDeviceGetNvLinkState, h, link) is None:
                continue  # link absent on this GPU, or NVLink unsupported
            for metric, counters in kinds.items():
                for c in counters:
                    v = read(gpu, f"nvlink {link} error counter {c}", nvml.nvmlDeviceGetNvLinkErrorCounter,
                             h, link, c)
                    if v is not None:
                        totals[metric] = totals.get(metric, 0) + int(v)
        for metric, total in sorted(totals.items()):
            add(metric, gpu, total, 64)

    if state.xid is None:
        state.xid = _start_xid_watch(nvml, handles, warn)
    if state.xid is not None:
        try:
            _drain_xids(nvml, state.xid, {id(h): i for i, h in enumerate(handles)})
        except nvml.NVMLError as exc:
            warn.append(f"nvml: reading XID events failed: {exc}")
        for gpu in range(len(handles)):
            add("gpu_xid_errors_total", gpu, state.xid.counts.get(gpu, 0))
            add("gpu_last_xid", gpu, state.xid.last.get(gpu, 0))
    if warnings is None and warn and not out:
        raise CollectError("; ".join(warn))
    return out


def reset_state() -> None:
    """Forget kept NVML event sets (tests, or after the driver was reloaded)."""
    _STATES.clear()
