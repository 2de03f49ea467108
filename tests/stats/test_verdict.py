"""Verdict rows (pcpo_eval.stats.verdict): keys, pairing by seed, targets, families with Holm, and
the calibration of whole simulated studies (A/A false positives, power, a frozen arm).

The simulated learning-curve process (:func:`simulate_study`) shares per-seed noise between arms, as
a real study does: seed ``s`` draws the same prompts and initial noises in every arm, so the
untrained control curve of seed ``s`` is the same in both arms (a seed level plus an epoch effect),
and the seed also sets how much can be learned (a shared multiplicative plateau factor). On top,
each run has its own learning rate, plateau noise and evaluation noise.
"""

from __future__ import annotations

import gc
import json
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest
import scipy.stats

from pcpo_eval.errors import UserError
from pcpo_eval.stats.adjust import holm
from pcpo_eval.stats.fmt import pct
from pcpo_eval.stats.runlevel import EQUAL_IN_EVERY_SEED, ONE_RUN_PER_ARM
from pcpo_eval.stats.verdict import (
    VERDICT_KEYS,
    Verdict,
    adjust_families,
    default_primary,
    headline,
    pair_runs,
    run_curves,
    target_status,
    unpaired_seeds,
    verdict_rows,
)

ALPHA = 0.05
N_EPOCHS = 40
GAIN_TARGET = 0.03  # the baseline's gain plateau is ~0.06
REWARD_TARGET = 0.36  # the control sits at 0.3 +- 0.02 (seed) +- 0.02 (epoch)
N_STUDIES = 400


def simulate_study(rng: np.random.Generator, seeds: dict[str, list[int]], gains: dict[str, float | None], *,
                   cells: tuple[str, ...] = ("hps",), n_epochs: int = N_EPOCHS) -> pd.DataFrame:  # fmt: skip
    """Tidy runs table. ``gains``: arm -> multiplier of the baseline's learnable gain (None = frozen:
    the arm's reward IS the untrained control, exactly)."""
    e = np.arange(1, n_epochs + 1)
    parts = []
    for cell in cells:
        shared = {}
        for s in sorted({x for ss in seeds.values() for x in ss}):
            control = 0.3 + rng.normal(0, 0.02) + rng.normal(0, 0.02, n_epochs)
            shared[s] = (control, rng.normal(0, 0.25))  # the seed's control curve, its learnability
        for arm, g in gains.items():
            for s in seeds[arm]:
                control, u = shared[s]
                if g is None:
                    reward = control.copy()
                else:
                    k = 0.08 * np.exp(rng.normal(0, 0.2))
                    plateau = 0.06 * g * (1 + u) + rng.normal(0, 0.035)
                    reward = control + plateau * (1 - np.exp(-k * e)) + rng.normal(0, 0.01, n_epochs)
                parts.append(pd.DataFrame({"arm": arm, "cell": cell, "seed": s, "epoch": e, "reward_mean": reward,
                                           "control_reward_mean": control}))  # fmt: skip
    return pd.concat(parts, ignore_index=True)


def _study(n=3, *, gain_t=1.0, seeds_t=None, seed=0, cells=("hps",)):
    rng = np.random.default_rng(seed)
    return simulate_study(rng, {"DDPO": list(range(n)), "PCPO": list(range(n)) if seeds_t is None else seeds_t},
                          {"DDPO": 1.0, "PCPO": gain_t}, cells=cells)  # fmt: skip


def _rates(seed: int, n_seeds: int, n_studies: int, gains: dict[str, float | None]) -> dict[str, float]:
    """Share of studies with a significant row: per quantity, for the primary row, for any row."""
    rng = np.random.default_rng(seed)
    hits: dict[str, list[bool]] = {}
    for _ in range(n_studies):
        tab = simulate_study(rng, {a: list(range(n_seeds)) for a in gains}, gains)
        rows = verdict_rows(tab, "DDPO", rng=rng, targets=(REWARD_TARGET,), gain_targets=(GAIN_TARGET,), n_boot=10)
        assert all(r.paired for r in rows)
        for r in rows:
            hits.setdefault(r.quantity, []).append(r.significant)
        hits.setdefault("primary", []).append(any(r.significant for r in rows if r.family == "primary"))
        hits.setdefault("any", []).append(any(r.significant for r in rows))
    return {k: float(np.mean(v)) for k, v in hits.items()}


# ---------------------------------------------------------------------------------------------
# rows, keys, pairing
# ---------------------------------------------------------------------------------------------


def test_rows_have_exactly_the_keys_and_are_json():
    rows = verdict_rows(_study(3, gain_t=2.0), "DDPO", rng=np.random.default_rng(0), targets=(REWARD_TARGET,),
                        gain_targets=(GAIN_TARGET,), n_boot=50)  # fmt: skip
    assert [r.quantity for r in rows] == ["paired_gain", "final_reward", "auc", "sampler_offset", "speedup_gain:0.03",
                                          "speedup_reward:0.36"]  # fmt: skip
    for r in rows:
        d = r.to_dict()
        assert tuple(d) == VERDICT_KEYS
        assert (d["cell"], d["baseline"], d["treatment"]) == ("hps", "DDPO", "PCPO")
        assert (d["n_baseline_runs"], d["n_treatment_runs"]) == (3, 3) and d["paired"]
        assert d["family"] == ("primary" if d["quantity"] == "paired_gain" else "secondary")
        json.dumps(d, allow_nan=False)  # machine-readable: no NaN/inf leaks into the JSON
        if r.quantity == "sampler_offset":  # the simulator's arms share one untrained control per seed
            assert not r.estimable and r.sentence == ("no difference in untrained-control reward between PCPO and "
                                                      "DDPO: equal in every seed (3 seeds per arm, paired by seed), "
                                                      "so there is nothing to test")
            continue
        assert r.sentence and "3 seeds per arm, paired by seed" in r.sentence


def _gains_by_seed(tab: pd.DataFrame, arm: str) -> np.ndarray:
    g = tab[tab.arm == arm].assign(gain=lambda d: d.reward_mean - d.control_reward_mean)
    return g[g.epoch > N_EPOCHS - 5].groupby("seed")["gain"].mean().sort_index().to_numpy()


def test_pairing_by_seed_when_the_seeds_match():
    tab = _study(5, gain_t=1.5, seed=1)
    (row,) = verdict_rows(tab, "DDPO", rng=np.random.default_rng(0), quantities=["paired_gain"], n_boot=50)
    b, t = _gains_by_seed(tab, "DDPO"), _gains_by_seed(tab, "PCPO")
    ref = scipy.stats.ttest_rel(t, b)
    ci = ref.confidence_interval(0.95)
    assert row.paired and row.p == pytest.approx(ref.pvalue) and row.details["df"] == 4
    assert (row.ci_low, row.ci_high) == (pytest.approx(ci.low), pytest.approx(ci.high))
    assert row.p_adjusted == pytest.approx(row.p)  # alone in its family


def test_unpaired_welch_when_the_seeds_differ():
    tab = _study(3, seeds_t=[10, 11, 12], seed=2)
    (row,) = verdict_rows(tab, "DDPO", rng=np.random.default_rng(0), quantities=["paired_gain"], n_boot=50)
    b, t = _gains_by_seed(tab, "DDPO"), _gains_by_seed(tab, "PCPO")
    ref = scipy.stats.ttest_ind(t, b, equal_var=False)
    assert not row.paired and row.p == pytest.approx(ref.pvalue) and row.details["ci_method"] == "Welch t"
    assert "3 vs 3 runs, unpaired" in row.sentence


def test_pair_runs_pairs_the_shared_seeds():
    """Shared seeds pair (the others are left out) when they are >= 2 and >= half of each arm; else Welch."""
    runs = run_curves(_study(3, seeds_t=[0, 1, 5]))
    b = [r for r in runs if r.arm == "DDPO"]
    t = [r for r in runs if r.arm == "PCPO"]
    bb, tt, ok = pair_runs(b, t)
    assert ok and [r.seed for r in bb] == [r.seed for r in tt] == ["0", "1"]
    assert unpaired_seeds(b, t) == (["2"], ["5"])
    few = run_curves(_study(3, seeds_t=[0, 5, 6]))  # 1 shared seed: nothing to pair
    bb, tt, ok = pair_runs([r for r in few if r.arm == "DDPO"], [r for r in few if r.arm == "PCPO"])
    assert not ok and len(bb) == len(tt) == 3 and unpaired_seeds(bb, tt) == ([], [])
    assert pair_runs(b, list(reversed(b)))[2]  # order does not matter: sorted by seed
    bb, tt, ok = pair_runs(b[:1], b[:1])
    assert not ok and len(bb) == len(tt) == 1  # one seed: no pairs to test


# ---------------------------------------------------------------------------------------------
# families and Holm
# ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_loop")
def test_families_and_holm_within_each_family():
    tab = _study(5, gain_t=2.0, seed=3, cells=("hps", "pick"))
    kw = dict(rng=np.random.default_rng(0), targets=(REWARD_TARGET,), gain_targets=(GAIN_TARGET, 0.05), n_boot=20)
    rows = verdict_rows(tab, "DDPO", **kw)
    assert default_primary(True) == ("paired_gain",) and default_primary(False) == ("final_reward",)
    assert {r.quantity for r in rows if r.family == "primary"} == {"paired_gain"}
    rows_g = verdict_rows(tab, "DDPO", primary=["speedup_gain"], **kw)
    assert {r.quantity for r in rows_g if r.family == "primary"} == {"speedup_gain:0.03", "speedup_gain:0.05"}
    for rs in (rows, rows_g):
        gate = all(r.significant for r in rs if r.family == "primary")  # serial gatekeeping
        for fam in ("primary", "secondary"):
            est = [r for r in rs if r.family == fam and r.estimable]
            assert est, fam
            np.testing.assert_allclose([r.p_adjusted for r in est], holm([r.p for r in est]))
            for r in est:
                assert r.significant == (r.p_adjusted < ALPHA and (fam == "primary" or gate)) and r.p_adjusted >= r.p
                assert r.details.get("gated", False) == (fam == "secondary" and not gate)
        for r in rs:
            if not r.estimable:
                assert r.p_adjusted is None and not r.significant
    # one named row can be primary too
    rows_1 = verdict_rows(tab, "DDPO", primary=["speedup_gain:0.05"], **kw)
    assert {r.quantity for r in rows_1 if r.family == "primary"} == {"speedup_gain:0.05"}


def test_mde_is_at_the_family_level():
    """A secondary row must pass Holm over its family, so its MDE (and a speed-up's seeds for 25%) is
    its test's at alpha / m; the primary row, alone in its family, keeps alpha."""
    from pcpo_eval.stats.power import mde as t_mde
    from pcpo_eval.stats.runlevel import trimmed_mde

    tab = _study(5, gain_t=1.5, seed=4)
    rows = verdict_rows(tab, "DDPO", rng=np.random.default_rng(0), targets=(REWARD_TARGET,),
                        gain_targets=(GAIN_TARGET,), n_boot=20)  # fmt: skip
    sizes = {"primary": 1, "secondary": sum(r.family == "secondary" and r.estimable for r in rows)}
    assert sizes["secondary"] == 4, [(r.quantity, r.reason) for r in rows]
    b, t = _gains_by_seed(tab, "DDPO"), _gains_by_seed(tab, "PCPO")
    prim = next(r for r in rows if r.family == "primary")
    assert prim.details["family_size"] == 1 and prim.details["mde_level"] == ALPHA
    assert prim.mde == pytest.approx(trimmed_mde(b, t, paired=True, trim=0.0, alpha=ALPHA))
    assert "detectable at 80% power: ±" in prim.sentence and "Holm over" not in prim.sentence
    final = next(r for r in rows if r.quantity == "final_reward")
    fb = tab[tab.arm == "DDPO"].query("epoch > @N_EPOCHS - 5").groupby("seed").reward_mean.mean().to_numpy()
    ft = tab[tab.arm == "PCPO"].query("epoch > @N_EPOCHS - 5").groupby("seed").reward_mean.mean().to_numpy()
    assert final.details["family_size"] == 4 and final.details["mde_level"] == ALPHA / 4
    assert final.mde == pytest.approx(trimmed_mde(fb, ft, paired=True, trim=0.0, alpha=ALPHA / 4))
    assert final.mde > trimmed_mde(fb, ft, paired=True, trim=0.0, alpha=ALPHA) * 1.2
    assert ("detectable at 80% power after Holm over the 4 secondary rows, once the primary is significant: ±"
            in final.sentence)
    for r in rows:
        if r.quantity.startswith("speedup"):
            assert r.details["family_size"] == 4 and r.details["mde_level"] == ALPHA / 4, r.details
            vb, vt = np.asarray(r.details["baseline_epochs"]), np.asarray(r.details["treatment_epochs"])
            d = t_mde(float((vb - vt).std(ddof=1)), vb.size, paired=True, alpha=ALPHA / 4)
            assert r.mde is None or r.mde == pytest.approx(r.baseline_value / (r.baseline_value - d) - 1), r
            assert "after Holm over the 4 secondary rows" in r.sentence


def test_a_planted_effect_at_the_printed_family_mde_is_found_with_80_percent_power():
    """Families of 4 paired comparisons (5 seeds, SD 1), one real effect: planted at the MDE the row
    prints (its test's at alpha / 4), Holm finds it with ~80% power; planted at the unadjusted MDE
    (what rows printed before), far less. Measured, 4000 families (seed 20261126): 0.80 and 0.44."""
    from pcpo_eval.stats.power import family_level, mde

    rng = np.random.default_rng(20261126)
    n, m, n_fam = 5, 4, 4000
    found = {}
    for name, level in (("family", family_level(ALPHA, m)), ("unadjusted", ALPHA)):
        delta = mde(1.0, n, paired=True, alpha=level)
        d = rng.normal(0, 1, (n_fam, m, n))
        d[:, 0] += delta
        p = scipy.stats.ttest_1samp(d, 0.0, axis=2).pvalue
        gc.collect()
        gc.freeze()  # statsmodels' Holm collects garbage on every call (fast_loop's docstring)
        try:
            found[name] = float(np.mean([holm(row)[0] < ALPHA for row in p]))
        finally:
            gc.unfreeze()
    se = np.sqrt(0.8 * 0.2 / n_fam)
    assert abs(found["family"] - 0.8) < 3 * se + 0.01, found
    assert found["unadjusted"] < 0.6, found


def test_without_control_the_primary_is_final_reward_and_there_is_no_gain():
    t = _study(3).drop(columns="control_reward_mean")
    assert len(run_curves(t)) == 6
    rows = verdict_rows(t, "DDPO", rng=np.random.default_rng(0), gain_targets=(GAIN_TARGET,), n_boot=20)
    assert [(r.quantity, r.family) for r in rows] == [("final_reward", "primary"), ("auc", "secondary")]


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------


def test_target_status_uninformative_targets_get_no_row():
    tab = _study(3, seed=4)
    runs = run_curves(tab)
    ctrl_max = max(np.nanmax(pd.Series(r.control).rolling(5).mean()) for r in runs)
    reached_by_control = round(float(ctrl_max) - 0.005, 3)  # one control's smoothed curve reaches it
    st = {(s["curve"], s["target"]): s for s in target_status(runs, [reached_by_control, 0.5],
                                                              [0.0, -0.1, GAIN_TARGET], 5)}  # fmt: skip
    assert "the untrained control reaches" in st[("reward", reached_by_control)]["note"]
    assert st[("reward", 0.5)]["status"] == "informative"
    assert "a gain target must be > 0" in st[("gain", 0.0)]["note"] and st[("gain", -0.1)]["status"] == "uninformative"
    assert st[("gain", GAIN_TARGET)]["status"] == "informative"
    rows = verdict_rows(tab, "DDPO", rng=np.random.default_rng(0), quantities=[],
                        targets=(reached_by_control, 0.5), gain_targets=(0.0, GAIN_TARGET))
    assert [r.quantity for r in rows] == ["speedup_gain:0.03", "speedup_reward:0.5"]
    (low,) = target_status(run_curves(tab), [], [0.001], 5)  # every run's gain reaches it at its first full window
    assert low["status"] == "uninformative" and "first full-window epoch" in low["note"]
    # without controls no raw-reward target tells learning from the sampler: a frozen arm could look fast
    (raw,) = target_status(run_curves(tab.drop(columns="control_reward_mean")), [0.5], [], 5)
    assert raw["status"] == "uninformative" and "no paired untrained control logged" in raw["note"]


def test_a_nan_in_a_control_does_not_make_every_reward_target_uninformative():
    """(Regression: a non-finite control curve counted as reaching every target.)"""
    tab = _study(3, seed=4)
    tab.loc[(tab.arm == "PCPO") & (tab.seed == 1) & (tab.epoch == 20), "control_reward_mean"] = np.nan
    (st,) = target_status(run_curves(tab), [0.5], [], 5)
    assert st["status"] == "informative", st


def test_gain_targets_without_control_are_uninformative():
    runs = run_curves(_study(2).drop(columns="control_reward_mean"))
    (st,) = target_status(runs, [], [GAIN_TARGET], 5)
    assert st["status"] == "uninformative" and "no paired control" in st["note"]


# ---------------------------------------------------------------------------------------------
# degenerate studies and errors
# ---------------------------------------------------------------------------------------------


def test_one_run_per_arm_is_not_estimable():
    rows = verdict_rows(_study(1, gain_t=2.0), "DDPO", rng=np.random.default_rng(0), gain_targets=(GAIN_TARGET,))
    assert not any(r.paired for r in rows)  # one seed: nothing to pair
    for r in rows:
        assert not r.estimable and r.p is None and r.ci_low is None and not r.significant
        assert r.reason.startswith(ONE_RUN_PER_ARM[:14])
        assert r.sentence.startswith("1 run per arm: differences between runs, not algorithms")
    assert rows[0].estimate is not None  # the run difference is still shown


def test_nan_run_and_missing_arm_in_a_cell():
    t = _study(3, cells=("hps", "pick"))
    t.loc[(t.arm == "PCPO") & (t.cell == "hps") & (t.seed == 1) & (t.epoch == 38), "reward_mean"] = np.nan
    t = t[~((t.cell == "pick") & (t.arm == "DDPO"))]
    rows = verdict_rows(t, "DDPO", rng=np.random.default_rng(0), quantities=["final_reward"],
                        gain_targets=(GAIN_TARGET,), primary=["final_reward"])  # fmt: skip
    by = {(r.cell, r.quantity): r for r in rows}
    assert by[("hps", "final_reward")].reason.startswith("non-finite values (NaN/inf) in 1 of 6 runs")
    # the NaN (epoch 38) comes after every run reached the gain target: the speed-up keeps its times
    assert by[("hps", "speedup_gain:0.03")].estimable
    assert by[("pick", "final_reward")].reason == "no baseline runs" and by[("pick", "final_reward")].n_baseline_runs == 0
    assert all(r.p is None and not r.estimable for r in rows if r.quantity == "final_reward")
    t.loc[(t.arm == "PCPO") & (t.cell == "hps") & (t.seed == 1) & (t.epoch == 2), "reward_mean"] = np.nan
    early = verdict_rows(t, "DDPO", rng=np.random.default_rng(0), quantities=["final_reward"],
                         gain_targets=(GAIN_TARGET,), primary=["final_reward"])  # fmt: skip
    gain = next(r for r in early if (r.cell, r.quantity) == ("hps", "speedup_gain:0.03"))
    assert not gain.estimable and gain.reason.startswith("1 of 6 runs have a missing (non-finite) reward or control")
    assert headline([r.to_dict() for r in rows]).startswith("On this study")


def test_iqm_rows_are_labelled():
    (r,) = verdict_rows(_study(5), "DDPO", rng=np.random.default_rng(0), quantities=["auc"], stat="iqm", n_boot=20)
    assert "IQM reward AUC" in r.sentence and r.details["stat"] == "iqm"


def test_table_errors_name_the_fix():
    t = _study(2)
    rng = np.random.default_rng(0)
    with pytest.raises(UserError, match="lacks column 'seed'"):
        verdict_rows(t.drop(columns="seed"), "DDPO", rng=rng)
    with pytest.raises(UserError, match="more than one row for"):
        verdict_rows(pd.concat([t, t.iloc[:1]]), "DDPO", rng=rng)
    with pytest.raises(UserError, match="baseline arm 'GRPO' is not in the table; arms: DDPO, PCPO"):
        verdict_rows(t, "GRPO", rng=rng)
    with pytest.raises(UserError, match="unknown quantity 'fid'"):
        verdict_rows(t, "DDPO", rng=rng, quantities=["fid"])
    with pytest.raises(UserError, match="paired_gain needs a 'control_reward_mean' column"):
        verdict_rows(t.drop(columns="control_reward_mean"), "DDPO", rng=rng, quantities=["paired_gain"])
    with pytest.raises(UserError, match="sampler_offset needs a 'control_reward_mean' column"):
        verdict_rows(t.drop(columns="control_reward_mean"), "DDPO", rng=rng, quantities=["auc", "sampler_offset"])
    # without controls the default quantities leave the offset out (nothing to compare)
    rows = verdict_rows(t.drop(columns="control_reward_mean"), "DDPO", rng=rng, n_boot=10)
    assert [r.quantity for r in rows] == ["final_reward", "auc"]


def test_headline_names_the_primary_ci_and_pairing():
    rows = verdict_rows(_study(5, gain_t=2.0, seed=5), "DDPO", rng=np.random.default_rng(0),
                        gain_targets=(GAIN_TARGET,), n_boot=20)  # fmt: skip
    h = headline([r.to_dict() for r in rows])
    assert h.startswith("On this study") and "paired gain" in h and "95% CI" in h and "paired by seed" in h
    assert "Learning speed (0.03 gain over the untrained control)" in h
    assert headline([]) == "No run-level verdict: the study has no estimable primary endpoint."


def test_package_exports_are_lazy():
    import subprocess
    import sys

    code = (
        "import sys, pcpo_eval.stats as s; assert 'scipy.stats' not in sys.modules, 'scipy.stats imported'; "
        "assert s.verdict_rows.__module__ == 'pcpo_eval.stats.verdict'; "
        "assert s.compare_runs.__module__ == 'pcpo_eval.stats.runlevel'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)


# ---------------------------------------------------------------------------------------------
# calibration over simulated studies
# ---------------------------------------------------------------------------------------------


@pytest.mark.usefixtures("fast_loop")
@pytest.mark.parametrize(("n_seeds", "seed"), [(3, 20241103), (5, 20241105)])
def test_aa_false_positive_rates(n_seeds, seed):
    """Both arms from one process (400 studies, paired by seed, 5 rows each: paired gain, final
    reward, AUC, gain and reward speed-ups). The primary row keeps alpha, and the secondary family is
    tested only behind a significant primary (serial gatekeeping), so a study shows a significant row
    exactly when its primary row is: 'any row' keeps alpha per study, not one alpha per family.
    Measured, 400 studies each: seed 20241103, 3 vs 3: primary (paired gain) 6.0%; seed 20241105,
    5 vs 5: 4.75% (before the gate, any row read 7.5% at 3 vs 3)."""
    r = _rates(seed, n_seeds, N_STUDIES, {"DDPO": 1.0, "PCPO": 1.0})
    margin = 2.5 * np.sqrt(ALPHA * (1 - ALPHA) / N_STUDIES)  # 2.5 binomial SE = 0.027
    assert r["primary"] <= ALPHA + margin, r
    assert r["any"] == r["primary"], r


@pytest.mark.usefixtures("fast_loop")
def test_the_sampler_offset_is_a_claim_of_the_verdicts_family():
    """Unpaired A/A studies (3 vs 3 runs on different seeds, so the untrained controls differ by the
    seeds' noise; 300 studies, seed 20261128): the offset's own Welch test finds a "difference" in about
    alpha of them. Tested beside the verdict, that was a claim of its own (resampled unpaired 3-seed A/A
    studies of real toy runs: 5.2% claimed something, 3.6% without it; bench_verdict_calibration); as a
    secondary row behind the
    gate it is significant only where the primary is, so any claim keeps alpha per study. Measured: the
    offset's own test 3.0%, the primary 2.7%, any row 2.7% (the offset's test or the primary: 5.7%)."""
    rng = np.random.default_rng(20261128)
    n = 300
    own, primary, anyrow = [], [], []
    for _ in range(n):
        tab = simulate_study(rng, {"DDPO": [0, 1, 2], "PCPO": [3, 4, 5]}, {"DDPO": 1.0, "PCPO": 1.0})
        rows = verdict_rows(tab, "DDPO", rng=rng, gain_targets=(GAIN_TARGET,), n_boot=10)
        (off,) = [r for r in rows if r.quantity == "sampler_offset"]
        assert off.family == "secondary" and not off.paired and off.estimable
        own.append(off.p < ALPHA)
        primary.append(any(r.significant for r in rows if r.family == "primary"))
        anyrow.append(any(r.significant for r in rows))
        assert not off.significant or primary[-1]  # the gate
    margin = 2.5 * np.sqrt(ALPHA * (1 - ALPHA) / n)
    assert 0.01 <= np.mean(own) <= ALPHA + margin, np.mean(own)  # the offset's test is live, at its level
    assert anyrow == primary and np.mean(primary) <= ALPHA + margin, (np.mean(own), np.mean(primary))
    assert any(o and not p for o, p in zip(own, primary, strict=True))  # offsets that used to be claims


def _learn_or_collapse(rng: np.random.Generator, n: int, paired: bool, n_epochs: int = 40) -> pd.DataFrame:
    """An A/A runs table whose runs learn (a plateau gain ~0.08) or collapse (none), 1/2 each in both arms:
    RL runs far from the t test's normal world (the second verdict review's ``e06b_aa_bimodal_2seeds.py``)."""
    e, parts = np.arange(1, n_epochs + 1), []
    control = {s: 0.3 + rng.normal(0, 0.02) + rng.normal(0, 0.02, n_epochs) for s in range(2 * n)}
    for arm, seeds in (("DDPO", range(n)), ("PCPO", range(n) if paired else range(n, 2 * n))):
        for s in seeds:
            plateau = (0.08 + rng.normal(0, 0.01)) if rng.random() < 0.5 else 0.0
            reward = control[s] + plateau * (1 - np.exp(-0.1 * e)) + rng.normal(0, 0.01, n_epochs)
            parts.append(pd.DataFrame({"arm": arm, "cell": "all", "seed": s, "epoch": e, "reward_mean": reward,
                                       "control_reward_mean": control[s]}))
    return pd.concat(parts, ignore_index=True)


@pytest.mark.usefixtures("fast_loop")
@pytest.mark.parametrize("paired", [True, False])
def test_aa_learn_or_collapse_runs_keep_alpha_at_2_and_3_seeds(paired):
    """300 A/A studies per seed count (seed 20261127), default primary and a speed-up as the primary. Before
    the t test was bounded by the exact permutation test below 3 runs per arm (``permutation.t_not_robust``),
    the paired t on 2 seeds called 9.8% of 1000 such studies significant (unpaired: 10.8%). Measured now,
    300 studies each: 0% at 2 seeds (the exact floor, 1/2 paired and 1/3 unpaired, is above alpha); at 3
    seeds paired 3.7% (default primary) and 5.0% (speed-up primary), unpaired 2.3% and 0.3%."""
    rng = np.random.default_rng(20261127 + paired)
    margin = 2.5 * np.sqrt(ALPHA * (1 - ALPHA) / 300)
    for n in (2, 3):
        for primary in (None, ("speedup_gain:0.05",)):
            hits = [any(r.significant for r in verdict_rows(_learn_or_collapse(rng, n, paired), "DDPO", rng=rng,
                                                            gain_targets=(0.05,), primary=primary, n_boot=10))
                    for _ in range(300)]
            rate = float(np.mean(hits))
            assert rate == 0.0 if n == 2 else rate <= ALPHA + margin, (n, primary, rate)


@pytest.mark.usefixtures("fast_loop")
def test_power_treatment_with_twice_the_gain():
    """10 seeds per arm, the treatment learns twice the baseline's gain (100 studies, seed 20241110):
    the primary paired gain detects it in 86% of studies (final reward 68%, gain speed-up 49%)."""
    r = _rates(20241110, 10, 100, {"DDPO": 1.0, "PCPO": 2.0})
    assert r["primary"] >= 0.8, r


@pytest.mark.usefixtures("fast_loop")
def test_frozen_arm_is_never_faster_nor_better():
    """An arm whose reward IS its control (it learns nothing) against a learning baseline, 3 and 5
    seeds (25 studies each, seed 20241120): no speed-up row calls it faster, no paired gain higher."""
    rng = np.random.default_rng(20241120)
    n_speed = n_lower = 0
    for n in (3, 5):
        for _ in range(25):
            tab = simulate_study(rng, {"DDPO": list(range(n)), "PCPO": list(range(n))}, {"DDPO": 1.0, "PCPO": None})
            rows = verdict_rows(tab, "DDPO", rng=rng, targets=(REWARD_TARGET, 0.33), gain_targets=(0.01, GAIN_TARGET),
                                n_boot=10)  # fmt: skip
            for r in rows:
                if r.quantity.startswith("speedup_"):
                    n_speed += 1
                    assert r.estimate is None or r.estimate <= 0, r
                    assert not (r.significant and r.estimate > 0), r
                    assert r.details["n_censored_treatment"] == n, r
                if r.quantity == "paired_gain":
                    assert r.treatment_value == 0.0 and not (r.significant and r.estimate > 0), r
                    n_lower += r.estimate < 0
    assert n_speed >= 100  # the gain targets always, the reward targets when the controls stay below
    assert n_lower >= 45  # of 50: the baseline learned something in (almost) every study


# ---------------------------------------------------------------------------------------------
# sentences: feasibility, two-piece CIs, no spread, IQM (review items 5, 8, 9, 11)
# ---------------------------------------------------------------------------------------------


def _speedup_sentence(bt, tt, *, n_epochs, paired=True):
    from pcpo_eval.stats.speedup import TimeToTarget, speedup_runs
    from pcpo_eval.stats.verdict import Verdict, speedup_sentence

    def run(h):
        return TimeToTarget(h, h is None, 1, n_epochs, 5)

    s = speedup_runs([run(h) for h in bt], [run(h) for h in tt], target=1.0, paired=paired)
    v = Verdict("all", "speedup_gain:1", "DDPO", "PCPO", s.estimate, s.ci_low, s.ci_high, len(bt), len(tt), s.p,
                s.estimable, s.reason, s.significant, "", s.paired, s.mde, "primary", s.p)  # fmt: skip
    return s, speedup_sentence(v, s, "gain")


def test_speedup_sentence_says_what_the_window_makes_impossible():
    s, text = _speedup_sentence((5, 6, 7, 6, 6), (5, 7, 6, 5, 7), n_epochs=20)
    assert ("no speed-up is detectable at 80% power (at most +20% is possible against the baseline's measured mean "
            "with this window; the CI also covers a baseline slower than measured)") in text
    assert text.endswith("a 25% speed-up is not possible with this window and baseline")


def test_speedup_mde_says_what_it_asks_of_the_treatment_in_epochs():
    """A printed speed-up MDE names the treatment's mean epochs at that speed-up beside the earliest its
    runs can reach a target: on the toy runs some printed MDEs needed a treatment within an epoch of its
    first full window, more than learning faster by replay reaches (benchmarks/RESULTS.md)."""
    s, text = _speedup_sentence((20, 26, 31, 24, 28, 35), (18, 25, 27, 22, 30, 33), n_epochs=40)
    assert s.mde is not None and s.earliest == 5.0
    implied = s.baseline_mean / (1 + s.mde)
    assert f"detectable at 80% power: {pct(s.mde)} (PCPO reaching it in {implied:.1f} epochs on average; " \
           "the earliest its runs can is 5.0)" in text
    assert s.earliest < implied < s.baseline_mean


def test_speedup_sentence_prints_both_pieces_of_the_ci():
    s, text = _speedup_sentence((10, 19, 47), (5, 13, 40), n_epochs=60)
    assert text.startswith("PCPO reaches gain 1 sooner than DDPO")
    assert "95% CI -92% to -14% or +13% to +1100%" in text and "unbounded" not in text


def test_speedup_sentence_with_the_exact_permutation_p():
    s, text = _speedup_sentence((None,) * 6, (5,) * 6, n_epochs=24)
    assert text.startswith("PCPO reaches gain 1 sooner than DDPO") and "p = 0.0312" in text
    assert "CI not estimable (every per-seed difference is +19 epochs: no spread)" in text
    assert "p is the exact sign-flip permutation test's" in text and "no detectable effect" in text


def test_no_spread_rows_enter_holm_with_the_exact_p():
    """Every per-seed final-reward difference is +0.1 at 6 seeds: p = 2/64, significant, no CI."""
    rows = [dict(arm=arm, cell="all", seed=str(s), epoch=e, reward_mean=0.1 * s + (0.1 if arm == "PCPO" else 0.0))
            for arm in ("DDPO", "PCPO") for s in range(6) for e in range(1, 6)]  # fmt: skip
    (v,) = verdict_rows(pd.DataFrame(rows), "DDPO", rng=np.random.default_rng(0), quantities=["final_reward"])
    assert v.estimable and v.p == pytest.approx(2 / 64) and v.p_adjusted == v.p and v.significant
    assert v.ci_low is None and v.p_permutation == v.p
    assert v.sentence.startswith("PCPO's final reward is higher than DDPO's") and "CI not estimable" in v.sentence


def test_iqm_paired_sentence_names_the_per_seed_estimate():
    """stat='iqm', paired: the estimate is the IQM of the per-seed differences (+0.28), while the arms'
    own IQMs (-0.48 vs -0.19) go the other way: the sentence must not print them next to 'higher'."""
    b = [0.05, 2.0, 0.19, -0.63, -0.38, -1.09, -1.28, 0.63]
    t = [0.41, -1.29, -2.73, -0.16, -0.11, -0.63, -1.02, 0.86]
    rows = [dict(arm=arm, cell="all", seed=str(s), epoch=e, reward_mean=x)
            for arm, vals in (("DDPO", b), ("PCPO", t)) for s, x in enumerate(vals) for e in range(1, 6)]
    (v,) = verdict_rows(pd.DataFrame(rows), "DDPO", rng=np.random.default_rng(0), quantities=["final_reward"],
                        stat="iqm")  # fmt: skip
    assert v.estimate == pytest.approx(0.28) and v.treatment_value < v.baseline_value and v.significant
    assert v.sentence.startswith("PCPO's final reward is higher than DDPO's, seed for seed "
                                 "(IQM of the per-seed differences +0.28, 95% CI +0.13 to +0.43")
    assert "-0.48" not in v.sentence and v.mde is not None and v.mde < 0.3


@pytest.mark.usefixtures("fast_loop")
def test_headline_per_cell_learning_speed_caveats_and_a_missing_primary():
    """Several cells: each cell's learning-speed sentence, named; the offset sentence of the cell it belongs
    to; caveats right after the primary sentences; a primary without a row says why."""
    tab = _study(5, gain_t=2.0, seed=3, cells=("hps", "pick"))
    rows = [r.to_dict() for r in verdict_rows(tab, "DDPO", rng=np.random.default_rng(0), gain_targets=(GAIN_TARGET,),
                                                n_boot=20)]
    h = headline(rows, {"pick": {"explains_raw_speedup": "The raw-reward speed-up (0.5: +20%) is the sampler's."}},
                 caveats=["Compared over epochs up to 7 only: run r logged 7 of the 24 epochs"])
    assert f"Learning speed (hps: {GAIN_TARGET:g} gain" in h and f"Learning speed (pick: {GAIN_TARGET:g} gain" in h
    assert "In pick: The raw-reward speed-up (0.5: +20%) is the sampler's." in h
    assert h.index("On this study (hps)") < h.index("Compared over epochs") < h.index("Learning speed (hps")
    assert headline([], no_primary="the primary endpoint speedup_gain:0.1 has no row (x)") == \
        "No run-level verdict: the primary endpoint speedup_gain:0.1 has no row (x)."


def _row(cell: str, q: str, p: float | None) -> Verdict:
    return Verdict(cell, q, "DDPO", "PCPO", 0.1, 0.0, 0.2, 3, 3, p, p is not None, "" if p is not None else "x", False, "")


def test_the_gate_names_the_primary_row_that_closed_it():
    """Secondary rows of a closed gate say which primary row closed it and why (no difference, or not
    estimable; with its cell when there are several), and whether their own Holm p was below alpha."""
    rows = adjust_families([_row("a", "paired_gain", 0.001), _row("b", "paired_gain", 0.4), _row("a", "auc", 0.001)],
                           ("paired_gain",), ALPHA)
    auc = rows[2]
    assert not auc.significant and auc.details["gated"] and auc.details["holm_below_alpha"]
    assert auc.details["gate"] == "the primary endpoint (paired_gain) in b is not significant (Holm-adjusted p = 0.4)"
    rows = adjust_families([_row("a", "paired_gain", None), _row("a", "auc", 0.3)], ("paired_gain",), ALPHA)
    assert rows[1].details["gate"] == "the primary endpoint (paired_gain) is not estimable"
    assert not rows[1].details["holm_below_alpha"]
    assert adjust_families([_row("a", "auc", 0.01)], ("paired_gain",), ALPHA)[0].details["gate"] == \
        "the study has no primary row"
    h = headline([r.to_dict() for r in adjust_families(
        [_row("a", "paired_gain", 0.4), _row("a", "auc", 0.001)], ("paired_gain",), ALPHA)])
    # a non-claim, and no advice to switch the primary endpoint after seeing the data (before: "a study that
    # needs them names one as its primary endpoint"; re-running so turns 1.5-2.5% more of resampled A/A
    # studies of the real toy pool into findings, docs/statistics.md)
    assert ("Not evidence of a difference: 1 secondary row(s) (reward AUC) have a Holm-adjusted p below alpha but "
            "were not tested, because the primary endpoint (paired_gain) is not significant (Holm-adjusted p = 0.4); naming "
            "one primary "
            "after seeing these results would not keep the 5% error rate") in h
    assert "names one as its primary endpoint" not in h
    # the sampler offset's own line says it was not tested: a real sampler change is not repeated in the headline
    h = headline([r.to_dict() for r in adjust_families(
        [_row("a", "paired_gain", 0.4), _row("a", "sampler_offset", 0.001)], ("paired_gain",), ALPHA)])
    assert "Not evidence" not in h and h.startswith("On this study")
    # arms equal in every seed (a deterministic A/A): a finding of no difference, not "not estimable"
    eq = replace(_row("a", "paired_gain", None), reason=EQUAL_IN_EVERY_SEED)
    rows = adjust_families([eq, _row("a", "auc", 0.3)], ("paired_gain",), ALPHA)
    assert rows[1].details["gate"] == "the primary endpoint (paired_gain) shows no difference: equal in every seed"


def test_a_run_missing_epochs_is_not_averaged_across_the_gap_by_verdict_rows():
    """verdict_rows on a table whose run lacks epochs 9-12 (as a study's runs table would hold NaN there):
    the rows that need those epochs are not estimable, instead of treating rows 8 and 13 as consecutive
    epochs (before: the AUC and every speed-up of that run were computed as if the gap did not exist)."""
    t = _study(3, seed=4)
    gapped = t[~((t["arm"] == "PCPO") & (t["seed"] == 0) & t["epoch"].between(9, 12))]
    rows = {r.quantity: r for r in verdict_rows(gapped, "DDPO", rng=np.random.default_rng(0), gain_targets=[0.05])}
    assert not rows["auc"].estimable and rows["auc"].reason.startswith("non-finite values (NaN/inf) in 1 of 6 runs")
    assert rows["paired_gain"].estimable and rows["final_reward"].estimable  # the last 5 epochs are all logged
    (curve,) = [r for r in run_curves(gapped) if r.arm == "PCPO" and r.seed == "0"]
    assert curve.epochs.tolist() == list(range(1, N_EPOCHS + 1)) and np.isnan(curve.reward[8:12]).all()


def test_runs_of_unequal_length_are_refused_not_compared():
    """An A/A table whose PCPO logs stop at epoch 8 while DDPO's run to 40 read "PCPO's paired gain is lower"
    (p = 0.0005) before: the compared runs of a cell must end at one epoch; cut, the same table is A/A again."""
    tab = _study(5, gain_t=1.0)
    short = tab[(tab["arm"] == "DDPO") | (tab["epoch"] <= 8)]
    with pytest.raises(UserError, match=r"cell 'hps': the compared runs end at different epochs \(DDPO: 40, PCPO: 8\)"
                                        r".*table\['epoch'\] <= 8"):
        verdict_rows(short, "DDPO", rng=np.random.default_rng(0), n_boot=10)
    rows = verdict_rows(short[short["epoch"] <= 8], "DDPO", rng=np.random.default_rng(0), n_boot=10)
    assert rows and all(r.estimable for r in rows if r.quantity != "sampler_offset")
    (off,) = [r for r in rows if r.quantity == "sampler_offset"]  # the simulator's arms share one untrained control
    assert not off.estimable and off.reason.startswith("no difference in any seed")
