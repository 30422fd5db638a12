"""DCGM: dcgm-exporter's Prometheus text -> canonical GPU samples, a scraper, and `dcgmi dmon` text.

dcgm-exporter names each metric after its DCGM field (`DCGM_FI_DEV_XID_ERRORS`, ...) and
labels it with `gpu`. Both the current field names and their deprecated aliases appear in
the wild (`DCGM_FI_DEV_XID_ERROR` vs `..._XID_ERRORS`), so both are mapped.

Decisions:
- `DCGM_FI_DEV_XID_ERRORS` is the *last* XID code, a gauge -> `gpu_last_xid`, not a count.
- NVLink CRC errors are flit + data CRC errors summed; the per-GPU `*_TOTAL` fields are used,
  and the per-link `_L<n>_` fields summed only when the total is absent.
- `DCGM_FI_DEV_NVLINK_BANDWIDTH_TOTAL` (field 449) adds both directions, and the
  `DCGM_FI_PROF_NVLINK_*_BYTES` fields are rates (bytes/s): neither fits the canonical
  per-direction byte counters, so both are left out (see the catalogue gap in the report).
- MIG: device-level fields are repeated once per GPU instance with the same `gpu`; the
  readings are one device counter, so duplicates collapse to the largest value.
- DCGM's blank values (a field the GPU or driver does not support, or could not read) are
  printed as huge numbers: 9223372036854775794 is DCGM_INT64_BLANK + 2, "not supported". They
  are no reading: the field is dropped and a warning names it, never a 9.2e18 error counter.
- `dcgmi dmon` output is parsed for structure only (`parse_dcgmi_dmon`): its NVLink fields
  1011/1012 are per-interval rates without timestamps, which no canonical metric takes.
"""

from __future__ import annotations

import re
from dataclasses import dataclass

import httpx

from collectors.base import CollectError, ParseError
from service.telemetry.promtext import PromParseError, parse_lines
from service.telemetry.samples import Sample

# field name -> (canonical metric, rank); equal ranks for one series are summed.
_FIELDS: dict[str, tuple[str, int]] = {
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_COUNT_TOTAL": ("gpu_nvlink_crc_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_COUNT_TOTAL": ("gpu_nvlink_crc_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_CRC_FLIT_ERROR_TOTAL": ("gpu_nvlink_crc_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_CRC_DATA_ERROR_TOTAL": ("gpu_nvlink_crc_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_COUNT_TOTAL": ("gpu_nvlink_replay_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_REPLAY_ERROR_TOTAL": ("gpu_nvlink_replay_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_COUNT_TOTAL": ("gpu_nvlink_recovery_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_RECOVERY_ERROR_TOTAL": ("gpu_nvlink_recovery_errors_total", 0),
    "DCGM_FI_DEV_NVLINK_TX_BYTES_TOTAL": ("gpu_nvlink_tx_bytes_total", 0),
    "DCGM_FI_DEV_NVLINK_RX_BYTES_TOTAL": ("gpu_nvlink_rx_bytes_total", 0),
    "DCGM_FI_DEV_XID_ERRORS": ("gpu_last_xid", 0),
    "DCGM_FI_DEV_XID_ERROR": ("gpu_last_xid", 0),
    "DCGM_FI_DEV_PCIE_LINK_GEN": ("gpu_pcie_link_generation", 0),
    "DCGM_FI_DEV_PCIE_LINK_WIDTH": ("gpu_pcie_link_width", 0),
    "DCGM_FI_DEV_GPU_TEMP": ("gpu_temperature_celsius", 0),
    "DCGM_FI_DEV_GPU_TEMP_CELSIUS": ("gpu_temperature_celsius", 0),
}
_PER_LINK_RE = re.compile(
    r"DCGM_FI_DEV_NVLINK_(?P<kind>CRC_FLIT|CRC_DATA|REPLAY|RECOVERY)_ERROR_(?:COUNT_)?L\d+(?:_TOTAL)?\Z"
)
_PER_LINK_METRIC = {
    "CRC_FLIT": "gpu_nvlink_crc_errors_total", "CRC_DATA": "gpu_nvlink_crc_errors_total",
    "REPLAY": "gpu_nvlink_replay_errors_total", "RECOVERY": "gpu_nvlink_recovery_errors_total",
}
# The catalogue's GPU counters; their readings in the exporter are float64 of uint64.
_COUNTERS = {"gpu_nvlink_crc_errors_total", "gpu_nvlink_replay_errors_total",
             "gpu_nvlink_recovery_errors_total", "gpu_nvlink_tx_bytes_total", "gpu_nvlink_rx_bytes_total"}


# DCGM blanks (dcgm_structs.h): int64 fields use 0x7ffffffffffffff0 and up, int32 fields 0x7ffffff0 and
# up, float64 fields 2**47 and the next few values. Counters may pass 2**31 and 2**47 for real, so only
# the int64 range applies to them.
_INT64_BLANK = float(0x7FFFFFFFFFFFFFF0)
_INT32_BLANK = float(0x7FFFFFF0)
_FP64_BLANK = float(2**47)


def _blank(metric: str, value: float) -> bool:
    if value >= _INT64_BLANK:
        return True
    if metric in _COUNTERS:
        return False
    return _INT32_BLANK <= value < 2**31 or _FP64_BLANK <= value < _FP64_BLANK + 16


def field_names() -> set[str]:
    """DCGM field names this parser maps (for checking against DCGM's field table)."""
    return set(_FIELDS)


def parse_dcgm_exporter(text: str, *, device: str, ts_ms: int, source: str,
                        warnings: list[str] | None = None) -> list[Sample]:
    """dcgm-exporter /metrics text -> canonical samples, one set per `gpu` label.

    Fields that read DCGM's blank are left out; each is named once in `warnings`.
    """
    # (metric, gpu) -> (rank, {(field, instance): value}) ; collapse MIG duplicates per field.
    acc: dict[tuple[str, int], tuple[int, dict[str, float]]] = {}
    stamp: dict[tuple[str, int], int] = {}
    blanks: dict[str, set[int]] = {}  # field -> GPUs where it read DCGM's blank
    try:
        for pl in parse_lines(text.splitlines(), source):
            hit = _FIELDS.get(pl.name)
            if hit is None:
                m = _PER_LINK_RE.match(pl.name)
                if m is None:
                    continue
                hit = (_PER_LINK_METRIC[m.group("kind")], 1)
            metric, rank = hit
            labels = dict(pl.labels)
            gpu_text = labels.get("gpu")
            if gpu_text is None or not gpu_text.isdigit():
                raise ParseError(source, f"{pl.name} has no numeric 'gpu' label", pl.line)
            key = (metric, int(gpu_text))
            if _blank(metric, pl.value):
                blanks.setdefault(pl.name, set()).add(key[1])
                continue
            cur = acc.get(key)
            if cur is None or rank < cur[0]:
                cur = (rank, {})
                acc[key] = cur
            elif rank > cur[0]:
                continue
            fields = cur[1]
            fields[pl.name] = max(fields.get(pl.name, pl.value), pl.value)
            stamp[key] = pl.ts_ms if pl.ts_ms is not None else ts_ms
    except PromParseError as exc:
        raise ParseError(source, exc.reason, exc.line) from None
    out = []
    for (metric, gpu), (_rank, fields) in sorted(acc.items()):
        out.append(Sample(metric=metric, value=float(sum(fields.values())), ts_ms=stamp[(metric, gpu)],
                          device=device, gpu=gpu, counter_bits=64 if metric in _COUNTERS else None))
    if blanks and warnings is not None:
        listed = "; ".join(f"{f} (GPU {', '.join(map(str, sorted(g)))})" for f, g in sorted(blanks.items()))
        warnings.append(f"{source}: no reading, DCGM reports blank (not supported or not read) for: {listed}")
    return out


def scrape_dcgm(
    url: str,
    *,
    device: str,
    ts_ms: int,
    timeout_s: float = 5.0,
    client: httpx.Client | None = None,
    warnings: list[str] | None = None,
) -> list[Sample]:
    """GET dcgm-exporter's /metrics (url may be the base or the full path) and parse it."""
    target = url if url.rstrip("/").endswith("/metrics") else url.rstrip("/") + "/metrics"
    try:
        if client is not None:
            resp = client.get(target, timeout=timeout_s)
        else:
            with httpx.Client(timeout=timeout_s) as c:
                resp = c.get(target)
        resp.raise_for_status()
    except httpx.TimeoutException:
        raise CollectError(f"dcgm-exporter {target}: no answer within {timeout_s:g} s") from None
    except httpx.HTTPError as exc:
        raise CollectError(f"dcgm-exporter {target}: {exc}") from None
    return parse_dcgm_exporter(resp.text, device=device, ts_ms=ts_ms, source=target, warnings=warnings)


# ----------------------------------------------------------------------------- dcgmi dmon

_DMON_CMD_RE = re.compile(r"^>?\s*dcgmi\s+dmon\b.*?-e\s+(?P<fields>[\d,]+)")
_DMON_ROW_RE = re.compile(r"^GPU\s+(?P<gpu>\d+)\s+(?P<rest>.*)$")
_NUM_RE = re.compile(r"^\d+(?:\.\d+)?$")


@dataclass(frozen=True, slots=True)
class DmonRow:
    line: int
    gpu: int
    values: dict[str, float | None]  # column (header name, else field id) -> value; N/A -> None


def parse_dcgmi_dmon(text: str, *, source: str) -> list[DmonRow]:
    """Parse `dcgmi dmon` text into rows. Columns come from the `#Entity` header.

    A block without a header is rejected (a column could be anything); a "..." line, which
    people use to elide rows, is skipped. These are rates, not counters: no samples.
    """
    rows: list[DmonRow] = []
    columns: list[str] | None = None
    fields: list[str] | None = None
    for lineno, raw in enumerate(text.splitlines(), 1):
        line = raw.strip()
        if not line or line in ("...", "…") or line == "ID":
            continue
        if (m := _DMON_CMD_RE.match(line)) is not None:
            fields, columns = m.group("fields").split(","), None
            continue
        if line.startswith("#Entity"):
            columns = line.split()[1:]
            if fields is not None and len(fields) != len(columns):
                raise ParseError(source, f"header has {len(columns)} columns, command asked for {len(fields)}",
                                 lineno)
            continue
        m = _DMON_ROW_RE.match(line)
        if m is None:
            raise ParseError(source, f"not a dmon row: {line[:60]!r}", lineno)
        if columns is None:
            raise ParseError(source, "row without a '#Entity' column header (header missing)", lineno)
        cells = m.group("rest").split()
        if len(cells) != len(columns):
            raise ParseError(source, f"row has {len(cells)} values for {len(columns)} columns", lineno)
        values: dict[str, float | None] = {}
        for col, cell in zip(columns, cells, strict=True):
            if cell == "N/A":
                values[col] = None
            elif _NUM_RE.match(cell):
                values[col] = float(cell)
            else:
                raise ParseError(source, f"column {col}: {cell[:40]!r} is not a number", lineno)
        rows.append(DmonRow(lineno, int(m.group("gpu")), values))
    if not rows:
        raise ParseError(source, "no 'GPU N ...' rows: not `dcgmi dmon` output")
    return rows
