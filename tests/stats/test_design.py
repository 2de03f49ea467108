"""Reported reference levels agree with the design patsy actually built (issue 7 follow-up).

Independent reference: in a one-factor treatment-coded fit on a balanced design the intercept is
the mean of the reference level, and that level is the one without a coefficient; patsy takes the
level order from a pandas Categorical's ``categories`` (ordered or not), sorts other values (a
numeric column in ``C()`` numerically: 2 before 10, whereas a string sort puts "10" first).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.stats.design import FULL_DUMMY, SUM_TO_ZERO, build_design
from pcpo_eval.stats.lmm import fit_lmm


def _data(levels, column) -> pd.DataFrame:
    rng = np.random.default_rng(0)
    k = len(levels)
    df = pd.DataFrame({"prompt": np.repeat(np.arange(12), k)})
    df["f"] = column(np.tile(levels, 12))
    df["y"] = rng.normal(size=len(df)) + rng.normal(size=12)[df.prompt] + np.tile(np.arange(k), 12)
    return df


CASES = {
    "object": (["pcpo", "base", "ddpo"], lambda v: v.astype(object), "base"),
    "categorical": (
        ["pcpo", "base", "ddpo"],
        lambda v: pd.Categorical(v, categories=["pcpo", "ddpo", "base"]),
        "pcpo",
    ),
    "ordered": (
        ["lo", "hi", "mid"],
        lambda v: pd.Categorical(v, categories=["mid", "lo", "hi"], ordered=True),
        "mid",
    ),
    "bool": ([True, False], lambda v: v.astype(bool), "False"),
}


@pytest.mark.parametrize("case", sorted(CASES))
def test_reference_level_matches_fitted_design(case):
    levels, column, expected = CASES[case]
    df = _data(levels, column)
    r = fit_lmm(df, "y ~ f", ["prompt"], diagnostics=False)
    assert r.reference_levels == {"f": expected}
    assert not any(t.endswith(f"[T.{expected}]") for t in (fe.term for fe in r.fixed))
    ref_mean = df.y[df.f.astype(str) == expected].mean()
    assert r.term("(Intercept)").estimate == pytest.approx(ref_mean, rel=1e-7)


def test_numeric_codes_in_C_sort_numerically():
    df = _data([10, 2, 33], lambda v: v.astype(np.int64))
    d = build_design(df, "y ~ C(f)", ["prompt"])
    assert d.reference_levels == {"f": "2"}  # a string sort would say "10"
    assert "C(f)[T.10]" in d.fixed_names and "C(f)[T.33]" in d.fixed_names
    assert build_design(df, "y ~ f", ["prompt"]).reference_levels == {}  # bare numeric = covariate


def test_explicit_reference_sum_and_full_dummy_coding():
    df = _data(["a", "b", "c"], lambda v: v.astype(object))
    assert build_design(df, "y ~ C(f, Treatment(reference='c'))", ["prompt"]).reference_levels == {"f": "c"}
    assert build_design(df, "y ~ C(f, levels=['b', 'a', 'c'])", ["prompt"]).reference_levels == {"f": "b"}
    assert build_design(df, "y ~ f", ["prompt"], coding="sum").reference_levels == {"f": SUM_TO_ZERO}
    assert build_design(df, "y ~ 0 + f", ["prompt"]).reference_levels == {"f": FULL_DUMMY}


def test_interaction_reports_each_factor_once():
    rng = np.random.default_rng(1)
    rows = [(p, a, b) for p in range(8) for a in ("pcpo", "base") for b in (256, 64)]
    df = pd.DataFrame(rows, columns=["prompt", "algorithm", "batch"])
    df["algorithm"] = pd.Categorical(df.algorithm, categories=["pcpo", "base"])
    df["y"] = rng.normal(size=len(df))
    d = build_design(df, "y ~ algorithm * C(batch)", ["prompt"])
    assert d.reference_levels == {"algorithm": "pcpo", "batch": "64"}
    assert "algorithm[T.base]:C(batch)[T.256]" in d.fixed_names
