"""Exporter series -> catalogue samples with port identity resolved: the one function every
Prometheus-shaped source goes through (the remote-write receiver, the scrape collector).

    mapper = Mapper()                       # one per process: it remembers ranks and sums
    result = mapper.map(conn, series)       # series: [(labels, [(ts_ms, value), ...]), ...]
    result.samples                          # list[Sample], ready for Ingestor / ingest_samples
    result.report()                         # {"mapped_series": .., "unmapped": {reason: n}, ...}

`labels` is a tuple of (name, value) pairs with `__name__` among them (the remote-write order:
sorted by name), or a dict. Mapping a label set is cached per process, keyed by the tuple.

Two rules need more than one series, and a remote-write request may carry only part of a scrape
(Prometheus shards and batches series), so the mapper remembers, per catalogue series:
- rank: where two sources give one catalogue series (ethtool `rx_bytes_phy` and the kernel's
  `node_network_receive_bytes_total`), the best rank seen so far wins; samples of a worse rank are
  counted `superseded`, whichever request they come in.
- sums: a catalogue series that is the sum of several source series (NVLink CRC flit + data) is
  stored only at timestamps where all the parts seen so far for it arrived in the same batch;
  otherwise `incomplete_sum`. (A scrape collector maps whole scrapes, so this never fires there;
  Prometheus sends a scrape's samples together unless a queue shard fills: see docs/ecosystem.md.)
Duplicates of one part at one timestamp (MIG instances repeating a device field) keep the largest.
"""

from __future__ import annotations

import math
import threading
from collections import Counter, defaultdict
from collections.abc import Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from typing import Any

from sqlalchemy import Connection

from service.telemetry.exporters import dcgm_exporter, gnmic, native, node_exporter, snmp_exporter
from service.telemetry.exporters.base import Match, MatchFn, Reason, Unmapped
from service.telemetry.exporters.resolve import InventoryIndex
from service.telemetry.samples import Sample

# Tried in order; the first that claims a name (returns not None) decides.
MATCHERS: tuple[tuple[str, MatchFn], ...] = (
    ("catalogue", native.match),
    ("node_exporter", node_exporter.match),
    ("dcgm-exporter", dcgm_exporter.match),
    ("snmp_exporter", snmp_exporter.match),
    ("gnmic", gnmic.match),
)

LabelPairs = tuple[tuple[str, str], ...]
SeriesKey = tuple[str, str, str | None, int | None, int | None, int | None]  # metric, device, port, lane, prio, gpu

_CACHE_LIMIT = 1 << 20
_INDEX_CHECK_S = 5.0  # how often the inventory fingerprint is checked


def match_series(labels: Mapping[str, str]) -> tuple[str, Match | Unmapped]:
    """(exporter, what its mapping says) for one label set; exporter "" if no mapping claims it."""
    name = labels.get("__name__", "")
    for exporter, fn in MATCHERS:
        got = fn(name, labels)
        if got is not None:
            return exporter, got
    return "", Unmapped(Reason.UNMAPPED_METRIC, name or "(no __name__)")


@dataclass(frozen=True, slots=True)
class _Target:
    key: SeriesKey
    m: Match
    exporter: str


@dataclass
class MapResult:
    samples: list[Sample] = field(default_factory=list)
    series: int = 0
    mapped_series: int = 0
    received: int = 0  # samples in
    unmapped: Counter[str] = field(default_factory=Counter)  # reason -> samples
    details: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # reason -> what
    exporters: Counter[str] = field(default_factory=Counter)  # exporter -> samples mapped

    def count(self, reason: Reason | str, detail: str, n: int = 1) -> None:
        self.unmapped[str(reason)] += n
        self.details[str(reason)][detail] += n

    def report(self, limit: int = 20) -> dict[str, Any]:
        return {
            "series": self.series, "mapped_series": self.mapped_series, "received": self.received,
            "mapped": len(self.samples), "exporters": dict(self.exporters),
            "unmapped": dict(self.unmapped),
            "unmapped_detail": {r: dict(c.most_common(limit)) for r, c in self.details.items()},
        }


class Mapper:
    """Maps exporter series onto the catalogue; thread-safe, one per process."""

    def __init__(self) -> None:
        self._lock = threading.Lock()
        self._index: InventoryIndex | None = None
        self._checked = 0.0
        self._cache: dict[LabelPairs, _Target | Unmapped] = {}
        self._best_rank: dict[SeriesKey, int] = {}
        self._parts: dict[SeriesKey, int] = {}  # most parts seen at one timestamp for a summed series

    def index(self, conn: Connection, now: float) -> InventoryIndex:
        with self._lock:
            idx = self._index
            if idx is None or (now - self._checked > _INDEX_CHECK_S and idx.stale(conn)):
                idx = self._index = InventoryIndex.load(conn)
                self._cache.clear()
                self._best_rank.clear()
                self._parts.clear()
            if now - self._checked > _INDEX_CHECK_S:
                self._checked = now
            return idx

    def forget(self) -> None:
        """Drop the inventory index, cache and memory (tests; an inventory reload is noticed anyway)."""
        with self._lock:
            self._index = None
            self._checked = 0.0
            self._cache.clear()
            self._best_rank.clear()
            self._parts.clear()

    def _target(self, idx: InventoryIndex, labels: LabelPairs | Mapping[str, str]) -> _Target | Unmapped:
        key = labels if isinstance(labels, tuple) else tuple(sorted(labels.items()))
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        exporter, got = match_series(dict(key))
        if isinstance(got, Match):
            device, reason, what = idx.device(got.hosts, got.kind, exact=got.exact)
            if device is None:
                got = Unmapped(reason or Reason.UNKNOWN_INSTANCE, what)
            else:
                port = None
                if got.port is not None:
                    port = idx.port(device, got.port)
                    if port is None:
                        got = Unmapped(Reason.UNKNOWN_PORT, f"{device}:{got.port[1]}")
                if isinstance(got, Match):
                    got = _Target((got.metric, device, port, got.lane, got.priority, got.gpu), got, exporter)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = got
        return got

    def map(self, conn: Connection, series: Iterable[tuple[LabelPairs | Mapping[str, str],
                                                          Sequence[tuple[int, float]]]],
            *, now: float = 0.0) -> MapResult:
        import time

        idx = self.index(conn, now or time.monotonic())
        res = MapResult()
        # (key, ts) -> {(rank, part): value}
        cells: dict[tuple[SeriesKey, int], dict[tuple[int, str | None], float]] = defaultdict(dict)
        targets: dict[tuple[SeriesKey, int], _Target] = {}  # by (key, rank): counter widths differ by rank
        for labels, samples in series:
            res.series += 1
            n = len(samples)
            res.received += n
            t = self._target(idx, labels)
            if isinstance(t, Unmapped):
                res.count(t.reason, t.detail, n)
                continue
            res.mapped_series += 1
            m = t.m
            targets.setdefault((t.key, m.rank), t)
            for ts, v in samples:
                if not math.isfinite(v):
                    res.count(Reason.NOT_FINITE, m.metric)
                    continue
                if m.value_fn is not None:
                    conv = m.value_fn(v)
                    if conv is None:
                        res.count(Reason.BLANK_VALUE, f"{dict(labels).get('__name__', m.metric)}")
                        continue
                    v = conv
                v *= m.scale
                cell = cells[(t.key, ts)]
                part = (m.rank, m.component)
                prev = cell.get(part)
                cell[part] = v if prev is None else max(prev, v)
        self._assemble(cells, targets, res)
        return res

    def _assemble(self, cells: dict[tuple[SeriesKey, int], dict[tuple[int, str | None], float]],
                  targets: dict[tuple[SeriesKey, int], _Target], res: MapResult) -> None:
        best_rank, parts_seen = self._best_rank, self._parts
        with self._lock:
            for (key, _ts), cell in cells.items():
                low = min(r for r, _ in cell)
                if low < best_rank.get(key, 1 << 30):
                    best_rank[key] = low
            for (key, ts), cell in cells.items():
                best = best_rank[key]
                for (rank, _part) in cell:
                    if rank > best:
                        res.count(Reason.SUPERSEDED, key[0])
                parts = [v for (rank, _), v in cell.items() if rank == best]
                if not parts:
                    continue
                if any(p is not None for r, p in cell if r == best):  # a summed series
                    seen = parts_seen.get(key, 0)
                    if len(parts) < seen:
                        res.count(Reason.INCOMPLETE_SUM, key[0], len(parts))
                        continue
                    if len(parts) > seen:
                        parts_seen[key] = len(parts)
                t = targets[(key, best)]
                metric, device, port, lane, prio, gpu = key
                res.samples.append(Sample(metric, float(sum(parts)), ts, device, port, lane, prio, gpu,
                                          counter_bits=t.m.counter_bits, saturating=t.m.saturating))
                res.exporters[t.exporter] += 1
