"""Layer 2: one IsolationForest per cohort (part number x speed x role) on robust-scaled features.

The score threshold is not contamination='auto': it is where the held-out clean rows' score tail,
extrapolated (`threshold_for`), reaches the false-alarm budget `if_tail_p` per observation (detection.md,
"Layer 2" / F42). Training rows come from a bounded reservoir of unflagged ports, sampled evenly over data
time (`reservoir_take`) so that it spans `if_window_ms`, whole diurnal cycles, whatever the cohort's size
and poll rate; flagged windows never become "normal".
Models are versioned; `ModelStore` keeps the current one per cohort and `store.py` writes
them to the detector_models table, so a restart scores exactly as before.

Stored models are plain arrays, never pickles: each tree's nodes (children, split feature and
threshold, samples per node) in an npz read with allow_pickle=False, with a format version and the
scikit-learn version that trained them. Scoring walks those arrays with numpy, so loading a model
needs neither pickle nor scikit-learn's private attributes, and nothing stored can run code.
"""

from __future__ import annotations

import io
from dataclasses import dataclass, field

import numpy as np
import sklearn
from sklearn.ensemble import IsolationForest
from sklearn.tree import ExtraTreeRegressor
from sklearn.utils.random import sample_without_replacement

from service.detection.state import Config

CLIP = 50.0
_MAX_INT = np.iinfo(np.int32).max  # scikit-learn's seed range
FORMAT_VERSION = 1
_CHUNK_CELLS = 1 << 16  # rows x trees walked at once: bounds the walk's memory (and stays in cache)


class ModelFormatError(ValueError):
    """A stored model that cannot be used: unreadable, malformed, or from another format or library version."""


def _avg_path(n: np.ndarray) -> np.ndarray:
    """c(n), the average path length of an unsuccessful BST search (Liu et al.), elementwise.

    Written as scikit-learn's `_average_path_length`, operation for operation, so scores agree bit for bit.
    """
    n = np.asarray(n).reshape(1, -1)
    out = np.zeros(n.shape)
    one, two = n <= 1, n == 2
    rest = ~np.logical_or(one, two)
    out[two] = 1.0
    out[rest] = 2.0 * (np.log(n[rest] - 1.0) + np.euler_gamma) - 2.0 * (n[rest] - 1.0) / n[rest]
    return out.reshape(-1)


@dataclass
class Trees:
    """An isolation forest as arrays: the nodes of every tree, concatenated (`offsets` marks each tree).

    Per node, as in scikit-learn's `tree_`: children (local indices, -1 at a leaf), split feature and
    threshold, and the training samples that reached it.
    """

    offsets: np.ndarray
    left: np.ndarray
    right: np.ndarray
    feature: np.ndarray
    threshold: np.ndarray
    n_samples: np.ndarray
    max_samples: int
    n_features: int
    # derived by _compile: global child indices (a leaf points to itself), per-node path term, depth
    _next: tuple[np.ndarray, np.ndarray] | None = field(default=None, repr=False)
    _term: np.ndarray = field(default_factory=lambda: np.zeros(0), repr=False)
    _depth: int = 0

    @classmethod
    def from_sklearn(cls, forest: IsolationForest) -> Trees:
        if forest.max_features != 1.0 or forest.bootstrap:
            raise ValueError("feature subsampling and bootstrap are not used by this detector")
        return cls.from_trees([est.tree_ for est in forest.estimators_], int(forest.max_samples_),
                              int(forest.n_features_in_))

    @classmethod
    def from_trees(cls, ts: list, max_samples: int, n_features: int) -> Trees:
        """From scikit-learn tree structures (`tree_` of fitted trees)."""
        sizes = [t.node_count for t in ts]
        return cls(offsets=np.concatenate([[0], np.cumsum(sizes)]).astype(np.int64),
                   left=np.concatenate([t.children_left for t in ts]).astype(np.int32),
                   right=np.concatenate([t.children_right for t in ts]).astype(np.int32),
                   feature=np.concatenate([t.feature for t in ts]).astype(np.int32),
                   threshold=np.concatenate([t.threshold for t in ts]).astype(np.float64),
                   n_samples=np.concatenate([t.n_node_samples for t in ts]).astype(np.int64),
                   max_samples=max_samples, n_features=n_features)._compile()

    def arrays(self) -> dict[str, np.ndarray]:
        return {"offsets": self.offsets, "left": self.left, "right": self.right, "feature": self.feature,
                "threshold": self.threshold, "n_samples": self.n_samples,
                "max_samples": np.asarray(self.max_samples, np.int64), "n_features": np.asarray(self.n_features)}

    def _compile(self) -> Trees:
        """Check the arrays form real trees, and derive what the walk needs; ModelFormatError otherwise."""
        off, n = self.offsets, len(self.left)
        if not (off.ndim == 1 and len(off) >= 2 and off[0] == 0 and off[-1] == n and (np.diff(off) > 0).all()):
            raise ModelFormatError("tree offsets do not partition the nodes")
        if not (len(self.right) == len(self.feature) == len(self.threshold) == len(self.n_samples) == n):
            raise ModelFormatError("node arrays differ in length")
        if self.max_samples < 1 or self.n_features < 1 or (self.n_samples < 1).any():
            raise ModelFormatError("sample counts must be positive")
        tree = np.repeat(np.arange(len(off) - 1), np.diff(off))
        local = np.arange(n) - off[tree]
        size = np.diff(off)[tree]
        leaf = self.left == -1
        inner = ~leaf
        if ((self.right == -1) != leaf).any():
            raise ModelFormatError("a node has exactly one child")
        # children come after their parent within its tree, so every walk goes down and ends
        for child in (self.left, self.right):
            if ((child[inner] <= local[inner]) | (child[inner] >= size[inner])).any():
                raise ModelFormatError("a child index is outside its tree or not after its parent")
        if ((self.feature[inner] < 0) | (self.feature[inner] >= self.n_features)).any():
            raise ModelFormatError("a split feature is out of range")
        if not np.isfinite(self.threshold[inner]).all():
            raise ModelFormatError("a split threshold is not finite")
        gl = np.where(leaf, np.arange(n), self.left + off[tree])
        gr = np.where(leaf, np.arange(n), self.right + off[tree])
        parents = np.bincount(np.concatenate([gl[inner], gr[inner]]), minlength=n)
        if (parents[off[:-1]] != 0).any() or (np.delete(parents, off[:-1]) != 1).any():
            raise ModelFormatError("nodes do not form trees (a node with no parent, or two)")
        depth = np.zeros(n, np.int64)
        level, d = off[:-1], 1
        while len(level):
            depth[level] = d
            level = level[inner[level]]
            level = np.concatenate([gl[level], gr[level]])
            d += 1
        # scikit-learn's depth term per node: node depth + c(samples at the node) - 1
        self._term = depth + _avg_path(self.n_samples) - 1.0
        # [right, left] per node, indexed by node * 2 + (x <= threshold): one gather per step
        self._next = (np.stack([gr, gl], axis=1).ravel().astype(np.int64), np.where(leaf, 0, self.feature))
        self._depth = int(depth.max())
        return self

    def score(self, Z: np.ndarray) -> np.ndarray:
        """scikit-learn's IsolationForest score (2^-E[h]/c, larger is worse), bit for bit."""
        assert self._next is not None
        kids, feat = self._next
        thr, off = self.threshold, self.offsets
        T, (n, nf) = len(off) - 1, Z.shape
        if nf != self.n_features:
            raise ValueError(f"rows have {nf} features, the trees {self.n_features}")
        X = np.ascontiguousarray(Z, np.float32).ravel()  # scikit-learn's trees compare float32 inputs
        depths = np.zeros(n)
        step = max(1, _CHUNK_CELLS // T)
        for a in range(0, n, step):
            b = min(a + step, n)
            at = np.arange(a, b, dtype=np.int64)[None, :] * nf  # row starts in X
            nodes = np.repeat(off[:-1, None], b - a, axis=1)  # every tree's root, for every row
            for _ in range(self._depth - 1):  # leaves point to themselves: extra steps change nothing
                nodes = kids[nodes * 2 + (X[at + feat[nodes]] <= thr[nodes])]
            # summed tree by tree, as scikit-learn sums them: accumulate is sequential by definition (a sum
            # over an axis may be pairwise, which differs in the last bits)
            depths[a:b] = np.add.accumulate(self._term[nodes], axis=0)[-1]
        denominator = T * _avg_path(np.asarray([self.max_samples]))[0]
        return 2 ** (-np.divide(depths, denominator, out=np.ones_like(depths), where=denominator != 0))


def _scaled(X: np.ndarray, center: np.ndarray, scale: np.ndarray) -> np.ndarray:
    with np.errstate(invalid="ignore", divide="ignore"):
        Z = (X - center) / scale
    Z = np.where(np.isfinite(Z), Z, 0.0)  # missing or garbage -> the cohort median
    return np.clip(Z, -CLIP, CLIP)


@dataclass
class CohortModel:
    cohort: str
    version: int
    trained_at_ms: int
    threshold: float
    n_rows: int
    center: np.ndarray
    scale: np.ndarray
    trees: Trees

    def transform(self, X: np.ndarray) -> np.ndarray:
        return _scaled(X, self.center, self.scale)

    def score(self, X: np.ndarray) -> np.ndarray:
        """Anomaly score, larger is worse: equals -IsolationForest.score_samples on the transformed rows."""
        if not len(X):
            return np.zeros(0)
        return self.trees.score(self.transform(X))

    def to_blob(self) -> bytes:
        buf = io.BytesIO()
        np.savez_compressed(buf, format=np.asarray(FORMAT_VERSION), sklearn=np.asarray(sklearn.__version__),
                            center=self.center, scale=self.scale, **self.trees.arrays())
        return buf.getvalue()

    @classmethod
    def from_blob(cls, cohort: str, version: int, trained_at_ms: int, threshold: float, n_rows: int,
                  blob: bytes) -> CohortModel:
        """Read a stored model; ModelFormatError if it is unreadable, malformed or from another version."""
        try:
            with np.load(io.BytesIO(blob), allow_pickle=False) as z:
                a = {k: z[k] for k in z.files}
        except Exception as exc:  # not an npz of plain arrays (a pickle, garbage): never unpickled
            raise ModelFormatError(f"unreadable ({type(exc).__name__}: {exc})") from None
        try:
            fmt, lib = int(a["format"]), str(a["sklearn"])
            if fmt != FORMAT_VERSION:
                raise ModelFormatError(f"format {fmt}, this release reads {FORMAT_VERSION}")
            if lib != sklearn.__version__:
                raise ModelFormatError(f"trained with scikit-learn {lib}, this is {sklearn.__version__}")
            center, scale = np.asarray(a["center"], np.float64), np.asarray(a["scale"], np.float64)
            trees = Trees(offsets=a["offsets"].astype(np.int64), left=a["left"].astype(np.int64),
                          right=a["right"].astype(np.int64), feature=a["feature"].astype(np.int64),
                          threshold=a["threshold"].astype(np.float64), n_samples=a["n_samples"].astype(np.int64),
                          max_samples=int(a["max_samples"]), n_features=int(a["n_features"]))._compile()
            if center.shape != (trees.n_features,) or scale.shape != center.shape or not (scale > 0).all():
                raise ModelFormatError("the scaler does not fit the trees")
        except ModelFormatError:
            raise
        except Exception as exc:  # a missing array, a wrong shape or dtype
            raise ModelFormatError(f"malformed ({type(exc).__name__}: {exc})") from None
        return cls(cohort, version, trained_at_ms, threshold, n_rows, center, scale, trees)


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
    trees = fit_trees(_scaled(fit_rows, center, scale), cfg.if_trees, min(cfg.if_max_samples, len(fit_rows)),
                      version * 7919 + 17)
    model = CohortModel(cohort, version, at_ms, 0.0, len(X), center, scale, trees)
    model.threshold = threshold_for(model.score(cal_rows), cfg)
    return model


def fit_trees(Z: np.ndarray, n_trees: int, max_samples: int, seed: int) -> Trees:
    """The trees of `IsolationForest(n_estimators=n_trees, max_samples=max_samples, max_features=1.0,
    random_state=seed).fit(Z)`, bit for bit (tests/detection/test_forest_fit.py compares them).

    Each tree is scikit-learn's own `ExtraTreeRegressor.fit`, called as the forest calls it: the same random
    draws (the forest's targets and per-tree seeds, each tree's seed and its rows drawn without replacement,
    passed as sample weights), parameters and inputs. What is left out is the forest's per-tree bookkeeping
    around those calls (cloning the template through `get_params` and `inspect.signature`, setting its seed,
    joblib, per-tree depth arrays this detector does not use): about half of a fit's time. Parameter and
    finiteness validation are skipped too: the parameters are fixed here and the scaled rows are finite by
    construction (`_scaled`).
    """
    if not 1 <= max_samples <= len(Z):
        raise ValueError(f"max_samples {max_samples} outside 1..{len(Z)} rows")
    X = np.ascontiguousarray(Z, np.float32)  # as the forest's input check converts it
    n, nf = X.shape
    # one generator re-seeded for each draw: `RandomState(s)` and `.seed(s)` give the same stream, and making
    # one costs ~60 times as much as seeding it (the forest made three per tree)
    rng = np.random.RandomState(seed)
    y = rng.uniform(size=n)  # IsolationForest.fit's random targets
    rng.seed(seed)
    seeds = rng.randint(_MAX_INT, size=n_trees).tolist()  # the bagging's per-tree seeds
    depth = int(np.ceil(np.log2(max(max_samples, 2))))
    out = []
    with sklearn.config_context(skip_parameter_validation=True, assume_finite=True):
        for s in seeds:
            rng.seed(s)
            tree_seed = rng.randint(_MAX_INT)  # as the ensemble seeds each tree
            rng.seed(s)  # the bagging's draws: features (all of them, unused), then rows
            sample_without_replacement(nf, nf, random_state=rng)
            w = np.bincount(sample_without_replacement(n, max_samples, random_state=rng), minlength=n)
            rng.seed(tree_seed)  # the tree makes RandomState(tree_seed) of an int; given one, it uses it
            est = ExtraTreeRegressor(max_depth=depth, max_features=1, splitter="random", random_state=rng)
            est.fit(X, y, sample_weight=w, check_input=False)
            out.append(est.tree_)
    return Trees.from_trees(out, max_samples, nf)


def threshold_for(cal: np.ndarray, cfg: Config) -> float:
    """The score a healthy row exceeds with probability `if_tail_p`: an exponential tail fitted to the held-out
    scores above their `if_tail_from` quantile, extrapolated.

    The budget is far beyond what a day of rows can show as a quantile (a 0.999 quantile of ~2,000 rows of ~20
    ports is their second largest, and the next day's healthy ports crossed it 9-18 times as often). An
    exponential tail is heavier than an isolation score's (bounded by 1), so the extrapolation errs quiet.
    """
    if not len(cal):
        return float("inf")
    u = float(np.quantile(cal, cfg.if_tail_from))
    excess = cal[cal > u] - u
    beta = float(excess.mean()) if len(excess) else 0.0
    return u + beta * float(np.log((1.0 - cfg.if_tail_from) / cfg.if_tail_p))


def reservoir_take(clean: np.ndarray, obs_t: np.ndarray, sec: int, cohort: np.ndarray, cohort_size: np.ndarray,
                   cfg: Config) -> np.ndarray:
    """The ports of `clean` whose row goes to the training reservoir this cycle (a subset of `clean`).

    Each port gives one row per period of data time, the period set so that a cohort adds `if_reservoir` rows per
    `if_window_ms`: the newest `if_reservoir` rows (what the reservoir keeps) then span that window, whole days of
    the diurnal cycle, whatever the cohort's size and poll rate. Keeping every row instead held 15 h for a
    23-port cohort polled every 5 minutes; the hours it missed (the night, on the simulator's fabric) held 95 %
    of the next day's false outliers. `obs_t` is the anomaly condition's observation times (uint32 s, newest
    last, this cycle's included), `sec` this cycle's: a port takes a row when a period boundary (offset per port,
    to spread them) fell since its previous observation, so a poll cadence finer or coarser than a cycle samples
    the same.
    """
    if not len(clean):
        return clean
    period = np.maximum(cfg.if_window_ms // 1000 * cohort_size[cohort[clean]] // cfg.if_reservoir, 1)
    t = obs_t[clean].astype(np.int64)
    prev = np.where(t < sec, t, 0).max(axis=1)
    phase = (clean * 7919) % period
    return clean[(prev == 0) | ((sec + phase) // period > (prev + phase) // period)]


@dataclass
class _Pack:
    """The current models of every cohort, walked as one forest: their trees' node arrays concatenated.

    Scoring the rows of 24 cohorts cohort by cohort took 24 walks of a dozen rows each, each step a numpy call
    on a (trees x rows) array; one walk over all of them takes the same number of steps. Per row and tree it
    is the same walk (a model's nodes only lead to its own nodes) and the same sequential sum of the same
    terms, then the row's own model's denominator: the scores are those of `CohortModel.score`, bit for bit.
    """

    model_of: list[CohortModel | None]  # per cohort index: what this pack was built from
    index: np.ndarray  # per cohort index: its model's number here (-1: none)
    roots: np.ndarray  # (models, trees): each model's tree roots, as global node numbers
    kids: np.ndarray  # per global node * 2 + (x <= threshold): the next node (a leaf points to itself)
    feat: np.ndarray
    thr: np.ndarray
    term: np.ndarray
    depth: int
    center: np.ndarray  # (models, features)
    scale: np.ndarray
    denominator: np.ndarray  # (models,)
    threshold: np.ndarray  # (models,)

    @classmethod
    def build(cls, model_of: list[CohortModel | None], n_features: int) -> _Pack | None:
        """None where the models cannot share a walk (a different tree count or feature count): then each
        cohort is scored on its own, as `CohortModel.score` does."""
        models = [m for m in model_of if m is not None]
        trees = [m.trees for m in models]
        if not models or any(t._next is None for t in trees) or \
                len({len(t.offsets) for t in trees}) != 1 or {t.n_features for t in trees} != {n_features}:
            return None
        index = np.full(len(model_of), -1, np.int64)
        kids, feat, roots, base = [], [], [], 0
        for k, ci in enumerate(i for i, m in enumerate(model_of) if m is not None):
            index[ci] = k
            t = trees[k]
            nxt, f = t._next  # type: ignore[misc]
            kids.append(nxt + base)
            feat.append(f)
            roots.append(t.offsets[:-1] + base)
            base += len(t.left)
        T = len(trees[0].offsets) - 1
        return cls(model_of=list(model_of), index=index, roots=np.stack(roots), kids=np.concatenate(kids),
                   feat=np.concatenate(feat), thr=np.concatenate([t.threshold for t in trees]),
                   term=np.concatenate([t._term for t in trees]), depth=max(t._depth for t in trees),
                   center=np.stack([m.center for m in models]), scale=np.stack([m.scale for m in models]),
                   denominator=np.asarray([T * _avg_path(np.asarray([t.max_samples]))[0] for t in trees]),
                   threshold=np.asarray([m.threshold for m in models], np.float64))

    def fits(self, model_of: list[CohortModel | None]) -> bool:
        return len(model_of) == len(self.model_of) and all(a is b for a, b in zip(model_of, self.model_of,
                                                                                     strict=True))

    def score(self, X: np.ndarray, k: np.ndarray) -> np.ndarray:
        """Rows `X` scored by models `k` (this pack's numbers): `Trees.score` of each row's own model, one walk."""
        n, nf = X.shape
        if not n:
            return np.zeros(0)
        Z = _scaled(X, self.center[k], self.scale[k])  # each row's own scaler: the same arithmetic per cell
        Xf = np.ascontiguousarray(Z, np.float32).ravel()  # scikit-learn's trees compare float32 inputs
        kids, feat, thr = self.kids, self.feat, self.thr
        T = self.roots.shape[1]
        depths = np.zeros(n)
        step = max(1, _CHUNK_CELLS // T)
        for a in range(0, n, step):
            b = min(a + step, n)
            at = np.arange(a, b, dtype=np.int64)[None, :] * nf
            nodes = np.ascontiguousarray(self.roots[k[a:b]].T)  # (trees, rows): each row's model's roots
            for _ in range(self.depth - 1):  # leaves point to themselves: extra steps change nothing
                nodes = kids[nodes * 2 + (Xf[at + feat[nodes]] <= thr[nodes])]
            depths[a:b] = np.add.accumulate(self.term[nodes], axis=0)[-1]  # sequential, as Trees.score
        den = self.denominator[k]
        return 2 ** (-np.divide(depths, den, out=np.ones_like(depths), where=den != 0))


@dataclass
class _Scored:
    """What the last scoring saw: each row's cohort, features (as raw bits) and model, and the result."""

    cohort_names: list[str]
    cohort: np.ndarray
    bits: np.ndarray  # equal bits under the same model: equal score (NaN-safe; -0.0 vs 0.0 is merely rescored)
    model_of: list[CohortModel | None]  # per cohort index
    score: np.ndarray
    threshold: np.ndarray


class ModelStore:
    """Current model per cohort name; versions count up per cohort.

    Scoring remembers each cohort's last rows and scores: a row whose features are the same bits as last
    time, under the same model, keeps its score (a score is a function of the row and the model alone), so
    a cycle rescores only the ports whose features moved. Between polls most ports bring no new sample, and
    their features, hence their scores, stay as they were (the detector is cadence-invariant, detection.md).
    """

    def __init__(self) -> None:
        self.models: dict[str, CohortModel] = {}
        self.new: list[CohortModel] = []  # trained since the last save (store.py drains it)
        # cohort -> version of a stored model that could not be used (store.py); the engine retrains
        # at its next cycle, and new versions continue after the unusable one
        self.unusable: dict[str, int] = {}
        self._last: _Scored | None = None
        self._pack: _Pack | None = None  # the current models as one forest (rebuilt when one changes)
        self.rows_scored = 0  # rows the trees walked (the rest kept their score), for tests and the benchmark

    def retrain(self, X: np.ndarray, cohort_of_row: np.ndarray, cohort_names: list[str], at_ms: int,
                cfg: Config) -> int:
        n = 0
        for ci in np.unique(cohort_of_row).tolist():
            name = cohort_names[ci] if 0 <= ci < len(cohort_names) else None
            if name is None:
                continue
            old = self.models.get(name)
            version = max(old.version if old else 0, self.unusable.get(name, 0)) + 1
            m = train_cohort(name, X[cohort_of_row == ci], at_ms, version, cfg)
            if m is not None:
                self.models[name] = m
                # a version superseded before it was saved is never current again: only the newest unsaved
                # version of a cohort waits for the save (a live cycle saves after each training, so this
                # drops nothing there; a replay never saves and would otherwise hold every version it trains)
                self.new = [k for k in self.new if k.cohort != name]
                self.new.append(m)
                n += 1
        self.unusable.clear()  # tried: a cohort with too few rows waits, like a new one
        return n

    def score(self, X: np.ndarray, cohort: np.ndarray, cohort_names: list[str]) -> tuple[np.ndarray, np.ndarray]:
        """(score, threshold) per row; NaN where the row's cohort has no model yet."""
        n_c = len(cohort_names)
        model_of = [self.models.get(name) for name in cohort_names]
        bits = np.ascontiguousarray(X, np.float64).view(np.uint64).copy()  # a copy: X may be changed later
        last = self._last
        if last is not None and last.cohort_names == cohort_names and np.array_equal(last.cohort, cohort) \
                and last.bits.shape == bits.shape:
            s, th = last.score.copy(), last.threshold.copy()
            moved = (bits != last.bits).any(axis=1)
            for ci in range(n_c):
                if model_of[ci] is not last.model_of[ci]:  # a new model (or a first one): all its rows
                    moved |= cohort == ci
        else:
            s, th = np.full(len(X), np.nan), np.full(len(X), np.nan)
            moved = np.ones(len(X), bool)
        pack = self._pack
        if pack is None or not pack.fits(model_of):
            pack = self._pack = _Pack.build(model_of, X.shape[1] if X.ndim == 2 else -1)
        if pack is not None and moved.any():  # every moved row with a model, in one walk
            ok = (cohort >= 0) & (cohort < n_c)
            k = np.where(ok, pack.index[np.where(ok, cohort, 0)], -1)
            rows = np.flatnonzero(moved & (k >= 0))
            s[moved], th[moved] = np.nan, np.nan  # no model: no score
            s[rows], th[rows] = pack.score(X[rows], k[rows]), pack.threshold[k[rows]]
            self.rows_scored += len(rows)
        elif all(m is None for m in model_of):  # no model yet (a replay's first day): no scores, in one step
            s[moved], th[moved] = np.nan, np.nan
        else:
            for ci in np.unique(cohort[moved]).tolist():
                rows = np.flatnonzero(moved & (cohort == ci))
                m = model_of[ci] if 0 <= ci < n_c else None
                if m is None:
                    s[rows], th[rows] = np.nan, np.nan
                    continue
                s[rows], th[rows] = m.score(X[rows]), m.threshold
                self.rows_scored += len(rows)
        self._last = _Scored(list(cohort_names), cohort.copy(), bits, model_of, s.copy(), th.copy())
        return s, th
