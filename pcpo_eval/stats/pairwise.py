"""Pairwise-comparison statistics: exact binomial intervals and tests, Bradley-Terry, Krippendorff's alpha.

General formulas, one home each, used by the human preference study (:mod:`pcpo_eval.human.analysis`)
and the calibration benchmark; nothing here knows a study folder or its tables.

* **Win rates**: :func:`rate` (k / n, None when n = 0), the exact (Clopper-Pearson 1934) interval
  :func:`clopper_pearson` and the exact two-sided binomial test against 1/2 :func:`binomial_p`
  (``scipy.stats.binomtest``).
* **Bradley-Terry** (:func:`fit_bradley_terry`): maximum-likelihood log-strengths by the MM
  algorithm (Hunter 2004, "MM algorithms for generalized Bradley-Terry models", Ann. Stat. 32(1),
  eq. 3), ties as half a win to each side (as Chatbot Arena), anchored at 0 for the first item;
  existence by Ford's (1957) condition; Chatbot Arena's Elo-like scale ``400 / ln 10 * s + 1000``;
  95% percentile bootstrap CIs over resampled comparisons, or over resampled raters (``clusters``: all
  of a rater's answers together, since they are not independent); the predicted win-probability matrix.
* **Agreement**: Krippendorff's alpha for nominal data from the coincidence matrix (Krippendorff
  2011, "Computing Krippendorff's Alpha-Reliability", any number of coders per unit):
  :func:`krippendorff_alpha_nominal`, :func:`krippendorff_alpha_from_counts`; raw pairwise percent
  agreement :func:`percent_agreement`.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np

ELO_SCALE = 400.0 / math.log(10.0)  # Chatbot Arena: SCALE = 400, BASE = 10
ELO_INIT = 1000.0
BT_TOL = 1e-10  # MM stops when no log-strength moves more than this
BT_MAXIT = 10_000
#: the fewest raters a bootstrap over raters resamples (1 gives zero-width intervals, 2 two-point ones)
MIN_CLUSTERS = 3


# -- win rates: exact binomial interval and test ------------------------------------------------


def rate(k: float, n: int) -> float | None:
    """k / n; None when n = 0."""
    return k / n if n else None


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Exact (Clopper-Pearson) CI for a binomial proportion k / n; (None, None) when n = 0.

    Limits are Beta quantiles: Beta(a/2; k, n-k+1) and Beta(1-a/2; k+1, n-k) (Clopper & Pearson
    1934), as ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``.
    """
    from scipy.special import betaincinv

    if n == 0:
        return None, None
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - a / 2))
    return lo, hi


def binomial_p(k: int, n: int) -> float | None:
    """Exact two-sided binomial p against 1/2 (``scipy.stats.binomtest``); None when n = 0."""
    from scipy.stats import binomtest

    return float(binomtest(k, n, 0.5).pvalue) if n else None


def binomial_power(p1: float, n: int, alpha: float = 0.05) -> float:
    """Power of the exact two-sided binomial test against 1/2 (:func:`binomial_p`) at ``n`` trials
    when the true rate is ``p1``: the probability of a count whose p is below ``alpha``."""
    from scipy.stats import binom

    k = np.arange(n + 1)
    # scipy's two-sided p at 1/2 (a symmetric null): 2 P(K >= max(k, n - k)), capped at 1
    p = np.minimum(1.0, 2.0 * binom.sf(np.maximum(k, n - k) - 1, n, 0.5))
    return float(binom.pmf(k[p < alpha], n, p1).sum())


def binomial_mde(n: int, alpha: float = 0.05, power: float = 0.8) -> float | None:
    """Smallest win rate above 1/2 that :func:`binomial_p` detects with probability ``power`` at
    ``n`` decisive answers (by symmetry ``1 - rate`` below 1/2); None when no rate up to 1 does
    (too few answers: fewer than 6 at alpha 0.05)."""
    from scipy.optimize import brentq

    if n < 1 or binomial_power(1.0, n, alpha) < power:
        return None
    return float(brentq(lambda q: binomial_power(q, n, alpha) - power, 0.5, 1.0, xtol=1e-9))


# -- Bradley-Terry ------------------------------------------------------------------------------


def bt_mm(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zermelo / MM iteration (Hunter 2004, eq. 3) on a batch of win matrices ``w`` (B, m, m).

    ``w[b, i, j]`` = wins of i over j (ties counted half to each side). Returns the log-strengths
    anchored at item 0 (B, m) and which replicates converged (B,).
    """
    games = w + np.swapaxes(w, 1, 2)
    wins = w.sum(axis=2)
    p = np.ones(w.shape[:2])
    done = np.zeros(w.shape[0], dtype=bool)
    for _ in range(BT_MAXIT):
        denom = (games / (p[:, :, None] + p[:, None, :])).sum(axis=2)
        new = wins / denom
        new = new / new[:, :1]
        step = np.max(np.abs(np.log(new) - np.log(p)), axis=1)
        p = new
        done = step < BT_TOL
        if done.all():
            break
    return np.log(p), done


def bt_exists(w: np.ndarray) -> bool:
    """Ford's condition: the directed 'i beat j at least half a time' graph is strongly connected."""
    from scipy.sparse.csgraph import connected_components

    n_comp, _ = connected_components(w > 0, directed=True, connection="strong")
    return n_comp == 1


def win_tensor(a: np.ndarray, b: np.ndarray, val: np.ndarray, idx: np.ndarray, m: int) -> np.ndarray:
    """Win matrices (B, m, m) of the comparisons ``idx`` (B, n): a beats b by ``val`` (1, 1/2 or 0)."""
    nb = idx.shape[0]
    base = np.arange(nb)[:, None] * m * m
    size = nb * m * m
    w = np.bincount((base + a[idx] * m + b[idx]).ravel(), weights=val[idx].ravel(), minlength=size)
    w += np.bincount((base + b[idx] * m + a[idx]).ravel(), weights=1.0 - val[idx].ravel(), minlength=size)
    return w.reshape(nb, m, m)


def fit_bradley_terry(
    a: np.ndarray, b: np.ndarray, val: np.ndarray, items: list[str], bootstrap: int, seed: int,
    clusters: np.ndarray | None = None,
) -> dict[str, Any]:
    """Bradley-Terry log-strengths, Elo-like scale, bootstrap CIs and win probabilities.

    Comparison i is item ``a[i]`` against item ``b[i]`` (indices into ``items``), won by a with
    ``val[i]`` (1, 0, or 1/2 for a tie). Strengths are anchored at ``items[0]``; ``log_strength``
    is None (with a reason) when the maximum-likelihood strengths do not exist (Ford's condition).
    ``clusters``: who gave comparison i (a rater id); the bootstrap then resamples them (:func:`bt_bootstrap`).
    """
    m, n = len(items), a.size
    w = win_tensor(a, b, val, np.arange(n)[None, :], m)
    out: dict[str, Any] = {
        "methods": items, "anchor": items[0], "n_responses": n,
        "ties": "counted as half a win to each side (as Chatbot Arena)",
        "elo_scale": "400 / ln(10) * log_strength + 1000 (Chatbot Arena)",
    }
    if not bt_exists(w[0]):
        return {**out, "log_strength": None, "reason": "the maximum-likelihood strengths do not exist: some "
                "method(s) never won (or never lost) against the rest (Ford's condition)"}
    s, _ = bt_mm(w)
    s = s[0]
    out["log_strength"] = dict(zip(items, s.tolist(), strict=True))
    out["elo"] = {x: ELO_SCALE * v + ELO_INIT for x, v in out["log_strength"].items()}
    prob = 1.0 / (1.0 + np.exp(-(s[:, None] - s[None, :])))
    out["win_probability"] = {"rows_beat_columns": items, "matrix": prob.tolist()}
    out["bootstrap"] = bt_bootstrap(a, b, val, m, bootstrap, seed, items, clusters)
    return out


def cluster_counts(clusters: np.ndarray, reps: int, rng: np.random.Generator) -> tuple[np.ndarray, np.ndarray]:
    """A cluster bootstrap's draws: (reps, k) times each of the k clusters was drawn (with replacement) in
    each replicate, and each comparison's cluster index (so comparison i counts ``counts[r, inv[i]]`` times)."""
    _, inv = np.unique(clusters, return_inverse=True)
    k = int(inv.max()) + 1
    return rng.multinomial(k, np.full(k, 1.0 / k), size=reps), inv


def cluster_win_tensor(a: np.ndarray, b: np.ndarray, val: np.ndarray, inv: np.ndarray, k: int, m: int) -> np.ndarray:
    """Each cluster's own win matrix (k, m, m): a replicate's matrix is then its cluster counts times these
    (memory in clusters, not in answers: a dense replicates x answers weight matrix took 15.6 KB per answer
    at 1,000 replicates, 6.1 GiB for 400,000 answers)."""
    w = np.bincount(inv * m * m + a * m + b, weights=val, minlength=k * m * m)
    w += np.bincount(inv * m * m + b * m + a, weights=1.0 - val, minlength=k * m * m)
    return w.reshape(k, m, m)


#: answers x replicates drawn at once by the answer bootstrap (bounds its memory at a few hundred MB)
BOOT_BLOCK = 4_000_000


def bt_bootstrap(a: np.ndarray, b: np.ndarray, val: np.ndarray, m: int, reps: int, seed: int,
                 items: list[str], clusters: np.ndarray | None = None) -> dict[str, Any]:
    """95% percentile CIs of log-strength and Elo over ``reps`` resamples of the comparisons, or of their
    ``clusters`` (raters) when given. Resampling answers treats a rater's answers as independent: in
    simulated A/A human studies with one rater giving most answers (rater and prompt effects SD 0.3 on the
    logit) an Elo interval excluded the anchor in 42.7% of studies, 16.7% with raters resampled
    (``benchmarks/bench_human.py --part ci``)."""
    info: dict[str, Any] = {"replicates": reps, "seed": seed, "used": 0, "log_strength_ci95": None,
                            "elo_ci95": None, "resampled": "answers" if clusters is None else "raters"}
    if reps <= 0:
        return info
    rng = np.random.default_rng(seed)
    if clusters is not None and (k := len(np.unique(clusters))) < MIN_CLUSTERS:
        # every resample of 1 rater is the data itself: a zero-width "interval" where nothing is known
        return {**info, "reason": f"{k} rater(s): an interval over raters needs at least {MIN_CLUSTERS}"}
    if clusters is None:  # blocks of replicates: the same draws as one (reps, n) array, in bounded memory
        step = max(1, BOOT_BLOCK // max(a.size, 1))
        w = np.concatenate([win_tensor(a, b, val, rng.integers(0, a.size, (min(step, reps - i), a.size)), m)
                            for i in range(0, reps, step)])
    else:
        counts, inv = cluster_counts(np.asarray(clusters), reps, rng)
        per = cluster_win_tensor(a, b, val, inv, counts.shape[1], m)
        w = (counts.astype(np.float64) @ per.reshape(per.shape[0], m * m)).reshape(reps, m, m)
    ok = np.array([bt_exists(wi) for wi in w])
    s, done = bt_mm(w[ok]) if ok.any() else (np.zeros((0, m)), np.zeros(0, bool))
    s = s[done]
    info["used"] = int(s.shape[0])
    info["dropped"] = f"{reps - s.shape[0]} resample(s) without finite maximum-likelihood strengths"
    if s.shape[0] < 2:
        return info
    lo, hi = np.percentile(s, [2.5, 97.5], axis=0)
    info["log_strength_ci95"] = {x: [float(lo[i]), float(hi[i])] for i, x in enumerate(items)}
    info["elo_ci95"] = {x: [ELO_SCALE * float(lo[i]) + ELO_INIT, ELO_SCALE * float(hi[i]) + ELO_INIT]
                        for i, x in enumerate(items)}
    return info


# -- agreement ----------------------------------------------------------------------------------


def krippendorff_alpha_from_counts(cnt: np.ndarray) -> float | None:
    """Nominal alpha from a (units, categories) matrix of value counts, units with >= 2 values.

    Coincidences o_ck = sum_u (ordered value pairs (c, k) from different coders in unit u) /
    (m_u - 1); alpha = 1 - (n - 1) sum_{c != k} o_ck / sum_{c != k} n_c n_k (Krippendorff 2011).
    None when undefined (no pairable unit, or no expected disagreement).
    """
    m = cnt.sum(axis=1)
    cnt = cnt[m >= 2]
    if cnt.shape[0] == 0:
        return None
    scaled = cnt / (cnt.sum(axis=1, keepdims=True) - 1.0)
    o = scaled.T @ cnt - np.diag(scaled.sum(axis=0))  # coincidences o_ck
    nc = o.sum(axis=1)
    n = nc.sum()
    expected = n * n - float(nc @ nc)
    if expected <= 0:
        return None
    return float(1.0 - (n - 1.0) * (o.sum() - np.trace(o)) / expected)


def krippendorff_alpha_nominal(units: list[list[Any]]) -> float | None:
    """Krippendorff's alpha, nominal metric, over units with any number (>= 2 counted) of values.

    Coincidence matrix o_ck = sum_u (number of ordered value pairs (c, k) from different coders in
    unit u) / (m_u - 1); alpha = 1 - (n - 1) sum_{c != k} o_ck / sum_{c != k} n_c n_k (Krippendorff
    2011). Units with fewer than 2 values are not pairable and are ignored. None when undefined
    (no pairable unit, or every value in one category: no expected disagreement).
    """
    units = [list(u) for u in units if len(u) >= 2]
    cats = sorted({v for u in units for v in u}, key=str)
    if not units:
        return None
    pos = {c: i for i, c in enumerate(cats)}
    cnt = np.array([np.bincount([pos[v] for v in u], minlength=len(cats)) for u in units], dtype=float)
    return krippendorff_alpha_from_counts(cnt)


def percent_agreement(cnt: np.ndarray) -> tuple[float, float]:
    """Agreeing and all rater pairs, pooled over units, from a (units, categories) count matrix.

    Raw percent agreement is their ratio: of all pairs of ratings of the same unit, the share that
    agree (sum_u sum_c C(n_uc, 2) / sum_u C(m_u, 2)).
    """
    m = cnt.sum(axis=1)
    return float((cnt * (cnt - 1) / 2).sum()), float((m * (m - 1) / 2).sum())
