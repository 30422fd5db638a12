"""forest.fit_trees builds the trees scikit-learn's IsolationForest builds, bit for bit, without the forest's
per-tree bookkeeping: every node array equal, and a trained cohort model equal to one trained through
IsolationForest.fit (the path before fit_trees)."""

from __future__ import annotations

import numpy as np
import pytest
import sklearn
from sklearn.ensemble import IsolationForest

from service.detection.features import IF_FEATURES
from service.detection.forest import CLIP, Trees, _scaled, fit_trees, robust_center_scale, threshold_for, train_cohort
from service.detection.state import Config

NF = len(IF_FEATURES)


def _forest_trees(Z: np.ndarray, trees: int, max_samples: int, seed: int) -> Trees:
    forest = IsolationForest(n_estimators=trees, max_samples=max_samples, max_features=1.0, random_state=seed)
    return Trees.from_sklearn(forest.fit(Z))


def _same(a: Trees, b: Trees) -> bool:
    x, y = a.arrays(), b.arrays()
    return x.keys() == y.keys() and all(x[k].dtype == y[k].dtype and np.array_equal(x[k], y[k]) for k in x)


@pytest.mark.parametrize(
    ("rows", "features", "trees", "max_samples", "seed"),
    [
        (2048, NF, 100, 256, 7936),
        (5000, NF, 30, 256, 17),
        (300, 3, 20, 256, 2),
        (257, 5, 10, 256, 3),
        (40, 2, 7, 40, 4),
        (2, 2, 3, 2, 5),
    ],
)
def test_fit_trees_builds_the_forests_trees(rows: int, features: int, trees: int, max_samples: int, seed: int) -> None:
    rng = np.random.default_rng(seed)
    Z = np.clip(rng.standard_t(3, (rows, features)), -CLIP, CLIP)
    Z[:, 0] = np.round(Z[:, 0])  # ties
    if features > 2:
        Z[:, 2] = 0.0  # a constant feature: the random splitter draws past it
    got = fit_trees(Z, trees, min(max_samples, rows), seed)
    assert _same(got, _forest_trees(Z, trees, min(max_samples, rows), seed))
    assert not _same(got, fit_trees(Z, trees, min(max_samples, rows), seed + 1))  # the seed matters


def test_a_cohort_model_is_the_one_isolation_forest_trained() -> None:
    """train_cohort as it was before fit_trees: IsolationForest.fit on the scaled half, the other half calibrates."""
    cfg = Config()
    rng = np.random.default_rng(11)
    X = rng.normal(size=(4096, NF)) * rng.uniform(0.1, 5, NF)
    X[rng.random(X.shape) < 0.02] = np.nan
    model = train_cohort("c", X, 1_000, 3, cfg)
    assert model is not None
    center, scale = robust_center_scale(X)
    fit_rows, cal_rows = X[0::2], X[1::2]
    forest = IsolationForest(
        n_estimators=cfg.if_trees,
        max_samples=min(cfg.if_max_samples, len(fit_rows)),
        max_features=1.0,
        contamination="auto",
        random_state=3 * 7919 + 17,
    )
    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        forest.fit(_scaled(fit_rows, center, scale))
    assert _same(model.trees, Trees.from_sklearn(forest))
    assert model.threshold == threshold_for(-forest.score_samples(_scaled(cal_rows, center, scale)), cfg)


def test_fit_trees_refuses_more_samples_than_rows() -> None:
    with pytest.raises(ValueError, match="max_samples"):
        fit_trees(np.zeros((10, 2)), 5, 11, 1)
