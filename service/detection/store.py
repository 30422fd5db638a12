"""Persistence of detector state and cohort models (tables in models.py)."""

from __future__ import annotations

import json
import logging
import threading
import uuid
from collections.abc import Callable
from datetime import UTC, datetime
from typing import Any, TypeVar

import numpy as np
from sqlalchemy import Connection, text

from service.detection.archive import Archive
from service.detection.features import IF_FEATURES
from service.detection.forest import CohortModel, ModelFormatError, ModelStore
from service.detection.state import KINDS, Config, Fabric, FeatureState, coverage_map

log = logging.getLogger(__name__)
T = TypeVar("T")


def _dt(ms: int) -> datetime:
    return datetime.fromtimestamp(ms / 1000.0, tz=UTC)


def load_state(conn: Connection, name: str, fabric: Fabric, config: Config | None = None) -> FeatureState | None:
    row = conn.execute(text("SELECT blob, reservoir_gen, reservoir_rows FROM detector_state WHERE name = :n"),
                       {"n": name}).first()
    if row is None:
        return None
    st = FeatureState.from_bytes(bytes(row[0]), fabric, config)
    if row[1] is not None:  # else in the blob (saved by an older release): the next save stores it apart
        _load_reservoir(conn, name, row[1], row[2], st)
    return st


def _load_reservoir(conn: Connection, name: str, gen: str, rows: int, st: FeatureState) -> None:
    """The stored reservoir's chunks into `st`. One missing or malformed is logged, and the forest trains on
    the rows collected from then on (the stored models score on): nothing else of the state is lost."""
    chunks = conn.execute(text("SELECT first_row, n_rows, n_cols, x, c FROM detector_reservoir "
                               "WHERE name = :n AND gen = :g ORDER BY first_row"), {"n": name, "g": gen}).all()
    xs, cs, at = [], [], 0
    for first, n, cols, x, c in chunks:
        if first != at or len(x) != n * cols * 8 or len(c) != n * 8:
            log.warning("detector %r: training reservoir %s not used (chunk at row %d: expected row %d, %d x %d "
                        "float64 and %d cohorts, found %d and %d bytes); it fills again from this cycle",
                        name, gen, first, at, n, cols, n, len(x), len(c))
            return
        xs.append(np.frombuffer(x, "<f8").reshape(n, cols))
        cs.append(np.frombuffer(c, "<i8"))
        at += n
    if at != rows:
        log.warning("detector %r: training reservoir %s not used (%d rows stored of %d); it fills again from this "
                    "cycle", name, gen, at, rows)
        return
    if xs:
        st.reservoir_x, st.reservoir_c = np.concatenate(xs), np.concatenate(cs).astype(np.int64)
    st.reservoir_gen, st.reservoir_stored = gen, rows


def load_coverage(conn: Connection, name: str = "default") -> dict[int, dict[str, Any]]:
    """Per port id with any gap, what the saved detector state says of its rules' inputs:
    {"blocked_rules": {rule: why it cannot run}, "degraded_rules": {rule: [what it runs without]}}.

    Reads only those arrays of the state blob (archive members are read one by one), not the whole state."""
    row = conn.execute(text("SELECT blob FROM detector_state WHERE name = :n"), {"n": name}).first()
    if row is None:
        return {}
    with Archive(bytes(row[0])) as z:
        names = set(z.files)
        blocked = {k: z[f"blk|{k}"] for k in KINDS if f"blk|{k}" in names}
        degraded = {k: z[f"deg|{k}"] for k in KINDS if f"deg|{k}" in names}
        return coverage_map(z["port_ids"], blocked, degraded)


# The version of a stored state: its row's xmin (the transaction that wrote it: any write, by any client, changes
# it) with its saved_at (a write's time, so that an xid used again after a wraparound or a point-in-time restore
# is not taken for the old one) and its cycle columns.
Version = tuple[str, datetime, int | None, int]
_VERSION = "xmin::text, saved_at, last_cycle_ms, watermark_ms"


def save_state(conn: Connection, name: str, st: FeatureState) -> Version:
    """Write the state; returns the row's version as this transaction wrote it.

    The training reservoir is stored apart (detector_reservoir): the rows since the last save are appended as
    one chunk while the stored reservoir is this state's, else it is written anew (trimmed since, never stored,
    or another's: a rolled-back save, another database)."""
    st.reservoir_flush()
    stored = conn.execute(text("SELECT reservoir_gen, reservoir_rows FROM detector_state WHERE name = :n"),
                          {"n": name}).first()
    gen, start = st.reservoir_gen, st.reservoir_stored
    if gen is None or stored is None or tuple(stored) != (gen, start) or start > len(st.reservoir_c):
        conn.execute(text("DELETE FROM detector_reservoir WHERE name = :n"), {"n": name})
        gen, start = str(uuid.uuid4()), 0
    rows = len(st.reservoir_c)
    if rows > start:
        x = np.ascontiguousarray(st.reservoir_x[start:], "<f8")
        conn.execute(text("INSERT INTO detector_reservoir (name, gen, first_row, n_rows, n_cols, x, c) "
                          "VALUES (:n, :g, :f, :r, :k, :x, :c)"),
                     {"n": name, "g": gen, "f": start, "r": rows - start, "k": x.shape[1], "x": x.tobytes(),
                      "c": np.ascontiguousarray(st.reservoir_c[start:], "<i8").tobytes()})
    row = conn.execute(text(
        "INSERT INTO detector_state (name, watermark_ms, last_cycle_ms, ports, saved_at, blob, reservoir_gen, "
        "reservoir_rows) VALUES (:n, :w, :c, :p, now(), :b, :g, :r) ON CONFLICT (name) DO UPDATE SET "
        "watermark_ms = excluded.watermark_ms, last_cycle_ms = excluded.last_cycle_ms, ports = excluded.ports, "
        "saved_at = now(), blob = excluded.blob, reservoir_gen = excluded.reservoir_gen, "
        f"reservoir_rows = excluded.reservoir_rows RETURNING {_VERSION}"),
        {"n": name, "w": st.watermark_ms or 0, "c": st.last_cycle_ms, "p": st.fabric.P,
         "b": st.to_bytes(reservoir=False), "g": gen, "r": rows}).one()
    st.reservoir_gen, st.reservoir_stored = gen, rows
    return (row[0], row[1], row[2], row[3])


class StateCache:
    """A process's detector states between its cycles, so that a cycle reads the stored state only when another
    process wrote it since (a second worker, a restarted one, a pod move or `_drop_detection`: service/shards/
    rebalance.py) or this process's own save did not commit. Its cohort models too (`take_models`).

    `take` hands the state over (it is no longer held: a cycle that fails leaves nothing here, and the next one
    reads the stored state); `save` writes it and holds it with the version its write gave the row. The next
    `take` uses it only if the row still has that version, read in the taker's transaction, after the cycle's
    lock: a save whose transaction rolled back, or any later write, gives another version. The stored state
    stays the whole truth: a held one is only ever a copy of a committed row."""

    def __init__(self) -> None:
        self._held: dict[tuple[str, str], tuple[Version, FeatureState]] = {}
        self._models: dict[str, ModelStore] = {}  # by database
        self._series: dict[str, tuple[tuple[int, int, int], Fabric, Any]] = {}  # by database
        self._lock = threading.Lock()
        self.loads = 0  # states read from the database (for tests and bench/detection_scale.py)
        self.model_loads = 0  # model sets read from the database (for tests)
        self.series_loads = 0  # series indexes read from the database (for tests)

    @staticmethod
    def _db(conn: Connection) -> str:
        return conn.engine.url.render_as_string(hide_password=True)

    @classmethod
    def _key(cls, conn: Connection, name: str) -> tuple[str, str]:
        return cls._db(conn), name

    def take(self, conn: Connection, name: str, fabric: Fabric, config: Config | None = None) -> FeatureState | None:
        """The stored state of `name` over `fabric` (None if there is none), from memory when it is current."""
        with self._lock:
            held = self._held.pop(self._key(conn, name), None)
        row = conn.execute(text(f"SELECT {_VERSION} FROM detector_state WHERE name = :n"), {"n": name}).first()
        if row is None:
            return None
        if held is not None:
            version, st = held
            # another fabric (an inventory change, a pod moved) or Config: read back, mapped by port id
            if version == tuple(row) and st.cfg == (config or Config()) and st.fabric.same_as(fabric):
                return st
        self.loads += 1
        return load_state(conn, name, fabric, config)

    def save(self, conn: Connection, name: str, st: FeatureState) -> None:
        """save_state, and hold the state until the next `take` (it must not change in between)."""
        version = save_state(conn, name, st)
        st.as_saved()
        with self._lock:
            self._held[self._key(conn, name)] = (version, st)

    def take_models(self, conn: Connection) -> ModelStore:
        """The cohort models (load_models), held from this process's last cycle when they are still the newest
        stored versions: a cycle then neither reads and rebuilds every forest again nor loses the scores the
        store keeps for rows that did not move (ModelStore.score). Handed over like `take`'s state."""
        key = self._db(conn)
        with self._lock:
            held = self._models.pop(key, None)
        if held is not None and not held.unusable and not held.new and \
                {c: m.version for c, m in held.models.items()} == stored_versions(conn):
            return held
        self.model_loads += 1
        return load_models(conn)

    def save_models(self, conn: Connection, models: ModelStore) -> None:
        """save_models, and hold them until the next `take_models` (a save that does not commit leaves the
        database an older version: the next take reads it). Not held if another process had stored one of
        these versions first: the stored model is then the one of that number."""
        trained = len(models.new)
        if save_models(conn, models) == trained:
            with self._lock:
                self._models[self._db(conn)] = models

    def series(self, conn: Connection, fabric: Fabric, load: Callable[[Connection, Fabric], T]) -> T:
        """The fabric's series index (`load`: service.load_series), held between cycles while the series table
        has the same rows (their number, newest id and sum of ids: series are added or deleted, never changed)
        and the fabric is the same. Marked before loading: a series added in between is read next cycle."""
        mark = tuple(conn.execute(text("SELECT count(*), COALESCE(max(id), 0), COALESCE(sum(id), 0) "
                                       "FROM series")).one())
        key = self._db(conn)
        with self._lock:
            held = self._series.get(key)
        if held is not None and held[0] == mark and held[1].same_as(fabric):
            return held[2]
        self.series_loads += 1
        index = load(conn, fabric)
        with self._lock:
            self._series[key] = (mark, fabric, index)
        return index

    def clear(self) -> None:
        with self._lock:
            self._held.clear()
            self._models.clear()
            self._series.clear()


# this process's (a Celery worker's: each process of a prefork pool has its own)
held_states = StateCache()


def save_models(conn: Connection, models: ModelStore) -> int:
    """Write models trained since the last save (new versions only; old versions are kept); the number written
    (a version another process stored first is kept as it is)."""
    n = 0
    for m in models.new:
        n += conn.execute(text(
            "INSERT INTO detector_models (cohort, version, trained_at, threshold, n_rows, features, blob) "
            "VALUES (:c, :v, :t, :th, :n, CAST(:f AS jsonb), :b) ON CONFLICT ON CONSTRAINT detector_model_version "
            "DO NOTHING"),
            {"c": m.cohort, "v": m.version, "t": _dt(m.trained_at_ms), "th": m.threshold, "n": m.n_rows,
             "f": json.dumps(list(IF_FEATURES)), "b": m.to_blob()}).rowcount
    models.new.clear()
    return n


def stored_versions(conn: Connection) -> dict[str, int]:
    """The newest stored version per cohort of the models `load_models` uses (this feature layout's), blobs
    unread."""
    rows = conn.execute(text("SELECT DISTINCT ON (cohort) cohort, version, features FROM detector_models "
                             "ORDER BY cohort, version DESC")).all()
    return {cohort: version for cohort, version, features in rows if list(features) == list(IF_FEATURES)}


def load_models(conn: Connection) -> ModelStore:
    """The newest version per cohort (models trained on another feature layout are skipped).

    A model that cannot be used (unreadable, tampered with, another format or scikit-learn version)
    is logged and listed in `unusable`, and the engine trains a new version at its next cycle.
    """
    store = ModelStore()
    rows = conn.execute(text(
        "SELECT DISTINCT ON (cohort) cohort, version, (extract(epoch FROM trained_at) * 1000)::bigint, threshold, "
        "n_rows, features, blob FROM detector_models ORDER BY cohort, version DESC")).all()
    for cohort, version, t_ms, th, n_rows, features, blob in rows:
        if list(features) != list(IF_FEATURES):
            continue
        try:
            store.models[cohort] = CohortModel.from_blob(cohort, version, int(t_ms), th, n_rows, bytes(blob))
        except ModelFormatError as exc:
            log.warning("detector model %s v%d not used, retraining: %s", cohort, version, exc)
            store.unusable[cohort] = version
    return store
