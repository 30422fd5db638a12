"""The forest's training reservoir stored apart from the detector state (store.save_state, detector_reservoir):
a save appends the cycle's new rows, a trim or a stored reservoir that is not the state's writes it anew, and
what is read back is always the reservoir that was saved."""

from __future__ import annotations

import logging

import numpy as np
import pytest
from sqlalchemy import Connection, Engine, text

from service.detection.service import detect_at, load_fabric
from service.detection.state import FeatureState
from service.detection.store import StateCache, load_state, save_state
from tests.detection.test_live import SPEC, load_history
from tests.detection.test_state_cache import TIMES, differences


def chunks(conn: Connection, name: str = "default") -> list[tuple[str, int, int]]:
    """The stored chunks: (generation, first row, rows)."""
    return [tuple(r) for r in conn.execute(text(  # type: ignore[misc]
        "SELECT gen, first_row, n_rows FROM detector_reservoir WHERE name = :n ORDER BY gen, first_row"),
        {"n": name}).all()]


def add_rows(st: FeatureState, n: int, seed: int) -> None:
    """n clean rows more, as a cycle's `_learn` adds them."""
    rng = np.random.default_rng(seed)
    st.reservoir_new.append((rng.normal(size=(n, st.reservoir_x.shape[1])), rng.integers(0, 2, n)))


@pytest.fixture()
def saved(db: Engine) -> tuple[Engine, FeatureState]:
    """A live detector's state after three cycles (its reservoir has rows), as its process holds it."""
    load_history(db, SPEC, 20)
    cache = StateCache()
    for t in TIMES[:3]:
        detect_at(db, t, states=cache)
    (_, held), = cache._held.values()
    assert len(held.reservoir_c)
    return db, held


def test_a_save_appends_the_new_rows_only(saved: tuple[Engine, FeatureState]) -> None:
    db, st = saved
    with db.begin() as c:
        before = chunks(c)
        n0 = len(st.reservoir_c)
        assert sum(n for _, _, n in before) == n0 and {g for g, _, _ in before} == {st.reservoir_gen}
        add_rows(st, 3, 1)
        save_state(c, "default", st)
        save_state(c, "default", st)  # nothing new: nothing written
        after = chunks(c)
        assert after == before + [(st.reservoir_gen, n0, 3)]
        again = load_state(c, "default", load_fabric(c))
    assert again is not None and differences(again, st) == []
    blob = st.to_bytes(reservoir=False)
    assert len(blob) < len(st.to_bytes())  # the blob no longer carries the reservoir


def test_a_trim_writes_the_reservoir_anew(saved: tuple[Engine, FeatureState]) -> None:
    db, st = saved
    old = st.reservoir_gen
    keep = np.arange(len(st.reservoir_c)) % 2 == 0
    st.reservoir_keep(keep)
    with db.begin() as c:
        save_state(c, "default", st)
        assert chunks(c) == [(st.reservoir_gen, 0, int(keep.sum()))] and st.reservoir_gen != old
        again = load_state(c, "default", load_fabric(c))
    assert again is not None and differences(again, st) == []


def test_a_save_rolled_back_is_not_appended_to(saved: tuple[Engine, FeatureState]) -> None:
    """The state object goes on after its save rolled back: its next save cannot append to rows that are not
    stored, so it writes the whole reservoir again."""
    db, st = saved
    with db.connect() as c:
        with c.begin() as tx:
            add_rows(st, 4, 2)
            save_state(c, "default", st)
            tx.rollback()
        with c.begin():
            add_rows(st, 2, 3)
            save_state(c, "default", st)
            assert chunks(c) == [(st.reservoir_gen, 0, len(st.reservoir_c))]
            again = load_state(c, "default", load_fabric(c))
    assert again is not None and differences(again, st) == []


def test_a_state_saved_by_an_older_release_keeps_its_reservoir(saved: tuple[Engine, FeatureState]) -> None:
    """Before 0320 the reservoir was in the blob and no generation was stored: it loads from there, and the next
    save stores it apart."""
    db, st = saved
    with db.begin() as c:
        c.execute(text("DELETE FROM detector_reservoir"))
        c.execute(text("UPDATE detector_state SET blob = :b, reservoir_gen = NULL, reservoir_rows = 0"),
                  {"b": st.to_bytes()})
        old = load_state(c, "default", load_fabric(c))
        assert old is not None and old.reservoir_gen is None
        assert np.array_equal(old.reservoir_x, st.reservoir_x, equal_nan=True)
        assert np.array_equal(old.reservoir_c, st.reservoir_c)
        save_state(c, "default", old)
        assert chunks(c) == [(old.reservoir_gen, 0, len(st.reservoir_c))]
        again = load_state(c, "default", load_fabric(c))
    assert again is not None and differences(again, old) == []


def test_a_damaged_reservoir_is_reported_and_filled_again(saved: tuple[Engine, FeatureState],
                                                          caplog: pytest.LogCaptureFixture) -> None:
    """A chunk cut short (or one missing): the state loads with an empty reservoir, a warning says what was found
    where, the rest of the state is intact, and the next save writes a new generation."""
    db, st = saved
    with db.begin() as c:
        add_rows(st, 3, 4)
        save_state(c, "default", st)
        last = max(f for _, f, _ in chunks(c))
        c.execute(text("UPDATE detector_reservoir SET x = substring(x FROM 9) WHERE first_row = :f"), {"f": last})
        with caplog.at_level(logging.WARNING, logger="service.detection.store"):
            got = load_state(c, "default", load_fabric(c))
        assert got is not None and len(got.reservoir_c) == 0 and got.reservoir_gen is None
        assert f"chunk at row {last}" in caplog.text and "fills again" in caplog.text
        c.execute(text("DELETE FROM detector_reservoir WHERE first_row = :f"), {"f": last})
        caplog.clear()
        with caplog.at_level(logging.WARNING, logger="service.detection.store"):
            missing = load_state(c, "default", load_fabric(c))
        assert missing is not None and len(missing.reservoir_c) == 0
        assert f"{last} rows stored of {len(st.reservoir_c)}" in caplog.text
        got.reservoir_x, got.reservoir_c = st.reservoir_x, st.reservoir_c
        got.reservoir_gen, got.reservoir_stored = st.reservoir_gen, st.reservoir_stored
        assert differences(got, st) == []  # all but the reservoir read back
        add_rows(missing, 2, 5)
        save_state(c, "default", missing)
        assert chunks(c) == [(missing.reservoir_gen, 0, 2)]
