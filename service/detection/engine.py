"""One detection cycle at data time T: features -> rules -> trends -> forest -> persistence/attribution.

`Engine.run_cycle(state, at_ms)` evaluates what the state has observed since its previous
cycle (each metric's newest observation: what arrived since then, or what it held before),
returns the findings, and then moves the rolling state on (baselines and trend buckets for the
metrics that brought new data, training reservoir, window roll). It reads no database and no clock: the
same observations and cycle times always give the same findings, which is what makes
backtest equal live detection.
"""

from __future__ import annotations

import numpy as np

from service.detection import attribution, rules, trends
from service.detection.features import Features, at_newest_event, compute, if_matrix, nan_num
from service.detection.findings import Finding
from service.detection.forest import ModelStore, reservoir_take
from service.detection.state import FeatureState


class Engine:
    """Stateless logic plus the model store (the only thing shared across restarts besides state)."""

    def __init__(self, models: ModelStore | None = None) -> None:
        self.models = models or ModelStore()

    def run_cycle(self, st: FeatureState, at_ms: int) -> list[Finding]:
        cfg, fab = st.cfg, st.fabric
        st.settle(at_ms)
        f = compute(st, at_ms)
        fresh, obs_ms, polls, hits = rules.fresh_kinds(st)
        self._bursts(st, f, fresh, obs_ms)
        if st.next_bucket_ms is None:
            st.next_bucket_ms = (at_ms // cfg.trend_bucket_ms + 1) * cfg.trend_bucket_ms
        self._trend_add(st, f)
        if at_ms >= st.next_bucket_ms:
            self._trend_close(st, at_ms)
            st.next_bucket_ms = (at_ms // cfg.trend_bucket_ms + 1) * cfg.trend_bucket_ms
        cond = rules.evaluate(f, st)
        hits.update(cond.hits)  # rate-window conditions: which of their windows held (rules.WINDOWED)
        for k in rules.OPTICAL:  # dark optics awaiting port state: not an observation (kept as they were)
            fresh[k] = fresh[k] & ~cond.wait
        X = if_matrix(f, st)
        score, th = self.models.score(X, fab.cohort, fab.cohort_names)
        physical_raw = np.zeros(fab.P, bool)
        for k in attribution.PHYSICAL_RAW:
            if k in cond.raw:
                physical_raw |= np.where(fresh.get(k, True), cond.raw[k], st.last_raw[k])
        with np.errstate(invalid="ignore"):
            cond.raw["anomaly"] = (score > th) & ~physical_raw & cond.optics_ok  # NaN compares False
        cond.score["anomaly"] = nan_num(score - th, nan=0.0)
        # time-based conditions carry their own data time: every cycle observes them
        every = np.ones(fab.P, bool)
        for k in rules.TIMED:
            fresh[k] = every
        obs_ms["flap_storm"] = f.storm_since
        obs_ms["link_down"] = st.down_since
        obs_ms["loose_module"] = np.maximum.reduce([d.t for d in st.pen.values()])
        began = st.onset["optical_degradation"] == 0
        firing, holding, eff = attribution.persist(st, cond.raw, fresh, obs_ms, at_ms, cond.now, polls, hits)
        began &= st.onset["optical_degradation"] > 0
        if began.any():  # a new optical episode: its wobble is measured from the drop on
            lanes = np.isin(fab.lane_port, np.flatnonzero(began))
            st.wob_sum[lanes], st.wob_n[lanes], st.wob_ref[lanes] = 0.0, 0, st.rx_jitter[lanes]
        st.blocked, st.degraded = cond.blocked, cond.degraded
        physical_now = np.zeros(fab.P, bool)
        for k in attribution.PHYSICAL_RAW:
            if k != "anomaly":  # a raw outlier is not flagged until it persists (training keeps such rows)
                physical_now |= eff[k]
        dev_raw, hit = attribution.shared_devices(st, eff, f)
        dev_fresh, dev_obs, dev_hits = attribution.device_observations(st, eff, hit, fresh, hits)
        k, n = attribution.SHARED_KN
        dev_fire, dev_hold, dev_count = attribution.observe_history(
            st.dev_hit, st.dev_t, st.dev_latched, dev_raw, dev_fresh, at_ms, k, n, cfg.persist_window_ms, None,
            dev_obs, dev_hits)
        dev_on = st.dev_onset
        dev_on[dev_raw & dev_fresh & (dev_on == 0)] = at_ms
        dev_on[~(dev_fire | dev_hold) & (dev_count == 0)] = 0
        dev_pending = st.dev_hit[:, -1] & ~(dev_fire | dev_hold)
        members = hit & (st.dev_hit[:, -1] | dev_fire | dev_hold)[fab.dev]
        findings = attribution.build(st, f, cond, firing, holding, dev_fire, dev_hold, dev_pending, members, at_ms)
        # anything active or raw-physical on a port freezes its baselines and keeps it out of training
        flagged = physical_now.copy()
        for kind in firing:
            if kind not in ("congestion", "pause_storm", "host_side"):  # these do not move physical baselines
                flagged |= firing[kind] | holding[kind]
        st.flagged = flagged
        flagged = flagged | cond.wait  # not judged yet: not learned either
        self._learn(st, f, X, flagged, at_ms, fresh)
        st.last_cycle_ms = at_ms
        st.cycles += 1
        st.roll()
        return findings

    # -- moving the state on ------------------------------------------------------------------
    @staticmethod
    def _bursts(st: FeatureState, f: Features, fresh: dict[str, np.ndarray], obs_ms: dict[str, np.ndarray]) -> None:
        """Error-burst onsets into the loose-module memory: a BER jump >= 1 decade over its baseline in the
        worst rate sub-window, or any post-FEC error, after Config.burst_quiet_ms without either. Errors that go
        on are one burst (a level change, or a steady trickle), not an intermittent module."""
        cfg = st.cfg
        with np.errstate(invalid="ignore"):
            ber = fresh["ber_degradation"] & (nan_num(f.log_ber_peak - st.base["logber"].loc, nan=0.0) >= 1.0)
            fec = fresh["post_fec_errors"] & (nan_num(f.post_fec, nan=0.0) > 0)
        err = ber | fec
        if not err.any():
            return
        c = st.counters
        t = np.where(ber, obs_ms["ber_degradation"], 0)
        t = np.maximum(t, np.where(fec, obs_ms["post_fec_errors"], 0))
        span = np.maximum(c["port_fec_corrected_bits_total"].h_ms, c["port_fec_uncorrectable_codewords_total"].h_ms)
        span = np.maximum(span, c["port_rx_fcs_errors_total"].h_ms)
        gap = (t - np.where(err, span, 0)) - st.burst_ms
        onset = err & ((st.burst_ms == 0) | (gap >= cfg.burst_quiet_ms))
        idx = np.flatnonzero(onset)
        if len(idx):
            order = np.argsort(t[idx], kind="stable")
            st.pen["burst"].add(idx[order], t[idx][order], np.ones(len(idx)))
            f.burst_pen = st.pen["burst"].value(f.at_ms)
            f.event_pen = at_newest_event(st)
        st.burst_ms[err] = t[err]

    @staticmethod
    def _trend_add(st: FeatureState, f: Features) -> None:
        """Each observation once into its bucket (a held value is not a new reading). A metric with no new
        reading adds nothing (an all-NaN add changes no bucket), so it is skipped."""
        fm = st.fresh_m
        if fm["optic_rx_power_dbm"].any():
            st.trend["rx"].add(np.where(fm["optic_rx_power_dbm"], f.rx, np.nan))
        if fm["optic_temperature_celsius"].any():
            st.trend["temp"].add(np.where(fm["optic_temperature_celsius"], f.temp, np.nan))
        if fm["optic_tx_bias_amperes"].any():
            with np.errstate(invalid="ignore", divide="ignore"):  # relative to baseline: %/day directly
                st.trend["bias"].add(np.where(fm["optic_tx_bias_amperes"], f.bias / st.base["bias"].loc, np.nan))

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
               fresh: dict[str, np.ndarray]) -> None:
        cfg, fab = st.cfg, st.fabric
        tau, fm = cfg.baseline_tau_ms, st.fresh_m
        lp = fab.lane_port
        # a baseline update without a fresh entity changes nothing (RobustBaseline.update): skipped, as are the
        # reservoir's rows (only fresh ports give one); most cycles of a replay bring no new sample at all
        if fm["optic_tx_power_dbm"].any() or fm["optic_tx_bias_amperes"].any():
            # a transmitter whose receiver is flagged keeps its tx/bias baseline too: a slowly dying laser must
            # not become its own new normal while the far end's alert is open (tx-vs-contamination test)
            peer = fab.peer[lp]
            tx_frozen = flagged[lp] | np.where(peer >= 0, flagged[np.maximum(peer, 0)], False)
            st.base["tx"].update(f.tx, at_ms, tau, fm["optic_tx_power_dbm"], tx_frozen)
            st.base["bias"].update(f.bias, at_ms, tau, fm["optic_tx_bias_amperes"], tx_frozen)
        if fm["optic_rx_power_dbm"].any():
            st.base["rx"].update(f.rx, at_ms, tau, fm["optic_rx_power_dbm"], flagged[lp])
        if fresh["ber_degradation"].any():
            no_flap = ~(nan_num(f.flaps, nan=0.0) > 0)
            st.base["logber"].update(f.log_ber, at_ms, tau, fresh["ber_degradation"] & no_flap, flagged)
        if fm["optic_temperature_celsius"].any():
            st.base["temp"].update(f.temp, at_ms, tau, fm["optic_temperature_celsius"], flagged)
        # training reservoir: a deterministic sample of clean rows per cohort
        if fresh["anomaly"].any():
            clean = np.flatnonzero(~flagged & fresh["anomaly"] & np.isfinite(X).any(axis=1)
                                   & (nan_num(f.oper_up, nan=1.0) > 0))
            take = reservoir_take(clean, st.obs_t["anomaly"], int(attribution._secs(at_ms)), fab.cohort,
                                  np.bincount(fab.cohort, minlength=len(fab.cohort_names)), cfg)
            if len(take):
                self._reservoir_add(st, X[take], fab.cohort[take])
        if st.first_cycle_ms is None:
            st.first_cycle_ms = at_ms
        due = (st.last_train_ms is None and at_ms - st.first_cycle_ms >= cfg.if_min_history_ms) or \
            (st.last_train_ms is not None and at_ms - st.last_train_ms >= cfg.if_retrain_ms) or \
            (st.last_train_ms is not None and bool(self.models.unusable))  # a stored model could not be loaded
        # rows added since the last trim count too: a live cycle's save flushes them into reservoir_c, a
        # replay's state is never saved, and waiting for reservoir_c alone trained it later than live
        if due and (len(st.reservoir_c) or st.reservoir_new):
            self._reservoir_trim(st)
            counts = np.bincount(st.reservoir_c, minlength=len(fab.cohort_names))
            if counts.max(initial=0) >= cfg.if_min_rows:
                self.models.retrain(st.reservoir_x, st.reservoir_c, fab.cohort_names, at_ms, cfg)
                st.last_train_ms = at_ms

    @staticmethod
    def _reservoir_add(st: FeatureState, rows: np.ndarray, cohorts: np.ndarray) -> None:
        st.reservoir_new.append((rows, cohorts.astype(np.int64)))
        # trimmed in batches (it may hold up to twice the cap between trims) and always before training
        st.reservoir_pending += len(rows)
        if st.reservoir_pending > st.cfg.if_reservoir * max(1, len(st.fabric.cohort_names)):
            Engine._reservoir_trim(st)

    @staticmethod
    def _reservoir_trim(st: FeatureState) -> None:
        """Keep the newest `if_reservoir` rows of each cohort."""
        st.reservoir_flush()
        st.reservoir_pending = 0
        cap, c = st.cfg.if_reservoir, st.reservoir_c
        order = np.lexsort((-np.arange(len(c)), c))
        sc = c[order]
        start = np.r_[True, sc[1:] != sc[:-1]]
        first = np.maximum.accumulate(np.where(start, np.arange(len(sc)), 0))
        keep = np.sort(order[(np.arange(len(sc)) - first) < cap])
        st.reservoir_keep(keep)
