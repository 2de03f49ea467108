"""General pairwise statistics (:mod:`pcpo_eval.stats.pairwise`) and the lme4-style GLMM front end
(:mod:`pcpo_eval.stats.glmer`): same numbers as the underlying fit, lme4's summary layout, bad
formulas as UserErrors. The human-study tests exercise the same functions through the analysis."""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.stats.glmer import between_within_df, fit_glmm, parse_glmm_formula
from pcpo_eval.stats.glmm import fit_binomial_glmm
from pcpo_eval.stats.pairwise import (
    ELO_INIT,
    fit_bradley_terry,
    krippendorff_alpha_from_counts,
    krippendorff_alpha_nominal,
    percent_agreement,
    rate,
)


def test_rate_and_percent_agreement_hand_values():
    assert rate(3, 4) == 0.75 and rate(0, 0) is None
    cnt = np.array([[2.0, 0.0, 0.0], [1.0, 1.0, 1.0]])  # unit 1: 1 agreeing of 1 pair; unit 2: 0 of 3
    assert percent_agreement(cnt) == (1.0, 4.0)
    units = [["left", "left"], ["left", "right", "tie"]]
    assert krippendorff_alpha_nominal(units) == krippendorff_alpha_from_counts(cnt)


def test_bradley_terry_on_index_arrays():
    items = ["a", "b", "c"]
    a, b = np.array([0, 0, 1, 1, 2, 2, 0, 1]), np.array([1, 2, 2, 0, 0, 1, 1, 2])
    val = np.array([1.0, 1.0, 1.0, 1.0, 1.0, 0.5, 1.0, 0.0])  # everyone beats everyone once
    bt = fit_bradley_terry(a, b, val, items, bootstrap=0, seed=0)
    assert bt["anchor"] == "a" and bt["log_strength"]["a"] == 0.0 and bt["elo"]["a"] == ELO_INIT
    never_loses = fit_bradley_terry(a, b, np.ones(a.size) * (a < b), items, bootstrap=0, seed=0)
    assert never_loses["log_strength"] is None and "Ford" in never_loses["reason"]


def test_bradley_terry_bootstrap_resamples_raters_as_wholes():
    """With ``clusters`` each replicate draws the raters with replacement and keeps all of a drawn rater's
    answers: the weights are constant within a rater and sum to the drawn raters' answers. Three checkpoints,
    four raters of two tastes (two always prefer c, two always a): resampling answers treats 300 answers as
    independent and gives a narrow Elo interval; resampling the 4 raters gives one spanning both tastes."""
    from pcpo_eval.stats.pairwise import cluster_counts, cluster_win_tensor, win_tensor

    rng = np.random.default_rng(0)
    clusters = np.repeat(["r1", "r2", "r3"], [5, 3, 2])
    counts, inv = cluster_counts(clusters, 200, rng)
    assert counts.shape == (200, 3) and (counts.sum(axis=1) == 3).all() and list(inv) == [0] * 5 + [1] * 3 + [2] * 2
    assert np.allclose(counts.mean(axis=0), 1.0, atol=0.2)
    # a replicate's win matrix from the clusters' own matrices = the answers counted as often as their rater
    a0, b0 = np.array([0, 1, 2, 0, 1, 2, 0, 1, 2, 0]), np.array([1, 2, 0, 2, 0, 1, 1, 2, 0, 2])
    v0 = np.linspace(0, 1, 10)
    per = cluster_win_tensor(a0, b0, v0, inv, 3, 3)
    for r in range(5):
        dense = sum(counts[r, inv[i]] * win_tensor(a0, b0, v0, np.array([[i]]), 3)[0] for i in range(10))
        assert np.allclose(np.tensordot(counts[r], per, axes=1), dense)
    items = ["a", "b", "c"]
    pairs = np.array([(0, 1), (0, 2), (1, 2)] * 100)
    a, b = pairs[:, 0], pairs[:, 1]
    rater = np.repeat([0, 1, 2, 3], 75)
    # raters 0 and 2 rank c > b > a (a loses every pair), 1 and 3 a > b > c, a few upsets so strengths exist
    val = np.where(rater % 2 == 0, 0.0, 1.0)
    val[::7] = 1.0 - val[::7]
    by_answers = fit_bradley_terry(a, b, val, items, bootstrap=300, seed=1)["bootstrap"]
    by_raters = fit_bradley_terry(a, b, val, items, bootstrap=300, seed=1, clusters=rater)["bootstrap"]
    assert by_answers["resampled"] == "answers" and by_raters["resampled"] == "raters"
    width = {k: np.diff(v["elo_ci95"]["c"])[0] for k, v in (("answers", by_answers), ("raters", by_raters))}
    assert width["raters"] > 5 * width["answers"], width
    # one or two raters: no interval over raters (every resample of one rater is the data: zero width)
    for k in (1, 2):
        few = fit_bradley_terry(a, b, val, items, bootstrap=50, seed=1, clusters=rater % k)["bootstrap"]
        assert few["elo_ci95"] is None and few["reason"] == f"{k} rater(s): an interval over raters needs at least 3"


def _data(seed: int = 3, n: int = 240) -> pd.DataFrame:
    rng = np.random.default_rng(seed)
    rater, prompt = rng.integers(0, 12, n), rng.integers(0, 20, n)
    side = rng.choice([-0.5, 0.5], n)
    eta = 0.6 + 0.4 * side + rng.normal(0, 0.5, 12)[rater] + rng.normal(0, 0.3, 20)[prompt]
    y = (rng.random(n) < 1 / (1 + np.exp(-eta))).astype(float)
    return pd.DataFrame({"win": y, "side": side, "rater": rater, "prompt": [f"p{p}" for p in prompt]})


def test_fit_glmm_is_fit_binomial_glmm_by_formula():
    d = _data()
    res = fit_glmm("win ~ 1 + side + (1|rater) + (1 | prompt)", d)
    ref = fit_binomial_glmm(d.win.to_numpy(), np.column_stack([np.ones(len(d)), d.side.to_numpy()]),
                            {"rater": d.rater.to_numpy(), "prompt": d.prompt.to_numpy()}, ["(Intercept)", "side"])
    assert res.names == ref.names and res.groups == ref.groups
    for k in ("beta", "se", "p", "theta"):
        np.testing.assert_array_equal(getattr(res, k), getattr(ref, k))
    assert res.deviance == ref.deviance and res.random_sd == ref.random_sd
    assert between_within_df({"rater": d.rater.to_numpy(), "prompt": d.prompt.to_numpy()}) == 11
    text = res.summary()
    for part in ("Laplace Approximation", "Formula: win ~ 1 + side", "Random effects:", "Fixed effects:",
                 "(Intercept)", "Number of obs: 240, groups:  rater, 12; prompt, 20"):
        assert part in text, text


def test_formula_terms():
    assert parse_glmm_formula("y ~ x + (1|g)") == ("y", ["x"], ["g"], True)
    assert parse_glmm_formula("y ~ 0 + x + (1|g) + (1|h)") == ("y", ["x"], ["g", "h"], False)
    assert parse_glmm_formula("y ~ 1 + (1|g)") == ("y", [], ["g"], True)


@pytest.mark.parametrize("formula, match", [
    ("win ~ side + (side|rater)", "random intercepts"),
    ("win ~ side", "no random intercept"),
    ("win ~ side * x + (1|rater)", "not a column name"),
    ("win ~ nope + (1|rater)", "lacks"),
    ("side + (1|rater)", "not of the form"),
])
def test_bad_formulas_are_user_errors(formula, match):
    with pytest.raises(UserError, match=match):
        fit_glmm(formula, _data())
