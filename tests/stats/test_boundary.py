"""The algorithm term when the run variance is estimated at 0 (pcpo_eval/stats/boundary.py).

lmerTest (and fit_lmm) then tests the algorithm effect against the residual; on balanced data that is
the "sometimes pool" rule, whose A/A rate exceeds the small levels a Holm family tests at. The study
tests it on the run means instead. Checked here: the fit path reproduces both rules to 1e-6 on
balanced data (so the rates below are the fit path's), the rates, the power, and the study's wiring.
"""

from __future__ import annotations

import functools
import sys
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd
import pytest
from scipy import stats

from pcpo_eval.stats import fit_lmm
from pcpo_eval.stats.boundary import run_level_at_boundary, run_variance_at_zero

sys.path.insert(0, str(Path(__file__).resolve().parents[2] / "benchmarks"))
from bench_lmm_boundary import draw  # noqa: E402

N_DRAWS = 200_000


def _anova(d: pd.DataFrame, k: int) -> tuple[float, float, bool]:
    """(lmerTest's p by the balanced ANOVA rule, run-means t p, run MS <= residual MS) of arm B - A,
    per-prompt rows (one per run x prompt)."""
    y = d.pivot(index="run", columns="prompt", values="value").to_numpy()
    arm = np.array([r.startswith("B") for r in d.pivot(index="run", columns="prompt", values="value").index])
    p_ = y.shape[1]
    g = y.mean(1)
    ssr = p_ * sum(((g[arm == a] - g[arm == a].mean()) ** 2).sum() for a in (False, True))
    resid = y - y.mean(1, keepdims=True) - y.mean(0, keepdims=True) + y.mean()
    sse, dfr, dfe = float((resid**2).sum()), 2 * k - 2, (2 * k - 1) * (p_ - 1)
    diff = g[arm].mean() - g[~arm].mean()
    p_run = 2 * stats.t.sf(abs(diff) / np.sqrt(2 * ssr / dfr / (k * p_)), dfr)
    zero = ssr / dfr <= sse / dfe
    p_pool = 2 * stats.t.sf(abs(diff) / np.sqrt(2 * (ssr + sse) / (dfr + dfe) / (k * p_)), dfr + dfe)
    return (p_pool if zero else p_run), p_run, zero


@pytest.mark.parametrize("seed", range(6))
def test_fit_path_is_the_anova_rule_and_the_study_p_the_run_means_t(seed):
    rng = np.random.default_rng([20261127, seed])
    d = draw(rng, 3, 12, 4, 0.0, "prompt")
    f = fit_lmm(d, "value ~ algorithm", ["prompt", "run"], coding="treatment", diagnostics=False)
    g = run_level_at_boundary(f, d, "value ~ algorithm", ["prompt", "run"], "treatment")
    p_lmer, p_run, zero = _anova(d, 3)
    assert run_variance_at_zero(f) == zero
    assert f.term("algorithm[T.B]").p == pytest.approx(p_lmer, rel=1e-5)  # the engine stays lmerTest
    assert g.term("algorithm[T.B]").p == pytest.approx(p_run, rel=1e-5)  # the study: runs are the replicates
    assert g.term("algorithm[T.B]").df == pytest.approx(4.0, abs=1e-5)
    assert (g is f) == (not zero)
    if zero:
        assert f.term("algorithm[T.B]").df > 30
        assert "tested on the 6 run means (t, df 4)" in g.remarks[-1] and "lmerTest's p" in g.remarks[-1]
        assert not any("as lmerTest" in r for r in g.remarks) and any("as lmerTest" in r for r in f.remarks)


def test_seeds_above_cover_both_cases():
    zs = [_anova(draw(np.random.default_rng([20261127, s]), 3, 12, 4, 0.0, "prompt"), 3)[2] for s in range(6)]
    assert 0 < sum(zs) < len(zs)


def test_per_image_rows_with_image_intercept():
    for s in range(2):
        d = draw(np.random.default_rng([7, s]), 3, 6, 4, 0.0, "image")
        groups = ["prompt", "image", "run"]
        f = fit_lmm(d, "value ~ algorithm", groups, coding="sum", diagnostics=False)
        g = run_level_at_boundary(f, d, "value ~ algorithm", groups, "sum")
        m = d.groupby(["algorithm", "run"])["value"].mean()
        assert g.fixed[1].p == pytest.approx(stats.ttest_ind(m["B"], m["A"]).pvalue, rel=1e-5)


@functools.cache
def _ps(k: int, c: float, plant: float, n: int = N_DRAWS) -> tuple[np.ndarray, np.ndarray]:
    """(lmerTest rule, run-means t) p-values from mean-square draws of the balanced design, 12 prompts
    (the rules the first test checks against the fit path)."""
    rng = np.random.default_rng([20261128, k, int(10 * c), int(10 * plant)])
    dfr, dfe, e = 2 * k - 2, (2 * k - 1) * 11, 1 + c
    d2 = (rng.standard_normal(n) + plant) ** 2 * e
    msr, mse = e * rng.chisquare(dfr, n) / dfr, rng.chisquare(dfe, n) / dfe
    pool = (dfr * msr + dfe * mse) / (dfr + dfe)
    p_run = 2 * stats.t.sf(np.sqrt(d2 / msr), dfr)
    p_old = np.where(msr <= mse, 2 * stats.t.sf(np.sqrt(d2 / pool), dfr + dfe), p_run)
    return p_old, p_run


def _rates(k: int, c: float, alpha: float, plant: float) -> tuple[float, float]:
    p_old, p_run = _ps(k, c, plant)
    return float(np.mean(p_old < alpha)), float(np.mean(p_run < alpha))


@pytest.mark.parametrize("alpha", [0.05, 0.0125, 0.005])
@pytest.mark.parametrize("c", [0.0, 1.0, 2.0, 5.0])
def test_aa_rate_at_family_levels(alpha, c):
    old, new = _rates(3, c, alpha, 0.0)
    se = np.sqrt(alpha * (1 - alpha) / N_DRAWS)
    assert new <= alpha + 3 * se  # the study's test: at nominal at every c and level
    if c in (1.0, 2.0) and alpha < 0.05:
        assert old > 1.3 * alpha  # lmerTest's rule: 1.6-3.1 x alpha at these levels


@pytest.mark.parametrize("c", [0.0, 2.0])
def test_power_at_alpha_05_nearly_unchanged(c):
    old, new = _rates(3, c, 0.05, 3.0)
    assert new > 0.6 and new > old - 0.025  # 3 SEs planted: 62% either way, at most 1.8 points lost


def test_planted_effect_found_through_fit_path():
    hits = 0
    for s in range(4):
        d = draw(np.random.default_rng([11, s]), 3, 12, 4, 0.0, "prompt", plant=8.0)
        f = fit_lmm(d, "value ~ algorithm", ["prompt", "run"], coding="treatment", diagnostics=False)
        g = run_level_at_boundary(f, d, "value ~ algorithm", ["prompt", "run"], "treatment")
        hits += g.term("algorithm[T.B]").p < 0.05
    assert hits == 4


def test_within_run_covariate_and_no_run_group_leave_the_fit_alone():
    d = draw(np.random.default_rng([20261127, 0]), 3, 12, 4, 0.0, "prompt")
    assert _anova(d, 3)[2]  # this draw's run variance is at 0
    d["x"] = np.random.default_rng(3).normal(size=len(d))
    f = fit_lmm(d, "value ~ algorithm + x", ["prompt", "run"], diagnostics=False)
    assert run_level_at_boundary(f, d, "value ~ algorithm + x", ["prompt", "run"]) is f
    f = fit_lmm(d, "value ~ algorithm", ["prompt"], diagnostics=False)
    assert run_level_at_boundary(f, d, "value ~ algorithm", ["prompt"]) is f


def test_study_lmm_tables_and_bold_rows_use_the_run_means_at_the_boundary():
    from pcpo_eval.study.image_metrics import _simple_effect, fit_metric_lmms, lmm_setup

    d = draw(np.random.default_rng([20261127, 0]), 3, 12, 4, 0.0, "prompt").rename(columns={"value": "m1"})
    d["m2"] = draw(np.random.default_rng([20261127, 2]), 3, 12, 4, 20.0, "prompt")["value"]
    setup = lmm_setup("value ~ algorithm", ["prompt"], None, 3)
    fits, adjusted = fit_metric_lmms({m: (d, setup) for m in ("m1", "m2")}, "treatment")
    fe = {m: next(x for x in fits[m]["fixed"] if x["term"] == "algorithm[T.B]") for m in fits}
    m = d.groupby(["algorithm", "run"])["m1"].mean()
    assert fe["m1"]["df"] == pytest.approx(4.0) and any("run means" in r for r in fits["m1"]["remarks"])
    assert fe["m1"]["p"] == pytest.approx(stats.ttest_ind(m["B"], m["A"]).pvalue, rel=1e-6)
    assert adjusted["m1"]["algorithm[T.B]"]["p"] == pytest.approx(fe["m1"]["p"])
    assert not any("run means" in r for r in fits["m2"]["remarks"])  # run variance above 0: lmerTest's
    sp = SimpleNamespace(compare_factor="algorithm", pcpo="B", baseline="A", lmm=SimpleNamespace(alpha=0.05))
    f, row = _simple_effect(sp, d, "m1", setup)
    assert row["p"] == pytest.approx(fe["m1"]["p"], rel=1e-6) and row["df"] == pytest.approx(4.0)
    assert "run means" in row["method"]


@pytest.mark.parametrize("many", [False, True])
def test_lmm_command_says_what_a_study_would_report_at_the_boundary(cli, tmp_path, many):
    """``pcpo-eval lmm`` keeps lmerTest's numbers but, where a study would test on the run means (run
    variance at 0, the effect constant within runs), warns with the run-mean test's p (a consistency
    review found p 0.023 on 79 df printed alone where the study reported p 0.061 on 4 df)."""
    import json

    seeds = [s for s in range(6) if _anova(draw(np.random.default_rng([20261127, s]), 3, 12, 4, 0.0, "prompt"), 3)[2]]
    kept = [s for s in range(6) if s not in seeds]
    for s, at_zero in ((seeds[0], True), (kept[0], False)):
        d = draw(np.random.default_rng([20261127, s]), 3, 12, 4, 0.0, "prompt")
        data = tmp_path / f"d{s}.csv"
        d.to_csv(data, index=False)
        args = ["lmm", data, "--group", "prompt", "--group", "run", "--json"]
        args += ["--formula", "y ~ algorithm", "--response", "value"] if many else ["--formula", "value ~ algorithm"]
        res = cli(*args)
        assert res.returncode == 0, res.stderr
        out = json.loads(res.stdout)
        f = fit_lmm(d, "value ~ algorithm", ["prompt", "run"], coding="treatment", diagnostics=False)
        g = run_level_at_boundary(f, d, "value ~ algorithm", ["prompt", "run"], "treatment")
        fixed = out["metrics"]["value"]["fixed"] if many else out["fixed"]
        assert fixed["algorithm[T.B]"]["p"] == pytest.approx(f.term("algorithm[T.B]").p, rel=1e-6)  # still lmerTest
        if at_zero:
            tests = out["run_means"]["value"] if many else out["run_means"]
            assert tests["algorithm[T.B]"]["p"] == pytest.approx(g.term("algorithm[T.B]").p, rel=1e-9)
            assert tests["algorithm[T.B]"]["df"] == 4
            (w,) = [w for w in out["warnings"] if "estimated at 0" in w]
            assert "tested on the 6 run means (t, df 4), as a study reports them: algorithm[T.B] p " in w
            assert "(Intercept)" not in w
        else:
            assert "run_means" not in out and not any("estimated at 0" in w for w in out["warnings"])
