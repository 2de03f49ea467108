"""Verdict rows: exact keys, plain sentences, censoring reported, degenerate studies not estimable."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.stats.runlevel import ONE_RUN_PER_ARM
from pcpo_eval.stats.verdict import VERDICT_KEYS, run_curves, verdict_rows

KEYS = {
    "cell", "quantity", "baseline", "treatment", "estimate", "ci_low", "ci_high", "n_baseline_runs",
    "n_treatment_runs", "p", "estimable", "reason", "significant", "sentence",
}  # fmt: skip


def _arm_rows(rng, arm, cell, n_runs, *, rate, gain=0.0, n_epochs=60, offset_sd=0.02):
    """Tidy rows of ``n_runs`` saturating learning curves with a noise-cancelling control."""
    rows = []
    e = np.arange(1, n_epochs + 1)
    for seed in range(n_runs):
        k = rate * np.exp(rng.normal(0, 0.1))
        eff = rng.normal(0, 0.03, n_epochs)
        ctrl = 0.3 + eff
        rew = (
            ctrl
            + (0.5 + rng.normal(0, offset_sd)) * (1 - np.exp(-k * e))
            + gain
            + rng.normal(0, 0.005, n_epochs)
        )
        rows += [dict(arm=arm, cell=cell, seed=seed, epoch=int(i), reward_mean=float(r), control_reward_mean=float(c))
                 for i, r, c in zip(e, rew, ctrl, strict=True)]  # fmt: skip
    return rows


def _table(n_runs=3, *, rate_t=0.1, gain_t=0.0, cells=("hps",), n_epochs=60, seed=0):
    rng = np.random.default_rng(seed)
    rows = []
    for cell in cells:
        rows += _arm_rows(rng, "DDPO", cell, n_runs, rate=0.05, n_epochs=n_epochs)
        rows += _arm_rows(rng, "PCPO", cell, n_runs, rate=rate_t, gain=gain_t, n_epochs=n_epochs)
    return pd.DataFrame(rows)


def test_rows_have_exactly_the_keys_and_are_json():
    rows = verdict_rows(_table(), "DDPO", rng=np.random.default_rng(0), targets=(0.6,))
    assert tuple(KEYS) and set(VERDICT_KEYS) == KEYS
    assert [r.quantity for r in rows] == ["final", "auc", "paired_gain", "speedup@0.6"]
    for r in rows:
        d = r.to_dict()
        assert set(d) == KEYS and list(d) == list(VERDICT_KEYS)
        assert (d["cell"], d["baseline"], d["treatment"]) == ("hps", "DDPO", "PCPO")
        assert (d["n_baseline_runs"], d["n_treatment_runs"]) == (3, 3)
        json.dumps(d, allow_nan=False)  # machine-readable: no NaN/inf leaks into the JSON


def test_faster_arm_gets_a_speedup_sentence_with_ci():
    rows = verdict_rows(_table(5), "DDPO", rng=np.random.default_rng(0), targets=(0.6,))
    sp = rows[-1]
    assert sp.estimable and sp.significant and sp.estimate > 0.5 and sp.p is not None and sp.p < 0.05
    assert sp.ci_low is not None and sp.ci_high is not None and 0 < sp.ci_low < sp.estimate < sp.ci_high
    assert sp.sentence.startswith("PCPO reaches 0.6 in ") and "speed-up" in sp.sentence
    assert sp.sentence.endswith(", 5 vs 5 runs)") and "95% CI" in sp.sentence  # 5 vs 5: p can be < alpha


def test_same_process_says_no_evidence():
    t = _table(3, rate_t=0.05, seed=3)
    rows = verdict_rows(t, "DDPO", rng=np.random.default_rng(0), quantities=["paired_gain"])
    (g,) = rows
    assert g.estimable and not g.significant and g.ci_low < 0 < g.ci_high
    assert g.sentence.startswith("no evidence of a difference in paired gain between PCPO and DDPO (")
    assert g.sentence.endswith("3 vs 3 runs)")


def test_significant_3_vs_3_notes_that_the_permutation_p_cannot_reach_alpha():
    rows = verdict_rows(
        _table(3, gain_t=0.2), "DDPO", rng=np.random.default_rng(0), quantities=["paired_gain"]
    )
    (g,) = rows
    assert g.significant and g.p == pytest.approx(0.1)
    assert g.sentence.startswith("PCPO's paired gain is higher than DDPO's: ")
    assert g.sentence.endswith(
        "3 vs 3 runs); exact permutation p = 0.10 (cannot be below 0.10 with 3 vs 3 runs)"
    )


def test_one_run_per_arm_is_not_estimable():
    rows = verdict_rows(_table(1), "DDPO", rng=np.random.default_rng(0), targets=(0.6,))
    for r in rows:
        assert not r.estimable and r.p is None and r.ci_low is None and not r.significant
        assert r.reason == ONE_RUN_PER_ARM
        assert r.sentence.startswith("1 run per arm: differences between runs, not algorithms")
    assert rows[0].estimate is not None  # the run difference is still shown


def test_censored_runs_are_reported_not_dropped():
    """A target only the fast arm reaches in 30 epochs: a lower bound naming the censored runs."""
    rows = verdict_rows(
        _table(3, n_epochs=30), "DDPO", rng=np.random.default_rng(0), quantities=[], targets=(0.74,)
    )
    (sp,) = rows
    assert sp.n_baseline_runs == 3 and sp.estimable and sp.ci_high is None
    assert (
        sp.reason
        == "estimate is a lower bound: 3 of 3 baseline runs never reach 0.74 within 30 epochs (censored)"
    )
    assert "3 of 3 DDPO runs never reach 0.74 within 30 epochs (speed-up at least" in sp.sentence


def test_uninformative_and_unreached_targets():
    rows = verdict_rows(_table(3), "DDPO", rng=np.random.default_rng(0), quantities=[], targets=(0.0, 5.0))
    low, high = rows
    assert not low.estimable and low.reason.startswith("uninformative target") and low.p is None
    assert "not estimable: uninformative target" in low.sentence
    assert not high.estimable and "3 of 3 baseline and 3 of 3 treatment runs never reach" in high.reason


def test_nan_run_and_missing_arm_in_a_cell():
    t = _table(3, cells=("hps", "pick"))
    t.loc[(t.arm == "PCPO") & (t.cell == "hps") & (t.seed == 1) & (t.epoch == 58), "reward_mean"] = np.nan
    t = t[~((t.cell == "pick") & (t.arm == "DDPO"))]
    rows = verdict_rows(t, "DDPO", rng=np.random.default_rng(0), quantities=["final"], targets=(0.6,))
    by = {(r.cell, r.quantity): r for r in rows}
    assert by[("hps", "final")].reason.startswith("non-finite values (NaN/inf) in 1 of 6 runs")
    assert by[("hps", "speedup@0.6")].reason.startswith("non-finite rewards in 1 of 6 runs")
    assert by[("pick", "final")].reason == "no baseline runs" and by[("pick", "final")].n_baseline_runs == 0
    assert all(r.p is None and not r.estimable for r in rows)


def test_iqm_rows_are_labelled():
    (r,) = verdict_rows(_table(5), "DDPO", rng=np.random.default_rng(0), quantities=["auc"], stat="iqm")
    assert "IQM reward AUC" in r.sentence


def test_table_errors_name_the_fix():
    t = _table(2)
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


def test_without_control_the_default_skips_paired_gain_and_runs_are_split():
    t = _table(2).drop(columns="control_reward_mean")
    assert len(run_curves(t)) == 4
    rows = verdict_rows(t, "DDPO", rng=np.random.default_rng(0))
    assert [r.quantity for r in rows] == ["final", "auc"]


def test_package_exports_are_lazy():
    import subprocess
    import sys

    code = (
        "import sys, pcpo_eval.stats as s; assert 'scipy.stats' not in sys.modules; "
        "assert s.verdict_rows.__module__ == 'pcpo_eval.stats.verdict'; "
        "assert s.compare_runs.__module__ == 'pcpo_eval.stats.runlevel'"
    )
    subprocess.run([sys.executable, "-c", code], check=True)
