"""Power of the run-level t tests: the minimum detectable effect and the seeds a study needs.

Every verdict row tests a difference of run means with a t statistic (:mod:`pcpo_eval.stats.runlevel`):

* paired by seed (n pairs): ``T = mean(d) / (s_d / sqrt(n))`` with ``n - 1`` df;
* unpaired (Welch): ``T = (mean_t - mean_b) / sqrt(s_t^2/n_t + s_b^2/n_b)`` with Welch-Satterthwaite df.

Paired, under a true difference ``delta`` the statistic is noncentral t with noncentrality
``delta / se`` (the standard power calculation for the t test, e.g. R's ``power.t.test`` with
``strict = TRUE``): power = ``P(|T'| > t_{1-alpha/2, df})``, both tails counted. Welch's statistic is not
noncentral t: its SE and its df are both estimated, and the noncentral t at the true SDs' df (the textbook
approximation, and statsmodels' pooled ``TTestIndPower`` at equal SDs) overstates its power at few runs: an
effect planted at that MDE was found by Welch's test in 0.684 of 2,000 simulated 3-vs-3 studies, 0.772 at
5 vs 5, 0.741 at 2 vs 10 (normal runs at the true SDs). So the unpaired power is computed from the test's
own sampling distribution: a fixed sample of :data:`WELCH_DRAWS` draws of the mean difference's normal part
and the two variance estimates (chi-square), each draw's Welch SE, df and critical value, and the share of
draws whose statistic passes (:func:`welch_power`); at its MDE the simulated Welch power is 0.795-0.804
(``tests/stats/test_power.py``). The *minimum
detectable effect* (MDE) is the ``delta`` with power 0.8 at the run-to-run spread measured in the
study (``s_d`` or ``s_b, s_t``); :func:`seeds_needed` is the smallest number of seeds per arm that
detects a stated ``delta`` with power 0.8 at that spread. Both treat the measured spread as the
truth: with 3 seeds an SD is itself uncertain (its 95% CI spans about 0.5x to 6x), so these are
planning figures, not guarantees; :mod:`benchmarks.bench_verdict_calibration` measures the power
the shipped tests actually reach on real toy runs.

A row tested in a family of ``m`` (Holm, or Benjamini-Hochberg) is significant only when its
adjusted p is below alpha, so the effect it detects is the one its test detects at
:func:`family_level` ``alpha / m``, not at alpha: printing the unadjusted MDE would promise power the
adjusted procedure does not have: one real effect planted at the unadjusted MDE in a family of 4
paired t tests (5 seeds) was found by Holm in 0.467 of 4,000 simulated families, at the MDE at
``alpha / 4`` in 0.797 (``tests/stats/test_verdict.py``, seed 20261126).
"""

from __future__ import annotations

import functools
import math

import numpy as np
import scipy.optimize
import scipy.stats

from pcpo_eval.stats.permutation import MIN_T_RUNS

#: the power a minimum detectable effect refers to (the usual planning convention)
POWER = 0.8
#: the largest seed count :func:`seeds_needed` searches
MAX_SEEDS = 10_000
#: draws of :func:`welch_power`'s fixed sample (Monte Carlo SE of a power near 0.8: 0.003)
WELCH_DRAWS = 20_000
#: the seed of that sample (with the two run counts): every call on the same counts uses the same draws
WELCH_SEED = 20261128


def family_level(alpha: float, m: int) -> float:
    """The per-test level at which a row of a family of ``m`` tests (adjusted together by Holm or
    Benjamini-Hochberg) is found when it is the family's one real effect: ``alpha / m``, the first
    step of both (Holm 1979; BH's first step rejects the smallest p at ``alpha / m`` too). With more
    than one real effect both procedures reject at higher levels, so an MDE at this level is the
    conservative planning figure for the family; ``m <= 1`` leaves ``alpha``."""
    return alpha / max(int(m), 1)


def _se_df(sd_b: float, sd_t: float, n_b: int, n_t: int, paired: bool) -> tuple[float, float]:
    """Standard error of the difference for a unit-free delta, and the test's df."""
    if paired:
        return sd_b / math.sqrt(n_b), float(n_b - 1)  # sd_b = SD of the per-seed differences
    vb, vt = sd_b**2 / n_b, sd_t**2 / n_t
    se = math.sqrt(vb + vt)
    denom = (vb**2 / (n_b - 1) if vb else 0.0) + (vt**2 / (n_t - 1) if vt else 0.0)
    return se, ((vb + vt) ** 2 / denom if denom > 0 else 1e6)  # no spread at all: the normal limit


@functools.lru_cache(maxsize=64)
def _welch_sample(n_b: int, n_t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fixed draws of :func:`welch_power`: a standard normal (the mean difference's error over its true
    SE) and each arm's variance estimate over its true variance (chi-square over its df)."""
    rng = np.random.default_rng([WELCH_SEED, n_b, n_t])
    return (rng.standard_normal(WELCH_DRAWS), rng.chisquare(n_b - 1, WELCH_DRAWS) / (n_b - 1),
            rng.chisquare(n_t - 1, WELCH_DRAWS) / (n_t - 1))


def _welch_parts(sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: the mean difference's error, and the critical value times the estimated SE, so Welch's test
    rejects a true difference ``delta`` where ``|delta + error| > critical``."""
    z, cb, ct = _welch_sample(n_b, n_t)
    vb, vt = sd_b**2 / n_b, sd_t**2 / n_t
    eb, et = vb * cb, vt * ct
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (eb + et) ** 2 / (eb**2 / (n_b - 1) + et**2 / (n_t - 1))
    q = scipy.stats.t.ppf(1 - alpha / 2, np.where(np.isfinite(df), df, 1e6))
    return z * math.sqrt(vb + vt), q * np.sqrt(eb + et)


def welch_power(delta: float, sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float = 0.05) -> float:
    """Power of the two-sided Welch t test for a true difference ``delta`` between normal arms with SDs
    ``sd_b``, ``sd_t`` and ``n_b``, ``n_t`` runs, over :func:`_welch_sample`'s fixed draws (module docstring)."""
    err, crit = _welch_parts(sd_b, n_b, sd_t, n_t, alpha)
    return float(np.mean(np.abs(delta + err) > crit))


def _welch_mde(sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float, power: float) -> float:
    """The smallest |delta| with :func:`welch_power` >= ``power`` (bisection on the fixed draws)."""
    err, crit = _welch_parts(sd_b, n_b, sd_t, n_t, alpha)
    f = lambda d: float(np.mean(np.abs(d + err) > crit))  # noqa: E731
    lo, hi = 0.0, math.sqrt(sd_b**2 / n_b + sd_t**2 / n_t)
    while f(hi) < power:
        lo, hi = hi, hi * 2
    for _ in range(60):
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if f(mid) < power else (lo, mid)
    return hi


def t_power(delta: float, sd_b: float, n_b: int, *, sd_t: float | None = None, n_t: int | None = None,
            paired: bool, alpha: float = 0.05) -> float:
    """Power of the two-sided t test to detect a true difference ``delta``.

    Paired: ``sd_b`` is the SD of the per-seed differences and ``n_b`` the number of pairs.
    Unpaired: ``sd_b``/``sd_t`` the per-arm run SDs, ``n_b``/``n_t`` the runs per arm.
    """
    n_t = n_b if n_t is None else n_t
    sd_t = sd_b if sd_t is None else sd_t
    if min(n_b, n_t) < 2:
        return math.nan
    se, df = _se_df(sd_b, sd_t, n_b, n_t, paired)
    if se == 0.0:
        return 1.0 if delta != 0 else alpha
    if not paired:
        return welch_power(delta, sd_b, n_b, sd_t, n_t, alpha)
    return power_at(abs(delta) / se, df, alpha)


def power_at(nc: float, df: float, alpha: float = 0.05) -> float:
    """Power of a two-sided t test with ``df`` at noncentrality ``nc`` = true effect / SE:
    ``P(|T'| > t_{1-alpha/2, df})`` with ``T'`` noncentral t, both tails counted."""
    q = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    # lower tail P(T' < -q) as sf(q; -nc): the same number, but scipy 1.17's nct.cdf(-q, df, nc) is NaN
    # at scattered nc >~ 7.5 (then the normal limit below was used: 0.92 instead of 0.73 at df 1)
    pw = float(scipy.stats.nct.sf(q, df, nc) + scipy.stats.nct.sf(q, df, -nc))
    if not math.isfinite(pw):  # scipy's nct gives NaN far in the tail: the normal limit there
        pw = float(scipy.stats.norm.sf(q - nc) + scipy.stats.norm.cdf(-q - nc))
    return min(pw, 1.0)


def mde_from_se(se: float, df: float, *, alpha: float = 0.05, power: float = POWER) -> float | None:
    """Smallest |effect| a two-sided Wald t test with standard error ``se`` and ``df`` detects with
    probability ``power`` (the effect in the SE's units, e.g. log-odds for a logistic model's
    coefficient); None without a finite positive SE or df."""
    if not (math.isfinite(se) and se > 0 and math.isfinite(df) and df > 0):
        return None
    f = lambda nc: power_at(nc, df, alpha) - power  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    return se * float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-10))


def mde(sd_b: float, n_b: int, *, sd_t: float | None = None, n_t: int | None = None, paired: bool,
        alpha: float = 0.05, power: float = POWER) -> float | None:
    """Smallest |delta| detected with probability ``power`` (None when fewer than 2 runs/pairs or
    no spread was measured)."""
    n_t = n_b if n_t is None else n_t
    sd_t = sd_b if sd_t is None else sd_t
    if min(n_b, n_t) < 2 or not (math.isfinite(sd_b) and math.isfinite(sd_t)) or sd_b + sd_t == 0:
        return None
    if not paired:
        return _welch_mde(sd_b, n_b, sd_t, n_t, alpha, power)
    se, _ = _se_df(sd_b, sd_t, n_b, n_t, paired)
    f = lambda d: t_power(d, sd_b, n_b, sd_t=sd_t, n_t=n_t, paired=paired, alpha=alpha) - power  # noqa: E731
    hi = se
    while f(hi) < 0:
        hi *= 2
    return float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-12 * hi, rtol=1e-10))


def seeds_needed(delta: float, sd_b: float, *, sd_t: float | None = None, paired: bool, alpha: float = 0.05,
                 power: float = POWER) -> int | None:
    """Smallest seeds per arm (pairs, when paired) detecting ``delta`` with ``power``; None above
    :data:`MAX_SEEDS` or when ``delta`` is 0. At least :data:`~pcpo_eval.stats.permutation.MIN_T_RUNS`:
    with fewer runs the verdict's p is bounded by the exact permutation test's, never below 0.5 at 2 pairs,
    so no effect is detectable there (``--plan`` said "2 seeds per arm" for a spread near 0, and the planted
    effect was then found in 0 of 100 studies)."""
    if delta == 0 or not math.isfinite(delta):
        return None

    def ok(n: int) -> bool:
        return t_power(delta, sd_b, n, sd_t=sd_t, n_t=n, paired=paired, alpha=alpha) >= power

    if not ok(MAX_SEEDS):
        return None
    lo = hi = MIN_T_RUNS
    while not ok(hi):
        lo, hi = hi, hi * 2
    while lo < hi:  # power grows with n: the smallest n with ok(n)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if not ok(mid) else (lo, mid)
    return min(lo, MAX_SEEDS)
