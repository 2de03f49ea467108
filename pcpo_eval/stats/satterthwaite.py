"""Satterthwaite denominator degrees of freedom for LMM t-tests, as in R's lmerTest.

Method (lmerTest, Kuznetsova et al. 2017, J. Stat. Softw. 82(13), Sec. 3.2 and the package note
``pkg_notes/Satterthwaite_for_LMMs.md``): for a contrast L (p,) of the fixed effects,

    var_con = L' V(tau) L                     V(tau) = Cov(beta_hat) at variance params tau
    g       = d var_con / d tau               (gradient over tau)
    A       = 2 H^{-1}                        H = Hessian of the (RE)ML deviance -2 l(tau) at tau_hat
    df      = 2 var_con^2 / (g' A g)

with tau = (theta..., sigma) on lme4's scale (relative Cholesky entries and the residual SD), the
deviance *not* profiled over sigma. The derivatives are numerical, by central differences with
Richardson extrapolation (the scheme of R's numDeriv, which lmerTest calls: initial relative step
1e-4 for the Jacobian and 0.1 for the Hessian (numDeriv's ``genD`` default), 4 halvings; a small
Hessian step would drown the second differences of a deviance of ~1e3 in rounding error). At an interior optimum df does not depend on the parameterization, since g and
H transform with the same Jacobian; the tests check the numbers against lmerTest.
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import numpy as np

_D_GRAD = 1e-4  # numDeriv grad/jacobian: relative step
_D_HESS = 0.1  # numDeriv hessian (genD): relative step
_EPS = 1e-4  # numDeriv: absolute step for parameters near zero
_ZERO_TOL = np.sqrt(np.finfo(float).eps / 7e-7)
_R = 4  # Richardson levels
#: lmerTest's ``tol``: Hessian eigenvalues above it are inverted, the others are warned about and dropped.
EIG_TOL = 1e-8


def _steps(x: np.ndarray, d: float) -> np.ndarray:
    """Initial step per coordinate: |d x| + eps where |x| is (near) zero (numDeriv convention)."""
    x = np.asarray(x, dtype=np.float64)
    return np.abs(d * x) + _EPS * (np.abs(x) < _ZERO_TOL)


def _richardson(a: list[np.ndarray], order: int = 2) -> np.ndarray:
    """Richardson extrapolation of estimates at steps h, h/2, h/4, ... with error O(h^order)."""
    a = [np.asarray(v, dtype=np.float64) for v in a]
    m = 1
    while len(a) > 1:
        f = 2.0 ** (order * m)
        a = [(f * a[i + 1] - a[i]) / (f - 1.0) for i in range(len(a) - 1)]
        m += 1
    return a[0]


def jacobian(fn: Callable[[np.ndarray], np.ndarray], x: np.ndarray) -> np.ndarray:
    """Jacobian (m, k) of a vector function at x by Richardson-extrapolated central differences."""
    x = np.asarray(x, dtype=np.float64)
    h0 = _steps(x, _D_GRAD)
    cols = []
    for j in range(x.size):
        ests = []
        for r in range(_R):
            h = h0[j] / 2.0**r
            e = np.zeros_like(x)
            e[j] = h
            ests.append((np.ravel(fn(x + e)) - np.ravel(fn(x - e))) / (2.0 * h))
        cols.append(_richardson(ests))
    return np.stack(cols, axis=1)


def hessian(fn: Callable[[np.ndarray], float], x: np.ndarray) -> np.ndarray:
    """Hessian (k, k) of a scalar function at x by Richardson-extrapolated central differences.

    Diagonal: (f(x+h) - 2 f(x) + f(x-h)) / h^2; off-diagonal: the four-point formula
    (f(++) - f(+-) - f(-+) + f(--)) / (4 h_i h_j); both are O(h^2), extrapolated over 4 levels.
    """
    x = np.asarray(x, dtype=np.float64)
    k = x.size
    h0 = _steps(x, _D_HESS)
    f0 = float(fn(x))
    hmat = np.zeros((k, k))
    for i in range(k):
        ests = []
        for r in range(_R):
            h = h0[i] / 2.0**r
            e = np.zeros(k)
            e[i] = h
            ests.append((float(fn(x + e)) - 2.0 * f0 + float(fn(x - e))) / h**2)
        hmat[i, i] = _richardson(ests)
        for j in range(i):
            ests = []
            for r in range(_R):
                hi, hj = h0[i] / 2.0**r, h0[j] / 2.0**r
                ei = np.zeros(k)
                ej = np.zeros(k)
                ei[i], ej[j] = hi, hj
                val = (
                    float(fn(x + ei + ej))
                    - float(fn(x + ei - ej))
                    - float(fn(x - ei + ej))
                    + float(fn(x - ei - ej))
                ) / (4.0 * hi * hj)
                ests.append(val)
            hmat[i, j] = hmat[j, i] = _richardson(ests)
    return hmat


def satterthwaite_df(var_con: float, grad: np.ndarray, a_mat: np.ndarray) -> float:
    """df = 2 var_con^2 / (g' A g) for one contrast (lmerTest ``contest1D``)."""
    denom = float(grad @ a_mat @ grad)
    if not np.isfinite(denom) or denom <= 0.0:
        return float("nan")
    return 2.0 * var_con**2 / denom


@dataclass(frozen=True)
class SatterthwaiteResult:
    """Satterthwaite df of several contrasts and the variance-parameter Hessian they came from."""

    dfs: np.ndarray  # (c,) one df per contrast row, NaN where not computable
    a_mat: np.ndarray  # A = 2 H^-1, or 2 H^+ over eigenvalues above EIG_TOL when H is not positive definite
    eigenvalues: np.ndarray  # of the deviance Hessian H over (theta..., sigma); NaN if H is not finite

    @property
    def hessian_ok(self) -> bool:
        """H is positive definite (every eigenvalue > 0): A = 2 H^-1."""
        return bool(np.all(self.eigenvalues > 0.0))

    @property
    def n_negative(self) -> int:
        """Eigenvalues below -EIG_TOL (lmerTest: "Model failed to converge with k negative eigenvalues")."""
        return int(np.sum(self.eigenvalues < -EIG_TOL))

    @property
    def n_dropped(self) -> int:
        """Eigenvalues left out of A (H not positive definite: those <= EIG_TOL, as lmerTest)."""
        return 0 if self.hessian_ok else int(np.sum(~(self.eigenvalues > EIG_TOL)))


def satterthwaite(
    deviance_vp: Callable[[np.ndarray], float],
    vcov_beta: Callable[[np.ndarray], np.ndarray],
    varpar: np.ndarray,
    contrasts: np.ndarray,
) -> SatterthwaiteResult:
    """Satterthwaite df for each row of ``contrasts`` (c, p), as lmerTest 3.1 computes them.

    lmerTest (``as_lmerModLT``) inverts the Hessian H of the deviance over (theta..., sigma) on its
    eigenvalues above 1e-8 only, A = 2 sum_{lambda_i > tol} v_i v_i' / lambda_i, and warns about
    the others (negative: failed to converge; near zero: may not have converged). The same here
    whenever H is not positive definite. A positive definite H is inverted in full: the same A
    as lmerTest's unless an eigenvalue lies in (0, 1e-8], which happens where a theta is huge
    (a random effect dwarfing the residual, theta ~ 1e9; H's theta entries ~ 1/theta^2): there
    the small eigenvalue is the scale of theta, not flatness, and dropping it gives lmerTest's
    wrong df (103 or 3 where the design has 132; tests/stats/test_degenerate.py).

    Singular fits need nothing special: a component estimated at 0 (theta_k = 0) stays in the
    parameter vector, and the central differences step to both sides of it (the deviance is even
    in a random intercept's theta, so its cross terms in H and its column of the Jacobian of
    Cov(beta) vanish there, and it drops out of g'Ag). A non-finite H gives NaN df.
    """
    varpar = np.asarray(varpar, dtype=np.float64)
    h = hessian(deviance_vp, varpar)
    h = 0.5 * (h + h.T)
    p = contrasts.shape[1]
    if not np.all(np.isfinite(h)):  # a step left the parameter space: no df, reported as NaN
        nan = np.full(h.shape[0], np.nan)
        return SatterthwaiteResult(np.full(contrasts.shape[0], np.nan), np.full_like(h, np.nan), nan)
    eig, vec = np.linalg.eigh(h)
    if np.all(eig > 0.0):
        a_mat = 2.0 * np.linalg.inv(h)
    else:
        pos = eig > EIG_TOL
        a_mat = 2.0 * (vec[:, pos] / eig[pos]) @ vec[:, pos].T
    jac = jacobian(lambda vp: vcov_beta(vp).ravel(), varpar)  # (p*p, k)
    jac = jac.reshape(p, p, -1)
    v = vcov_beta(varpar)
    dfs = []
    for c in contrasts:
        var_con = float(c @ v @ c)
        grad = np.einsum("i,ijk,j->k", c, jac, c)
        dfs.append(satterthwaite_df(var_con, grad, a_mat))
    return SatterthwaiteResult(np.asarray(dfs), a_mat, eig)


def satterthwaite_dfs(
    deviance_vp: Callable[[np.ndarray], float],
    vcov_beta: Callable[[np.ndarray], np.ndarray],
    varpar: np.ndarray,
    contrasts: np.ndarray,
) -> tuple[np.ndarray, np.ndarray, bool]:
    """(df (c,), A, hessian_ok) of :func:`satterthwaite`; ``hessian_ok``: H positive definite."""
    r = satterthwaite(deviance_vp, vcov_beta, varpar, contrasts)
    return r.dfs, r.a_mat, r.hessian_ok
