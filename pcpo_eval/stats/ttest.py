"""t intervals for a difference of run means: Welch's (unpaired), the paired t, and their trimmed-mean
forms (Yuen 1974; Tukey-McLaughlin on the differences), each with its SE, df, critical value and p.

The one home of the t test every run-level row uses: :mod:`pcpo_eval.stats.runlevel` (the verdict's rows,
image-metric raw scores) and :mod:`pcpo_eval.stats.speedup` (restricted times to a target) build on it,
so "Welch" means the same numbers everywhere (``scipy.stats.ttest_ind(t, b, equal_var=False, trim=...)``).
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import scipy.stats


@dataclass(frozen=True)
class TInterval:
    """CI for a difference of (trimmed) means: estimate +- q * se, q = t_{df, 1-alpha/2} (nan without spread)."""

    estimate: float
    low: float
    high: float
    se: float
    df: float
    q: float = math.nan

    @property
    def p(self) -> float:
        """Two-sided p of the t statistic behind the interval; nan without spread."""
        if self.se == 0.0 or not math.isfinite(self.df):
            return math.nan
        return 2 * float(scipy.stats.t.sf(abs(self.estimate) / self.se, self.df))


def yuen_parts(x: np.ndarray, trim: float) -> tuple[float, float, int]:
    """Trimmed mean, squared standard error d = (n-1) s_w^2 / (h (h-1)), and h = n - 2g (Yuen 1974)."""
    n = x.size
    g = int(trim * n)  # as scipy.stats.trim_mean / ttest_ind(trim=...)
    s = np.sort(x)
    w = np.clip(s, s[g], s[n - g - 1])  # winsorised sample
    h = n - 2 * g
    return float(s[g : n - g].mean()), float((n - 1) * np.var(w, ddof=1) / (h * (h - 1))), h


def trimmed_t_interval(
    baseline: np.ndarray, treatment: np.ndarray, *, trim: float, alpha: float
) -> TInterval:
    """Welch (trim=0) or Yuen-Welch (trim>0) interval for treatment - baseline.

    se^2 = d_t + d_b; df = (d_t + d_b)^2 / (d_t^2/(h_t-1) + d_b^2/(h_b-1)) (Welch-Satterthwaite);
    the same numbers as ``scipy.stats.ttest_ind(t, b, equal_var=False, trim=trim)``.
    """
    mb, db, hb = yuen_parts(np.asarray(baseline, dtype=np.float64), trim)
    mt, dt, ht = yuen_parts(np.asarray(treatment, dtype=np.float64), trim)
    se = math.sqrt(dt + db)
    est = mt - mb
    if se == 0.0:
        return TInterval(est, est, est, 0.0, math.nan)
    df = (dt + db) ** 2 / (dt**2 / (ht - 1) + db**2 / (hb - 1))
    q = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    return TInterval(est, est - q * se, est + q * se, se, df, q)


def trimmed_paired_interval(diffs: np.ndarray, *, trim: float, alpha: float) -> TInterval:
    """One-sample (trimmed) t interval for the mean per-seed difference: the paired t interval
    (trim=0), or Tukey-McLaughlin's trimmed-mean interval on the differences (trim>0) with
    ``se^2 = d`` of :func:`yuen_parts` and ``h - 1`` df."""
    m, d, h = yuen_parts(np.asarray(diffs, dtype=np.float64), trim)
    se = math.sqrt(d)
    if se == 0.0:
        return TInterval(m, m, m, 0.0, math.nan)
    df = float(h - 1)
    q = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    return TInterval(m, m - q * se, m + q * se, se, df, q)
