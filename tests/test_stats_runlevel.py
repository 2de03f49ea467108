"""Run-level inference: per-run quantities, comparisons over runs, speed-up with censoring.

The heart of this file is the A/A test: two arms simulated from the SAME learning-curve process
must give `significant` at most ~alpha of the time, at 3 and at 5 runs per arm; and planted
differences must be detected at 5 runs per arm. References: scipy.stats (trim_mean, Mann-Whitney
U, ttest_ind with trim, permutation_test) -- the functions rliable itself builds on.
"""

from __future__ import annotations

import math

import numpy as np
import pytest
import scipy.stats

from pcpo_eval.errors import UserError
from pcpo_eval.stats import speedup as speedup_mod
from pcpo_eval.stats.runlevel import (
    ONE_RUN_PER_ARM,
    TimeToTarget,
    auc,
    compare_runs,
    epochs_to_target,
    fieller_ratio_interval,
    final,
    iqm,
    paired_gain,
    permutation_test,
    probability_of_improvement,
    reward_at_epochs,
    speedup_runs,
    stratified_bootstrap_ci,
    trimmed_t_interval,
)

ALPHA = 0.05
#: 200 studies: the SE of a rate near 0.05 is 0.015; allow ~2.5 SE above alpha.
FPR_MAX = 0.09
N_STUDIES = 200
TARGET = 0.6  # the simulated curves start near 0.3 and cross 0.6 around epoch 20


def simulate_arm(rng: np.random.Generator, n_runs: int, *, n_epochs: int = 60, rate: float = 0.05,
                 gain_shift: float = 0.0) -> tuple[np.ndarray, np.ndarray]:  # fmt: skip
    """(reward, control), each (n_runs, n_epochs): saturating learning curves of independent runs.

    Per run: a random learning rate (log-normal, SD 0.25) and plateau offset (SD 0.05); per epoch
    a prompt/noise effect (SD 0.05) shared by reward and control (what the paired gain cancels)
    and independent evaluation noise (SD 0.02) on each.
    """
    e = np.arange(1, n_epochs + 1)
    k = rate * np.exp(rng.normal(0, 0.25, (n_runs, 1)))
    plateau = 0.5 + rng.normal(0, 0.05, (n_runs, 1))
    epoch_effect = rng.normal(0, 0.05, (n_runs, n_epochs))
    control = 0.3 + epoch_effect + rng.normal(0, 0.02, (n_runs, n_epochs))
    reward = (
        0.3
        + epoch_effect
        + plateau * (1 - np.exp(-k * e))
        + gain_shift
        + rng.normal(0, 0.02, (n_runs, n_epochs))
    )
    return reward, control


def summaries(reward: np.ndarray, control: np.ndarray, target: float = TARGET) -> dict[str, object]:
    return {
        "final": np.array([final(r) for r in reward]),
        "auc": np.array([auc(r) for r in reward]),
        "paired_gain": np.array([paired_gain(r, c) for r, c in zip(reward, control, strict=True)]),
        "ett": [epochs_to_target(r, target) for r in reward],
    }


def significance_rates(seed: int, n_runs: int, *, rate_t: float = 0.05, gain_shift_t: float = 0.0,
                       target: float = TARGET, n_epochs: int = 60, n_studies: int = N_STUDIES) -> dict[str, float]:  # fmt: skip
    """Share of ``n_studies`` simulated studies in which each comparison is `significant`."""
    rng = np.random.default_rng(seed)
    hits: dict[str, list[bool]] = {}
    for _ in range(n_studies):
        b = summaries(*simulate_arm(rng, n_runs, n_epochs=n_epochs), target)
        t = summaries(
            *simulate_arm(rng, n_runs, n_epochs=n_epochs, rate=rate_t, gain_shift=gain_shift_t), target
        )
        for q in ("final", "auc", "paired_gain"):
            c = compare_runs(b[q], t[q], n_boot=200, rng=rng, alpha=ALPHA)
            hits.setdefault(q, []).append(c.significant)
            hits.setdefault(q + "/poi_ci_excludes_half", []).append(not c.poi_ci_low <= 0.5 <= c.poi_ci_high)
            lo, hi = stratified_bootstrap_ci(b[q], t[q], lambda x, y: y.mean(-1) - x.mean(-1),
                                             n_boot=1000, rng=rng, alpha=ALPHA)  # fmt: skip
            hits.setdefault(q + "/percentile_bootstrap", []).append(lo > 0 or hi < 0)
        s = speedup_runs(b["ett"], t["ett"], rng=rng, alpha=ALPHA)
        hits.setdefault("speedup", []).append(s.significant)
        hits.setdefault("speedup_is_a_bound", []).append(s.bound in ("lower", "upper"))
    return {k: float(np.mean(v)) for k, v in hits.items()}


# ---------------------------------------------------------------------------------------------
# per-run quantities
# ---------------------------------------------------------------------------------------------


def test_epochs_to_target_reached_censored_and_at_start():
    ramp = np.linspace(0.0, 1.0, 51)  # epoch e has value (e-1)/50; window-1 -> no smoothing lag
    r = epochs_to_target(ramp, 0.5, window=1)
    assert (r.epoch, r.censored, r.first_epoch, r.last_epoch, r.value) == (26, False, 1, 51, 26.0)
    never = epochs_to_target(ramp, 2.0, window=1)
    assert never.epoch is None and never.censored and never.value == 51.0  # censored, not dropped
    start = epochs_to_target(ramp, -1.0)
    assert start.at_start and start.epoch == 1
    down = epochs_to_target(ramp[::-1], 0.2, window=1, higher_is_better=False)
    assert down.epoch == 41
    shifted = epochs_to_target(ramp, 0.5, window=1, epochs=np.arange(10, 61))
    assert (shifted.epoch, shifted.first_epoch, shifted.last_epoch) == (35, 10, 60)


def test_epochs_to_target_matches_the_speedup_table_convention():
    import pandas as pd

    y = np.cumsum(np.random.default_rng(1).normal(0.02, 0.05, 80))
    log = pd.DataFrame({"epoch": np.arange(1, 81), "reward_mean": y})
    for target in (0.2, 0.5, 1.0, 5.0):
        ours = epochs_to_target(y, target, 5)
        assert ours.epoch == speedup_mod.epochs_to_target(log, target, 5)


def test_epochs_to_target_non_finite_curve_is_flagged():
    r = epochs_to_target([0.1, np.nan, 0.9], 0.5)
    assert not r.finite and r.epoch is None and not r.censored and math.isnan(r.value)


def test_reward_at_epochs_auc_final_paired_gain():
    y = np.arange(1.0, 11.0)  # epoch e -> e
    np.testing.assert_allclose(reward_at_epochs(y, [1, 10]), [1.0, 10.0])
    np.testing.assert_allclose(reward_at_epochs(y, [10], window=5), [8.0])  # mean of 6..10
    with pytest.raises(UserError, match="epoch 11 is not logged"):
        reward_at_epochs(y, [11])
    assert auc(np.full(7, 0.3)) == pytest.approx(0.3)
    assert auc(np.linspace(0, 1, 11)) == pytest.approx(0.5)
    assert auc([0.0, 1.0, 1.0], epochs=[1, 2, 11]) == pytest.approx((0.5 + 9.0) / 10)
    assert final(y, 3) == pytest.approx(9.0)
    with pytest.raises(UserError, match="fewer than k=20"):
        final(y, 20)
    noise = np.random.default_rng(0).normal(0, 1, 10)
    assert paired_gain(0.5 + noise + 0.1, 0.5 + noise, k=5) == pytest.approx(0.1)  # epoch noise cancels
    with pytest.raises(UserError, match="control has 9"):
        paired_gain(y, y[:9])
    with pytest.raises(UserError, match="strictly increasing"):
        auc([1.0, 2.0], epochs=[2, 2])


# ---------------------------------------------------------------------------------------------
# statistics against scipy (the functions rliable is built on)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nb", "nt"), [(3, 3), (5, 5), (4, 6), (2, 7)])
def test_iqm_poi_and_t_interval_match_scipy(nb, nt):
    rng = np.random.default_rng(nb * 10 + nt)
    b, t = rng.normal(size=nb), rng.normal(size=nt) + 0.5
    assert iqm(t) == pytest.approx(scipy.stats.trim_mean(t, 0.25))
    u = scipy.stats.mannwhitneyu(t, b, alternative="greater").statistic
    assert probability_of_improvement(b, t) == pytest.approx(u / (nb * nt))
    for trim in (0.0, 0.25):
        ours = trimmed_t_interval(b, t, trim=trim, alpha=0.05)
        ref = scipy.stats.ttest_ind(t, b, equal_var=False, trim=trim)
        ci = ref.confidence_interval(0.95)
        np.testing.assert_allclose([ours.low, ours.high, ours.df], [ci.low, ci.high, ref.df], rtol=1e-10)


def test_probability_of_improvement_counts_ties_half():
    assert probability_of_improvement(np.array([1.0, 2.0]), np.array([2.0, 3.0])) == pytest.approx(0.875)


@pytest.mark.parametrize(("nb", "nt"), [(3, 3), (4, 6), (5, 5)])
def test_exact_permutation_p_matches_scipy(nb, nt):
    rng = np.random.default_rng(nb + 100 * nt)
    b, t = rng.normal(size=nb), rng.normal(size=nt) + 1.0
    ours = permutation_test(b, t, rng=rng)
    ref = scipy.stats.permutation_test(
        (t, b), lambda x, y, axis: np.abs(np.mean(x, axis) - np.mean(y, axis)),
        permutation_type="independent", alternative="greater", n_resamples=np.inf,
    )  # fmt: skip
    assert ours.exact and ours.n_relabellings == math.comb(nb + nt, nt)
    assert ours.p == pytest.approx(ref.pvalue)


def test_permutation_3_vs_3_cannot_go_below_0_1_and_monte_carlo_agrees():
    b, t = np.array([1.0, 2.0, 3.0]), np.array([10.0, 11.0, 12.0])
    exact = permutation_test(b, t, rng=np.random.default_rng(0))
    assert (exact.n_relabellings, exact.p, exact.p_min) == (20, pytest.approx(0.1), pytest.approx(0.1))
    rng = np.random.default_rng(1)
    b7, t7 = rng.normal(size=7), rng.normal(size=7) + 0.8
    ex = permutation_test(b7, t7, rng=rng)
    mc = permutation_test(b7, t7, rng=rng, limit=100, n_resamples=20_000)
    assert ex.exact and not mc.exact and mc.p_min == pytest.approx(1 / 20_001)
    assert mc.p == pytest.approx(ex.p, abs=0.01)


def test_fieller_endpoints_solve_the_pivot_equation():
    a_x, b_x = np.array([19.0, 22.0, 17.0, 25.0]), np.array([12.0, 11.0, 14.0])
    lo, hi = fieller_ratio_interval(a_x, b_x, alpha=0.05)
    a, b = a_x.mean(), b_x.mean()
    va, vb = a_x.var(ddof=1) / 4, b_x.var(ddof=1) / 3
    rho = a / b
    df = (va + rho**2 * vb) ** 2 / (va**2 / 3 + rho**4 * vb**2 / 2)
    q = scipy.stats.t.ppf(0.975, df)
    assert lo < rho < hi
    for r in (lo, hi):  # the pivot (a - r b) / sqrt(va + r^2 vb) equals +-q at the ends
        assert abs(a - r * b) / math.sqrt(va + r * r * vb) == pytest.approx(q)


def test_fieller_unbounded_when_the_denominator_is_too_uncertain():
    lo, hi = fieller_ratio_interval(np.array([15.0, 33.0, 28.0]), np.array([40.0, 18.0, 12.0]), alpha=0.05)
    assert hi == math.inf and 0 < lo < (76 / 70)


# ---------------------------------------------------------------------------------------------
# compare_runs: results and degenerate inputs
# ---------------------------------------------------------------------------------------------


def test_compare_runs_fields_and_determinism():
    b, t = [0.80, 0.82, 0.79], [0.90, 0.93, 0.91]
    c = compare_runs(b, t, rng=np.random.default_rng(5))
    assert c == compare_runs(b, t, rng=np.random.default_rng(5))
    assert c.estimable and c.reason == "" and (c.n_baseline, c.n_treatment) == (3, 3)
    assert c.estimate == pytest.approx(np.mean(t) - np.mean(b))
    assert c.ci_low is not None and c.ci_high is not None and 0 < c.ci_low < c.estimate < c.ci_high
    assert c.significant and c.ci_method == "Welch t"
    assert c.p == pytest.approx(0.1) and c.p_method == "exact permutation over 20 relabellings"
    assert c.poi == 1.0 and c.poi_ci_low is not None and c.poi_ci_low <= 1.0 == c.poi_ci_high
    overlap = compare_runs([0.80, 0.85, 0.79], [0.81, 0.84, 0.80], rng=np.random.default_rng(5))
    assert overlap.estimable and not overlap.significant and overlap.ci_low < 0 < overlap.ci_high


def test_compare_runs_iqm_ignores_an_outlier_run():
    b = np.array([0.80, 0.81, 0.79, 0.80, 0.82])
    t = np.array([0.90, 0.91, 0.89, 0.90, -5.0])  # one diverged run
    rng = np.random.default_rng(0)
    m, q = compare_runs(b, t, "mean", rng=rng), compare_runs(b, t, "iqm", rng=rng)
    assert q.estimate == pytest.approx(scipy.stats.trim_mean(t, 0.25) - scipy.stats.trim_mean(b, 0.25))
    assert q.significant and q.ci_method.startswith("Yuen") and not m.significant


@pytest.mark.parametrize(
    ("b", "t", "reason"),
    [
        ([0.8], [0.9], ONE_RUN_PER_ARM),
        ([0.8], [0.9, 0.91, 0.92], "1 baseline run: no run-to-run spread"),
        ([0.8, 0.8, 0.8], [0.8, 0.8, 0.8], "no variation: every run of both arms has the same value"),
        ([0.8, 0.8, 0.8], [0.9, 0.9, 0.9], "no within-arm variation"),
        ([0.8, np.nan, 0.7], [0.9, 0.9, 0.8], "non-finite values (NaN/inf) in 1 of 6 runs"),
        ([0.8, 0.7, np.inf], [0.9, 0.9, 0.8], "non-finite values (NaN/inf) in 1 of 6 runs"),
        ([], [0.9, 0.9, 0.8], "no baseline runs"),
    ],
)
def test_compare_runs_degenerate_inputs_are_not_estimable(b, t, reason):
    c = compare_runs(b, t, rng=np.random.default_rng(0))
    assert not c.estimable and c.reason.startswith(reason)
    assert c.p is None and c.ci_low is None and c.ci_high is None and not c.significant
    if reason == ONE_RUN_PER_ARM:
        assert c.estimate == pytest.approx(0.1)  # a difference between two runs, still shown


def test_compare_runs_iqm_with_no_spread_left_after_trimming():
    c = compare_runs(
        [1.0, 1.0, 1.0, 1.0, 5.0], [2.0, 2.0, 2.0, 2.0, 0.0], "iqm", rng=np.random.default_rng(0)
    )
    assert not c.estimable and "after trimming" in c.reason and c.p is None


def test_compare_runs_user_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(UserError, match="unknown stat 'median'"):
        compare_runs([1.0, 2.0], [1.0, 3.0], "median", rng=rng)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="1-D array"):
        compare_runs([[1.0, 2.0]], [1.0, 3.0], rng=rng)
    with pytest.raises(UserError, match="alpha"):
        compare_runs([1.0, 2.0], [1.0, 3.0], rng=rng, alpha=5)


# ---------------------------------------------------------------------------------------------
# speed-up with censoring
# ---------------------------------------------------------------------------------------------


def _t(epoch: int | None, last: int = 60, first: int = 1) -> TimeToTarget:
    return TimeToTarget(epoch, epoch is None, first, last)


def test_speedup_point_estimate_is_the_paper_formula():
    s = speedup_runs([_t(19), _t(22), _t(17)], [_t(12), _t(11), _t(14)], rng=np.random.default_rng(0))
    assert s.estimate == pytest.approx(
        speedup_mod.speedup_pct(np.mean([19, 22, 17]), np.mean([12, 11, 14])) / 100
    )
    assert s.bound == "point" and s.estimable and s.significant and 0 < s.ci_low < s.estimate < s.ci_high
    assert s.p == pytest.approx(0.1) and s.p_min == pytest.approx(0.1)


def test_speedup_baseline_censored_gives_a_lower_bound_and_keeps_every_run():
    b = [_t(None), _t(50), _t(55), _t(None)]
    s = speedup_runs(b, [_t(20), _t(22), _t(19), _t(21)], rng=np.random.default_rng(0))
    assert s.n_baseline == 4 and s.n_censored_baseline == 2 and s.baseline_epochs == (60.0, 50.0, 55.0, 60.0)
    assert s.bound == "lower" and s.estimable and s.ci_high is None
    assert s.estimate == pytest.approx(56.25 / 20.5 - 1) and s.ci_low is not None and s.ci_low < s.estimate
    assert s.significant == (s.ci_low > 0)


def test_speedup_treatment_censored_gives_an_upper_bound():
    s = speedup_runs([_t(20), _t(22), _t(19)], [_t(None), _t(50), _t(45)], rng=np.random.default_rng(0))
    assert (
        s.bound == "upper" and s.ci_low is None and s.ci_high is not None and s.ci_high < 0 and s.significant
    )


@pytest.mark.parametrize(
    ("b", "t", "reason"),
    [
        ([_t(None), _t(30), _t(25)], [_t(None), _t(20), _t(19)],
         "1 of 3 baseline and 1 of 3 treatment runs never reach the target (censored in both arms"),
        ([_t(None), _t(None)], [_t(None), _t(None)],
         "2 of 2 baseline and 2 of 2 treatment runs never reach the target (censored in both arms"),
        ([_t(1), _t(1), _t(1)], [_t(1), _t(1), _t(1)], "uninformative target"),
        ([_t(20)], [_t(10)], ONE_RUN_PER_ARM),
        ([_t(20), _t(20)], [_t(10), _t(10)], "no within-arm variation"),
        ([_t(20), TimeToTarget(None, False, 1, 60, finite=False)], [_t(10), _t(12)], "non-finite rewards in 1 of 4"),
    ],
)  # fmt: skip
def test_speedup_not_estimable(b, t, reason):
    s = speedup_runs(b, t, rng=np.random.default_rng(0))
    assert not s.estimable and s.reason.startswith(reason) and s.p is None and not s.significant
    assert s.ci_low is None and s.ci_high is None
    assert s.uninformative == (reason == "uninformative target")


def test_censoring_bound_is_below_the_uncensored_speedup():
    """Truncating training (censoring slow baseline runs) can only lower the speed-up estimate."""
    rng = np.random.default_rng(11)
    rb, _ = simulate_arm(rng, 5, n_epochs=200, rate=0.02)
    rt, _ = simulate_arm(rng, 5, n_epochs=200, rate=0.05)
    full = speedup_runs(
        [epochs_to_target(r, 0.7) for r in rb], [epochs_to_target(r, 0.7) for r in rt], rng=rng
    )
    cut = speedup_runs(
        [epochs_to_target(r[:60], 0.7) for r in rb], [epochs_to_target(r[:60], 0.7) for r in rt], rng=rng
    )
    assert full.bound == "point" and cut.bound == "lower" and cut.n_censored_baseline > 0
    assert cut.estimate is not None and full.estimate is not None and cut.estimate < full.estimate
    assert cut.ci_low is not None and full.ci_low is not None and cut.ci_low <= full.ci_low


# ---------------------------------------------------------------------------------------------
# A/A false-positive rates and power (seeds fixed; rates reported in the module docstring)
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("n_runs", "seed"), [(3, 20240703), (5, 20240705)])
def test_aa_false_positive_rate_holds_alpha(n_runs, seed):
    rates = significance_rates(seed, n_runs)
    for q in ("final", "auc", "paired_gain", "speedup"):
        assert rates[q] <= FPR_MAX, (
            f"A/A false-positive rate of {q} at {n_runs} runs/arm: {rates[q]:.3f} ({rates})"
        )
    # why not rliable's percentile bootstrap: over 3 runs it rejects far more often than alpha
    if n_runs == 3:
        assert min(rates[q + "/percentile_bootstrap"] for q in ("final", "auc", "paired_gain")) > 0.10, rates


def test_aa_false_positive_rate_with_censored_runs():
    """A target that a good share of runs never reach: the bounds must still hold alpha."""
    rates = significance_rates(20240713, 5, target=0.72)
    assert rates["speedup_is_a_bound"] > 0.3, rates  # the scenario does censor (in one arm)
    assert rates["speedup"] <= FPR_MAX, rates


def test_power_treatment_learns_twice_as_fast():
    rates = significance_rates(20240725, 5, rate_t=0.10)
    assert rates["speedup"] >= 0.65, rates  # measured 0.765 over 1000 studies (seed 20240615)
    assert rates["auc"] >= 0.4, rates  # measured 0.567


def test_power_paired_gain_plus_3_sd():
    rng = np.random.default_rng(0)
    sd = float(np.std(summaries(*simulate_arm(rng, 2000))["paired_gain"], ddof=1))  # type: ignore[arg-type]
    rates = significance_rates(20240735, 5, gain_shift_t=3 * sd)
    assert rates["paired_gain"] >= 0.9, rates
