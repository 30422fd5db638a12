"""The one ingest path: canonical samples -> series ids -> binary COPY into `samples`.

Collectors, the import API and `fabricwatch import` all come through `Ingestor`. It runs
inside the caller's transaction, so a caller that fails half way (a malformed line, a lost
connection) rolls back everything and writes nothing; data is acknowledged only after commit.

Rows take one of two routes into `samples`:
- direct: a series created by this transaction cannot have stored rows (its id is unknown
  to anyone else until we commit), so while its timestamps increase its rows go straight
  in with a binary COPY. During `add_prom_lines` that COPY stays open while the caller
  keeps parsing, so the server stores rows in parallel with the parser;
- staged: rows of series that existed before, and a timestamp that does not increase
  within the input (possibly a duplicate), go through a temp table and INSERT .. ON
  CONFLICT DO NOTHING, so a re-import (or a retried Celery task) stores no duplicates and
  the report counts them.

Each distinct series gets a slot on first sight. New slots are resolved in bulk (devices
and ports looked up, series created); during `add_prom_lines` that happens on one worker
thread while parsing goes on, and rows of unresolved slots wait in compact arrays whose
size is capped, so memory stays bounded whatever the input size.
"""

from __future__ import annotations

import struct
from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, suppress
from dataclasses import dataclass, field
from datetime import UTC, date, datetime
from typing import Any

import psycopg
from sqlalchemy import Connection, text

from service.telemetry import catalogue
from service.telemetry.partitions import ensure_partitions
from service.telemetry.promtext import SHARED_CACHE_LIMIT, PromLine, PromSample
from service.telemetry.samples import Sample

# (metric, device, port, lane, priority, gpu)
SeriesKey = tuple[str, str, str | None, int | None, int | None, int | None]

_STAGE_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS samples_stage (series_id int NOT NULL, ts timestamptz NOT NULL, "
    "value float8 NOT NULL) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE IF NOT EXISTS series_stage (metric text, device_id int, port_id int, lane smallint, "
    "priority smallint, gpu smallint, counter_bits smallint, saturating bool, ord int) ON COMMIT DELETE ROWS",
)
_SAMPLES_COPY = "COPY samples (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
_STAGE_COPY = "COPY samples_stage (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
_MOVE_SQL = ("INSERT INTO samples (series_id, ts, value) SELECT series_id, ts, value FROM samples_stage "
             "ON CONFLICT DO NOTHING")
_SERIES_COPY = ("COPY series_stage (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating, "
                "ord) FROM STDIN")
_NEW_SERIES_SQL = """
INSERT INTO series (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating)
SELECT metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating FROM series_stage ORDER BY ord
ON CONFLICT ON CONSTRAINT series_identity DO NOTHING
RETURNING id, metric, device_id, port_id, lane, priority, gpu
"""
_STAGED_IDS_SQL = """
SELECT s.id FROM series_stage st JOIN series s
  ON s.metric = st.metric AND s.device_id = st.device_id
 AND s.port_id IS NOT DISTINCT FROM st.port_id AND s.lane IS NOT DISTINCT FROM st.lane
 AND s.priority IS NOT DISTINCT FROM st.priority AND s.gpu IS NOT DISTINCT FROM st.gpu
ORDER BY st.ord
"""
_REJECTED = -1
_NO_TS = -(1 << 64)  # below any timestamp

# Binary COPY: a row is field count, then (length, bytes) per field. The per-series head
# (3 fields, series id, length of ts) and per-timestamp part (ts, length of value) are
# packed once and reused; timestamptz is microseconds since 2000-01-01 UTC.
_COPY_HEADER = b"PGCOPY\n\xff\r\n\x00" + bytes(8)
_COPY_TRAILER = b"\xff\xff"
_ROW_HEAD = struct.Struct(">hiii")
_ROW_TS = struct.Struct(">qi")
_F8 = struct.Struct(">d").pack
_PG_EPOCH_MS = 946_684_800_000
_ROW_BYTES = 34  # 2 + (4 + 4) + (4 + 8) + (4 + 8)

_CHUNK_BYTES = 1 << 20  # direct rows go to the server in chunks of this size
_MAX_HELD_ROWS = 1_000_000  # rows held while series resolve: ~20 MB waiting, ~34 MB packed
_RESOLVE_MIN_SLOTS = 1024  # resolve new series in rounds of at least this many...
_RESOLVE_MIN_WAITING = 16_384  # ...or once this many rows wait for them
_TS_CACHE_LIMIT = 65_536


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
    index: int
    sid: int | None = None  # None until resolved; _REJECTED if rejected
    rejection: tuple[Counter[str], str] | None = None
    bits: int | None = None
    saturating: bool = False
    created: bool = False  # created by this transaction: no stored rows can conflict
    last_ts: int = _NO_TS  # newest timestamp sent direct
    head: bytes = b""  # binary COPY row head carrying the series id


@dataclass(frozen=True, slots=True)
class _Outcome:
    """What resolving one slot found: a series id, or why the series was rejected."""

    sid: int | None
    created: bool = False
    unknown: str = ""  # "device" or "port"
    label: str = ""


class _KnownSeries:
    """Series ids this process has resolved before, per database: collectors and pushes repeat the
    same series every poll. A hit is only a hint: `_Resolver` checks that the id still exists (a
    device or port leaving the inventory deletes its series) with one index probe per round,
    instead of staging the keys and joining them against `series`."""

    def __init__(self) -> None:
        self._by_db: dict[str, dict[SeriesKey, int]] = {}

    def of(self, database: str) -> dict[SeriesKey, int]:
        ids = self._by_db.get(database)
        if ids is None:
            if len(self._by_db) >= 8:  # tests and tools that switch databases
                self._by_db.clear()
            ids = self._by_db[database] = {}
        return ids


_KNOWN = _KnownSeries()

# Pure functions of the text, kept process-wide because pushes repeat the same series every poll:
# keys that pass the catalogue check (`Ingestor._check`), and exposition text -> such a key.
_VALID: dict[SeriesKey, SeriesKey] = {}
_VALID_KEYS: dict[str, SeriesKey] = {}


def _remember(cache: dict[Any, Any], k: Any, v: Any) -> None:
    if len(cache) >= SHARED_CACHE_LIMIT:
        cache.clear()
    cache[k] = v


class _Resolver:
    """Looks up devices and ports and creates series, in bulk. Only ever runs on one thread
    at a time (the worker, or the caller while no worker is busy)."""

    def __init__(self, raw: psycopg.Connection[Any]) -> None:
        self.raw = raw
        self._devices: dict[str, int] | None = None
        self._ports: dict[int, dict[str, int]] = {}
        info = raw.info
        self._known = _KNOWN.of(f"{info.host}:{info.port}/{info.dbname}")

    def resolve(self, wanted: list[tuple[SeriesKey, int | None, bool]]) -> list[_Outcome]:
        """Outcomes for (key, counter_bits, saturating), in order; creates missing series."""
        known = self._known
        hints = [known.get(k) for k, _, _ in wanted]
        hinted = [sid for sid in hints if sid is not None]
        if hinted:
            with self.raw.cursor() as cur:
                alive = {r[0] for r in cur.execute("SELECT id FROM series WHERE id = ANY(%s)", [hinted])}
            if len(alive) == len(hints):  # every key known and alive: the steady state of a poller
                return [_Outcome(sid) for sid in hinted]  # type: ignore[arg-type]
            rest = [w for w, sid in zip(wanted, hints, strict=True) if sid is None or sid not in alive]
            found = iter(self._resolve(rest))
            return [_Outcome(sid) if sid is not None and sid in alive else next(found) for sid in hints]
        return self._resolve(wanted)

    def _resolve(self, wanted: list[tuple[SeriesKey, int | None, bool]]) -> list[_Outcome]:
        with self.raw.cursor() as cur:
            if self._devices is None:
                self._devices = dict(cur.execute("SELECT name, id FROM devices").fetchall())
            devices = self._devices
            unseen = {devices[k[1]] for k, _, _ in wanted if k[1] in devices} - self._ports.keys()
            if unseen:
                for dev in unseen:
                    self._ports[dev] = {}
                for dev, name, pid in cur.execute("SELECT device_id, name, id FROM ports WHERE device_id = ANY(%s)",
                                                  [list(unseen)]):
                    self._ports[dev][name] = pid
            outcomes: list[_Outcome | None] = []
            to_create = []
            for key, bits, saturating in wanted:
                dev = devices.get(key[1])
                port = key[2]
                if dev is None:
                    outcomes.append(_Outcome(None, unknown="device", label=key[1]))
                elif port is not None and port not in self._ports[dev]:
                    outcomes.append(_Outcome(None, unknown="port", label=f"{key[1]}:{port}"))
                else:
                    outcomes.append(None)
                    to_create.append((key[0], dev, None if port is None else self._ports[dev][port], key[3], key[4],
                                      key[5], bits, saturating, len(outcomes) - 1))
            if to_create:
                for row, (sid, created) in zip(to_create, self._create(cur, to_create), strict=True):
                    outcomes[row[-1]] = _Outcome(sid, created=created)
                    if not created:  # committed by someone; ours may still roll back
                        _remember(self._known, wanted[row[-1]][0], sid)
        return [o for o in outcomes if o is not None]


    @staticmethod
    def _create(cur: psycopg.Cursor[Any], rows: list[tuple[Any, ...]]) -> list[tuple[int, bool]]:
        """(series id, created by us) per row; the join for ids runs only if some existed.

        The COPY payload is built in one piece: on the worker thread, every wait for the
        socket is a wait for the GIL too, so few large writes beat many small ones.
        """
        payload = "".join([f"{m}\t{d}\t{_txt(p)}\t{_txt(ln)}\t{_txt(pr)}\t{_txt(g)}\t{_txt(b)}\t"
                           f"{'t' if sat else 'f'}\t{o}\n" for m, d, p, ln, pr, g, b, sat, o in rows])
        with cur.copy(_SERIES_COPY) as copy:
            copy.write(payload)
        new = {tuple(r[1:]): r[0] for r in cur.execute(_NEW_SERIES_SQL).fetchall()}
        if len(new) == len(rows):
            ids = [new[r[:6]] for r in rows]
        else:
            ids = [r[0] for r in cur.execute(_STAGED_IDS_SQL).fetchall()]
        cur.execute("TRUNCATE series_stage")
        if len(ids) != len(rows):
            raise RuntimeError(f"resolved {len(ids)} series ids for {len(rows)} new series")
        created = set(new.values())
        return [(sid, sid in created) for sid in ids]


class Ingestor:
    """Resolve samples to series and write them with binary COPY, inside `conn`'s transaction.

    `batch_rows` bounds the rows staged (for ON CONFLICT) before they are moved, and the
    rows a non-streaming caller (`add`, `add_prom`) buffers before sending.
    """

    def __init__(self, conn: Connection, *, batch_rows: int = 50_000) -> None:
        self.conn = conn
        self.batch_rows = batch_rows
        self.report = IngestReport()
        self._raw: psycopg.Connection[Any] = conn.connection.driver_connection  # type: ignore[assignment]
        self._resolver = _Resolver(self._raw)
        self._slots: list[_Slot] = []
        self._by_key: dict[SeriesKey, _Slot] = {}
        self._by_text: dict[str, _Slot] = {}
        self._pending: list[_Slot] = []
        self._worker: ThreadPoolExecutor | None = None  # set while streaming
        self._inflight: tuple[Future[list[_Outcome]], list[_Slot]] | None = None
        self._waiting = _Held()
        self._direct = bytearray()
        self._staged = bytearray()
        self._copy: psycopg.Copy | None = None
        self._copy_stack = ExitStack()
        self._ts_parts: dict[int, bytes] = {}
        self._days: set[date] = set()
        for ddl in _STAGE_DDL:
            conn.execute(text(ddl))

    # -- adding -----------------------------------------------------------------------
    def add(self, s: Sample) -> None:
        key = (s.metric, s.device, s.port, s.lane, s.priority, s.gpu)
        slot = self._by_key.get(key) or self._new_slot(key)
        if s.counter_bits is not None and slot.sid is None:
            slot.bits, slot.saturating = s.counter_bits, s.saturating
        self._add(slot, s.ts_ms, s.value)

    def add_prom(self, line: PromLine, default_ts_ms: int) -> None:
        """Add one parsed exposition line; entity labels name the series, others are ignored."""
        slot = self._text_slot(line.series, (line.name, line.labels), line.line)
        if slot is not None:
            self._add(slot, line.ts_ms if line.ts_ms is not None else default_ts_ms, line.value)

    def add_prom_lines(self, samples: Iterable[PromSample], default_ts_ms: int,
                       on_progress: Callable[[int], None] | None = None) -> None:
        """Add a stream of parsed lines, storing them while the stream is still being parsed.

        The COPY into `samples` stays open and new series resolve on a worker thread for the
        duration of this call; both are closed (or aborted, on any error) before it returns.
        """
        self._worker = ThreadPoolExecutor(1, thread_name_prefix="ingest-resolve")
        fast = 0  # lines taken by the fast path below, added to `received` at the end
        try:
            fast = self._stream(samples, default_ts_ms, on_progress)
            self._resolve_all()
            self._send_direct(force=True)
            self._close_copy()
        except BaseException as exc:
            self._abort(exc)
            raise
        finally:
            self.report.received += fast
            self._worker.shutdown(wait=True)
            self._worker = None

    def _stream(self, samples: Iterable[PromSample], default_ts_ms: int,
                on_progress: Callable[[int], None] | None) -> int:
        """The per-line loop. Its inline fast path is the common case (a resolved series
        created here, an increasing timestamp, a finite value): pack the row into the direct
        buffer; anything else goes through `_add`. Returns how many lines took the fast path."""
        direct = self._direct  # flushed in place, so this alias stays valid
        send_at = _CHUNK_BYTES  # raised while a series round holds the connection
        last_ms: int | None = None
        last_part = b""
        fast = 0
        for n, (series, parsed, value, ts_ms, lineno) in enumerate(samples, 1):
            slot = parsed.tag
            if slot is None:
                slot = parsed.tag = self._text_slot(series, (parsed.name, parsed.labels), lineno)
                if slot is None:
                    continue
            if ts_ms is None:
                ts_ms = default_ts_ms
            if slot.created and ts_ms > slot.last_ts and value - value == 0.0:  # type: ignore[union-attr]
                if ts_ms != last_ms:
                    last_part = self._ts_parts.get(ts_ms) or self._ts_part(ts_ms)
                    last_ms = ts_ms
                slot.last_ts = ts_ms  # type: ignore[union-attr]
                direct += slot.head  # type: ignore[union-attr]
                direct += last_part
                direct += _F8(value)
                fast += 1
                if len(direct) >= send_at:
                    send_at = _CHUNK_BYTES if self._send_direct() else len(direct) + _CHUNK_BYTES
            else:
                self._add(slot, ts_ms, value)  # type: ignore[arg-type]
            if on_progress is not None and n % 10_000 == 0:
                on_progress(n)
        return fast

    def _text_slot(self, series: str, parsed: tuple[str, tuple[tuple[str, str], ...]], lineno: int) -> _Slot | None:
        """The slot for a `name{labels}` text; None (and counted) if a label is not an integer."""
        slot = self._by_text.get(series) if series else None
        if slot is None and (key := _VALID_KEYS.get(series)) is not None:
            slot = self._by_text[series] = self._by_key.get(key) or self._new_slot(key)
        if slot is None:
            name, label_pairs = parsed
            labels = dict(label_pairs)
            try:
                key = (name, labels.get("device", ""), labels.get("port"), _int_label(labels, "lane"),
                       _int_label(labels, "priority"), _int_label(labels, "gpu"))
            except ValueError as exc:
                self.report.received += 1
                self.report.invalid[f"line {lineno}: {exc}"] += 1
                return None
            slot = self._by_key.get(key) or self._new_slot(key)
            if series:
                self._by_text[series] = slot
                if key in _VALID:
                    _remember(_VALID_KEYS, series, key)
        return slot

    def _add(self, slot: _Slot, ts_ms: int, value: float) -> None:
        report = self.report
        report.received += 1
        if value - value != 0.0:  # NaN or +/-Inf
            report.skipped_nan += 1
            return
        self._route(slot, ts_ms, value)
        if slot.sid is None:
            held = len(self._waiting)
            if held % 4096 == 0:
                self._maybe_resolve()
                if held >= _MAX_HELD_ROWS:
                    self._resolve_all()
        elif len(self._direct) >= _CHUNK_BYTES:
            self._send_direct()
        elif len(self._staged) >= self.batch_rows * _ROW_BYTES:
            self._move_staged()

    def _route(self, slot: _Slot, ts_ms: int, value: float) -> None:
        """Put one finite value into the direct or staged buffer, or hold it until its slot resolves."""
        sid = slot.sid
        if sid is None:
            self._waiting.append(slot.index, ts_ms, value)
            return
        if sid == _REJECTED:
            bucket, label = slot.rejection  # type: ignore[misc]
            bucket[label] += 1
            return
        ts_part = self._ts_parts.get(ts_ms) or self._ts_part(ts_ms)
        if slot.created and ts_ms > slot.last_ts:
            slot.last_ts = ts_ms
            buf = self._direct
        else:
            buf = self._staged
        buf += slot.head
        buf += ts_part
        buf += _F8(value)

    def _ts_part(self, ts_ms: int) -> bytes:
        """The packed timestamp, cached (import files repeat few); makes sure its day's partition exists."""
        day = _day(ts_ms)
        if day not in self._days:
            self._free_connection()
            ensure_partitions(self.conn, day, day)
            self._days.add(day)
        if len(self._ts_parts) >= _TS_CACHE_LIMIT:
            self._ts_parts.clear()
        part = self._ts_parts[ts_ms] = _ROW_TS.pack((ts_ms - _PG_EPOCH_MS) * 1000, 8)
        return part

    def _new_slot(self, key: SeriesKey) -> _Slot:
        slot = _Slot(key, len(self._slots))
        self._slots.append(slot)
        self._by_key[key] = slot
        rejection = None
        if key not in _VALID:
            rejection = self._check(key)
            if rejection is None:
                _remember(_VALID, key, key)
        if rejection is not None:
            slot.sid, slot.rejection = _REJECTED, rejection
        else:
            self._pending.append(slot)
            if len(self._pending) % _RESOLVE_MIN_SLOTS == 0:
                self._maybe_resolve()
        return slot

    def _check(self, key: SeriesKey) -> tuple[Counter[str], str] | None:
        """Rejections that need no database: unknown metric, missing labels."""
        metric, device, port, lane, priority, gpu = key
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
        return None

    # -- resolution -------------------------------------------------------------------
    def _maybe_resolve(self, *, force: bool = False) -> None:
        """Apply a finished round; start the next one if enough new series are pending.

        With `force`, wait for the round in flight and resolve everything pending now.
        """
        if self._inflight is not None:
            future, slots = self._inflight
            if not force and not future.done():
                return
            self._inflight = None
            self._apply(slots, future.result())
        if not self._pending or not (force or len(self._pending) >= _RESOLVE_MIN_SLOTS
                                     or len(self._waiting) >= _RESOLVE_MIN_WAITING):
            return
        slots, self._pending = self._pending, []
        wanted = [(s.key, s.bits, s.saturating) for s in slots]
        self._close_copy()
        if self._worker is None or force:
            self._apply(slots, self._resolver.resolve(wanted))
        else:
            self._inflight = (self._worker.submit(self._resolver.resolve, wanted), slots)

    def _resolve_all(self) -> None:
        while self._inflight is not None or self._pending:
            self._maybe_resolve(force=True)

    def _apply(self, slots: list[_Slot], outcomes: list[_Outcome]) -> None:
        """Record resolved ids (or rejections), then route the rows that waited for them."""
        r = self.report
        for slot, o in zip(slots, outcomes, strict=True):
            if o.sid is None:
                bucket = r.unknown_devices if o.unknown == "device" else r.unknown_ports
                slot.sid, slot.rejection = _REJECTED, (bucket, o.label)
            else:
                slot.sid, slot.created, slot.head = o.sid, o.created, _ROW_HEAD.pack(3, 4, o.sid, 8)
        held, self._waiting = self._waiting, _Held()
        slot_list = self._slots
        for index, ts_ms, value in held:
            self._route(slot_list[index], ts_ms, value)

    # -- writing ----------------------------------------------------------------------
    def _free_connection(self) -> None:
        """Make the connection available for a statement: no COPY open, no round in flight."""
        self._close_copy()
        if self._inflight is not None:
            self._inflight[0].result()

    def _send_direct(self, *, force: bool = False) -> bool:
        """Send the packed direct rows down the COPY (kept open while streaming); False if
        they stay buffered because a series round holds the connection."""
        if not self._direct:
            return True
        if self._inflight is not None and not self._inflight[0].done():
            if not force and len(self._direct) < _MAX_HELD_ROWS * _ROW_BYTES:
                return False
            self._inflight[0].result()
        if self._copy is None:
            cur = self._copy_stack.enter_context(self._raw.cursor())
            self._copy = self._copy_stack.enter_context(cur.copy(_SAMPLES_COPY))
            self._copy.write(_COPY_HEADER)
        self._copy.write(self._direct)
        self.report.written += len(self._direct) // _ROW_BYTES
        self._direct.clear()  # in place: the streaming loop holds an alias
        if self._worker is None:
            self._close_copy()
        return True

    def _close_copy(self) -> None:
        if self._copy is not None:
            self._copy.write(_COPY_TRAILER)
            self._copy = None
            self._copy_stack.close()

    def _abort(self, exc: BaseException) -> None:
        """After an error: end the COPY as failed and let the round in flight finish, so the
        caller's rollback finds the connection idle."""
        if self._inflight is not None:
            self._inflight[0].exception()
            self._inflight = None
        if self._copy is not None:
            self._copy = None
            with suppress(Exception):  # the original error is the one to report
                self._copy_stack.__exit__(type(exc), exc, exc.__traceback__)

    def _move_staged(self) -> None:
        """Move staged rows with ON CONFLICT DO NOTHING: what conflicts is a duplicate."""
        staged_rows = len(self._staged) // _ROW_BYTES
        if not staged_rows:
            return
        self._free_connection()
        with self._raw.cursor() as cur:
            with cur.copy(_STAGE_COPY) as copy:
                copy.write(_COPY_HEADER)
                copy.write(self._staged)
                copy.write(_COPY_TRAILER)
            written = cur.execute(_MOVE_SQL).rowcount
            cur.execute("TRUNCATE samples_stage")
        self.report.written += written
        self.report.duplicates += staged_rows - written
        self._staged.clear()

    def flush(self) -> None:
        """Resolve pending series and store every buffered row."""
        self._resolve_all()
        self._send_direct(force=True)
        self._close_copy()
        self._move_staged()

    def finish(self) -> IngestReport:
        self.flush()
        return self.report


class _Held:
    """Rows waiting for their series to resolve, in compact typed arrays (20 bytes a row)."""

    __slots__ = ("slots", "ts", "values")

    def __init__(self) -> None:
        self.slots, self.ts, self.values = array("q"), array("q"), array("d")

    def append(self, slot: int, ts_ms: int, value: float) -> None:
        self.slots.append(slot)
        self.ts.append(ts_ms)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.slots)

    def __iter__(self) -> Iterator[tuple[int, int, float]]:
        return zip(self.slots, self.ts, self.values, strict=True)


def _int_label(labels: dict[str, str], name: str) -> int | None:
    v = labels.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"label {name}={v!r} is not an integer") from None


def _txt(v: int | None) -> str:
    return "\\N" if v is None else str(v)


def _day(ts_ms: int) -> date:
    return datetime.fromtimestamp(ts_ms / 1000, tz=UTC).date()
