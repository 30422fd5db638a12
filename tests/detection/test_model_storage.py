"""Stored detector models are plain arrays: nothing in detector_models can run code, the stored form
scores exactly as scikit-learn does, and a model that cannot be used is retrained, not a crash."""

from __future__ import annotations

import io
import logging
import os
import pickle
from pathlib import Path

import numpy as np
import pytest
from sklearn.ensemble import IsolationForest
from sqlalchemy import Engine, text

from service.detection.engine import Engine as DetectionEngine
from service.detection.features import IF_FEATURES
from service.detection.forest import CohortModel, ModelFormatError, ModelStore, Trees
from service.detection.state import Config, FeatureState
from service.detection.store import load_models, save_models
from tests.detection.crafted import T0, tiny_fabric

COHORT = "DR4|400G|host"
NF = len(IF_FEATURES)


@pytest.mark.parametrize(("rows", "features", "trees", "max_samples", "seed"),
                         [(2000, NF, 100, 256, 1), (300, 3, 17, 64, 2), (40, 5, 5, 40, 3), (2, 2, 3, 2, 4)])
def test_stored_trees_score_exactly_as_scikit_learn(rows: int, features: int, trees: int, max_samples: int,
                                                    seed: int) -> None:
    rng = np.random.default_rng(seed)
    forest = IsolationForest(n_estimators=trees, max_samples=max_samples, max_features=1.0, random_state=seed)
    forest.fit(rng.normal(size=(rows, features)))
    Z = np.vstack([rng.normal(size=(3000, features)), rng.normal(size=(30, features)) * 10,
                   np.full((1, features), 50.0), np.full((1, features), -50.0)])
    want = -forest.score_samples(Z)
    assert np.array_equal(Trees.from_sklearn(forest).score(Z), want)
    # and after a trip through the stored form, with no scikit-learn object involved
    model = CohortModel("c", 1, 0, 0.5, rows, np.zeros(features), np.ones(features), Trees.from_sklearn(forest))
    again = CohortModel.from_blob("c", 1, 0, 0.5, rows, model.to_blob())
    assert np.array_equal(again.score(Z), want)


def _saved_model(db: Engine) -> None:
    rng = np.random.default_rng(5)
    store = ModelStore()
    store.retrain(rng.normal(size=(800, NF)), np.zeros(800, np.int64), [COHORT], 1_000, Config())
    with db.begin() as c:
        assert save_models(c, store) == 1


def _set_blob(db: Engine, blob: bytes) -> None:
    with db.begin() as c:
        c.execute(text("UPDATE detector_models SET blob = :b"), {"b": blob})


class _Payload:
    """A pickle that makes a directory when unpickled (as an attacker's `os.system` would run a command)."""

    def __init__(self, path: Path) -> None:
        self.path = path

    def __reduce__(self) -> tuple[object, tuple[str]]:
        return os.mkdir, (str(self.path),)


def test_a_tampered_blob_cannot_run_code(db: Engine, tmp_path: Path, caplog: pytest.LogCaptureFixture) -> None:
    _saved_model(db)
    marker = tmp_path / "pwned"
    evil = pickle.dumps(_Payload(marker))
    # the pickle alone, and the pickle as an array inside an otherwise valid npz
    buf = io.BytesIO()
    np.savez(buf, format=np.asarray(1), center=np.asarray([_Payload(marker)], dtype=object))
    for blob in (evil, buf.getvalue(), b"garbage"):
        _set_blob(db, blob)
        with caplog.at_level(logging.WARNING, logger="service.detection.store"), db.connect() as c:
            store = load_models(c)
        assert not marker.exists(), "loading a stored model ran code"
        assert store.models == {} and store.unusable == {COHORT: 1}
        assert f"detector model {COHORT} v1 not used, retraining" in caplog.text
        caplog.clear()


def _rewrite(blob: bytes, **changes: object) -> bytes:
    with np.load(io.BytesIO(blob), allow_pickle=False) as z:
        arrays = {k: z[k] for k in z.files}
    arrays.update({k: np.asarray(v) for k, v in changes.items()})
    buf = io.BytesIO()
    np.savez(buf, **arrays)  # type: ignore[arg-type]
    return buf.getvalue()


def test_a_version_mismatch_retrains(db: Engine) -> None:
    _saved_model(db)
    with db.connect() as c:
        blob = bytes(c.execute(text("SELECT blob FROM detector_models")).scalar_one())
    for change, why in (({"sklearn": "0.24.2"}, "trained with scikit-learn 0.24.2"), ({"format": 99}, "format 99")):
        with pytest.raises(ModelFormatError, match=why):
            CohortModel.from_blob(COHORT, 1, 0, 0.5, 800, _rewrite(blob, **change))
    _set_blob(db, _rewrite(blob, sklearn="0.24.2"))
    with db.connect() as c:
        store = load_models(c)
    assert store.models == {} and store.unusable == {COHORT: 1}
    # the next cycle retrains at once (not a day later, when training is next due), as version 2
    st = FeatureState(tiny_fabric())
    st.reservoir_x = np.random.default_rng(6).normal(size=(500, NF))
    st.reservoir_c = np.zeros(500, np.int64)
    st.first_cycle_ms, st.last_train_ms, st.last_cycle_ms = T0 - 86_400_000, T0 - 60_000, T0 - 60_000
    DetectionEngine(store).run_cycle(st, T0)
    assert store.models[COHORT].version == 2 and store.unusable == {} and st.last_train_ms == T0
    with db.begin() as c:
        save_models(c, store)
    with db.connect() as c:
        assert load_models(c).models[COHORT].version == 2


def _bad(trees: Trees, what: str) -> dict[str, np.ndarray]:
    if what == "lengths":
        return {"right": trees.right[:3]}
    if what == "feature":  # a split on a feature that does not exist
        return {"feature": np.where(trees.left >= 0, 10**6, trees.feature)}
    if what == "offsets":  # trees that do not cover the nodes
        return {"offsets": np.asarray([0, 5])}
    left = trees.left.copy()  # the root's child points back at the root: a walk would loop
    left[0] = 0
    return {"left": left}


@pytest.mark.parametrize(("what", "why"), [("lengths", "differ in length"), ("feature", "feature is out of range"),
                                           ("offsets", "offsets"), ("loop", "not after its parent")])
def test_malformed_trees_are_refused(what: str, why: str) -> None:
    rng = np.random.default_rng(7)
    forest = IsolationForest(n_estimators=2, max_samples=8, random_state=0).fit(rng.normal(size=(20, 2)))
    trees = Trees.from_sklearn(forest)
    blob = CohortModel("c", 1, 0, 0.5, 20, np.zeros(2), np.ones(2), trees).to_blob()
    with pytest.raises(ModelFormatError, match=why):
        CohortModel.from_blob("c", 1, 0, 0.5, 20, _rewrite(blob, **_bad(trees, what)))
