"""collect_nvml against an injected fake of pynvml.

Honest scope: no GPU is available here, so this exercises our logic against a stand-in. The
fake reuses the real pynvml module's constants and exception classes (NVMLError and its
per-code subclasses) and mimics the real function names, argument orders and return types
(ints from the getters, an event-data struct with device/eventType/eventData from
nvmlEventSetWait_v2, NVML_ERROR_TIMEOUT when no event is pending). Whether the driver really
behaves like this is checked on a GPU with bench/gpu/nvml_check.py.
"""

from __future__ import annotations

from dataclasses import dataclass
from types import SimpleNamespace
from typing import Any

import pynvml
import pytest

from collectors.base import CollectError
from collectors.host import nvml as nvml_mod
from collectors.host.nvml import collect_nvml
from service.telemetry import catalogue


@dataclass
class _Event:
    device: Any
    eventType: int
    eventData: int
    gpuInstanceId: int = 0
    computeInstanceId: int = 0


class FakeNvml(SimpleNamespace):
    """Two GPUs: gpu 0 has 2 NVLinks (CRC_DATA unsupported), gpu 1 has no NVLink."""

    def __init__(self) -> None:
        consts = {k: getattr(pynvml, k) for k in dir(pynvml) if k.startswith(("NVML_", "nvmlEventType"))}
        super().__init__(**consts)
        self.NVMLError = pynvml.NVMLError
        self.handles = ["h0", "h1"]
        self.pending: list[_Event] = []
        self.inits = 0
        self.fail_init = False
        self.counters = {("h0", 0, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 10,
                         ("h0", 1, pynvml.NVML_NVLINK_ERROR_DL_CRC_FLIT): 5,
                         ("h0", 0, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 2,
                         ("h0", 1, pynvml.NVML_NVLINK_ERROR_DL_REPLAY): 1,
                         ("h0", 0, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY): 0,
                         ("h0", 1, pynvml.NVML_NVLINK_ERROR_DL_RECOVERY): 4}

    def _err(self, code: int) -> pynvml.NVMLError:
        return pynvml.NVMLError(code)

    def nvmlInit(self) -> None:
        if self.fail_init:
            raise self._err(pynvml.NVML_ERROR_DRIVER_NOT_LOADED)
        self.inits += 1

    def nvmlDeviceGetCount(self) -> int:
        return len(self.handles)

    def nvmlDeviceGetHandleByIndex(self, i: int) -> str:
        return self.handles[i]

    def nvmlDeviceGetIndex(self, h: str) -> int:
        return self.handles.index(h)

    def nvmlDeviceGetTemperature(self, h: str, sensor: int) -> int:
        assert sensor == pynvml.NVML_TEMPERATURE_GPU
        return {"h0": 45, "h1": 51}[h]

    def nvmlDeviceGetCurrPcieLinkGeneration(self, h: str) -> int:
        return 5

    def nvmlDeviceGetCurrPcieLinkWidth(self, h: str) -> int:
        if h == "h1":
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return 16

    def nvmlDeviceGetNvLinkState(self, h: str, link: int) -> int:
        if h == "h1":
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        if link >= 2:
            raise self._err(pynvml.NVML_ERROR_INVALID_ARGUMENT)
        return pynvml.NVML_FEATURE_ENABLED

    def nvmlDeviceGetNvLinkErrorCounter(self, h: str, link: int, counter: int) -> int:
        if counter == pynvml.NVML_NVLINK_ERROR_DL_CRC_DATA:
            raise self._err(pynvml.NVML_ERROR_NOT_SUPPORTED)
        return self.counters[(h, link, counter)]

    def nvmlEventSetCreate(self) -> str:
        return "set"

    def nvmlDeviceRegisterEvents(self, h: str, types: int, es: str) -> None:
        assert types == pynvml.nvmlEventTypeXidCriticalError and es == "set"

    def nvmlEventSetWait_v2(self, es: str, timeout_ms: int) -> _Event:
        assert timeout_ms == 0  # never block the poll
        if not self.pending:
            raise self._err(pynvml.NVML_ERROR_TIMEOUT)
        return self.pending.pop(0)

    def nvmlEventSetFree(self, es: str) -> None:
        pass


@pytest.fixture(autouse=True)
def _fresh_state() -> None:
    nvml_mod.reset_state()


def vals(samples: list) -> dict[tuple[str, int], float]:
    assert all(catalogue.get(s.metric) is not None for s in samples)
    return {(s.metric, s.gpu): s.value for s in samples}


def test_counters_summed_per_gpu_and_unsupported_fields_skipped() -> None:
    fake = FakeNvml()
    warnings: list[str] = []
    got = vals(collect_nvml(device="gpu1", ts_ms=5, nvml=fake, warnings=warnings))
    assert warnings == []
    assert got[("gpu_nvlink_crc_errors_total", 0)] == 15  # flit only; DL_CRC_DATA not supported
    assert got[("gpu_nvlink_replay_errors_total", 0)] == 3
    assert got[("gpu_nvlink_recovery_errors_total", 0)] == 4
    assert ("gpu_nvlink_crc_errors_total", 1) not in got  # gpu 1: no NVLink
    assert got[("gpu_temperature_celsius", 1)] == 51
    assert got[("gpu_pcie_link_width", 0)] == 16 and ("gpu_pcie_link_width", 1) not in got
    assert got[("gpu_xid_errors_total", 0)] == 0 and got[("gpu_last_xid", 1)] == 0


def test_xids_accumulate_across_polls() -> None:
    fake = FakeNvml()
    collect_nvml(device="g", ts_ms=1, nvml=fake)
    fake.pending = [_Event("h1", pynvml.nvmlEventTypeXidCriticalError, 79),
                    _Event("h1", pynvml.nvmlEventTypeXidCriticalError, 48)]
    got = vals(collect_nvml(device="g", ts_ms=2, nvml=fake))
    assert got[("gpu_xid_errors_total", 1)] == 2 and got[("gpu_last_xid", 1)] == 48
    fake.pending = [_Event("h0", pynvml.nvmlEventTypeXidCriticalError, 13)]
    got = vals(collect_nvml(device="g", ts_ms=3, nvml=fake))
    assert got[("gpu_xid_errors_total", 1)] == 2 and got[("gpu_xid_errors_total", 0)] == 1
    assert got[("gpu_last_xid", 0)] == 13


def test_other_errors_become_warnings() -> None:
    fake = FakeNvml()

    def lost(h: str, sensor: int) -> int:
        raise pynvml.NVMLError(pynvml.NVML_ERROR_GPU_IS_LOST)

    fake.nvmlDeviceGetTemperature = lost
    warnings: list[str] = []
    got = vals(collect_nvml(device="g", ts_ms=1, nvml=fake, warnings=warnings))
    assert ("gpu_temperature_celsius", 0) not in got and ("gpu_pcie_link_generation", 0) in got
    assert len(warnings) == 2 and "temperature" in warnings[0]


def test_no_driver_is_a_collect_error() -> None:
    fake = FakeNvml()
    fake.fail_init = True
    with pytest.raises(CollectError, match="cannot initialise"):
        collect_nvml(device="g", ts_ms=1, nvml=fake)
