"""Exporter series -> catalogue samples with port identity resolved: the one function every
Prometheus-shaped source goes through (the remote-write receiver, the scrape collector).

    mapper = Mapper()                       # one per process: it remembers ranks and sums
    result = mapper.map(conn, series)       # series: [(labels, [(ts_ms, value), ...]), ...]
    result.rows                             # per catalogue series: key, series text, counter width, points
    result.samples                          # the same as list[Sample], ready for Ingestor / ingest_samples
    result.report()                         # {"mapped_series": .., "unmapped": {reason: n}, ...}

`labels` is a tuple of (name, value) pairs with `__name__` among them (the remote-write order:
sorted by name), or a dict. Mapping a label set is cached per process, keyed by the tuple.
`map_keyed` takes any cache key and a function that decodes it into label pairs on a miss (remote write:
the encoded labels); `map_columns` takes series as columns and keeps the plain ones as columns
(`MapResult.block`) for the ingest's block path.

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

import threading
import time
from collections import Counter, defaultdict
from collections.abc import Callable, Hashable, Iterable, Mapping, Sequence
from dataclasses import dataclass, field
from math import isfinite
from typing import Any, NamedTuple

import numpy as np
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
    name: str  # the source metric name, for reports
    text: str  # the catalogue series as exposition text (the ingest path's series key)
    plain: bool  # value as is: no conversion, scale or sum
    width: bool  # a counter width (or saturation) to store with a new series


def series_text(key: SeriesKey) -> str:
    """`metric{device="..",port="..",lane=".."}`: the canonical exposition text of a catalogue series
    (inventory names never hold quotes or backslashes)."""
    metric, device, port, lane, prio, gpu = key
    parts = [f'device="{device}"']
    for name, v in (("port", port), ("lane", lane), ("priority", prio), ("gpu", gpu)):
        if v is not None:
            parts.append(f'{name}="{v}"')
    return f"{metric}{{{','.join(parts)}}}"


class Row(NamedTuple):
    """The readings of one catalogue series in a batch, in catalogue units (a tuple: a batch has one per
    series, hundreds of thousands, and a tuple is the cheapest to build)."""

    key: SeriesKey
    text: str
    counter_bits: int | None
    saturating: bool
    points: list[tuple[int, float]]


@dataclass(frozen=True, slots=True)
class Block:
    """Readings as columns (`map_columns`): catalogue series texts, and per reading its text's index,
    time and value; series without a counter width only (the ingest's block path takes none)."""

    texts: list[str]
    keys: list[SeriesKey]
    codes: np.ndarray  # int32
    ts_ms: np.ndarray  # int64
    values: np.ndarray  # float64


@dataclass
class MapResult:
    rows: list[Row] = field(default_factory=list)
    block: Block | None = None
    mapped: int = 0  # samples in rows and block
    series: int = 0
    mapped_series: int = 0
    received: int = 0  # samples in
    unmapped: Counter[str] = field(default_factory=Counter)  # reason -> samples
    details: dict[str, Counter[str]] = field(default_factory=lambda: defaultdict(Counter))  # reason -> what
    exporters: Counter[str] = field(default_factory=Counter)  # exporter -> samples mapped

    def count(self, reason: Reason | str, detail: str, n: int = 1) -> None:
        if not n:  # a series without samples (only a histogram, say)
            return
        self.unmapped[str(reason)] += n
        self.details[str(reason)][detail] += n

    @property
    def samples(self) -> list[Sample]:
        """The rows and the block as canonical samples (for Ingestor.add, ingest_samples)."""
        out = [Sample(r.key[0], v, ts, r.key[1], r.key[2], r.key[3], r.key[4], r.key[5], r.counter_bits,
                      r.saturating) for r in self.rows for ts, v in r.points]
        b = self.block
        if b is not None:
            for code, ts, v in zip(b.codes.tolist(), b.ts_ms.tolist(), b.values.tolist(), strict=True):
                k = b.keys[code]
                out.append(Sample(k[0], v, ts, k[1], k[2], k[3], k[4], k[5]))
        return out

    def report(self, limit: int = 20) -> dict[str, Any]:
        return {
            "series": self.series, "mapped_series": self.mapped_series, "received": self.received,
            "mapped": self.mapped, "exporters": dict(self.exporters),
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
        # series with a counter width that a committed write created or found: their width is in the
        # database, so their readings may go the block way, which carries none
        self._widths: set[SeriesKey] = set()

    def index(self, conn: Connection, now: float) -> InventoryIndex:
        with self._lock:
            idx = self._index
            if idx is None or (now - self._checked > _INDEX_CHECK_S and idx.stale(conn)):
                idx = self._index = InventoryIndex.load(conn)
                self._cache.clear()
                self._best_rank.clear()
                self._parts.clear()
                self._widths.clear()
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
            self._widths.clear()

    def width_known(self, key: SeriesKey) -> bool:
        """Whether a committed write stored this series (with its counter width) since the inventory loaded."""
        return key in self._widths

    def widths_stored(self, keys: Iterable[SeriesKey]) -> None:
        """Note series with a counter width that a write has just committed."""
        with self._lock:
            if len(self._widths) > _CACHE_LIMIT:
                self._widths.clear()
            self._widths.update(keys)

    def _target(self, idx: InventoryIndex, key: Hashable,
                decode: Callable[[Any], LabelPairs] | None = None) -> _Target | Unmapped:
        """What a series maps to, cached by `key` (its label pairs, or what `decode` turns into them)."""
        hit = self._cache.get(key)
        if hit is not None:
            return hit
        labels = dict(decode(key) if decode is not None else key)  # type: ignore[call-overload]
        exporter, got = match_series(labels)
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
                    skey = (got.metric, device, port, got.lane, got.priority, got.gpu)
                    got = _Target(skey, got, exporter, labels.get("__name__", got.metric), series_text(skey),
                                  got.component is None and got.value_fn is None and got.scale == 1.0,
                                  got.counter_bits is not None or got.saturating)
        if len(self._cache) >= _CACHE_LIMIT:
            self._cache.clear()
        self._cache[key] = got
        return got

    def map(self, conn: Connection, series: Iterable[tuple[LabelPairs | Mapping[str, str],
                                                          Sequence[tuple[int, float]]]],
            *, now: float = 0.0) -> MapResult:
        """Map series given as (labels, samples); labels as (name, value) pairs or a dict."""
        return self.map_keyed(conn, ((labels if isinstance(labels, tuple) else tuple(sorted(labels.items())),
                                      samples) for labels, samples in series), now=now)

    def map_keyed(self, conn: Connection, items: Iterable[tuple[Hashable, Sequence[tuple[int, float]]]],
                  decode: Callable[[Any], LabelPairs] | None = None, *, now: float = 0.0) -> MapResult:
        """Map series given as (cache key, samples): the key is the label pairs, or anything `decode` turns
        into them (remote write: the encoded labels, decoded only the first time a label set is seen)."""
        idx = self.index(conn, now or time.monotonic())
        res = MapResult()
        by_key: dict[SeriesKey, list[tuple[_Target, Sequence[tuple[int, float]]]]] = {}
        target, cache = self._target, self._cache
        n_series = n_samples = 0
        for key, samples in items:
            n_series += 1
            n_samples += len(samples)
            t = cache.get(key)
            if t is None:
                t = target(idx, key, decode)
            if t.__class__ is Unmapped:
                res.count(t.reason, t.detail, len(samples))  # type: ignore[union-attr]
                continue
            got = by_key.get(t.key)  # type: ignore[union-attr]
            if got is None:
                by_key[t.key] = [(t, samples)]  # type: ignore[union-attr,list-item]
            else:
                got.append((t, samples))  # type: ignore[arg-type]
        res.series, res.received = n_series, n_samples
        mapped_series = 0
        exporters: dict[str, int] = {}
        with self._lock:
            for key, contributions in by_key.items():
                mapped_series += len(contributions)
                if len(contributions) == 1 and contributions[0][0].m.component is None:
                    t, samples = contributions[0]
                    n = self._emit_one(key, t, samples, res)
                else:
                    t = contributions[0][0]
                    n = self._emit_combined(key, contributions, res)
                if n:
                    exporters[t.exporter] = exporters.get(t.exporter, 0) + n
        res.mapped_series = mapped_series
        res.exporters.update(exporters)
        return res

    def map_columns(self, conn: Connection, keys: Sequence[Hashable], counts: np.ndarray, ts_ms: np.ndarray,
                    values: np.ndarray, decode: Callable[[Any], LabelPairs], *, now: float = 0.0) -> MapResult:
        """`map_keyed` for series given as columns (remote_write_columns): per series its cache key and
        sample count, per sample its time and value. Series that are a catalogue series' only source in the
        batch, with plain values and no counter width, stay columns (`MapResult.block`); the others
        (ranks, sums, conversions, counter widths) go through `map_keyed`'s per-series rules."""
        idx = self.index(conn, now or time.monotonic())
        cache, target = self._cache, self._target
        targets = [cache.get(k) or target(idx, k, decode) for k in keys]
        offsets = np.zeros(len(keys) + 1, np.int64)
        np.cumsum(counts, out=offsets[1:])
        seen: dict[SeriesKey, int] = {}
        for t in targets:
            if t.__class__ is _Target:
                seen[t.key] = seen.get(t.key, 0) + 1  # type: ignore[union-attr]
        res = MapResult(series=len(keys), received=int(offsets[-1]))
        fast_code = [-1] * len(keys)  # per series: its index in the block's texts
        texts: list[str] = []
        block_keys: list[SeriesKey] = []
        slow: list[int] = []
        mapped_series = 0
        exporters: dict[str, int] = {}
        best_rank, widths = self._best_rank, self._widths
        n_of = counts.tolist()
        with self._lock:
            for i, t in enumerate(targets):
                if t.__class__ is not _Target:
                    res.count(t.reason, t.detail, n_of[i])  # type: ignore[union-attr]
                    continue
                mapped_series += 1
                key = t.key  # type: ignore[union-attr]
                if not t.plain or seen[key] > 1 or (t.width and key not in widths):  # type: ignore[union-attr]
                    slow.append(i)
                    continue
                rank = t.m.rank  # type: ignore[union-attr]
                best = best_rank.get(key)
                if best is None or rank < best:
                    best_rank[key] = rank
                elif rank > best:
                    res.count(Reason.SUPERSEDED, t.name, n_of[i])  # type: ignore[union-attr]
                    continue
                fast_code[i] = len(texts)
                texts.append(t.text)  # type: ignore[union-attr]
                block_keys.append(key)
                exporters[t.exporter] = exporters.get(t.exporter, 0) + n_of[i]  # type: ignore[union-attr]
        if texts:
            code = np.repeat(np.array(fast_code, np.int64), counts)
            keep = code >= 0
            finite = np.isfinite(values)
            bad = keep & ~finite
            if bad.any():
                which, n = np.unique(code[bad], return_counts=True)
                for c, k in zip(which.tolist(), n.tolist(), strict=True):
                    res.count(Reason.NOT_FINITE, block_keys[c][0], k)
            keep &= finite
            res.block = Block(texts, block_keys, code[keep].astype(np.int32), ts_ms[keep], values[keep])
            res.mapped += int(keep.sum())
        if slow:
            ts_list, v_list = ts_ms.tolist(), values.tolist()
            sub = self.map_keyed(conn, ((keys[i], list(zip(ts_list[offsets[i]:offsets[i + 1]],
                                                           v_list[offsets[i]:offsets[i + 1]], strict=True)))
                                        for i in slow), decode, now=now or time.monotonic())
            res.rows = sub.rows
            res.mapped += sub.mapped
            for reason, c in sub.details.items():
                for what, n in c.items():
                    res.count(reason, what, n)
            res.exporters.update(sub.exporters)
        res.mapped_series = mapped_series
        res.exporters.update(exporters)
        return res

    @staticmethod
    def _values(t: _Target, samples: Sequence[tuple[int, float]], res: MapResult) -> list[tuple[int, float]]:
        """(ts, value in catalogue units) of the readings; NaN, infinities and blanks counted."""
        m = t.m
        fn, scale = m.value_fn, m.scale
        if fn is None and scale == 1.0:
            out = [p for p in samples if isfinite(p[1])]
            if len(out) != len(samples):
                res.count(Reason.NOT_FINITE, t.name, len(samples) - len(out))
            return out  # type: ignore[return-value]
        out = []
        for ts, v in samples:
            if not isfinite(v):
                res.count(Reason.NOT_FINITE, t.name)
                continue
            if fn is not None:
                conv = fn(v)
                if conv is None:
                    res.count(Reason.BLANK_VALUE, t.name)
                    continue
                v = conv
            out.append((ts, float(v * scale)))
        return out

    def _emit_one(self, key: SeriesKey, t: _Target, samples: Sequence[tuple[int, float]], res: MapResult) -> int:
        """The common case: one source series for a catalogue series in this batch; the samples emitted."""
        best = self._best_rank.get(key)
        rank = t.m.rank
        if best is None or rank < best:
            self._best_rank[key] = rank
        elif rank > best:
            res.count(Reason.SUPERSEDED, t.name, len(samples))
            return 0
        points = self._values(t, samples, res)
        if points:
            res.rows.append(Row(key, t.text, t.m.counter_bits, t.m.saturating, points))
            res.mapped += len(points)
        return len(points)

    def _emit_combined(self, key: SeriesKey, contributions: list[tuple[_Target, Sequence[tuple[int, float]]]],
                       res: MapResult) -> int:
        """Several source series for one catalogue series: the best rank wins (remembered across batches);
        parts of a sum add up per timestamp, only when all the parts seen before are there; duplicates of one
        part (MIG instances repeating a device field) keep the largest."""
        low = min(t.m.rank for t, _ in contributions)
        best = self._best_rank.get(key)
        if best is None or low < best:
            self._best_rank[key] = best = low
        cells: dict[int, dict[str | None, float]] = defaultdict(dict)
        winner: _Target | None = None
        summed = False
        for t, samples in contributions:
            if t.m.rank > best:
                res.count(Reason.SUPERSEDED, t.name, len(samples))
                continue
            winner = winner or t
            summed = summed or t.m.component is not None
            for ts, v in self._values(t, samples, res):
                cell = cells[ts]
                prev = cell.get(t.m.component)
                cell[t.m.component] = v if prev is None else max(prev, v)
        if winner is None:
            return 0
        points = []
        for ts, cell in cells.items():
            if summed:
                seen = self._parts.get(key, 0)
                if len(cell) < seen:
                    res.count(Reason.INCOMPLETE_SUM, winner.name, len(cell))
                    continue
                if len(cell) > seen:
                    self._parts[key] = len(cell)
            points.append((ts, float(sum(cell.values()))))
        if points:
            res.rows.append(Row(key, winner.text, winner.m.counter_bits, winner.m.saturating, points))
            res.mapped += len(points)
        return len(points)
