"""A model store rescores only the rows whose features moved (forest.ModelStore keeps each cohort's last
rows and scores): every cycle's scores equal scoring every row afresh, and live cycles (which load their
models from the table each cycle, so score every port) equal a backtest (one store for the whole replay,
keeping its scores between cycles) once the forest has models."""

from __future__ import annotations

import numpy as np
import pytest
from sqlalchemy import Engine

from service.detection import forest
from service.detection.features import IF_FEATURES
from service.detection.forest import ModelStore
from service.detection.service import backtest, detect_at
from service.detection.state import Config
from tests.detection.test_live import SPEC, T0, load_history

NAMES = ["a", "b", "c"]  # "c" has no model
NF = len(IF_FEATURES)


def _fresh(store: ModelStore, X: np.ndarray, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """The same models, no memory of earlier scores: every row walked."""
    again = ModelStore()
    again.models = dict(store.models)
    return again.score(X, cohort, NAMES)


def _check(store: ModelStore, X: np.ndarray, cohort: np.ndarray, walked: int) -> None:
    before = store.rows_scored
    got, th = store.score(X, cohort, NAMES)
    want, want_th = _fresh(store, X, cohort)
    assert np.array_equal(got, want, equal_nan=True) and np.array_equal(th, want_th, equal_nan=True)
    assert store.rows_scored - before == walked


def test_rows_that_did_not_move_keep_their_score_and_every_other_row_is_rescored() -> None:
    rng = np.random.default_rng(11)
    cfg = Config()
    store = ModelStore()
    train = rng.normal(size=(1600, NF))
    store.retrain(train, np.repeat([0, 1], 800), NAMES, 1_000, cfg)
    cohort = np.asarray([0] * 10 + [1] * 10 + [2] * 4)
    X = rng.normal(size=(len(cohort), NF))
    X[3, 1] = np.nan
    _check(store, X, cohort, walked=20)  # the first scoring walks every row with a model
    _check(store, X.copy(), cohort, walked=0)  # nothing moved: nothing walked, the same scores
    Y = X.copy()
    Y[0, 0] += 4.0  # a feature moved
    Y[3, 1] = np.nan  # NaN stays NaN: not a move
    Y[5, 2] = np.nan  # a value became missing
    Y[12, 9] = np.inf
    Y[21] += 1.0  # a cohort without a model: no score either way
    _check(store, Y, cohort, walked=3)
    # cohort "a" retrained: its rows are rescored under the new model, "b" keeps its scores
    store.retrain(train[:800] * 1.5, np.zeros(800, np.int64), NAMES, 2_000, cfg)
    _check(store, Y, cohort, walked=10)
    # a row changes cohort (another fabric's layout): both cohorts' rows are rescored
    moved = cohort.copy()
    moved[9] = 1
    _check(store, Y, moved, walked=20)
    # a stored score is never served for another row's features: rows swapped between cycles
    Z = Y[::-1].copy()
    _check(store, Z, moved, walked=int((Z.view(np.uint64) != Y.view(np.uint64)).any(axis=1)[moved < 2].sum()))


def _sparse_history(db: Engine, minutes: int, poll_s: int) -> None:
    """The faulty fabric polled every `poll_s` (cycles every 60 s see new samples one cycle in poll_s / 60)."""
    load_history(db, SPEC, minutes, poll_s)


def test_backtest_keeping_scores_equals_live_and_full_scoring(db: Engine, monkeypatch: pytest.MonkeyPatch) -> None:
    _sparse_history(db, 80, 300)
    # models early and often, so most of the run is scored: first training after 20 min, then every 25
    cfg = Config(if_min_history_ms=20 * 60_000, if_retrain_ms=25 * 60_000, if_min_rows=20)
    seen = {"rows": 0, "walked": 0, "models": 0}
    real = ModelStore.score

    def checked(self: ModelStore, X: np.ndarray, cohort: np.ndarray, names: list[str]):  # type: ignore[no-untyped-def]
        before = self.rows_scored
        got = real(self, X, cohort, names)
        again = ModelStore()
        again.models = dict(self.models)
        want = real(again, X, cohort, names)
        assert all(np.array_equal(g, w, equal_nan=True) for g, w in zip(got, want, strict=True))
        seen["rows"] += int(np.isfinite(got[0]).sum())
        seen["walked"] += self.rows_scored - before
        seen["models"] = max(seen["models"], len(self.models))
        return got

    monkeypatch.setattr(forest.ModelStore, "score", checked)
    t1 = int(T0 * 1000) + 10 * 60_000
    times = list(range(t1, int(T0 * 1000) + 80 * 60_000 + 1, 60_000))
    replay = backtest(db, times[0], times[-1], 60_000, config=cfg)
    # the replay scored with models, and kept most scores (4 cycles in 5 bring no sample)
    assert seen["models"] >= 1 and seen["rows"] > 0
    assert 0 < seen["walked"] < seen["rows"] / 2, seen
    live = []
    for t in times:
        live += detect_at(db, t, config=cfg)
    assert [f.to_dict() for f in live] == [f.to_dict() for f in replay]


def test_a_version_superseded_before_its_save_is_not_kept() -> None:
    """A replay never saves: the store holds the current version per cohort, not every version it trained."""
    rng = np.random.default_rng(12)
    cfg = Config()
    store = ModelStore()
    X = rng.normal(size=(1600, NF))
    store.retrain(X, np.repeat([0, 1], 800), NAMES, 1_000, cfg)
    store.retrain(X[:800], np.zeros(800, np.int64), NAMES, 2_000, cfg)
    assert sorted((m.cohort, m.version) for m in store.new) == [("a", 2), ("b", 1)]
    assert store.new[-1] is store.models["a"]
