"""The one ingest path: canonical samples -> series ids -> COPY batches into `samples`.

Collectors, the import API and `fabricwatch import` all come through `Ingestor`. It runs
inside the caller's transaction, so a caller that fails half way (a malformed line, a lost
connection) rolls back everything and writes nothing; data is acknowledged only after
commit. Rows are staged with COPY and moved with INSERT .. ON CONFLICT DO NOTHING, which
makes a retried batch (a Celery task run twice) store no duplicates.

Each distinct series seen gets a small local slot number on first sight; rows carry the
slot, and slots are resolved to series ids in bulk (one COPY of new series per batch).
"""

from __future__ import annotations

import math
from collections import Counter
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

from sqlalchemy import Connection, text

from service.telemetry import catalogue
from service.telemetry.partitions import ensure_partitions
from service.telemetry.promtext import PromLine
from service.telemetry.samples import Sample

# (metric, device, port, lane, priority, gpu)
SeriesKey = tuple[str, str, str | None, int | None, int | None, int | None]

_STAGE_DDL = """
CREATE TEMP TABLE IF NOT EXISTS ingest_stage
  (series_id int NOT NULL, ts_ms bigint NOT NULL, value float8 NOT NULL) ON COMMIT DELETE ROWS;
CREATE TEMP TABLE IF NOT EXISTS series_stage
  (metric text, device_id int, port_id int, lane smallint, priority smallint, gpu smallint,
   counter_bits smallint, saturating bool) ON COMMIT DELETE ROWS
"""
_MOVE_SQL = ("INSERT INTO samples (series_id, ts, value) "
             "SELECT series_id, timestamptz 'epoch' + ts_ms * interval '1 millisecond', value "
             "FROM ingest_stage ON CONFLICT DO NOTHING")
_NEW_SERIES_SQL = """
INSERT INTO series (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating)
SELECT DISTINCT ON (metric, device_id, port_id, lane, priority, gpu) * FROM series_stage
ON CONFLICT ON CONSTRAINT series_identity DO NOTHING
"""
_STAGED_IDS_SQL = """
SELECT s.id FROM series_stage st JOIN series s
  ON s.metric = st.metric AND s.device_id = st.device_id
 AND s.port_id IS NOT DISTINCT FROM st.port_id AND s.lane IS NOT DISTINCT FROM st.lane
 AND s.priority IS NOT DISTINCT FROM st.priority AND s.gpu IS NOT DISTINCT FROM st.gpu
ORDER BY st.ord
"""
_NULL = "\\N"
_REJECTED = -1


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


@dataclass(slots=True)
class _Slot:
    key: SeriesKey
    sid: int | None = None  # None until resolved; _REJECTED if rejected
    rejection: tuple[Counter[str], str] | None = None
    device_id: int | None = None
    port_id: int | None = None
    bits: int | None = None
    saturating: bool = False


class Ingestor:
    """Resolve samples to series and write them in COPY batches, inside `conn`'s transaction."""

    def __init__(self, conn: Connection, *, batch_rows: int = 50_000) -> None:
        self.conn = conn
        self.batch_rows = batch_rows
        self.report = IngestReport()
        self._slots: list[_Slot] = []
        self._by_key: dict[SeriesKey, int] = {}
        self._by_text: dict[str, int] = {}
        self._devices: dict[str, int] | None = None
        self._ports: dict[int, dict[str, int]] = {}
        self._pending: list[int] = []
        self._rows: list[tuple[int, int, float]] = []
        for ddl in _STAGE_DDL.split(";"):
            conn.execute(text(ddl))

    # -- adding -----------------------------------------------------------------------
    def add(self, s: Sample) -> None:
        key = (s.metric, s.device, s.port, s.lane, s.priority, s.gpu)
        slot = self._by_key.get(key)
        if slot is None:
            slot = self._new_slot(key)
        if s.counter_bits is not None and self._slots[slot].sid is None:
            self._slots[slot].bits, self._slots[slot].saturating = s.counter_bits, s.saturating
        self._add(slot, s.ts_ms, s.value)

    def add_prom(self, line: PromLine, default_ts_ms: int) -> None:
        """Add one parsed exposition line; entity labels name the series, others are ignored."""
        slot = self._by_text.get(line.series) if line.series else None
        if slot is None:
            labels = dict(line.labels)
            try:
                key = (line.name, labels.get("device", ""), labels.get("port"), _int_label(labels, "lane"),
                       _int_label(labels, "priority"), _int_label(labels, "gpu"))
            except ValueError as exc:
                self.report.received += 1
                self.report.invalid[f"line {line.line}: {exc}"] += 1
                return
            slot = self._by_key.get(key)
            if slot is None:
                slot = self._new_slot(key)
            if line.series:
                self._by_text[line.series] = slot
        self._add(slot, line.ts_ms if line.ts_ms is not None else default_ts_ms, line.value)

    def _add(self, slot: int, ts_ms: int, value: float) -> None:
        report = self.report
        report.received += 1
        if math.isnan(value) or math.isinf(value):
            report.skipped_nan += 1
            return
        st = self._slots[slot]
        if st.sid == _REJECTED:
            bucket, label = st.rejection  # type: ignore[misc]
            bucket[label] += 1
            return
        self._rows.append((slot, ts_ms, value))
        if len(self._rows) >= self.batch_rows:
            self.flush()

    def _new_slot(self, key: SeriesKey) -> int:
        slot = len(self._slots)
        st = _Slot(key)
        self._slots.append(st)
        self._by_key[key] = slot
        rejection = self._check(st)
        if rejection is not None:
            st.sid, st.rejection = _REJECTED, rejection
        else:
            self._pending.append(slot)
        return slot

    # -- resolution -------------------------------------------------------------------
    def _device_id(self, name: str) -> int | None:
        if self._devices is None:
            self._devices = dict(self.conn.execute(text("SELECT name, id FROM devices")).all())
        return self._devices.get(name)

    def _port_id(self, device_id: int, name: str) -> int | None:
        ports = self._ports.get(device_id)
        if ports is None:
            ports = dict(self.conn.execute(text("SELECT name, id FROM ports WHERE device_id = :d"),
                                           {"d": device_id}).all())
            self._ports[device_id] = ports
        return ports.get(name)

    def _check(self, st: _Slot) -> tuple[Counter[str], str] | None:
        metric, device, port, lane, priority, gpu = st.key
        mdef = catalogue.get(metric)
        r = self.report
        if mdef is None:
            return r.unknown_metrics, metric
        if not device:
            return r.invalid, f"{metric}: missing label 'device'"
        given = {"port": port, "lane": lane, "priority": priority, "gpu": gpu}
        for label in mdef.labels[1:]:
            if given[label] is None:
                return r.invalid, f"{metric}: missing label {label!r}"
        st.device_id = self._device_id(device)
        if st.device_id is None:
            return r.unknown_devices, device
        if port is not None:
            st.port_id = self._port_id(st.device_id, port)
            if st.port_id is None:
                return r.unknown_ports, f"{device}:{port}"
        return None

    def _resolve_pending(self) -> None:
        """Create the batch's new series in bulk and learn all their ids, in slot order."""
        if not self._pending:
            return
        raw = self.conn.connection.driver_connection
        with raw.cursor() as cur:
            cur.execute("ALTER TABLE series_stage ADD COLUMN IF NOT EXISTS ord int")
            with cur.copy("COPY series_stage (metric, device_id, port_id, lane, priority, gpu, counter_bits, "
                          "saturating, ord) FROM STDIN") as copy:
                for i, slot in enumerate(self._pending):
                    st = self._slots[slot]
                    copy.write_row((st.key[0], st.device_id, st.port_id, st.key[3], st.key[4], st.key[5],
                                    st.bits, st.saturating, i))
            cur.execute(_NEW_SERIES_SQL.replace("*", "metric, device_id, port_id, lane, priority, gpu, "
                                                     "counter_bits, saturating"))
            ids = [r[0] for r in cur.execute(_STAGED_IDS_SQL).fetchall()]
            cur.execute("TRUNCATE series_stage")
        if len(ids) != len(self._pending):
            raise RuntimeError(f"resolved {len(ids)} series ids for {len(self._pending)} new series")
        for slot, sid in zip(self._pending, ids, strict=True):
            self._slots[slot].sid = sid
        self._pending.clear()

    # -- writing ----------------------------------------------------------------------
    def flush(self) -> None:
        if not self._rows:
            return
        self._resolve_pending()
        rows = self._rows
        ensure_partitions(self.conn, _day(min(r[1] for r in rows)), _day(max(r[1] for r in rows)))
        slots = self._slots
        raw = self.conn.connection.driver_connection
        with raw.cursor() as cur, cur.copy("COPY ingest_stage (series_id, ts_ms, value) FROM STDIN") as copy:
            for start in range(0, len(rows), 10_000):
                copy.write("".join([f"{slots[s].sid}\t{t}\t{v!r}\n" for s, t, v in rows[start:start + 10_000]]))
        written = self.conn.execute(text(_MOVE_SQL)).rowcount
        self.conn.execute(text("TRUNCATE ingest_stage"))
        self.report.written += written
        self.report.duplicates += len(rows) - written
        self._rows = []

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


def _day(ts_ms: int) -> date:
    return datetime.fromtimestamp(ts_ms / 1000, tz=UTC).date()
