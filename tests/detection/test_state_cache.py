"""The detector state kept in a process between live cycles (store.StateCache): read again whenever another
process wrote it, or this process's own save did not commit; never a cycle on a stale state."""

from __future__ import annotations

import io
import subprocess
import sys
from typing import Any

import numpy as np
import pytest
from sqlalchemy import Engine, text

from service.detection.archive import Archive
from service.detection.features import IF_FEATURES
from service.detection.forest import ModelStore
from service.detection.service import detect_at, detect_in, load_fabric
from service.detection.state import BLOCKED, Config, FeatureState
from service.detection.store import StateCache, load_coverage, load_models, load_state, save_models
from tests.detection.test_live import SPEC, T0, load_history
from tests.paths import REPO

T1 = int(T0 * 1000) + 10 * 60_000
TIMES = [T1 + i * 60_000 for i in range(8)]


def differences(a: Any, b: Any, path: str = "state") -> list[str]:
    """Where two states (or parts of them) differ, attribute by attribute, arrays by value (NaN equal to NaN)."""
    if isinstance(a, np.ndarray) or isinstance(b, np.ndarray):
        x, y = np.asarray(a), np.asarray(b)
        same = x.shape == y.shape and x.dtype == y.dtype and np.array_equal(x, y, equal_nan=x.dtype.kind in "fc")
        return [] if same else [path]
    if isinstance(a, dict) and isinstance(b, dict):
        if a.keys() != b.keys():
            return [f"{path}: keys {sorted(a.keys() ^ b.keys())}"]
        return [d for k in a for d in differences(a[k], b[k], f"{path}[{k!r}]")]
    if isinstance(a, list | tuple) and isinstance(b, list | tuple) and len(a) == len(b):
        return [d for i, (x, y) in enumerate(zip(a, b, strict=True)) for d in differences(x, y, f"{path}[{i}]")]
    if hasattr(a, "__dict__") and type(a) is type(b):
        return differences({k: v for k, v in vars(a).items() if k not in ("fabric", "cfg")},
                           {k: v for k, v in vars(b).items() if k not in ("fabric", "cfg")}, path)
    return [] if a == b else [f"{path}: {a!r} != {b!r}"]


def stored(db: Engine, name: str) -> dict[str, np.ndarray]:
    """A stored state's arrays, as stored, and its training reservoir's rows (stored apart, in chunks)."""
    with db.connect() as c:
        blob = c.execute(text("SELECT blob FROM detector_state WHERE name = :n"), {"n": name}).scalar_one()
        chunks = c.execute(text("SELECT r.x, r.c FROM detector_reservoir r JOIN detector_state s ON s.name = r.name "
                                "AND s.reservoir_gen = r.gen WHERE r.name = :n ORDER BY r.first_row"),
                           {"n": name}).all()
    with Archive(bytes(blob)) as z:
        arrays = {k: z[k] for k in z.files}
    arrays["reservoir x"] = np.frombuffer(b"".join(bytes(x) for x, _ in chunks), "<f8")
    arrays["reservoir c"] = np.frombuffer(b"".join(bytes(c) for _, c in chunks), "<i8")
    return arrays


def stored_differences(db: Engine) -> list[str]:
    """The arrays in which detector 'x''s stored state differs from 'ref''s."""
    mine, theirs = stored(db, "x"), stored(db, "ref")
    return sorted(mine.keys() ^ theirs.keys()) + [
        k for k in mine.keys() & theirs.keys() if differences(mine[k], theirs[k])]


def reference(db: Engine, times: list[int]) -> list[list[dict[str, Any]]]:
    """Cycles of detector 'ref', each reading its state from the database (a new process every cycle)."""
    return [[f.to_dict() for f in detect_at(db, t, name="ref", states=StateCache())] for t in times]


def test_a_held_state_goes_on_exactly_as_the_stored_one(db: Engine) -> None:
    """After each cycle the state held in memory is, attribute by attribute, the one read back from the database;
    and the cycles after the first read nothing back."""
    load_history(db, SPEC, 20)
    cache = StateCache()
    for t in TIMES:
        detect_at(db, t, states=cache)
        (_, held), = cache._held.values()
        with db.connect() as c:
            again = load_state(c, "default", load_fabric(c))
        assert again is not None and differences(held, again) == []
    assert cache.loads == 0


def test_two_workers_never_cycle_on_a_stale_state(db: Engine) -> None:
    """Two workers (two caches) take turns on one detector: each cycle goes on from the other's last one, so
    findings and the stored state are those of cycles that all read the stored state."""
    load_history(db, SPEC, 20)
    ref = reference(db, TIMES)
    a, b = StateCache(), StateCache()
    got = [[f.to_dict() for f in detect_at(db, t, name="x", states=w)] for t, w in zip(
        TIMES, (a, a, b, a, b, b, a, a), strict=True)]
    assert got == ref
    # read back: a after b's cycles (4, 7), b after a's (3, 5); a's 2 and 8 and b's 6 went on from memory
    assert (a.loads, b.loads) == (2, 2)
    assert stored_differences(db) == []


def test_a_save_that_did_not_commit_is_not_gone_on_from(db: Engine) -> None:
    """A cycle whose transaction rolled back after the state was saved (the pipeline failed after detection):
    the next cycle reads the stored state, so it is run again at the same time and sees the same samples."""
    load_history(db, SPEC, 20)
    ref = reference(db, TIMES[:4])
    cache = StateCache()
    got = [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[:2]]
    with db.connect() as conn, conn.begin() as tx:
        detect_in(conn, TIMES[2], name="x", states=cache)
        tx.rollback()
    got += [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[2:4]]
    assert got == ref and cache.loads == 1
    assert stored_differences(db) == []


def test_a_cycle_that_failed_leaves_nothing_held(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    """A cycle that failed after evaluating (here: its state's write) keeps no half-run state: the same cycle
    runs again from the stored state."""
    import service.detection.store as store

    load_history(db, SPEC, 20)
    ref = reference(db, TIMES[:4])
    cache = StateCache()
    got = [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[:2]]

    def lost(*args: object) -> None:
        raise ConnectionError("server closed the connection")

    with monkeypatch.context() as m:
        m.setattr(store, "save_state", lost)
        with pytest.raises(ConnectionError):
            detect_at(db, TIMES[2], name="x", states=cache)
    got += [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[2:4]]
    assert got == ref and cache.loads == 1
    assert stored_differences(db) == []


def test_another_process_cycle_in_between_is_read(db: Engine) -> None:
    """A real second process (another worker, or this one restarted) runs a cycle between two of this process's:
    this one's next cycle goes on from it."""
    load_history(db, SPEC, 20)
    ref = reference(db, TIMES[:4])
    cache = StateCache()
    got = [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[:2]]
    url = db.url.render_as_string(hide_password=False)
    code = ("import json, sys; from sqlalchemy import create_engine; from service.detection.service import detect_at; "
            f"print(json.dumps([f.to_dict() for f in detect_at(create_engine({url!r}), {TIMES[2]}, name='x')], "
            "default=str))")
    out = subprocess.run([sys.executable, "-c", code], cwd=REPO, capture_output=True, text=True, timeout=300)
    assert out.returncode == 0, out.stderr
    got.append([f.to_dict() for f in detect_at(db, TIMES[3], name="x", states=cache)])
    assert got[:2] == ref[:2] and got[2] == ref[3] and cache.loads == 1
    assert stored_differences(db) == []


def test_another_fabric_or_config_reads_the_state_again(db: Engine) -> None:
    """A held state is over one fabric and Config: an inventory change (a pod moved in or out of a shard, a module's
    thresholds) or another Config reads the stored state again, mapped by port id, as before."""
    load_history(db, SPEC, 20)
    cache = StateCache()
    detect_at(db, TIMES[0], states=cache)
    with db.connect() as c:
        fab = load_fabric(c)
        assert fab.same_as(load_fabric(c))
        other = load_fabric(c)
        other.th["rx_lw"] = other.th["rx_lw"].copy()
        other.th["rx_lw"][0] -= 1.0
        assert not fab.same_as(other)
        held = cache.take(c, "default", other)
    assert held is not None and held.fabric is other and cache.loads == 1
    detect_at(db, TIMES[1], states=cache)
    assert cache.loads == 2  # nothing held after that take
    detect_at(db, TIMES[2], states=cache)
    assert cache.loads == 2
    detect_at(db, TIMES[3], states=cache, config=Config(stale_ms=1_800_000))
    assert cache.loads == 3


def test_the_state_is_stored_compressed_and_earlier_formats_still_load(db: Engine) -> None:
    """The stored state is an archive of compressed members (read one by one: load_coverage), in a column
    PostgreSQL does not compress again, without the training reservoir (stored apart); the whole state as bytes
    (a restart's, a test's) keeps the reservoir's floats uncompressed. States stored by earlier releases, a plain
    npz (until 2026-12-04) and a deflated one (until 2026-12-06), load to the same state, and the API's coverage
    reads the deflated one."""
    import zipfile

    load_history(db, SPEC, 20)
    cache = StateCache()
    for t in TIMES[:3]:
        detect_at(db, t, states=cache)
    (_, held), = cache._held.values()
    with db.connect() as c:
        blob = bytes(c.execute(text("SELECT blob FROM detector_state WHERE name = 'default'")).scalar_one())
        fab = load_fabric(c)
        storage = c.execute(text("SELECT attstorage FROM pg_attribute WHERE attrelid = 'detector_state'::regclass "
                                 "AND attname = 'blob'")).scalar_one()
    assert storage == "e"  # EXTERNAL (migration 0310)
    with zipfile.ZipFile(io.BytesIO(blob)) as z:
        kinds = {i.filename: i.compress_type for i in z.infolist()}
    assert not any(n.startswith("reservoir_x.") for n in kinds)  # stored apart
    assert {kinds[n] for n in kinds if n.endswith(".npy.zst")} == {zipfile.ZIP_STORED}  # zstd, by us
    assert {kinds[n] for n in kinds if n.endswith(".npy")} == {zipfile.ZIP_DEFLATED}  # small ones
    assert len(held.reservoir_x)  # the reservoir has rows to store
    whole = held.to_bytes()
    with zipfile.ZipFile(io.BytesIO(whole)) as z:
        assert z.getinfo("reservoir_x.npy").compress_type == zipfile.ZIP_STORED
    plain, deflated = io.BytesIO(), io.BytesIO()
    np.savez(plain, **held.saved_arrays())
    np.savez_compressed(deflated, **held.saved_arrays())
    assert len(whole) * 2 < len(plain.getvalue())
    for earlier in (plain.getvalue(), deflated.getvalue()):
        assert differences(FeatureState.from_bytes(earlier, fab), FeatureState.from_bytes(whole, fab)) == []
    again = FeatureState.from_bytes(whole, fab)
    again.reservoir_gen, again.reservoir_stored = held.reservoir_gen, held.reservoir_stored  # known to the store
    assert differences(again, held) == []
    # the API's coverage reads either format alike: one port with a rule that cannot run
    kind = next(iter(held.blocked))
    held.blocked[kind][3] = 1
    deflated = io.BytesIO()
    np.savez_compressed(deflated, **held.saved_arrays())
    seen = []
    for stored_blob in (held.to_bytes(reservoir=False), deflated.getvalue()):
        with db.begin() as c:
            c.execute(text("UPDATE detector_state SET blob = :b WHERE name = 'default'"), {"b": stored_blob})
            seen.append(load_coverage(c))
    assert seen[0] == seen[1] and [p["blocked_rules"] for p in seen[0].values()] == [{kind: BLOCKED[1]}]


def _one_model(store: ModelStore, seed: int, at_ms: int) -> ModelStore:
    X = np.random.default_rng(seed).normal(size=(600, len(IF_FEATURES)))
    store.retrain(X, np.zeros(len(X), np.int64), ["c1"], at_ms, Config())
    return store


def test_models_are_held_between_cycles_and_read_again_when_the_stored_ones_moved_on(db: Engine) -> None:
    """A cycle goes on with the models the last one held while they are the newest stored versions; a version
    stored since (another process trained it), or this process's own save that did not commit, is read."""
    load_history(db, SPEC, 20)
    other = _one_model(ModelStore(), 1, 1_000)
    with db.begin() as c:
        save_models(c, other)
    cache = StateCache()
    detect_at(db, TIMES[0], states=cache)
    key = db.url.render_as_string(hide_password=True)
    held = cache._models[key]
    detect_at(db, TIMES[1], states=cache)
    detect_at(db, TIMES[2], states=cache)
    assert cache.model_loads == 1 and held.models["c1"].version == 1
    assert cache._models[key] is held  # the same store, cycle after cycle
    # another process stores version 2
    with db.begin() as c:
        save_models(c, _one_model(other, 2, 2_000))
    detect_at(db, TIMES[3], states=cache)
    assert cache.model_loads == 2
    with db.connect() as c:
        with c.begin():
            mine = cache.take_models(c)
            assert mine.models["c1"].version == 2 and cache.model_loads == 2
            cache.save_models(c, _one_model(mine, 3, 3_000))  # version 3, written, then rolled back
            c.rollback()
        with c.begin():
            again = cache.take_models(c)
    assert cache.model_loads == 3 and again.models["c1"].version == 2
    # another process stores version 3 first: this process's own version 3 is not the stored one, not held
    with db.begin() as c:
        save_models(c, _one_model(load_models(c), 4, 4_000))
    with db.begin() as c:
        cache.save_models(c, _one_model(again, 5, 5_000))
    assert key not in cache._models


def test_the_series_index_is_held_until_the_series_change(db: Engine) -> None:
    """A cycle reads the series index (every detection series and its entity) only when series were added or
    deleted since the last one read it, or the fabric changed: findings as if it were read every cycle."""
    load_history(db, SPEC, 20)
    ref = reference(db, TIMES[:5])
    cache = StateCache()
    got = [[f.to_dict() for f in detect_at(db, t, name="x", states=cache)] for t in TIMES[:2]]
    assert cache.series_loads == 1
    key = db.url.render_as_string(hide_password=True)
    with db.begin() as c:  # a series more (a lane the history has no samples of yet)
        sid = c.execute(text(
            "INSERT INTO series (metric, device_id, port_id, lane, saturating) SELECT metric, device_id, port_id, "
            "lane + 100, saturating FROM series WHERE metric = 'optic_rx_power_dbm' LIMIT 1 RETURNING id")).scalar_one()
    got.append([f.to_dict() for f in detect_at(db, TIMES[2], name="x", states=cache)])
    assert cache.series_loads == 2 and cache._series[key][2].max_id == sid
    with db.begin() as c:
        c.execute(text("DELETE FROM series WHERE id = :s"), {"s": sid})
    got.append([f.to_dict() for f in detect_at(db, TIMES[3], name="x", states=cache)])
    assert cache.series_loads == 3
    with db.connect() as c:
        other = load_fabric(c)
    other.port_names = [*other.port_names[:-1], "renamed"]
    with db.begin() as c:
        assert cache.series(c, other, lambda conn, fab: "read again") == "read again"
    got.append([f.to_dict() for f in detect_at(db, TIMES[4], name="x", states=cache)])
    assert cache.series_loads == 5 and got == ref
