"""The one ingest path: canonical samples -> series ids -> binary COPY into `sample_rows` / `sample_blocks`.

Collectors, the import API and `fabricwatch import` all come through `Ingestor`. It runs
inside the caller's transaction, so a caller that fails half way (a malformed line, a lost
connection) rolls back everything and writes nothing; data is acknowledged only after commit.

Rows take one of two routes into `samples`:
- direct: a series created by this transaction cannot have stored rows (its id is unknown
  to anyone else until we commit), so while its timestamps increase its rows go straight
  in with a binary COPY, sorted by (series, time) within each batch so the primary key
  fills in order. During `add_prom_blocks` (an import) they wait instead, up to
  `_MAX_BLOCKED_ROWS`, and go in as blocks: a series' samples of one day as one row of arrays
  in `sample_blocks` (one heap tuple and one key entry instead of one per sample; migration 0100);
- staged: rows of series that existed before, and a timestamp that does not increase
  within the input (possibly a duplicate), are first tried with a plain COPY under a
  savepoint (polls bring new timestamps); if one is stored already, they go through a
  temp table and INSERT .. ON CONFLICT DO NOTHING, so a re-import (or a retried Celery
  task) stores no duplicates and the report counts them. Where a block of their series spans
  their time, they are checked against the blocks too.

Each distinct series gets a slot on first sight. Series text this process resolved before
(a poller pushes the same series every interval) takes its id from a per-process cache, all
of a block's checked alive by one count. New slots are resolved in bulk (devices
and ports looked up, series created); during `add_prom_blocks` that happens on one worker
thread while parsing goes on, and rows of unresolved slots wait in arrays whose size is
capped, so memory stays bounded whatever the input size. Rows are routed a batch at a time
with numpy, never one Python step per row.
"""

from __future__ import annotations

from array import array
from collections import Counter
from collections.abc import Callable, Iterable, Iterator
from concurrent.futures import Future, ThreadPoolExecutor
from contextlib import ExitStack, contextmanager, suppress
from dataclasses import dataclass, field
from datetime import UTC, datetime, timedelta
from typing import TYPE_CHECKING, Any

import numpy as np
import psycopg

from service.telemetry import catalogue
from service.telemetry.backfill import Hours
from service.telemetry.copy_format import HEADER, ROW_BYTES, ROW_DTYPE, TRAILER, pack_blocks_in_parts, pack_rows
from service.telemetry.partitions import analyze_written, create_partitions
from service.telemetry.promtext import (
    CANONICAL_SERIES_RE,
    SHARED_CACHE_LIMIT,
    PromBlock,
    PromParseError,
    PromSample,
    iter_blocks,
    parse_series,
)
from service.telemetry.samples import Sample

if TYPE_CHECKING:  # not imported at run time: `fabricwatch import` runs without SQLAlchemy
    from sqlalchemy import Connection

# (metric, device, port, lane, priority, gpu)
SeriesKey = tuple[str, str, str | None, int | None, int | None, int | None]

# staging tables of the ON CONFLICT fallbacks, made on first use (per connection)
_STAGE_DDL = (
    "CREATE TEMP TABLE IF NOT EXISTS samples_stage (series_id int NOT NULL, ts timestamptz NOT NULL, "
    "value float8 NOT NULL) ON COMMIT DELETE ROWS",
    "CREATE TEMP TABLE IF NOT EXISTS series_stage (metric text, device_id int, port_id int, lane smallint, "
    "priority smallint, gpu smallint, counter_bits smallint, saturating bool, ord int) ON COMMIT DELETE ROWS",
)
_SAMPLES_COPY = "COPY sample_rows (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
_BLOCKS_COPY = "COPY sample_blocks (series_id, first_ts, last_ts, ts, vals) FROM STDIN (FORMAT BINARY)"
_STAGE_COPY = "COPY samples_stage (series_id, ts, value) FROM STDIN (FORMAT BINARY)"
_MOVE_SQL = ("INSERT INTO sample_rows (series_id, ts, value) SELECT series_id, ts, value FROM samples_stage "
             "ON CONFLICT DO NOTHING")
_SERIES_COPY = ("COPY series_stage (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating, "
                "ord) FROM STDIN")
# one row each (an array): far cheaper to load than a row per id
_ALIVE_SQL = "SELECT array(SELECT id FROM series WHERE id = ANY(%s::int[]))"
_COUNT_ALIVE_SQL = "SELECT count(*), pg_relation_filenode('series') FROM series WHERE id = ANY(%s::int[])"
_SERIES_IDS_SQL = "SELECT array(SELECT nextval('series_id_seq') FROM generate_series(1, %s))"
_SERIES_DIRECT_COPY = ("COPY series (id, metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating) "
                       "FROM STDIN")
_NEW_SERIES_SQL = """
INSERT INTO series (metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating)
SELECT metric, device_id, port_id, lane, priority, gpu, counter_bits, saturating FROM series_stage ORDER BY ord
ON CONFLICT ON CONSTRAINT series_identity DO NOTHING
RETURNING id
"""
_STAGED_IDS_SQL = """
SELECT s.id FROM series_stage st JOIN series s
  ON s.metric = st.metric AND s.device_id = st.device_id
 AND s.port_id IS NOT DISTINCT FROM st.port_id AND s.lane IS NOT DISTINCT FROM st.lane
 AND s.priority IS NOT DISTINCT FROM st.priority AND s.gpu IS NOT DISTINCT FROM st.gpu
ORDER BY st.ord
"""
_UNRESOLVED, _REJECTED = -2, -1  # series ids of slots without one
_NO_TS = np.iinfo(np.int64).min  # below any timestamp

_DAY_MS = 86_400_000
# While streaming an import, direct rows wait to be stored as blocks (a series' samples of a day as
# one row of arrays), up to this many (~100 MB: 10 samples of each of 400k series); a series with
# fewer than _MIN_BLOCK_SAMPLES samples of a day among them stays rows.
_MAX_BLOCKED_ROWS = 4 << 20
_MIN_BLOCK_SAMPLES = 4
_BLOCK_PART_SAMPLES = 1 << 18  # blocks are packed and sent in parts of about this many samples (~8 MB)
_BLOCKS_NEAR_SQL = ("SELECT EXISTS (SELECT 1 FROM sample_blocks WHERE series_id = ANY(%s::int[]) "
                    "AND last_ts >= %s AND first_ts <= %s)")
_MOVE_PAST_BLOCKS_SQL = """
INSERT INTO sample_rows (series_id, ts, value)
SELECT s.series_id, s.ts, s.value FROM samples_stage s
WHERE NOT EXISTS (SELECT 1 FROM sample_blocks b WHERE b.series_id = s.series_id
                  AND b.first_ts <= s.ts AND b.last_ts >= s.ts AND s.ts = ANY(b.ts))
ON CONFLICT DO NOTHING
"""

_CHUNK_BYTES = 1 << 20  # direct rows go to the server in chunks of this size
_MAX_HELD_ROWS = 1_000_000  # rows held while series resolve: ~20 MB waiting, ~34 MB packed
_RESOLVE_MIN_SLOTS = 1024  # resolve new series in rounds of at least this many...
_RESOLVE_MIN_WAITING = 16_384  # ...or once this many rows wait for them
_SERIES_PART_ROWS = 16_384  # new series are sent to PostgreSQL in parts of this many

# Imported timestamps are milliseconds since 1970, from 2000-01-01 to 2200-01-01 (excluded), the range the
# API's time parameters take (service/api/params.py). A value outside is another unit (seconds, µs, ns), or
# wrong: it would be stored decades away from its data and never read.
_MIN_TS_MS, _MAX_TS_MS = 946_684_800_000, 7_258_118_400_000
_MAX_LANES = 16  # the inventory's limit on an optic's lanes (inventory/schemas.py `Optic.lanes`)


def timestamp_problem(ts: int) -> str:
    """Why an imported timestamp is refused: the unit it looks like, and its date in that unit."""
    def at(ms: float) -> str:
        return datetime.fromtimestamp(ms / 1000, tz=UTC).isoformat(timespec="seconds").replace("+00:00", "Z")

    unit = "timestamps are milliseconds since 1970-01-01 UTC"
    for factor, name, fix in ((1000, "seconds", "multiply by 1000"), (1e-3, "microseconds", "divide by 1000"),
                              (1e-6, "nanoseconds", "divide by 1,000,000")):
        if _MIN_TS_MS <= ts * factor < _MAX_TS_MS:
            return f"timestamp {ts} looks like {name} ({at(ts * factor)}), not milliseconds; {unit}: {fix}"
    try:
        shown = f" ({at(ts)} as milliseconds)"
    except (OverflowError, ValueError, OSError):  # beyond the year 9999
        shown = ""
    return f"timestamp {ts}{shown} is not from 2000 to 2200; {unit}"


def check_line_time(ts_ms: int | None, lineno: int, source: str) -> None:
    """PromParseError if a line's timestamp is not milliseconds from 2000 to 2200 (`timestamp_problem`)."""
    if ts_ms is not None and not _MIN_TS_MS <= ts_ms < _MAX_TS_MS:
        raise PromParseError(lineno, timestamp_problem(ts_ms), source)


def check_block_times(block: PromBlock, source: str) -> tuple[int, int]:
    """A block's first and last timestamp; PromParseError at its first line whose timestamp is not
    milliseconds from 2000 to 2200 (a file in seconds, µs or ns is refused, not stored in 1970)."""
    ts_ms = block.ts_ms
    lo, hi = int(ts_ms.min()), int(ts_ms.max())
    if lo < _MIN_TS_MS or hi >= _MAX_TS_MS:
        at = np.argmax((ts_ms < _MIN_TS_MS) | (ts_ms >= _MAX_TS_MS))
        raise PromParseError(int(block.line_numbers(np.array([at]))[0]), timestamp_problem(int(ts_ms[at])), source)
    return lo, hi


class NothingStored(PromParseError):
    """An import whose samples were all refused: nothing was stored, and the report says why.
    `line` is the first sample line (refused too); the message leads with the likely cause."""

    def __init__(self, report: IngestReport, line: int, source: str) -> None:
        self.report = report
        super().__init__(line, f"nothing stored: {report.why_nothing_stored()}", source)
        self.args = (f"{source}: {self.reason}",)  # the message: about the whole input, not its line


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

    @property
    def nothing_stored(self) -> bool:
        """Samples came and none is stored, now or before (a re-import stores nothing new, and that is fine)."""
        return bool(self.received) and not self.written and not self.duplicates

    def why_nothing_stored(self) -> str:
        """The refusals, the most common first (the likely cause), for people."""
        import difflib

        def names(c: Counter[str], show: Callable[[str], str] = str, limit: int = 3) -> str:
            top = [show(k) for k, _ in c.most_common(limit)]
            return ", ".join(top) + (f" and {len(c) - limit} more" if len(c) > limit else "")

        def closest(name: str) -> str:
            near = difflib.get_close_matches(name, catalogue.METRICS, n=2, cutoff=0.6)
            return f"{name} (closest: {' or '.join(near)})" if near else f"{name} (nothing close)"

        causes = [
            (sum(self.unknown_metrics.values()), "name metrics not in the catalogue (docs/metrics.md): "
             + names(self.unknown_metrics, closest)),
            (sum(self.unknown_devices.values()), "name devices not in the inventory (load it first: "
             "fabricwatch inventory load FILE): " + names(self.unknown_devices)),
            (sum(self.unknown_ports.values()), "name ports not in the inventory: " + names(self.unknown_ports)),
            (sum(self.invalid.values()), "are invalid: " + names(self.invalid, limit=2)),
            (self.skipped_nan, "have a NaN or infinite value"),
        ]
        found = sorted((c for c in causes if c[0]), key=lambda c: -c[0])
        return f"all {self.received} samples were refused: " + "; ".join(f"{n} {why}" for n, why in found)

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
class _Resolution:
    """What resolving a round of keys found, by position: series ids (`_REJECTED` where none),
    whether this transaction created them, and why rejected ones are: ("device", "port" or "invalid", label)."""

    sids: np.ndarray
    created: np.ndarray
    rejected: dict[int, tuple[str, str]]

    @classmethod
    def empty(cls, n: int) -> _Resolution:
        return cls(np.full(n, _REJECTED, np.int64), np.zeros(n, bool), {})


@dataclass(slots=True)
class _KnownIds:
    """Series ids this process resolved before in one database, by key and by exposition text:
    collectors and pushes repeat the same series every poll. A hit is only a hint. The ids are
    checked to still exist (a device or port leaving the inventory deletes its series) with one count
    per round, instead of staging the keys and joining them against `series`; and to belong to the
    storage of `series` they were found in: a TRUNCATE, or the database dropped and created again,
    gives `series` new storage and lets ids be reused (tests truncate between tests; an operator may
    reset a database under a running service), so then every id is forgotten."""

    by_key: dict[SeriesKey, int] = field(default_factory=dict)
    by_text: dict[str, int] = field(default_factory=dict)
    storage: int | None = None  # pg_relation_filenode('series') the ids were found in

    def same_storage(self, storage: int) -> bool:
        """Whether the ids were found in this storage of `series`; if not, forget them and note it."""
        if storage == self.storage:
            return True
        self.by_key.clear()
        self.by_text.clear()
        self.storage = storage
        return False


_KNOWN: dict[str, _KnownIds] = {}  # per database


def _known_ids(database: str) -> _KnownIds:
    ids = _KNOWN.get(database)
    if ids is None:
        if len(_KNOWN) >= 8:  # tests and tools that switch databases
            _KNOWN.clear()
        ids = _KNOWN[database] = _KnownIds()
    return ids


# exposition text that takes a full parse -> its key, process-wide because pushes repeat the same
# series every poll (texts of the canonical shape take one regex match instead)
_TEXT_KEYS: dict[str, SeriesKey] = {}


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
        self._lanes: dict[int, int] = {}  # port id -> its optic's lanes (ports with an optic)
        info = raw.info
        self._known = _known_ids(f"{info.host}:{info.port}/{info.dbname}")
        self.known, self.known_texts = self._known.by_key, self._known.by_text  # emptied in place, never replaced

    def alive(self, sids: list[int]) -> set[int] | None:
        """Which of these remembered series ids still exist; None if all do (the common case, one count).
        None of them if `series` has new storage since they were remembered (they are forgotten)."""
        ids = "{" + ",".join(map(str, sids)) + "}"  # far cheaper than psycopg's per-element list dumper
        with self.raw.cursor() as cur:
            count, storage = cur.execute(_COUNT_ALIVE_SQL, [ids]).fetchone()
            if not self._known.same_storage(storage):
                return set()
            if count == len(set(sids)):
                return None
            return set(cur.execute(_ALIVE_SQL, [ids]).fetchone()[0])

    def resolve(self, keys: list[SeriesKey], bits: dict[int, tuple[int, bool]]) -> _Resolution:
        """Series ids for keys, in order, creating missing series; `bits` has (counter_bits,
        saturating) by position where the caller knows them."""
        if not self.known:  # e.g. a fresh process's import: nothing to look up
            return self._resolve(keys, bits)
        hints = list(map(self.known.get, keys))
        hinted = [sid for sid in hints if sid is not None]
        if not hinted:
            return self._resolve(keys, bits)
        alive = self.alive(hinted)
        out = _Resolution(np.array([_REJECTED if sid is None else sid for sid in hints], np.int64),
                          np.zeros(len(keys), bool), {})
        rest = [i for i, sid in enumerate(hints) if sid is None or (alive is not None and sid not in alive)]
        if rest:
            found = self._resolve([keys[i] for i in rest], {j: bits[i] for j, i in enumerate(rest) if i in bits})
            out.sids[rest], out.created[rest] = found.sids, found.created
            out.rejected = {rest[j]: why for j, why in found.rejected.items()}
        return out

    def _resolve(self, keys: list[SeriesKey], bits: dict[int, tuple[int, bool]]) -> _Resolution:
        out = _Resolution.empty(len(keys))
        with self.raw.cursor() as cur:
            # what this round finds is remembered for the storage of `series` it is found in
            self._known.same_storage(cur.execute("SELECT pg_relation_filenode('series')").fetchone()[0])
            if self._devices is None:
                self._devices = dict(cur.execute("SELECT name, id FROM devices").fetchall())
            devices, ports = self._devices, self._ports
            unseen = {devices[k[1]] for k in keys if k[1] in devices} - ports.keys()
            if unseen:
                for dev in unseen:
                    ports[dev] = {}
                for dev, name, pid, lanes in cur.execute(
                        "SELECT p.device_id, p.name, p.id, o.lanes FROM ports p LEFT JOIN optics o ON o.port_id = p.id "
                        "WHERE p.device_id = ANY(%s)", [list(unseen)]):
                    ports[dev][name] = pid
                    if lanes is not None:
                        self._lanes[pid] = lanes
            at: list[int] = []  # positions of the keys whose device (and port) exist
            rows: list[tuple[SeriesKey, int, int | None, int | None, bool]] = []
            for i, key in enumerate(keys):
                dev = devices.get(key[1])
                port = key[2]
                if dev is None:
                    out.rejected[i] = ("device", key[1])
                elif port is None:
                    at.append(i)
                    rows.append((key, dev, None, *bits.get(i, (None, False))))
                elif (pid := ports[dev].get(port)) is None:
                    out.rejected[i] = ("port", f"{key[1]}:{port}")
                elif key[3] is not None and not 0 <= key[3] < self._lanes.get(pid, _MAX_LANES):
                    out.rejected[i] = ("invalid", self._lane_problem(key, pid))
                else:
                    at.append(i)
                    rows.append((key, dev, pid, *bits.get(i, (None, False))))
            if rows:
                self._lock_parents(cur, {r[1] for r in rows}, {r[2] for r in rows} - {None})
                out.sids[at], out.created[at] = self._create(cur, rows)
                for i in np.flatnonzero(~out.created[at]).tolist():  # committed by someone; ours may roll back
                    _remember(self.known, rows[i][0], int(out.sids[at[i]]))
        return out

    def _lane_problem(self, key: SeriesKey, pid: int) -> str:
        """Why a lane is refused: detection reads only the lanes the port's module has."""
        lanes = self._lanes.get(pid)
        where = f"{key[1]}:{key[2]} lane {key[3]}"
        if lanes is None:
            return f"{where}: lanes are 0-{_MAX_LANES - 1} (the port has no optic in the inventory)"
        return f"{where}: the port's optic has {lanes} lane{'s' if lanes > 1 else ''} (0-{lanes - 1})"

    @staticmethod
    def _lock_parents(cur: psycopg.Cursor[Any], devices: set[int], ports: set[int]) -> None:
        """Lock the devices and ports that new series name until commit, as foreign keys would (series
        have none, see migration 0080): a parent deleted meanwhile fails this ingest, which is retried."""
        for table, ids in (("devices", devices), ("ports", ports)):
            if ids:
                locked = cur.execute(f"SELECT count(*) FROM (SELECT 1 FROM {table} WHERE id = ANY(%s) "
                                     "FOR KEY SHARE) l", [list(ids)]).fetchone()[0]
                if locked != len(ids):
                    raise psycopg.errors.ForeignKeyViolation(
                        f"{len(ids) - locked} of the {table} named by new series were deleted during this ingest")

    def _create(self, cur: psycopg.Cursor[Any], rows: list[tuple[SeriesKey, int, int | None, int | None, bool]]
                ) -> tuple[np.ndarray, np.ndarray]:
        """Series ids, and whether we created them, for (key, device_id, port_id, counter_bits,
        saturating) rows.

        First try the common case, all new: take ids from the sequence and COPY the rows straight
        into `series`, under a savepoint. If one exists already (or another ingest creates it
        first) that fails on the unique key and the rows go through a staging table and
        INSERT .. ON CONFLICT, then a join for the ids of those that existed.

        The payload is built and sent in a few large parts, so that PostgreSQL stores one while the
        next is built (few: on the worker thread every wait for the socket is a wait for the GIL too).
        """
        ids = cur.execute(_SERIES_IDS_SQL, [len(rows)]).fetchone()[0]
        lines: list[str] = []
        try:
            with self.raw.transaction(), cur.copy(_SERIES_DIRECT_COPY) as copy:
                for at in range(0, len(rows), _SERIES_PART_ROWS):
                    part = _series_lines(rows[at:at + _SERIES_PART_ROWS])
                    lines += part
                    part_ids = ids[at:at + len(part)]
                    copy.write("".join([f"{sid}\t{line}\n" for sid, line in zip(part_ids, part, strict=True)]))
            return np.array(ids, np.int64), np.ones(len(ids), bool)
        except psycopg.errors.UniqueViolation:
            lines += _series_lines(rows[len(lines):])  # if it came before the last part was built
        _stage_tables(cur)
        with cur.copy(_SERIES_COPY) as copy:
            copy.write("".join([f"{line}\t{i}\n" for i, line in enumerate(lines)]))
        created = {r[0] for r in cur.execute(_NEW_SERIES_SQL).fetchall()}
        ids = [r[0] for r in cur.execute(_STAGED_IDS_SQL).fetchall()]
        cur.execute("TRUNCATE series_stage")
        if len(ids) != len(rows):
            raise RuntimeError(f"resolved {len(ids)} series ids for {len(rows)} new series")
        return np.array(ids, np.int64), np.isin(ids, list(created))


class Ingestor:
    """Resolve samples to series and write them with binary COPY, inside `conn`'s transaction.

    Rows are routed in vectorized batches: a PromBlock at a time, or the rows added one by one
    (`add`, `add_prom_sample`), which wait in `_rows` until there are `batch_rows` of them.
    `batch_rows` also bounds the rows staged (for ON CONFLICT) before they are moved.
    """

    def __init__(self, conn: Connection | psycopg.Connection[Any], *, batch_rows: int = 50_000) -> None:
        self.batch_rows = batch_rows
        self.report = IngestReport()
        self._raw: psycopg.Connection[Any] = (
            conn if isinstance(conn, psycopg.Connection) else conn.connection.driver_connection)  # type: ignore[assignment]
        self._resolver = _Resolver(self._raw)
        self._nslots = 0
        self._by_key: dict[SeriesKey, int] = {}  # -> slot index
        self._shape_checks: dict[tuple[Any, ...], tuple[Counter[str], str] | None] = {}  # see `_new_slots`
        self._rejections: dict[int, tuple[Counter[str], str]] = {}  # slot index -> (report bucket, label)
        self._by_text: dict[str, int] = {}  # exposition text -> slot index
        self._unhinted: list[str] = []  # texts given slots by `_text_slots`
        # per slot, by index: series id (or _UNRESOLVED / _REJECTED), created by this
        # transaction, newest timestamp sent direct
        self._sid = np.empty(0, np.int64)
        self._created = np.empty(0, bool)
        self._last_ts = np.empty(0, np.int64)
        # slots waiting for a round of resolution, their keys, and counter bits of slots given them
        self._pending: list[int] = []
        self._pending_keys: list[SeriesKey] = []
        self._bits: dict[int, tuple[int, bool]] = {}
        self._streaming = False  # inside add_prom_blocks: COPY kept open, rounds on a worker thread
        self._worker: ThreadPoolExecutor | None = None  # started by the first round while streaming
        self._inflight: tuple[Future[_Resolution], list[int]] | None = None
        self._rows = _Rows()  # added one by one, not yet routed
        self._held: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # waiting for their series
        self._held_rows = 0
        self._direct = bytearray()
        self._blocked: list[tuple[np.ndarray, np.ndarray, np.ndarray]] = []  # direct rows to store as blocks
        self._blocked_rows = 0
        self._staged = bytearray()
        self._copy: psycopg.Copy | None = None
        self._copy_stack = ExitStack()
        self._days: set[int] = set()
        self._wrote_blocks = False
        self._hours = Hours()  # of the rows stored: marked for the rollups at `finish` (telemetry/backfill.py)
        # the texts of the stream being added (`PromBlock.texts`), their slots (-1: lines refused, why)
        self._stream_texts: list[str] | None = None
        self._stream_slots = np.empty(0, np.int64)
        self._stream_refused: dict[int, str] = {}
        self._source = "body"  # the exposition's name in errors (`add_prom_blocks`)

    # -- adding -----------------------------------------------------------------------
    def add(self, s: Sample) -> None:
        key = (s.metric, s.device, s.port, s.lane, s.priority, s.gpu)
        index = self._by_key.get(key)
        if index is None:
            index = self._by_key[key] = self._new_slots([key])[0]
        if s.counter_bits is not None and self._sid[index] == _UNRESOLVED:
            self._bits[index] = (s.counter_bits, s.saturating)
        if len(self._pending) >= _RESOLVE_MIN_SLOTS:  # after the bits are noted: they go with the round
            self._maybe_resolve()
        self._add(index, s.ts_ms, s.value)

    def add_prom_sample(self, sample: PromSample, default_ts_ms: int) -> None:
        """Add one parsed exposition line; entity labels name the series, others are ignored."""
        series, parsed, value, ts_ms, lineno = sample
        check_line_time(ts_ms, lineno, self._source)
        index = self._text_slots([series], [(parsed.name, parsed.labels)])[0]
        if isinstance(index, str):
            self.report.received += 1
            self.report.invalid[f"line {lineno}: {index}"] += 1
        else:
            self._add(index, ts_ms if ts_ms is not None else default_ts_ms, value)

    def import_exposition(self, chunks: Iterable[bytes], source: str, default_ts_ms: int,
                          on_progress: Callable[[int], None] | None = None) -> IngestReport:
        """Store exposition text (UTF-8 bytes, in chunks of any size); the caller commits. A malformed
        line, or a timestamp in another unit than milliseconds, raises PromParseError; samples that
        were all refused (none stored now or before) raise NothingStored. The caller's rollback then
        leaves nothing written."""
        first = self.add_prom_blocks(iter_blocks(chunks, source), default_ts_ms, on_progress, source=source)
        report = self.finish()
        if report.nothing_stored:
            raise NothingStored(report, first, source)
        if report.written:  # an import may write days of history at once: see analyze_written
            days = [datetime.fromtimestamp(day * _DAY_MS / 1000, tz=UTC).date() for day in sorted(self._days)]
            with self._raw.cursor() as cur:
                analyze_written(cur, days, report.written, blocks=self._wrote_blocks)
        return report

    def add_prom_blocks(self, items: Iterable[PromBlock | PromSample], default_ts_ms: int,
                        on_progress: Callable[[int], None] | None = None, *, source: str = "body") -> int:
        """Add parsed exposition (`promtext.iter_blocks`), storing it while the stream is still parsed;
        the number of its first sample line (0 if none).

        The COPY into `samples` stays open and new series resolve on a worker thread for the
        duration of this call; both are closed (or aborted, on any error) before it returns.
        """
        lines = first = 0
        with self.streaming(source):
            for item in items:
                if not first:
                    first = item.first_line if isinstance(item, PromBlock) else item[4]
                if isinstance(item, PromBlock):
                    self.add_prom_block(item)
                    lines = item.first_line + len(item.codes) - 1
                else:
                    self.add_prom_sample(item, default_ts_ms)
                    lines = item[4]
                if on_progress is not None:
                    on_progress(lines)
        return first

    @contextmanager
    def streaming(self, source: str = "body") -> Iterator[None]:
        """Inside: parsed exposition is added (`add_prom_block`, `add_prom_sample`) and stored while the
        stream is still parsed (`add_prom_blocks`; a sharded import streams to each shard's Ingestor).
        The COPY into `samples` stays open and new series resolve on a worker thread until the block
        ends; both are closed on leaving it (or aborted, on any error)."""
        self._streaming, self._source = True, source
        try:
            yield
            self._route_rows()
            self._resolve_all()
            self._flush_blocks()
            self._send_direct(force=True)
            self._close_copy()
        except BaseException as exc:
            self._abort(exc)
            raise
        finally:
            self._streaming = False
            if self._worker is not None:
                self._worker.shutdown(wait=True)
                self._worker = None

    def add_prom_block(self, block: PromBlock) -> None:
        """Add a parsed block of lines (inside `streaming`)."""
        ts_ms = block.ts_ms
        lo, hi = check_block_times(block, self._source)
        # partitions first: while a round of new series (started below) holds the connection they
        # could not be created without waiting for it
        self._ensure_partitions(ts_ms, lo, hi)
        if block.texts is not self._stream_texts:  # a new stream
            self._stream_texts, self._stream_slots, self._stream_refused = block.texts, np.empty(0, np.int64), {}
        if len(block.texts) > len(self._stream_slots):
            self._map_stream_texts(block.texts[len(self._stream_slots):])
        idx = self._stream_slots[block.codes]
        values, ts_ms = block.values, block.ts_ms
        refused = idx < 0
        if refused.any():
            r = self.report
            at = np.flatnonzero(refused)
            r.received += len(at)
            for line, code in zip(block.line_numbers(at).tolist(), block.codes[at].tolist(), strict=True):
                r.invalid[f"line {line}: {self._stream_refused[code]}"] += 1
            keep = ~refused
            idx, values, ts_ms = idx[keep], values[keep], ts_ms[keep]
        self._maybe_resolve()
        self._route(idx, ts_ms, values)

    def _map_stream_texts(self, texts: list[str]) -> None:
        """Slots for texts new to the stream (`StreamTexts`), appended to `_stream_slots`: -1 for a
        text whose lines are refused, with the reason in `_stream_refused`."""
        by_text = self._by_text
        found = list(map(by_text.get, texts))
        if None in found and self._adopt_known(texts, found):
            found = list(map(by_text.get, texts))
        if None in found:  # series not seen by this ingestor yet
            new = [i for i, index in enumerate(found) if index is None]
            base = len(self._stream_slots)
            for i, got in zip(new, self._text_slots([texts[i] for i in new]), strict=True):
                if isinstance(got, str):
                    self._stream_refused[base + i], got = got, -1
                found[i] = got
        self._stream_slots = np.append(self._stream_slots, np.array(found, np.int64))

    def _adopt_known(self, texts: list[str], found: list[int | None]) -> bool:
        """Give slots in bulk to texts whose series this process resolved before and that still
        exist: a poller's pushes repeat the same series, and one count probe per block checks them
        all. True if any were adopted; the rest are parsed (`_text_slots`)."""
        known = self._resolver.known_texts
        if not known:
            return False
        new = dict.fromkeys([t for t, index in zip(texts, found, strict=True) if index is None])
        hinted = [(t, sid) for t, sid in zip(new, map(known.get, new), strict=True) if sid is not None]
        if not hinted:
            return False
        self._free_connection()
        alive = self._resolver.alive([sid for _, sid in hinted])
        if alive is not None:
            for t, sid in hinted:
                if sid not in alive:
                    known.pop(t, None)  # (all are gone already if `series` has new storage)
            hinted = [(t, sid) for t, sid in hinted if sid in alive]
        start = self._alloc(len(hinted))
        self._sid[start:self._nslots] = [sid for _, sid in hinted]
        self._by_text.update(zip([t for t, _ in hinted], range(start, self._nslots), strict=True))
        return bool(hinted)

    def _alloc(self, n: int) -> int:
        """Allocate n slots (unresolved); the first one's index."""
        start = self._nslots
        self._nslots += n
        if self._nslots > len(self._sid):  # grow the per-slot arrays
            grow = max(1024, len(self._sid), self._nslots - len(self._sid))
            self._sid = np.append(self._sid, np.full(grow, _UNRESOLVED, np.int64))
            self._created = np.append(self._created, np.zeros(grow, bool))
            self._last_ts = np.append(self._last_ts, np.full(grow, _NO_TS, np.int64))
        return start

    def _text_slots(self, texts: list[str], parsed: list[tuple[str, tuple[tuple[str, str], ...]]] | None = None
                    ) -> list[int | str]:
        """Slot indices for `name{labels}` texts new to this ingestor (parsed here unless given), or
        for each text whose samples are refused, why (a label that must be an integer is not)."""
        keys = _text_keys(texts, parsed)
        by_key = self._by_key
        new_keys = [k for k in dict.fromkeys(keys) if not isinstance(k, str) and k not in by_key]
        by_key.update(zip(new_keys, self._new_slots(new_keys), strict=True))
        if len(self._pending) >= _RESOLVE_MIN_SLOTS:
            self._maybe_resolve()
        out: list[int | str] = [k if isinstance(k, str) else by_key[k] for k in keys]
        given = [(t, o) for t, o in zip(texts, out, strict=True) if not isinstance(o, str)]
        self._by_text.update(given)
        self._unhinted.extend(t for t, _ in given)
        return out

    def _add(self, index: int, ts_ms: int, value: float) -> None:
        self._rows.append(index, ts_ms, value)
        if len(self._rows) >= self.batch_rows:
            self._route_rows()

    def _route_rows(self) -> None:
        rows, self._rows = self._rows, _Rows()
        if len(rows):
            idx, ts_ms, values = rows.arrays()
            self._ensure_partitions(ts_ms)
            self._maybe_resolve()
            self._route(idx, ts_ms, values)

    def _new_slots(self, keys: list[SeriesKey]) -> range:
        """Slots for keys without one (the caller maps the keys to them); those that pass the checks
        needing no database wait to be resolved (the caller starts a round when enough wait). The
        checks depend only on the key's metric and which labels it has, so they run once per shape."""
        indices = range(self._alloc(len(keys)), self._nslots)
        checks = self._shape_checks
        for index, key in zip(indices, keys, strict=True):
            shape = (key[0], not key[1], key[2] is None, key[3] is None, key[4] is None, key[5] is None)
            try:
                rejection = checks[shape]
            except KeyError:
                rejection = checks[shape] = self._check(key)
            if rejection is None:
                self._pending.append(index)
                self._pending_keys.append(key)
            else:
                self._sid[index], self._rejections[index] = _REJECTED, rejection
        return indices

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

    # -- routing ----------------------------------------------------------------------
    def _route(self, idx: np.ndarray, ts_ms: np.ndarray, values: np.ndarray) -> None:
        """Put rows (slot index, timestamp, value) into the direct or staged buffer, count
        what is refused, and hold rows whose series is not resolved yet. The callers have made
        sure the rows' day partitions exist (`_ensure_partitions`) when the rows came in."""
        sid = self._sid[idx]
        waiting = sid == _UNRESOLVED
        if waiting.any():
            self._held.append((idx[waiting], ts_ms[waiting], values[waiting]))
            self._held_rows += int(waiting.sum())
            ready = ~waiting
            idx, ts_ms, values, sid = idx[ready], ts_ms[ready], values[ready], sid[ready]
            if self._held_rows >= _MAX_HELD_ROWS:
                self._resolve_all()
        r = self.report
        r.received += len(idx)
        rejected = sid == _REJECTED
        if rejected.any():
            slots, counts = np.unique(idx[rejected], return_counts=True)
            for index, count in zip(slots.tolist(), counts.tolist(), strict=True):
                bucket, label = self._rejections[index]
                bucket[label] += count
        finite = np.isfinite(values)
        r.skipped_nan += int(np.count_nonzero(~finite & ~rejected))
        ok = finite & ~rejected
        if not ok.all():
            idx, ts_ms, values, sid = idx[ok], ts_ms[ok], values[ok], sid[ok]
        if not len(idx):
            return
        self._hours.add_times(ts_ms)
        # Sorted by (series, time): the (series_id, ts) key is then filled in order. The sort
        # is stable, so of two rows with one timestamp the first stays first (and is kept).
        order = np.lexsort((ts_ms, sid))
        idx, ts_ms, values, sid = idx[order], ts_ms[order], values[order], sid[order]
        first = np.ones(len(idx), bool)
        first[1:] = sid[1:] != sid[:-1]
        above_prev = np.ones(len(idx), bool)
        above_prev[1:] = ts_ms[1:] > ts_ms[:-1]
        direct = self._created[idx] & (ts_ms > self._last_ts[idx]) & (first | above_prev)
        if direct.any():
            np.maximum.at(self._last_ts, idx[direct], ts_ms[direct])
            if self._streaming:
                self._blocked.append((sid[direct], ts_ms[direct], values[direct]))
                self._blocked_rows += int(direct.sum())
            else:
                self._direct += pack_rows(sid[direct], ts_ms[direct], values[direct])
        if not direct.all():
            staged = ~direct
            self._staged += pack_rows(sid[staged], ts_ms[staged], values[staged])
        if len(self._direct) >= _CHUNK_BYTES:
            self._send_direct()
        if self._blocked_rows >= _MAX_BLOCKED_ROWS:
            self._flush_blocks()
        if len(self._staged) >= self.batch_rows * ROW_BYTES:
            self._move_staged()

    def _ensure_partitions(self, ts_ms: np.ndarray, lo: int | None = None, hi: int | None = None) -> None:
        """Make sure the day partitions of these timestamps exist (`lo`, `hi`: their bounds, if known)."""
        if not len(ts_ms):
            return
        if lo is None or hi is None:
            lo, hi = int(ts_ms.min()), int(ts_ms.max())
        first, last = lo // _DAY_MS, hi // _DAY_MS
        if first == last and first in self._days:
            return
        days = set(np.unique(ts_ms // _DAY_MS).tolist()) - self._days
        if days:
            self._free_connection()
            dates = [datetime.fromtimestamp(day * _DAY_MS / 1000, tz=UTC).date() for day in sorted(days)]
            with self._raw.cursor() as cur:
                create_partitions(cur, dates)
            self._days |= days

    # -- resolution -------------------------------------------------------------------
    def _maybe_resolve(self, *, force: bool = False) -> None:
        """Record a finished round and start the next one if enough new series are pending, then
        route the rows that waited (the next round runs meanwhile).

        With `force`, wait for the round in flight and resolve everything pending now.
        """
        resolved = False
        if self._inflight is not None:
            future, slots = self._inflight
            if not force and not future.done():
                return
            self._inflight = None
            self._record(slots, future.result())
            resolved = True
        if self._pending and (force or len(self._pending) >= _RESOLVE_MIN_SLOTS
                              or self._held_rows >= _RESOLVE_MIN_WAITING):
            slots, keys, bits = self._pending, self._pending_keys, self._bits
            self._pending, self._pending_keys = [], []
            if bits:
                self._bits = {}
                bits = {j: bits[index] for j, index in enumerate(slots) if index in bits}
            self._close_copy()
            if not self._streaming or force:
                self._record(slots, self._resolver.resolve(keys, bits))
                resolved = True
            else:
                if self._worker is None:
                    self._worker = ThreadPoolExecutor(1, thread_name_prefix="ingest-resolve")
                self._inflight = (self._worker.submit(self._resolver.resolve, keys, bits), slots)
        if resolved and self._held:
            held, self._held, self._held_rows = self._held, [], 0
            self._route(*(np.concatenate(column) for column in zip(*held, strict=True)))

    def _resolve_all(self) -> None:
        while self._inflight is not None or self._pending:
            self._maybe_resolve(force=True)

    def _record(self, slots: list[int], found: _Resolution) -> None:
        """Record resolved ids, or rejections."""
        index = np.array(slots, np.int64)
        self._sid[index], self._created[index] = found.sids, found.created
        r = self.report
        buckets = {"device": r.unknown_devices, "port": r.unknown_ports, "invalid": r.invalid}
        for j, (why, label) in found.rejected.items():
            self._rejections[slots[j]] = (buckets[why], label)

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
            if not force and len(self._direct) < _MAX_HELD_ROWS * ROW_BYTES:
                return False
            self._inflight[0].result()
        if self._copy is None:
            cur = self._copy_stack.enter_context(self._raw.cursor())
            self._copy = self._copy_stack.enter_context(cur.copy(_SAMPLES_COPY))
            self._copy.write(HEADER)
        self._copy.write(self._direct)
        self.report.written += len(self._direct) // ROW_BYTES
        self._direct.clear()
        if not self._streaming:
            self._close_copy()
        return True

    def _close_copy(self) -> None:
        if self._copy is not None:
            self._copy.write(TRAILER)
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

    def _flush_blocks(self) -> None:
        """Store the direct rows waiting for blocks: a series' samples of one day as one block if
        there are `_MIN_BLOCK_SAMPLES` of them, else as rows. They are direct rows (series created
        by this transaction, times increasing), so no block can repeat a stored sample."""
        if not self._blocked:
            return
        sid, ts_ms, values = (np.concatenate(column) for column in zip(*self._blocked, strict=True))
        self._blocked, self._blocked_rows = [], 0
        # A series' direct rows came in time order (each later than the last), so a stable sort by
        # series puts them in (series, time) order, and so (series, day, time).
        order = np.argsort(sid, kind="stable")
        sid, ts_ms, values = sid[order], ts_ms[order], values[order]
        day = ts_ms // _DAY_MS
        run_start = np.ones(len(sid), bool)
        run_start[1:] = (sid[1:] != sid[:-1]) | (day[1:] != day[:-1])
        counts = np.diff(np.append(np.flatnonzero(run_start), len(sid)))
        as_block = np.repeat(counts >= _MIN_BLOCK_SAMPLES, counts)
        if not as_block.all():
            as_rows = ~as_block
            self._direct += pack_rows(sid[as_rows], ts_ms[as_rows], values[as_rows])
            sid, ts_ms, values = sid[as_block], ts_ms[as_block], values[as_block]
            counts = counts[counts >= _MIN_BLOCK_SAMPLES]
        if len(counts):
            self._free_connection()
            with self._raw.cursor() as cur:
                _copy_rows(cur, _BLOCKS_COPY, pack_blocks_in_parts(sid, ts_ms, values, counts, _BLOCK_PART_SAMPLES))
            self.report.written += len(sid)
            self._wrote_blocks = True

    def _move_staged(self) -> None:
        """Store staged rows, which may repeat stored ones. Polls and pushes bring new timestamps, so
        first a plain COPY under a savepoint; if a row is already stored that fails on the primary
        key, and the rows go through a temp table and ON CONFLICT DO NOTHING: what conflicts is a
        duplicate."""
        staged_rows = len(self._staged) // ROW_BYTES
        if not staged_rows:
            return
        self._flush_blocks()  # first the direct rows that staged ones may repeat
        self._send_direct(force=True)
        self._free_connection()
        with self._raw.cursor() as cur:
            if self._near_blocks(cur):
                _stage_tables(cur)
                _copy_rows(cur, _STAGE_COPY, [self._staged])
                written = cur.execute(_MOVE_PAST_BLOCKS_SQL).rowcount
                cur.execute("TRUNCATE samples_stage")
            else:
                try:
                    with self._raw.transaction():
                        _copy_rows(cur, _SAMPLES_COPY, [self._staged])
                    written = staged_rows
                except psycopg.errors.UniqueViolation:
                    _stage_tables(cur)
                    _copy_rows(cur, _STAGE_COPY, [self._staged])
                    written = cur.execute(_MOVE_SQL).rowcount
                    cur.execute("TRUNCATE samples_stage")
        self.report.written += written
        self.report.duplicates += staged_rows - written
        self._staged.clear()

    def _near_blocks(self, cur: psycopg.Cursor[Any]) -> bool:
        """Whether a sample block of a staged row's series spans its time (a re-import of
        imported data): then staged rows are checked against blocks, not only stored rows."""
        rows = np.frombuffer(self._staged, ROW_DTYPE)
        ids = "{" + ",".join(map(str, np.unique(rows["sid"]).tolist())) + "}"
        lo, hi = (datetime(2000, 1, 1, tzinfo=UTC) + timedelta(microseconds=int(t))
                  for t in (rows["ts"].min(), rows["ts"].max()))
        return bool(cur.execute(_BLOCKS_NEAR_SQL, [ids, lo, hi]).fetchone()[0])

    def flush(self) -> None:
        """Resolve pending series and store every buffered row."""
        self._route_rows()
        self._resolve_all()
        self._flush_blocks()
        self._send_direct(force=True)
        self._close_copy()
        self._move_staged()

    def finish(self) -> IngestReport:
        self.flush()
        # hours stored behind the rollup watermark are computed again by the rollup task (live pushes,
        # ahead of it, write no mark)
        with self._raw.cursor() as cur:
            self._hours.mark(cur, with_blocks=self._wrote_blocks)
        self._hours = Hours()
        self._remember_texts()
        return self.report

    def _remember_texts(self) -> None:
        """Remember the texts that were resolved one by one, for `_adopt_known` next time: those of
        series that existed before this transaction (which may still roll back its own)."""
        texts, self._unhinted = self._unhinted, []
        if not texts:
            return
        existed = (self._sid[:self._nslots] >= 0) & ~self._created[:self._nslots]
        if not existed.any():  # e.g. an import of new series: nothing to remember
            return
        index = np.fromiter(map(self._by_text.__getitem__, texts), np.int64, len(texts))
        sid, keep = self._sid[index], existed[index]
        known = self._resolver.known_texts
        if len(known) + len(texts) > SHARED_CACHE_LIMIT:
            known.clear()
        known.update(zip(np.array(texts, object)[keep].tolist(), sid[keep].tolist(), strict=True))


class _Rows:
    """Rows added one by one, in compact typed arrays (20 bytes a row) until routed together."""

    __slots__ = ("slots", "ts", "values")

    def __init__(self) -> None:
        self.slots, self.ts, self.values = array("q"), array("q"), array("d")

    def append(self, slot: int, ts_ms: int, value: float) -> None:
        self.slots.append(slot)
        self.ts.append(ts_ms)
        self.values.append(value)

    def __len__(self) -> int:
        return len(self.slots)

    def arrays(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        return (np.frombuffer(self.slots, np.int64), np.frombuffer(self.ts, np.int64),
                np.frombuffer(self.values, np.float64))


def _text_keys(texts: list[str], parsed: list[tuple[str, tuple[tuple[str, str], ...]]] | None = None
               ) -> list[SeriesKey | str]:
    """The series key of each valid `name{labels}` text (parsed here unless given), or why its samples
    are refused. Texts of the canonical shape take one match each, in one comprehension (an import's
    new series come by the hundred thousand); others are parsed, and remembered process-wide."""
    if parsed is not None:
        return [_parsed_key(t, p) for t, p in zip(texts, parsed, strict=True)]
    match = CANONICAL_SERIES_RE.fullmatch
    return [_parsed_key(t, None) if m is None else _canonical_key(*m.groups())
            for t, m in zip(texts, map(match, texts), strict=True)]


def _canonical_key(name: str, device: str, port: str | None, lane: str | None, priority: str | None,
                   gpu: str | None) -> SeriesKey:
    return (name, device, port, None if lane is None else int(lane), None if priority is None else int(priority),
            None if gpu is None else int(gpu))


def _parsed_key(series: str, parsed: tuple[str, tuple[tuple[str, str], ...]] | None) -> SeriesKey | str:
    key = _TEXT_KEYS.get(series)
    if key is not None:
        return key
    name, label_pairs = parsed or parse_series(series)
    labels = dict(label_pairs)
    try:
        key = (name, labels.get("device", ""), labels.get("port"), _int_label(labels, "lane"),
               _int_label(labels, "priority"), _int_label(labels, "gpu"))
    except ValueError as exc:
        return str(exc)
    _remember(_TEXT_KEYS, series, key)
    return key


def _int_label(labels: dict[str, str], name: str) -> int | None:
    v = labels.get(name)
    if v is None or v == "":
        return None
    try:
        return int(v)
    except ValueError:
        raise ValueError(f"label {name}={v!r} is not an integer") from None


def _series_lines(rows: list[tuple[SeriesKey, int, int | None, int | None, bool]]) -> list[str]:
    """`series` columns from metric to saturating in COPY's text format, for `_Resolver._create`'s rows."""
    n = "\\N"  # NULL
    return [f"{k[0]}\t{d}\t{n if p is None else p}\t{n if k[3] is None else k[3]}\t{n if k[4] is None else k[4]}\t"
            f"{n if k[5] is None else k[5]}\t{n if b is None else b}\t{'t' if sat else 'f'}"
            for k, d, p, b, sat in rows]


def _copy_rows(cur: psycopg.Cursor[Any], sql: str, parts: Iterable[bytes | bytearray]) -> None:
    """One whole binary COPY of packed rows, written part by part as they come."""
    with cur.copy(sql) as copy:
        copy.write(HEADER)
        for rows in parts:
            copy.write(rows)
        copy.write(TRAILER)


def _stage_tables(cur: psycopg.Cursor[Any]) -> None:
    for ddl in _STAGE_DDL:
        cur.execute(ddl)



def resolve_series(conn: psycopg.Connection[Any], keys: list[SeriesKey]) -> tuple[np.ndarray, dict[int, str]]:
    """Series ids for canonical keys, in order, creating the missing series as an ingest does (their
    devices and ports must exist); and, by position, why a key has none. For writers that store
    samples another way than through `Ingestor` (the simulator's chunk writer)."""
    found = _Resolver(conn).resolve(keys, {})
    return found.sids, {i: f"unknown {why} {label}" if why != "invalid" else label
                        for i, (why, label) in found.rejected.items()}
