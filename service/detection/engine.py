"""One detection cycle at data time T: features -> rules -> trends -> forest -> persistence/attribution.

`Engine.run_cycle(state, at_ms)` evaluates what the state has observed since its previous
cycle, returns the findings, and then moves the rolling state on (baselines, trend buckets,
decayed penalties, training reservoir, window roll). It reads no database and no clock: the
same observations and cycle times always give the same findings, which is what makes
backtest equal live detection.
"""

from __future__ import annotations

import numpy as np

from service.detection import attribution, rules, trends
from service.detection.features import IF_FEATURES, Features, compute, if_matrix
from service.detection.findings import Finding
from service.detection.forest import ModelStore
from service.detection.state import FeatureState


class Engine:
    """Stateless logic plus the model store (the only thing shared across restarts besides state)."""

    def __init__(self, models: ModelStore | None = None) -> None:
        self.models = models or ModelStore()

    def run_cycle(self, st: FeatureState, at_ms: int) -> list[Finding]:
        cfg, fab = st.cfg, st.fabric
        prev = st.last_cycle_ms
        dt_ms = (at_ms - prev) if prev is not None and at_ms > prev else 60_000
        f = compute(st, at_ms)
        self._decay(st, f, dt_ms)
        if st.next_bucket_ms is None:
            st.next_bucket_ms = (at_ms // cfg.trend_bucket_ms + 1) * cfg.trend_bucket_ms
        self._trend_add(st, f)
        if at_ms >= st.next_bucket_ms:
            self._trend_close(st, at_ms)
            st.next_bucket_ms = (at_ms // cfg.trend_bucket_ms + 1) * cfg.trend_bucket_ms
        cond = rules.evaluate(f, st)
        X = if_matrix(f, st)
        physical_now = np.zeros(fab.P, bool)
        for k in attribution.PHYSICAL_RAW:
            if k in cond.raw:
                physical_now |= cond.raw[k]
        score, th = self.models.score(X, fab.cohort, fab.cohort_names)
        with np.errstate(invalid="ignore"):
            cond.raw["anomaly"] = np.nan_to_num(score > th, nan=0.0).astype(bool) & ~physical_now & cond.optics_ok
        cond.score["anomaly"] = np.nan_to_num(score - th, nan=0.0)
        firing, holding = attribution.persist(st, cond.raw, cond.now)
        dev_raw, members = attribution.shared_devices(st, cond.raw, f)
        k, n = attribution.SHARED_KN
        dev_fire, dev_hold = attribution._step_history(st.dev_hist, st.dev_latched, dev_raw, k, n)
        findings = attribution.build(st, f, cond, firing, holding, dev_fire, dev_hold, members, at_ms)
        # anything active or raw-physical on a port freezes its baselines and keeps it out of training
        flagged = physical_now.copy()
        for kind in firing:
            if kind not in ("congestion", "pause_storm", "host_side"):  # these do not move physical baselines
                flagged |= firing[kind] | holding[kind]
        st.flagged = flagged
        self._learn(st, f, X, flagged, at_ms, dt_ms)
        st.last_cycle_ms = at_ms
        st.cycles += 1
        st.roll()
        return findings

    # -- moving the state on ------------------------------------------------------------------
    @staticmethod
    def _decay(st: FeatureState, f: Features, dt_ms: int) -> None:
        fac = 0.5 ** (dt_ms / st.cfg.decay_half_life_ms)
        pen = st.penalty
        with np.errstate(invalid="ignore"):
            pen["flap"] = pen["flap"] * fac + (np.nan_to_num(f.flaps, nan=0.0) > 0)
            # each link error recovery is a retrain (a micro-flap); a few in one poll weigh more than one
            pen["recovery"] = pen["recovery"] * fac + np.clip(np.nan_to_num(f.recoveries, nan=0.0), 0, 3)
            burst = np.nan_to_num(f.log_ber_delta, nan=0.0) >= 1.0
            # count burst onsets: a BER that stays up is a level change, not an intermittent module
            pen["burst"] = np.minimum(pen["burst"] * fac + (burst & (pen["burst_on"] == 0)), 10.0)
            pen["burst_on"] = burst.astype(float)
            pen["flap"] = np.minimum(pen["flap"], 10.0)
            pen["recovery"] = np.minimum(pen["recovery"], 10.0)

    @staticmethod
    def _trend_add(st: FeatureState, f: Features) -> None:
        st.trend["rx"].add(f.rx)
        st.trend["temp"].add(f.temp)
        with np.errstate(invalid="ignore", divide="ignore"):
            st.trend["bias"].add(f.bias / st.base["bias"].loc)  # relative to baseline: %/day directly

    @staticmethod
    def _trend_close(st: FeatureState, at_ms: int) -> None:
        cfg, fab = st.cfg, st.fabric
        lt = st.lane_trend
        for tb in st.trend.values():
            tb.close(at_ms)
        r = cfg.trend_recent_points
        t, buf = st.trend["rx"].ordered()
        _, temp = st.trend["temp"].ordered()
        t, buf, temp = t[-r:], buf[:, -r:], temp[:, -r:]
        for key in lt:
            lt[key][:] = np.nan
        rows, slope, level = trends.declining(t, buf, min_points=cfg.trend_min_points,
                                              min_drop_per_day=cfg.trend_slope_db_per_day,
                                              temp=temp[fab.lane_port])
        with np.errstate(invalid="ignore"):
            real = (level - st.base["rx"].loc[rows]) <= -cfg.trend_min_drop_db  # already moved, not just noise
        rows, slope, level = rows[real], slope[real], level[real]
        if len(rows):
            p = fab.lane_port[rows]
            lt["rx_slope"][rows], lt["rx_level"][rows] = slope, level
            lt["ttt_warn"][rows] = trends.time_to(level, slope, fab.th["rx_lw"][p])
            lt["ttt_alarm"][rows] = trends.time_to(level, slope, fab.th["rx_la"][p])
        t, buf = st.trend["bias"].ordered()
        t, buf = t[-r:], buf[:, -r:]
        rows, slope, _ = trends.declining(t, buf, min_points=cfg.trend_min_points,
                                          min_drop_per_day=cfg.bias_slope_frac_per_day, rising=True)
        if len(rows):
            lt["bias_slope"][rows] = slope

    def _learn(self, st: FeatureState, f: Features, X: np.ndarray, flagged: np.ndarray, at_ms: int,
               dt_ms: int) -> None:
        cfg, fab = st.cfg, st.fabric
        alpha = min(1.0, dt_ms / cfg.baseline_tau_ms)
        lp = fab.lane_port
        # a transmitter whose receiver is flagged keeps its tx/bias baseline too: a slowly dying laser must
        # not become its own new normal while the far end's alert is open (tx-vs-contamination test)
        peer = fab.peer[lp]
        tx_frozen = flagged[lp] | np.where(peer >= 0, flagged[np.maximum(peer, 0)], False)
        st.base["rx"].update(f.rx, alpha, flagged[lp])
        st.base["tx"].update(f.tx, alpha, tx_frozen)
        st.base["bias"].update(f.bias, alpha, tx_frozen)
        no_flap = ~(np.nan_to_num(f.flaps, nan=0.0) > 0)
        st.base["logber"].update(np.where(no_flap, f.log_ber, np.nan), alpha, flagged)
        st.base["temp"].update(f.temp, alpha, flagged)
        # training reservoir: a deterministic sample of clean rows per cohort
        clean = np.flatnonzero(~flagged & np.isfinite(X).any(axis=1) & (np.nan_to_num(f.oper_up, nan=0.0) > 0))
        if len(clean):
            rng = np.random.default_rng([at_ms & 0x7FFFFFFF, 0xF0])
            take = rng.permutation(clean)[: cfg.if_rows_per_cycle * max(1, len(fab.cohort_names))]
            take = np.sort(take)
            self._reservoir_add(st, X[take], fab.cohort[take])
        if st.first_cycle_ms is None:
            st.first_cycle_ms = at_ms
        due = (st.last_train_ms is None and at_ms - st.first_cycle_ms >= cfg.if_min_history_ms) or \
            (st.last_train_ms is not None and at_ms - st.last_train_ms >= cfg.if_retrain_ms) or \
            (st.last_train_ms is not None and bool(self.models.unusable))  # a stored model could not be loaded
        if due and len(st.reservoir_c):
            counts = np.bincount(st.reservoir_c, minlength=len(fab.cohort_names))
            if counts.max(initial=0) >= cfg.if_min_rows:
                self.models.retrain(st.reservoir_x, st.reservoir_c, fab.cohort_names, at_ms, cfg)
                st.last_train_ms = at_ms

    @staticmethod
    def _reservoir_add(st: FeatureState, rows: np.ndarray, cohorts: np.ndarray) -> None:
        cap = st.cfg.if_reservoir
        if st.reservoir_x.shape[1:] != (len(IF_FEATURES),):
            st.reservoir_x = np.zeros((0, len(IF_FEATURES)))
            st.reservoir_c = np.zeros(0, np.int64)
        x = np.concatenate([st.reservoir_x, rows])
        c = np.concatenate([st.reservoir_c, cohorts.astype(np.int64)])
        # keep the newest `cap` rows of each cohort
        order = np.lexsort((-np.arange(len(c)), c))
        sc = c[order]
        start = np.r_[True, sc[1:] != sc[:-1]]
        first = np.maximum.accumulate(np.where(start, np.arange(len(sc)), 0))
        keep = np.sort(order[(np.arange(len(sc)) - first) < cap])
        st.reservoir_x, st.reservoir_c = x[keep], c[keep]
