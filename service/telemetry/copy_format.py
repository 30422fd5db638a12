"""Payloads in PostgreSQL's binary COPY format for `sample_rows` and `sample_blocks`, built with numpy.

A row is its field count, then (length, bytes) per field, big-endian; timestamptz is microseconds
since 2000-01-01 UTC; an array is (dimensions, has-nulls flag, element type, length, lower bound)
followed by its elements as fields.
"""

from __future__ import annotations

from collections.abc import Iterator

import numpy as np

HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
TRAILER = b"\xff\xff"
ROW_DTYPE = np.dtype([("fields", ">i2"), ("sid_len", ">i4"), ("sid", ">i4"), ("ts_len", ">i4"), ("ts", ">i8"),
                      ("value_len", ">i4"), ("value", ">f8")])
ROW_BYTES = ROW_DTYPE.itemsize  # 34
_PG_EPOCH_MS = 946_684_800_000
_TIMESTAMPTZ_OID, _FLOAT8_OID = 1184, 701
_ARRAY_HEAD = [("len", ">i4"), ("ndim", ">i4"), ("flags", ">i4"), ("oid", ">i4"), ("n", ">i4"), ("lower", ">i4")]
# a block row up to its first ts element: series_id, first_ts, last_ts, the ts array's header
_BLOCK_HEAD = np.dtype([("fields", ">i2"), ("sid_len", ">i4"), ("sid", ">i4"), ("first_len", ">i4"),
                        ("first", ">i8"), ("last_len", ">i4"), ("last", ">i8"),
                        *[(f"ts_{name}", kind) for name, kind in _ARRAY_HEAD]])
_VALS_HEAD = np.dtype(_ARRAY_HEAD)
_TS_ELEM = np.dtype([("len", ">i4"), ("v", ">i8")])
_VALUE_ELEM = np.dtype([("len", ">i4"), ("v", ">f8")])


def _pg_us(ts_ms: np.ndarray) -> np.ndarray:
    return (ts_ms - _PG_EPOCH_MS) * 1000


def pack_rows(sid: np.ndarray, ts_ms: np.ndarray, values: np.ndarray) -> bytes:
    """(series_id, ts, value) rows."""
    return pack_rows_us(sid, ts_ms * 1000, values)


def pack_rows_us(sid: np.ndarray, ts_us: np.ndarray, values: np.ndarray) -> bytes:
    """(series_id, ts, value) rows, times in Unix microseconds."""
    rows = np.empty(len(sid), ROW_DTYPE)
    rows["fields"], rows["sid_len"], rows["ts_len"], rows["value_len"] = 3, 4, 8, 8
    rows["sid"] = sid
    rows["ts"] = ts_us - _PG_EPOCH_MS * 1000
    rows["value"] = values
    return rows.tobytes()


def pack_blocks(sid: np.ndarray, ts_ms: np.ndarray, values: np.ndarray, counts: np.ndarray) -> bytes:
    """(series_id, first_ts, last_ts, ts[], vals[]) rows: one per run of `counts` consecutive samples
    (each run one series, sorted by time). Blocks of one length share a record layout, so they are
    built together; COPY takes rows in any order."""
    first = np.zeros(len(counts), np.int64)
    np.cumsum(counts[:-1], out=first[1:])
    us = _pg_us(ts_ms)
    parts = []
    for n in np.unique(counts).tolist():
        starts = first[counts == n]
        at = starts[:, None] + np.arange(n)  # each block's samples, a row per block
        rec = np.empty(len(starts), np.dtype([("head", _BLOCK_HEAD), ("ts", _TS_ELEM, (n,)),
                                              ("vals_head", _VALS_HEAD), ("vals", _VALUE_ELEM, (n,))]))
        head = rec["head"]
        head["fields"], head["sid_len"], head["first_len"], head["last_len"] = 5, 4, 8, 8
        head["sid"], head["first"], head["last"] = sid[starts], us[starts], us[starts + n - 1]
        head["ts_len"], head["ts_ndim"], head["ts_flags"], head["ts_oid"] = 20 + 12 * n, 1, 0, _TIMESTAMPTZ_OID
        head["ts_n"], head["ts_lower"] = n, 1
        vals_head = rec["vals_head"]
        vals_head["len"], vals_head["ndim"], vals_head["flags"], vals_head["oid"] = 20 + 12 * n, 1, 0, _FLOAT8_OID
        vals_head["n"], vals_head["lower"] = n, 1
        rec["ts"]["len"], rec["ts"]["v"] = 8, us[at]
        rec["vals"]["len"], rec["vals"]["v"] = 8, values[at]
        parts.append(rec.tobytes())
    return b"".join(parts)


def pack_blocks_in_parts(sid: np.ndarray, ts_ms: np.ndarray, values: np.ndarray, counts: np.ndarray,
                         part_samples: int) -> Iterator[bytes]:
    """`pack_blocks` in parts of about `part_samples` samples (whole blocks each), so that a COPY
    can store one part while the next is packed."""
    starts = np.zeros(len(counts) + 1, np.int64)
    np.cumsum(counts, out=starts[1:])
    cuts = np.unique(np.searchsorted(starts, np.arange(part_samples, starts[-1], part_samples)))
    for b0, b1 in zip([0, *cuts.tolist()], [*cuts.tolist(), len(counts)], strict=True):
        s0, s1 = starts[b0], starts[b1]
        if b1 > b0:
            yield pack_blocks(sid[s0:s1], ts_ms[s0:s1], values[s0:s1], counts[b0:b1])
