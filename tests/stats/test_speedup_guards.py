"""A speed-up measures learning, whatever the arms' noise, logs and controls (the fourth verdict review).

Each case was a way to be called "faster" without learning faster, found by simulating studies whose arms
learn alike (or not at all) and counting significant speed-ups:

* a noisier arm's smoothed curve first crosses a target sooner by chance: 13% of 200 A/A studies at
  20 seeds with a speed-up as the primary endpoint; now an intersection-union test with each run's
  midpoint crossing (``speedup.bound_by_midpoint``);
* an arm that drifted without learning (gain 0 with noise) reached a low gain target sooner than a slowly
  learning baseline: 6%; now "faster" also needs the faster arm to have learned (``bound_by_learning``);
* a log starting at epoch 6 reached its first full window later: refused;
* a raw target with a frozen arm's controls missing counted as "not reached by the sampler": uninformative;
* a constant sampler offset at 5 seeds (exact p 0.0625) explained nothing.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.stats.fmt import p_value
from pcpo_eval.stats.permutation import one_sided_mean_p
from pcpo_eval.stats.speedup import (
    bound_by_learning,
    bound_by_midpoint,
    epochs_to_target,
    speedup_runs,
    speedup_table,
)
from pcpo_eval.stats.verdict import run_curves, target_status, verdict_rows
from tests.support.curves import learning_study

GAIN_TARGETS = (0.02, 0.03)


def _faster(rows) -> bool:
    return any(r.significant and r.quantity.startswith("speedup") and (r.estimate or 0) > 0 for r in rows)


@pytest.mark.usefixtures("fast_loop")
def test_a_noisier_arm_that_learns_alike_is_not_called_faster():
    """One mean curve, PCPO's evaluation noise 3x DDPO's, 20 seeds, a gain speed-up as the primary. The first
    crossing alone called PCPO faster in 15.0% [10.4, 20.7] of 200 such studies, the shipped rule in 2.0%
    [0.5, 5.0] (benchmarks/bench_speedup_guards.py, seed 20261127). Here 60 studies, seed 20261128."""
    rng = np.random.default_rng(20261128)
    hits = sum(_faster(verdict_rows(learning_study(rng, 20, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.03}}),
                                    "DDPO", rng=rng, gain_targets=GAIN_TARGETS, primary=("speedup_gain",), n_boot=10))
               for _ in range(60))
    assert hits / 60 <= 0.05 + 2.5 * np.sqrt(0.05 * 0.95 / 60), hits


@pytest.mark.usefixtures("fast_loop")
def test_an_arm_that_does_not_learn_is_never_faster_however_noisy():
    """Gain 0 every epoch with noise SD 0.03 against a slowly learning DDPO (k 0.015), default primary (the
    paired gain, which the non-learner's lower gain makes significant, opening the gate): the first crossing
    alone called it faster in 11.0% [7.0, 16.2] of 200 studies at 20 seeds, the shipped rule in 0
    (benchmarks/bench_speedup_guards.py). Here 20 studies: never, and its p is never below the learning test's."""
    rng = np.random.default_rng(20261129)
    for _ in range(20):
        tab = learning_study(rng, 20, {"DDPO": {"noise": 0.01}, "Frozen": {"noise": 0.03, "gain": None}}, k_rate=0.015)
        rows = verdict_rows(tab, "DDPO", rng=rng, gain_targets=(0.01, 0.02), n_boot=10)
        assert not _faster(rows)
        for r in rows:
            if r.quantity.startswith("speedup") and (r.estimate or 0) > 0 and r.details["p_learned"] is not None:
                assert r.p >= r.details["p_learned"]


@pytest.mark.usefixtures("fast_loop")
def test_a_faster_learner_with_proportionally_more_noise_is_still_found():
    """The price of the bounds: PCPO learns 2x with 2x the gain noise (10 seeds): found in 41.5% [34.6, 48.7]
    of 200 studies, 44.5% with the first crossing alone (benchmarks/bench_speedup_guards.py); a guard on the
    noise ratio (tried first) withheld such a learner's speed-ups outright. Here 40 studies."""
    rng = np.random.default_rng(20261130)
    hits = sum(_faster(verdict_rows(learning_study(rng, 10, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.02, "gain": 2.0}}),
                                    "DDPO", rng=rng, gain_targets=GAIN_TARGETS, primary=("speedup_gain",), n_boot=10))
               for _ in range(40))
    assert hits >= 8, hits


def test_the_midpoint_crossing():
    y = np.r_[np.zeros(10), np.ones(5), np.zeros(10), np.ones(15)]  # up at 11-15, down, up again from 26
    first = epochs_to_target(y, 0.9, 1)
    mid = epochs_to_target(y, 0.9, 1, crossing="midpoint")
    assert first.epoch == 11 and mid.epoch == (11 + 26) / 2 and not mid.censored
    clean = np.linspace(0, 1, 40)
    assert epochs_to_target(clean, 0.5, 5, crossing="midpoint").epoch == epochs_to_target(clean, 0.5, 5).epoch
    assert epochs_to_target(np.zeros(20), 0.5, 5, crossing="midpoint").censored
    with pytest.raises(UserError, match="crossing 'last'"):
        epochs_to_target(clean, 0.5, 5, crossing="last")
    # a missing log row long after the hit is no crossing (it moved the midpoint from 7 to 13.5)
    rise = np.r_[np.linspace(0, 0.2, 8), np.full(16, 0.2)]
    e = np.arange(1, 25)
    gap = e != 15
    assert epochs_to_target(rise[gap], 0.1, 5, epochs=e[gap], crossing="midpoint").epoch == 7
    # a real dip below the target, seen between missing rows, still is one
    dip = rise.copy()
    dip[15:20] = 0.0
    keep = e != 13
    assert epochs_to_target(dip[keep], 0.1, 5, epochs=e[keep], crossing="midpoint").epoch > 7


def test_bound_by_midpoint_is_the_larger_p_and_one_when_the_two_disagree():
    tt = [epochs_to_target(np.r_[np.zeros(k), np.ones(40 - k)], 0.5, 1) for k in (5, 6, 7, 8)]
    bt = [epochs_to_target(np.r_[np.zeros(k), np.ones(40 - k)], 0.5, 1) for k in (15, 17, 16, 18)]
    first = speedup_runs(bt, tt, paired=True)
    assert first.significant
    same = bound_by_midpoint(first, first)
    assert same.p == first.p and same.p_midpoint == first.p
    other = bound_by_midpoint(first, speedup_runs(tt, bt, paired=True))  # the midpoints say "slower"
    assert other.p == 1.0 and not other.significant and "point the other way" in other.reason
    assert other.estimate == first.estimate and other.ci_low == first.ci_low  # the paper's numbers stay


def test_bound_by_learning_needs_the_faster_arm_to_have_learned():
    tt = [epochs_to_target(np.r_[np.zeros(k), np.ones(40 - k)], 0.5, 1) for k in (5, 6, 7, 8)]
    bt = [epochs_to_target(np.r_[np.zeros(k), np.ones(40 - k)], 0.5, 1) for k in (15, 17, 16, 18)]
    s = speedup_runs(bt, tt, paired=True)
    learned = [np.full(40, 0.05) + 0.01 * i for i in range(8)][::2]
    noise = [np.random.default_rng(i).normal(0, 0.03, 40) for i in range(4)]
    kept = bound_by_learning(s, learned, learned)
    assert kept.p_learned < 0.01 and kept.p == max(s.p, kept.p_learned) and kept.significant
    b = bound_by_learning(s, learned, noise, ("DDPO", "Frozen"))
    assert b.p == b.p_learned > s.p and not b.significant and "Frozen, the faster arm, learned at all" in b.reason
    assert one_sided_mean_p(np.array([-0.1, 0.2])) >= 0.25 and one_sided_mean_p(np.array([0.0, -1.0])) == 1.0


def test_runs_starting_at_different_epochs_are_refused():
    rng = np.random.default_rng(1)
    tab = learning_study(rng, 4, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.01}})
    late = tab[(tab.arm == "PCPO") | (tab.epoch >= 6)]
    with pytest.raises(UserError, match=r"logs start at different epochs \(DDPO: 6, PCPO: 1\).*>= 6"):
        verdict_rows(late, "DDPO", rng=rng, gain_targets=GAIN_TARGETS)
    assert verdict_rows(tab[tab.epoch >= 6], "DDPO", rng=rng, gain_targets=GAIN_TARGETS, n_boot=10)


def test_a_raw_target_whose_sampler_reach_cannot_be_checked_is_uninformative():
    rng = np.random.default_rng(2)
    tab = learning_study(rng, 4, {"DDPO": {"noise": 0.01}, "Frozen": {"noise": 0.01, "gain": 0.0}})
    ok = target_status(run_curves(tab), [0.5], [], 5)[0]
    assert ok["status"] == "informative"
    for blank in (tab.arm == "Frozen", (tab.arm == "Frozen") & (tab.epoch % 2 == 0)):
        t = tab.assign(control_reward_mean=tab.control_reward_mean.mask(blank))
        st = target_status(run_curves(t), [0.5], [], 5)[0]
        assert st["status"] == "uninformative" and "4 of 8 runs have no full window of their untrained" in st["note"]


def test_raw_speedups_from_logs_without_controls_have_no_test():
    rng = np.random.default_rng(3)
    tab = learning_study(rng, 4, {"DDPO": {"noise": 0.01}, "PCPO": {"noise": 0.01, "gain": 2.0}})
    logs = {a: [g.drop(columns=["arm", "cell", "seed"]) for _, g in tab[tab.arm == a].groupby("seed")]
            for a in ("DDPO", "PCPO")}
    bare = speedup_table([x.drop(columns="control_reward_mean") for x in logs["DDPO"]], logs["PCPO"], [0.33],
                         paired=True)
    (row,) = bare.rows
    assert row.estimate is not None and row.p is None and not row.significant and bare.p_holm == (None,)
    assert row.reason.startswith("no test: 4 of 8 logs have no paired untrained control")


def test_a_constant_sampler_offset_explains_raw_rows_even_when_its_test_cannot_decide():
    """5 seeds, a frozen arm whose sampler scores exactly 0.10 more in every seed: the offset's exact p is
    2/2^5 = 0.0625, so it was "not significant" and the frozen arm's significant "higher reward AUC" went
    unexplained; it goes one way in every seed, so it now explains."""
    from types import SimpleNamespace

    from pcpo_eval.study import verdicts as sv

    rng = np.random.default_rng(4)
    e = np.arange(1, 41)
    parts = []
    for s in range(5):
        c = 0.3 + rng.normal(0, 0.02) + rng.normal(0, 0.01, 40)
        parts += [pd.DataFrame({"arm": "DDPO", "cell": "all", "seed": s, "epoch": e,
                                "reward_mean": c + 0.05 * (1 - np.exp(-0.1 * e)) + rng.normal(0, 0.005, 40),
                                "control_reward_mean": c}),
                  pd.DataFrame({"arm": "Frozen", "cell": "all", "seed": s, "epoch": e, "reward_mean": c + 0.1,
                                "control_reward_mean": c + 0.1})]
    tab = pd.concat(parts, ignore_index=True)
    sp = SimpleNamespace(baseline="DDPO", pcpo="Frozen", window=5, targets=[], gain_targets=[], primary=[])
    rows = sv.verdict(sp, tab)
    auc = next(r for r in rows if r["quantity"] == "auc")
    assert auc["significant"] and auc["estimate"] > 0
    off = sv.sampler_offset(sp, tab, rows)["all"]
    assert not off["significant"] and off["p"] == pytest.approx(2 / 32)
    assert off["explains_raw_speedup"].startswith("The raw-reward difference (final reward")


def test_a_raw_difference_larger_than_the_offset_is_not_called_the_samplers():
    """A raw final-reward difference far beyond the sampler's offset (a reward spike in one arm, a control
    missing at the end) with no learning row that way: before, "is the sampler's, not learning" beside a 0.03
    offset. Now only rows the offset's CI can hold are the sampler's; a larger one is said to exceed it."""
    from types import SimpleNamespace

    from pcpo_eval.study import verdicts as sv

    sp = SimpleNamespace(baseline="DDPO", pcpo="PCPO")

    def row(q: str, est: float) -> dict:
        return {"cell": "all", "quantity": q, "significant": True, "estimate": est}

    big = sv._raw_speedup_explained(sp, "all", 0.03, True, [row("final_reward", 5.0), row("auc", 0.04)],
                                    paired=True, bound=0.05)
    first, second = big.split(". The ")
    assert first.startswith("The raw-reward difference (reward AUC: +0.04) is the sampler's, not learning")
    assert second.startswith("raw-reward difference (final reward: +5) is larger than the sampler's offset")
    assert "final reward at most 0.05 within the 95% CI" in second and "not shown to be learning" in second
    small = sv._raw_speedup_explained(sp, "all", 0.03, True, [row("final_reward", 0.045)], bound=0.05)
    assert "is the sampler's, not learning" in small and "larger" not in small
    speed = sv._raw_speedup_explained(sp, "all", 0.03, True, [row("speedup_reward:0.5", 3.0)], bound=0.05)
    assert speed.startswith("The raw-reward speed-up (speed-up to 0.5: +300%) is the sampler's")  # epochs: no size
    assert sv._raw_speedup_explained(sp, "all", 0.03, True, [row("final_reward", 5.0)]).count("larger") == 1


def test_a_sampler_offset_is_named_even_when_learning_goes_the_same_way():
    """10 paired seeds, PCPO's sampler +0.08 untrained and 10% more learning: its raw-reward speed-up is mostly
    the sampler's. Before, any significant learning row in that direction silenced the explanation (a +185%
    raw speed-up with no caveat, where the same learning alone gave +11%); now it says the raw rows mix the
    two and names the learning rows."""
    from types import SimpleNamespace

    from pcpo_eval.study import verdicts as sv

    rng = np.random.default_rng(3)
    e = np.arange(1, 41)
    parts = []
    for s in range(10):
        c = 0.7 + rng.normal(0, 0.005) + rng.normal(0, 0.005, 40)
        for arm, offset, gain in (("DDPO", 0.0, 0.15), ("PCPO", 0.08, 0.165)):
            parts.append(pd.DataFrame({"arm": arm, "cell": "all", "seed": s, "epoch": e,
                                       "reward_mean": c + offset + gain * (1 - np.exp(-e / 8)) + rng.normal(0, 0.005, 40),
                                       "control_reward_mean": c + offset}))
    tab = pd.concat(parts, ignore_index=True)
    sp = SimpleNamespace(baseline="DDPO", pcpo="PCPO", window=5, targets=[0.83], gain_targets=[0.06],
                         primary=["paired_gain"])
    rows = sv.verdict(sp, tab)
    raw = next(r for r in rows if r["quantity"] == "speedup_reward:0.83")
    learned = next(r for r in rows if r["quantity"] == "paired_gain")
    assert raw["significant"] and raw["estimate"] > 0.5 and learned["significant"] and learned["estimate"] > 0
    off = sv.sampler_offset(sp, tab, rows)["all"]
    assert off["significant"] and off["difference"] == pytest.approx(0.08, abs=0.01)
    said = off["explains_raw_speedup"]
    assert "mixes the sampler and learning" in said and "speed-up to 0.83: +" in said
    assert f"paired gain {learned['estimate']:+.3g}" in said


def test_the_speedup_table_refuses_logs_that_start_at_different_epochs(tmp_path, cli):
    """The same curves (but for a 0.0005 shift: one run's copy is refused as such), the PCPO logs from epoch 6:
    before, `pcpo-eval speedup` read PCPO -33% (p 0.333)."""
    e = np.arange(1, 41)
    curve = 0.3 + 0.06 * (1 - np.exp(-0.08 * e))
    base = [pd.DataFrame({"epoch": e, "reward_mean": curve + 0.001 * i}) for i in range(3)]
    late = [d[d.epoch >= 6].assign(reward_mean=lambda x: x.reward_mean + 0.0005) for d in base]  # other runs
    with pytest.raises(UserError, match=r"logs start at different epochs \(PCPO log 1 at 6.*epoch >= 6"):
        speedup_table(base, late, [0.33])
    args = []
    for i, (b, p) in enumerate(zip(base, late, strict=True)):
        b.to_csv(tmp_path / f"b{i}.csv", index=False)
        p.to_csv(tmp_path / f"p{i}.csv", index=False)
        args += ["--baseline", tmp_path / f"b{i}.csv", "--pcpo", tmp_path / f"p{i}.csv"]
    r = cli("speedup", *args, "--target", "0.33")
    assert r.returncode == 2 and r.stderr.startswith("error: the logs start at different epochs"), r.stderr
    assert len(r.stderr.strip().splitlines()) == 1


def test_the_learning_bound_follows_a_lower_is_better_curve():
    """With --lower-is-better, learning lowers the gain: the faster arm's gain is below 0, and the learning
    bound must read that as learning (it read a learner's negative gain as "not above 0": p = 1)."""
    rng = np.random.default_rng(5)
    e = np.arange(1, 41)
    logs = {}
    for arm, rate in (("DDPO", 0.06), ("PCPO", 0.15)):
        logs[arm] = []
        for _ in range(6):
            ctrl = 1.0 + rng.normal(0, 0.01, 40)
            drop = 0.1 * (1 - np.exp(-rate * np.exp(rng.normal(0, 0.1)) * e))
            logs[arm].append(pd.DataFrame({"epoch": e, "reward_mean": ctrl - drop + rng.normal(0, 0.002, 40),
                                           "control_reward_mean": ctrl}))
    tab = speedup_table(logs["DDPO"], logs["PCPO"], [-0.05], higher_is_better=False, paired=True, curve="gain")
    (row,) = tab.rows
    assert row.estimate > 0 and row.p_learned is not None and row.p_learned < 1e-3
    assert row.significant and row.p < 0.05, row.reason


def test_a_raw_speedup_that_the_samplers_offset_explains_is_said():
    """Both arms learn alike (gain curves from one model); PCPO's sampler scores 0.1 higher untrained. The
    raw-reward speed-up is found (Holm p < 0.05) and the table now says it may be the sampler's."""
    rng = np.random.default_rng(3)
    e = np.arange(1, 31)

    def log(offset: float) -> pd.DataFrame:
        control = 0.6 + offset + 0.01 * rng.standard_normal(e.size)
        gain = (0.012 + 0.002 * rng.standard_normal()) * (e - 1) + 0.01 * rng.standard_normal(e.size)
        return pd.DataFrame({"epoch": e, "reward_mean": control + gain, "control_reward_mean": control})

    base, pcpo = [log(0.0) for _ in range(6)], [log(0.1) for _ in range(6)]
    raw = speedup_table(base, pcpo, [0.85], paired=True)
    assert raw.p_holm[0] is not None and raw.p_holm[0] < 0.05 and raw.rows[0].estimate > 0
    (note,) = [n for n in raw.notes if "sampler's" in n]
    assert note.startswith("the raw-reward speed-up may be the sampler's, not learning: untrained, PCPO's sampler "
                           "already scores 0.1") and "--curve gain" in note and f"Note: {note}." in raw.to_markdown()
    assert not [n for n in speedup_table(base, pcpo, [0.15], paired=True, curve="gain").notes if "sampler's" in n]
    same = speedup_table(base, [log(0.0) for _ in range(6)], [0.85], paired=True)  # no offset: nothing to say
    assert not [n for n in same.notes if "sampler's" in n]


def test_the_offset_bound_uses_the_raw_rows_own_epochs():
    """A pure sampler change (both arms frozen, 3 paired seeds) whose controls' difference grows over the
    epochs: 0.0445 over the last 5, 0.0332 over all 16. Before, its final-reward difference (exactly the
    controls' last-5 difference, paired gain 0) was "larger than the sampler's offset (at most 0.0375)" and
    "not shown to be learning"; the bound now comes from the controls' own final reward and AUC."""
    from types import SimpleNamespace

    from pcpo_eval.stats.verdict import RunCurve, run_scalar
    from pcpo_eval.study import verdicts as sv

    e = np.arange(1, 17, dtype=float)
    rng = np.random.default_rng(20261128)
    b, t = [], []
    for s in range(3):
        base = 0.70 + 0.01 * s + 0.004 * rng.standard_normal(16)
        shift = 0.015 + 0.03 * (e - 1) / 15 + 0.001 * rng.standard_normal(16)  # the sampler's edge grows
        b.append(RunCurve("DDPO", "all", str(s), e, base.copy(), base.copy()))  # frozen: reward = control
        t.append(RunCurve("PCPO", "all", str(s), e, base + shift, base + shift))
    diff = float(np.mean([np.mean(x.control) for x in t]) - np.mean([np.mean(x.control) for x in b]))
    final = float(np.mean([run_scalar(x, "final_reward", 5) for x in t]) - np.mean([run_scalar(x, "final_reward", 5)
                                                                                       for x in b]))
    assert final > diff + 0.008  # the all-epoch offset understates the last epochs' one
    bounds = sv.control_bounds(b, t, True, diff, 5)
    assert bounds["final_reward"] >= final
    sp = SimpleNamespace(baseline="DDPO", pcpo="PCPO")
    row = {"cell": "all", "quantity": "final_reward", "significant": True, "estimate": final}
    said = sv._raw_speedup_explained(sp, "all", diff, True, [row], paired=True, bound=bounds)
    assert "is the sampler's, not learning" in said and "larger" not in said
    old = sv._raw_speedup_explained(sp, "all", diff, True, [row], paired=True, bound=diff + 0.004)  # one bound
    assert "larger than the sampler's offset" in old


def test_the_sampler_offset_says_what_it_could_detect():
    """Every printed comparison says what it could have found: the sampler offset's sentence lacked it (a review)."""
    from tests.report.test_printed_numbers import _results

    rng, e, parts = np.random.default_rng(4), np.arange(1, 21), []
    for arm, c0 in (("DDPO", 0.30), ("PCPO", 0.31)):
        for seed in range(4):
            ctrl = c0 + 0.01 * rng.standard_normal() + 0.002 * rng.standard_normal(20)
            parts.append(pd.DataFrame({"arm": arm, "cell": "c", "seed": seed, "epoch": e,
                                       "reward_mean": ctrl + 0.005 * e, "control_reward_mean": ctrl}))
    res = _results(pd.concat(parts, ignore_index=True))
    (off,) = res["sampler_offset"].values()
    # at its family's level: a secondary row of the verdict, so it is tested only once the primary is significant
    assert off["mde"] is not None and (f"detectable at 80% power after Holm over the 3 secondary rows, once the "
                                       f"primary is significant: ±{off['mde']:.3g}") in off["explains"]


def test_a_missing_control_epoch_keeps_the_offsets_own_bound():
    """A control epoch missing: the quantity's own bound cannot be computed, and the bound fell back to the bare
    offset estimate, printed as a CI bound (a review). It now keeps the all-epoch offset's CI bound."""
    from pcpo_eval.stats.verdict import RunCurve
    from pcpo_eval.study import verdicts as sv

    e = np.arange(1, 11, dtype=float)
    b = [RunCurve("DDPO", "all", str(s), e, np.full(10, 0.7 + 0.01 * s), np.full(10, 0.7 + 0.01 * s)) for s in range(3)]
    t = [RunCurve("PCPO", "all", str(s), e, np.full(10, 0.73 + 0.01 * s), np.full(10, 0.73 + 0.01 * s)) for s in range(3)]
    t[0].control[4] = np.nan
    bounds = sv.control_bounds(b, t, True, 0.03, 5, fallback=0.045)
    assert bounds["auc"] == 0.045 and bounds["final_reward"] == pytest.approx(0.03)  # auc needs every epoch


def test_the_sampler_offset_line_prints_its_rows_p():
    """8 vs 9 unpaired runs: the offset's p is the larger of Welch's and a Monte Carlo relabelling p, which
    the line drew again with another generator: "p = 0.0461, Holm-adjusted p = 0.154" where the row's p was
    0.0515 (0.154 = 3 x 0.0515; a review). The line, results.json and the guard now use the row's p."""
    from tests.report.test_printed_numbers import _results

    rng, e, parts = np.random.default_rng(147), np.arange(1, 11), []
    seeds = {"DDPO": list(range(8)), "PCPO": list(range(100, 109))}
    shared = {s: (0.3 + rng.normal(0, 0.02) + rng.normal(0, 0.02, 10), rng.normal(0, 0.25)) for s in sorted(
        seeds["DDPO"] + seeds["PCPO"])}
    for arm, offset in (("DDPO", 0.0), ("PCPO", 0.02)):
        for seed in seeds[arm]:
            ctrl, u = shared[seed][0] + offset, shared[seed][1]
            k = 0.08 * np.exp(rng.normal(0, 0.2))
            plateau = 0.06 * (1 + u) + rng.normal(0, 0.035)
            reward = ctrl + plateau * (1 - np.exp(-k * e)) + rng.normal(0, 0.01, 10)
            parts.append(pd.DataFrame({"arm": arm, "cell": "c", "seed": seed, "epoch": e,
                                       "reward_mean": reward, "control_reward_mean": ctrl}))
    res = _results(pd.concat(parts, ignore_index=True), primary=())
    (row,) = [v for v in res["verdict"] if v["quantity"] == "sampler_offset"]
    off = res["sampler_offset"]["c"]
    assert "Monte Carlo relabelling" in row["details"]["p_method"] or "Monte Carlo" in row["reason"]
    assert (off["p"], off["p_adjusted"], off["ci_low"], off["ci_high"]) == (row["p"], row["p_adjusted"],
                                                                            row["ci_low"], row["ci_high"])
    assert f"p = {p_value(row['p'])}, Holm-adjusted p = {p_value(row['p_adjusted'])} (secondary)" in off["explains"]
