"""dcgm-exporter -> catalogue: the `DCGM_FI_*` NVLink, XID, PCIe and temperature fields.

Identity: dcgm-exporter labels each series with `Hostname` (the node it runs on) and `gpu` (the
index); `Hostname` names the device first, then `instance` (in Kubernetes the instance is a pod
address, so Hostname is the one that matches the inventory). The gpu index is the catalogue's `gpu`.

Fields (the same choices as the host agent's parser, collectors/host/dcgm.py):

| field | catalogue |
|---|---|
| `DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL` + `..._DATA_...` | `gpu_nvlink_crc_errors_total` (summed) |
| `DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL` | `gpu_nvlink_replay_errors_total` |
| `DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL` | `gpu_nvlink_recovery_errors_total` |
| `DCGM_FI_DEV_NVLINK_TX_BYTES_TOTAL` / `_RX_BYTES_TOTAL` | `gpu_nvlink_tx_bytes_total` / `gpu_nvlink_rx_bytes_total` |
| `DCGM_FI_DEV_XID_ERRORS` (the last XID code, a gauge) | `gpu_last_xid` |
| `DCGM_FI_DEV_PCIE_LINK_GEN` / `_WIDTH` | `gpu_pcie_link_generation` / `gpu_pcie_link_width` |
| `DCGM_FI_DEV_GPU_TEMP` | `gpu_temperature_celsius` |

The older `*_TOTAL` spellings without `_COUNT` are taken too. Left out, and counted as unmapped:
`DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` (both directions added: no per-direction counter), the
`DCGM_FI_PROF_NVLINK_*` rates, the per-link `_L<n>` fields (the totals are mapped), and every
non-fabric field (clocks, power, utilisation, memory, ECC).

DCGM "blank" values (a field the GPU does not support or the exporter could not read: int64
values from 0x7ffffffffffffff0 up, int32 ones from 0x7ffffff0, float64 2^47 and up) are no reading,
counted as `blank_value`. MIG: device fields repeat once per GPU instance with the same `gpu`;
they are one reading (the mapper keeps the largest of a field's duplicates).
"""

from __future__ import annotations

from service.telemetry.exporters.base import DeviceKind, Labels, Match, Reason, Unmapped, hosts_of, int_label

EXPORTER = "dcgm-exporter"

_CRC = "gpu_nvlink_crc_errors_total"
# field -> (catalogue metric, counter)
FIELDS: dict[str, tuple[str, bool]] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": (_CRC, True),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": (_CRC, True),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": (_CRC, True),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": (_CRC, True),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("gpu_nvlink_replay_errors_total", True),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": ("gpu_nvlink_replay_errors_total", True),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("gpu_nvlink_recovery_errors_total", True),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": ("gpu_nvlink_recovery_errors_total", True),
    "DCGM_FI_DEV_NVLINK_TX_BYTES_TOTAL": ("gpu_nvlink_tx_bytes_total", True),
    "DCGM_FI_DEV_NVLINK_RX_BYTES_TOTAL": ("gpu_nvlink_rx_bytes_total", True),
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_last_xid", False),
    "DCGM_FI_DEV_XID_ERROR": ("gpu_last_xid", False),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("gpu_pcie_link_generation", False),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("gpu_pcie_link_width", False),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", False),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("gpu_temperature_celsius", False),
}
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
_INT32_BLANK = float(0x7FFFFFF0)
_FP64_BLANK = 2.0 ** 47


def _counter_value(v: float) -> float | None:
    return None if v >= _INT64_BLANK or v == _FP64_BLANK else v


def _gauge_value(v: float) -> float | None:
    # a gauge field (temperature, PCIe generation/width, XID code) never reaches the int32 blank range
    return None if v >= _INT32_BLANK else v


def match(name: str, labels: Labels) -> Match | Unmapped | None:
    if not name.startswith("DCGM_"):
        return None
    hit = FIELDS.get(name)
    if hit is None:
        return Unmapped(Reason.UNMAPPED_METRIC, name)
    metric, counter = hit
    try:
        gpu = int_label(labels, "gpu")
    except ValueError as exc:
        return Unmapped(Reason.BAD_LABEL, f"{name}: {exc}")
    if gpu is None:
        return Unmapped(Reason.MISSING_LABEL, f"{name}: no 'gpu' label")
    return Match(metric, DeviceKind.HOST, hosts_of(labels, "Hostname"), gpu=gpu, component=name,
                 counter_bits=64 if counter else None, value_fn=_counter_value if counter else _gauge_value)
