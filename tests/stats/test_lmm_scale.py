"""The nested-term elimination of ``lmm_core`` (per-image designs: images nested in prompts).

Reference: the dense Schur complement path it replaces (``NESTED_ELIMINATION = False``), which is
the same factorization of M = Lambda'Z'Z Lambda + I in another elimination order, so every PLS
quantity at a given theta agrees to rounding. Full fits agree to the optimizer's resolution
(COBYQA stops at a trust radius of 1e-8, and its path depends on the last bits of the deviance).
"""

from __future__ import annotations

import numpy as np
import pandas as pd
import pytest

import pcpo_eval.stats.lmm_core as lc
from pcpo_eval.errors import UserError
from pcpo_eval.stats.lmm import fit_lmm
from pcpo_eval.stats.lmm_core import LMMCore, REBlock
from pcpo_eval.stats.satterthwaite import satterthwaite


@pytest.fixture(autouse=True)
def _one_blas_thread():
    """As ``fit_lmm``: small dense algebra, BLAS threads only add contention."""
    from threadpoolctl import threadpool_limits

    with threadpool_limits(limits=1, user_api="blas"):
        yield


def _per_image(rng: np.random.Generator, prompts: int, images: int, runs_per_arm: int) -> pd.DataFrame:
    """One row per (run, image), images nested in prompts, as the study's per-image table."""
    pid = np.repeat(np.arange(prompts), images)
    pe, ie = rng.normal(0, 0.5, prompts), rng.normal(0, 0.3, prompts * images)
    frames = []
    for a in range(2):
        for r in range(runs_per_arm):
            x = rng.normal(size=pid.size)
            v = 0.2 * a + rng.normal(0, 0.15) + pe[pid] + ie + 0.4 * x + rng.normal(size=pid.size)
            frames.append(
                pd.DataFrame(
                    {
                        "prompt": pid,
                        "image": np.arange(pid.size),
                        "run": f"a{a}r{r}",
                        "algorithm": f"A{a}",
                        "x": x,
                        "value": v,
                    }
                )
            )
    return pd.concat(frames, ignore_index=True)


def _blocks(rng: np.random.Generator, slope: bool, seed: bool, runs: int = 4):
    """(y, X, blocks): (1 [+ x] | prompt) + (1 | image) + (1 | run) [+ (1 | seed), crossed]."""
    prompts, images = 40, 4
    pid = np.tile(np.repeat(np.arange(prompts), images), runs)
    img = np.tile(np.arange(prompts * images), runs)
    run = np.repeat(np.arange(runs), prompts * images)
    n = pid.size
    x, one = rng.normal(size=n), np.ones((n, 1))
    X = np.column_stack([one, run % 2, x])
    y = (
        0.3 * (run % 2)
        + rng.normal(0, 0.5, prompts)[pid]
        + rng.normal(0, 0.3, prompts)[pid] * x
        + rng.normal(0, 0.3, prompts * images)[img]
        + rng.normal(0, 0.2, runs)[run]
        + rng.normal(size=n)
    )
    prompt = (
        REBlock("prompt", pid, prompts, np.column_stack([one, x]), ("(Intercept)", "x"))
        if slope
        else REBlock("prompt", pid, prompts, one, ("(Intercept)",))
    )
    blocks = [prompt, REBlock("image", img, prompts * images, one, ("(Intercept)",))]
    blocks.append(REBlock("run", run, runs, one, ("(Intercept)",)))
    if seed:
        blocks.append(REBlock("seed", img % images, images, one, ("(Intercept)",)))
    return y, X, blocks


def _dense_core(monkeypatch, y, X, blocks) -> LMMCore:
    with monkeypatch.context() as m:
        m.setattr(lc, "NESTED_ELIMINATION", False)
        core = LMMCore(y, X, blocks)
    assert core._cp.nested is None
    return core


def _random_theta(rng: np.random.Generator, blocks: list[REBlock]) -> np.ndarray:
    lb = lc.theta_lower_bounds(blocks)
    return np.where(np.isfinite(lb), rng.uniform(0.05, 2.5, lb.size), rng.normal(0, 0.5, lb.size))


def _assert_same_solve(a: LMMCore, b: LMMCore, theta: np.ndarray, rtol: float = 1e-10) -> None:
    sa, sb = a.solve(theta), b.solve(theta)
    assert sb.pwrss == pytest.approx(sa.pwrss, rel=rtol)
    assert sb.logdet_L2 == pytest.approx(sa.logdet_L2, rel=rtol, abs=1e-12)
    assert sb.logdet_RX2 == pytest.approx(sa.logdet_RX2, rel=rtol)
    np.testing.assert_allclose(sb.beta, sa.beta, rtol=rtol, atol=1e-13)
    np.testing.assert_allclose(sb.xtvx, sa.xtvx, rtol=rtol, atol=rtol * np.max(np.abs(sa.xtvx)))
    np.testing.assert_allclose(sb.u, sa.u, rtol=1e-8, atol=1e-11 * np.max(np.abs(sa.u)))


def test_nesting_is_detected_from_the_codes_exactly():
    codes_img = np.array([0, 1, 2, 3, 0, 1, 2, 3])
    img = REBlock("image", codes_img, 4, np.ones((8, 1)), ("(Intercept)",))
    prompt = REBlock("prompt", np.array([0, 0, 1, 1, 0, 0, 1, 1]), 2, np.ones((8, 1)), ("(Intercept)",))
    np.testing.assert_array_equal(lc._nested_parent(img, prompt), [0, 0, 1, 1])
    crossed = REBlock("prompt", np.array([0, 0, 1, 1, 0, 1, 1, 1]), 2, np.ones((8, 1)), ("(Intercept)",))
    assert lc._nested_parent(img, crossed) is None  # image 1 falls in prompts 0 and 1


@pytest.mark.parametrize(
    ("slope", "seed", "runs"),
    [(False, False, 4), (True, False, 4), (False, True, 4), (True, True, 6), (False, False, 0)],
    ids=["intercepts", "prompt-slope", "crossed-seed", "slope-and-seed", "no-remainder"],
)
def test_nested_elimination_matches_the_dense_schur_complement(monkeypatch, slope, seed, runs):
    rng = np.random.default_rng(11)
    y, X, blocks = _blocks(rng, slope, seed, max(runs, 2))
    if runs == 0:
        blocks = blocks[:2]
    nested, dense = LMMCore(y, X, blocks), _dense_core(monkeypatch, y, X, blocks)
    assert nested._cp.nested is not None and nested._cp.nested.k == (2 if slope else 1)
    assert nested._cp.a22.shape[0] == sum(b.q for b in blocks[2:])  # only run/seed are dense
    for theta in [lc.theta_start(blocks)] + [_random_theta(rng, blocks) for _ in range(4)]:
        _assert_same_solve(dense, nested, theta)
    # At the fitted theta: deviance, sigma, Cov(beta) and Satterthwaite df (lme4 / lmerTest paths).
    theta, dev, _ = nested.fit_theta()
    assert dense.profiled_deviance(theta) == pytest.approx(dev, rel=1e-10)
    vp = np.r_[theta, dense.sigma_hat(theta)]
    assert nested.sigma_hat(theta) == pytest.approx(vp[-1], rel=1e-10)
    np.testing.assert_allclose(nested.vcov_beta(vp), dense.vcov_beta(vp), rtol=1e-9)
    sa = satterthwaite(dense.deviance_vp, dense.vcov_beta, vp, np.eye(X.shape[1]))
    sb = satterthwaite(nested.deviance_vp, nested.vcov_beta, vp, np.eye(X.shape[1]))
    np.testing.assert_allclose(sb.dfs, sa.dfs, rtol=1e-6)  # 2nd differences at step 1e-4 of 1e-13 noise


def test_sparse_remainder_rows_give_the_dense_result(monkeypatch):
    """The run/seed rows of L21 kept sparse (large designs) or dense under the nested elimination."""
    rng = np.random.default_rng(5)
    y, X, blocks = _blocks(rng, False, True)
    dense_rows = LMMCore(y, X, blocks)
    monkeypatch.setattr(lc, "DENSE_L21_CELLS", 0)
    sparse_rows = LMMCore(y, X, blocks)
    assert isinstance(dense_rows._cp.a21, np.ndarray) and not isinstance(sparse_rows._cp.a21, np.ndarray)
    for theta in [_random_theta(rng, blocks) for _ in range(3)]:
        _assert_same_solve(dense_rows, sparse_rows, theta)


def test_per_image_fit_matches_the_dense_path(monkeypatch):
    df = _per_image(np.random.default_rng(3), 60, 4, 2)
    groups = ["prompt", "image", "run"]
    nested = fit_lmm(df, "value ~ algorithm + x", groups)
    monkeypatch.setattr(lc, "NESTED_ELIMINATION", False)
    dense = fit_lmm(df, "value ~ algorithm + x", groups)
    assert nested.converged and dense.converged
    assert nested.loglik == pytest.approx(dense.loglik, rel=1e-10)
    np.testing.assert_allclose(nested.theta, dense.theta, rtol=1e-6)
    for a, b in zip(nested.fixed, dense.fixed, strict=True):
        assert a.term == b.term
        assert a.estimate == pytest.approx(b.estimate, rel=1e-7)
        assert a.se == pytest.approx(b.se, rel=1e-7)
        assert a.df == pytest.approx(b.df, rel=1e-5)


def test_a_design_that_is_not_nested_keeps_the_dense_path(monkeypatch):
    """One image spread over two prompts breaks the nesting: dense Schur complement, same numbers."""
    rng = np.random.default_rng(7)
    y, X, blocks = _blocks(rng, False, False)
    codes = blocks[0].codes.copy()
    codes[np.flatnonzero(blocks[1].codes == 5)[0]] = 39  # image 5 (prompt 1) once in prompt 39
    blocks[0] = REBlock("prompt", codes, 40, blocks[0].design, blocks[0].coef_names)
    core = LMMCore(y, X, blocks)
    assert core._cp.nested is None and core._cp.a22.shape[0] == 40 + 4
    reference = _dense_core(monkeypatch, y, X, blocks)
    for theta in [_random_theta(rng, blocks) for _ in range(3)]:
        _assert_same_solve(reference, core, theta, rtol=0.0)  # the very same code path


def test_max_schur_counts_only_the_densely_factored_columns(monkeypatch):
    rng = np.random.default_rng(2)
    y, X, blocks = _blocks(rng, False, False, runs=3)
    monkeypatch.setattr(lc, "MAX_SCHUR", 3)
    assert LMMCore(y, X, blocks)._cp.nested is not None  # 3 run columns: allowed
    monkeypatch.setattr(lc, "MAX_SCHUR", 2)
    with pytest.raises(UserError, match="^3 random-effect columns outside the largest grouping and the"):
        LMMCore(y, X, blocks)


def test_more_prompts_than_max_schur_fit():
    """7,000 prompts x 2 images x 4 runs: refused by the dense Schur complement, now a quick fit."""
    df = _per_image(np.random.default_rng(9), 7000, 2, 2)
    fit = fit_lmm(df, "value ~ algorithm", ["prompt", "image", "run"], diagnostics=False)
    assert fit.n_groups == {"prompt": 7000, "image": 14000, "run": 4}
    assert fit.estimable and np.isfinite(fit.loglik)
    assert fit.random_sd["prompt"] == pytest.approx(0.5, rel=0.1)
