"""Permutation tests over runs, and when a t test's p may decide alone: the exact relabelling and sign-flip
tests that bound a verdict's p (:func:`t_not_robust`), and the statistics they permute (mean, rliable's IQM).

The one home of these facts for :mod:`pcpo_eval.stats.runlevel` (comparisons of per-run scalars) and
:mod:`pcpo_eval.stats.speedup` (epochs to a target), which both bound their t tests by them. scipy is
imported on first use, so ``import pcpo_eval.stats`` stays scipy-free.
"""

from __future__ import annotations

import itertools
import math
from collections.abc import Callable
from dataclasses import dataclass
from typing import Literal

import numpy as np

from pcpo_eval.errors import UserError

Stat = Literal["mean", "iqm"]

#: rliable's IQM: the mean of the middle 50% (25% trimmed from each end, ``floor(0.25 n)`` runs).
IQM_TRIM = 0.25
#: Enumerate every relabelling up to this many (7 vs 7 = 3432); above it, Monte Carlo.
EXACT_PERMUTATION_LIMIT = 10_000
#: Random relabellings of the Monte Carlo permutation test.
MC_PERMUTATIONS = 9_999


def iqm(x: np.ndarray, axis: int | None = None) -> np.ndarray | float:
    """Interquartile mean (rliable ``aggregate_iqm``): ``scipy.stats.trim_mean(x, 0.25)``."""
    import scipy.stats

    return scipy.stats.trim_mean(x, IQM_TRIM, axis=axis)


def stat_fn(stat: Stat) -> Callable[..., np.ndarray]:
    if stat == "mean":
        return np.mean
    if stat == "iqm":
        return iqm
    raise UserError(f"unknown stat {stat!r}; choose 'mean' or 'iqm'")


@dataclass(frozen=True)
class PermutationTest:
    """Two-sided permutation test of stat(treatment) - stat(baseline) over run relabellings."""

    p: float
    n_relabellings: int  #: every possible relabelling (sign pattern), drawn or not
    exact: bool
    p_min: float
    n_drawn: int = 0  #: how many were evaluated (all when ``exact``; the Monte Carlo draws otherwise)

    def scope(self) -> str:
        """What the p was computed over, for a sentence: "all 20" or "9,999 random of 2^40" (a Monte Carlo
        test printed the count of every pattern, a 302-digit number at 1000 seeds, as if it had drawn them)."""
        if self.exact:
            return f"all {self.n_relabellings:,}"
        total = f"{self.n_relabellings:,}" if self.n_relabellings < 10**12 else f"about 10^{len(str(self.n_relabellings)) - 1}"
        return f"{self.n_drawn:,} random of {total}"


def _relabellings(
    n_b: int, n_t: int, rng: np.random.Generator, limit: int, n_resamples: int
) -> tuple[np.ndarray, bool]:
    """Boolean masks (M, n_b + n_t), True = treatment: every relabelling, or random ones."""
    n = n_b + n_t
    if math.comb(n, n_t) <= limit:
        idx = np.asarray(list(itertools.combinations(range(n), n_t)), dtype=np.intp)
        mask = np.zeros((idx.shape[0], n), dtype=bool)
        mask[np.arange(idx.shape[0])[:, None], idx] = True
        return mask, True
    labels = np.r_[np.zeros(n_b, dtype=bool), np.ones(n_t, dtype=bool)]
    return rng.permuted(np.tile(labels, (n_resamples, 1)), axis=1), False


def permutation_test(
    baseline: np.ndarray,
    treatment: np.ndarray,
    *,
    rng: np.random.Generator,
    stat: Stat = "mean",
    limit: int = EXACT_PERMUTATION_LIMIT,
    n_resamples: int = MC_PERMUTATIONS,
) -> PermutationTest:
    """p = share of relabellings with |T*| >= |T_obs| (exact), or (1 + hits) / (1 + B) (Monte Carlo).

    The observed labelling is one of the exact relabellings, so p >= 1 / C(n_b + n_t, n_t);
    ``p_min`` is the smallest p the data allow (3 vs 3 distinct values: 2/20).
    """
    f = stat_fn(stat)
    b, t = np.asarray(baseline, dtype=np.float64), np.asarray(treatment, dtype=np.float64)
    x = np.r_[b, t]
    mask, exact = _relabellings(b.size, t.size, rng, limit, n_resamples)
    m = mask.shape[0]
    xx = np.broadcast_to(x, mask.shape)
    perm = f(xx[mask].reshape(m, t.size), axis=1) - f(xx[~mask].reshape(m, b.size), axis=1)
    obs = abs(float(f(t) - f(b)))
    tol = 1e-9 * max(1.0, obs)  # equal sums in another order differ in the last bits
    hits = int(np.sum(np.abs(perm) >= obs - tol))
    if exact:
        p_min = float(np.mean(np.abs(perm) >= np.max(np.abs(perm)) - tol))
        return PermutationTest(hits / m, m, True, p_min, m)
    return PermutationTest((1 + hits) / (1 + m), math.comb(x.size, t.size), False, 1 / (1 + m), m)


def sign_flip_test(
    diffs: np.ndarray,
    *,
    rng: np.random.Generator,
    limit: int = EXACT_PERMUTATION_LIMIT,
    n_resamples: int = MC_PERMUTATIONS,
) -> PermutationTest:
    """Paired permutation test: under "no difference" each seed's two runs are exchangeable, so each
    difference's sign is flipped at random; p = share of the 2^n sign patterns with |mean| >= observed
    (exact up to ``limit`` patterns, else Monte Carlo ``(1 + hits) / (1 + B)``). 3 pairs: p >= 2/8."""
    d = np.asarray(diffs, dtype=np.float64)
    n = d.size
    exact = 2**n <= limit
    if exact:
        signs = 1 - 2 * ((np.arange(2**n)[:, None] >> np.arange(n)) & 1)
    else:
        signs = rng.choice(np.array([-1, 1]), size=(n_resamples, n))
    perm = np.abs((signs * d).mean(axis=1))
    obs = abs(float(d.mean()))
    tol = 1e-9 * max(1.0, obs)
    hits = int(np.sum(perm >= obs - tol))
    if exact:
        p_min = float(np.mean(perm >= perm.max() - tol))
        return PermutationTest(hits / perm.size, perm.size, True, p_min, perm.size)
    return PermutationTest((1 + hits) / (1 + perm.size), 2**n, False, 1 / (1 + perm.size), perm.size)


#: Fewest runs per arm (paired: seeds) at which a t test's p decides a comparison alone. In 1000 simulated
#: A/A studies whose runs learn or collapse with probability 1/2 each (the second verdict review's
#: ``e06b_aa_bimodal_2seeds.py``; ``tests/stats/test_verdict.py``), the paired t on 2 seeds (1 df) called
#: 9.8% of them significant at alpha 0.05, on 3 seeds 3.3%.
MIN_T_RUNS = 3


def t_not_robust(baseline: np.ndarray, treatment: np.ndarray, paired: bool) -> str:
    """Why a t test's p should not decide alone ('' when it may): fewer than :data:`MIN_T_RUNS` runs in an
    arm (paired: seeds), or (unpaired) one arm without spread, which makes Welch's t a one-sample t of the
    other arm against a pile-up (e.g. a baseline that never reached a target: every run at the last epoch),
    or (unpaired) arms of unequal size: Welch's t is then far from its nominal level when runs are skewed or
    bimodal (learn or collapse): 21.7% [17.8, 26.1] of 400 A/A studies of 10 vs 3 such runs were significant,
    and 9.2% of 600 A/A studies of 20 vs 3 seeds drawn from the toy calibration pool; with the permutation
    bound, 5.2% (the permutation test of exchangeable runs is exact under A/A).
    Where it says why, ``p`` is the larger of the t test's and the exact permutation test's, so it is never
    below the smallest p that a test of exchangeable runs can give."""
    b, t = np.asarray(baseline, dtype=np.float64), np.asarray(treatment, dtype=np.float64)
    n = min(b.size, t.size)
    if n < MIN_T_RUNS:
        unit = "seed" if paired else "run"
        return (f"{n} {unit}{'s' if n != 1 else ''}{'' if paired else ' in an arm'}: a t test needs at least "
                f"{MIN_T_RUNS} to be trusted alone")
    if not paired and (np.ptp(b) == 0) != (np.ptp(t) == 0):
        return f"every {'baseline' if np.ptp(b) == 0 else 'treatment'} run has the same value, so Welch's t is a one-sample t"
    if not paired and b.size != t.size:
        return f"{b.size} vs {t.size} runs: Welch's t is not trusted alone with unequal arms"
    return ""


# ---------------------------------------------------------------------------------------------
# one-sample, one-sided
# ---------------------------------------------------------------------------------------------


def one_sided_mean_p(x: np.ndarray) -> float:
    """p of "the mean of ``x`` is above 0": a one-sample t test, one-sided; below :data:`MIN_T_RUNS` values
    never below the exact sign-flip test's one-sided p. Every value equal: 0.5^n above 0, 1 at or below."""
    from scipy.stats import t as student_t

    x = np.asarray(x, dtype=np.float64)
    x = x[np.isfinite(x)]
    if x.size == 0 or x.mean() <= 0:
        return 1.0
    if x.size < 2 or np.ptp(x) == 0:
        return float(0.5**x.size)
    p = float(student_t.sf(x.mean() / (x.std(ddof=1) / np.sqrt(x.size)), x.size - 1))
    if x.size < MIN_T_RUNS:
        p = max(p, sign_flip_test(x, rng=np.random.default_rng(0)).p / 2)
    return p
