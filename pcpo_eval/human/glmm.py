"""The human study's mixed logistic model of one comparison, on the lme4-style front end.

``A chosen ~ 1 + side + (1|rater) + (1|prompt)`` (binomial logit, Laplace, as lme4's ``glmer``)
over the decisive answers of ``"A vs B"``, fitted by :func:`pcpo_eval.stats.glmer.fit_glmm`;
``side`` = +0.5 if A was shown left, -0.5 if right, so ``exp(intercept)`` is the odds of choosing
A at no side advantage. Wald t tests with between-within df
(:func:`pcpo_eval.stats.glmer.between_within_df`), or by likelihood ratio beyond
:data:`WALD_LOG_ODDS_LIMIT` (Hauck-Donner); what that test detects at the study family's
level is the analysis' (:func:`pcpo_eval.human.analysis.detectable_win_rate`, from ``se`` and ``df``).
Not estimable (``p = None`` and a reason, never a made-up p) with fewer than 2 raters, fewer than :data:`MIN_DECISIVE` decisive answers, every answer
one way, or a fit that does not converge.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import ALPHA

MIN_DECISIVE = 10  # decisive answers below which the mixed model is not fitted


def _not_estimable(reason: str, **extra: Any) -> dict[str, Any]:
    return {"estimable": False, "odds_ratio_a": None, "ci95": [None, None], "p": None, "reason": reason,
            **extra}


#: |log-odds of choosing A| above which the intercept is tested by likelihood ratio instead of Wald: far from
#: 0 the Wald SE grows faster than the estimate (Hauck & Donner 1977), so near-unanimous answers tested
#: weaker than unanimous ones: 285 of 285 answers for A gave "Raters preferred A", 283 of 285 (the other 2
#: from one rater, whose fitted SD went to 7.2) Wald p 0.028 and "No evidence" after Holm (the human-study
#: review's ``repro_hauck_donner.py``; R's glmer gives the same estimate and SE). 3 is a win rate of 0.95.
WALD_LOG_ODDS_LIMIT = 3.0


def _lrt_p(fit: Any, terms: list[str], data: pd.DataFrame) -> float | None:
    """p of the likelihood-ratio test of the intercept (deviance of ``chosen ~ 0 + side + ...`` minus the
    full model's, chi-square 1 df); None where the null model has no fixed effect or does not fit."""
    from scipy.stats import chi2

    from pcpo_eval.stats.glmer import fit_glmm

    if "side" not in terms:
        return None
    try:
        null = fit_glmm("chosen ~ 0 + " + " + ".join(t for t in terms if t != "1"), data)
    except UserError:
        return None
    if not null.estimable:
        return None
    return float(chi2.sf(max(null.fit.deviance - fit.fit.deviance, 0.0), 1))


def mixed_model(dec: pd.DataFrame, a: str) -> dict[str, Any]:
    """``A chosen ~ 1 + side + (1|rater) + (1|prompt)`` over decisive answers of one comparison.

    ``side`` = +0.5 if A was shown left, -0.5 if right; dropped if A was always on one side. A
    grouping with a single level (one prompt) is dropped too (noted); fewer than 2 raters, fewer
    than :data:`MIN_DECISIVE` answers, all answers one way or no convergence: not estimable.
    """
    from scipy.stats import t as student_t

    from pcpo_eval.stats.glmer import between_within_df, fit_glmm

    n, n_raters, n_prompts = len(dec), dec.rater_id.nunique(), dec.prompt_id.nunique()
    sizes = {"n": n, "n_raters": n_raters, "n_prompts": n_prompts}
    y = ((dec.choice == "left") == (dec.left_method == a)).to_numpy(float)
    if n_raters < 2:
        return _not_estimable(f"{n_raters} rater(s): a rater random effect needs at least 2", **sizes)
    if n < MIN_DECISIVE:
        return _not_estimable(f"{n} decisive answers (fewer than {MIN_DECISIVE})", **sizes)
    if y.min() == y.max():
        return _not_estimable(f"all {n} decisive answers chose {'A' if y[0] else 'B'} (separation)", **sizes)
    side = np.where(dec.left_method == a, 0.5, -0.5)
    data = pd.DataFrame({"chosen": y, "side": side, "rater": dec.rater_id.to_numpy(),
                         "prompt": dec.prompt_id.astype(str).to_numpy()})
    terms, notes = ["1"], []
    if np.unique(side).size > 1:
        terms.append("side")
    else:
        notes.append("A was always on one side: no side term")
    terms.append("(1|rater)")
    if n_prompts > 1:
        terms.append("(1|prompt)")
    else:
        notes.append("a single prompt: no prompt random effect")
    try:
        fit = fit_glmm("chosen ~ " + " + ".join(terms), data)
    except UserError as exc:
        return _not_estimable(f"model not estimable: {exc}", **sizes)
    if not fit.estimable:
        return _not_estimable(f"model did not converge: {fit.message}", **sizes)
    b, se = float(fit.beta[0]), float(fit.se[0])
    df = between_within_df({g: data[g].to_numpy() for g in fit.groups})
    tq = float(student_t.ppf(1 - ALPHA / 2, df))
    has_side = "side" in fit.names
    p = float(2 * student_t.sf(abs(b / se), df))
    test = f"Wald t with between-within df = {df} (levels of the smallest grouping factor - 1)"
    p_lrt = _lrt_p(fit, terms, data) if abs(b) > WALD_LOG_ODDS_LIMIT else None
    ci95: list[float | None] = [math.exp(b - tq * se), math.exp(b + tq * se)]
    if p_lrt is not None:  # the Wald interval is as unreliable there as the Wald p: not printed beside the LR p
        p, test = p_lrt, (f"likelihood ratio (chi-square, 1 df) against the model without the intercept: |log-odds| "
                          f"{abs(b):.1f} > {WALD_LOG_ODDS_LIMIT:g}, where the Wald test loses power (Hauck-Donner); "
                          "no Wald CI")
        ci95 = [None, None]
    return {
        "estimable": True, "odds_ratio_a": math.exp(b),
        "ci95": ci95,
        "p": p, "p_wald_z": float(fit.p[0]), "p_lrt": p_lrt, "df": df, "test": test,
        "log_odds_a": b, "se": se, "reason": None, **sizes,
        "side_log_odds": float(fit.beta[1]) if has_side else None,
        "side_p": float(2 * student_t.sf(abs(fit.z[1]), df)) if has_side else None,
        "random_sd": fit.random_sd, "singular": fit.singular, "message": fit.message, "notes": notes,
        "formula": "A chosen ~ 1 + side + (1|rater) + (1|prompt), binomial logit, Laplace (lme4 glmer)",
    }
