"""Layer 1: robust slopes over the downsampled buffers and time-to-threshold.

The full fleet gets a cheap least-squares slope; only rows that look like a decline (or a
rise, for bias) get the Theil-Sen slope (median of pairwise slopes), which a single spike
or a missing bucket does not move. Time to threshold is (value - threshold) / -slope,
capped at 30 days (detection.md A5).
"""

from __future__ import annotations

import numpy as np

TTT_CAP_H = 30 * 24.0


def ols_slope(t_h: np.ndarray, y: np.ndarray, min_points: int) -> np.ndarray:
    """Least-squares slope per row (units of y per hour); NaN where fewer than min_points."""
    ok = np.isfinite(y)
    n = ok.sum(axis=1)
    tt = np.where(ok, t_h[None, :], 0.0)
    yy = np.where(ok, y, 0.0)
    with np.errstate(invalid="ignore", divide="ignore"):
        tm = tt.sum(1) / n
        ym = yy.sum(1) / n
        cov = (np.where(ok, (t_h[None, :] - tm[:, None]) * (y - ym[:, None]), 0.0)).sum(1)
        var = (np.where(ok, (t_h[None, :] - tm[:, None]) ** 2, 0.0)).sum(1)
        s = cov / var
    return np.where(n >= min_points, s, np.nan)


def theil_sen(t_h: np.ndarray, y: np.ndarray, min_points: int) -> tuple[np.ndarray, np.ndarray]:
    """(slope per hour, intercept at the last time) per row by median of pairwise slopes."""
    K = len(t_h)
    if K < 2 or not len(y):
        return np.full(len(y), np.nan), np.full(len(y), np.nan)
    i, j = np.triu_indices(K, 1)
    dt = t_h[j] - t_h[i]
    with np.errstate(invalid="ignore", divide="ignore"):
        s = (y[:, j] - y[:, i]) / dt[None, :]
        slope = np.nanmedian(np.where(dt[None, :] > 0, s, np.nan), axis=1) if s.size else np.full(len(y), np.nan)
        # intercept: median of y - slope * (t - t_last): the robust level now
        level = np.nanmedian(y - slope[:, None] * (t_h[None, :] - t_h[-1]), axis=1)
    n = np.isfinite(y).sum(axis=1)
    bad = n < min_points
    slope[bad], level[bad] = np.nan, np.nan
    return slope, level


def time_to(level: np.ndarray, slope_per_h: np.ndarray, threshold: np.ndarray) -> np.ndarray:
    """Hours until a declining level reaches the threshold (0 if already past; inf if not declining)."""
    with np.errstate(invalid="ignore", divide="ignore"):
        h = (level - threshold) / -slope_per_h
    h = np.where(level <= threshold, 0.0, h)
    h = np.where(slope_per_h < 0, h, np.inf)
    return np.where(np.isfinite(level) & np.isfinite(threshold), np.minimum(h, np.inf), np.nan)


def detrend_temperature(t_h: np.ndarray, y: np.ndarray, temp: np.ndarray) -> np.ndarray:
    """Remove the reading's temperature coupling (F6: ~0.1 dB/C on DDM rx) per row.

    Least squares of y on (1, t, temp) per row; returns y - c * (temp - mean temp). Time stays in
    the fit so a real decline is not absorbed by a temperature that happens to drift with it.
    """
    ok = np.isfinite(y) & np.isfinite(temp)
    out = y.copy()
    for r in range(len(y)):  # candidates only: a handful of rows
        m = ok[r]
        if m.sum() < 4 or np.ptp(temp[r, m]) < 0.5:
            continue
        A = np.column_stack([np.ones(m.sum()), t_h[m], temp[r, m]])
        coef, *_ = np.linalg.lstsq(A, y[r, m], rcond=None)
        out[r, m] = y[r, m] - coef[2] * (temp[r, m] - temp[r, m].mean())
    return out


def declining(times_ms: np.ndarray, buf: np.ndarray, *, min_points: int, min_drop_per_day: float,
              rising: bool = False, temp: np.ndarray | None = None) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """Rows whose robust slope passes min_drop_per_day (down, or up with rising=True).

    `temp` (same shape as buf) is a covariate to detrend first. Returns (row indices, Theil-Sen
    slope per hour, level now) for those rows only.
    """
    if len(times_ms) < min_points or not buf.size:
        e = np.zeros(0)
        return e.astype(np.int64), e, e
    t_h = (times_ms - times_ms[-1]) / 3_600_000.0
    y = buf.astype(np.float64)
    pre = ols_slope(t_h, y, min_points) * 24.0
    sign = 1.0 if rising else -1.0
    cand = np.flatnonzero(np.isfinite(pre) & (sign * pre >= 0.5 * min_drop_per_day))
    if not len(cand):
        e = np.zeros(0)
        return cand, e, e
    yc = y[cand] if temp is None else detrend_temperature(t_h, y[cand], temp[cand].astype(np.float64))
    slope, level = theil_sen(t_h, yc, min_points)
    keep = np.isfinite(slope) & (sign * slope * 24.0 >= min_drop_per_day)
    return cand[keep], slope[keep], level[keep]
