"""Analysis of a pairwise human preference study: checks, win rates, mixed model, Bradley-Terry, agreement.

Input: the pairs table and the responses (columns and conventions: :mod:`pcpo_eval.human`).
Output of :func:`analyze`: one JSON-serialisable dict (``None`` wherever a number does not exist).

* **Attention checks** (per rater). ``degraded`` pairs: choosing anything but ``expected`` (the
  undegraded side), a tie included, is a failure; raters with more than ``max_degraded_failures``
  failures are excluded from every other analysis (``exclude_failed``), listed with the reason.
  ``identical`` pairs: a side pick is *not* a failure; the share of non-tie answers calibrates how
  often raters pick a side when there is nothing to see.
* **Side bias**: the share of ``left`` among decisive ``main`` answers, exact (Clopper-Pearson)
  95% CI and exact two-sided binomial p against 1/2.
* **Per comparison** ``"A vs B"`` (A = the method named first): A wins, B wins, ties. The win rate
  of A among decisive answers with its Clopper-Pearson 95% CI and the exact two-sided binomial p
  (``scipy.stats.binomtest``); ties are excluded from that test and the output says so. Also the
  win rate with ties as half a win. A mixed logistic model (:func:`pcpo_eval.stats.glmm.fit_binomial_glmm`,
  lme4's ``glmer``): ``A chosen ~ 1 + side + (1|rater) + (1|prompt)`` over decisive answers, side
  = +0.5 if A was shown left, -0.5 if right, so ``exp(intercept)`` is the odds of choosing A at
  no side advantage; its Wald 95% CI and p. It is not estimable (``p = None`` and a reason, never a
  made-up p) with fewer than 2 raters, fewer than :data:`MIN_DECISIVE` decisive answers, every
  answer one way, or a fit that does not converge. The verdict uses the mixed-model p when
  estimable, else the binomial p, says which, and says "no evidence of a preference" unless
  p < :data:`ALPHA`.
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

:func:`simulate_responses` draws a study's responses from planted preferences (tests, the demo).
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import CHOICES, KINDS, PAIR_COLUMNS, RESPONSE_COLUMNS
from pcpo_eval.io import to_jsonable

ALPHA = 0.05  # significance level of the verdicts
MIN_DECISIVE = 10  # decisive answers below which the mixed model is not fitted
#: The columns the analysis reads (a subset of PAIR_COLUMNS / RESPONSE_COLUMNS).
NEEDED_PAIR_COLUMNS = (
    "pair_id", "comparison", "kind", "prompt_id", "left_method", "right_method", "expected"
)
NEEDED_RESPONSE_COLUMNS = ("rater_id", "pair_id", "choice")
ELO_SCALE = 400.0 / math.log(10.0)  # Chatbot Arena: SCALE = 400, BASE = 10
ELO_INIT = 1000.0
BT_TOL = 1e-10  # MM stops when no log-strength moves more than this
BT_MAXIT = 10_000
P_CLIP = 1e-9  # simulate_responses: a planted probability of 0 or 1 is taken as 1e-9 / 1 - 1e-9


# -- validation ---------------------------------------------------------------------------------


def parse_comparison(label: str) -> tuple[str, str]:
    """``"pcpo@120 vs ddpo@180"`` -> ("pcpo@120", "ddpo@180") (A = the method named first)."""
    parts = str(label).split(" vs ")
    if len(parts) != 2 or not all(p.strip() for p in parts) or parts[0].strip() == parts[1].strip():
        raise UserError(
            f"comparison {label!r} is not of the form 'A vs B' with two different methods; fix pairs.parquet"
        )
    return parts[0].strip(), parts[1].strip()


def _require_columns(df: pd.DataFrame, needed: tuple[str, ...], what: str, full: tuple[str, ...]) -> None:
    missing = [c for c in needed if c not in df.columns]
    if missing:
        raise UserError(f"{what} lacks column(s) {', '.join(missing)}; it needs {', '.join(full)}")


def _validate_pairs(pairs: pd.DataFrame) -> pd.DataFrame:
    _require_columns(pairs, NEEDED_PAIR_COLUMNS, "the pairs table", PAIR_COLUMNS)
    pairs = pairs.copy()
    pairs["pair_id"] = pairs["pair_id"].astype(str)
    if pairs.pair_id.duplicated().any():
        dup = pairs.pair_id[pairs.pair_id.duplicated()].iloc[0]
        raise UserError(f"pair_id {dup!r} occurs twice in the pairs table; every pair needs its own id")
    bad = sorted(set(pairs.kind) - set(KINDS))
    if bad:
        raise UserError(f"unknown pair kind(s) {bad}; valid kinds: {', '.join(KINDS)}")
    pairs["expected"] = pairs["expected"].fillna("").astype(str)
    for row in pairs[pairs.kind == "main"].itertuples():
        a, b = parse_comparison(row.comparison)
        if {row.left_method, row.right_method} != {a, b}:
            raise UserError(f"pair {row.pair_id}: sides {row.left_method!r}/{row.right_method!r} are not the "
                            f"methods of {row.comparison!r}; fix pairs.parquet")
    ok = {"identical": {"tie"}, "degraded": {"left", "right"}}
    for kind, allowed in ok.items():
        wrong = pairs[(pairs.kind == kind) & ~pairs.expected.isin(allowed)]
        if len(wrong):
            raise UserError(f"{kind} pair {wrong.pair_id.iloc[0]} has expected={wrong.expected.iloc[0]!r}; "
                            f"expected must be {' or '.join(sorted(allowed))}")
    return pairs


def _validate_responses(responses: pd.DataFrame, pairs: pd.DataFrame) -> pd.DataFrame:
    _require_columns(responses, NEEDED_RESPONSE_COLUMNS, "the responses table", RESPONSE_COLUMNS)
    r = responses.copy()
    if len(r) == 0:
        raise UserError("there are no responses to analyze; collect ratings first (pcpo-eval human serve)")
    r["pair_id"] = r["pair_id"].astype(str)
    if "rater" not in r.columns:
        r["rater"] = r["rater_id"].astype(str)
    unknown = sorted(set(r.pair_id) - set(pairs.pair_id))
    if unknown:
        raise UserError(f"{len(unknown)} response(s) name unknown pair_id(s), e.g. {unknown[0]!r}; "
                        "analyze the responses with the pairs table of the same study")
    bad = sorted(set(map(str, r.choice)) - set(CHOICES))
    if bad:
        raise UserError(f"unknown choice(s) {bad}; valid choices: {', '.join(CHOICES)}")
    dup = r.duplicated(["rater_id", "pair_id"])
    if dup.any():
        d = r[dup].iloc[0]
        raise UserError(
            f"rater {d.rater_id} answered pair {d.pair_id} twice; keep one response per (rater, pair)"
        )
    return r


# -- small exact statistics ---------------------------------------------------------------------


def clopper_pearson(k: int, n: int, level: float = 0.95) -> tuple[float | None, float | None]:
    """Exact (Clopper-Pearson) CI for a binomial proportion k / n; (None, None) when n = 0.

    Limits are Beta quantiles: Beta(a/2; k, n-k+1) and Beta(1-a/2; k+1, n-k) (Clopper & Pearson
    1934), as ``scipy.stats.binomtest(k, n).proportion_ci(method="exact")``.
    """
    from scipy.special import betaincinv

    if n == 0:
        return None, None
    a = 1.0 - level
    lo = 0.0 if k == 0 else float(betaincinv(k, n - k + 1, a / 2))
    hi = 1.0 if k == n else float(betaincinv(k + 1, n - k, 1 - a / 2))
    return lo, hi


def binomial_p(k: int, n: int) -> float | None:
    """Exact two-sided binomial p against 1/2 (``scipy.stats.binomtest``); None when n = 0."""
    from scipy.stats import binomtest

    return float(binomtest(k, n, 0.5).pvalue) if n else None


def _rate(k: int, n: int) -> float | None:
    return k / n if n else None


# -- attention checks and side bias -------------------------------------------------------------


def attention_checks(merged: pd.DataFrame, max_degraded_failures: int) -> list[dict[str, Any]]:
    """Per rater: degraded checks seen / failed, identical checks seen / answered with a side."""
    deg, ide = merged.kind == "degraded", merged.kind == "identical"
    flags = pd.DataFrame({
        "rater_id": merged.rater_id, "n_responses": 1, "degraded_seen": deg,
        "degraded_failed": deg & (merged.choice != merged.expected),
        "identical_seen": ide, "identical_non_tie": ide & (merged.choice != "tie"),
    })
    counts = flags.groupby("rater_id", sort=True).sum()
    names = merged.groupby("rater_id", sort=True).rater.first()
    out = []
    for rid, row in counts.iterrows():
        c = {k: int(v) for k, v in row.items()}
        excluded = c["degraded_failed"] > max_degraded_failures
        reason = (f"failed {c['degraded_failed']} of {c['degraded_seen']} degraded checks "
                  f"(more than {max_degraded_failures})")
        out.append({"rater_id": rid, "rater": str(names[rid]), **c, "fails_checks": excluded,
                    "reason": reason if excluded else None})
    return out


def side_bias(main: pd.DataFrame) -> dict[str, Any]:
    """Share of ``left`` among decisive main answers, Clopper-Pearson CI, binomial p against 1/2."""
    dec = main[main.choice != "tie"]
    k, n = int((dec.choice == "left").sum()), len(dec)
    lo, hi = clopper_pearson(k, n)
    return {"n_decisive": n, "left": k, "share_left": _rate(k, n), "ci95": [lo, hi], "p": binomial_p(k, n),
            "note": "share of 'left' among decisive main answers; 0.5 = no side bias"}


# -- per comparison -----------------------------------------------------------------------------


def _not_estimable(reason: str, **extra: Any) -> dict[str, Any]:
    return {"estimable": False, "odds_ratio_a": None, "ci95": [None, None], "p": None, "reason": reason,
            **extra}


def wald_df(groups: dict[str, np.ndarray]) -> int:
    """Denominator df of the mixed model's Wald tests: levels of the smallest grouping factor - 1.

    The preference (the intercept) is a between-rater quantity, so its information grows with the
    number of raters, not of answers (SAS GLIMMIX's "between-within" df). With ~15 raters the
    Wald z-test was anticonservative in simulated A/A studies (6-8% at alpha 0.05,
    benchmarks/bench_human.py); the t reference with these df brings it back to the nominal rate.
    """
    return max(1, min(int(np.unique(g).size) for g in groups.values()) - 1)


def mixed_model(dec: pd.DataFrame, a: str) -> dict[str, Any]:
    """``A chosen ~ 1 + side + (1|rater) + (1|prompt)`` over decisive answers of one comparison.

    ``side`` = +0.5 if A was shown left, -0.5 if right; dropped if A was always on one side. A
    grouping with a single level (one prompt) is dropped too (noted); fewer than 2 raters, fewer
    than :data:`MIN_DECISIVE` answers, all answers one way or no convergence: not estimable.
    """
    from scipy.stats import t as student_t

    from pcpo_eval.stats.glmm import fit_binomial_glmm

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
    cols, names, notes = [np.ones(n)], ["(Intercept)"], []
    if np.unique(side).size > 1:
        cols.append(side)
        names.append("side")
    else:
        notes.append("A was always on one side: no side term")
    groups = {"rater": dec.rater_id.to_numpy()}
    if n_prompts > 1:
        groups["prompt"] = dec.prompt_id.astype(str).to_numpy()
    else:
        notes.append("a single prompt: no prompt random effect")
    try:
        fit = fit_binomial_glmm(y, np.column_stack(cols), groups, names)
    except UserError as exc:
        return _not_estimable(f"model not estimable: {exc}", **sizes)
    if not fit.estimable:
        return _not_estimable(f"model did not converge: {fit.message}", **sizes)
    b, se = float(fit.beta[0]), float(fit.se[0])
    df = wald_df(groups)
    tq = float(student_t.ppf(1 - ALPHA / 2, df))
    out = {
        "estimable": True, "odds_ratio_a": math.exp(b),
        "ci95": [math.exp(b - tq * se), math.exp(b + tq * se)],
        "p": float(2 * student_t.sf(abs(b / se), df)), "p_wald_z": float(fit.p[0]), "df": df,
        "test": f"Wald t with between-within df = {df} (levels of the smallest grouping factor - 1)",
        "log_odds_a": b, "se": se, "reason": None, **sizes,
        "side_log_odds": float(fit.beta[1]) if "side" in names else None,
        "side_p": float(2 * student_t.sf(abs(fit.z[1]), df)) if "side" in names else None,
        "random_sd": fit.random_sd, "singular": fit.singular, "message": fit.message, "notes": notes,
        "formula": "A chosen ~ 1 + side + (1|rater) + (1|prompt), binomial logit, Laplace (lme4 glmer)",
    }
    return out


def _fmt_ci(lo: float | None, hi: float | None) -> str:
    return "n/a" if lo is None else f"{lo:.2f}-{hi:.2f}"


def verdict_sentence(c: dict[str, Any]) -> str:
    """One line: a preference only when the chosen p is below :data:`ALPHA`, else "no evidence"."""
    a, b = c["a"], c["b"]
    if c["n_decisive"] == 0:
        return f"{a} vs {b}: no decisive answers; no evidence of a preference."
    rate = (f"win rate of {a} {c['win_rate_a']:.2f} (95% CI {_fmt_ci(*c['ci95'])}, "
            f"{c['n_decisive']} decisive answers)")
    mm = c["mixed_model"]
    p_txt = f"{c['p_source']} p = {c['p']:.3g}"
    if not mm["estimable"]:
        p_txt += f"; mixed model not estimable: {mm['reason']}"
    if c["p"] is not None and c["p"] < ALPHA:
        a_ahead = mm["odds_ratio_a"] > 1.0 if c["p_source"] == "mixed-model" else c["win_rate_a"] > 0.5
        winner, loser = (a, b) if a_ahead else (b, a)
        return f"Raters preferred {winner} over {loser}: {rate}, {p_txt}."
    return f"No evidence of a preference between {a} and {b}: {rate}, {p_txt}."


def compare(main: pd.DataFrame, label: str) -> dict[str, Any]:
    """Counts, exact binomial analysis, mixed model and verdict of one comparison ``"A vs B"``."""
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
    c["p"], c["p_source"] = (mm["p"], "mixed-model") if mm["estimable"] else (c["p_binomial"], "binomial")
    c["significant"] = c["p"] is not None and c["p"] < ALPHA
    c["verdict"] = verdict_sentence(c)
    return c


# -- Bradley-Terry ------------------------------------------------------------------------------


def _bt_mm(w: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
    """Zermelo / MM iteration (Hunter 2004, eq. 3) on a batch of win matrices ``w`` (B, m, m).

    ``w[b, i, j]`` = wins of i over j (ties counted half to each side). Returns the log-strengths
    anchored at method 0 (B, m) and which replicates converged (B,).
    """
    games = w + np.swapaxes(w, 1, 2)
    wins = w.sum(axis=2)
    p = np.ones(w.shape[:2])
    done = np.zeros(w.shape[0], dtype=bool)
    for _ in range(BT_MAXIT):
        denom = (games / (p[:, :, None] + p[:, None, :])).sum(axis=2)
        new = wins / denom
        new = new / new[:, :1]
        step = np.max(np.abs(np.log(new) - np.log(p)), axis=1)
        p = new
        done = step < BT_TOL
        if done.all():
            break
    return np.log(p), done


def _bt_exists(w: np.ndarray) -> bool:
    """Ford's condition: the directed 'i beat j at least half a time' graph is strongly connected."""
    from scipy.sparse.csgraph import connected_components

    n_comp, _ = connected_components(w > 0, directed=True, connection="strong")
    return n_comp == 1


def _win_tensor(a: np.ndarray, b: np.ndarray, val: np.ndarray, idx: np.ndarray, m: int) -> np.ndarray:
    """Win matrices (B, m, m) of the responses ``idx`` (B, n): a beats b by ``val`` (1, 1/2 or 0)."""
    nb = idx.shape[0]
    base = np.arange(nb)[:, None] * m * m
    size = nb * m * m
    w = np.bincount((base + a[idx] * m + b[idx]).ravel(), weights=val[idx].ravel(), minlength=size)
    w += np.bincount((base + b[idx] * m + a[idx]).ravel(), weights=1.0 - val[idx].ravel(), minlength=size)
    return w.reshape(nb, m, m)


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
    m, n = len(methods), len(main)
    w = _win_tensor(a, b, val, np.arange(n)[None, :], m)
    out: dict[str, Any] = {
        "methods": methods, "anchor": methods[0], "n_responses": n,
        "ties": "counted as half a win to each side (as Chatbot Arena)",
        "elo_scale": "400 / ln(10) * log_strength + 1000 (Chatbot Arena)",
    }
    if not _bt_exists(w[0]):
        return {**out, "log_strength": None, "reason": "the maximum-likelihood strengths do not exist: some "
                "method(s) never won (or never lost) against the rest (Ford's condition)"}
    s, _ = _bt_mm(w)
    s = s[0]
    out["log_strength"] = dict(zip(methods, s.tolist(), strict=True))
    out["elo"] = {x: ELO_SCALE * v + ELO_INIT for x, v in out["log_strength"].items()}
    prob = 1.0 / (1.0 + np.exp(-(s[:, None] - s[None, :])))
    out["win_probability"] = {"rows_beat_columns": methods, "matrix": prob.tolist()}
    out["bootstrap"] = _bt_bootstrap(a, b, val, m, bootstrap, seed, methods)
    return out


def _bt_bootstrap(a: np.ndarray, b: np.ndarray, val: np.ndarray, m: int, reps: int, seed: int,
                  methods: list[str]) -> dict[str, Any]:
    """95% percentile CIs of log-strength and Elo over ``reps`` resamples of the responses."""
    info: dict[str, Any] = {"replicates": reps, "seed": seed, "used": 0, "log_strength_ci95": None,
                            "elo_ci95": None}
    if reps <= 0:
        return info
    rng = np.random.default_rng(seed)
    idx = rng.integers(0, a.size, (reps, a.size))
    w = _win_tensor(a, b, val, idx, m)
    ok = np.array([_bt_exists(wi) for wi in w])
    s, done = _bt_mm(w[ok]) if ok.any() else (np.zeros((0, m)), np.zeros(0, bool))
    s = s[done]
    info["used"] = int(s.shape[0])
    info["dropped"] = f"{reps - s.shape[0]} resample(s) without finite maximum-likelihood strengths"
    if s.shape[0] < 2:
        return info
    lo, hi = np.percentile(s, [2.5, 97.5], axis=0)
    info["log_strength_ci95"] = {x: [float(lo[i]), float(hi[i])] for i, x in enumerate(methods)}
    info["elo_ci95"] = {x: [ELO_SCALE * float(lo[i]) + ELO_INIT, ELO_SCALE * float(hi[i]) + ELO_INIT]
                        for i, x in enumerate(methods)}
    return info


# -- agreement ----------------------------------------------------------------------------------


def _alpha_from_counts(cnt: np.ndarray) -> float | None:
    """Nominal alpha from a (units, categories) matrix of value counts, units with >= 2 values."""
    m = cnt.sum(axis=1)
    cnt = cnt[m >= 2]
    if cnt.shape[0] == 0:
        return None
    scaled = cnt / (cnt.sum(axis=1, keepdims=True) - 1.0)
    o = scaled.T @ cnt - np.diag(scaled.sum(axis=0))  # coincidences o_ck
    nc = o.sum(axis=1)
    n = nc.sum()
    expected = n * n - float(nc @ nc)
    if expected <= 0:
        return None
    return float(1.0 - (n - 1.0) * (o.sum() - np.trace(o)) / expected)


def krippendorff_alpha_nominal(units: list[list[Any]]) -> float | None:
    """Krippendorff's alpha, nominal metric, over units with any number (>= 2 counted) of values.

    Coincidence matrix o_ck = sum_u (number of ordered value pairs (c, k) from different coders in
    unit u) / (m_u - 1); alpha = 1 - (n - 1) sum_{c != k} o_ck / sum_{c != k} n_c n_k (Krippendorff
    2011). Units with fewer than 2 values are not pairable and are ignored. None when undefined
    (no pairable unit, or every value in one category: no expected disagreement).
    """
    units = [list(u) for u in units if len(u) >= 2]
    cats = sorted({v for u in units for v in u}, key=str)
    if not units:
        return None
    pos = {c: i for i, c in enumerate(cats)}
    cnt = np.array([np.bincount([pos[v] for v in u], minlength=len(cats)) for u in units], dtype=float)
    return _alpha_from_counts(cnt)


def agreement(main: pd.DataFrame) -> dict[str, Any]:
    """Krippendorff's alpha (nominal) and pooled pairwise percent agreement over multiply rated pairs."""
    cnt = pd.crosstab(main.pair_id, main.choice).reindex(columns=list(CHOICES), fill_value=0).to_numpy(float)
    cnt = cnt[cnt.sum(axis=1) >= 2] if cnt.size else np.zeros((0, len(CHOICES)))
    note = "main pairs rated by >= 2 retained raters; categories left/right/tie"
    if cnt.shape[0] == 0:
        return {"n_pairs": 0, "n_ratings": 0, "krippendorff_alpha_nominal": None, "percent_agreement": None,
                "reason": "no pair was rated by 2 or more raters", "note": note}
    m = cnt.sum(axis=1)
    agree, total = float((cnt * (cnt - 1) / 2).sum()), float((m * (m - 1) / 2).sum())
    alpha = _alpha_from_counts(cnt)
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

    Keys: ``settings``, ``counts``, ``attention_checks`` (``raters``, ``excluded``,
    ``identical_non_tie_rate``), ``side_bias``, ``comparisons`` (one dict per comparison, with
    ``verdict``), ``bradley_terry`` (None with <= 2 methods), ``agreement``.
    Bad input raises :class:`UserError`.
    """
    pairs = _validate_pairs(pairs)
    resp = _validate_responses(responses, pairs)
    merged = resp.merge(pairs.drop(columns=[c for c in ("rater",) if c in pairs.columns]), on="pair_id")
    raters = attention_checks(merged, max_degraded_failures)
    excluded = [{"rater_id": r["rater_id"], "rater": r["rater"], "reason": r["reason"]}
                for r in raters if r["fails_checks"] and exclude_failed]
    used = merged[~merged.rater_id.isin([e["rater_id"] for e in excluded])]
    main = used[used.kind == "main"]
    ide = merged[merged.kind == "identical"]
    labels = list(dict.fromkeys(pairs.loc[pairs.kind == "main", "comparison"]))
    out = {
        "settings": {"exclude_failed": exclude_failed, "max_degraded_failures": max_degraded_failures,
                     "bootstrap": bootstrap, "seed": seed, "alpha": ALPHA, "min_decisive": MIN_DECISIVE},
        "counts": {"pairs": len(pairs), "responses": len(resp), "raters": resp.rater_id.nunique(),
                   "raters_excluded": len(excluded), "responses_used": len(used),
                   "main_responses_used": len(main)},
        "attention_checks": {
            "raters": raters, "excluded": excluded,
            "identical_non_tie_rate": _rate(int((ide.choice != "tie").sum()), len(ide)),
            "note": "degraded: any answer but the undegraded side (a tie included) fails; identical: a side "
                    "pick is not a failure, its rate calibrates side-picking when there is nothing to see",
        },
        "side_bias": side_bias(main),
        "comparisons": [compare(main, c) for c in labels],
        "bradley_terry": bradley_terry(main, bootstrap, seed),
        "agreement": agreement(main),
    }
    return to_jsonable(out)


# -- simulation ---------------------------------------------------------------------------------


def _p_first(a: str, b: str, p_prefer: dict[str, float] | float) -> float:
    """P(A chosen over B) among decisive answers: a float is P(A); a dict maps methods to their P of
    being chosen against an unlisted method (log-strength logit(p), unlisted = 0)."""
    if not isinstance(p_prefer, dict):
        return min(max(float(p_prefer), P_CLIP), 1.0 - P_CLIP)

    def s(x: str) -> float:
        p = min(max(float(p_prefer.get(x, 0.5)), P_CLIP), 1.0 - P_CLIP)
        return math.log(p / (1.0 - p))

    return min(max(1.0 / (1.0 + math.exp(-(s(a) - s(b)))), P_CLIP), 1.0 - P_CLIP)


def _check_answer(kind: str, expected: str, fail_rate: float, rng: np.random.Generator) -> str:
    if kind == "degraded":
        degraded_side = "right" if expected == "left" else "left"
        return expected if rng.random() >= fail_rate else str(rng.choice(["tie", degraded_side]))
    return "tie" if rng.random() < 0.6 else str(rng.choice(["left", "right"]))


def simulate_responses(
    pairs: pd.DataFrame,
    n_raters: int,
    responses_per_rater: int,
    p_prefer: dict[str, float] | float,
    rng_seed: int,
    fail_rate: float = 0.0,
    *,
    tie_rate: float = 0.05,
    rater_sd: float = 0.3,
    prompt_sd: float = 0.3,
) -> pd.DataFrame:
    """Simulated responses (columns RESPONSE_COLUMNS and ``simulated``, always true) of ``n_raters`` raters.

    Each rater answers ``responses_per_rater`` main pairs drawn without replacement plus every
    attention-check pair. On a main pair of ``"A vs B"`` the rater ties with ``tie_rate``, else
    chooses A with log-odds logit(P(A)) + rater effect + prompt effect (N(0, rater_sd^2) and
    N(0, prompt_sd^2)); P(A) from ``p_prefer``: a float is P(A) for every comparison, a dict maps
    method names to their chance against an unlisted method (e.g. ``{"pcpo@120": 0.7}``;
    Bradley-Terry log-strengths logit(p); 0 and 1 are taken as 1e-9 and 1 - 1e-9). Degraded checks
    are answered ``expected`` except with probability ``fail_rate`` (then the degraded side or a
    tie); identical checks with a tie 60% of the time, else a random side.
    """
    pairs = _validate_pairs(pairs)
    probs = [p_prefer] if not isinstance(p_prefer, dict) else list(p_prefer.values())
    if not all(0.0 <= float(p) <= 1.0 for p in probs):
        raise UserError(f"p_prefer {p_prefer!r}: every probability must lie in [0, 1]")
    rng = np.random.default_rng(rng_seed)
    main, checks = pairs[pairs.kind == "main"], pairs[pairs.kind != "main"]
    prompts = sorted(map(str, pairs.prompt_id.unique()))
    prompt_eff = dict(zip(prompts, rng.normal(0.0, prompt_sd, len(prompts)), strict=True))
    rows, t0 = [], pd.Timestamp("2026-01-01T00:00:00Z")
    recs = main[["pair_id", "comparison", "prompt_id", "left_method"]].astype(str).to_numpy().tolist()
    checks = checks[["pair_id", "kind", "expected"]].astype(str).to_numpy().tolist()
    for r in range(n_raters):
        eff = rng.normal(0.0, rater_sd)
        take = rng.choice(len(recs), size=min(responses_per_rater, len(recs)), replace=False)
        for pair_id, label, prompt_id, left in (recs[i] for i in take):
            a, b = parse_comparison(label)
            p = _p_first(a, b, p_prefer)
            pa = 1.0 / (1.0 + math.exp(-(math.log(p / (1.0 - p)) + eff + prompt_eff[prompt_id])))
            if rng.random() < tie_rate:
                choice = "tie"
            else:
                choice = "left" if (rng.random() < pa) == (left == a) else "right"
            rows.append((r, pair_id, choice))
        rows += [(r, pid, _check_answer(kind, exp, fail_rate, rng)) for pid, kind, exp in checks]
    df = pd.DataFrame(rows, columns=["rater_id", "pair_id", "choice"])
    df.insert(0, "rater", [f"rater{r:02d}" for r in df.rater_id])
    df["reason"] = ""
    df["submitted_at"] = pd.date_range(t0, periods=len(df), freq="10s").strftime("%Y-%m-%dT%H:%M:%S+00:00")
    df["first_choice"] = df["choice"]
    df["corrections"] = 0
    df["simulated"] = True  # marks a rehearsal: `human analyze` never lets it reach the study report
    return df[[*RESPONSE_COLUMNS, "simulated"]]
