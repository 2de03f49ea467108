"""Analysis of a pairwise human preference study: checks, win rates, mixed model, Bradley-Terry, agreement.

Input: the pairs table and the responses (columns and conventions: :mod:`pcpo_eval.human`).
Output of :func:`analyze`: one JSON-serialisable dict (``None`` wherever a number does not exist).

* **Attention checks** (per rater). ``degraded`` pairs: choosing anything but ``expected`` (the
  undegraded side), a tie included, is a failure; raters with more than ``max_degraded_failures``
  failures are excluded from every other analysis (``exclude_failed``), listed with the reason.
  Raters who answered no degraded check are listed as ``unscreened`` (kept: nothing excludes them),
  and raters whose median answer came within ``FAST_SECONDS`` of its page as ``fast`` (kept).
  ``identical`` pairs: a side pick is *not* a failure; the share of non-tie answers calibrates how
  often raters pick a side when there is nothing to see.
* **Side bias**: the share of ``left`` among decisive ``main`` answers, exact (Clopper-Pearson)
  95% CI and exact two-sided binomial p against 1/2.
* **Per comparison** ``"A vs B"`` (A = the method named first): A wins, B wins, ties. The win rate
  of A among decisive answers with its Clopper-Pearson 95% CI and the exact two-sided binomial p
  (``scipy.stats.binomtest``); ties are excluded from that test and the output says so. Also the
  win rate with ties as half a win. A mixed logistic model (:func:`pcpo_eval.human.glmm.mixed_model`
  on :func:`pcpo_eval.stats.glmer.fit_glmm`, lme4's ``glmer``): ``A chosen ~ 1 + side + (1|rater) + (1|prompt)`` over decisive answers, side
  = +0.5 if A was shown left, -0.5 if right, so ``exp(intercept)`` is the odds of choosing A at
  no side advantage; its Wald 95% CI and p. It is not estimable (``p = None`` and a reason, never a
  made-up p) with fewer than 2 raters, fewer than :data:`MIN_DECISIVE` decisive answers, every
  answer one way, or a fit that does not converge. The verdict uses the mixed-model p when
  estimable, else the binomial p (but no p at all when one rater gave every decisive answer:
  :data:`ONE_RATER`), says which, and says "no evidence of a preference" unless that
  p, Holm-adjusted over the study's main comparisons (one family per study, :func:`study_family`),
  is below :data:`ALPHA`; it also says which win rate that test would detect with 80% power at the
  family's level ``ALPHA / m`` with the answers it had (``mde_win_rate``, :func:`detectable_win_rate`).
* **Bradley-Terry** (more than two methods across main comparisons): maximum-likelihood
  log-strengths by the MM algorithm (Hunter 2004, "MM algorithms for generalized Bradley-Terry
  models", Ann. Stat. 32(1), eq. 3) with ties as half a win to each side (as Chatbot Arena),
  anchored at 0 for the first method in sorted order, also on Chatbot Arena's Elo-like scale
  ``400 / ln 10 * s + 1000``; 95% percentile bootstrap CIs by resampling responses with
  replacement; the predicted win-probability matrix ``P(row beats column)``.
* **Agreement** over main pairs rated by >= 2 (retained) raters: Krippendorff's alpha for nominal
  data over {left, right, tie} from the coincidence matrix (Krippendorff 2011, "Computing
  Krippendorff's Alpha-Reliability", any number of raters per unit), and raw percent agreement:
  the share of agreeing rater pairs, pooled over all pairs of ratings of the same pair.

The general formulas (Clopper-Pearson, exact binomial p, Bradley-Terry MM and bootstrap,
Krippendorff's alpha) live in :mod:`pcpo_eval.stats.pairwise`; the mixed model in
:mod:`pcpo_eval.human.glmm`; table validation in :mod:`pcpo_eval.human.tables`;
:func:`~pcpo_eval.human.simulate.simulate_responses` (simulated raters) in
:mod:`pcpo_eval.human.simulate`. Their public names are re-exported here.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.human import ALPHA, CHOICES
from pcpo_eval.human.glmm import MIN_DECISIVE, mixed_model
from pcpo_eval.human.simulate import simulate_responses
from pcpo_eval.human.tables import (
    NEEDED_PAIR_COLUMNS,
    NEEDED_RESPONSE_COLUMNS,
    parse_comparison,
    validate_pairs,
    validate_responses,
)
from pcpo_eval.io import to_jsonable
from pcpo_eval.stats.pairwise import (
    binomial_mde,
    binomial_p,
    clopper_pearson,
    fit_bradley_terry,
    krippendorff_alpha_from_counts,
    krippendorff_alpha_nominal,
    percent_agreement,
)
from pcpo_eval.stats.pairwise import rate as _rate

__all__ = [  # the analysis, and the moved names its callers import from here
    "ALPHA", "MIN_DECISIVE", "NEEDED_PAIR_COLUMNS", "NEEDED_RESPONSE_COLUMNS", "agreement", "analyze",
    "attention_checks", "binomial_p", "bradley_terry", "clopper_pearson", "compare",
    "krippendorff_alpha_nominal", "mixed_model", "parse_comparison", "side_bias", "simulate_responses",
    "study_family",
    "verdict_sentence",
]


# -- attention checks and side bias -------------------------------------------------------------


#: ``p_source`` of a comparison whose decisive answers all come from one rater: no p, no verdict. Its
#: binomial p tests that rater's own preference; with rater-to-rater spread (log-odds SD 0.3, as the
#: simulator) one rater answering 450 pairs per comparison made "Raters preferred" of 60% of A/A studies
ONE_RATER = "none: one rater"

#: a rater whose median answer came this many seconds or fewer after the page was served is listed as
#: ``fast`` (a look at two images and a click takes longer; the answers are kept)
FAST_SECONDS = 1.0


def _median_seconds(merged: pd.DataFrame) -> pd.Series:
    """Per rater the median seconds from page to answer (NaN where not recorded: older databases)."""
    if "seconds" not in merged.columns:
        return pd.Series(np.nan, index=sorted(merged.rater_id.unique()))
    return pd.to_numeric(merged.seconds, errors="coerce").groupby(merged.rater_id, sort=True).median()


def attention_checks(merged: pd.DataFrame, max_degraded_failures: int) -> list[dict[str, Any]]:
    """Per rater: degraded checks seen / failed, identical checks seen / answered with a side, median
    seconds from page to answer.

    ``unscreened``: the rater answered no degraded check, so the checks could not exclude them
    (their answers are kept; the analysis lists them under ``attention_checks.unscreened``).
    ``fast``: the median answer came within :data:`FAST_SECONDS` of its page (listed, kept)."""
    deg, ide = merged.kind == "degraded", merged.kind == "identical"
    flags = pd.DataFrame({
        "rater_id": merged.rater_id, "n_responses": 1, "degraded_seen": deg,
        "degraded_failed": deg & (merged.choice != merged.expected),
        "identical_seen": ide, "identical_non_tie": ide & (merged.choice != "tie"),
    })
    counts = flags.groupby("rater_id", sort=True).sum()
    names = merged.groupby("rater_id", sort=True).rater.first()
    secs = _median_seconds(merged)
    out = []
    for rid, row in counts.iterrows():
        c = {k: int(v) for k, v in row.items()}
        excluded = c["degraded_failed"] > max_degraded_failures
        reason = (f"failed {c['degraded_failed']} of {c['degraded_seen']} degraded checks "
                  f"(more than {max_degraded_failures})")
        med = float(secs.get(rid, np.nan))
        out.append({"rater_id": rid, "rater": str(names[rid]), **c, "fails_checks": excluded,
                    "reason": reason if excluded else None, "unscreened": c["degraded_seen"] == 0,
                    "median_seconds": med if np.isfinite(med) else None,
                    "fast": bool(np.isfinite(med) and med <= FAST_SECONDS)})
    return out


def side_bias(main: pd.DataFrame) -> dict[str, Any]:
    """Share of ``left`` among decisive main answers, Clopper-Pearson CI, binomial p against 1/2."""
    dec = main[main.choice != "tie"]
    k, n = int((dec.choice == "left").sum()), len(dec)
    lo, hi = clopper_pearson(k, n)
    return {"n_decisive": n, "left": k, "share_left": _rate(k, n), "ci95": [lo, hi], "p": binomial_p(k, n),
            "note": "share of 'left' among decisive main answers; 0.5 = no side bias"}


# -- per comparison -----------------------------------------------------------------------------


def _fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None else f"{lo:.2f}-{hi:.2f}"


def detectable_win_rate(c: dict[str, Any], level: float = ALPHA) -> float | None:
    """The win rate of A (above 1/2; 1 minus it below) that the verdict's test detects with 80% power
    at test level ``level`` (the study family's ``alpha / m``, :func:`study_family`) with the answers
    this study has: with the mixed model, the inverse logit of its Wald t MDE on the log-odds
    (:func:`pcpo_eval.stats.power.mde_from_se` at the fitted SE and df: a typical rater and prompt, no
    side advantage); with the binomial test, its exact MDE at ``n_decisive``
    (:func:`pcpo_eval.stats.pairwise.binomial_mde`). None where no rate up to 1 is detectable."""
    from pcpo_eval.stats.power import mde_from_se

    mm = c["mixed_model"]
    if c["p_source"] == ONE_RATER:
        return None
    if c["p_source"] == "mixed-model":
        d = mde_from_se(float(mm["se"]), float(mm["df"]), alpha=level)
        return None if d is None else 1.0 / (1.0 + math.exp(-d))
    return binomial_mde(c["n_decisive"], level)


def _power_txt(c: dict[str, Any]) -> str:
    q = c.get("mde_win_rate")
    m = int(c.get("family_size") or 1)
    how = "detectable at 80% power" + (f" after Holm over the {m} comparisons" if m > 1 else "")
    if q is None:
        return f"; no win rate is {how} with {'one rater' if c.get('p_source') == ONE_RATER else 'these answers'}"
    return f"; {how}: a win rate of {q:.2f} (or {1 - q:.2f})"


def verdict_sentence(c: dict[str, Any]) -> str:
    """One line: a preference only when the chosen p, Holm-adjusted over the study's comparisons
    (``p_holm``, :func:`study_family`), is below :data:`ALPHA`, else "no evidence"."""
    a, b = c["a"], c["b"]
    if c["n_decisive"] == 0:
        return f"{a} vs {b}: no decisive answers; no evidence of a preference."
    rate = (f"win rate of {a} {c['win_rate_a']:.2f} (95% CI {_fmt_ci(*c['ci95'])}, "
            f"{c['n_decisive']} decisive answers)")
    mm = c["mixed_model"]
    if c["p"] is None:
        return (f"No evidence of a preference between {a} and {b}: {rate}, all from one rater (binomial p = "
                f"{c['p_binomial']:.3g} speaks for that rater only, not for raters; mixed model not estimable: "
                f"{mm['reason']}){_power_txt(c)}.")
    p_txt = f"{c['p_source']} p = {c['p']:.3g}"
    if c.get("p_holm") is not None and int(c.get("family_size") or 1) > 1:
        p_txt += f", Holm-adjusted over the {c['family_size']} comparisons p = {c['p_holm']:.3g}"
    if not mm["estimable"]:
        p_txt += f"; mixed model not estimable: {mm['reason']}"
    if c["significant"]:
        a_ahead = mm["odds_ratio_a"] > 1.0 if c["p_source"] == "mixed-model" else c["win_rate_a"] > 0.5
        winner, loser = (a, b) if a_ahead else (b, a)
        return f"Raters preferred {winner} over {loser}: {rate}, {p_txt}{_power_txt(c)}."
    own = f" (p < {ALPHA:g} alone, but not after Holm over the study's comparisons)" if (
        c["p"] is not None and c["p"] < ALPHA) else ""
    return f"No evidence of a preference between {a} and {b}: {rate}, {p_txt}{_power_txt(c)}{own}."


def compare(main: pd.DataFrame, label: str) -> dict[str, Any]:
    """Counts, exact binomial analysis and mixed model of one comparison ``"A vs B"``; its verdict
    comes with the study's family (:func:`study_family`)."""
    a, b = parse_comparison(label)
    d = main[main.comparison == label]
    chose_a = (d.choice == "left") & (d.left_method == a) | (d.choice == "right") & (d.right_method == a)
    ties = int((d.choice == "tie").sum())
    wa, n = int(chose_a.sum()), len(d)
    wb = n - ties - wa
    nd = wa + wb
    lo, hi = clopper_pearson(wa, nd)
    c = {
        "comparison": label, "a": a, "b": b, "n": n, "a_wins": wa, "b_wins": wb, "ties": ties,
        "n_decisive": nd, "win_rate_a": _rate(wa, nd), "ci95": [lo, hi], "p_binomial": binomial_p(wa, nd),
        "ties_note": f"ties: {ties} of {n}, excluded from the binomial test",
        "win_rate_a_ties_half": _rate(wa + 0.5 * ties, n),
        "mixed_model": mixed_model(d[d.choice != "tie"], a),
    }
    mm = c["mixed_model"]
    if mm["estimable"]:
        c["p"], c["p_source"] = mm["p"], "mixed-model"
    elif d.loc[d.choice != "tie", "rater_id"].nunique() < 2:
        c["p"], c["p_source"] = None, ONE_RATER  # one rater's own preference is no preference of raters
    else:
        c["p"], c["p_source"] = c["p_binomial"], "binomial"
    return c


def study_family(comps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The study's verdicts: ONE multiplicity family over its main comparisons (the paper's bracket
    has two), Holm-adjusted, so raters who see no difference anywhere give "Raters preferred ..." in
    at most :data:`ALPHA` of studies, not one ALPHA per comparison. Sets ``p_holm``, ``family_size``
    (comparisons with a p), ``significant`` (``p_holm < ALPHA``), ``mde_level`` (``ALPHA / m``,
    :func:`pcpo_eval.stats.power.family_level`), ``mde_win_rate`` at that level and ``verdict``."""
    from pcpo_eval.stats.adjust import holm_present
    from pcpo_eval.stats.power import family_level

    adj = holm_present([c["p"] for c in comps])
    m = sum(a is not None for a in adj)
    level = family_level(ALPHA, m)
    out = []
    for c, a in zip(comps, adj, strict=True):
        c = dict(c, p_holm=a, family_size=m, mde_level=level)
        c["significant"] = c["p_holm"] is not None and c["p_holm"] < ALPHA
        c["mde_win_rate"] = detectable_win_rate(c, level)
        c["verdict"] = verdict_sentence(c)
        out.append(c)
    return out


# -- Bradley-Terry ------------------------------------------------------------------------------


def bradley_terry(main: pd.DataFrame, bootstrap: int, seed: int) -> dict[str, Any] | None:
    """Bradley-Terry log-strengths, Elo-like scale, bootstrap CIs and win probabilities (> 2 methods)."""
    ab = [parse_comparison(c) for c in main.comparison]
    methods = sorted({x for pair in ab for x in pair})
    if len(methods) <= 2:
        return None
    pos = {x: i for i, x in enumerate(methods)}
    a = np.array([pos[p[0]] for p in ab])
    b = np.array([pos[p[1]] for p in ab])
    chose_a = ((main.choice == "left") & (main.left_method == [p[0] for p in ab])) | (
        (main.choice == "right") & (main.right_method == [p[0] for p in ab]))
    val = np.where(main.choice == "tie", 0.5, chose_a.astype(float))
    return fit_bradley_terry(a, b, val, methods, bootstrap, seed)


# -- agreement ----------------------------------------------------------------------------------


def agreement(main: pd.DataFrame) -> dict[str, Any]:
    """Krippendorff's alpha (nominal) and pooled pairwise percent agreement over multiply rated pairs."""
    cnt = pd.crosstab(main.pair_id, main.choice).reindex(columns=list(CHOICES), fill_value=0).to_numpy(float)
    cnt = cnt[cnt.sum(axis=1) >= 2] if cnt.size else np.zeros((0, len(CHOICES)))
    note = "main pairs rated by >= 2 retained raters; categories left/right/tie"
    if cnt.shape[0] == 0:
        return {"n_pairs": 0, "n_ratings": 0, "krippendorff_alpha_nominal": None, "percent_agreement": None,
                "reason": "no pair was rated by 2 or more raters", "note": note}
    m = cnt.sum(axis=1)
    agree, total = percent_agreement(cnt)
    alpha = krippendorff_alpha_from_counts(cnt)
    return {
        "n_pairs": int(cnt.shape[0]), "n_ratings": int(m.sum()), "krippendorff_alpha_nominal": alpha,
        "percent_agreement": agree / total, "n_rating_pairs": int(total), "note": note,
        "reason": None if alpha is not None else "every rating in one category: alpha is undefined",
    }


# -- the whole analysis -------------------------------------------------------------------------


def analyze(
    pairs: pd.DataFrame,
    responses: pd.DataFrame,
    *,
    exclude_failed: bool = True,
    max_degraded_failures: int = 0,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The full analysis of a study (module docstring); a JSON-serialisable dict.

    Keys: ``settings``, ``counts``, ``attention_checks`` (``raters``, ``excluded``, ``unscreened``,
    ``identical_non_tie_rate``), ``side_bias``, ``comparisons`` (one dict per comparison, with
    ``verdict``), ``bradley_terry`` (None with <= 2 methods), ``agreement``.
    Bad input raises :class:`UserError`.
    """
    pairs = validate_pairs(pairs)
    resp = validate_responses(responses, pairs)
    merged = resp.merge(pairs.drop(columns=[c for c in ("rater",) if c in pairs.columns]), on="pair_id")
    raters = attention_checks(merged, max_degraded_failures)
    excluded = [{"rater_id": r["rater_id"], "rater": r["rater"], "reason": r["reason"]}
                for r in raters if r["fails_checks"] and exclude_failed]
    unscreened = [{"rater_id": r["rater_id"], "rater": r["rater"]} for r in raters if r["unscreened"]]
    fast = [{"rater_id": r["rater_id"], "rater": r["rater"], "median_seconds": r["median_seconds"]}
            for r in raters if r["fast"]]
    used = merged[~merged.rater_id.isin([e["rater_id"] for e in excluded])]
    main = used[used.kind == "main"]
    ide = merged[merged.kind == "identical"]
    labels = list(dict.fromkeys(pairs.loc[pairs.kind == "main", "comparison"]))
    out = {
        "settings": {"exclude_failed": exclude_failed, "max_degraded_failures": max_degraded_failures,
                     "bootstrap": bootstrap, "seed": seed, "alpha": ALPHA, "min_decisive": MIN_DECISIVE},
        "counts": {"pairs": len(pairs), "responses": len(resp), "raters": resp.rater_id.nunique(),
                   "raters_excluded": len(excluded), "raters_unscreened": len(unscreened), "raters_fast": len(fast),
                   "responses_used": len(used),
                   "main_responses_used": len(main)},
        "attention_checks": {
            "raters": raters, "excluded": excluded, "unscreened": unscreened, "fast": fast,
            "identical_non_tie_rate": _rate(int((ide.choice != "tie").sum()), len(ide)),
            "note": "degraded: any answer but the undegraded side (a tie included) fails; identical: a side "
                    "pick is not a failure, its rate calibrates side-picking when there is nothing to see; "
                    "unscreened: raters who answered no degraded check (the checks could not exclude them; kept); "
                    f"fast: raters whose median answer came within {FAST_SECONDS:g} s of the page (kept)",
        },
        "side_bias": side_bias(main),
        "comparisons": study_family([compare(main, c) for c in labels]),
        "bradley_terry": bradley_terry(main, bootstrap, seed),
        "agreement": agreement(main),
    }
    return to_jsonable(out)
