"""ModelStore scores every cohort's moved rows in one walk over all current models (forest._Pack): each row's
score and threshold are what its own cohort's model gives (CohortModel.score, the per-cohort walk that
test_model_storage.py compares with scikit-learn), bit for bit, whatever the cohorts' sizes and models."""

from __future__ import annotations

import numpy as np

from service.detection.features import IF_FEATURES
from service.detection.forest import ModelStore
from service.detection.state import Config

NAMES = ["a", "b", "c", "d"]  # "d" never has a model
NF = len(IF_FEATURES)


def _own(store: ModelStore, X: np.ndarray, cohort: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Each row scored by its own cohort's model alone."""
    s, th = np.full(len(X), np.nan), np.full(len(X), np.nan)
    for ci, name in enumerate(NAMES):
        m = store.models.get(name)
        rows = np.flatnonzero(cohort == ci)
        if m is not None and len(rows):
            s[rows], th[rows] = m.score(X[rows]), m.threshold
    return s, th


def test_one_walk_over_all_cohorts_scores_each_row_as_its_own_model() -> None:
    rng = np.random.default_rng(5)
    cfg = Config()
    store = ModelStore()
    # cohorts of different sizes: different max_samples (denominators), tree depths and scalers
    sizes = {0: 1200, 1: 420, 2: 900}
    X_train = np.concatenate([rng.normal(loc=ci, scale=1 + ci, size=(n, NF)) for ci, n in sizes.items()])
    c_train = np.concatenate([np.full(n, ci) for ci, n in sizes.items()])
    store.retrain(X_train, c_train, NAMES, 1_000, cfg)
    assert {m.trees.max_samples for m in store.models.values()} == {256, 210}
    cohort = rng.integers(0, 4, 300)
    X = rng.normal(scale=3, size=(300, NF))
    X[rng.random(X.shape) < 0.05] = np.nan  # missing features: the cohort median
    X[7, 2], X[8, 4] = np.inf, -np.inf  # garbage: clipped
    for _ in range(2):
        got = store.score(X, cohort, NAMES)
        assert store._pack is not None  # the shared walk was used
        want = _own(store, X, cohort)
        assert np.isfinite(got[0][cohort < 3]).all() and np.isnan(got[0][cohort == 3]).all()
        for g, w in zip(got, want, strict=True):
            assert np.array_equal(g, w, equal_nan=True)
        # one cohort retrained: the pack is rebuilt with its new model, the others keep theirs
        store.retrain(X_train[c_train == 1] * 1.3, np.ones(sizes[1], np.int64), NAMES, 2_000, cfg)
        X = X.copy()
        X[::3] += 0.5
