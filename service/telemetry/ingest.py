"""The one ingest path: canonical samples -> series ids -> COPY batches into `samples`.

Collectors, the import API and `fabricwatch import` all come through `Ingestor`. It runs
inside the caller's transaction, so a caller that fails half way (a malformed line, a lost
connection) rolls back everything and writes nothing; data is acknowledged only after
commit. Rows are staged with COPY and moved with INSERT .. ON CONFLICT DO NOTHING, which
makes a retried batch (a Celery task run twice) store no duplicates.
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, datetime
from typing import Any

from sqlalchemy import Connection, text

from service.telemetry import catalogue
from service.telemetry.partitions import ensure_partitions
from service.telemetry.promtext import PromLine
from service.telemetry.samples import Sample

# (metric, device, port, lane, priority, gpu)
SeriesKey = tuple[str, str, str | None, int | None, int | None, int | None]

_STAGE_DDL = ("CREATE TEMP TABLE IF NOT EXISTS ingest_stage "
              "(series_id int NOT NULL, ts_ms bigint NOT NULL, value float8 NOT NULL) ON COMMIT DELETE ROWS")
_MOVE_SQL = ("INSERT INTO samples (series_id, ts, value) "
             "SELECT series_id, timestamptz 'epoch' + ts_ms * interval '1 millisecond', value "
             "FROM ingest_stage ON CONFLICT DO NOTHING")


class IngestError(ValueError):
    """A sample that cannot be stored for a reason the caller must fix (not an unknown entity)."""


@dataclass
class IngestReport:
    received: int = 0
    written: int = 0
    duplicates: int = 0
    skipped_nan: int = 0
    unknown_metrics: Counter[str] = field(default_factory=Counter)
    unknown_devices: Counter[str] = field(default_factory=Counter)
    unknown_ports: Counter[str] = field(default_factory=Counter)
    invalid: Counter[str] = field(default_factory=Counter)

    @property
    def rejected(self) -> int:
        return (sum(self.unknown_metrics.values()) + sum(self.unknown_devices.values())
                + sum(self.unknown_ports.values()) + sum(self.invalid.values()) + self.skipped_nan)

    def to_dict(self, limit: int = 100) -> dict[str, Any]:
        def top(c: Counter[str]) -> dict[str, int]:
            return dict(c.most_common(limit))

        return {
            "received": self.received, "written": self.written, "duplicates": self.duplicates,
            "rejected": self.rejected, "skipped_nan": self.skipped_nan,
            "unknown_metrics": top(self.unknown_metrics), "unknown_devices": top(self.unknown_devices),
            "unknown_ports": top(self.unknown_ports), "invalid": top(self.invalid),
        }


class _Rejected:
    """Cache marker for a key that was rejected; counts where the rejection is reported."""

    __slots__ = ("bucket", "label")

    def __init__(self, bucket: Counter[str], label: str) -> None:
        self.bucket, self.label = bucket, label


class Ingestor:
    """Resolve samples to series and write them in COPY batches, inside `conn`'s transaction."""

    def __init__(self, conn: Connection, *, batch_rows: int = 50_000) -> None:
        self.conn = conn
        self.batch_rows = batch_rows
        self.report = IngestReport()
        self._series: dict[SeriesKey, int | _Rejected] = {}
        self._devices: dict[str, int] | None = None
        self._ports: dict[int, dict[str, int]] = {}
        self._pending: dict[SeriesKey, tuple[int | None, int | None, bool]] = {}
        self._rows: list[tuple[SeriesKey, int, float]] = []
        conn.execute(text(_STAGE_DDL))

    # -- adding -----------------------------------------------------------------------
    def add(self, s: Sample) -> None:
        key = (s.metric, s.device, s.port, s.lane, s.priority, s.gpu)
        self._add(key, s.ts_ms, s.value, s.counter_bits, s.saturating)

    def add_prom(self, line: PromLine, default_ts_ms: int) -> None:
        """Add one parsed exposition line; entity labels name the series, others are ignored."""
        labels = dict(line.labels)
        try:
            key = (line.name, labels.get("device", ""), labels.get("port"), _int_label(labels, "lane"),
                   _int_label(labels, "priority"), _int_label(labels, "gpu"))
        except ValueError as exc:
            self.report.received += 1
            self.report.invalid[f"line {line.line}: {exc}"] += 1
            return
        self._add(key, line.ts_ms if line.ts_ms is not None else default_ts_ms, line.value, None, False)

    def _add(self, key: SeriesKey, ts_ms: int, value: float, bits: int | None, saturating: bool) -> None:
        self.report.received += 1
        if math.isnan(value) or math.isinf(value):
            self.report.skipped_nan += 1
            return
        sid = self._series.get(key)
        if isinstance(sid, _Rejected):
            sid.bucket[sid.label] += 1
            return
        if sid is None and key not in self._pending:
            rejection = self._check(key)
            if rejection is not None:
                self._series[key] = rejection
                rejection.bucket[rejection.label] += 1
                return
            self._pending[key] = (self._device_id(key[1]), None, False)
        if sid is None:
            dev, _, _ = self._pending[key]
            if bits is not None:
                self._pending[key] = (dev, bits, saturating)
        self._rows.append((key, ts_ms, value))
        if len(self._rows) >= self.batch_rows:
            self.flush()

    # -- resolution -------------------------------------------------------------------
    def _device_id(self, name: str) -> int | None:
        if self._devices is None:
            self._devices = dict(self.conn.execute(text("SELECT name, id FROM devices")).all())
        return self._devices.get(name)

    def _device_ports(self, device_id: int) -> dict[str, int]:
        ports = self._ports.get(device_id)
        if ports is None:
            ports = dict(self.conn.execute(text("SELECT name, id FROM ports WHERE device_id = :d"),
                                           {"d": device_id}).all())
            self._ports[device_id] = ports
        return ports

    def _port_id(self, device_id: int, name: str) -> int | None:
        return self._device_ports(device_id).get(name)

    def _check(self, key: SeriesKey) -> _Rejected | None:
        metric, device, port, lane, priority, gpu = key
        mdef = catalogue.get(metric)
        r = self.report
        if mdef is None:
            return _Rejected(r.unknown_metrics, metric)
        if not device:
            return _Rejected(r.invalid, f"{metric}: missing label 'device'")
        given = {"port": port, "lane": lane, "priority": priority, "gpu": gpu}
        for label in mdef.labels[1:]:
            if given[label] is None:
                return _Rejected(r.invalid, f"{metric}: missing label {label!r}")
        dev_id = self._device_id(device)
        if dev_id is None:
            return _Rejected(r.unknown_devices, device)
        if port is not None and self._port_id(dev_id, port) is None:
            return _Rejected(r.unknown_ports, f"{device}:{port}")
        return None

    def _resolve_pending(self) -> None:
        if not self._pending:
            return
        rows = []
        for key, (dev_id, bits, saturating) in self._pending.items():
            metric, _, port, lane, priority, gpu = key
            port_id = self._port_id(dev_id, port) if port is not None and dev_id is not None else None
            rows.append({"metric": metric, "device_id": dev_id, "port_id": port_id, "lane": lane,
                         "priority": priority, "gpu": gpu, "bits": bits, "sat": saturating})
        self.conn.execute(text(
            "INSERT INTO series (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating) "
            "VALUES (:metric, :device_id, :port_id, :lane, :priority, :gpu, :bits, :sat) "
            "ON CONFLICT ON CONSTRAINT series_identity DO NOTHING"), rows)
        device_ids = sorted({r["device_id"] for r in rows})
        id_to_name = {v: k for k, v in (self._devices or {}).items()}
        port_names = {pid: name for d in device_ids for name, pid in self._device_ports(d).items()}
        found = self.conn.execute(text(
            "SELECT id, metric, device_id, port_id, lane, priority, gpu FROM series "
            "WHERE device_id = ANY(:ids)"), {"ids": device_ids}).all()
        for sid, metric, dev_id, port_id, lane, priority, gpu in found:
            port = port_names.get(port_id) if port_id is not None else None
            if port_id is not None and port is None:
                continue  # a port added after this ingest began; not in this batch
            self._series[(metric, id_to_name[dev_id], port, lane, priority, gpu)] = sid
        missing = [k for k in self._pending if k not in self._series]
        if missing:
            raise RuntimeError(f"series were not created for {len(missing)} keys, e.g. {missing[0]}")
        self._pending.clear()

    # -- writing ----------------------------------------------------------------------
    def flush(self) -> None:
        if not self._rows:
            return
        self._resolve_pending()
        lo = min(r[1] for r in self._rows)
        hi = max(r[1] for r in self._rows)
        ensure_partitions(self.conn, _day(lo), _day(hi))
        series = self._series
        raw = self.conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy("COPY ingest_stage (series_id, ts_ms, value) FROM STDIN") as copy:
            buf: list[str] = []
            for key, ts_ms, value in self._rows:
                buf.append(f"{series[key]}\t{ts_ms}\t{value!r}\n")
                if len(buf) >= 10_000:
                    copy.write("".join(buf))
                    buf.clear()
            if buf:
                copy.write("".join(buf))
        written = self.conn.execute(text(_MOVE_SQL)).rowcount
        self.conn.execute(text("TRUNCATE ingest_stage"))
        self.report.written += written
        self.report.duplicates += len(self._rows) - written
        self._rows.clear()

    def finish(self) -> IngestReport:
        self.flush()
        return self.report


def _int_label(labels: dict[str, str], name: str) -> int | None:
    v = labels.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"label {name}={v!r} is not an integer") from None


def _day(ts_ms: int) -> Any:
    return datetime.fromtimestamp(ts_ms / 1000, tz=UTC).date()
