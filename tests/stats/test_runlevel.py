"""Run-level inference (pcpo_eval.stats.runlevel): per-run quantities and comparisons over runs.

References: scipy.stats (ttest_rel, ttest_1samp, ttest_ind with equal_var=False and trim,
trim_mean, Mann-Whitney U, permutation_test) and brute-force enumeration of sign flips. The
calibration of whole studies (A/A rates, power) lives in tests/stats/test_verdict.py.
"""

from __future__ import annotations

import itertools
import math

import numpy as np
import pytest
import scipy.stats

from pcpo_eval.errors import UserError
from pcpo_eval.stats.power import expected_power, mde, spread_factor, welch_power, welch_spread_df
from pcpo_eval.stats.runlevel import (
    ONE_RUN_PER_ARM,
    auc,
    compare_runs,
    degenerate_reason,
    final,
    iqm,
    no_spread_difference,
    paired_gain,
    permutation_test,
    probability_of_improvement,
    reward_at_epochs,
    sign_flip_test,
    stratified_bootstrap_ci,
    trimmed_paired_interval,
    trimmed_t_interval,
    yuen_parts,
)

ALPHA = 0.05

# ---------------------------------------------------------------------------------------------
# per-run quantities
# ---------------------------------------------------------------------------------------------


def test_reward_at_epochs_auc_final_paired_gain():
    y = np.arange(1.0, 11.0)  # epoch e -> e
    np.testing.assert_allclose(reward_at_epochs(y, [1, 10]), [1.0, 10.0])
    np.testing.assert_allclose(reward_at_epochs(y, [10], window=5), [8.0])  # mean of 6..10
    np.testing.assert_allclose(reward_at_epochs(y, [12], epochs=np.arange(3, 13)), [10.0])
    with pytest.raises(UserError, match="epoch 11 is not logged"):
        reward_at_epochs(y, [11])
    assert auc(np.full(7, 0.3)) == pytest.approx(0.3)
    assert auc(np.linspace(0, 1, 11)) == pytest.approx(0.5)
    assert auc([0.0, 1.0, 1.0], epochs=[1, 2, 11]) == pytest.approx((0.5 + 9.0) / 10)
    assert final(y, 3) == pytest.approx(9.0)
    assert math.isnan(final([1.0, np.nan, 2.0], 2))  # NaN propagates, compare_runs reports it
    with pytest.raises(UserError, match="fewer than k=20"):
        final(y, 20)
    noise = np.random.default_rng(0).normal(0, 1, 10)
    assert paired_gain(0.5 + noise + 0.1, 0.5 + noise, k=5) == pytest.approx(0.1)  # epoch noise cancels
    with pytest.raises(UserError, match="control has 9"):
        paired_gain(y, y[:9])
    with pytest.raises(UserError, match="strictly increasing"):
        auc([1.0, 2.0], epochs=[2, 2])


# ---------------------------------------------------------------------------------------------
# unpaired statistics against scipy
# ---------------------------------------------------------------------------------------------


@pytest.mark.parametrize(("nb", "nt"), [(3, 3), (5, 5), (4, 6), (2, 7)])
def test_iqm_poi_and_welch_yuen_intervals_match_scipy(nb, nt):
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
        c = compare_runs(b, t, "iqm" if trim else "mean", n_boot=50, rng=rng)
        # 2 runs in an arm, or arms of unequal size: the t test is not trusted alone (permutation.t_not_robust),
        # p is never below the exact relabelling test's
        trusted = min(nb, nt) >= 3 and nb == nt
        want = ref.pvalue if trusted else max(ref.pvalue, c.p_permutation)
        assert not c.paired and c.p == pytest.approx(want, rel=1e-10)
        assert (c.p_floor is None) == trusted and ("a t test needs at least 3" in c.reason) == (nb < 3)
        assert ("not trusted alone with unequal arms" in c.reason) == (min(nb, nt) >= 3 and nb != nt)
        assert (c.ci_low, c.ci_high) == (pytest.approx(ci.low, rel=1e-10), pytest.approx(ci.high, rel=1e-10))
        assert c.significant == (c.p < ALPHA)
        if min(nb, nt) >= 3:
            assert c.significant == (c.ci_low > 0 or c.ci_high < 0)


def test_unequal_arms_of_runs_that_learn_or_not_keep_the_false_positive_rate():
    """A/A, 10 vs 3 runs that learn (0.15) or collapse (0) with probability 1/2: Welch's t alone called 19% of
    the comparisons significant (scipy: 0.191 of 20,000); bounded by the exact relabelling test, at most 5% (the
    test of exchangeable runs is exact under A/A)."""
    rng = np.random.default_rng(0)
    n, hits, welch = 400, 0, 0
    for _ in range(n):
        b, t = (np.where(rng.random(k) < 0.5, 0.15, 0.0) + rng.normal(0, 0.01, k) for k in (10, 3))
        c = compare_runs(b, t, n_boot=10, rng=rng)
        hits += c.significant
        welch += scipy.stats.ttest_ind(t, b, equal_var=False).pvalue < ALPHA
    assert welch / n > 0.12  # the failure is there to be caught
    assert hits / n <= 0.05 + 2 * np.sqrt(0.05 * 0.95 / n)


def test_probability_of_improvement_by_binary_search_equals_all_pairs():
    """Above POI_PAIRWISE_LIMIT run pairs (500 runs per arm: a 2,000-draw bootstrap's pairwise array took
    4.6 GB) each row counts by binary search; with ties, per leading row and with a shared baseline, it equals
    the all-pairs count exactly."""
    from pcpo_eval.stats.runlevel import POI_PAIRWISE_LIMIT

    rng = np.random.default_rng(0)
    b, t = rng.integers(0, 20, (6, 90)).astype(float), rng.integers(0, 20, (6, 80)).astype(float)
    assert 90 * 80 > POI_PAIRWISE_LIMIT
    d = t[..., :, None] - b[..., None, :]
    want = (np.sum(d > 0, axis=(-2, -1)) + 0.5 * np.sum(d == 0, axis=(-2, -1))) / (90 * 80)
    np.testing.assert_array_equal(probability_of_improvement(b, t), want)
    shared = probability_of_improvement(b[0], t)  # one baseline broadcast against 6 treatment rows
    np.testing.assert_array_equal(shared, [float(probability_of_improvement(b[0], t[i])) for i in range(6)])
    u = scipy.stats.mannwhitneyu(t[0], b[0]).statistic
    assert float(probability_of_improvement(b[0], t[0])) == pytest.approx(u / (90 * 80))


def test_probability_of_improvement_counts_ties_half():
    assert probability_of_improvement(np.array([1.0, 2.0]), np.array([2.0, 3.0])) == pytest.approx(0.875)


def test_stratified_bootstrap_resamples_each_arm():
    b, t = np.array([0.0, 0.0, 0.0]), np.array([1.0, 1.0, 1.0])
    lo, hi = stratified_bootstrap_ci(b, t, probability_of_improvement, n_boot=100,
                                     rng=np.random.default_rng(0), alpha=0.05)  # fmt: skip
    assert lo == hi == 1.0


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


def test_permutation_floor_and_monte_carlo_agree():
    b, t = np.array([1.0, 2.0, 3.0]), np.array([10.0, 11.0, 12.0])
    exact = permutation_test(b, t, rng=np.random.default_rng(0))
    assert (exact.n_relabellings, exact.p, exact.p_min) == (20, pytest.approx(0.1), pytest.approx(0.1))
    rng = np.random.default_rng(1)
    b7, t7 = rng.normal(size=7), rng.normal(size=7) + 0.8
    ex = permutation_test(b7, t7, rng=rng)
    mc = permutation_test(b7, t7, rng=rng, limit=100, n_resamples=20_000)
    assert ex.exact and not mc.exact and mc.p_min == pytest.approx(1 / 20_001)
    assert mc.p == pytest.approx(ex.p, abs=0.01)
    assert ex.scope() == "all 3,432" and mc.scope() == "20,000 random of 3,432"


# ---------------------------------------------------------------------------------------------
# paired: t on the per-seed differences, sign flips
# ---------------------------------------------------------------------------------------------


def _brute_force_sign_flip_p(d: np.ndarray) -> float:
    obs = abs(d.mean())
    hits = [abs(np.mean(np.array(s) * d)) >= obs - 1e-12 for s in itertools.product((1, -1), repeat=d.size)]
    return float(np.mean(hits))


@pytest.mark.parametrize("n", [2, 3, 4, 6, 9])
def test_sign_flip_exact_p_equals_brute_force_enumeration(n):
    rng = np.random.default_rng(n)
    for shift in (0.0, 0.5, 2.0):
        d = rng.normal(shift, 1.0, n)
        ours = sign_flip_test(d, rng=rng)
        assert ours.exact and ours.n_relabellings == 2**n
        assert ours.p == pytest.approx(_brute_force_sign_flip_p(d))


def test_sign_flip_floor_and_monte_carlo():
    three = sign_flip_test(np.array([1.0, 2.0, 3.0]), rng=np.random.default_rng(0))
    assert three.p == pytest.approx(2 / 8) and three.p_min == pytest.approx(2 / 8)
    d = np.random.default_rng(2).normal(0.7, 1.0, 10)
    ex = sign_flip_test(d, rng=np.random.default_rng(0))
    mc = sign_flip_test(d, rng=np.random.default_rng(0), limit=100, n_resamples=20_000)
    assert ex.exact and not mc.exact and mc.n_relabellings == 1024 and mc.p_min == pytest.approx(1 / 20_001)
    assert mc.p == pytest.approx(ex.p, abs=0.01)
    # what the p was computed over: the draws, not every pattern (a 302-digit count at 1000 seeds before)
    assert ex.scope() == "all 1,024" and mc.scope() == "20,000 random of 1,024"
    big = sign_flip_test(np.random.default_rng(3).normal(size=1000), rng=np.random.default_rng(0))
    assert big.scope() == "9,999 random of about 10^301" and big.n_drawn == 9_999


@pytest.mark.parametrize("n", [2, 3, 5, 8])
def test_paired_compare_is_the_paired_t_test(n):
    """CI and p equal scipy's ttest_rel and a one-sample t on the differences; the seed effect
    (large, shared by both arms) cancels, so the paired CI is much narrower than Welch's."""
    rng = np.random.default_rng(100 + n)
    seed = rng.normal(0, 1.0, n)
    b = seed + rng.normal(0, 0.05, n)
    t = seed + 0.08 + rng.normal(0, 0.05, n)
    c = compare_runs(b, t, n_boot=50, rng=rng, paired=True)
    rel = scipy.stats.ttest_rel(t, b)
    one = scipy.stats.ttest_1samp(t - b, 0.0)
    ci = rel.confidence_interval(0.95)
    assert c.paired and c.estimable and c.ci_method == "paired t" and c.df == n - 1
    assert rel.pvalue == pytest.approx(one.pvalue, rel=1e-10)
    # 2 seeds: the t test is not trusted alone (permutation.t_not_robust), p is never below the sign-flip test's
    assert c.p == pytest.approx(rel.pvalue if n >= 3 else max(rel.pvalue, c.p_permutation), rel=1e-10)
    np.testing.assert_allclose([c.ci_low, c.ci_high], [ci.low, ci.high], rtol=1e-10)
    assert c.estimate == pytest.approx(np.mean(t - b))
    assert c.baseline_value == pytest.approx(b.mean()) and c.treatment_value == pytest.approx(t.mean())
    assert c.p_permutation == pytest.approx(_brute_force_sign_flip_p(t - b))
    assert c.p_min == pytest.approx(2 / 2**n)
    if n >= 3:
        assert c.p_method.startswith("paired t (permutation check: exact sign-flip over") and c.p_floor is None
        assert c.mde == pytest.approx(mde(float(np.std(t - b, ddof=1)), n, paired=True, measured=True))
    else:  # the exact test's floor (2/4) is above alpha: no effect is detectable
        assert c.p_method.startswith("the larger of the paired t's p and the p of the exact sign-flip permutation test over all 4 (")
        assert c.p_floor == 0.5 and c.mde is None and "2 seeds: a t test needs at least 3" in c.reason
    assert c.significant == (c.p < ALPHA)
    welch = compare_runs(b, t, n_boot=50, rng=rng)
    assert welch.ci_high - welch.ci_low > 3 * (c.ci_high - c.ci_low)


def test_trimmed_paired_interval_without_trim_is_the_one_sample_t():
    d = np.random.default_rng(4).normal(0.3, 1.0, 7)
    ours = trimmed_paired_interval(d, trim=0.0, alpha=0.1)
    ci = scipy.stats.ttest_1samp(d, 0.0).confidence_interval(0.9)
    np.testing.assert_allclose([ours.low, ours.high, ours.df], [ci.low, ci.high, 6], rtol=1e-10)
    iq = trimmed_paired_interval(np.r_[d, 50.0], trim=0.25, alpha=0.1)
    assert iq.estimate == pytest.approx(scipy.stats.trim_mean(np.r_[d, 50.0], 0.25)) and iq.df == 8 - 2 * 2 - 1


def test_significant_iff_ci_excludes_zero_paired_and_unpaired(monkeypatch):
    import pcpo_eval.stats.runlevel as runlevel

    monkeypatch.setattr(runlevel, "_mde", lambda *a, **k: None)  # power figures: not checked here
    rng = np.random.default_rng(9)
    seen = set()
    for _ in range(150):
        n = int(rng.integers(2, 7))
        b = rng.normal(0, 1, n)
        t = b * rng.uniform(0, 1) + rng.normal(rng.uniform(0, 2), 1, n)
        for paired in (True, False):
            c = compare_runs(b, t, n_boot=10, rng=rng, paired=paired)
            excludes = c.ci_low > 0 or c.ci_high < 0
            if c.p_floor is None:
                assert c.significant == (c.p < ALPHA) == excludes
            else:  # 2 runs in an arm: p bounded by the exact test's, so significant implies the t CI excludes 0
                assert c.significant == (c.p < ALPHA) and (excludes or not c.significant) and c.p >= c.p_floor
            seen.add(c.significant)
    assert seen == {True, False}


# ---------------------------------------------------------------------------------------------
# compare_runs: fields and degenerate inputs
# ---------------------------------------------------------------------------------------------


def test_compare_runs_fields_and_determinism():
    b, t = [0.80, 0.82, 0.79], [0.90, 0.93, 0.91]
    c = compare_runs(b, t, rng=np.random.default_rng(5))
    assert c == compare_runs(b, t, rng=np.random.default_rng(5))
    assert c.estimable and c.reason == "" and (c.n_baseline, c.n_treatment) == (3, 3) and not c.paired
    assert c.estimate == pytest.approx(np.mean(t) - np.mean(b))
    assert c.ci_low is not None and c.ci_high is not None and 0 < c.ci_low < c.estimate < c.ci_high
    assert c.ci_method == "Welch t" and c.significant
    assert c.p == pytest.approx(scipy.stats.ttest_ind(t, b, equal_var=False).pvalue) and c.p < ALPHA
    # the permutation check cannot go below 2/20 with 3 vs 3 runs; significance follows the t test
    assert c.p_permutation == pytest.approx(0.1) and c.p_min == pytest.approx(0.1)
    assert c.p_method == "Welch t (permutation check: exact relabelling over all 20)"
    assert c.poi == 1.0 and c.poi_ci_low is not None and c.poi_ci_low <= 1.0 == c.poi_ci_high
    assert c.mde == pytest.approx(mde(float(np.std(b, ddof=1)), 3, sd_t=float(np.std(t, ddof=1)), n_t=3,
                                      paired=False, measured=True))  # fmt: skip
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
    ("b", "t", "paired", "reason"),
    [
        ([0.8], [0.9], False, ONE_RUN_PER_ARM),
        ([0.8], [0.9], True, ONE_RUN_PER_ARM),
        ([0.8], [0.9, 0.91, 0.92], False, "1 baseline run: no run-to-run spread"),
        ([0.8, 0.8, 0.8], [0.8, 0.8, 0.8], False, "no variation: every run of both arms has the same value"),
        ([0.8, np.nan, 0.7], [0.9, 0.9, 0.8], False, "non-finite values (NaN/inf) in 1 of 6 runs"),
        ([0.8, 0.7, np.inf], [0.9, 0.9, 0.8], True, "non-finite values (NaN/inf) in 1 of 6 runs"),
        ([], [0.9, 0.9, 0.8], False, "no baseline runs"),
        # paired: the runs vary, the per-seed differences do not
        ([0.5, 0.7, 0.9], [0.5, 0.7, 0.9], True, "no difference in any seed: the arms' values are equal seed for seed"),
    ],
)
def test_compare_runs_degenerate_inputs_are_not_estimable(b, t, paired, reason):
    c = compare_runs(b, t, rng=np.random.default_rng(0), paired=paired)
    assert not c.estimable and c.reason.startswith(reason) and c.paired == paired
    assert c.p is None and c.ci_low is None and c.ci_high is None and not c.significant
    assert c.reason == degenerate_reason(np.asarray(b, dtype=float), np.asarray(t, dtype=float), paired)
    if reason == ONE_RUN_PER_ARM:
        assert c.estimate == pytest.approx(0.1)  # a difference between two runs, still shown


@pytest.mark.parametrize(
    ("b", "t", "paired", "p"),
    [
        # 6 seeds, every per-seed difference +0.1 (up to rounding): exact sign flips, 2 / 2^6
        ([0.5, 0.7, 0.9, 0.2, 0.4, 0.6], [0.6, 0.8, 1.0, 0.3, 0.5, 0.7], True, 2 / 64),
        ([0.5, 0.7, 0.9], [0.6, 0.8, 1.0], True, 2 / 8),
        # each arm constant at its own value: relabellings, 2 / C(6, 3) and 2 / C(12, 6)
        ([0.8] * 3, [0.9] * 3, False, 2 / 20),
        ([0.8] * 6, [0.7] * 6, False, 2 / 924),
    ],
)  # fmt: skip
def test_no_spread_but_a_consistent_difference_gives_the_exact_permutation_p(b, t, paired, p):
    """The t test is degenerate, the difference is not: p is the exact permutation p, no CI, no MDE
    (review item 11; these were "not estimable" with no p)."""
    b, t = np.asarray(b), np.asarray(t)
    assert degenerate_reason(b, t, paired) and no_spread_difference(b, t, paired)
    c = compare_runs(b, t, rng=np.random.default_rng(0), paired=paired)
    ref = sign_flip_test(t - b, rng=np.random.default_rng(0)) if paired else permutation_test(b, t, rng=np.random.default_rng(0))
    assert c.estimable and c.p == pytest.approx(p) == pytest.approx(ref.p) and c.p_permutation == c.p
    assert c.significant == (p < ALPHA) and c.ci_low is None and c.ci_high is None and c.mde is None
    assert c.reason.startswith("CI not estimable") and "exact" in c.reason and "permutation" in c.p_method
    assert c.estimate == pytest.approx(float(np.mean(t - b)))


def test_iqm_mde_is_the_trimmed_tests():
    """stat='iqm': the MDE is the power of the trimmed test whose CI is printed (winsorised SE, h - 1 df),
    not the plain paired t's (review item 8: +-1.85 for a test whose CI half-width is 0.15)."""
    b = np.array([0.05, 2.0, 0.19, -0.63, -0.38, -1.09, -1.28, 0.63])
    t = np.array([0.41, -1.29, -2.73, -0.16, -0.11, -0.63, -1.02, 0.86])
    rng = np.random.default_rng(0)
    for paired in (True, False):
        c = compare_runs(b, t, "iqm", n_boot=10, rng=rng, paired=paired)
        ci = (trimmed_paired_interval(t - b, trim=0.25, alpha=ALPHA) if paired
              else trimmed_t_interval(b, t, trim=0.25, alpha=ALPHA))
        assert c.df == pytest.approx(ci.df)
        q = scipy.stats.t.ppf(1 - ALPHA / 2, ci.df)
        _, db, hb = yuen_parts(b, 0.25)
        _, dt, ht = yuen_parts(t, 0.25)
        # the MDE at the measured spread taken as the truth (paired: its factor at the test's df; Welch: at
        # stats.power.welch_spread_df)
        plug_in = c.mde / spread_factor(ci.df if paired else welch_spread_df(math.sqrt(db * hb), hb, math.sqrt(dt * ht), ht))
        nc = plug_in / ci.se
        power = scipy.stats.nct.sf(q, ci.df, nc) + scipy.stats.nct.sf(q, ci.df, -nc)
        if paired:
            assert power == pytest.approx(0.8, abs=1e-6)
            assert expected_power(c.mde / ci.se, ci.df) == pytest.approx(0.8, abs=1e-6)
        else:  # Yuen-Welch: its SE and df are estimated, so the noncentral t at the interval's df overstates
            # its power (stats.power.welch_power); the MDE is Welch's own over the trimmed arms' SE and h
            assert welch_power(plug_in, math.sqrt(db * hb), hb, math.sqrt(dt * ht), ht) == pytest.approx(0.8, abs=1e-3)
            assert power > 0.8
    assert compare_runs(b, t, "iqm", n_boot=10, rng=rng, paired=True).mde < 0.3


def test_constant_differences_are_fine_unpaired():
    b, t = np.array([0.5, 0.7, 0.9]), np.array([0.6, 0.8, 1.0])
    assert degenerate_reason(b, t, paired=False) == ""
    assert compare_runs(b, t, rng=np.random.default_rng(0)).estimable


def test_compare_runs_iqm_with_no_spread_left_after_trimming():
    """The trimmed t has no spread left (every middle run equal) though the runs vary: no CI, but the
    exact IQM relabelling test still gives a p (it was 'not estimable')."""
    from pcpo_eval.stats.runlevel import permutation_test

    b, t = np.array([1.0, 1.0, 1.0, 1.0, 5.0]), np.array([2.0, 2.0, 2.0, 2.0, 0.0])
    c = compare_runs(b, t, "iqm", rng=np.random.default_rng(0))
    perm = permutation_test(b, t, rng=np.random.default_rng(0), stat="iqm")
    assert c.estimable and "after trimming" in c.reason and c.ci_low is None and c.mde is None
    assert perm.exact and c.p == pytest.approx(perm.p) and c.significant == (perm.p < 0.05)
    assert c.estimate == pytest.approx(1.0)


def test_compare_runs_user_errors():
    rng = np.random.default_rng(0)
    with pytest.raises(UserError, match="unknown stat 'median'"):
        compare_runs([1.0, 2.0], [1.0, 3.0], "median", rng=rng)  # type: ignore[arg-type]
    with pytest.raises(UserError, match="1-D array"):
        compare_runs([[1.0, 2.0]], [1.0, 3.0], rng=rng)
    with pytest.raises(UserError, match="alpha"):
        compare_runs([1.0, 2.0], [1.0, 3.0], rng=rng, alpha=5)
    with pytest.raises(UserError, match="paired runs need equal arms, got 2 and 3"):
        compare_runs([1.0, 2.0], [1.0, 3.0, 4.0], rng=rng, paired=True)
