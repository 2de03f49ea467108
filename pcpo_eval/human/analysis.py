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
* **Revoked raters** (:func:`revocations`): answers stored at or after a rater's revocation (the
  export's ``revoked_at``) are dropped; with ``exclude_revoked`` every answer of a revoked rater.
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
  answer one way, or a fit that does not converge. A rater-level test (:func:`rater_level`): each
  rater's own win rate of A (one number per rater), a one-sample t test of those against 1/2. The
  verdict's p is the larger of the answer-level p (the mixed model's when estimable, else the
  binomial one) and the rater-level p (an intersection-union test: a rater who gives most answers
  cannot carry it alone), no p at all when one rater gave every decisive answer
  (:data:`ONE_RATER`); ``p_source`` says which. It says "no evidence of a preference" unless that p,
  Holm-adjusted over the study's main comparisons (one family per study, :func:`study_family`), is
  below :data:`ALPHA`; it also says which win rate (of a typical rater and prompt) the two tests
  together would detect with 80% power at the family's level ``ALPHA / m`` with the answers it had
  (``mde_win_rate``, :func:`detectable`: where the product of the two tests' powers reaches 80%), and
  when fewer than :data:`FEW_RATERS` raters answered, that the preference rests on that few raters.
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

from pcpo_eval.errors import UserError
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
from pcpo_eval.stats.fmt import p_value
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
    "rater_level", "revocations", "study_family",
    "verdict_sentence",
]


# -- attention checks and side bias -------------------------------------------------------------


#: ``p_source`` of a comparison whose decisive answers all come from one rater: no p, no verdict. Its
#: binomial p tests that rater's own preference; with rater-to-rater spread (log-odds SD 0.3, as the
#: simulator) one rater answering 450 pairs per comparison made "Raters preferred" of 60% of A/A studies
ONE_RATER = "none: one rater"

#: ``p_source`` when the rater-level test (:func:`rater_level`) gave the verdict's p (the larger one)
RATER_LEVEL = "rater-level"

#: with fewer raters than this giving decisive answers in a comparison, the verdict says that a
#: preference of raters rests on that few raters' win rates (a t test with raters - 1 df)
FEW_RATERS = 5

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


#: nodes of the Gauss-Hermite rule (probabilists') that averages a win rate over raters and prompts
_GH_NODES, _GH_WEIGHTS = np.polynomial.hermite_e.hermegauss(40)


def _population_rate(q: float, sd: float) -> float:
    """The mean over raters and prompts of the win rate of a typical rater and prompt ``q``: the mean
    of ``logistic(logit(q) + u)``, u ~ N(0, sd^2) (the mixed model's rater and prompt log-odds SDs
    together), by 40-node Gauss-Hermite quadrature; ``q`` itself at sd 0."""
    if sd <= 0 or not 0.0 < q < 1.0:
        return q
    x = math.log(q / (1.0 - q)) + sd * _GH_NODES
    return float(np.sum(_GH_WEIGHTS * (1.0 / (1.0 + np.exp(-x)))) / np.sum(_GH_WEIGHTS))


def _answers_power(c: dict[str, Any], q: float, level: float) -> float:
    """Power of the answer-level test at level ``level`` when a typical rater and prompt choose A with
    probability ``q``: the mixed model's Wald t (noncentral t at logit(q) / its SE, its df), else the
    exact binomial test at ``n_decisive`` answers."""
    from pcpo_eval.stats.pairwise import binomial_power
    from pcpo_eval.stats.power import power_at

    mm = c["mixed_model"]
    if mm["estimable"]:
        return power_at(abs(math.log(q / (1.0 - q))) / float(mm["se"]), float(mm["df"]), level)
    return binomial_power(q, int(c["n_decisive"]), level)


def _raters_power(c: dict[str, Any], q: float, level: float) -> float:
    """Power of the rater-level t test at level ``level`` when a typical rater and prompt choose A with
    probability ``q`` (1 when every rater had the same win rate: no spread to plan with).

    The raters' mean win rate is then ``m`` = :func:`_population_rate` (q averaged over the mixed
    model's rater and prompt SDs; q when it is not estimable), and the power is the noncentral t's at
    ``(m - 1/2) / SE`` with raters - 1 df, where SE^2 is (1) the raters' squared SE scaled by
    ``df / median(chi2_df)``: the sample SD is below the true SD in more than half of the studies (its
    median is ``sqrt(median(chi2_df) / df)`` of it, 0.976 at 14 df), and unscaled the MDE printed
    by the median study would be the one of a smaller spread than the raters have; plus (2) the
    prompts' share ``(m (1 - m))^2 prompt_sd^2 / prompts``: every rater answers the same prompts, so
    their win rates share the prompts' effects, which the raters' own spread does not show."""
    from scipy.stats import chi2

    from pcpo_eval.stats.power import power_at

    rl, mm = c["rater_level"], c["mixed_model"]
    if not rl["se"]:
        return 1.0
    sds = (mm.get("random_sd") or {}) if mm["estimable"] else {}
    m = _population_rate(q, math.hypot(*map(float, sds.values())) if sds else 0.0)
    df = float(rl["df"])
    se2 = float(rl["se"]) ** 2 * df / float(chi2.median(df))
    if sds.get("prompt") and mm.get("n_prompts"):
        se2 += (m * (1.0 - m)) ** 2 * float(sds["prompt"]) ** 2 / int(mm["n_prompts"])
    return power_at(abs(m - 0.5) / math.sqrt(se2), df, level)


def _rate_at_power(power: Any) -> float | None:
    """The win rate of a typical rater and prompt above 1/2 at which ``power(q)`` (increasing in q)
    reaches :data:`pcpo_eval.stats.power.POWER` (80%); None when no rate below 1 does."""
    from scipy.optimize import brentq

    from pcpo_eval.stats.power import POWER

    lo, hi = 0.5 + 1e-9, 1.0 - 1e-9
    if power(hi) < POWER:
        return None
    return float(brentq(lambda q: power(q) - POWER, lo, hi, xtol=1e-7))


def _answers_mde(c: dict[str, Any], level: float) -> float | None:
    """The win rate the answer-level test alone detects with 80% power at ``level`` (the binomial
    test's exact :func:`pcpo_eval.stats.pairwise.binomial_mde` when the mixed model is not estimable)."""
    if not c["mixed_model"]["estimable"]:
        return binomial_mde(int(c["n_decisive"]), level)
    return _rate_at_power(lambda q: _answers_power(c, q, level))


def _rater_mde(c: dict[str, Any], level: float) -> float | None:
    """The win rate (of a typical rater and prompt) the rater-level t test alone detects with 80%
    power at ``level`` (:func:`_raters_power`); None when no rate below 1 is detectable."""
    return _rate_at_power(lambda q: _raters_power(c, q, level))


def detectable(c: dict[str, Any], level: float = ALPHA) -> tuple[float | None, str | None]:
    """The win rate of A (above 1/2; 1 minus it below) of a typical rater and prompt that the verdict
    detects with 80% power at test level ``level`` (the study family's ``alpha / m``,
    :func:`study_family`) with the answers this study has, and the test that limits it.

    The verdict needs BOTH tests to reject (an intersection-union test), so its power is that of the
    two together, below either's: here the product of the two powers (:func:`_answers_power`,
    :func:`_raters_power`), the rate where that product reaches 80%. The two tests reject together
    more often than independent tests would (both count the same answers), so the product is a lower
    bound of the verdict's power and the rate a conservative one; the larger of the two tests' own
    MDEs (before) was optimistic: a preference planted at it was found in 0.747 [0.693, 0.795] of 300
    simulated studies of 15 raters x 40 answers, not 0.80; now 0.883 [0.841, 0.917], and with one
    rater giving 600 answers and 14 giving 20 0.857 [0.812, 0.894] (0.803 before; benchmarks/RESULTS.md,
    human section). The test that limits it (``source``) is the one with the
    lower power there. Without spread among the raters' win rates the rater-level test does not
    limit it. None where no rate up to 1 is detectable."""
    if c["p_source"] == ONE_RATER:
        return None, None

    def both(q: float) -> float:
        return _answers_power(c, q, level) * _raters_power(c, q, level)

    q = _rate_at_power(both)
    at = 1.0 - 1e-9 if q is None else q
    weaker = RATER_LEVEL if _raters_power(c, at, level) < _answers_power(c, at, level) else c["p_answers_source"]
    return q, weaker


def detectable_win_rate(c: dict[str, Any], level: float = ALPHA) -> float | None:
    """The rate of :func:`detectable` (None where no rate up to 1 is detectable)."""
    return detectable(c, level)[0]


def _power_txt(c: dict[str, Any]) -> str:
    q = c.get("mde_win_rate")
    m = int(c.get("family_size") or 1)
    how = "detectable at 80% power" + (f" after Holm over the {m} comparisons" if m > 1 else "")
    k = (c.get("rater_level") or {}).get("n_raters")
    if c.get("p_source") == ONE_RATER:
        return f"; no win rate is {how} with one rater"
    if q is None:
        return f"; no win rate is {how} with " + (
            f"{k} raters (the rater-level test)" if c.get("mde_source") == RATER_LEVEL else "these answers")
    by = f"; the rater-level test, {k} raters, limits it" if c.get("mde_source") == RATER_LEVEL else ""
    return f"; {how}: a win rate of {q:.2f} (or {1 - q:.2f}) (both tests together{by})"


def _p_txt(c: dict[str, Any]) -> str:
    """How the verdict's p was made: the larger of the answer-level and the rater-level p."""
    rl = c["rater_level"]
    k = rl["n_raters"]
    both = (f"{c['p_answers_source']} p = {p_value(c['p_answers'], ALPHA)} and rater-level p = "
            f"{p_value(rl['p'], ALPHA)} ({k} raters' own win rates of {c['a']}: mean {rl['mean_win_rate']:.2f}, "
            "t test against 0.5)")
    if not c["directions_agree"]:
        txt = f"p = 1 (the two tests point different ways: {both})"
    else:
        txt = f"p = {p_value(c['p'], ALPHA)} (the larger of {both})"
    if c.get("p_holm") is not None and int(c.get("family_size") or 1) > 1:
        txt += f", Holm-adjusted over the {c['family_size']} comparisons p = {p_value(c['p_holm'], ALPHA)}"
    if not c["mixed_model"]["estimable"]:
        txt += f"; mixed model not estimable: {c['mixed_model']['reason']}"
    if k < FEW_RATERS:
        txt += (f"; only {k} raters gave decisive answers: a preference of raters rests on {k} win rates "
                f"(t test with {k - 1} df)")
    return txt


def winner_is_a(c: dict[str, Any]) -> bool:
    """The direction a significant verdict states: the answer-level test's (the mixed model's odds ratio,
    else the pooled win rate), which :func:`compare` requires the rater-level test to share."""
    mm = c["mixed_model"]
    return mm["odds_ratio_a"] > 1.0 if c["p_answers_source"] == "mixed-model" else c["win_rate_a"] > 0.5


def pooled_agrees(c: dict[str, Any]) -> bool:
    """Whether the pooled win rate of A (every decisive answer counted once) leans the verdict's way. It need
    not: 20 raters at 75% A and one rater with 1,000 answers at 20% give a pooled 0.35 beside a significant
    "Raters preferred A" (mixed model and rater-level test); the sentence then says so, and the report does
    not bold that rate."""
    return not c.get("significant") or (c["win_rate_a"] > 0.5) == winner_is_a(c)


def verdict_sentence(c: dict[str, Any]) -> str:
    """One line: a preference only when the chosen p, Holm-adjusted over the study's comparisons
    (``p_holm``, :func:`study_family`), is below :data:`ALPHA`, else "no evidence"."""
    a, b = c["a"], c["b"]
    if c["n_decisive"] == 0:
        return f"{a} vs {b}: no decisive answers; no evidence of a preference."
    rl = c["rater_level"]
    who = (f"spanning the exact interval of the answers and the t interval of {rl['n_raters']} raters' own win "
           "rates" if rl.get("ci95") else "the exact interval of the answers")
    rate = (f"win rate of {a} {c['win_rate_a']:.2f} (95% CI {_fmt_ci(*c['ci95_verdict'])}, {who}; "
            f"{c['n_decisive']} decisive answers)")
    mm = c["mixed_model"]
    if c["p"] is None:
        return (f"No evidence of a preference between {a} and {b}: {rate}, all from one rater (binomial p = "
                f"{p_value(c['p_binomial'], ALPHA)} speaks for that rater only, not for raters; mixed model not estimable: "
                f"{mm['reason']}){_power_txt(c)}.")
    p_txt = _p_txt(c)
    if c["significant"]:
        a_ahead = winner_is_a(c)
        winner, loser = (a, b) if a_ahead else (b, a)
        if not pooled_agrees(c):  # one heavy rater can pull the pooled rate the other way
            return (f"Raters preferred {winner} over {loser} (the mixed model and the raters' own win rates, each "
                    f"rater one number; pooled over answers the {rate} points the other way: a few raters gave "
                    f"most of the answers), {p_txt}{_power_txt(c)}.")
        return f"Raters preferred {winner} over {loser}: {rate}, {p_txt}{_power_txt(c)}."
    own = f" (p < {ALPHA:g} alone, but not after Holm over the study's comparisons)" if (
        c["p"] is not None and c["p"] < ALPHA) else ""
    return f"No evidence of a preference between {a} and {b}: {rate}, {p_txt}{_power_txt(c)}{own}."


def _chose_a(d: pd.DataFrame, a: str) -> pd.Series:
    return (d.choice == "left") & (d.left_method == a) | (d.choice == "right") & (d.right_method == a)


def rater_level(dec: pd.DataFrame, a: str) -> dict[str, Any]:
    """The rater-level test of one comparison: one number per rater, their own win rate of A among
    their decisive answers, and a one-sample t test of those numbers against 1/2 (df = raters - 1),
    each rater counting once however many answers they gave. It asks whether raters, not answers,
    lean one way: a rater who gives most answers is one of k numbers here, while the mixed model (whose
    rater SD is estimated near zero when the other raters give few answers) weights them by their
    answers. Every rater with the same win rate (no spread): t is infinite, p = 0 (1 at exactly 1/2),
    and there is no planning figure (``se`` 0). Fewer than 2 raters: ``p`` None."""
    rates = _chose_a(dec, a).astype(float).groupby(dec.rater_id.to_numpy(), sort=True).mean()
    k = len(rates)
    out: dict[str, Any] = {"n_raters": k, "test": "one-sample t test of the raters' own win rates of A against "
                           "0.5 (one number per rater, df raters - 1)"}
    if k < 2:
        return out | {"p": None, "mean_win_rate": float(rates.mean()) if k else None, "sd": None, "se": None,
                      "df": None, "t": None, "reason": f"{k} rater(s) with decisive answers: needs at least 2"}
    from pcpo_eval.stats.ttest import trimmed_paired_interval  # the one-sample t's home (imports scipy)

    mean, sd = float(rates.mean()), float(rates.std(ddof=1))
    ci = trimmed_paired_interval(rates.to_numpy() - 0.5, trim=0.0, alpha=ALPHA)
    se = ci.se
    if se > 0:
        t, p = ci.estimate / se, ci.p
    else:
        t, p = (0.0, 1.0) if mean == 0.5 else (math.copysign(math.inf, mean - 0.5), 0.0)
    answers = dec.groupby("rater_id").size()
    # the t interval of the raters' mean win rate: the interval of this test, raters as the replicates
    ci95 = [max(0.0, 0.5 + ci.low), min(1.0, 0.5 + ci.high)] if se > 0 else [mean, mean]
    return out | {"p": p, "mean_win_rate": mean, "sd": sd, "se": se, "df": k - 1, "t": t, "reason": None,
                  "ci95": ci95, "min_answers": int(answers.min()), "max_answers": int(answers.max())}


def compare(main: pd.DataFrame, label: str) -> dict[str, Any]:
    """Counts, exact binomial analysis, mixed model and rater-level test of one comparison ``"A vs B"``;
    its verdict comes with the study's family (:func:`study_family`).

    The verdict's ``p``: the answer-level p (``p_answers``: the mixed model's when estimable, else the
    binomial one; ``p_answers_source``) and the rater-level p (:func:`rater_level`), the larger of the
    two (an intersection-union test: "Raters preferred A" needs both, so its level is at most either
    test's); ``p_source`` names the one that gave it. Should the two point different ways (A ahead in
    one, B in the other), no direction is supported: ``p`` = 1. One rater: no p (:data:`ONE_RATER`)."""
    a, b = parse_comparison(label)
    d = main[main.comparison == label]
    chose_a = _chose_a(d, a)
    ties = int((d.choice == "tie").sum())
    wa, n = int(chose_a.sum()), len(d)
    wb = n - ties - wa
    nd = wa + wb
    lo, hi = clopper_pearson(wa, nd)
    dec = d[d.choice != "tie"]
    c = {
        "comparison": label, "a": a, "b": b, "n": n, "a_wins": wa, "b_wins": wb, "ties": ties,
        "n_decisive": nd, "win_rate_a": _rate(wa, nd), "ci95": [lo, hi], "p_binomial": binomial_p(wa, nd),
        "ties_note": f"ties: {ties} of {n}, excluded from the binomial test",
        "win_rate_a_ties_half": _rate(wa + 0.5 * ties, n),
        "mixed_model": mixed_model(dec, a),
        "rater_level": rater_level(dec, a),
    }
    mm, rl = c["mixed_model"], c["rater_level"]
    # the sentence's interval: the hull of the answers' exact one and the raters' t interval. Each alone
    # treats something as independent that is not (answers of one rater; prompts shared by raters): in
    # simulated A/A studies with one rater giving most answers the exact interval excluded 0.5 in 54% of
    # them (benchmarks/bench_human.py --part ci, RESULTS.md)
    c["ci95_verdict"] = ([min(lo, rl["ci95"][0]), max(hi, rl["ci95"][1])] if rl.get("ci95") and lo is not None
                         else [lo, hi])
    if mm["estimable"]:
        c["p_answers"], c["p_answers_source"], ahead = mm["p"], "mixed-model", mm["log_odds_a"]
    else:
        c["p_answers"], c["p_answers_source"] = c["p_binomial"], "binomial"
        ahead = (c["win_rate_a"] - 0.5) if nd else 0.0
    c["directions_agree"] = None
    if rl["p"] is None:  # one rater's own preference is no preference of raters
        c["p"], c["p_source"] = None, ONE_RATER
        return c
    r_ahead = rl["mean_win_rate"] - 0.5
    c["directions_agree"] = not (ahead * r_ahead < 0)
    if not c["directions_agree"]:
        c["p"], c["p_source"] = 1.0, RATER_LEVEL
    elif rl["p"] > c["p_answers"]:
        c["p"], c["p_source"] = rl["p"], RATER_LEVEL
    else:
        c["p"], c["p_source"] = c["p_answers"], c["p_answers_source"]
    return c


def study_family(comps: list[dict[str, Any]]) -> list[dict[str, Any]]:
    """The study's verdicts: ONE multiplicity family over its main comparisons (the paper's bracket
    has two), Holm-adjusted, so raters who see no difference anywhere give "Raters preferred ..." in
    at most :data:`ALPHA` of studies, not one ALPHA per comparison. Sets ``p_holm``, ``family_size``
    (comparisons with a p), ``significant`` (``p_holm < ALPHA``), ``mde_level`` (``ALPHA / m``,
    :func:`pcpo_eval.stats.power.family_level`), ``mde_win_rate`` at that level with ``mde_source``
    (:func:`detectable`; each test's own: ``mde_win_rate_answers``, ``mde_win_rate_raters``) and
    ``verdict``. Each comparison's p is the larger of its answer-level and
    rater-level p (:func:`compare`); Holm adjusts those."""
    from pcpo_eval.stats.adjust import holm_present
    from pcpo_eval.stats.power import family_level

    adj = holm_present([c["p"] for c in comps])
    m = sum(a is not None for a in adj)
    level = family_level(ALPHA, m)
    out = []
    for c, a in zip(comps, adj, strict=True):
        c = dict(c, p_holm=a, family_size=m, mde_level=level)
        c["significant"] = c["p_holm"] is not None and c["p_holm"] < ALPHA
        c["mde_win_rate"], c["mde_source"] = detectable(c, level)
        one = c["p_source"] == ONE_RATER
        c["mde_win_rate_answers"] = None if one else _answers_mde(c, level)
        c["mde_win_rate_raters"] = None if one or not c["rater_level"]["se"] else _rater_mde(c, level)
        c["pooled_agrees"] = pooled_agrees(c)
        c["verdict"] = verdict_sentence(c)
        out.append(c)
    return out


# -- Bradley-Terry ------------------------------------------------------------------------------


def bradley_terry(main: pd.DataFrame, bootstrap: int, seed: int, by_raters: bool = True) -> dict[str, Any] | None:
    """Bradley-Terry log-strengths, Elo-like scale, bootstrap CIs over resampled raters (``by_raters``; else
    over answers, Chatbot Arena's) and win probabilities (> 2 methods)."""
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
    return fit_bradley_terry(a, b, val, methods, bootstrap, seed,
                             clusters=main.rater_id.to_numpy() if by_raters else None)


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


# -- revoked raters -----------------------------------------------------------------------------


def revocations(resp: pd.DataFrame, exclude_revoked: bool) -> tuple[pd.DataFrame, dict[str, Any]]:
    """The responses to analyse and what revocation took out. An answer given on a link that was
    revoked (the export's ``revoked_at``, UTC, per answer: a rater's answers on an earlier link keep
    its revocation after a rotate, those on the new link have none; "" or absent: not revoked, and
    exports made before the column have none) is kept when stored before that time; an answer stored at or after it (a submit in
    flight while the link was revoked) is always dropped, and with ``exclude_revoked`` every answer of
    a revoked rater is (a leaked link: who gave the earlier answers?)."""
    note = ("answers stored at or after a rater's revocation are dropped; those before are kept unless "
            "exclude_revoked (human analyze --exclude-revoked) drops every answer of a revoked rater")
    if "revoked_at" not in resp.columns:
        return resp, {"recorded": False, "exclude_revoked": exclude_revoked, "raters": [], "dropped": 0,
                      "note": "the responses carry no revoked_at column (an export made before it): "
                              "revocation is not known here"}
    raw = resp["revoked_at"].fillna("").astype(str).str.strip()
    at = pd.to_datetime(raw.where(raw != ""), utc=True, errors="coerce", format="ISO8601")
    bad = (raw != "") & at.isna()
    if bad.any():
        raise UserError(f"revoked_at {raw[bad].iloc[0]!r} of rater {resp.rater_id[bad].iloc[0]} is no ISO 8601 "
                        "time; export the responses again (pcpo-eval human export)")
    sub = pd.to_datetime(resp["submitted_at"], utc=True, errors="coerce", format="ISO8601") if (
        "submitted_at" in resp.columns) else pd.Series(pd.NaT, index=resp.index)
    revoked = at.notna()
    after = revoked & sub.notna() & (sub >= at)
    drop = revoked if exclude_revoked else after
    raters = []
    for rid, g in resp[revoked].groupby("rater_id", sort=True):
        raters.append({"rater_id": rid, "rater": str(g.rater.iloc[0]),
                       "revoked_at": ", ".join(sorted(set(raw[g.index]))), "answers": len(g),
                       "after_revocation": int(after[g.index].sum()), "dropped": int(drop[g.index].sum())})
    kept = resp[~drop]
    if len(kept) == 0:
        raise UserError(f"every one of the {len(resp)} responses is from a revoked rater"
                        + (" (--exclude-revoked)" if exclude_revoked else " after their revocation")
                        + "; nothing is left to analyse")
    return kept, {"recorded": True, "exclude_revoked": exclude_revoked, "raters": raters,
                  "dropped": int(drop.sum()), "note": note}


# -- the whole analysis -------------------------------------------------------------------------


def analyze(
    pairs: pd.DataFrame,
    responses: pd.DataFrame,
    *,
    exclude_failed: bool = True,
    max_degraded_failures: int = 0,
    exclude_revoked: bool = False,
    bootstrap: int = 1000,
    seed: int = 0,
) -> dict[str, Any]:
    """The full analysis of a study (module docstring); a JSON-serialisable dict.

    Keys: ``settings``, ``counts``, ``revoked`` (:func:`revocations`: revoked raters, answers
    dropped), ``attention_checks`` (``raters``, ``excluded``, ``unscreened``,
    ``identical_non_tie_rate``), ``side_bias``, ``comparisons`` (one dict per comparison, with
    ``verdict``), ``bradley_terry`` (None with <= 2 methods), ``agreement``.
    Bad input raises :class:`UserError`.
    """
    pairs = validate_pairs(pairs)
    resp, revoked = revocations(validate_responses(responses, pairs), exclude_revoked)
    n_all = len(responses)
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
                     "exclude_revoked": exclude_revoked,
                     "bootstrap": bootstrap, "seed": seed, "alpha": ALPHA, "min_decisive": MIN_DECISIVE},
        "counts": {"pairs": len(pairs), "responses": n_all, "responses_dropped_revoked": revoked["dropped"],
                   "responses_kept": len(resp), "raters_all": int(responses.rater_id.nunique()),
                   "raters": resp.rater_id.nunique(), "raters_revoked": len(revoked["raters"]),
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
        "revoked": revoked,
        "side_bias": side_bias(main),
        "comparisons": study_family([compare(main, c) for c in labels]),
        "bradley_terry": bradley_terry(main, bootstrap, seed),
        "agreement": agreement(main),
    }
    return to_jsonable(out)
