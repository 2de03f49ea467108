"""``fit_lmm`` against R's lme4 + lmerTest themselves, run through Rscript on random designs.

Designs: nested (pupils in classes in schools), crossed prompt x seed with an interaction,
random slopes, crossed with a third of the cells missing (unbalanced), a grouping near the
boundary (theta ~ 0.03) and one on it (a singular fit), 180-row algorithm x run x prompt designs
with the prompt, the run or both variances at 0 (singular) and neither, and one ML fit.
Tolerances: estimates 1e-6 relative (1e-6 SE for an estimate near 0), SE 1e-4, Satterthwaite df
1e-3, p 1e-3 relative, REML criterion / deviance 1e-8. Singular fits are healthy fits: their
p-values are lmerTest's and are reported, with a remark. R fits with lme4's default optimizer
(nloptwrap BOBYQA) and with minqa's ``bobyqa``, both at tighter tolerances than their defaults,
and keeps the lower criterion, so both sides sit at the optimum rather than at two optimizers'
stopping points (nloptwrap alone stops 1.9 above the optimum on ``prompt_at_0``, with df 13.6
where the optimum has 6). Install R's side with
``apt-get install r-cran-lmertest`` (Debian); without Rscript or lmerTest those tests are skipped.
The last tests check the core without R: no per-theta work on the n rows, the sparse and dense
off-diagonal blocks agree, the Schur-size limit, and lme4's convergence check.
"""

from __future__ import annotations

import re
from dataclasses import replace

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.stats.lmm import fit_lmm
from tests.support.rscript import have_r_package, run_r_fits

R_SCRIPT = r"""
suppressMessages(library(lmerTest))
specs <- read.delim(commandArgs(TRUE)[1], stringsAsFactors = FALSE)
ctrl <- lmerControl(optCtrl = list(xtol_abs = 1e-12, ftol_abs = 1e-13, maxeval = 1e5))
ctrl_bq <- lmerControl(optimizer = "bobyqa", optCtrl = list(rhoend = 1e-10, maxfun = 1e5))
num <- function(x) paste(sprintf("%.17g", x), collapse = " ")
for (i in seq_len(nrow(specs))) {
  d <- read.csv(specs$csv[i], stringsAsFactors = TRUE)
  fits <- lapply(list(ctrl, ctrl_bq), function(cc)
    suppressMessages(lmer(as.formula(specs$formula[i]), d, REML = specs$reml[i] == "TRUE", control = cc)))
  crit <- sapply(fits, function(m) if (isREML(m)) REMLcrit(m) else deviance(m))
  m <- fits[[which.min(crit)]]
  co <- summary(m)$coefficients
  cat("model", specs$id[i], "\n")
  cat("names", rownames(co), "\n")
  cat("estimate", num(co[, "Estimate"]), "\n")
  cat("se", num(co[, "Std. Error"]), "\n")
  cat("df", num(co[, "df"]), "\n")
  cat("p", num(co[, "Pr(>|t|)"]), "\n")
  cat("sigma", num(sigma(m)), "\n")
  cat("deviance", num(if (isREML(m)) REMLcrit(m) else deviance(m)), "\n")
  cat("singular", as.integer(isSingular(m)), "\n")
}
"""


needs_lmertest = pytest.mark.skipif(
    not have_r_package("lmerTest"), reason="needs Rscript with lmerTest (Debian: apt-get install r-cran-lmertest)"
)


def _nested(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    for s in range(12):
        for c in range(4):
            for _ in range(rng.integers(3, 9)):
                rows.append((f"s{s}", f"s{s}c{c}", rng.choice(["a0", "a1"]), rng.normal()))
    df = pd.DataFrame(rows, columns=["school", "klass", "a", "x"])
    school, klass = rng.normal(0, 1.0, 12), rng.normal(0, 0.6, 48)
    df["y"] = (
        2.0
        + 0.5 * (df.a == "a1")
        + 0.3 * df.x
        + school[df.school.str[1:].astype(int)]
        + klass[pd.factorize(df.klass)[0]]
        + rng.normal(0, 1.0, len(df))
    )
    return df


def _crossed(rng: np.random.Generator, n_prompt: int, n_seed: int, keep: float) -> pd.DataFrame:
    grid = [
        (f"p{p:02d}", f"s{s}", a, b)
        for p in range(n_prompt)
        for s in range(n_seed)
        for a in ("ddpo", "pcpo")
        for b in ("large", "small")
    ]
    df = pd.DataFrame(grid, columns=["prompt", "seed", "algorithm", "batch"])
    df = df[rng.random(len(df)) < keep].reset_index(drop=True)
    pe, se = rng.normal(0, 1.0, n_prompt), rng.normal(0, 0.4, n_seed)
    df["y"] = (
        5.0
        + 0.3 * (df.algorithm == "pcpo")
        - 0.2 * (df.batch == "small")
        + 0.15 * ((df.algorithm == "pcpo") & (df.batch == "small"))
        + pe[df.prompt.str[1:].astype(int)]
        + se[df.seed.str[1:].astype(int)]
        + rng.normal(0, 1.0, len(df))
    )
    return df


def _slopes(rng: np.random.Generator) -> pd.DataFrame:
    rows = []
    cov = np.array([[1.0, 0.3], [0.3, 0.5]])
    for g in range(20):
        b0, b1 = rng.multivariate_normal([0, 0], cov)
        for _ in range(rng.integers(4, 12)):
            x = rng.uniform(0, 5)
            rows.append((f"g{g:02d}", x, 1.0 + b0 + (0.8 + b1) * x + rng.normal(0, 0.7)))
    return pd.DataFrame(rows, columns=["g", "x", "y"])


def _one_way(rng: np.random.Generator, ratio: float) -> pd.DataFrame:
    """25 groups x 6 rows with between / within mean squares MSB / MSW = ``ratio``.

    Balanced one-way ANOVA: sigma_b^2 = (MSB - MSW) / m, so theta ~ sqrt((ratio - 1) / m):
    ratio 1.0054 puts theta near the boundary (0.053 here); ratio < 1 gives 0 (a singular fit).
    """
    g, m = 25, 6
    e = rng.normal(size=(g, m))
    e -= e.mean(axis=1, keepdims=True)
    msw = float(np.sum(e**2)) / (g * (m - 1))
    mu = rng.normal(size=g)
    mu = (mu - mu.mean()) / mu.std(ddof=1) * np.sqrt(msw * ratio / m)
    a = np.tile(["a0", "a1", "a0", "a1", "a0", "a1"], g)
    y = (mu[:, None] + e).ravel() + 0.3 * (a == "a1")
    return pd.DataFrame({"g": np.repeat([f"g{i:02d}" for i in range(g)], m), "a": a, "y": y})


def _runs(rng: np.random.Generator, prompt_sd: float, run_sd: float, effect: tuple[float, ...]) -> pd.DataFrame:
    """180 rows: 3 algorithms x 3 runs each x 20 prompts, ``y ~ algorithm + (1|prompt) + (1|run)``.

    A grouping with SD 0 is put on the boundary for certain: the noise is shifted so that every
    prompt (or every run of an algorithm) has the same mean, so its variance is estimated at 0.
    """
    rows = [(f"a{a}", f"a{a}r{r}", f"p{p:02d}") for a in range(3) for r in range(3) for p in range(20)]
    df = pd.DataFrame(rows, columns=["algorithm", "run", "prompt"])
    e = pd.Series(rng.normal(0, 1, len(df)))
    if prompt_sd == 0:
        e = e - e.groupby(df.prompt).transform("mean") + e.mean()
    if run_sd == 0:
        e = e - e.groupby(df.run).transform("mean") + e.groupby(df.algorithm).transform("mean")
    pe = rng.normal(0, prompt_sd, 20)[df.prompt.str[1:].astype(int)]
    re_ = rng.normal(0, run_sd, 9)[pd.factorize(df.run)[0]]
    df["y"] = np.asarray(effect)[df.algorithm.str[1:].astype(int)] + pe + re_ + e.to_numpy()
    return df


def _cases() -> dict[str, tuple[pd.DataFrame, str, list[str], str | None, bool, str]]:
    """id -> (data, fixed formula, groups, re_formula, reml, R formula)."""
    rng = np.random.default_rng(2024)
    fx = "y ~ algorithm * batch"
    return {
        "nested": (
            _nested(rng),
            "y ~ a + x",
            ["school", "klass"],
            None,
            True,
            "y ~ a + x + (1|school) + (1|klass)",
        ),
        "crossed": (
            _crossed(rng, 30, 6, 1.0),
            fx,
            ["prompt", "seed"],
            None,
            True,
            f"{fx} + (1|prompt) + (1|seed)",
        ),
        "slopes": (_slopes(rng), "y ~ x", ["g"], "~x", True, "y ~ x + (x|g)"),
        "unbalanced": (
            _crossed(rng, 25, 8, 0.65),
            fx,
            ["prompt", "seed"],
            None,
            True,
            f"{fx} + (1|prompt) + (1|seed)",
        ),
        "near_singular": (_one_way(rng, 1.0054), "y ~ a", ["g"], None, True, "y ~ a + (1|g)"),
        "singular": (_one_way(rng, 0.8), "y ~ a", ["g"], None, True, "y ~ a + (1|g)"),
        # singular but healthy: lmerTest's tests are reported (with a remark), not withheld
        "prompt_at_0": (_runs(rng, 0.0, 0.3, (0.0, 1.5, 3.0)), "y ~ algorithm", ["prompt", "run"], None, True,
                        "y ~ algorithm + (1|prompt) + (1|run)"),
        "run_at_0": (_runs(rng, 0.5, 0.0, (0.0, 0.3, 0.5)), "y ~ algorithm", ["prompt", "run"], None, True,
                     "y ~ algorithm + (1|prompt) + (1|run)"),
        "both_at_0": (_runs(rng, 0.0, 0.0, (0.0, 0.3, 0.5)), "y ~ algorithm", ["prompt", "run"], None, True,
                      "y ~ algorithm + (1|prompt) + (1|run)"),
        "runs_healthy": (_runs(rng, 0.5, 0.3, (0.0, 0.8, 1.6)), "y ~ algorithm", ["prompt", "run"], None, True,
                         "y ~ algorithm + (1|prompt) + (1|run)"),
        "crossed_ml": (
            _crossed(rng, 20, 5, 0.8),
            fx,
            ["prompt", "seed"],
            None,
            False,
            f"{fx} + (1|prompt) + (1|seed)",
        ),
    }


@pytest.fixture(scope="module")
def pairs(tmp_path_factory) -> dict[str, tuple[object, dict[str, list[str]]]]:
    """Our fit and lme4's numbers for every case (one Rscript process for all of them)."""
    d = tmp_path_factory.mktemp("lme4")
    cases = _cases()
    specs = []
    for cid, (df, _, _, _, reml, r_formula) in cases.items():
        df.to_csv(d / f"{cid}.csv", index=False)
        specs.append((cid, str(d / f"{cid}.csv"), r_formula, "TRUE" if reml else "FALSE"))
    ref = run_r_fits(R_SCRIPT, pd.DataFrame(specs, columns=["id", "csv", "formula", "reml"]), d)
    return {
        cid: (fit_lmm(df, f, g, reml=reml, re_formula=re, diagnostics=False), ref[cid])
        for cid, (df, f, g, re, reml, _) in cases.items()
    }


def _r_name(term: str) -> str:
    """patsy's ``a[T.a1]:b[T.b1]`` -> R's ``aa1:bb1``."""
    return re.sub(r"(\w+)\[T\.([^\]]+)\]", r"\1\2", term)


def _ours(fit: object, key: str) -> np.ndarray:
    return np.array([getattr(fe, key) for fe in fit.fixed])


def _theirs(fit: object, ref: dict[str, list[str]], key: str) -> np.ndarray:
    pos = {name: i for i, name in enumerate(ref["names"])}
    return np.array([float(ref[key][pos[_r_name(fe.term)]]) for fe in fit.fixed])


CASES = list(_cases())


@needs_lmertest
@pytest.mark.parametrize("cid", CASES)
def test_estimates_and_se_match_lme4(pairs, cid):
    fit, ref = pairs[cid]
    se_r = _theirs(fit, ref, "se")
    est, est_r = _ours(fit, "estimate"), _theirs(fit, ref, "estimate")
    assert np.all(np.abs(est - est_r) <= 1e-6 * np.maximum(np.abs(est_r), se_r)), (est, est_r)
    np.testing.assert_allclose(_ours(fit, "se"), se_r, rtol=1e-4)
    np.testing.assert_allclose(fit.random_sd["Residual"], float(ref["sigma"][0]), rtol=1e-5)
    np.testing.assert_allclose(fit.deviance, float(ref["deviance"][0]), rtol=1e-8)
    assert fit.singular == bool(int(ref["singular"][0]))


@needs_lmertest
@pytest.mark.parametrize("cid", CASES)
def test_satterthwaite_df_match_lmertest(pairs, cid):
    fit, ref = pairs[cid]
    np.testing.assert_allclose(_ours(fit, "df"), _theirs(fit, ref, "df"), rtol=1e-3)
    assert fit.converged


SINGULAR = {"singular": "g", "prompt_at_0": "prompt", "run_at_0": "run", "both_at_0": "prompt, run"}


@needs_lmertest
@pytest.mark.parametrize("cid", CASES)
def test_p_values_match_lmertest_singular_fits_included(pairs, cid):
    """Every fit here is healthy, singular or not: its p-values are lmerTest's, and none is withheld."""
    fit, ref = pairs[cid]
    assert fit.estimable and fit.reason is None
    np.testing.assert_allclose(_ours(fit, "p"), _theirs(fit, ref, "p"), rtol=1e-3)
    np.testing.assert_allclose(_ours(fit, "t"), _theirs(fit, ref, "estimate") / _theirs(fit, ref, "se"), rtol=1e-4)
    d = fit.to_dict()
    assert [v["p"] for v in d["fixed"].values()] == list(_ours(fit, "p")) and d["estimable"] is True
    assert fit.singular == (cid in SINGULAR)
    if cid in SINGULAR:
        remark = f"singular fit: variance of {SINGULAR[cid]} estimated at 0 (boundary); fixed-effect tests as lmerTest"
        assert fit.remarks == (remark,) and d["remarks"] == [remark] and f"Note: {remark}" in fit.summary()
    else:
        assert fit.remarks == ()


@needs_lmertest
def test_singular_designs_give_the_p_values_the_guard_used_to_withhold(pairs):
    """The 180-row design with the prompt variance at 0: the algorithm effect is clear (p 7e-4 in
    lmerTest) and tested against the runs (df 6); with the run variance at 0 it is tested against the
    residual (df ~ n - p), as lmerTest does, and the remark names the grouping that dropped out."""
    fit, ref = pairs["prompt_at_0"]
    fe = fit.term("algorithm[T.a2]")
    assert fe.p < 1e-3 and fe.df == pytest.approx(6.0, rel=1e-3)
    assert "algorithm[T.a2]" in fit.summary().split("Random effects")[1]
    run0, _ = pairs["run_at_0"]
    assert run0.term("algorithm[T.a2]").df > 150 and "variance of run" in run0.remarks[0]


# -- the core itself (no R needed) --------------------------------------------------------------


def _core(df: pd.DataFrame, formula: str, groups: list[str]):
    from pcpo_eval.stats.design import build_design
    from pcpo_eval.stats.lmm_core import LMMCore

    d = build_design(df, formula, groups)
    return LMMCore(d.y, d.X, list(d.blocks))


def test_theta_steps_never_touch_the_rows():
    """After the cross-products are formed, no n-sized array (y, X, Z, level codes) is read again."""
    from pcpo_eval.stats.lmm_core import LMMCore

    core = _core(_crossed(np.random.default_rng(1), 12, 5, 0.8), "y ~ algorithm * batch", ["prompt", "seed"])
    thetas = [np.array([0.7, 0.2]), np.array([1.3, 0.0]), np.array([0.0, 2.0])]
    before = [core.profiled_deviance(t) for t in thetas]
    core._cache.clear()
    core.y = core.X = None
    core.blocks = [replace(b, codes=np.zeros(0, int), design=np.zeros((0, b.k))) for b in core.blocks]
    core.__class__ = type("NoRows", (LMMCore,), {"Z": property(lambda self: pytest.fail("Z was built"))})
    assert [core.profiled_deviance(t) for t in thetas] == pytest.approx(before, rel=1e-12)


def test_sparse_off_diagonal_block_gives_the_dense_result(monkeypatch):
    """The off-diagonal block L21 kept sparse (large designs) or dense: the same factorization."""
    import pcpo_eval.stats.lmm_core as lc

    df = _nested(np.random.default_rng(3))
    dense = _core(df, "y ~ a + x", ["school", "klass"])
    monkeypatch.setattr(lc, "DENSE_L21_CELLS", 0)
    sparse = _core(df, "y ~ a + x", ["school", "klass"])
    assert not isinstance(sparse._cp.a21, np.ndarray) and isinstance(dense._cp.a21, np.ndarray)
    for t in (np.array([0.9, 0.4]), np.array([0.0, 1.5])):
        a, b = dense.solve(t), sparse.solve(t)
        assert a.pwrss == pytest.approx(b.pwrss, rel=1e-12)
        assert a.logdet_L2 == pytest.approx(b.logdet_L2, rel=1e-12)
        np.testing.assert_allclose(a.u, b.u, rtol=1e-10, atol=1e-12)


def test_too_many_columns_outside_the_largest_term_is_a_user_error(monkeypatch):
    import pcpo_eval.stats.lmm_core as lc
    from pcpo_eval.errors import UserError

    monkeypatch.setattr(lc, "MAX_SCHUR", 3)
    with pytest.raises(UserError, match="largest grouping"):
        _core(_crossed(np.random.default_rng(1), 12, 5, 1.0), "y ~ algorithm", ["prompt", "seed"])


def test_convergence_check_flags_a_point_off_the_optimum():
    """lme4's checkConv: passes at the optimum, fails (scaled gradient) away from it."""
    from pcpo_eval.stats.lmm_core import check_convergence

    core = _core(_crossed(np.random.default_rng(5), 15, 6, 1.0), "y ~ algorithm", ["prompt", "seed"])
    theta, _, ok = core.fit_theta()
    good, bad = check_convergence(core, theta), check_convergence(core, theta * 1.5)
    assert ok and not good.failed and not good.singular and good.max_grad < 2e-3
    assert bad.failed and "max|grad|" in bad.failed[0] and bad.max_grad > 2e-3


def agreement_table() -> str:
    """Max relative differences to lme4 / lmerTest per quantity, healthy and singular fits apart
    (``python tests/stats/test_lme4.py``: the numbers quoted in docs/statistics.md)."""
    import tempfile
    from pathlib import Path

    cases = _cases()
    with tempfile.TemporaryDirectory() as tmp:
        d = Path(tmp)
        specs = []
        for cid, (df, _, _, _, reml, r_formula) in cases.items():
            df.to_csv(d / f"{cid}.csv", index=False)
            specs.append((cid, str(d / f"{cid}.csv"), r_formula, "TRUE" if reml else "FALSE"))
        ref = run_r_fits(R_SCRIPT, pd.DataFrame(specs, columns=["id", "csv", "formula", "reml"]), d)
    worst: dict[tuple[str, str], float] = {}
    n = {"healthy": 0, "singular": 0}
    for cid, (df, f, g, re_, reml, _) in cases.items():
        fit = fit_lmm(df, f, g, reml=reml, re_formula=re_, diagnostics=False)
        kind = "singular" if fit.singular else "healthy"
        n[kind] += 1
        se_r = _theirs(fit, ref[cid], "se")
        for key in ("estimate", "se", "df", "p"):
            ours, theirs = _ours(fit, key), _theirs(fit, ref[cid], key)
            scale = np.maximum(np.abs(theirs), se_r) if key == "estimate" else np.abs(theirs)
            worst[kind, key] = max(worst.get((kind, key), 0.0), float(np.max(np.abs(ours - theirs) / scale)))
        dev = abs(fit.deviance - float(ref[cid]["deviance"][0])) / abs(float(ref[cid]["deviance"][0]))
        worst[kind, "deviance"] = max(worst.get((kind, "deviance"), 0.0), dev)
    keys = ("estimate", "se", "df", "p", "deviance")
    lines = ["| fits | " + " | ".join(keys) + " |", "|---|" + "---:|" * len(keys)]
    for kind in ("healthy", "singular"):
        lines.append(f"| {kind} ({n[kind]}) | " + " | ".join(f"{worst[kind, k]:.1e}" for k in keys) + " |")
    return "\n".join(lines)


if __name__ == "__main__":
    print(agreement_table())
