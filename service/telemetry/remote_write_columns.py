"""A WriteRequest's series as columns, read with numpy: each series' encoded label set (the cache key
the exporter mapper knows it by), and its samples' timestamps and values as arrays.

Python touches each series once (to walk the top-level framing and cut its label bytes); the labels'
inner framing and the samples are read for all series at once, one numpy step per label or sample
position. This reads the layout Prometheus, vmagent and Alloy write: in each TimeSeries its labels,
then its samples, each sample `value` (field 1, omitted when 0) then `timestamp` (field 2, omitted
when 0). Anything else (exemplars, histograms, another field order) returns None and the caller reads
the request message by message. The request has been parsed and checked as a WriteRequest first
(remote_write.decode): this only reads it faster.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np

_LABEL, _SAMPLE, _METADATA = 0x0A, 0x12, 0x1A
_VALUE, _TIMESTAMP = 0x09, 0x10


@dataclass(frozen=True, slots=True)
class Columns:
    keys: list[bytes]  # per series: its labels as encoded (a prometheus.LabelSet message)
    counts: np.ndarray  # int64 per series: its samples
    ts_ms: np.ndarray  # int64 per sample, series after series
    values: np.ndarray  # float64 per sample


def _varints(buf: np.ndarray, at: np.ndarray, limit: int = 10) -> tuple[np.ndarray, np.ndarray]:
    """Unsigned varints at positions `at`: (values as uint64, byte lengths). Invalid ones (longer than
    `limit`) come back with length 0."""
    value = np.zeros(len(at), np.uint64)
    length = np.zeros(len(at), np.int64)
    open_ = np.ones(len(at), bool)
    last = len(buf) - 1
    for k in range(limit):
        pos = np.minimum(at + k, last)
        b = buf[pos].astype(np.uint64)
        live = open_ & (at + k <= last)
        value[live] |= (b[live] & np.uint64(0x7F)) << np.uint64(7 * k)
        done = live & (b < 0x80)
        length[done] = k + 1
        open_ &= ~done & live
        if not open_.any():
            break
    return value, length


def read(raw: bytes) -> Columns | None:
    """The columns of a WriteRequest in the usual layout; None for any other layout."""
    n = len(raw)
    starts: list[int] = []
    ends: list[int] = []
    i = 0
    while i < n:  # top level: series (field 1) and metadata (field 3)
        tag = raw[i]
        if tag != _LABEL and tag != _METADATA:
            return None
        length = shift = 0
        j = i + 1
        while True:
            if j >= n:
                return None
            b = raw[j]
            length |= (b & 0x7F) << shift
            j += 1
            if b < 0x80:
                break
            shift += 7
        if tag == _LABEL:
            starts.append(j)
            ends.append(j + length)
        i = j + length
    if i != n:
        return None
    buf = np.frombuffer(raw, np.uint8)
    start = np.array(starts, np.int64)
    end = np.array(ends, np.int64)
    cur = start.copy()
    last = n - 1
    # labels: every series at once, one label position per step
    while True:
        live = cur < end
        at = np.flatnonzero(live)
        if not len(at):
            break
        is_label = buf[np.minimum(cur[at], last)] == _LABEL
        at = at[is_label]
        if not len(at):
            break
        ln, w = _varints(buf, cur[at] + 1, 5)
        if (w == 0).any():
            return None
        cur[at] += 1 + w + ln.astype(np.int64)
    label_end = cur.copy()
    # samples: one sample position per step
    series_of: list[np.ndarray] = []
    ts_parts: list[np.ndarray] = []
    value_parts: list[np.ndarray] = []
    while True:
        at = np.flatnonzero(cur < end)
        if not len(at):
            break
        at = at[buf[cur[at]] == _SAMPLE]
        if not len(at):
            break
        ln, w = _varints(buf, cur[at] + 1, 5)
        if (w == 0).any():
            return None
        p = cur[at] + 1 + w
        stop = p + ln.astype(np.int64)
        value = np.zeros(len(at), np.float64)
        has_v = (p < stop) & (buf[np.minimum(p, last)] == _VALUE)
        if has_v.any():
            src = p[has_v] + 1
            if (src + 8 > stop[has_v]).any():
                return None
            value[has_v] = buf[src[:, None] + np.arange(8)].copy().view("<f8").ravel()
            p = p + 9 * has_v
        ts = np.zeros(len(at), np.int64)
        has_t = (p < stop) & (buf[np.minimum(p, last)] == _TIMESTAMP)
        if has_t.any():
            tv, tw = _varints(buf, p[has_t] + 1)
            if (tw == 0).any():
                return None
            ts[has_t] = tv.astype(np.int64)  # int64 two's complement, as protobuf encodes negatives
            p[has_t] += 1 + tw
        if (p != stop).any():
            return None
        series_of.append(at)
        ts_parts.append(ts)
        value_parts.append(value)
        cur[at] = stop
    if (cur != end).any():  # exemplars, histograms or another field after the samples
        return None
    if series_of:
        who = np.concatenate(series_of)
        order = np.argsort(who, kind="stable")  # series after series, each in its own order
        counts = np.bincount(who, minlength=len(start)).astype(np.int64)
        ts_ms = np.concatenate(ts_parts)[order]
        values = np.concatenate(value_parts)[order]
    else:
        counts = np.zeros(len(start), np.int64)
        ts_ms, values = np.zeros(0, np.int64), np.zeros(0, np.float64)
    keys = [raw[a:b] for a, b in zip(starts, label_end.tolist(), strict=True)]
    return Columns(keys, counts, ts_ms, values)
