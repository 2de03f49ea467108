"""Time to target and speed-up (pcpo_eval.stats.speedup): full-window smoothing, censoring, the
Kaplan-Meier restricted mean, Fieller's interval from the t test's own quantile, the CLI."""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from pcpo_eval.errors import UserError
from pcpo_eval.stats.speedup import (
    TimeToTarget,
    epochs_to_target,
    fieller_interval,
    full_window_average,
    km_restricted_mean,
    moving_average,
    speedup_pct,
    speedup_runs,
    speedup_table,
)

ALPHA = 0.05


def _log(rewards, start=1, control=None):
    d = {"epoch": np.arange(start, start + len(rewards)), "reward_mean": np.asarray(rewards, dtype=float)}
    if control is not None:
        d["control_reward_mean"] = np.asarray(control, dtype=float)
    return pd.DataFrame(d)


def _crossing(cross_epoch: int, n_epochs: int = 300, target: float = 6.9) -> np.ndarray:
    """A noise-free ramp whose window-5 trailing mean first reaches ``target`` at ``cross_epoch``."""
    e = np.arange(1, n_epochs + 1, dtype=float)
    # the trailing mean of a line lags by 2 epochs: mean(r[e-4..e]) = r(e-2)
    return target + 0.01 * (e + 2 - cross_epoch) + 1e-5


def _tt(epoch: int | None, last: int = 60, eligible: int = 5) -> TimeToTarget:
    return TimeToTarget(epoch, epoch is None, 1, last, eligible)


@pytest.fixture
def no_power(monkeypatch):
    """Skip the power figures (root searches over scipy's noncentral t) in many-draw loops; they do
    not enter the estimate, CI or p checked there."""
    import pcpo_eval.stats.power as power

    monkeypatch.setattr(power, "mde", lambda *a, **k: None)
    monkeypatch.setattr(power, "seeds_needed", lambda *a, **k: None)


# ---------------------------------------------------------------------------------------------
# smoothing and time to target
# ---------------------------------------------------------------------------------------------


def test_moving_average_and_full_window_average_match_pandas_rolling():
    x = np.random.default_rng(0).normal(size=40)
    np.testing.assert_allclose(moving_average(x, 5), pd.Series(x).rolling(5, min_periods=1).mean(), rtol=1e-12)
    np.testing.assert_allclose(moving_average(x, 1), x)
    full = full_window_average(x, 5)
    assert np.isnan(full[:4]).all()
    np.testing.assert_allclose(full[4:], pd.Series(x).rolling(5).mean().to_numpy()[4:], rtol=1e-12)
    assert np.isnan(full_window_average(x[:3], 5)).all()
    with pytest.raises(UserError, match="window must be a whole number of epochs >= 1"):
        moving_average(x, 0)


def test_paper_formula():
    assert speedup_pct(260, 131) == pytest.approx(98.47, abs=0.01)  # paper: 98.5%
    assert speedup_pct(147, 118) == pytest.approx(24.58, abs=0.01)  # paper: 24.6%
    assert speedup_pct(145, 155) == pytest.approx(-6.45, abs=0.01)


def test_full_window_rule_no_hit_before_the_window_th_epoch():
    """A curve above the target from epoch 1 reaches it at epoch ``window``, never earlier."""
    for window in (1, 3, 5, 8):
        r = epochs_to_target(np.full(20, 9.0), 1.0, window)
        assert (r.epoch, r.first_eligible, r.at_start, r.censored) == (window, window, True, False)
    shifted = epochs_to_target(np.full(20, 9.0), 1.0, 5, epochs=np.arange(10, 30))
    assert (shifted.epoch, shifted.first_epoch, shifted.first_eligible, shifted.last_epoch) == (14, 10, 14, 29)
    # a curve shorter than the window has no eligible epoch: censored, never "reached at epoch 1"
    short = epochs_to_target([9.0, 9.0, 9.0], 1.0, 5)
    assert short.epoch is None and short.censored and short.first_eligible is None and short.value == 3.0
    # a single high first epoch is not a 5-epoch average
    spike = epochs_to_target([10.0, 0.0, 0.0, 0.0, 0.0, 0.0], 1.5, 5)
    assert spike.epoch == 5 and epochs_to_target([10.0, 0, 0, 0, 0, 0], 2.5, 5).censored


def test_epochs_to_target_reached_censored_and_non_finite():
    y = np.arange(1.0, 9.0)  # trailing window-5 means from epoch 5: 3, 4, 5, 6
    assert epochs_to_target(y, 4.0, 5).epoch == 6
    assert epochs_to_target(y, 4.0, 1).epoch == 4
    never = epochs_to_target(y, 100.0, 5)
    assert never.epoch is None and never.censored and never.value == 8.0 and not never.at_start
    assert epochs_to_target([9, 8, 7, 6], 7.5, 1, higher_is_better=False).epoch == 3
    bad = epochs_to_target([0.1, np.nan, 0.9, 1, 1, 1], 0.5)
    assert not bad.finite and bad.epoch is None and not bad.censored and math.isnan(bad.value)
    with pytest.raises(UserError, match="strictly increasing"):
        epochs_to_target([1.0, 2.0], 1.0, 1, epochs=[2, 2])


def test_restricted_turns_a_late_hit_into_censoring_at_tau():
    r = _tt(40, last=80)
    assert r.restricted(60) == TimeToTarget(40, False, 1, 60, 5)
    late = _tt(70, last=80).restricted(60)
    assert late.epoch is None and late.censored and late.value == 60.0


# ---------------------------------------------------------------------------------------------
# Kaplan-Meier restricted mean
# ---------------------------------------------------------------------------------------------


def test_km_restricted_mean_is_mean_of_min_t_tau_with_censoring_only_at_tau():
    rng = np.random.default_rng(3)
    for _ in range(50):
        tau = int(rng.integers(20, 80))
        t = rng.integers(5, 120, size=int(rng.integers(1, 9))).astype(float)
        reached = t <= tau
        v = np.minimum(t, tau)
        assert km_restricted_mean(v, reached, tau) == pytest.approx(v.mean())


def test_km_restricted_mean_interior_censoring_by_hand():
    """Events at 2, 5, 6; one run censored at 3; tau 8.

    S = 1 on [0, 2), 3/4 on [2, 5) (4 at risk), 3/4 * 1/2 on [5, 6) (2 at risk), 0 from 6:
    area = 2 + 0.75 * 3 + 0.375 * 1 = 4.625 (the plain mean of the times, 4, would treat the
    censored run as reaching the target at 3)."""
    assert km_restricted_mean([2, 3, 5, 6], [True, False, True, True], 8) == pytest.approx(4.625)
    # an event at the censoring epoch counts first (events before censorings)
    assert km_restricted_mean([4, 4], [True, False], 10) == pytest.approx(4 + 0.5 * 6)
    with pytest.raises(UserError, match="one time and one flag"):
        km_restricted_mean([1.0, 2.0], [True], 5)


# ---------------------------------------------------------------------------------------------
# Fieller's interval and the t test behind it
# ---------------------------------------------------------------------------------------------


def _pivot(b: np.ndarray, t: np.ndarray, rho: float, paired: bool) -> float:
    """|mean_b - rho mean_t| / se(rho), written out from the definition."""
    if paired:
        se = np.std(b - rho * t, ddof=1) / math.sqrt(b.size)
    else:
        se = math.sqrt(b.var(ddof=1) / b.size + rho**2 * t.var(ddof=1) / t.size)
    return abs(b.mean() - rho * t.mean()) / se


@pytest.mark.parametrize("paired", [True, False])
def test_fieller_endpoints_solve_the_pivot_equation(paired):
    b, t = np.array([19.0, 22.0, 17.0, 25.0]), np.array([12.0, 11.0, 14.0, 13.0])
    q = scipy.stats.t.ppf(0.975, 3)
    lo, hi = fieller_interval(b, t, paired=paired, q=q)
    assert 0 < lo < b.mean() / t.mean() < hi < math.inf
    for r in (lo, hi):
        assert _pivot(b, t, r, paired) == pytest.approx(q, rel=1e-9)


def test_fieller_ray_when_the_treatment_mean_is_uncertain():
    """Paired, strongly correlated arms, treatment mean not clear of 0 (A < 0): the set is the ray
    [r2, inf). (Regression: the smaller root was returned, so the CI reached down to -100% and said
    'no evidence' while p = 0.012.)"""
    b, t = np.array([31.0, 48.0, 27.0]), np.array([16.0, 29.0, 14.0])
    s = speedup_runs([_tt(int(x)) for x in b], [_tt(int(x)) for x in t], paired=True)
    assert s.p == pytest.approx(scipy.stats.ttest_rel(b, t).pvalue) and s.p < ALPHA
    # unbounded above by the data; clipped at the design's limit tau / earliest - 1 = 60 / 5 - 1
    assert s.ci_high == pytest.approx(60 / 5 - 1) and s.ci_high_clipped
    assert s.ci_low is not None and 0 < s.ci_low < s.estimate and s.ci_gap_low is None
    assert _pivot(b, t, s.ci_low + 1, True) == pytest.approx(scipy.stats.t.ppf(0.975, 2), rel=1e-9)


def test_fieller_two_piece_set_is_reported_as_its_hull():
    """Both means uncertain and the set [0, r1] U [r2, inf): the CI is the conservative hull."""
    b, t = np.array([14.0, 12.0, 36.0]), np.array([23.0, 28.0, 56.0])
    lo, hi = fieller_interval(b, t, paired=True, q=scipy.stats.t.ppf(0.975, 2))
    assert (lo, hi) == (0.0, math.inf)


def _draw_times(rng: np.random.Generator, n: int, scale: float, tau: int) -> list[TimeToTarget]:
    """Epochs to a target of n runs: log-normal around ``scale`` (CV ~30%), censored at tau."""
    e = np.maximum(np.round(scale * np.exp(rng.normal(0, 0.3, n))), 5).astype(int)
    return [_tt(int(x) if x <= tau else None, last=tau) for x in e]


@pytest.mark.usefixtures("no_power")
@pytest.mark.filterwarnings("ignore:Precision loss occurred")
def test_ci_excludes_zero_exactly_when_p_below_alpha():
    """2 x 600 random studies (seed 7; 3-6 runs per arm, 0-100% more epochs in the baseline,
    CV ~30%, censoring at 60; paired arms share a seed effect): the Fieller CI excludes a speed-up
    of 0 iff p < alpha, and p is scipy's t test on min(T, tau). Measured: 419 significant, 0
    disagreements on one-piece Fieller sets; 2 paired studies had a two-piece set [0, r1] U [r2, inf)
    (both means uncertain), reported as its two pieces, whose hole holds 0: the CI excludes 0 there too.
    Since the t test is not trusted alone where an arm has no spread (every treatment run censored, say),
    7 unpaired studies take the exact relabelling test's p when larger (416 significant)."""
    rng = np.random.default_rng(7)
    n_sig = n_hull = n_robust = 0
    for _ in range(600):
        n = int(rng.integers(3, 7))
        ratio = 1 + rng.uniform(0, 1)
        seed_effect = np.exp(rng.normal(0, 0.3, n))
        b = _draw_times(rng, n, 30 * ratio, 60)
        t = _draw_times(rng, n, 30, 60)
        # paired arms: the same seed makes both arms slow or fast
        bp = [_tt(None if r.epoch is None or r.epoch * f > 60 else max(int(r.epoch * f), 5)) for r, f in
              zip(b, seed_effect, strict=True)]
        tp = [_tt(None if r.epoch is None or r.epoch * f > 60 else max(int(r.epoch * f), 5)) for r, f in
              zip(t, seed_effect, strict=True)]
        for paired, bb, tt in ((False, b, t), (True, bp, tp)):
            s = speedup_runs(bb, tt, paired=paired, alpha=ALPHA)
            if not s.estimable:
                continue
            vb, vt = np.array(s.baseline_epochs), np.array(s.treatment_epochs)
            ref = scipy.stats.ttest_rel(vb, vt) if paired else scipy.stats.ttest_ind(vb, vt, equal_var=False)
            if s.p_floor is not None:  # an arm without spread (every run censored, say): the t test is not
                # trusted alone, p is never below the exact relabelling test's (permutation.t_not_robust)
                assert not paired and "the same value" in s.reason and s.p >= max(ref.pvalue, s.p_floor) - 1e-12
                assert not s.significant or not any(lo <= 0 <= hi for lo, hi in [(s.ci_low, s.ci_high)])
                n_robust += 1
                continue
            assert s.p == pytest.approx(ref.pvalue, rel=1e-9, abs=1e-15)
            assert s.df == pytest.approx(ref.df, rel=1e-9)
            assert s.estimate == pytest.approx(vb.mean() / vt.mean() - 1, rel=1e-12)
            assert s.significant == (s.p < ALPHA)
            assert s.ci_high is not None and s.ci_high <= 60 / 5 - 1 + 1e-12  # clipped at the design's limit
            pieces = [(s.ci_low, s.ci_high)]
            if s.ci_gap_low is not None:
                # the two-piece set [0, r1] U [r2, ...] (both means uncertain): printed as both pieces
                assert paired and s.ci_gap_high is not None and s.ci_low <= s.ci_gap_low < s.ci_gap_high <= s.ci_high
                pieces = [(s.ci_low, s.ci_gap_low), (s.ci_gap_high, s.ci_high)]
                n_hull += 1
            excludes = not any(lo <= 0 <= hi for lo, hi in pieces)
            assert excludes == s.significant, (paired, vb, vt, s)
            n_sig += s.significant
    assert n_sig > 300 and n_robust > 0, (n_sig, n_robust)  # the check covers both outcomes
    assert n_hull <= 5


def test_speedup_runs_restricts_to_the_last_common_epoch():
    b = [_tt(50, last=80), _tt(70, last=80), _tt(None, last=60)]
    t = [_tt(20, last=80), _tt(30, last=60), _tt(25, last=70)]
    s = speedup_runs(b, t)
    assert s.tau == 60 and s.baseline_epochs == (50.0, 60.0, 60.0) and s.n_censored_baseline == 2
    assert s.baseline_mean == pytest.approx(170 / 3) and s.treatment_mean == pytest.approx(25.0)
    assert s.estimate == pytest.approx((170 / 3) / 25 - 1)
    assert s.mde is not None and s.mde > 0 and s.seeds_for_reference is not None
    assert s.to_dict()["n_baseline"] == 3 and not s.paired


@pytest.mark.usefixtures("no_power")
def test_frozen_treatment_is_never_faster():
    """A treatment that never reaches the target (censored at tau) against any baseline."""
    rng = np.random.default_rng(11)
    for _ in range(200):
        n = int(rng.integers(2, 6))
        b = _draw_times(rng, n, float(rng.uniform(10, 80)), 60)
        t = [_tt(None) for _ in range(n)]
        for paired in (False, True):
            s = speedup_runs(b, t, paired=paired)
            assert s.n_censored_treatment == n and s.treatment_mean == 60.0
            assert s.estimate is None or s.estimate <= 0
            assert not (s.significant and s.estimate > 0)
            if s.estimable:
                assert s.ci_low is not None and s.ci_low <= 0


@pytest.mark.parametrize(
    ("b", "t", "paired", "reason"),
    [
        ([], [_tt(10), _tt(12)], False, "no baseline runs"),
        ([_tt(20), TimeToTarget(None, False, 1, 60, 5, finite=False)], [_tt(10), _tt(12)], False,
         "1 of 4 runs have a missing (non-finite) reward or control before they reach the target"),
        ([TimeToTarget(None, True, 1, 3, None)] * 2, [TimeToTarget(None, True, 1, 3, None)] * 2, False,
         "the runs have 3 epochs, fewer than the smoothing window"),
        ([_tt(5), _tt(5)], [_tt(5), _tt(5)], False, "uninformative target"),
        ([_tt(20)], [_tt(10)], False, "1 run per arm"),
        ([_tt(20)], [_tt(10), _tt(12)], False, "1 baseline run: need >= 2 runs per arm"),
        ([_tt(None), _tt(None)], [_tt(None), _tt(None)], False, "no run of either arm reaches the target"),
        ([_tt(20), _tt(30)], [_tt(20), _tt(30)], True, "the per-seed differences in epochs are all 0"),
        ([_tt(20), _tt(20)], [_tt(20), _tt(20)], False, "no variation: every run of both arms"),
    ],
)  # fmt: skip
def test_speedup_not_estimable(b, t, paired, reason):
    s = speedup_runs(b, t, paired=paired)
    assert not s.estimable and s.reason.startswith(reason) and s.p is None and not s.significant
    assert s.ci_low is None and s.ci_high is None and s.mde is None
    assert s.uninformative == (reason == "uninformative target")


def test_speedup_runs_user_errors():
    with pytest.raises(UserError, match="paired speed-up needs as many"):
        speedup_runs([_tt(10), _tt(12)], [_tt(10)], paired=True)
    with pytest.raises(UserError, match="alpha"):
        speedup_runs([_tt(10), _tt(12)], [_tt(10), _tt(11)], alpha=1.5)


# ---------------------------------------------------------------------------------------------
# table and CLI
# ---------------------------------------------------------------------------------------------


def test_speedup_table_paper_example():
    tab = speedup_table([_log(_crossing(260))], [_log(_crossing(131))], [6.9])
    (row,) = tab.rows
    assert row.baseline_epochs == (260.0,) and row.treatment_epochs == (131.0,) and row.tau == 300
    assert row.estimate == pytest.approx(speedup_pct(260, 131) / 100)  # 98.5%
    assert not row.estimable and row.reason.startswith("1 run per arm")  # no CI from one run per arm
    md = tab.to_markdown()
    assert "| 6.9 | 260.0 | 131.0 | 1 run per arm" in md and "full window of 5 epochs" in md


def _gain_logs(crossings, seed_offsets):
    """Logs whose gain (reward - control) crosses 6.9 at the given epochs; the control carries a
    per-seed offset (same seed, same offset in both arms) and epoch noise the gain cancels."""
    rng = np.random.default_rng(0)
    out = []
    for c, off in zip(crossings, seed_offsets, strict=True):
        ctrl = 1.0 + off + rng.normal(0, 0.5, 300)
        out.append(_log(_crossing(c) + ctrl, control=ctrl))
    return out


def test_cli_speedup_json_paired_gain(tmp_path, cli):
    offs = [0.0, 3.0, -2.0]
    base, pcpo = _gain_logs([200, 240, 215], offs), _gain_logs([100, 130, 110], offs)
    args = []
    for i, (b, p) in enumerate(zip(base, pcpo, strict=True)):
        (tmp_path / f"b{i}").mkdir()
        b.to_parquet(tmp_path / f"b{i}" / "log.parquet")
        p.to_csv(tmp_path / f"p{i}.csv", index=False)
        args += ["--baseline", tmp_path / f"b{i}", "--pcpo", tmp_path / f"p{i}.csv"]
    r = cli("speedup", *args, "--target", "6.9", "--paired", "--curve", "gain", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["window"] == 5 and d["curve"] == "gain" and len(d["baseline_runs"]) == 3
    (row,) = d["targets"]
    assert row["paired"] and row["baseline_epochs"] == [200, 240, 215] and row["treatment_epochs"] == [100, 130, 110]
    assert row["estimate"] == pytest.approx(655 / 340 - 1)
    assert row["p"] == pytest.approx(scipy.stats.ttest_rel([200, 240, 215], [100, 130, 110]).pvalue)
    assert row["significant"] and row["ci_low"] > 0 and row["df"] == 2
    # the raw reward carries the control's seed offsets: no longer the same epochs
    r = cli("speedup", *args, "--target", "6.9", "--json")
    assert r.returncode == 0 and json.loads(r.stdout)["targets"][0]["baseline_epochs"] != [200, 240, 215]
    r = cli("speedup", *args, "--target", "6.9", "--paired", "--curve", "gain")
    assert r.returncode == 0 and "paired (each pair one training seed)" in r.stdout and "curve: gain" in r.stdout


def test_a_tables_targets_are_one_holm_family():
    """Several targets: Holm over the targets with a p, and each row's MDE and seeds for +25% at the
    family's level alpha / m (the command prints comparisons: one family per table)."""
    from pcpo_eval.stats.adjust import holm
    from pcpo_eval.stats.speedup import at_level

    rng = np.random.default_rng(3)
    zero = np.zeros(300)  # an untrained control that reaches no target: the raw rows keep their test
    base = [_log(_crossing(c) + rng.normal(0, 0.02, 300), control=zero) for c in (200, 240, 215, 230)]
    pcpo = [_log(_crossing(c) + rng.normal(0, 0.02, 300), control=zero) for c in (190, 250, 200, 220)]
    targets = [6.9, 7.2, 7.5]
    tab = speedup_table(base, pcpo, targets, paired=True)
    alone = [speedup_table(base, pcpo, [t], paired=True).rows[0] for t in targets]
    assert tab.family_size == 3 and len(tab.p_holm) == 3
    np.testing.assert_allclose(tab.p_holm, holm([r.p for r in alone]))
    for r, a in zip(tab.rows, alone, strict=True):
        assert (r.estimate, r.ci_low, r.ci_high, r.p) == (a.estimate, a.ci_low, a.ci_high, a.p)
        assert (r.mde, r.seeds_for_reference) == (at_level(a, 0.05 / 3).mde, at_level(a, 0.05 / 3).seeds_for_reference)
    assert any(r.mde is not None and a.mde is not None and r.mde > a.mde for r, a in zip(tab.rows, alone, strict=True))
    d = tab.to_dict()
    assert d["family_size"] == 3 and [t["p_holm"] for t in d["targets"]] == list(tab.p_holm)
    md = tab.to_markdown()
    assert "| p | Holm p | detectable at 80% power |" in md and "adjusted over the 3 targets" in md


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"epoch": [1, 2], "reward": [1.0, 2.0]}), "lacks column 'reward_mean'"),
        (pd.DataFrame({"step": [1, 2], "reward_mean": [1.0, 2.0]}), "lacks column 'epoch'"),
        (pd.DataFrame({"epoch": [1, 2], "reward_mean": [1.0, np.nan]}),
         "'reward_mean' has 1 missing/NaN values (epoch 2); a diverged or crashed epoch? drop those rows"),
        (pd.DataFrame({"epoch": [1, 1], "reward_mean": [1.0, 2.0]}), "epoch 1 more than once"),
    ],
)
def test_cli_bad_logs(tmp_path, cli, frame, message):
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    good = tmp_path / "good.csv"
    _log([1.0, 2.0]).to_csv(good, index=False)
    r = cli("speedup", "--baseline", bad, "--pcpo", good, "--target", "1")
    assert r.returncode == 2
    assert message in r.stderr and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1


def test_cli_bad_options_are_one_line_errors(tmp_path, cli):
    a, b, c = tmp_path / "a.csv", tmp_path / "b.csv", tmp_path / "c.csv"
    _log(_crossing(100)).to_csv(a, index=False)
    _log(_crossing(90)).to_csv(b, index=False)
    _log(_crossing(95)).to_csv(c, index=False)
    cases = [
        (["--curve", "foo"], "--curve must be reward or gain, got 'foo'"),
        (["--paired", "--baseline", c], "--paired needs as many baseline as PCPO logs (got 2 and 1)"),
        (["--curve", "gain"], "has no finite control_reward_mean; the gain curve needs runs trained"),
    ]
    for extra, message in cases:
        r = cli("speedup", "--baseline", a, "--pcpo", b, "--target", "6.9", *extra)
        assert r.returncode == 2, (extra, r.stdout)
        assert r.stderr.startswith("error: ") and message in r.stderr and r.stderr.count("\n") == 1, r.stderr


def test_cli_paired_runs_of_other_seeds_are_refused(tmp_path, cli):
    """--paired pairs by position: run folders whose config.yaml record other seeds are two seeds' noise."""
    runs = {}
    for arm, crossing, seeds in (("b", 200, (0, 1)), ("p", 100, (1, 0))):
        for s in seeds:
            rd = tmp_path / f"{arm}{s}"
            rd.mkdir()
            _log(_crossing(crossing + 10 * s)).to_parquet(rd / "log.parquet")
            (rd / "config.yaml").write_text(f"seed: {s}\n")
            runs.setdefault(arm, []).append(rd)
    args = [x for b, p in zip(runs["b"], runs["p"], strict=True) for x in ("--baseline", b, "--pcpo", p)]
    r = cli("speedup", *args, "--target", "6.9", "--paired")
    assert r.returncode == 2 and r.stderr.count("\n") == 1
    assert f"--paired pair 1: --baseline {runs['b'][0]} has seed 0, --pcpo {runs['p'][0]} seed 1" in r.stderr
    r = cli("speedup", *args, "--target", "6.9")  # unpaired: the order does not matter
    assert r.returncode == 0, r.stderr


def test_cli_missing_log_and_empty_run(tmp_path, cli):
    r = cli("speedup", "--baseline", tmp_path / "nope.parquet", "--pcpo", tmp_path / "x.csv", "--target", "1")
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "run").mkdir()
    r = cli("speedup", "--baseline", tmp_path / "run", "--pcpo", tmp_path / "run", "--target", "1")
    assert r.returncode == 2 and "no log.parquet" in r.stderr


# ---------------------------------------------------------------------------------------------
# feasibility, two-piece Fieller sets, no spread (review items 5, 9, 11)
# ---------------------------------------------------------------------------------------------


def _hit_curve(hit: int, n_epochs: int = 20, window: int = 5) -> np.ndarray:
    """Gain 0 until epoch ``hit - window``, then 1: the full-window mean first reaches 1 at ``hit``."""
    y = np.zeros(n_epochs)
    y[hit - window :] = 1.0
    return y


def test_mde_and_reference_effect_respect_the_first_full_window_epoch():
    """Baseline restricted mean 6.0 epochs, window 5: no run reaches before epoch 5, so at most a
    6 / 5 - 1 = +20% speed-up is possible. The paired t's MDE in epochs would mean +39%, and a 25%
    speed-up (4.8 epochs) is impossible: no MDE, no seed count (was +39% and 8 seeds)."""
    b = [epochs_to_target(_hit_curve(h), 1.0, 5) for h in (5, 6, 7, 6, 6)]
    t = [epochs_to_target(_hit_curve(h), 1.0, 5) for h in (5, 7, 6, 5, 7)]
    s = speedup_runs(b, t, target=1.0, paired=True)
    assert s.estimable and s.baseline_mean == 6.0 and s.earliest == 5.0
    assert s.max_speedup == pytest.approx(0.2)
    assert s.mde is None and s.seeds_for_reference is None and not s.reference_feasible
    # the same spread against a slower baseline: both feasible, and the MDE below the maximum
    slow = [epochs_to_target(_hit_curve(h, 40), 1.0, 5) for h in (25, 26, 27, 26, 26)]
    tt = [epochs_to_target(_hit_curve(h, 40), 1.0, 5) for h in (25, 27, 26, 25, 27)]
    f = speedup_runs(slow, tt, target=1.0, paired=True)
    assert f.reference_feasible and f.seeds_for_reference is not None
    assert f.mde is not None and 0 < f.mde <= f.max_speedup


def test_ci_is_clipped_at_the_designs_largest_speedup():
    """rho = mu_b / mu_t <= tau / earliest (mu_b <= tau, mu_t >= the first full-window epoch): the
    upper end is clipped there, a parameter-space bound that keeps the CI's coverage."""
    b, t = np.array([31.0, 48.0, 27.0]), np.array([16.0, 29.0, 14.0])  # Fieller: a ray [r2, inf)
    s = speedup_runs([_tt(int(x), eligible=10) for x in b], [_tt(int(x), eligible=10) for x in t], paired=True)
    assert s.earliest == 10.0 and s.ci_high == pytest.approx(60 / 10 - 1) and s.ci_high_clipped


def test_ci_is_clipped_at_the_designs_largest_slowdown():
    """rho >= earliest_b / tau (the baseline's mean cannot fall below its runs' first full-window
    epochs, the treatment's cannot pass tau): a treatment slower than an uncertain baseline has its
    Fieller ray cut there instead of reaching -100%; a piece wholly outside is dropped."""
    from pcpo_eval.stats.speedup import clip_pieces

    b, t = np.array([16.0, 29.0, 14.0]), np.array([31.0, 48.0, 27.0])  # the ray test's arms swapped
    s = speedup_runs([_tt(int(x), eligible=10) for x in b], [_tt(int(x), eligible=10) for x in t], paired=True)
    assert s.estimate < 0 and s.significant and s.ci_low_clipped
    assert s.ci_low == pytest.approx(10 / 60 - 1) and s.ci_low < s.estimate < s.ci_high < 0
    assert clip_pieces(((0.0, 0.5), (2.0, math.inf)), 6.0, 0.6) == ((2.0, 6.0),)
    assert clip_pieces(((0.0, 0.5), (2.0, math.inf)), 1.5, 0.1) == ((0.1, 0.5),)


def test_two_piece_fieller_set_is_reported_as_its_pieces():
    """Times 10/19/47 vs 5/13/40 paired: p = 0.009 and Fieller's set is [0, r1] U [r2, inf) with
    r1 < 1 < r2. The CI was printed as the hull '-100% to unbounded' next to 'sooner'; now both pieces,
    whose hole holds 0, so significance and 'the CI excludes 0' agree."""
    from pcpo_eval.stats.speedup import ci_text

    b = [epochs_to_target(_hit_curve(h, 60), 1.0, 5) for h in (10, 19, 47)]
    t = [epochs_to_target(_hit_curve(h, 60), 1.0, 5) for h in (5, 13, 40)]
    s = speedup_runs(b, t, target=1.0, paired=True)
    assert s.significant and s.p == pytest.approx(scipy.stats.ttest_rel([10, 19, 47], [5, 13, 40]).pvalue)
    # Fieller's lower piece starts at rho = 0 (-100%); the design bounds it at earliest_b / tau = 5 / 60
    assert s.ci_low == pytest.approx(5 / 60 - 1) and s.ci_low_clipped
    assert s.ci_gap_low is not None and s.ci_gap_high is not None
    assert s.ci_gap_low < 0 < s.ci_gap_high < s.estimate <= s.ci_high == pytest.approx(60 / 5 - 1)
    q = scipy.stats.t.ppf(1 - ALPHA / 2, 2)
    vb, vt = np.array([10.0, 19, 47]), np.array([5.0, 13, 40])
    for r in (s.ci_gap_low + 1, s.ci_gap_high + 1):
        assert _pivot(vb, vt, r, True) == pytest.approx(q, rel=1e-9)
    assert ci_text(s) == "95% CI -92% to -14% or +13% to +1100%"


def test_constant_difference_p_is_the_exact_permutation_p():
    from pcpo_eval.stats.runlevel import permutation_test, sign_flip_test
    from pcpo_eval.stats.speedup import constant_difference_p

    rng = np.random.default_rng(0)
    for n in (2, 3, 6):
        d = np.full(n, 3.0)
        assert constant_difference_p(n, n, True) == pytest.approx(sign_flip_test(d, rng=rng).p)
    for nb, nt in ((2, 3), (3, 3), (4, 2), (6, 6)):
        b, t = np.full(nb, 20.0), np.full(nt, 8.0)
        assert constant_difference_p(nb, nt, False) == pytest.approx(permutation_test(b, t, rng=rng).p)


@pytest.mark.parametrize(("paired", "p"), [(True, 2 / 2**6), (False, 2 / math.comb(12, 6))])
def test_clearest_speedup_gets_the_exact_permutation_p(paired, p):
    """Every treatment run at epoch 5 (the first eligible), no baseline run by epoch 24: the t test has
    no spread; the row is estimable with the exact permutation p and no CI (was "not estimable")."""
    b = [_tt(None, last=24) for _ in range(6)]
    t = [_tt(5, last=24) for _ in range(6)]
    s = speedup_runs(b, t, target=0.05, paired=paired)
    assert s.estimable and s.significant and s.p == pytest.approx(p) and s.estimate == pytest.approx(24 / 5 - 1)
    assert s.ci_low is None and s.ci_high is None and s.mde is None and s.seeds_for_reference is None
    assert s.p_method.startswith("exact") and s.reason.startswith("CI not estimable")
    three = speedup_runs(b[:3], t[:3], paired=True)
    assert three.estimable and three.p == pytest.approx(0.25) and not three.significant


def test_a_missing_value_decides_only_the_windows_that_hold_it():
    """A NaN after the first hit leaves the hit; before it (or in a curve that never hits) the time is unknown."""
    y = np.array([0.0, 0.1, 0.2, 0.3, 0.4, 0.5, 0.6, 0.7, 0.8, 0.9, 1.0, 1.1])
    clean = epochs_to_target(y, 0.4, 3)
    assert clean.epoch == 7 and clean.finite
    late = y.copy()
    late[10] = np.nan
    assert epochs_to_target(late, 0.4, 3) == clean
    early = y.copy()
    early[1] = np.nan
    assert not epochs_to_target(early, 0.4, 3).finite and epochs_to_target(early, 0.4, 3).epoch is None
    never = y.copy()
    never[11] = np.nan
    out = epochs_to_target(never, 5.0, 3)
    assert not out.finite and not out.censored
    assert epochs_to_target(y, 5.0, 3).censored  # every window decided, none reaches it


def _frozen_sampler_logs(n_seeds: int = 6, epochs: int = 30):
    """Baseline runs that learn (gain 0.005 per epoch) from an untrained control at 0.75; 'PCPO' runs that
    learn nothing (reward == control every epoch) with a sampler whose untrained control scores 0.80."""
    rng = np.random.default_rng(5)
    e = np.arange(1, epochs + 1)
    base, frozen = [], []
    for _ in range(n_seeds):
        cb = 0.75 + rng.normal(0, 0.004, epochs)
        base.append(_log(cb + 0.005 * e + rng.normal(0, 0.004, epochs), control=cb))
        cf = 0.80 + rng.normal(0, 0.004, epochs)
        frozen.append(_log(cf, control=cf))
    return base, frozen


def test_a_frozen_policy_with_a_better_sampler_is_never_fast_on_a_raw_target(tmp_path, cli):
    """``pcpo-eval speedup`` on the raw reward: a target some run's untrained control reaches is the sampler's
    (the study verdict's rule, stats.verdict.target_status). Before, the table called the frozen arm
    +73% faster to 0.78 (5 vs 8.7 epochs, paired t p = 1.2e-05, Holm p 1.2e-05); now that target is
    uninformative (no speed-up, outside the Holm family) and 0.86, which no control reaches, is compared
    as before."""
    base, frozen = _frozen_sampler_logs()
    tab = speedup_table(base, frozen, [0.78, 0.86], paired=True)
    raw, high = tab.rows
    assert raw.uninformative and not raw.estimable and not raw.significant
    assert raw.estimate is None and raw.p is None and raw.mde is None and raw.ci_low is None
    assert raw.reason.startswith("uninformative: the untrained control reaches 0.78 in 6 of 12 runs, so the sampler")
    assert raw.treatment_epochs == (5.0,) * 6  # the frozen arm's epochs stay for reading
    assert high.estimable and high.treatment_epochs == (30.0,) * 6 and high.estimate < 0  # never reached: slower
    assert tab.family_size == 1 and tab.p_holm[0] is None and tab.p_holm[1] == high.p
    assert tab.notes == () and "Note:" not in tab.to_markdown()
    assert "| 0.78 | " in tab.to_markdown() and "uninformative: the untrained control reaches 0.78" in tab.to_markdown()
    # the same logs through the CLI
    args = []
    for i, (b, f) in enumerate(zip(base, frozen, strict=True)):
        b.to_csv(tmp_path / f"b{i}.csv", index=False)
        f.to_csv(tmp_path / f"f{i}.csv", index=False)
        args += ["--baseline", tmp_path / f"b{i}.csv", "--pcpo", tmp_path / f"f{i}.csv"]
    r = cli("speedup", *args, "--target", "0.78", "--paired", "--json")
    assert r.returncode == 0, r.stderr
    (row,) = json.loads(r.stdout)["targets"]
    assert row["uninformative"] and row["estimate"] is None and row["p_holm"] is None and not row["significant_holm"]
    # without the control column nothing tells the sampler from learning: no verdict (before: the frozen arm
    # was "faster", p and Holm p printed, with a note beside it; 11 of 100 such studies significant)
    for drop in (range(6), range(3, 6)):  # no log has it; the frozen arm's logs lack it
        tab = speedup_table(base, [f.drop(columns="control_reward_mean") if i in drop else f
                                   for i, f in enumerate(frozen)], [0.78], paired=True)
        (row,) = tab.rows
        assert row.estimate > 0 and row.p is None and not row.significant and tab.p_holm == (None,), row
        assert row.reason.startswith(f"no test: {len(drop)} of 12 logs have no paired untrained control")
        assert tab.notes == (row.reason,) and f"Note: {row.reason}." in tab.to_markdown()
        assert not tab.to_dict()["targets"][0]["significant_holm"]
    half = [f.assign(control_reward_mean=f["control_reward_mean"].where(f["epoch"] % 2 == 0)) for f in frozen]
    assert "no test: 6 of 12 logs" in speedup_table(base, half, [0.78], paired=True).rows[0].reason


def test_a_gain_target_a_frozen_policy_reaches_is_refused(tmp_path, cli):
    """--curve gain --target 0: a policy that learns nothing has gain 0 every epoch and 'reaches' 0 at its
    first full-window epoch. Before, such a frozen arm was +153% faster (5 vs 12.7 epochs, paired t
    p = 3.0e-07) than runs whose gain dips to -0.01 for 9 epochs and then learns; now one error line."""
    rng = np.random.default_rng(5)
    e = np.arange(1, 31)
    base, frozen = [], []
    for _ in range(6):
        cb = 0.75 + rng.normal(0, 0.004, 30)
        base.append(_log(cb + np.where(e < 10, -0.01, 0.005 * (e - 10)) + rng.normal(0, 0.004, 30), control=cb))
        cf = 0.8 + rng.normal(0, 0.004, 30)
        frozen.append(_log(cf, control=cf))
    for t in (0.0, -0.01):
        with pytest.raises(UserError, match=f"--target {t:g} with --curve gain: a gain target must be > 0"):
            speedup_table(base, frozen, [t], paired=True, curve="gain")
    with pytest.raises(UserError, match="must be < 0 with --lower-is-better"):
        speedup_table(base, frozen, [0.01], 5, False, paired=True, curve="gain")
    assert speedup_table(base, frozen, [0.02], paired=True, curve="gain").rows[0].estimate < 0  # learning: slower
    base[0].to_csv(tmp_path / "b.csv", index=False)
    frozen[0].to_csv(tmp_path / "f.csv", index=False)
    r = cli("speedup", "--baseline", tmp_path / "b.csv", "--pcpo", tmp_path / "f.csv", "--target", "0", "--curve", "gain")
    assert r.returncode == 2 and r.stderr.startswith("error: --target 0 with --curve gain") and r.stderr.count("\n") == 1


def test_a_window_counts_epochs_not_log_rows():
    """A log that lacks epochs 3-8 (merged by hand after a crash): its rows 1, 2, 9, 10, 11 are no 5-epoch
    window. Before, epochs_to_target averaged them (0.81 >= 0.8) and called the target reached at epoch 11,
    while `pcpo-eval select` (select.trailing_by_epoch) and a study (its runs table holds NaN there) found
    no full window; now the time is unknown (no window before the first decided one reaches it), and a
    gap after the hit changes nothing."""
    from pcpo_eval.stats.select import trailing_by_epoch

    e = np.arange(1, 25)
    r = np.full(24, 0.75)
    r[:2] = 0.9
    keep = ~np.isin(e, range(3, 9))
    tt = epochs_to_target(r[keep], 0.8, 5, epochs=e[keep])
    assert tt.epoch is None and not tt.finite and tt.first_eligible == 5
    assert math.isnan(tt.value)
    means, full = trailing_by_epoch(e[keep], r[keep], 5)
    assert not any(full[int(x)] and means[int(x)] >= 0.8 for x in e[keep])  # select's rule agrees
    # the study's table: the same curve on every epoch with NaN in the gap gives the same answer
    assert epochs_to_target(np.where(keep, r, np.nan), 0.8, 5) == tt
    # a gap after the hit does not matter; a log without gaps is unchanged
    ramp = np.linspace(0.7, 0.9, 24)
    late = ~np.isin(e, range(20, 23))
    assert epochs_to_target(ramp[late], 0.8, 5, epochs=e[late]) == epochs_to_target(ramp, 0.8, 5) != tt
    assert epochs_to_target(ramp, 0.8, 5).epoch == 15
    # through the table: the gapped run makes the row not estimable, with the reason
    frames = [_log(ramp + 0.01 * i) for i in range(3)]
    gapped = _log(r).loc[keep]
    row = speedup_table([*frames[:2], gapped], frames, [0.8], paired=True).rows[0]
    assert not row.estimable and row.reason.startswith("1 of 6 runs have a missing (non-finite) reward or control")


def test_a_crashed_log_that_cuts_the_table_is_named():
    """One PCPO log ends at epoch 25 of 60 (a crash): every log is cut there, and both targets read "3/3 not
    reached" in both arms. Before, the table gave no reason (it was a +32% speed-up, Holm p 0.0066, on the
    full logs); now a note names the short log and the epoch."""
    rng = np.random.default_rng(0)
    e = np.arange(1, 61)
    ctrl = np.full(60, 0.1)  # an untrained control that reaches no target: the raw rows keep their test
    base = [_log(0.5 + 0.01 * (e - c) + rng.normal(0, 0.003, 60), control=ctrl) for c in (40, 42, 44)]
    pcpo = [_log(0.5 + 0.01 * (e - c) + rng.normal(0, 0.003, 60), control=ctrl) for c in (30, 31, 33)]
    full = speedup_table(base, pcpo, [0.5, 0.55])
    assert all(r.significant for r in full.rows) and not any("compared over" in n for n in full.notes)
    cut = speedup_table(base, [*pcpo[:2], pcpo[2].iloc[:25]], [0.5, 0.55])
    assert all(r.tau == 25 and not r.estimable for r in cut.rows)
    assert cut.notes[0] == ("compared over epochs up to 25 only: PCPO log 3 ends at epoch 25 of the longest log's 60, "
                            "and every log is cut there (a hit after epoch 25 counts as not reached); leave a crashed "
                            "run out, or train it to the end")
    assert f"Note: {cut.notes[0]}." in cut.to_markdown() and cut.to_dict()["notes"][0] == cut.notes[0]


def test_a_speedup_whose_p_the_relabelling_test_bounds_prints_that_tests_mde():
    """3 vs 8 unpaired runs: the row's p is the larger of Welch's and the exact relabelling test's
    (``t_not_robust``: unequal arms), so what it could detect is the bounded test's MDE, as for a verdict
    row's difference (a review: the speed-up printed Welch's alone, a smaller speed-up than the row's test
    finds with 80% power)."""
    from pcpo_eval.stats import power
    from pcpo_eval.stats.speedup import _as_speedup

    b = [_tt(e) for e in (40, 46, 43)]
    t = [_tt(e) for e in (20, 22, 25, 28, 30, 33, 35, 38)]
    s = speedup_runs(b, t)
    assert "3 vs 8 runs" in s.reason and s.mde is not None
    vb, vt = np.asarray(s.baseline_epochs), np.asarray(s.treatment_epochs)
    sd_b, sd_t = float(vb.std(ddof=1)), float(vt.std(ddof=1))
    bounded = power.bounded_welch_mde(sd_b, 3, sd_t, 8, measured=True)
    welch = power.mde(sd_b, 3, sd_t=sd_t, n_t=8, paired=False, measured=True)
    assert bounded is not None and bounded > welch
    assert s.mde == pytest.approx(_as_speedup(s.baseline_mean, bounded, s.earliest))
    even = speedup_runs([_tt(e) for e in (40, 46, 43)], [_tt(e) for e in (20, 25, 30)])  # 3 vs 3: Welch's
    vb, vt = np.asarray(even.baseline_epochs), np.asarray(even.treatment_epochs)
    assert not even.reason and even.mde == pytest.approx(_as_speedup(
        even.baseline_mean, power.mde(float(vb.std(ddof=1)), 3, sd_t=float(vt.std(ddof=1)), n_t=3, paired=False,
                                      measured=True), even.earliest))
