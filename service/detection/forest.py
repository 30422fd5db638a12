"""Layer 2: one IsolationForest per cohort (part number x speed x role) on robust-scaled features.

The score threshold is not contamination='auto': it is the `if_quantile` quantile of scores
on held-out clean rows (a false-alarm budget, detection.md 3.3 / F42). Training rows come
from a bounded reservoir of unflagged ports, so flagged windows never become "normal".
Models are versioned; `ModelStore` keeps the current one per cohort and `store.py` writes
them to the detector_models table, so a restart scores exactly as before.
"""

from __future__ import annotations

import pickle
from dataclasses import dataclass

import numpy as np
from sklearn.ensemble import IsolationForest

from service.detection.state import Config

CLIP = 50.0


@dataclass
class CohortModel:
    cohort: str
    version: int
    trained_at_ms: int
    threshold: float
    n_rows: int
    center: np.ndarray
    scale: np.ndarray
    forest: IsolationForest
    _walk: list[tuple[object, np.ndarray]] | None = None

    def transform(self, X: np.ndarray) -> np.ndarray:
        with np.errstate(invalid="ignore", divide="ignore"):
            Z = (X - self.center) / self.scale
        Z = np.where(np.isfinite(Z), Z, 0.0)  # missing or garbage -> the cohort median
        return np.clip(Z, -CLIP, CLIP)

    def score(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score, larger is worse: equals -IsolationForest.score_samples, computed by
        walking all rows down each tree at once (sklearn pays a Python call per tree per batch)."""
        if not len(X):
            return np.zeros(0)
        if self._walk is None:
            self._walk = compile_forest(self.forest)
        return walk_score(self._walk, self.transform(X))

    def to_blob(self) -> bytes:
        return pickle.dumps({"center": self.center, "scale": self.scale, "forest": self.forest}, protocol=5)

    @classmethod
    def from_blob(cls, cohort: str, version: int, trained_at_ms: int, threshold: float, n_rows: int,
                  blob: bytes) -> CohortModel:
        d = pickle.loads(blob)
        return cls(cohort, version, trained_at_ms, threshold, n_rows, d["center"], d["scale"], d["forest"])


def compile_forest(forest: IsolationForest) -> list[tuple[object, np.ndarray]]:
    """Per tree: (the fitted tree, its per-node depth term), plus c(max_samples) and the tree count."""
    if forest._max_features != forest.n_features_in_:
        raise ValueError("feature subsampling is not used by this detector")
    out: list[tuple[object, np.ndarray]] = []
    for tree, lengths, avg in zip(forest.estimators_, forest._decision_path_lengths,
                                  forest._average_path_length_per_tree, strict=True):
        out.append((tree, np.asarray(lengths, np.float64) + np.asarray(avg, np.float64) - 1.0))
    out.append((None, np.asarray([_avg_path(forest._max_samples), len(forest.estimators_)], np.float64)))
    return out


def _avg_path(n: int) -> float:
    """c(n): average path length of an unsuccessful BST search (Liu et al.)."""
    if n <= 1:
        return 0.0
    if n == 2:
        return 1.0
    return 2.0 * (np.log(n - 1.0) + np.euler_gamma) - 2.0 * (n - 1.0) / n


def walk_score(compiled: list[tuple[object, np.ndarray]], Z: np.ndarray) -> np.ndarray:
    """sklearn's score (2^-E[h]/c), with tree.apply called directly: no joblib round per tree."""
    Xf = np.ascontiguousarray(Z, dtype=np.float32)  # sklearn trees compare float32 inputs
    depths = np.zeros(len(Xf))
    *trees, (_, consts) = compiled
    for tree, leaf_term in trees:
        depths += leaf_term[tree.apply(Xf, check_input=False)]  # type: ignore[attr-defined]
    denom = float(consts[0] * consts[1])
    return 2.0 ** (-(depths / denom)) if denom != 0 else np.ones(len(Xf))


def robust_center_scale(X: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    with np.errstate(invalid="ignore"):
        ok = np.isfinite(X)
        Xn = np.where(ok, X, np.nan)
        if not ok.any():
            return np.zeros(X.shape[1]), np.ones(X.shape[1])
        import warnings

        with warnings.catch_warnings():
            warnings.simplefilter("ignore", RuntimeWarning)
            center = np.nanmedian(Xn, axis=0)
            q75, q25 = np.nanpercentile(Xn, 75, axis=0), np.nanpercentile(Xn, 25, axis=0)
    center = np.where(np.isfinite(center), center, 0.0)
    iqr = np.where(np.isfinite(q75 - q25), q75 - q25, 0.0)
    return center, np.maximum(iqr / 1.349, 1e-3)


def train_cohort(cohort: str, X: np.ndarray, at_ms: int, version: int, cfg: Config) -> CohortModel | None:
    """Fit on one half of the clean rows, calibrate the threshold on the other half."""
    X = X[np.isfinite(X).any(axis=1)] if len(X) else X
    if len(X) < cfg.if_min_rows:
        return None
    center, scale = robust_center_scale(X)
    fit_rows, cal_rows = X[0::2], X[1::2]
    forest = IsolationForest(n_estimators=cfg.if_trees, max_samples=min(cfg.if_max_samples, len(fit_rows)),
                             max_features=1.0, contamination="auto", random_state=version * 7919 + 17)
    model = CohortModel(cohort, version, at_ms, 0.0, len(X), center, scale, forest)
    forest.fit(model.transform(fit_rows))
    cal = model.score(cal_rows)
    model.threshold = float(np.quantile(cal, cfg.if_quantile)) if len(cal) else float("inf")
    return model


class ModelStore:
    """Current model per cohort name; versions count up per cohort."""

    def __init__(self) -> None:
        self.models: dict[str, CohortModel] = {}
        self.new: list[CohortModel] = []  # trained since the last save (store.py drains it)

    def retrain(self, X: np.ndarray, cohort_of_row: np.ndarray, cohort_names: list[str], at_ms: int,
                cfg: Config) -> int:
        n = 0
        for ci in np.unique(cohort_of_row).tolist():
            name = cohort_names[ci] if 0 <= ci < len(cohort_names) else None
            if name is None:
                continue
            old = self.models.get(name)
            m = train_cohort(name, X[cohort_of_row == ci], at_ms, (old.version + 1) if old else 1, cfg)
            if m is not None:
                self.models[name] = m
                self.new.append(m)
                n += 1
        return n

    def score(self, X: np.ndarray, cohort: np.ndarray, cohort_names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(score, threshold) per row; NaN where the row's cohort has no model yet."""
        s = np.full(len(X), np.nan)
        th = np.full(len(X), np.nan)
        for ci in np.unique(cohort).tolist():
            m = self.models.get(cohort_names[ci]) if 0 <= ci < len(cohort_names) else None
            if m is None:
                continue
            rows = np.flatnonzero(cohort == ci)
            s[rows] = m.score(X[rows])
            th[rows] = m.threshold
        return s, th
