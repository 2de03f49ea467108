"""Fixed effects that are constant within runs, when the run variance is estimated at 0.

lmerTest (and :func:`pcpo_eval.stats.lmm.fit_lmm`, which matches it) tests every fixed effect
against the residual once the REML run variance sits on the boundary: the Satterthwaite df of the
algorithm term jumps from runs - 2 to the number of rows. On balanced data that is the classic
"sometimes pool" rule (pool the between-run mean square into the residual when it is the smaller
one), and it is anticonservative at the small levels a multiplicity family tests at: with 3 runs
per arm and a run variance of about 2 sigma^2 / (rows per run), the A/A rate of the algorithm term
is 1.06 x alpha at alpha = 0.05, 1.7 x at 0.0125 and 2.9 x at 0.005 (the first Holm step of 4 and
10 rows; ``benchmarks/bench_lmm_boundary.py``, docs/statistics.md).

:func:`run_level_at_boundary` is what the study reports instead: when the variance of ``run`` is
at 0 and every fixed-effects column is constant within each run, the fixed effects are tested on
the run means (ordinary least squares of the runs' mean responses on the same design, one row per
run; t with runs - p df), so the runs are the replicates whether or not their variance was
estimated above 0. On balanced data the REML test with a positive run variance IS this test
(SE from the between-run mean square, df runs - p), so the decision is the run-level test
throughout and its A/A rate is alpha at every level. The engine's own numbers stay lmerTest's.
"""

from __future__ import annotations

import dataclasses

import numpy as np
import pandas as pd

from pcpo_eval.stats.design import build_design
from pcpo_eval.stats.lmm import LMMResult, _fixed_effects_table
from pcpo_eval.stats.lmm_core import SINGULAR_TOL


def run_variance_at_zero(fit: LMMResult, run: str = "run") -> bool:
    """True when ``fit`` has the random intercept ``run`` and its SD is estimated at 0 (lme4's
    ``isSingular`` tolerance on the relative factor, 1e-4)."""
    sd, res = fit.random_sd.get(run), fit.random_sd.get("Residual")
    return sd is not None and res is not None and res > 0 and sd < SINGULAR_TOL * res


def run_level_at_boundary(fit: LMMResult, data: pd.DataFrame, formula: str, groups: list[str],
                          coding: str = "treatment", run: str = "run") -> LMMResult:
    """``fit`` itself, or, when the variance of ``run`` is estimated at 0 and every fixed-effects column
    is constant within each run, ``fit`` with its fixed effects tested on the run means (estimate, SE,
    df = runs - p, t, p, CIs) and a remark quoting lmerTest's p-values. Unchanged when the run design
    leaves no residual df or no spread (then lmerTest's test is kept as it is)."""
    if run not in groups or not run_variance_at_zero(fit, run):
        return fit
    d = build_design(data, formula, list(groups), coding)
    codes, runs = pd.factorize(data[run], sort=True)
    n_runs, k = len(runs), d.X.shape[1]
    xr = np.zeros((n_runs, k))
    for j in range(n_runs):
        rows = d.X[codes == j]
        if np.ptp(rows, axis=0).max(initial=0.0) > 0.0:  # a within-run covariate: the LMM's business
            return fit
        xr[j] = rows[0]
    ybar = np.bincount(codes, weights=d.y, minlength=n_runs) / np.bincount(codes, minlength=n_runs)
    df = n_runs - k
    if df < 1 or np.linalg.matrix_rank(xr) < k:
        return fit
    beta, *_ = np.linalg.lstsq(xr, ybar, rcond=None)
    resid = ybar - xr @ beta
    s2 = float(resid @ resid) / df
    if not s2 > 0.0:  # run means fitted exactly: no spread to test against
        return fit
    se = np.sqrt(s2 * np.diag(np.linalg.inv(xr.T @ xr)))
    names = [fe.term for fe in fit.fixed]
    fixed = _fixed_effects_table(names, beta, se, np.full(k, float(df)))
    old = ", ".join(f"{fe.term} {fe.p:.3g}" for fe in fit.fixed if np.isfinite(fe.p))
    remark = (f"variance of {run} estimated at 0: fixed effects tested on the {n_runs} {run} means "
              f"(t, df {df}), not against the residual (lmerTest's p: {old})")
    kept = tuple(r.replace("; fixed-effect tests as lmerTest", "") for r in fit.remarks)  # no longer true
    return dataclasses.replace(fit, fixed=fixed, remarks=(*kept, remark))



def run_means_warning(fit: LMMResult, data: pd.DataFrame, formula: str, groups: list[str],
                      coding: str = "treatment") -> tuple[str | None, dict[str, dict[str, float]] | None]:
    """What ``pcpo-eval lmm`` says where a study would test on run means: for the first group whose
    variance is estimated at 0 while every fixed effect is constant within it (:func:`run_level_at_boundary`
    with that group as the run), a warning naming lmerTest's residual df and the run-mean test's p per
    term, and those tests (estimate, se, df, p); (None, None) elsewhere. The command's own numbers stay
    lmerTest's; before, it printed them alone (p 0.023 on 79 df for 6 runs where a study, on the run
    means, found p 0.061 on 4 df) and a reader saw two answers to one question."""
    for g in groups:
        alt = run_level_at_boundary(fit, data, formula, groups, coding, run=g)
        if alt is fit:
            continue
        lmer = {fe.term: fe for fe in fit.fixed}
        terms = {fe.term: {"estimate": fe.estimate, "se": fe.se, "df": fe.df, "p": fe.p} for fe in alt.fixed}
        shown = [t for t in terms if t not in ("Intercept", "(Intercept)")] or list(terms)
        said = "; ".join(f"{t} p {terms[t]['p']:.3g} (lmerTest {lmer[t].p:.3g} on {lmer[t].df:.3g} df)" for t in shown)
        n = int(data[g].nunique())
        return (f"{formula.split('~', 1)[0].strip()}: the variance of {g} is estimated at 0 and every fixed effect is "
                f"constant within {g}, so lmerTest (the numbers below) tests them against the residual as if the rows "
                f"of one {g} were independent; tested on the {n} {g} means (t, df {n - len(terms)}), as a study "
                f"reports them: {said}"), terms
    return None, None
