"""Prometheus remote-write 1.0 receiver: snappy-compressed protobuf WriteRequest -> exporter mappings ->
the one ingest path, in one transaction.

Prometheus, vmagent and Grafana Alloy send what they scrape; what maps onto the catalogue
(service/telemetry/exporters) is stored, the rest is counted per reason and reported (the answer's
headers, GET /api/v1/write/status, /metrics), never stored. Errors follow the spec's retry rules:
a 4xx is never retried, so it is kept for data that would fail again (corrupt snappy, not a
WriteRequest, a timestamp that is not milliseconds); a 5xx (the database away) is retried.
"""

from __future__ import annotations

import threading
import time
from collections import Counter
from collections.abc import Callable
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import cramjam
import numpy as np
from google.protobuf.message import DecodeError
from google.protobuf.unknown_fields import UnknownFieldSet
from prometheus_client import Counter as PromCounter
from sqlalchemy import Connection, Engine

from service.telemetry import remote_write_columns as columns
from service.telemetry.exporters import Mapper, MapResult
from service.telemetry.exporters.store import store_mapped
from service.telemetry.ingest import _MAX_TS_MS, _MIN_TS_MS, IngestReport, timestamp_problem
from service.telemetry.remote_write_pb2 import Label, LabelSet, RawWriteRequest

if TYPE_CHECKING:
    from service.shards.topology import Topology
    from service.telemetry.exporters.mapper import SeriesKey

REMOTE_WRITE_SAMPLES = PromCounter(
    "fabricwatch_remote_write_samples", "Remote-write samples received, by outcome: stored, duplicate, or "
    "the reason they were not stored (unmapped_metric, unknown_instance, unknown_port, ...)", ["outcome"])
REMOTE_WRITE_REQUESTS = PromCounter(
    "fabricwatch_remote_write_requests", "Remote-write requests, by answer status", ["status"])

_WIRE = {0: "varint", 1: "64-bit", 2: "length-delimited", 5: "32-bit"}


class RemoteWriteError(ValueError):
    """A request that would fail again: answered 4xx (`status`), never retried by the sender."""

    def __init__(self, status: int, title: str, detail: str) -> None:
        super().__init__(detail)
        self.status, self.title, self.detail = status, title, detail


def _uvarint(data: bytes) -> int:
    """The snappy block's leading varint: its decompressed length."""
    n = shift = 0
    for i, b in enumerate(data[:10]):
        n |= (b & 0x7F) << shift
        if not b & 0x80:
            return n
        shift += 7
        if i == 9:
            break
    raise RemoteWriteError(400, "Malformed body", "snappy: the block's length header is not a varint")


def decompress(body: bytes, limit: int) -> bytes:
    """Snappy block format (not framed), refusing a block that says it is larger than `limit`."""
    if not body:
        raise RemoteWriteError(400, "Malformed body", "empty body: a remote-write request is a snappy-compressed "
                               "WriteRequest")
    size = _uvarint(body)
    if size > limit:
        raise RemoteWriteError(413, "Body too large", f"decompressed body of {size} bytes exceeds the limit of "
                               f"{limit} bytes")
    try:
        return bytes(cramjam.snappy.decompress_raw(body))
    except cramjam.DecompressionError as exc:
        raise RemoteWriteError(400, "Malformed body", f"snappy: {exc} (Content-Encoding: snappy is the block "
                               "format, not the framed stream format)") from None


def _unknown(msg: Any, where: str) -> None:
    for f in UnknownFieldSet(msg):
        raise RemoteWriteError(400, "Not a WriteRequest", f"not a Prometheus remote-write 1.0 WriteRequest: {where} "
                               f"has field {f.field_number} ({_WIRE.get(f.wire_type, f.wire_type)}), which "
                               "prometheus.WriteRequest does not have")


def decode(raw: bytes) -> RawWriteRequest:
    """Parse a WriteRequest, its label sets left encoded (`labels` decodes one); a protobuf of another
    message (its fields do not fit) is refused."""
    try:
        req = RawWriteRequest.FromString(raw)
    except DecodeError as exc:
        raise RemoteWriteError(400, "Not a WriteRequest", f"protobuf: {exc}") from None
    _unknown(req, "the request")
    for i, ts in enumerate(req.timeseries):
        _unknown(ts, f"series {i}")
    return req


def labels(encoded: tuple[bytes, ...]) -> tuple[tuple[str, str], ...]:
    """A series' label pairs from its encoded Label messages (on the first sight of the label set)."""
    out = []
    for b in encoded:
        try:
            lbl = Label.FromString(b)
        except DecodeError as exc:
            raise RemoteWriteError(400, "Not a WriteRequest", f"protobuf: a label: {exc}") from None
        _unknown(lbl, "a label")
        out.append((lbl.name, lbl.value))
    if not any(name == "__name__" for name, _ in out):
        raise RemoteWriteError(400, "Malformed series", f"a series without __name__: {dict(out)!r}"[:300])
    return tuple(out)


@dataclass
class WriteReport:
    """What one request did: the mapping's counts and the store's."""

    mapped: MapResult
    stored: IngestReport
    histograms: int = 0

    def unmapped(self) -> Counter[str]:
        out = Counter(self.mapped.unmapped)
        if self.histograms:
            out["histogram"] += self.histograms
        # the store's own refusals (a lane the optic does not have, ...) are not stored either
        if self.stored.invalid:
            out["invalid"] += sum(self.stored.invalid.values())
        return out

    def headers(self) -> dict[str, str]:
        """Summary headers on the 204 (which has no body)."""
        unmapped = self.unmapped()
        return {"X-Fabricwatch-Samples": str(self.mapped.received), "X-Fabricwatch-Written": str(self.stored.written),
                "X-Fabricwatch-Duplicates": str(self.stored.duplicates),
                "X-Fabricwatch-Unmapped": ", ".join(f"{k}={v}" for k, v in sorted(unmapped.items())) or "none"}


@dataclass
class Totals:
    """Since this process started, for GET /api/v1/write/status."""

    requests: int = 0
    refused: Counter[str] = field(default_factory=Counter)  # status -> requests
    samples: int = 0
    written: int = 0
    duplicates: int = 0
    unmapped: Counter[str] = field(default_factory=Counter)
    details: dict[str, Counter[str]] = field(default_factory=dict)
    last_request_at: float | None = None
    last_error: str | None = None
    _lock: threading.Lock = field(default_factory=threading.Lock, repr=False)

    def add(self, report: WriteReport) -> None:
        with self._lock:
            self.requests += 1
            self.samples += report.mapped.received
            self.written += report.stored.written
            self.duplicates += report.stored.duplicates
            self.unmapped.update(report.unmapped())
            for reason, c in report.mapped.details.items():
                d = self.details.setdefault(reason, Counter())
                d.update(c)
                if len(d) > 1000:  # bounded: keep the most common
                    self.details[reason] = Counter(dict(d.most_common(500)))
            self.last_request_at = time.time()

    def refuse(self, status: int, detail: str) -> None:
        with self._lock:
            self.requests += 1
            self.refused[str(status)] += 1
            self.last_error = detail
            self.last_request_at = time.time()

    def to_dict(self, limit: int = 20) -> dict[str, Any]:
        with self._lock:
            return {"requests": self.requests, "refused": dict(self.refused), "samples": self.samples,
                    "written": self.written, "duplicates": self.duplicates, "unmapped": dict(self.unmapped),
                    "unmapped_detail": {r: dict(c.most_common(limit)) for r, c in self.details.items()},
                    "last_request_at": self.last_request_at, "last_error": self.last_error}


MAPPER = Mapper()
TOTALS = Totals()


def labels_of_set(encoded: bytes) -> tuple[tuple[str, str], ...]:
    """A series' label pairs from its encoded label section (the columnar reader's cache key)."""
    try:
        found = LabelSet.FromString(encoded)
    except DecodeError as exc:
        raise RemoteWriteError(400, "Not a WriteRequest", f"protobuf: labels: {exc}") from None
    out = []
    for lbl in found.labels:
        _unknown(lbl, "a label")
        out.append((lbl.name, lbl.value))
    if not any(name == "__name__" for name, _ in out):
        raise RemoteWriteError(400, "Malformed series", f"a series without __name__: {dict(out)!r}"[:300])
    return tuple(out)


def _check_ts(ts_ms: np.ndarray, name: Callable[[int], str]) -> None:
    bad = np.flatnonzero((ts_ms < _MIN_TS_MS) | (ts_ms >= _MAX_TS_MS))
    if len(bad):
        raise RemoteWriteError(400, "Bad timestamp", f"{name(int(bad[0]))}: {timestamp_problem(int(ts_ms[bad[0]]))}")


def _store(conn: Connection, mapped: MapResult, mapper: Mapper, batch_rows: int,
           topology: Topology | None) -> tuple[IngestReport, list[SeriesKey]]:
    if topology is None:
        return store_mapped(conn, mapped, mapper, batch_rows=batch_rows, source="remote write")
    from service.shards.ingest import store_mapped_routed

    return store_mapped_routed(conn, topology, mapped, mapper, batch_rows=batch_rows, source="remote write")


def write(engine: Engine, raw: bytes, req: RawWriteRequest | None = None, *, batch_rows: int = 50_000,
          mapper: Mapper = MAPPER, topology: Topology | None = None) -> WriteReport:
    """Map and store one decompressed WriteRequest in one transaction: all of it or nothing. With shards
    (`topology`), each series is stored on its device's shard, one transaction per shard
    (service/shards/ingest.py:store_mapped_routed): a shard that cannot be reached fails the request (503),
    and the sender's retry stores no duplicate of what the others committed. The usual
    layout is read as columns, which checks its framing (every label set is checked when first decoded);
    any other is parsed and checked whole by `decode` (or `req`, already decoded), and read message by
    message."""
    cols = columns.read(raw)
    if cols is None or not cols.keys:  # another layout, or no series: the strict parse says what it is
        req = req if req is not None else decode(raw)
        cols = None
    histograms = 0
    if cols is not None:
        who = np.repeat(np.arange(len(cols.keys)), cols.counts)
        _check_ts(cols.ts_ms, lambda at: dict(labels_of_set(cols.keys[int(who[at])])).get("__name__", "?"))
        with engine.begin() as conn:
            mapped = mapper.map_columns(conn, cols.keys, cols.counts, cols.ts_ms, cols.values, labels_of_set)
            stored, widths = _store(conn, mapped, mapper, batch_rows, topology)
    else:  # another layout (exemplars, histograms, field order): message by message
        assert req is not None
        series = []
        for ts in req.timeseries:
            key = tuple(ts.labels)
            samples = [(s.timestamp, s.value) for s in ts.samples]
            _check_ts(np.fromiter((t for t, _v in samples), np.int64, len(samples)),
                      lambda _at, key=key: dict(labels(key)).get("__name__", "?"))
            histograms += len(ts.histograms)
            series.append((key, samples))
        with engine.begin() as conn:
            mapped = mapper.map_keyed(conn, series, labels)
            stored, widths = _store(conn, mapped, mapper, batch_rows, topology)
    mapper.widths_stored(widths)  # committed
    report = WriteReport(mapped, stored, histograms)
    REMOTE_WRITE_SAMPLES.labels("stored").inc(stored.written)
    REMOTE_WRITE_SAMPLES.labels("duplicate").inc(stored.duplicates)
    for reason, n in report.unmapped().items():
        REMOTE_WRITE_SAMPLES.labels(reason).inc(n)
    TOTALS.add(report)
    return report
