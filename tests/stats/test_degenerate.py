"""Regression tests: nearly constant responses never crash ``fit_lmm`` (issue 7 follow-up).

Reported defect: a per-prompt Inception-Score column ~1.0 everywhere with tiny noise
(``value ~ algorithm * batch``, group ``prompt``) raised ZeroDivisionError in
``lmm_core.deviance_vp``. Independent reference: an LMM is equivariant under y -> a y + c, so a
fit of ``1 + eps * z`` must equal the unit-scale fit of ``z`` (itself checked against lme4 /
lmerTest in test_lmm.py) with estimates, SEs and SDs scaled by eps, the same theta, t, df
and p, and REML criterion shifted by (n - p) log eps^2. For the balanced 45 x 4 design the
within-prompt df is also known in closed form: (45 - 1) x 3 = 132.
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.stats.lmm import fit_lmm
from pcpo_eval.stats.lmm_core import LMMCore, REBlock

FORMULA = "value ~ algorithm * batch"
TERMS = ("algorithm[T.pcpo]", "batch[T.small]", "algorithm[T.pcpo]:batch[T.small]")


def _table(prompt_sd: float, seed: int = 1) -> tuple[pd.DataFrame, np.ndarray]:
    """45 prompts x {ddpo, pcpo} x {large, small}; returns the table and unit-scale z."""
    rng = np.random.default_rng(seed)
    rows = [(p, a, b) for p in range(45) for a in ("ddpo", "pcpo") for b in ("large", "small")]
    df = pd.DataFrame(rows, columns=["prompt", "algorithm", "batch"])
    z = prompt_sd * rng.normal(size=45)[df.prompt] + rng.normal(size=len(df))
    z = z + 0.3 * (df.algorithm == "pcpo").to_numpy()
    return df, z


@pytest.fixture(scope="module", params=[1.0, 0.0], ids=["prompt-sd-1", "no-prompt-effect"])
def unit_fit(request):
    df, z = _table(request.param)
    return df, z, fit_lmm(df.assign(value=z), FORMULA, ["prompt"])


@pytest.mark.parametrize("eps", [1e-9, 1e-4])
def test_nearly_constant_response_fits_like_unit_scale(unit_fit, eps):
    df, z, ref = unit_fit
    r = fit_lmm(df.assign(value=1.0 + eps * z), FORMULA, ["prompt"])
    assert r.converged and r.notes == ()
    assert r.singular == ref.singular
    assert r.term("(Intercept)").estimate == pytest.approx(
        1.0 + eps * ref.term("(Intercept)").estimate, abs=1e-6 * eps
    )
    for t in TERMS:
        a, b = r.term(t), ref.term(t)
        assert a.estimate == pytest.approx(eps * b.estimate, rel=1e-6)
        assert a.se == pytest.approx(eps * b.se, rel=1e-6)
        assert a.df == pytest.approx(b.df, rel=1e-4)
        # balanced design: within-prompt contrasts have (45 - 1) x 3 df, or n - p when the
        # prompt variance is estimated as zero (then the LMM is OLS)
        assert a.df == pytest.approx(176.0 if ref.singular else 132.0, rel=1e-3)
        assert a.p == pytest.approx(b.p, rel=1e-4)
    assert r.random_sd["Residual"] == pytest.approx(eps * ref.random_sd["Residual"], rel=1e-6)
    assert r.random_sd["prompt"] == pytest.approx(eps * ref.random_sd["prompt"], rel=1e-4, abs=1e-4 * eps)
    n_minus_p = r.n_obs - 4
    assert r.reml_criterion == pytest.approx(ref.reml_criterion + n_minus_p * np.log(eps**2), rel=1e-8)


def test_singular_nearly_constant_fit_is_flagged():
    """Pure noise around 1 with no prompt effect -> zero prompt variance, flagged singular."""
    df, z = _table(0.0, seed=2)
    ref = fit_lmm(df.assign(value=z), FORMULA, ["prompt"])
    r = fit_lmm(df.assign(value=1.0 + 1e-9 * z), FORMULA, ["prompt"])
    assert ref.singular and r.singular and r.random_sd["prompt"] < 1e-4 * 1e-9
    assert r.to_dict()["singular"] is True


def test_random_effect_dwarfing_residual():
    """Constant within prompt up to 1e-9 noise (ICC ~ 1): solved by the QR path, df still 132."""
    df, z = _table(0.0, seed=3)
    pe = np.random.default_rng(4).normal(size=45)[df.prompt]
    r = fit_lmm(df.assign(value=1.0 + pe + 1e-9 * z), FORMULA, ["prompt"])
    ref = fit_lmm(df.assign(value=z), FORMULA, ["prompt"])
    assert r.converged
    assert r.term("algorithm[T.pcpo]").estimate == pytest.approx(
        1e-9 * ref.term("algorithm[T.pcpo]").estimate, rel=1e-5
    )
    assert r.term("algorithm[T.pcpo]").df == pytest.approx(132.0, rel=1e-3)
    assert r.random_sd["prompt"] == pytest.approx(np.std(pe[::4], ddof=1), rel=1e-2)


def test_rounding_level_variation_is_reported_not_converged():
    df, z = _table(0.0)
    r = fit_lmm(df.assign(value=1.0 + 1e-15 * z), FORMULA, ["prompt"])
    assert r.converged is False
    assert r.notes and "floating-point rounding" in r.notes[0]
    assert r.to_dict()["notes"] == list(r.notes) and "Note: " in r.summary()


def test_constant_response_is_user_error_and_exact_fit_is_reported():
    df, _ = _table(0.0)
    with pytest.raises(UserError, match="constant"):
        fit_lmm(df.assign(value=1.0), FORMULA, ["prompt"])
    # exactly a function of the fixed effects: residuals are rounding error only
    exact = 1.0 + 0.5 * (df.algorithm == "pcpo") + 0.25 * (df.batch == "small")
    r = fit_lmm(df.assign(value=exact), FORMULA, ["prompt"])
    assert r.converged is False and "floating-point rounding" in r.notes[0]


def test_deviance_at_zero_sigma_is_infinite_not_an_exception():
    n = 8
    core = LMMCore(
        np.arange(n, dtype=float),
        np.ones((n, 1)),
        [REBlock("g", np.arange(n) % 2, 2, np.ones((n, 1)), ("(Intercept)",))],
    )
    assert core.deviance_vp(np.array([0.5, 0.0])) == np.inf
    assert np.isfinite(core.deviance_vp(np.array([0.5, 1.0])))


def test_not_estimable_fits_print_no_p_value():
    """A metric with only rounding-level variation (per-prompt IS of single-class sets) gets no p."""
    rng = np.random.default_rng(3)
    rows = [(p, a, 1.0 + 1e-15 * rng.normal()) for p in range(10) for a in ("DDPO", "PCPO") for _ in range(2)]
    df = pd.DataFrame(rows, columns=["prompt", "algorithm", "value"])
    r = fit_lmm(df, "value ~ algorithm", ["prompt"])
    d = r.to_dict()
    assert r.estimable is False and d["estimable"] is False and "rounding" in d["reason"]
    assert all(v["p"] is None for v in d["fixed"].values())
    text = r.summary()
    assert "NOT ESTIMABLE" in text and " p " not in text.split("Random effects")[1]


def test_singular_fit_keeps_its_p_values_and_joins_the_family():
    """A grouping estimated at zero variance is an estimate, not a failure: p-values as lmerTest
    gives them (tests/stats/test_lme4.py), a remark saying so, and Holm/BH over both metrics."""
    from pcpo_eval.stats.adjust import benjamini_hochberg, holm
    from pcpo_eval.stats.lmm import adjust_across_metrics, many_summary

    rng = np.random.default_rng(0)
    peff = rng.normal(0, 2, 10)
    # "flat": every prompt has the same mean (+-e around 0.5 within each prompt), so the prompt variance is 0.
    rows = [(p, a, 50 + peff[p] - 3 * (a == "B") + rng.normal(), 0.5 + (0.01 + 0.001 * p) * s)
            for p in range(10) for a in ("A", "B") for s in (-1, 1)]
    df = pd.DataFrame(rows, columns=["prompt", "algorithm", "fid", "flat"])
    good = fit_lmm(df, "fid ~ algorithm", ["prompt"])
    sing = fit_lmm(df, "flat ~ algorithm", ["prompt"])
    remark = "singular fit: variance of prompt estimated at 0 (boundary); fixed-effect tests as lmerTest"
    assert good.estimable and good.remarks == ()
    assert sing.singular and sing.estimable and sing.reason is None and sing.remarks == (remark,)
    fe = sing.term("algorithm[T.B]")
    # prompt variance 0: the LMM is OLS, so t has n - p = 38 df
    assert fe.df == pytest.approx(38.0, rel=1e-4) and 0.0 < fe.p < 1.0
    d = sing.to_dict()
    assert d["fixed"]["algorithm[T.B]"]["p"] == fe.p and d["estimable"] is True and d["remarks"] == [remark]
    assert f"Note: {remark}" in sing.summary() and "NOT ESTIMABLE" not in sing.summary()
    adj = adjust_across_metrics({"fid": good, "flat": sing})
    pv = np.array([good.term("algorithm[T.B]").p, fe.p])
    for m, a, h, b in zip(("fid", "flat"), pv, holm(pv), benjamini_hochberg(pv), strict=True):
        assert adj[m]["algorithm[T.B]"] == pytest.approx({"p": a, "p_holm": h, "p_bh": b})
    assert "not estimable" not in many_summary({"fid": good, "flat": sing}, adj)
