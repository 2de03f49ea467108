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
detectable effect* (MDE) is the ``delta`` with power 0.8 at a run-to-run spread (``s_d`` or ``s_b, s_t``);
:func:`seeds_needed` is the smallest number of seeds per arm that detects a stated ``delta`` with power 0.8.

**Measured spread.** A verdict's spread is measured from its own few runs, and with 3 seeds an SD is
itself uncertain (its 95% CI spans about 0.5x to 6x). Taken as the truth (the plug-in MDE), it gives an
effect that studies of this design detect less often than promised, because a study that happened to
measure a small spread prints a small MDE: an effect planted at each study's plug-in MDE was found in
0.629 of them at 3 paired seeds, 0.685 at 5 and 0.739 at 10 for normal runs (:func:`expected_power` at 1
plug-in MDE), and as often on real toy runs (``benchmarks/bench_mde_power.py``). So a verdict's MDE
(``measured=True``) is the effect whose power *averaged over the uncertainty of the measured spread*
is 0.8: with ``s / sigma ~ sqrt(chi2_df / df)`` the power at ``c`` plug-in MDEs is averaged over that
distribution and ``c`` (:func:`spread_factor`) solved for 0.8 -- exact for the paired t. For Welch's test the
factor is read at :func:`welch_spread_df`: the smaller of the df of its SE at equal true SDs (from the run
counts alone) and Welch-Satterthwaite's df at the measured SDs (each alone fell short in one regime:
unequal run counts, unequal SDs; drawing each arm's true SD apart was needlessly conservative at equal
run counts). ``tests/stats/test_power.py`` checks both tests by
simulation over normal studies (paired 3 and 5 seeds; Welch 3 vs 3, 3 vs 6, 2 vs 10);
``benchmarks/bench_mde_power.py`` on real toy runs. The same average, over the studies that could have measured this
spread, is what a reviewer's replication sees; it is also the "assurance" of O'Hagan, Stevens & Campbell
(2005) under the reference prior for ``sigma``. :func:`seeds_needed` with ``measured`` averages the same
way over a spread measured from that many runs (a pilot's or the study's own).
:mod:`benchmarks.bench_verdict_calibration` measures the power the shipped tests actually reach on real
toy runs.

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
#: quantile points of a measured SD's sampling distribution over which :func:`expected_power` averages
#: (midpoint rule; the factor of :func:`spread_factor` moves by < 1e-3 from 256 to 4,096 points)
SPREAD_POINTS = 256
#: below this many degrees of freedom a measured spread says too little for any effect to have 80% power on
#: average (:func:`spread_factor` is infinite; an MDE is then None: nothing is detectable)
MIN_SPREAD_DF = 1.0


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


def equal_spread_df(n_b: int, n_t: int) -> float:
    """Welch-Satterthwaite's df at equal true SDs, ``(1/n_b + 1/n_t)^2 / (1/(n_b^2 (n_b-1)) + 1/(n_t^2 (n_t-1)))``:
    how many degrees of freedom the Welch SE of ``n_b`` vs ``n_t`` runs is measured with, from the run
    counts alone."""
    return (1 / n_b + 1 / n_t) ** 2 / (1 / (n_b**2 * (n_b - 1)) + 1 / (n_t**2 * (n_t - 1)))


def welch_spread_df(sd_b: float, n_b: int, sd_t: float, n_t: int) -> float:
    """The df at which a Welch MDE's :func:`spread_factor` is read: the smaller of :func:`equal_spread_df` and
    Welch-Satterthwaite's df at the measured SDs. The first alone fell short of 80% with one arm's SD several
    times the other's, where the SE is the noisy arm's, about ``n - 1`` df; the second alone is larger
    exactly when the smaller arm's spread came out small, and fell short at 2 vs 10 runs of equal SDs
    (``tests/stats/test_power.py`` checks both regimes)."""
    return min(_se_df(sd_b, sd_t, n_b, n_t, False)[1], equal_spread_df(n_b, n_t))


def _welch_df(vb: np.ndarray, vt: np.ndarray, n_b: int, n_t: int) -> np.ndarray:
    """Welch-Satterthwaite's df of each draw's estimated squared SEs ``vb``, ``vt`` (no spread at all: the
    normal limit, 1e6 df)."""
    with np.errstate(divide="ignore", invalid="ignore"):
        df = (vb + vt) ** 2 / (vb**2 / (n_b - 1) + vt**2 / (n_t - 1))
    return np.where(np.isfinite(df), df, 1e6)


def _welch_parts(sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float) -> tuple[np.ndarray, np.ndarray]:
    """Per draw: the mean difference's error, and the critical value times the estimated SE, so Welch's test
    rejects a true difference ``delta`` where ``|delta + error| > critical``."""
    z, cb, ct = _welch_sample(n_b, n_t)
    vb, vt = sd_b**2 / n_b, sd_t**2 / n_t
    eb, et = vb * cb, vt * ct
    q = scipy.stats.t.ppf(1 - alpha / 2, _welch_df(eb, et, n_b, n_t))
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


#: normal studies drawn for :func:`bounded_welch_power` (Monte Carlo SE of a power near 0.8: 0.009)
BOUNDED_DRAWS = 2_000
#: relabellings up to which :func:`bounded_welch_mde` is computed; with more, the exact permutation test
#: is nearly as powerful as Welch's and Welch's MDE stands (3 vs 10 runs: 286; 5 vs 10: 3,003)
BOUNDED_LIMIT = 1_000


@functools.lru_cache(maxsize=32)
def _bounded_sample(n_b: int, n_t: int) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
    """The fixed draws of :func:`bounded_welch_power`: standard normal runs of both arms, and every
    relabelling of the ``n_b + n_t`` runs (True = treatment)."""
    from pcpo_eval.stats.permutation import _relabellings

    rng = np.random.default_rng([WELCH_SEED, n_b, n_t, 2])
    mask, _ = _relabellings(n_b, n_t, rng, BOUNDED_LIMIT, 0)
    return rng.standard_normal((BOUNDED_DRAWS, n_b)), rng.standard_normal((BOUNDED_DRAWS, n_t)), mask


def bounded_welch_power(delta: float, sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float = 0.05) -> float:
    """Power of the test an unpaired verdict row runs where Welch's t is not trusted alone
    (:func:`pcpo_eval.stats.permutation.t_not_robust`: an arm of 2 runs, unequal arms, one arm without
    spread): significant when the *larger* of Welch's p and the exact relabelling test's p is below
    ``alpha``. Over :data:`BOUNDED_DRAWS` fixed normal studies; needs at most :data:`BOUNDED_LIMIT`
    relabellings."""
    zb, zt, mask = _bounded_sample(n_b, n_t)
    b, t = sd_b * zb, sd_t * zt + delta
    vb, vt = b.var(axis=1, ddof=1) / n_b, t.var(axis=1, ddof=1) / n_t
    diff = t.mean(axis=1) - b.mean(axis=1)
    with np.errstate(divide="ignore", invalid="ignore"):
        p_welch = 2 * scipy.stats.t.sf(np.abs(diff) / np.sqrt(vb + vt), _welch_df(vb, vt, n_b, n_t))
    p_welch = np.where(np.isfinite(p_welch), p_welch, np.where(diff != 0, 0.0, 1.0))  # no spread at all
    x = np.concatenate([b, t], axis=1)
    s_t = x @ mask.T.astype(np.float64)  # (draws, relabellings): each relabelling's treatment sum
    perm = s_t / n_t - (x.sum(axis=1, keepdims=True) - s_t) / n_b
    obs = np.abs(diff)[:, None]
    p_perm = np.mean(np.abs(perm) >= obs - 1e-9 * np.maximum(1.0, obs), axis=1)
    return float(np.mean(np.maximum(p_welch, p_perm) < alpha))


def bounded_welch_mde(sd_b: float, n_b: int, sd_t: float, n_t: int, *, alpha: float = 0.05, power: float = POWER,
                      measured: bool = False) -> float | None:
    """The smallest |delta| with :func:`bounded_welch_power` >= ``power`` (``measured``: times
    :func:`spread_factor` at :func:`welch_spread_df`, as :func:`mde`); None with more than
    :data:`BOUNDED_LIMIT` relabellings (Welch's :func:`mde` then stands), without a finite spread, or when
    the exact test can never pass ``alpha``. Welch's MDE was printed for such rows: an effect planted at it
    was found in 0.69-0.71 of fresh 2 vs 10 studies of real toy runs (``benchmarks/bench_mde_power.py``)."""
    if (math.comb(n_b + n_t, n_t) > BOUNDED_LIMIT or min(n_b, n_t) < 2
            or not (math.isfinite(sd_b) and math.isfinite(sd_t)) or sd_b + sd_t == 0):
        return None
    scale = max(sd_b, sd_t)  # the MDE scales with the SDs: solved once per SD ratio
    unit = _bounded_unit_mde(round(sd_b / scale, 9), n_b, round(sd_t / scale, 9), n_t, alpha, power)
    if unit is None:
        return None
    factor = spread_factor(welch_spread_df(sd_b, n_b, sd_t, n_t), alpha, power) if measured else 1.0
    return scale * unit * factor if math.isfinite(factor) else None


#: relative precision of :func:`bounded_welch_mde`'s search (its 2,000 draws carry a power SE of 0.009)
BOUNDED_RTOL = 1e-3


@functools.lru_cache(maxsize=256)
def _bounded_unit_mde(sd_b: float, n_b: int, sd_t: float, n_t: int, alpha: float, power: float) -> float | None:
    """:func:`bounded_welch_mde` at SDs scaled so the larger is 1."""
    lo = hi = _welch_mde(sd_b, n_b, sd_t, n_t, alpha, power)  # the bound only lowers the power
    for _ in range(40):
        if bounded_welch_power(hi, sd_b, n_b, sd_t, n_t, alpha) >= power:
            break
        lo, hi = hi, hi * 1.5
    else:
        return None
    while hi - lo > BOUNDED_RTOL * hi:
        mid = (lo + hi) / 2
        lo, hi = (mid, hi) if bounded_welch_power(mid, sd_b, n_b, sd_t, n_t, alpha) < power else (lo, mid)
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
    return float(_powers_at(np.asarray([nc], dtype=np.float64), df, alpha)[0])


def _powers_at(nc: np.ndarray, df: float, alpha: float) -> np.ndarray:
    """:func:`power_at` at each noncentrality of ``nc``."""
    q = float(scipy.stats.t.ppf(1 - alpha / 2, df))
    # lower tail P(T' < -q) as sf(q; -nc): the same number, but scipy 1.17's nct.cdf(-q, df, nc) is NaN
    # at scattered nc >~ 7.5 (then the normal limit below was used: 0.92 instead of 0.73 at df 1)
    pw = scipy.stats.nct.sf(q, df, nc) + scipy.stats.nct.sf(q, df, -nc)
    bad = ~np.isfinite(pw)  # scipy's nct gives NaN far in the tail: the normal limit there
    pw[bad] = scipy.stats.norm.sf(q - nc[bad]) + scipy.stats.norm.cdf(-q - nc[bad])
    return np.minimum(pw, 1.0)


@functools.lru_cache(maxsize=512)
def _spread_ratios(df: float) -> np.ndarray:
    """:data:`SPREAD_POINTS` midpoint quantiles of ``s / sigma`` for an SD estimated with ``df`` degrees of
    freedom (``sqrt(chi2_df / df)``): the grid over which :func:`spread_factor` averages."""
    q = (np.arange(SPREAD_POINTS) + 0.5) / SPREAD_POINTS
    return np.sqrt(scipy.stats.chi2.ppf(q, df) / df)


def expected_power(nc: float, df: float, alpha: float = 0.05, spread_df: float | None = None) -> float:
    """:func:`power_at` for an effect of ``nc`` *measured* SEs, averaged over how far the true SE may lie
    from the measured one (``s / sigma ~ sqrt(chi2 / spread_df)``, ``spread_df`` defaulting to the test's
    ``df``): the power of a study of this design at that effect, over the studies that could have
    measured this SE (module docstring, "measured spread")."""
    u = _spread_ratios(float(df if spread_df is None else spread_df))
    return float(np.mean(_powers_at(nc * u, df, alpha)))


@functools.lru_cache(maxsize=512)
def spread_factor(df: float, alpha: float = 0.05, power: float = POWER) -> float:
    """How many times the plug-in MDE (the effect with ``power`` if the measured SE were the true one) an
    effect must be for the t test with ``df`` to reach ``power`` on average over the SE's own uncertainty
    (:func:`expected_power`): 1.55 at 2 df, 1.24 at 4, 1.10 at 9, 1.02 at 49 (alpha 0.05). Exact for a
    normal paired or one-sample t test, whose variance estimate is ``sigma^2 chi2_df / df``."""
    if not (math.isfinite(df) and df > 0):
        return 1.0
    if df < MIN_SPREAD_DF:  # a spread measured with less than one df: no effect is detectable on average
        return math.inf
    k0 = mde_from_se(1.0, df, alpha=alpha, power=power)
    assert k0 is not None
    f = lambda c: expected_power(c * k0, df, alpha) - power  # noqa: E731
    hi = 2.0
    while f(hi) < 0:
        hi *= 2
    return float(scipy.optimize.brentq(f, 1.0, hi, xtol=1e-10))


def mde_from_se(se: float, df: float, *, alpha: float = 0.05, power: float = POWER,
                measured: bool = False) -> float | None:
    """Smallest |effect| a two-sided Wald t test with standard error ``se`` and ``df`` detects with
    probability ``power`` (the effect in the SE's units, e.g. log-odds for a logistic model's
    coefficient); None without a finite positive SE or df. ``measured``: ``se`` is the study's own
    estimate (``df`` its degrees of freedom), so the effect is the one with ``power`` on average over
    that estimate's uncertainty (:func:`spread_factor`) rather than at the estimate taken as the truth."""
    if not (math.isfinite(se) and se > 0 and math.isfinite(df) and df > 0):
        return None
    f = lambda nc: power_at(nc, df, alpha) - power  # noqa: E731
    hi = 1.0
    while f(hi) < 0:
        hi *= 2
    k = float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-12, rtol=1e-10))
    factor = spread_factor(df, alpha, power) if measured else 1.0
    return se * k * factor if math.isfinite(factor) else None


def mde(sd_b: float, n_b: int, *, sd_t: float | None = None, n_t: int | None = None, paired: bool,
        alpha: float = 0.05, power: float = POWER, measured: bool = False) -> float | None:
    """Smallest |delta| detected with probability ``power`` (None when fewer than 2 runs/pairs or
    no spread was measured). ``measured``: the SDs are the study's own estimates, so the effect is the one
    with ``power`` on average over their uncertainty (:func:`spread_factor` at ``n - 1`` df paired, at
    :func:`welch_spread_df` unpaired), as a verdict's "detectable" must be; None where that factor is
    infinite (:data:`MIN_SPREAD_DF`)."""
    n_t = n_b if n_t is None else n_t
    sd_t = sd_b if sd_t is None else sd_t
    if min(n_b, n_t) < 2 or not (math.isfinite(sd_b) and math.isfinite(sd_t)) or sd_b + sd_t == 0:
        return None
    se, df = _se_df(sd_b, sd_t, n_b, n_t, paired)
    factor = spread_factor(df if paired else welch_spread_df(sd_b, n_b, sd_t, n_t), alpha, power) if measured else 1.0
    if not math.isfinite(factor):
        return None
    if not paired:
        return factor * _welch_mde(sd_b, n_b, sd_t, n_t, alpha, power)
    f = lambda d: t_power(d, sd_b, n_b, sd_t=sd_t, n_t=n_t, paired=paired, alpha=alpha) - power  # noqa: E731
    hi = se
    while f(hi) < 0:
        hi *= 2
    return factor * float(scipy.optimize.brentq(f, 0.0, hi, xtol=1e-12 * hi, rtol=1e-10))


def seeds_needed(delta: float, sd_b: float, *, sd_t: float | None = None, paired: bool, alpha: float = 0.05,
                 power: float = POWER, measured: int | tuple[int, int] | None = None) -> int | None:
    """Smallest seeds per arm (pairs, when paired) detecting ``delta`` with ``power``; None above
    :data:`MAX_SEEDS` or when ``delta`` is 0. At least :data:`~pcpo_eval.stats.permutation.MIN_T_RUNS`:
    with fewer runs the verdict's p is bounded by the exact permutation test's, never below 0.5 at 2 pairs,
    so no effect is detectable there (``--plan`` said "2 seeds per arm" for a spread near 0, and the planted
    effect was then found in 0 of 100 studies). ``measured``: the SDs were measured from that many pairs
    (paired) or runs per arm (unpaired: ``(n_b, n_t)``) of a finished study or a pilot, so the seeds are those
    whose power, averaged over the SDs' uncertainty (module docstring), reaches ``power``."""
    if delta == 0 or not math.isfinite(delta):
        return None
    sd_t = sd_b if sd_t is None else sd_t
    if measured is not None and min((measured,) if isinstance(measured, int) else measured) < 2:
        return None  # no spread is measured from one run

    def ok(n: int) -> bool:
        if measured is None or sd_b + sd_t == 0:
            return t_power(delta, sd_b, n, sd_t=sd_t, n_t=n, paired=paired, alpha=alpha) >= power
        if paired:  # true SD = measured / u: the effect in true SEs scales with u
            u = _spread_ratios(float(measured if isinstance(measured, int) else measured[0]) - 1)
            return float(np.mean(_powers_at(abs(delta) * math.sqrt(n) / sd_b * u, n - 1, alpha))) >= power
        m_b, m_t = (measured, measured) if isinstance(measured, int) else measured
        u = _spread_ratios(welch_spread_df(sd_b, m_b, sd_t, m_t))
        err, crit = _welch_parts(sd_b, n, sd_t, n, alpha)
        hits = np.abs(abs(delta) * u[:, None] + err[None, :]) > crit[None, :]
        return float(hits.mean()) >= power

    if not ok(MAX_SEEDS):
        return None
    lo = hi = MIN_T_RUNS
    while not ok(hi):
        lo, hi = hi, hi * 2
    while lo < hi:  # power grows with n: the smallest n with ok(n)
        mid = (lo + hi) // 2
        lo, hi = (mid + 1, hi) if not ok(mid) else (lo, mid)
    return min(lo, MAX_SEEDS)
