"""Training speed-up as time to an event: epochs to reach a target, one home for the whole suite.

The paper's headline (Table 1, tab:efficiency-results; App. Table 10, tab:full-speedup-results) is a speed-up: "(Epochs_Baseline /
Epochs_PCPO - 1) x 100%" (e.g. 260 vs 131 epochs -> 98.5%, :func:`speedup_pct`), with curves
"smoothed with a moving average window of 5 epochs". Everything that counts epochs to a target
(study verdicts, ``pcpo-eval speedup``, the report) calls this module.

1. Smoothing (:func:`full_window_average`): trailing mean over ``window`` logged epochs. A target
   can only be reached once a *full* window exists, i.e. from the ``window``-th logged epoch on
   (``first_eligible``): a single noisy first epoch is not a 5-epoch average, and with the old
   partial-window rule 38-56% of the demo's runs "reached" a target at epoch 1 (an untrained policy
   looked fast). :func:`moving_average` (partial windows at the start) is kept for drawing curves
   and for the reward shown beside a checkpoint, never for deciding that a target was reached
   (reward-matched checkpoint selection uses the same full-window rule:
   :func:`pcpo_eval.stats.select.match_checkpoint`).
2. Time to target (:func:`epochs_to_target`): the first eligible epoch whose smoothed value reaches
   the target; a run that never does is *right-censored* at its last epoch.
3. Restricted mean time (:func:`km_restricted_mean`): runs that never reach the target are censored
   observations, so the per-arm summary is the Kaplan-Meier restricted mean time to target up to
   ``tau`` (RMST, Royston & Parmar 2013): the area under the KM "not yet reached" curve from epoch 0
   to ``tau``. In a study every compared run is cut to the same last epoch (``tau``), so censoring
   happens only at ``tau`` and the KM RMST equals the plain mean of ``min(T, tau)`` (tested); the
   estimand is "expected epochs to the target, counting a run that has not reached it by ``tau`` as
   ``tau``". Assumption: censoring is administrative (the run ended), not informative.
4. Speed-up (:func:`speedup_runs`): ``RMST_baseline / RMST_treatment - 1``. The test of "no
   speed-up" is a t test on the per-run times ``min(T, tau)``: *paired by seed* (the same seed draws
   the same prompts and noises in both arms) when both arms share their seeds, else Welch. Its CI is
   Fieller's interval for the ratio of means (Fieller 1954) built from the *same* t statistic: the
   set of ratios ``rho`` with ``|mean_b - rho mean_t| <= q se(rho)``, ``se(rho)^2 = var(b - rho t)/n``
   paired or ``v_b + rho^2 v_t`` unpaired, ``q`` the t quantile of the test's df. So the CI excludes
   a speed-up of 0 exactly when p < alpha. When the set is two pieces, ``[0, r1] U [r2, inf)`` (a
   rare paired case with both means uncertain), both pieces are reported (``ci_gap_low`` /
   ``ci_gap_high``: "CI -100% to -x% or +y% to ..."), never their hull, so this holds there too.
   Feasibility: no run reaches a target before its first full-window epoch, so the treatment's
   restricted mean is at least ``earliest`` (the mean of its runs' first full-window epochs), and
   the baseline's at most ``tau``. The CI's upper end is clipped at ``tau / earliest - 1``, the
   largest speed-up the design allows (``ci_high_clipped``): a bound on the parameter, so the
   clipped set keeps its coverage; likewise its lower end at ``earliest_b / tau - 1`` (the baseline's
   own earliest mean over ``tau``; ``ci_low_clipped``), where Fieller's set reached -100%. It is not clipped at ``RMST_b / earliest - 1``: that bound
   uses the baseline's *estimate*, and a CI cut there misses the true speed-up whenever the
   baseline's mean is underestimated and the treatment is near its floor.
   Power: the minimum detectable speed-up at 80% power and the seeds per arm a 25% speed-up needs
   (:mod:`pcpo_eval.stats.power`), from the measured spread and baseline mean, as planning figures:
   an MDE above ``max_speedup = RMST_b / earliest - 1`` means "no speed-up is detectable", and a
   reference speed-up above it is "not possible with this window and baseline" (no seed count).
5. Guards: no runs, non-finite curves, fewer than 2 runs per arm, every run at ``tau``, no
   variation and no difference: not estimable, with the reason. No spread but a consistent nonzero
   difference (every per-seed difference equal, or each arm constant at its own value; e.g. every
   treatment run at its first eligible epoch and no baseline run by ``tau``): the t test is
   degenerate, so there is no CI, and ``p`` is the exact permutation test's (sign flips:
   ``2 / 2^n``; relabellings: ``2 / C(2n, n)``, :func:`constant_difference_p`), used for
   ``significant``. A target every run reaches at its first eligible
   epoch is *uninformative*; so is a raw target an untrained control reaches (the sampler, not learning,
   reaches it: :func:`raw_target_note` here, ``target_status`` in :mod:`pcpo_eval.stats.verdict`), and a
   raw target without a control in every log gets no p (:func:`without_test`).
6. Faster means learning faster: "sooner" also needs the same test on each run's midpoint crossing
   (:func:`bound_by_midpoint`: a noisier curve's first crossing is early by chance) and, with controls,
   the faster arm to have learned at all (:func:`bound_by_learning`); ``p`` is the largest of the three.
   Logs must start at one epoch.

Measured calibration (A/A false positives, power, CI coverage on 40 real toy runs per arm):
``benchmarks/bench_verdict_calibration.py``, docs/statistics.md.
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass, replace
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError, require
from pcpo_eval.rundir import load_log, log_path, validate_log
from pcpo_eval.stats.fmt import p_value, pct, pct_interval

#: why a comparison of one run per arm has no CI or p-value (runs, not algorithms, differ); the verdict
#: sentences test for this reason by identity
ONE_RUN_PER_ARM = "1 run per arm: these are differences between runs; no CI/p-value"


#: The paper's smoothing: "smoothed with a moving average window of 5 epochs" (App. plotting details,
#: l.1293-1294); the default of every speed-up, selection and curve here.
SMOOTHING_WINDOW = 5


def check_window(window: int) -> None:
    """A moving-average window is a whole number of epochs >= 1 (one UserError otherwise)."""
    if isinstance(window, bool) or not isinstance(window, int | np.integer) or window < 1:
        raise UserError(f"moving-average window must be a whole number of epochs >= 1, got {window}; "
                        "pass e.g. --window 5")


def moving_average(x: Sequence[float] | np.ndarray, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """Trailing moving average; the first ``window-1`` values average what is available."""
    check_window(window)
    a = np.asarray(x, dtype=np.float64)
    c = np.cumsum(np.r_[0.0, a])
    idx = np.arange(1, a.size + 1)
    lo = np.maximum(idx - window, 0)
    return (c[idx] - c[lo]) / (idx - lo)


def speedup_pct(epochs_baseline: float, epochs_pcpo: float) -> float:
    """(E_base / E_pcpo - 1) * 100 (paper App. Table 10)."""
    return (float(epochs_baseline) / float(epochs_pcpo) - 1.0) * 100.0


def full_window_average(x: Sequence[float] | np.ndarray, window: int = SMOOTHING_WINDOW) -> np.ndarray:
    """Trailing mean over ``window`` values; NaN for the first ``window - 1`` (no full window yet) and
    for every window that holds a non-finite value (it decides nothing; the other windows still do)."""
    check_window(window)
    a = np.asarray(x, dtype=np.float64)
    out = np.full(a.size, np.nan)
    if a.size >= window:
        with np.errstate(invalid="ignore"):
            means = np.lib.stride_tricks.sliding_window_view(a, window).mean(axis=1)
        out[window - 1:] = np.where(np.isfinite(means), means, np.nan)
    return out


#: how a run's time to a target is read off its smoothed curve (:func:`epochs_to_target`)
CROSSINGS = ("first", "midpoint")


@dataclass(frozen=True)
class TimeToTarget:
    """Epochs a run needs to reach a target; ``censored`` = not reached by ``last_epoch``.

    ``first_eligible`` is the first epoch with a full smoothing window (the earliest possible hit).
    """

    epoch: float | None  # an int epoch; a half epoch for a midpoint crossing
    censored: bool
    first_epoch: int
    last_epoch: int
    first_eligible: int | None
    finite: bool = True

    @property
    def value(self) -> float:
        """The epoch, or the censoring epoch if censored; NaN if the curve is not finite."""
        if not self.finite:
            return math.nan
        return float(self.last_epoch if self.epoch is None else self.epoch)

    @property
    def at_start(self) -> bool:
        """Reached at the first eligible epoch (such a target says nothing about learning speed)."""
        return self.epoch is not None and self.epoch == self.first_eligible

    def restricted(self, tau: int) -> TimeToTarget:
        """The same run observed only up to epoch ``tau`` (a hit after ``tau`` becomes censoring)."""
        if self.epoch is not None and self.epoch <= tau:
            return TimeToTarget(self.epoch, False, self.first_epoch, tau, self.first_eligible, self.finite)
        return TimeToTarget(None, True, self.first_epoch, min(tau, self.last_epoch), self.first_eligible, self.finite)


def check_curve(curve: Sequence[float] | np.ndarray, epochs: Sequence[int] | np.ndarray | None) -> tuple[np.ndarray, np.ndarray]:
    """Validate a per-epoch curve and its epochs (default 1..T, strictly increasing)."""
    y = np.asarray(curve, dtype=np.float64)
    require(y.ndim == 1 and y.size > 0, f"a curve must be a non-empty 1-D array, got shape {y.shape}")
    e = np.arange(1, y.size + 1) if epochs is None else np.asarray(epochs)
    require(e.shape == y.shape, f"epochs has shape {e.shape} but the curve has {y.shape}; give one epoch per value")
    require(bool(np.all(np.diff(e) > 0)), "epochs must be strictly increasing (sort the log by epoch, one row per epoch)")
    return y, e


def on_epoch_grid(y: np.ndarray, e: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """A curve on every epoch from its first to its last logged one, NaN where the log has no row (a
    smoothing window counts epochs, and one that holds a missing epoch decides nothing)."""
    if e.size == 0 or int(e[-1]) - int(e[0]) + 1 == e.size:
        return y, e
    grid = np.arange(int(e[0]), int(e[-1]) + 1)
    out = np.full(grid.size, np.nan)
    out[np.asarray(e, dtype=np.int64) - int(e[0])] = y
    return out, grid


def epochs_to_target(
    curve: Sequence[float] | np.ndarray,
    target: float,
    window: int = SMOOTHING_WINDOW,
    *,
    epochs: Sequence[int] | np.ndarray | None = None,
    higher_is_better: bool = True,
    crossing: str = "first",
) -> TimeToTarget:
    """First epoch whose full-window trailing mean reaches ``target``; censored if none does.

    ``crossing="midpoint"``: the midpoint of the first and the LAST epoch at which the smoothed curve
    crosses up to the target (from below, or at its first eligible epoch); the same as the first where it
    crosses once. Noise makes a curve's first crossing early and its last up-crossing late, by about the
    same where the mean curve is straight there, so the midpoint does not favour a noisier curve as the
    first crossing does (:func:`bound_by_midpoint`).

    A window holding a non-finite value decides nothing: the first window that reaches the target
    counts when every window before it was decided (a missing value after the hit does not matter, nor to
    the midpoint: an up-crossing is a hit whose last decided window before it was below the target),
    a curve that never reaches it is censored when every window was decided; otherwise the time is
    unknown (``finite=False``). A curve shorter than the window has no eligible epoch and is censored.
    The window counts epochs, not log rows: an epoch the log lacks (``epochs`` with a gap, e.g. a log
    merged by hand after a crash or a sampled history) is a missing value there, as in a study's runs
    table, so no window spans the gap.
    """
    check_window(window)
    require(crossing in CROSSINGS, f"crossing {crossing!r}: choose {' or '.join(CROSSINGS)}")
    y, e = on_epoch_grid(*check_curve(curve, epochs))
    first, last = int(e[0]), int(e[-1])
    eligible = int(e[window - 1]) if y.size >= window else None
    if y.size < window:
        return TimeToTarget(None, bool(np.all(np.isfinite(y))), first, last, eligible,
                            finite=bool(np.all(np.isfinite(y))))
    s = full_window_average(y, window)[window - 1:]  # one per eligible epoch, NaN where a window holds a NaN
    known = np.isfinite(s)
    with np.errstate(invalid="ignore"):
        hit = known & (s >= target if higher_is_better else s <= target)
    if hit.any():
        i = int(np.argmax(hit))
        if not known[:i].all():
            return TimeToTarget(None, False, first, last, eligible, finite=False)
        if crossing == "midpoint":
            # windows where the curve crosses up: a hit whose last decided window before it was below (an
            # undecided window in between, a missing log row, is no crossing: one missing row long after the
            # hit moved a run's midpoint from epoch 7 to 13.5)
            last_known = np.maximum.accumulate(np.where(known, np.arange(hit.size), -1))
            before = np.r_[-1, last_known[:-1]]
            up = np.flatnonzero(hit & ~np.where(before >= 0, hit[np.maximum(before, 0)], False))
            j = int(up[-1])
            return TimeToTarget((int(e[i + window - 1]) + int(e[j + window - 1])) / 2, False, first, last, eligible)
        return TimeToTarget(int(e[i + window - 1]), False, first, last, eligible)
    if not known.all():
        return TimeToTarget(None, False, first, last, eligible, finite=False)
    return TimeToTarget(None, True, first, last, eligible)


def km_restricted_mean(times: Sequence[float] | np.ndarray, reached: Sequence[bool] | np.ndarray, tau: float) -> float:
    """Kaplan-Meier restricted mean time to the event up to ``tau``: the integral of S(t) on [0, tau].

    ``times`` are event epochs (``reached``) or censoring epochs; ties put events before censorings
    (the usual convention). With censoring only at or after ``tau`` this is ``mean(min(T, tau))``.
    """
    t = np.asarray(times, dtype=np.float64)
    d = np.asarray(reached, dtype=bool)
    require(t.size > 0 and t.shape == d.shape, "km_restricted_mean needs one time and one flag per run")
    surv, last, area = 1.0, 0.0, 0.0
    for u in np.unique(t[d & (t <= tau)]):
        area += surv * (u - last)
        at_risk = np.sum(t >= u)
        surv *= 1.0 - np.sum(d & (t == u)) / at_risk
        last = u
    return float(area + surv * (tau - last))


def fieller_set(b: np.ndarray, t: np.ndarray, *, paired: bool, q: float) -> tuple[tuple[float, float], ...]:
    """Fieller's set {rho >= 0 : (m_b - rho m_t)^2 <= q^2 v(rho)} for ``rho = mean(b) / mean(t)``, as
    one or two intervals (Fieller 1954).

    ``v(rho) = v_bb - 2 rho v_bt + rho^2 v_tt`` with ``v`` the (co)variances of the means: the
    sample covariance of the pairs / n when paired, ``s^2/n`` per arm and ``v_bt = 0`` when not. The
    quadratic ``A rho^2 - 2 B rho + C <= 0``: with ``A > 0`` (the treatment mean clearly positive) an
    interval; with ``A < 0`` the outside of the roots ``r1 <= r2``, i.e. on ``rho >= 0`` the ray
    ``[r2, inf)`` when ``r1 < 0``, else the two pieces ``[0, r1]`` and ``[r2, inf)`` (a rare paired
    case, both means uncertain); else everything, ``[0, inf)``. Limits below 0 are clipped to 0
    (epochs > 0). Since ``v(1)`` is the variance of the t test's difference, rho = 1 is outside the
    set exactly when that t test has p < alpha (``q`` its quantile), whatever the number of pieces.
    """
    mb, mt = float(b.mean()), float(t.mean())
    if paired:
        c = np.cov(np.vstack([b, t]), ddof=1) / b.size
        vbb, vbt, vtt = float(c[0, 0]), float(c[0, 1]), float(c[1, 1])
    else:
        vbb, vbt, vtt = float(b.var(ddof=1)) / b.size, 0.0, float(t.var(ddof=1)) / t.size
    q2 = q * q
    A, B, C = mt * mt - q2 * vtt, mb * mt - q2 * vbt, mb * mb - q2 * vbb
    disc = B * B - A * C
    if A > 0 and disc >= 0:
        r = math.sqrt(disc)
        return ((max((B - r) / A, 0.0), (B + r) / A),)
    if A < 0 and disc >= 0:  # outside the roots r1 <= r2: (-inf, r1] U [r2, inf)
        r = math.sqrt(disc)
        r1, r2 = (B + r) / A, (B - r) / A  # A < 0: (B + r) / A is the smaller root
        # r1 < 0: on rho >= 0 the set is the ray [r2, inf) (it holds the estimate mb/mt > 0)
        return ((max(r2, 0.0), math.inf),) if r1 < 0 else ((0.0, r1), (r2, math.inf))
    return ((0.0, math.inf),)


def fieller_interval(b: np.ndarray, t: np.ndarray, *, paired: bool, q: float) -> tuple[float, float]:
    """The hull of :func:`fieller_set` (``[0, inf)`` for its two-piece case): an interval holding it."""
    pieces = fieller_set(b, t, paired=paired, q=q)
    return pieces[0][0], pieces[-1][1]


def clip_pieces(pieces: Sequence[tuple[float, float]], upper: float,
                lower: float = -math.inf) -> tuple[tuple[float, float], ...]:
    """``pieces`` intersected with ``[lower, upper]``; a piece wholly outside is dropped."""
    return tuple((max(lo, lower), min(hi, upper)) for lo, hi in pieces if lo <= upper and hi >= lower)


@dataclass(frozen=True)
class Speedup:
    """Speed-up ``RMST_b / RMST_t - 1`` (a fraction: 0.25 = 25%) of the treatment over the baseline.

    ``baseline_epochs`` / ``treatment_epochs`` are the per-run ``min(T, tau)`` (censored runs at
    ``tau``); ``p`` and the Fieller CI come from one t test (paired by seed when ``paired``).

    * CI: ``ci_low..ci_high``; when Fieller's set has two pieces, ``ci_gap_low``/``ci_gap_high``
      are the hole inside it, so the CI is ``[ci_low, ci_gap_low]`` or ``[ci_gap_high, ci_high]``
      (both None for one piece). The upper end is clipped at ``tau / earliest - 1``, the largest
      speed-up the design allows (``ci_high_clipped``), so ``ci_high`` None only without a CI; the
      lower end at ``earliest_b / tau - 1``, the largest slow-down it allows (``ci_low_clipped``:
      the baseline's runs' first full-window epochs against a treatment that never hits).
    * ``earliest``: the earliest possible treatment restricted mean, the mean over treatment runs
      of their first full-window epoch (``tau`` for a run without one); ``max_speedup``:
      ``baseline_mean / earliest - 1``, the largest speed-up possible against this baseline.
    * ``mde``: the smallest speed-up detectable at 80% power; ``seeds_for_reference``: the seeds per
      arm a ``reference_effect`` speed-up needs, both at the measured spread; None when not
      computable, when the MDE exceeds ``max_speedup`` or when ``reference_effect`` does
      (``reference_feasible`` False).
    * ``p_method``: ``paired t`` / ``Welch t``, or, when the runs have no spread but every per-seed
      difference (paired) or the two arms' constant values (unpaired) differ, the exact permutation
      test (``exact sign-flip permutation`` / ``exact relabelling permutation``): then ``p`` is
      its p, there is no CI, and ``reason`` says so. Where the t test is not robust
      (:func:`pcpo_eval.stats.permutation.t_not_robust`: fewer than 3 runs in an arm, or one arm without
      spread, e.g. a baseline whose runs never reach the target), ``p`` is the larger of the t test's and
      the permutation test's of the epochs, ``reason`` says why, and ``p_floor`` is that test's smallest p
      (at or above the level: no speed-up is detectable, and there is no MDE).
    """

    target: float
    baseline_epochs: tuple[float, ...]
    treatment_epochs: tuple[float, ...]
    n_censored_baseline: int
    n_censored_treatment: int
    tau: int | None
    baseline_mean: float | None
    treatment_mean: float | None
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    alpha: float
    p: float | None
    paired: bool
    df: float | None
    mde: float | None
    reference_effect: float
    seeds_for_reference: int | None
    uninformative: bool
    estimable: bool
    reason: str
    significant: bool
    ci_gap_low: float | None = None
    ci_gap_high: float | None = None
    ci_high_clipped: bool = False
    ci_low_clipped: bool = False
    earliest: float | None = None
    max_speedup: float | None = None
    reference_feasible: bool = True
    p_method: str = ""
    p_floor: float | None = None
    #: the same test on the runs' midpoint crossings (:func:`bound_by_midpoint`); None when not run
    p_midpoint: float | None = None
    midpoint: Speedup | None = None
    #: p that the faster arm learned at all (:func:`bound_by_learning`); None when not checked
    p_learned: float | None = None

    @property
    def n_baseline(self) -> int:
        return len(self.baseline_epochs)

    @property
    def n_treatment(self) -> int:
        return len(self.treatment_epochs)

    def to_dict(self) -> dict[str, Any]:
        return asdict(self) | {"n_baseline": self.n_baseline, "n_treatment": self.n_treatment}


def _reason(b: Sequence[TimeToTarget], t: Sequence[TimeToTarget], vb: np.ndarray, vt: np.ndarray, paired: bool) -> str:
    """Why the speed-up has no test ('' if it has one); the checks in order."""
    if not b or not t:
        return f"no {'baseline' if not b else 'treatment'} runs"
    bad = sum(not r.finite for r in (*b, *t))
    if bad:
        return (f"{bad} of {len(b) + len(t)} runs have a missing (non-finite) reward or control before they reach "
                "the target, so their time to it is unknown; fix or exclude those runs explicitly")
    if all(r.first_eligible is None for r in (*b, *t)):
        return f"the runs have {b[0].last_epoch - b[0].first_epoch + 1} epochs, fewer than the smoothing window"
    if all(r.at_start for r in (*b, *t)):
        return "uninformative target: every run reaches it at its first full-window epoch; choose a higher target"
    if len(b) < 2 or len(t) < 2:
        return ONE_RUN_PER_ARM if len(b) < 2 and len(t) < 2 \
            else f"1 {'baseline' if len(b) < 2 else 'treatment'} run: need >= 2 runs per arm for a CI/p-value"
    if all(r.censored for r in (*b, *t)):
        return "no run of either arm reaches the target within the compared epochs"
    if no_spread(vb, vt, paired) and not differs(vb, vt):
        cens = any(r.censored for r in (*b, *t))
        how = (f" (a run that never reaches it counts as epoch {int(max(vb.max(), vt.max()))}, the last compared one, like a run that "
               "reaches it there: train longer to tell them apart)") if cens else ""
        return ("the per-seed differences in epochs are all 0: no difference and no spread to test against" + how
                if paired else "no variation: every run of both arms counts the same number of epochs" + how)
    return ""


def no_spread(vb: np.ndarray, vt: np.ndarray, paired: bool) -> bool:
    """The t test has no spread: equal per-seed differences (paired), constant arms (unpaired)."""
    return bool(np.ptp(vb - vt) == 0) if paired else bool(np.ptp(vb) == 0 and np.ptp(vt) == 0)


def separated(vb: np.ndarray, vt: np.ndarray, paired: bool) -> bool:
    """Whether two arms' run values differ one way without exception: every per-seed difference of one
    sign (paired), or no overlap between the arms (unpaired). The rule by which an untrained-sampler
    offset still explains a raw-reward row where its t test cannot decide (no spread; at 5 seeds the exact
    sign-flip p of a constant offset is 2/2^5 = 0.0625): :func:`sampler_offset_note` here and the study's
    sampler offset (``study.verdicts``)."""
    b, t = np.asarray(vb, dtype=np.float64), np.asarray(vt, dtype=np.float64)
    if paired:
        d = t - b
        return bool(np.all(d > 0) or np.all(d < 0))
    return bool(t.min() > b.max() or t.max() < b.min())


def differs(vb: np.ndarray, vt: np.ndarray) -> bool:
    """Under :func:`no_spread`: the arms differ (a nonzero per-seed difference, or two constants)."""
    return bool(vb[0] != vt[0])


def constant_difference_p(n_b: int, n_t: int, paired: bool) -> float:
    """Exact two-sided permutation p of the mean difference when it is consistent and nonzero with no
    spread (:func:`no_spread` and :func:`differs`): only the observed labelling and its mirror reach
    the observed |difference|.

    Paired (sign flips, 2^n patterns): the all-+ and all-- patterns, ``p = 2 / 2^n``. Unpaired
    (relabellings, C(n_b + n_t, n_t)): the observed split, and the swapped one when ``n_b == n_t``:
    ``p = 2 / C`` or ``1 / C``. The same p as :func:`pcpo_eval.stats.runlevel.sign_flip_test` /
    ``permutation_test`` (tested), in closed form for any n.
    """
    if paired:
        return 2.0 / 2.0**n_b
    return (2.0 if n_b == n_t else 1.0) / math.comb(n_b + n_t, n_t)


def _t_test(vb: np.ndarray, vt: np.ndarray, paired: bool, alpha: float) -> tuple[float, float, float, float, float]:
    """(p, df, q, sd_b, sd_t) of the t test of mean(b) - mean(t) = 0 (paired t, else Welch's; one home:
    :func:`pcpo_eval.stats.ttest.trimmed_t_interval` at no trim); sd_b = sd_t is the SD of the
    differences when paired."""
    # here, not at import: ttest imports scipy, and ``import pcpo_eval.stats`` (every CLI start) stays scipy-free
    from pcpo_eval.stats.ttest import trimmed_paired_interval, trimmed_t_interval

    if paired:
        ci = trimmed_paired_interval(vb - vt, trim=0.0, alpha=alpha)
        sd = float((vb - vt).std(ddof=1))
        return ci.p, ci.df, ci.q, sd, sd
    ci = trimmed_t_interval(vt, vb, trim=0.0, alpha=alpha)
    return ci.p, ci.df, ci.q, float(vb.std(ddof=1)), float(vt.std(ddof=1))


def _as_speedup(rmst_b: float, diff: float | None, earliest: float) -> float | None:
    """The speed-up that a difference of ``diff`` epochs below ``rmst_b`` means; None if impossible:
    the treatment would need a restricted mean below ``earliest``, the earliest it can have (no run
    reaches a target before its first full-window epoch)."""
    if diff is None or rmst_b - diff <= 0 or rmst_b - diff < earliest:
        return None
    return rmst_b / (rmst_b - diff) - 1.0


def earliest_mean(runs: Sequence[TimeToTarget], tau: int) -> float:
    """The smallest restricted mean time these runs could have: each at its first full-window epoch
    (``tau`` for a run without one, which can reach nothing)."""
    return float(np.mean([tau if r.first_eligible is None else min(r.first_eligible, tau) for r in runs]))


def _power(vb: np.ndarray, vt: np.ndarray, paired: bool, mb: float, earliest: float, reference_effect: float,
           feasible: bool, level: float) -> tuple[float | None, int | None]:
    """(MDE as a speed-up, seeds per arm for ``reference_effect``) of the t test on restricted times at
    the measured spread, at test level ``level`` (:class:`Speedup`'s ``mde`` and ``seeds_for_reference``), both
    with 80% power averaged over that spread's uncertainty (:func:`pcpo_eval.stats.power.spread_factor`).
    Unpaired runs whose p the exact relabelling test bounds (:func:`_robust_p`,
    :func:`pcpo_eval.stats.permutation.t_not_robust`: 2 runs in an arm, unequal arms, one arm without
    spread) get that bounded test's MDE (:func:`pcpo_eval.stats.power.bounded_welch_mde`), as a verdict
    row's difference does (:func:`pcpo_eval.stats.runlevel.trimmed_mde`); Welch's alone promised more."""
    from pcpo_eval.stats.permutation import t_not_robust
    from pcpo_eval.stats.power import bounded_welch_mde, seeds_needed
    from pcpo_eval.stats.power import mde as _mde  # imports scipy: on first use (see _t_test)

    _, _, _, sd_b, sd_t = _t_test(vb, vt, paired, level)
    bounded = (bounded_welch_mde(sd_b, vb.size, sd_t, vt.size, alpha=level, measured=True)
               if not paired and t_not_robust(vb, vt, paired=False) else None)
    d_mde = bounded if bounded is not None else _mde(sd_b, vb.size, sd_t=sd_t, n_t=vt.size, paired=paired,
                                                     alpha=level, measured=True)
    need = (seeds_needed(mb - mb / (1 + reference_effect), sd_b, sd_t=sd_t, paired=paired, alpha=level,
                         measured=vb.size if paired else (vb.size, vt.size)) if feasible else None)
    return _as_speedup(mb, d_mde, earliest), need


def at_level(s: Speedup, level: float) -> Speedup:
    """``s`` with its MDE and seeds-for-reference at test level ``level`` (e.g. its family's
    :func:`pcpo_eval.stats.power.family_level`); everything else, the CI and p included, unchanged.
    Rows without a t test (not estimable, or the exact permutation p) have neither and stay as they are."""
    if not s.estimable or s.ci_low is None or s.baseline_mean is None or s.earliest is None:
        return s
    if s.p_floor is not None and s.p_floor >= level:
        return replace(s, mde=None, seeds_for_reference=None)
    vb, vt = np.asarray(s.baseline_epochs), np.asarray(s.treatment_epochs)
    mde, need = _power(vb, vt, s.paired, s.baseline_mean, s.earliest, s.reference_effect, s.reference_feasible, level)
    mid = at_level(s.midpoint, level) if s.midpoint is not None else None
    return _with_both_powers(replace(s, mde=mde, seeds_for_reference=need, midpoint=mid))


def speedup_runs(
    baseline: Sequence[TimeToTarget],
    treatment: Sequence[TimeToTarget],
    *,
    target: float = math.nan,
    paired: bool = False,
    alpha: float = 0.05,
    reference_effect: float = 0.25,
) -> Speedup:
    """Speed-up of the treatment over the baseline from per-run times to a target (module docstring).

    Runs are restricted to ``tau`` = the earliest last epoch over all runs. ``paired``: the i-th
    baseline and i-th treatment run share a seed.
    """
    require(0 < alpha < 1, f"alpha must be in (0, 1), got {alpha}")
    require(not paired or len(baseline) == len(treatment), "paired speed-up needs as many baseline as treatment runs")
    tau = min((r.last_epoch for r in (*baseline, *treatment)), default=None)
    b = [r.restricted(tau) for r in baseline] if tau is not None else []
    t = [r.restricted(tau) for r in treatment] if tau is not None else []
    vb = np.asarray([r.value for r in b], dtype=np.float64)
    vt = np.asarray([r.value for r in t], dtype=np.float64)
    cb, ct = sum(r.censored for r in b), sum(r.censored for r in t)
    reason = _reason(b, t, vb, vt, paired)
    finite = vb.size > 0 and vt.size > 0 and bool(np.all(np.isfinite(vb)) and np.all(np.isfinite(vt)))
    mb = km_restricted_mean(vb, [not r.censored for r in b], tau) if finite else None
    mt = km_restricted_mean(vt, [not r.censored for r in t], tau) if finite else None
    est = None if mb is None or mt is None or mt <= 0 else mb / mt - 1
    uninformative = bool(b) and bool(t) and all(r.at_start for r in (*b, *t))
    base = dict(target=float(target), baseline_epochs=tuple(vb.tolist()), treatment_epochs=tuple(vt.tolist()),
                n_censored_baseline=cb, n_censored_treatment=ct, tau=tau, baseline_mean=mb, treatment_mean=mt,
                estimate=est, alpha=alpha, paired=paired, reference_effect=reference_effect, uninformative=uninformative)
    if reason:
        return Speedup(**base, ci_low=None, ci_high=None, p=None, df=None, mde=None, seeds_for_reference=None,
                       estimable=False, reason=reason, significant=False)
    assert mb is not None and tau is not None
    earliest = earliest_mean(t, tau)
    feas = dict(earliest=earliest, max_speedup=mb / earliest - 1,
                reference_feasible=mb / (1 + reference_effect) >= earliest)
    if no_spread(vb, vt, paired):  # and the arms differ (else _reason): the exact permutation p
        p = constant_difference_p(vb.size, vt.size, paired)
        how = "sign-flip" if paired else "relabelling"
        why = (f"every per-seed difference is {float(vb[0] - vt[0]):+g} epochs" if paired else
               f"every baseline run takes {float(vb[0]):g} epochs, every treatment run {float(vt[0]):g}")
        return Speedup(**base, ci_low=None, ci_high=None, p=p, df=None, mde=None, seeds_for_reference=None,
                       estimable=True, significant=bool(p < alpha), **feas, p_floor=p,
                       p_method=f"exact {how} permutation",
                       reason=f"CI not estimable ({why}: no spread); p is the exact {how} permutation test's")
    p, df, q, _, _ = _t_test(vb, vt, paired, alpha)
    # the parameter space: earliest_b / tau <= rho = mu_b / mu_t <= tau / earliest (no mean beyond tau,
    # none before its runs' first full-window epochs); it holds the estimate, so a piece survives
    lower, upper = earliest_mean(b, tau) / tau, tau / earliest
    pieces = fieller_set(vb, vt, paired=paired, q=q)
    kept = clip_pieces(pieces, upper, lower)
    gap = (kept[0][1] - 1, kept[1][0] - 1) if len(kept) == 2 else (None, None)
    mde, need = _power(vb, vt, paired, mb, earliest, reference_effect, feas["reference_feasible"], alpha)
    p, p_floor, p_method, why = _robust_p(vb, vt, paired, p)
    if p_floor is not None and p_floor >= alpha:
        mde, need = None, None
    return Speedup(**base, ci_low=kept[0][0] - 1, ci_high=kept[-1][1] - 1, p=p, df=df,
                   mde=mde, seeds_for_reference=need, estimable=True, reason=why,
                   significant=bool(p < alpha), ci_gap_low=gap[0], ci_gap_high=gap[1],
                   ci_high_clipped=pieces[-1][1] > upper, ci_low_clipped=pieces[0][0] < lower, **feas,
                   p_method=p_method, p_floor=p_floor)


def bound_by_midpoint(s: Speedup, mid: Speedup) -> Speedup:
    """``s`` (from the runs' first crossings, the paper's epochs to a target) with ``p`` the larger of its own
    and ``mid``'s (the same runs' midpoint crossings, :func:`epochs_to_target`), 1 where the two point
    different ways: an intersection-union test, "sooner" only where both say so, so its level is at most
    either's. The first crossing comes sooner on a noisier curve: two arms with one mean learning curve,
    one with 3x the evaluation noise, 20 seeds, gave the noisier one a significant speed-up in 15.0% of 200
    studies with the first crossing alone, 2.0% with this bound (``benchmarks/bench_speedup_guards.py``).
    The estimate and CI stay the first crossing's; ``p_midpoint`` and ``midpoint`` record the other test."""
    if not s.estimable or s.p is None or s.estimate is None:
        return s
    agree = mid.estimable and mid.p is not None and mid.estimate is not None and \
        (mid.estimate > 0) == (s.estimate > 0) and mid.estimate != 0
    p_mid = float(mid.p) if agree else 1.0  # type: ignore[arg-type]
    out = _with_both_powers(replace(s, p_midpoint=p_mid, midpoint=mid))
    if p_mid <= s.p:
        return out
    how = (f"p is the larger of the first-crossing test's and the same test's on each run's midpoint between its "
           f"first and last up-crossing (speed-up {pct(mid.estimate)}" if agree else
           f"p = 1: the runs' midpoints between their first and last up-crossings point the other way (speed-up "
           f"{pct(mid.estimate)}")
    why = f"{how}; a first crossing comes sooner on a noisier curve)"
    return replace(out, p=p_mid, significant=bool(p_mid < s.alpha), reason=f"{s.reason}; {why}" if s.reason else why,
                   p_method=f"{s.p_method}, bounded by the midpoint crossings' test")


def bound_by_learning(s: Speedup, baseline_gains: Sequence[np.ndarray], treatment_gains: Sequence[np.ndarray],
                      names: tuple[str, str] = ("baseline", "PCPO")) -> Speedup:
    """``s`` with ``p`` the larger of its own and the p that its faster arm learned at all: that arm's runs'
    mean gain over their untrained controls (``reward - control`` over all epochs, one value per run) is
    above 0 (:func:`pcpo_eval.stats.permutation.one_sided_mean_p`). "Learns faster" needs both (an
    intersection-union test). A policy that drifted without learning (mean gain 0, noisy) reached a gain
    target by noise sooner than a slowly learning baseline and was called faster in 11.0% of 200 studies at
    20 seeds on the first crossing alone, never with the bounds (``benchmarks/bench_speedup_guards.py``)."""
    from pcpo_eval.stats.permutation import one_sided_mean_p

    if not s.estimable or s.p is None or s.estimate is None or s.estimate == 0:
        return s
    gains, who = (treatment_gains, names[1]) if s.estimate > 0 else (baseline_gains, names[0])
    means = np.asarray([np.nanmean(g) if np.isfinite(g).any() else np.nan for g in gains], dtype=np.float64)
    p_learn = one_sided_mean_p(means)
    out = replace(s, p_learned=p_learn)
    if p_learn <= s.p:
        return out
    why = (f"p is the larger of the speed-up test's and the test that {who}, the faster arm, learned at all (its "
           f"runs' mean gain over their untrained controls {np.nanmean(means):+.3g}, one-sided p = {p_value(p_learn)}): "
           "reaching a target without learning is noise")
    return replace(out, p=p_learn, significant=bool(p_learn < s.alpha), reason=f"{s.reason}; {why}" if s.reason else why,
                   p_method=f"{s.p_method}, bounded by the faster arm's learning test")


def _with_both_powers(s: Speedup) -> Speedup:
    """``s`` whose MDE and seeds for the reference effect are the larger of its own and its midpoint test's
    (None where either has none): "sooner" needs both tests, so it detects no less than either needs."""
    m = s.midpoint
    if m is None:
        return s
    mde = None if s.mde is None or m.mde is None else max(s.mde, m.mde)
    need = None if s.seeds_for_reference is None or m.seeds_for_reference is None else \
        max(s.seeds_for_reference, m.seeds_for_reference)
    return replace(s, mde=mde, seeds_for_reference=need, reference_feasible=s.reference_feasible and m.reference_feasible)


def _robust_p(vb: np.ndarray, vt: np.ndarray, paired: bool, p_t: float) -> tuple[float, float | None, str, str]:
    """(p, floor, method, reason) of a speed-up's test: the t test's p, or where it is not robust
    (:func:`pcpo_eval.stats.permutation.t_not_robust`) the larger of it and the exact (else Monte Carlo, seeded)
    permutation test's of the epochs, with that test's floor. Before, a baseline that never reached the
    target (3 runs at tau) against treatment runs at 20, 21, 22 epochs gave Welch's p = 0.0009, where the
    same treatment runs all at 20 (stronger evidence) gave the exact test's 0.1."""
    from pcpo_eval.stats.permutation import permutation_test, sign_flip_test, t_not_robust

    t_method = "paired t" if paired else "Welch t"
    why = t_not_robust(vb, vt, paired)
    if not why:
        return p_t, None, t_method, ""
    rng = np.random.default_rng(0)  # used only beyond the exact enumeration's limit
    perm = sign_flip_test(vt - vb, rng=rng) if paired else permutation_test(vb, vt, rng=rng)
    how = f"{'exact' if perm.exact else 'Monte Carlo'} {'sign-flip' if paired else 'relabelling'} permutation"
    return (max(p_t, perm.p), perm.p_min, f"the larger of the {t_method}'s p and the {how} test's",
            f"p is the larger of the {t_method}'s and the {how} test's: {why}")


@dataclass(frozen=True)
class SpeedupTable:
    """Speed-ups of one treatment over one baseline for several targets (``pcpo-eval speedup``)."""

    rows: tuple[Speedup, ...]
    window: int
    baseline_names: tuple[str, ...]
    pcpo_names: tuple[str, ...]
    curve: str = "reward"
    #: Holm-adjusted p per row over the table's targets (one family; None where a row has no p)
    p_holm: tuple[float | None, ...] = ()
    #: what limits the comparison: logs cut to the shortest one (:func:`cut_note`), a raw-reward table
    #: without the paired control, which then has no p (:func:`no_control_note`)
    notes: tuple[str, ...] = ()
    #: the targets are reached from below (False: ``--lower-is-better``, from above)
    higher_is_better: bool = True
    #: the test level of every row (Holm over the targets at this level)
    alpha: float = 0.05
    #: how runs given by hand were paired (:func:`pcpo_eval.stats.given_runs.choose_pairing`); "" when the
    #: caller paired them itself
    pairing: str = ""

    @property
    def family_size(self) -> int:
        """The rows Holm adjusts together (those with a p); their MDEs are at alpha / this."""
        return sum(p is not None for p in self.p_holm)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape of ``pcpo-eval speedup --json``."""
        holm = self.p_holm or (None,) * len(self.rows)
        return {"window": self.window, "curve": self.curve, "higher_is_better": self.higher_is_better,
                "alpha": self.alpha, "baseline_runs": list(self.baseline_names),
                "pcpo_runs": list(self.pcpo_names), "family_size": self.family_size, "pairing": self.pairing,
                "notes": list(self.notes),
                "targets": [r.to_dict() | {"p_holm": h, "significant_holm": h is not None and h < r.alpha}
                            for r, h in zip(self.rows, holm, strict=True)]}

    def to_markdown(self) -> str:
        """Target, restricted mean epochs per arm (censored runs), speed-up with CI, p, power."""
        paired = "paired (each pair one training seed)" if self.rows and self.rows[0].paired else "unpaired (Welch)"
        paired = f"{paired}: {self.pairing}" if self.pairing else paired
        lines = [f"Smoothing: trailing mean over a full window of {self.window} epochs; {len(self.baseline_names)} "
                 f"baseline / {len(self.pcpo_names)} PCPO run(s), {paired}; curve: {self.curve} "
                 f"({'higher' if self.higher_is_better else 'lower'} is better; alpha {self.alpha:g}).",
                 "Epochs: Kaplan-Meier restricted mean to the last common epoch (runs that never reach the "
                 "target count as that epoch).", *(f"Note: {n}." for n in self.notes), "",
                 f"p: each target's own test; Holm p: adjusted over the {self.family_size} targets with a p (one "
                 f"family: a target is a finding only when its Holm p < alpha); detectable: at 80% power at that "
                 "family's level, alpha / targets.", "",
                 "| Target | Epochs baseline | Epochs PCPO | Speed-up (95% CI) | p | Holm p | detectable at 80% power |",
                 "|---:|---:|---:|---:|---:|---:|---:|"]
        holm = self.p_holm or (None,) * len(self.rows)
        for r, h in zip(self.rows, holm, strict=True):
            lines.append(f"| {r.target:g} | {speedup_cell_epochs(r.baseline_mean, r.n_censored_baseline, r.n_baseline)} | "
                         f"{speedup_cell_epochs(r.treatment_mean, r.n_censored_treatment, r.n_treatment)} | "
                         f"{speedup_text(r)} | {'' if r.p is None else p_value(r.p, r.alpha)} | {'' if h is None else p_value(h, r.alpha)} | "
                         f"{pct(r.mde, 'none')} |")
        return "\n".join(lines)


def speedup_cell_epochs(mean: float | None, censored: int, n: int) -> str:
    if mean is None:
        return "n/a"
    return f"{mean:.1f}" + (f" ({censored}/{n} not reached)" if censored else "")


def ci_text(s: Speedup) -> str:
    """The CI as printed: '95% CI +3% to +60%', its two pieces '95% CI -100% to -40% or +20% to +300%'
    (:func:`fieller_set`), or, with the exact permutation p and no CI, the reason there is none."""
    if s.ci_low is None:
        return s.reason
    return f"{100 * (1 - s.alpha):g}% CI {pct_interval(s.ci_low, s.ci_high, (s.ci_gap_low, s.ci_gap_high))}"


def speedup_text(s: Speedup) -> str:
    """'+25% (95% CI +3% to +60%)' (:func:`ci_text`) or the reason there is none."""
    if not s.estimable:
        return s.reason
    return f"{pct(s.estimate)} ({ci_text(s)})"


def speedup_table(
    baseline: Sequence[pd.DataFrame | str | Path | tuple[str, pd.DataFrame]],
    pcpo: Sequence[pd.DataFrame | str | Path | tuple[str, pd.DataFrame]],
    targets: Sequence[float],
    window: int = SMOOTHING_WINDOW,
    higher_is_better: bool = True,
    *,
    paired: bool = False,
    curve: str = "reward",
    alpha: float = 0.05,
) -> SpeedupTable:
    """Speed-ups for each target from logs (DataFrames, log files, RUN directories, or ``(name, log)`` pairs
    of logs already read with :func:`pcpo_eval.rundir.load_log`).

    ``curve``: ``reward`` (``reward_mean``) or ``gain`` (``reward_mean - control_reward_mean``, the
    learning curve; logs need the paired control). ``paired``: the i-th baseline and i-th PCPO log
    share a seed.
    """
    if not baseline or not pcpo:
        raise UserError("give at least one baseline log and one PCPO log")
    if not targets:
        raise UserError("give at least one --target level")
    if paired and len(baseline) != len(pcpo):
        raise UserError(f"--paired needs as many baseline as PCPO logs (got {len(baseline)} and {len(pcpo)}), "
                        "given in seed order")

    def load(x: pd.DataFrame | str | Path | tuple[str, pd.DataFrame], label: str) -> tuple[str, pd.DataFrame]:
        name, df = (x if isinstance(x, tuple) else (label, validate_log(x, label)) if isinstance(x, pd.DataFrame)
                    else (str(x), load_log(x)))
        if curve == "gain":
            if "control_reward_mean" not in df.columns or not np.isfinite(df["control_reward_mean"].to_numpy(np.float64)).all():
                raise UserError(f"log {name} has no finite control_reward_mean; the gain curve needs runs trained "
                                "with paired_control: true (or use the reward curve)")
            df = df.assign(reward_mean=df["reward_mean"] - df["control_reward_mean"])
        return name, df

    if curve == "gain":  # the untrained control's gain is 0 by definition: it "reaches" such a target at once
        bad = [t for t in targets if (t <= 0 if higher_is_better else t >= 0)]
        if bad:
            raise UserError(f"--target {bad[0]:g} with --curve gain: a gain target must be "
                            f"{'> 0' if higher_is_better else '< 0 with --lower-is-better'} (a policy that learns "
                            "nothing has gain 0 every epoch and would reach it at its first full-window epoch)")
    b = [load(x, f"baseline log {i}") for i, x in enumerate(baseline, start=1)]
    p = [load(x, f"PCPO log {i}") for i, x in enumerate(pcpo, start=1)]
    check_common_start([*b, *p])

    def ttt(df: pd.DataFrame, t: float, crossing: str) -> TimeToTarget:
        return epochs_to_target(df["reward_mean"].to_numpy(), t, window, epochs=df["epoch"].to_numpy(),
                                higher_is_better=higher_is_better, crossing=crossing)

    def test(t: float, crossing: str) -> Speedup:
        return speedup_runs([ttt(d, t, crossing) for _, d in b], [ttt(d, t, crossing) for _, d in p], target=t,
                            paired=paired, alpha=alpha)

    rows = tuple(bound_by_midpoint(test(t, "first"), test(t, "midpoint")) for t in targets)

    controls = [None if curve == "gain" else control_curve(d) for _, d in (*b, *p)]
    if curve == "gain" or all(c is not None for c in controls):  # "faster" needs the faster arm to have learned
        sign = 1.0 if higher_is_better else -1.0  # learning lowers a lower-is-better curve
        gains = [sign * (d["reward_mean"].to_numpy(np.float64) - (0.0 if c is None else c))  # gain curve: already
                 for (_, d), c in zip((*b, *p), controls, strict=True)]
        rows = tuple(bound_by_learning(r, gains[:len(b)], gains[len(b):]) for r in rows)
    notes = [cut_note([*b, *p])] if len({int(d["epoch"].max()) for _, d in (*b, *p)}) > 1 else []
    if curve == "reward":  # a target the untrained control reaches is the sampler's, not learning's
        blind = [n for (n, _), c in zip((*b, *p), controls, strict=True) if not control_has_window(c, window)]
        if not blind:
            rows = tuple(uninformative(r, raw_target_note(controls, r.target, window, higher_is_better))  # type: ignore[arg-type]
                         for r in rows)
        else:  # nothing tells learning from the sampler: the paper's numbers, but no p (before: a note beside a Holm finding)
            note = no_control_note(blind, len(controls))
            rows = tuple(without_test(r, note) for r in rows)
            notes.append(note)
    rows, p_holm = targets_family(rows, alpha)
    if curve == "reward" and all(c is not None for c in controls):
        offset = sampler_offset_note(controls[:len(b)], controls[len(b):], rows, p_holm, paired=paired,  # type: ignore[arg-type]
                                     higher_is_better=higher_is_better, alpha=alpha)
        notes += [offset] if offset else []
    return SpeedupTable(rows, window, tuple(n for n, _ in b), tuple(n for n, _ in p), curve, p_holm, tuple(notes),
                        higher_is_better, alpha)


def check_common_start(logs: Sequence[tuple[str, pd.DataFrame]]) -> None:
    """UserError when the logs start at different epochs: a late log's first full window ends later, so its arm
    would read slower (a study verdict refuses the same, ``stats.verdict``)."""
    starts = {n: int(d["epoch"].min()) for n, d in logs}
    first = min(starts.values())
    if len(set(starts.values())) > 1:
        who = ", ".join(f"{n} at {e}" for n, e in starts.items() if e != first)
        raise UserError(f"the logs start at different epochs ({who}; the others at {first}): a log's first full "
                        "window would end later and its arm read slower; give every log the same first epoch (cut "
                        f"them to epoch >= {max(starts.values())})")


def cut_note(logs: Sequence[tuple[str, pd.DataFrame]]) -> str:
    """What cutting every log to the shortest one means (a crashed or shorter run): the restricted mean
    counts a run that has not reached a target by that epoch as that epoch, so a later hit is not seen."""
    last = [(n, int(d["epoch"].max())) for n, d in logs]
    tau, longest = min(e for _, e in last), max(e for _, e in last)
    short = [n for n, e in last if e == tau]
    who = ", ".join(short[:3]) + (", ..." if len(short) > 3 else "")
    return (f"compared over epochs up to {tau} only: {who} {'ends' if len(short) == 1 else 'end'} at epoch {tau} of "
            f"the longest log's {longest}, and every log is cut there (a hit after epoch {tau} counts as not "
            "reached); leave a crashed run out, or train it to the end")


def sampler_offset_note(baseline_controls: Sequence[np.ndarray], pcpo_controls: Sequence[np.ndarray],
                        rows: Sequence[Speedup], p_holm: Sequence[float | None], *, paired: bool,
                        higher_is_better: bool, alpha: float) -> str:
    """A note when a raw-reward speed-up found (Holm p < alpha) goes the way the arms' untrained samplers
    differ: each run's mean control reward, PCPO's against the baseline's (paired t by seed, else Welch;
    an offset of one sign in every pair, or with no overlap, counts too, as the study's sampler offset does).
    The raw reward holds the sampler's level as well as learning; ``--curve gain`` measures learning alone.
    Before, a PCPO sampler +0.1 above DDPO's with the same learning printed "+47%, p 0.005" (raw) and
    nothing else, where its gain curve said -12%, p 0.55. '' when nothing needs saying."""
    mb = np.asarray([float(np.nanmean(c)) for c in baseline_controls])
    mt = np.asarray([float(np.nanmean(c)) for c in pcpo_controls])
    diff = float(mt.mean() - mb.mean())
    favours = diff * (1.0 if higher_is_better else -1.0)  # > 0: PCPO's sampler alone is ahead
    found = [r for r, h in zip(rows, p_holm, strict=True) if h is not None and h < alpha and r.estimate is not None
             and r.estimate * favours > 0]
    if not found or mb.size < 2 or mt.size < 2 or (paired and mb.size != mt.size):
        return ""
    one_way = separated(mb, mt, paired)
    p = _t_test(mb, mt, paired, alpha)[0] if not no_spread(mb, mt, paired) else math.nan
    if not (p < alpha or one_way):
        return ""
    who = "PCPO" if diff > 0 else "the baseline"
    return (f"the raw-reward speed-up may be the sampler's, not learning: untrained, {who}'s sampler already scores "
            f"{abs(diff):.3g} {'higher' if diff > 0 else 'lower'} (mean control reward, "
            f"{'paired by seed' if paired else 'unpaired'}{f', p = {p_value(p)}' if math.isfinite(p) else ''}); "
            "--curve gain measures learning alone")


def control_curve(log: pd.DataFrame) -> np.ndarray | None:
    """A log's untrained-control curve on its epochs, or None when it logged none (no finite value)."""
    if "control_reward_mean" not in log.columns:
        return None
    c = log["control_reward_mean"].to_numpy(np.float64)
    return c if np.isfinite(c).any() else None


def uninformative(s: Speedup, note: str) -> Speedup:
    """``s`` as a target that says nothing about learning (``note`` the reason; unchanged when empty): no
    speed-up, CI, p or power, outside the Holm family; the restricted mean epochs stay for reading."""
    if not note:
        return s
    return replace(s, estimate=None, ci_low=None, ci_high=None, p=None, df=None, mde=None, seeds_for_reference=None,
                   uninformative=True, estimable=False, reason=note, significant=False, ci_gap_low=None,
                   ci_gap_high=None, ci_high_clipped=False, ci_low_clipped=False, p_method="")


def targets_family(rows: Sequence[Speedup], alpha: float) -> tuple[tuple[Speedup, ...], tuple[float | None, ...]]:
    """The targets of one table as one Holm family: the adjusted p per row (None without a p) and each
    row's MDE and seeds-for-reference at the family's level ``alpha / m`` (:func:`at_level`)."""
    from pcpo_eval.stats.adjust import holm_present
    from pcpo_eval.stats.power import family_level

    adj = holm_present([r.p if r.estimable else None for r in rows])
    m = sum(a is not None for a in adj)
    out = tuple(at_level(r, family_level(alpha, m)) if m > 1 else r for r in rows)
    return out, tuple(adj)


def control_has_window(control: Sequence[float] | np.ndarray | None, window: int) -> bool:
    """Whether an untrained control curve has a full window of ``window`` finite values, so that
    :func:`control_reaches` can say no (a control missing, or logged every other epoch, decides nothing)."""
    return control is not None and bool(np.isfinite(full_window_average(control, window)).any())


def control_reaches(control: Sequence[float] | np.ndarray, target: float, window: int, *,
                    higher_is_better: bool = True) -> bool:
    """Whether an untrained control curve reaches ``target`` in some full window of ``window`` logged values
    (a window with a missing control epoch decides nothing; the other windows still count, so a control
    missing one epoch cannot make a target the sampler reaches look informative)."""
    s = full_window_average(control, window)
    s = s[np.isfinite(s)]
    return bool(np.any(s >= target if higher_is_better else s <= target))


def raw_target_note(controls: Sequence[np.ndarray], target: float, window: int, higher_is_better: bool = True) -> str:
    """Why a raw-reward target says nothing about learning ('' when it may): some run's untrained control
    (``control_reward_mean``: the same prompts and noises, the run's own sampler, no training) reaches it, so
    a policy that learned nothing reaches it too, sooner with a better sampler (the rule of
    :func:`pcpo_eval.stats.verdict.target_status`)."""
    hits = sum(control_reaches(c, target, window, higher_is_better=higher_is_better) for c in controls)
    if not hits:
        return ""
    return (f"uninformative: the untrained control reaches {target:g} in {hits} of {len(controls)} runs, so the "
            "sampler reaches it without learning (a frozen policy with a better sampler would look fast); choose "
            "a target no control reaches, or --curve gain")


def no_control_note(blind: Sequence[str], n_logs: int) -> str:
    """Why a raw-reward target has no verdict when some log lacks the paired untrained control
    (``control_reward_mean`` with a full window of finite values): nothing tells a speed-up from a sampler
    change. Before, such a table carried a note beside the rows' p and Holm p, so a frozen policy with a
    better sampler could be a Holm finding ("faster") with the note beside it (tests/stats/test_speedup.py)."""
    who = ", ".join(blind[:2]) + (", ..." if len(blind) > 2 else "")
    return (f"no test: {len(blind)} of {n_logs} logs have no paired untrained control (control_reward_mean, "
            f"a full window; {who}), so reaching a raw reward cannot be told from a sampler change (a frozen policy "
            "with a better sampler would look fast): the speed-ups are printed as the paper's, without p; train "
            "with paired_control: true and use --curve gain")


def without_test(s: Speedup, note: str) -> Speedup:
    """``s`` as a number to read, not a finding: its epochs, speed-up and CI stay (the paper's table), its p,
    power and significance go (outside the Holm family), ``reason`` says why (``note``)."""
    if not s.estimable:
        return s
    return replace(s, p=None, significant=False, mde=None, seeds_for_reference=None, p_floor=None,
                   reason=f"{s.reason}; {note}" if s.reason else note)


def unreachable_targets(run_dirs: Sequence[str | Path], targets: Sequence[float], window: int) -> list[str]:
    """Problems for targets that no run's smoothed reward reaches: a sanity check on the spec (a typo,
    another reward's scale). Full windows only, the rule of both time to target and checkpoint
    selection (:func:`pcpo_eval.stats.select.match_checkpoint`), which ``select_target`` must pass."""
    best, any_log = float("-inf"), False
    for rd in run_dirs:
        try:
            log = load_log(log_path(rd))
        except UserError:
            continue
        any_log = True
        sm = full_window_average(log["reward_mean"].to_numpy(), window)
        if np.isfinite(sm).any():
            best = max(best, float(np.nanmax(sm)))
    if any_log and best == float("-inf"):
        return [f"no run has logged {window} epochs (the smoothing window), so no target can be reached on a "
                f"full-window average; train at least {window} epochs, or set a smaller window"]
    out = []
    for t in dict.fromkeys(targets):
        if t == t and not best >= t:  # NaN-safe
            out.append(f"target {t:g} is reached by no run (best smoothed reward {best:.4g}, window {window}); "
                       "lower it or train longer")
    return out
