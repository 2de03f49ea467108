"""The image-metric comparisons are one multiplicity family per study (bold cells, LMM tables).

Before, each comparison (matched reward, matched epoch) and, within it, the simple-effect LMMs and the
overall-only Welch rows were separate Holm families, so an A/A study showed some bold cell far more
often than 5% of the time. The calibration test below draws A/A studies (3 vs 3 runs, Gaussian), gives
the per-prompt metric the exact run-level t-test of a balanced LMM and the overall-only metrics the
study's own Welch rows (:func:`pcpo_eval.study.image_metrics.overall_effects`), and runs them through
:func:`pcpo_eval.study.image_metrics.image_metrics`, which builds the raw-score table the report bolds.
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import numpy as np
import pytest
from scipy import stats

import pcpo_eval.study.image_metrics as image_metrics_module
from pcpo_eval.study.image_metrics import arm_family, image_metrics, lmm_study_family, overall_effects
from pcpo_eval.study.spec import load_spec
from pcpo_eval.studydir import StudyLayout

ROOT = Path(__file__).resolve().parents[2]


def _row(p: float | None, **kw: Any) -> dict[str, Any]:
    return {"estimate": 0.0, "p": p, "estimable": p is not None, "p_adj": p, "significant": p is not None and p < 0.05,
            **kw}


def test_study_family_adjusts_every_cell_and_comparison_at_once():
    sig = {"all": {"a": _row(0.01), "b": _row(0.04)}, "all @ epoch 10": {"a": _row(0.03), "b": _row(None)},
           "x": {"c": {"error": "boom"}}}
    out, _ = arm_family(sig, {}, "algorithm", {}, "holm", 0.05)
    # Holm over the three estimable p-values: 0.01 * 3, max(0.03 * 2, 0.03), max(0.04, 0.06)
    assert out["all"]["a"]["p_adj"] == pytest.approx(0.03) and out["all"]["a"]["significant"]
    assert out["all @ epoch 10"]["a"]["p_adj"] == pytest.approx(0.06) and not out["all @ epoch 10"]["a"]["significant"]
    assert out["all"]["b"]["p_adj"] == pytest.approx(0.06) and not out["all"]["b"]["significant"]
    assert out["all @ epoch 10"]["b"]["p_adj"] is None and not out["all @ epoch 10"]["b"]["significant"]
    assert out["x"]["c"] == {"error": "boom"}
    assert sig["all"]["b"]["significant"]  # the input is not modified


def test_arm_family_joins_the_lmm_terms_of_the_compared_factor_and_counts_a_repeated_test_once():
    sig = {"all": {"a": _row(0.01, se=1.0)}, "all @ epoch 10": {"a": _row(0.04, se=1.0)}}
    adj = {"a": {"algorithm[T.B]": {"p": 0.01}, "batch[T.y]": {"p": 0.001, "p_holm": 0.002, "p_bh": 0.002}},
           "a @ epoch 10": {"algorithm[T.B]": {"p": 0.04}, "algorithm[T.B]:batch[T.y]": {"p": 0.02}}}
    # the matched-reward LMM term is the raw-score row (same estimate, SE, p); the epoch one is not
    fits = {"a": {"fixed": [{"term": "algorithm[T.B]", "estimate": 0.0, "se": 1.0, "p": 0.01}]}}
    same = image_metrics_module.same_tests({"all": sig["all"]}, {"a": adj["a"]}, fits, "algorithm", "")
    assert same == {("a", "algorithm[T.B]"): ("all", "a")}
    s, a = arm_family(sig, adj, "algorithm", same, "holm", 0.05)
    # one family of 4 tests (2 rows, the epoch LMM term and the interaction; not batch, not the repeat)
    assert s["all"]["a"]["p_adj"] == pytest.approx(0.04) and s["all"]["a"]["significant"]
    assert a["a"]["algorithm[T.B]"]["p_holm"] == s["all"]["a"]["p_adj"]  # the repeat shows the row's value
    assert a["a @ epoch 10"]["algorithm[T.B]:batch[T.y]"]["p_holm"] == pytest.approx(0.06)
    assert a["a @ epoch 10"]["algorithm[T.B]"]["p_holm"] == pytest.approx(0.08)
    assert s["all @ epoch 10"]["a"]["p_adj"] == pytest.approx(0.08)
    assert a["a"]["batch[T.y]"]["p_holm"] == 0.002  # not an arm comparison: its own family, untouched
    assert image_metrics_module.involves("x[T.1]:algorithm[T.B]", "algorithm") and not image_metrics_module.involves("algorithmic", "algorithm")


def test_lmm_study_family_spans_both_comparisons_per_term():
    adj = {"m": {"alg": {"p": 0.02, "p_holm": 0.02, "p_bh": 0.02}, "(Intercept)": {"p": 0.5, "p_holm": 0.5, "p_bh": 0.5}},
           "m @ epoch 10": {"alg": {"p": 0.04, "p_holm": 0.04, "p_bh": 0.04}},
           "n @ epoch 10": {"alg": {"p": None, "p_holm": None, "p_bh": None}}}
    out = lmm_study_family(adj)
    assert out["m"]["alg"]["p_holm"] == pytest.approx(0.04) and out["m @ epoch 10"]["alg"]["p_holm"] == pytest.approx(0.04)
    assert out["m"]["alg"]["p_bh"] == pytest.approx(0.04)
    assert out["m"]["(Intercept)"]["p_holm"] == pytest.approx(0.5)  # its own family (one fit)
    assert out["n @ epoch 10"]["alg"]["p_holm"] is None


def _fake_comparison(sp, rng: np.random.Generator):
    """A comparison() stand-in: A/A Gaussian runs; lpips_toy by the exact run-level t (a balanced LMM's
    test, its own per-cell family as simple_effects made it), fd_toy / is_toy by the study's Welch rows."""
    runs = [{"name": r.name, "cell": sp.cell_key(r), "role": sp.role(r)} for r in sp.runs]

    def comparison(_sp, _layout, match):
        values = {r["name"]: {m: float(rng.normal()) for m in sp.overall_only} for r in runs}
        base = [rng.normal() for r in runs if r["role"] == "baseline"]
        trt = [rng.normal() for r in runs if r["role"] == "pcpo"]
        p = float(stats.ttest_ind(trt, base).pvalue)
        sig = {cell: {"lpips_toy": _row(p, se=1.0)} | per for cell, per in overall_effects(sp, runs, values).items()}
        # one cell: the LMM table's algorithm term is the raw-score row's test (same estimate, SE and p)
        fits = {"lpips_toy": {"fixed": [{"term": "algorithm[T.B]", "estimate": 0.0, "se": 1.0, "p": p}]}}
        return {"rows": [], "values": {}, "n_rows": 0, "formula": "f", "image_formula": None, "fits": fits,
                "adjusted": {"lpips_toy": {"algorithm[T.B]": {"p": p, "p_holm": p, "p_bh": p}}}, "significance": sig}

    return comparison


def test_aa_studies_show_a_bold_cell_in_at_most_5_percent(tmp_path, monkeypatch):
    sp = load_spec(ROOT / "analysis" / "toy_aa_study.yaml", check_weights=False)
    layout = StudyLayout(tmp_path)
    layout.selection_file.parent.mkdir(parents=True, exist_ok=True)
    layout.selection_file.write_text(json.dumps({"epoch": 10}))
    monkeypatch.setattr(image_metrics_module, "metrics_json", lambda path: {"metrics": {}})
    monkeypatch.setattr(image_metrics_module, "comparison", _fake_comparison(sp, np.random.default_rng(20261127)))
    n, bold, lmm_sig, either = 120, 0, 0, 0
    for _ in range(n):
        raw, lmm, _ = image_metrics(sp, layout)
        b = any(any(r["significant"].values()) for r in raw["rows"])
        m = any(v["p_holm"] < 0.05 for terms in lmm["adjusted"].values() for v in terms.values())
        bold, lmm_sig, either = bold + b, lmm_sig + m, either + (b or m)
    bound = 0.05 + 2 * np.sqrt(0.05 * 0.95 / n)
    # per-comparison families (the old code): 16 of these 120 studies (13.3%) had a bold cell
    assert bold / n <= bound, (bold, n)
    assert lmm_sig / n <= bound, (lmm_sig, n)
    # ONE family per study: some arm comparison anywhere in the image-metric sections (was two families)
    assert either / n <= bound, (either, n)


def test_overall_only_rows_state_their_welch_mde():
    """An overall-only (Welch) row carries the MDE and df of the very test it reports."""
    from pcpo_eval.stats.power import spread_factor, t_power, welch_spread_df
    from pcpo_eval.stats.runlevel import compare_runs

    sp = load_spec(ROOT / "analysis" / "toy_aa_study.yaml", check_weights=False)
    runs = [{"name": r.name, "cell": sp.cell_key(r), "role": sp.role(r)} for r in sp.runs]
    rng = np.random.default_rng(3)
    values = {r["name"]: {m: float(rng.normal()) for m in sp.overall_only} for r in runs}
    for cell, per in overall_effects(sp, runs, values).items():
        for m, row in per.items():
            b, t = ([values[r["name"]][m] for r in runs if r["cell"] == cell and r["role"] == role]
                    for role in ("baseline", "pcpo"))
            c = compare_runs(b, t, rng=np.random.default_rng(0))
            assert row["mde"] == pytest.approx(c.mde) and row["df"] == pytest.approx(c.df)
            # 80% power averaged over the measured spread's uncertainty: the plug-in MDE times the factor
            sd_b, sd_t = float(np.std(b, ddof=1)), float(np.std(t, ddof=1))
            plug_in = row["mde"] / spread_factor(welch_spread_df(sd_b, len(b), sd_t, len(t)))
            power = t_power(plug_in, float(np.std(b, ddof=1)), len(b), sd_t=float(np.std(t, ddof=1)),
                            n_t=len(t), paired=False)
            assert power == pytest.approx(0.8, abs=1e-4)  # Welch's power: a share of 20,000 fixed draws


def test_overall_only_rows_keep_the_permutation_bound_of_few_runs():
    """2 runs per arm: the overall-only row's p is compare_runs' (never below the exact relabelling test's
    1/3), not scipy's plain Welch p (0.013 here, which made the row significant, bold in the raw-score table);
    with 3 runs per arm and spread it is exactly Welch's."""
    from types import SimpleNamespace

    sp = SimpleNamespace(cells=lambda: ["c"], overall_only=["fd_toy"], lmm=SimpleNamespace(alpha=0.05, adjust="holm"))
    rows = [{"name": n, "cell": "c", "role": "baseline" if n[0] == "b" else "pcpo"} for n in ("b0", "b1", "t0", "t1")]
    values = {"b0": {"fd_toy": 10.0}, "b1": {"fd_toy": 10.3}, "t0": {"fd_toy": 12.0}, "t1": {"fd_toy": 12.2}}
    assert stats.ttest_ind([12.0, 12.2], [10.0, 10.3], equal_var=False).pvalue < 0.05
    row = overall_effects(sp, rows, values)["c"]["fd_toy"]
    assert row["p"] >= 1 / 3 and not row["significant"] and "2 runs in an arm" in row["reason"]
    sig, _ = arm_family(overall_effects(sp, rows, values), {}, "algorithm", {}, "holm", 0.05)
    assert not sig["c"]["fd_toy"]["significant"]

    rows3 = rows + [{"name": "b2", "cell": "c", "role": "baseline"}, {"name": "t2", "cell": "c", "role": "pcpo"}]
    values3 = values | {"b2": {"fd_toy": 10.1}, "t2": {"fd_toy": 11.5}}
    row3 = overall_effects(sp, rows3, values3)["c"]["fd_toy"]
    welch = stats.ttest_ind([12.0, 12.2, 11.5], [10.0, 10.3, 10.1], equal_var=False).pvalue
    assert row3["p"] == pytest.approx(welch, rel=1e-9) and row3["significant"]


def test_sum_coded_terms_of_the_compared_factor_join_the_family_and_the_console():
    """``lmm.coding: sum`` names the factor's term ``C(algorithm, Sum)[S.DDPO]``; looking for ``algorithm[``
    left it out of the study's one family of arm comparisons (its own Holm family: two families again) and
    out of the console's LMM lines."""
    from pcpo_eval.report.summary import lmm_lines
    from pcpo_eval.stats.design import term_factors

    assert term_factors("C(algorithm, Sum)[S.DDPO]") == ("algorithm",) == term_factors("C(algorithm)[T.PCPO]")
    assert term_factors("C(algorithm, Sum)[S.DDPO]:C(batch, Sum)[S.8]") == ("algorithm", "batch")
    assert term_factors("(Intercept)") == () == term_factors("log_reward")
    assert image_metrics_module.involves("C(algorithm, Sum)[S.DDPO]", "algorithm")
    assert not image_metrics_module.involves("C(algorithmic, Sum)[S.x]", "algorithm")
    term = "C(algorithm, Sum)[S.DDPO]"
    adjusted = {"fid": {term: {"p": 0.03, "p_holm": 0.03, "p_bh": 0.03},
                        "(Intercept)": {"p": 0.5, "p_holm": 0.5, "p_bh": 0.5}}}
    sig = {"c": {"clip": _row(0.01, se=1.0)}}
    s, a = arm_family(sig, adjusted, "algorithm", {}, "holm", 0.05)
    # one family of two tests: 0.01 * 2 and max(0.03, 0.02)
    assert a["fid"][term]["p_holm"] == pytest.approx(0.03) and s["c"]["clip"]["p_adj"] == pytest.approx(0.02)
    assert a["fid"]["(Intercept)"]["p_holm"] == 0.5
    res = {"study": {"compare": {"factor": "algorithm"}},
           "lmm": {"fits": {"fid": {"fixed": [{"term": term, "estimate": -0.06, "p": 0.03},
                                              {"term": "(Intercept)", "estimate": 1.0, "p": 0.5}]}},
                   "adjusted": a, "adjust": "holm"}}
    assert lmm_lines(res) == [f"  LMM fid: {term} = -0.06 (p = 0.03, adj. p = 0.03)"]
