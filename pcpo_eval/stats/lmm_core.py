"""lme4-style penalized least squares core of a linear mixed model (pure numpy/scipy).

This module re-derives, for given variance parameters, the quantities lme4 and lmerTest compute
(Bates et al. 2015, "Fitting Linear Mixed-Effects Models Using lme4", J. Stat. Softw. 67(1),
Sec. 3). statsmodels' MixedLM does the fitting (see :mod:`pcpo_eval.stats.lmm`); this core is what
lets us evaluate the REML deviance and Cov(beta_hat) as functions of the variance parameters in
*lme4's* parameterization, which the Satterthwaite degrees of freedom need (lmerTest,
``devfun_vp`` / ``vcov_beta``).

Notation (lme4 paper -> code)::

    y = X beta + Z b + e,   b = Lambda_theta u,  u ~ N(0, sigma^2 I_q),  e ~ N(0, sigma^2 I_n)
    theta   -> ``theta``: entries of the lower-triangular relative Cholesky factors T_k (one per
               grouping, Lambda = blockdiag(I_{levels_k} kron T_k)), column-major lower triangle
    sigma   -> ``sigma``: residual standard deviation
    L_theta -> ``L``:  lower Cholesky factor of Lambda' Z'Z Lambda + I_q
    R_ZX    -> ``RZX``: L^{-1} Lambda' Z'X
    R_X     -> ``RX``:  upper Cholesky factor of X'X - R_ZX' R_ZX   (= X' V^{-1} X, V = Sigma/sigma^2)
    r^2     -> ``pwrss``: penalized weighted residual sum of squares
               = min_{beta,u} ||y - X beta - Z Lambda u||^2 + ||u||^2

Deviances (lme4 eqs. 34, 41 and lmerTest ``devfun_vp``)::

    ML   (theta, sigma):  log|L|^2 + r^2/sigma^2 + n log(2 pi sigma^2)
    REML (theta, sigma):  log|L|^2 + r^2/sigma^2 + (n-p) log(2 pi sigma^2) + log|R_X|^2
    profiled over sigma:  sigma^2 = r^2/n (ML) or r^2/(n-p) (REML)
    Cov(beta_hat)      =  sigma^2 (R_X' R_X)^{-1}

The cross-products X'X, Z'Z, Z'X, ... are precomputed once, so evaluating the deviance costs
O(q^3) in the number q of random effects and nothing in n: fine for per-image crossed designs
(q = prompts + seeds) where a dense n x n marginal covariance would not fit in memory.
"""

from __future__ import annotations

from dataclasses import dataclass

import numpy as np
import scipy.sparse as sp

#: Relative size of r^2 next to y'y below which r^2 is recomputed from residuals (see ``solve``).
PWRSS_CANCEL_TOL = 1e-6
#: diag(X'V^-1X) / diag(X'X) below which the blocked Cholesky solve is redone by QR.
XTVX_CANCEL_TOL = 1e-8
MAX_QR_CELLS = 5e7  # (n + q) x (q + p + 1) doubles for the QR fallback (400 MB)


@dataclass(frozen=True)
class REBlock:
    """One random-effects term ``(z_1 + ... + z_k | group)``.

    ``codes`` are the integer group levels (0..n_levels-1) of each row, ``design`` the (n, k)
    matrix of random-effect covariates (a column of ones for a random intercept).
    """

    name: str
    codes: np.ndarray
    n_levels: int
    design: np.ndarray
    coef_names: tuple[str, ...]

    @property
    def k(self) -> int:
        """Number of random coefficients per level."""
        return self.design.shape[1]

    @property
    def n_theta(self) -> int:
        """Number of lower-triangular entries of T (k (k+1) / 2)."""
        return self.k * (self.k + 1) // 2


def build_z(blocks: list[REBlock]) -> sp.csc_matrix:
    """Sparse random-effects design Z (n, q); columns level-major within each block (lme4 order)."""
    mats = []
    for b in blocks:
        n = b.design.shape[0]
        rows = np.repeat(np.arange(n), b.k)
        cols = (b.codes[:, None] * b.k + np.arange(b.k)[None, :]).ravel()
        mats.append(sp.csc_matrix((b.design.ravel(), (rows, cols)), shape=(n, b.n_levels * b.k)))
    return sp.hstack(mats, format="csc")


def tril_from_theta(theta_k: np.ndarray, k: int) -> np.ndarray:
    """Lower-triangular T (k, k) from its column-major lower-triangle entries (lme4's theta order)."""
    t = np.zeros((k, k))
    idx = 0
    for j in range(k):
        for i in range(j, k):
            t[i, j] = theta_k[idx]
            idx += 1
    return t


def theta_from_cov(cov_rel: np.ndarray) -> np.ndarray:
    """lme4 theta of one block from its relative covariance Cov(b)/sigma^2 (lower Cholesky).

    A singular (semi-definite) covariance is handled with an eigenvalue floor at zero so that a
    boundary fit maps to theta entries of (numerically) zero rather than failing.
    """
    k = cov_rel.shape[0]
    try:
        t = np.linalg.cholesky(cov_rel)
    except np.linalg.LinAlgError:
        w, v = np.linalg.eigh(cov_rel)
        c = (v * np.clip(w, 0.0, None)) @ v.T + 1e-14 * np.eye(k)
        t = np.linalg.cholesky(c)
    return np.concatenate([t[j:, j] for j in range(k)])


def theta_lower_bounds(blocks: list[REBlock]) -> np.ndarray:
    """lme4 bounds: 0 for diagonal entries of each T, -inf for off-diagonal ones."""
    lb = []
    for b in blocks:
        for j in range(b.k):
            for i in range(j, b.k):
                lb.append(0.0 if i == j else -np.inf)
    return np.asarray(lb)


@dataclass(frozen=True)
class PLSState:
    """Penalized least squares solution at one theta (see module notation)."""

    beta: np.ndarray
    u: np.ndarray
    pwrss: float
    logdet_L2: float
    logdet_RX2: float
    xtvx: np.ndarray  # R_X' R_X = X' V^{-1} X


class LMMCore:
    """Precomputed cross-products of one LMM; evaluates lme4's deviances at any theta.

    Parameters
    ----------
    y, X : response (n,) and fixed-effects design (n, p).
    blocks : random-effects terms; crossed groupings are simply several blocks.
    """

    def __init__(self, y: np.ndarray, X: np.ndarray, blocks: list[REBlock]):
        self.y = np.asarray(y, dtype=np.float64)
        self.X = np.asarray(X, dtype=np.float64)
        self.blocks = blocks
        self.n, self.p = self.X.shape
        self.Z = build_z(blocks)
        self.q = self.Z.shape[1]
        zt = self.Z.T.tocsr()
        self.ZtZ = np.asarray((zt @ self.Z).todense())
        self.ZtX = np.asarray(zt @ self.X)
        self.Zty = np.asarray(zt @ self.y).ravel()
        self.XtX = self.X.T @ self.X
        self.Xty = self.X.T @ self.y
        self.yty = float(self.y @ self.y)
        self.n_theta = sum(b.n_theta for b in blocks)

    # -- parameter maps -------------------------------------------------------------------
    def _lambda_template(self) -> tuple[np.ndarray, np.ndarray, np.ndarray]:
        """Sparsity pattern of Lambda and, per stored entry, its index into theta (lme4's Lind)."""
        parts, i = [], 0
        for b in self.blocks:
            marks = tril_from_theta(np.arange(i + 1, i + b.n_theta + 1, dtype=np.float64), b.k)
            i += b.n_theta
            parts.append(sp.kron(sp.identity(b.n_levels, format="csc"), sp.csc_matrix(marks), format="csc"))
        lam = sp.block_diag(parts, format="csc")
        lam.sort_indices()
        return lam.data.astype(np.int64) - 1, lam.indices.copy(), lam.indptr.copy()

    def lambda_matrix(self, theta: np.ndarray) -> sp.csc_matrix:
        """Lambda_theta = blockdiag_k(I_{levels_k} kron T_k) as a sparse (q, q) matrix."""
        if not hasattr(self, "_lind"):
            self._lind, self._lam_indices, self._lam_indptr = self._lambda_template()
        data = np.asarray(theta, dtype=np.float64)[self._lind]
        return sp.csc_matrix((data, self._lam_indices, self._lam_indptr), shape=(self.q, self.q))

    def block_covariances(self, theta: np.ndarray, sigma: float) -> list[np.ndarray]:
        """Cov(b) per block: sigma^2 T_k T_k'."""
        out, i = [], 0
        for b in self.blocks:
            t = tril_from_theta(theta[i : i + b.n_theta], b.k)
            i += b.n_theta
            out.append(sigma**2 * t @ t.T)
        return out

    # -- penalized least squares ----------------------------------------------------------
    def solve(self, theta: np.ndarray) -> PLSState:
        """Blocked Cholesky PLS solve at ``theta`` (lme4 paper Sec. 3.5).

        Written with M^{-1} = L'^{-1} L^{-1} (M = Lambda'Z'Z Lambda + I) instead of explicit
        triangular solves: R_ZX'R_ZX = W'M^{-1}W with W = Lambda'Z'X, c_u'c_u = w'M^{-1}w with
        w = Lambda'Z'y, and so on. numpy's batched ``solve`` avoids the per-call LAPACK thread
        overhead of ``scipy.linalg.solve_triangular``, which dominated on a shared machine.
        """
        lam = self.lambda_matrix(np.asarray(theta, dtype=np.float64))
        lt = lam.T.tocsr()
        m = lt @ (lt @ self.ZtZ).T + np.eye(self.q)  # Lambda' Z'Z Lambda + I (ZtZ symmetric)
        L = np.linalg.cholesky(m)
        w_y = lt @ self.Zty
        w_x = np.asarray(lt @ self.ZtX)
        sol = np.linalg.solve(m, np.column_stack([w_y, w_x]))  # M^{-1} [w_y, W_X]
        minv_wy, minv_wx = sol[:, 0], sol[:, 1:]
        xtvx = self.XtX - w_x.T @ minv_wx  # R_X'R_X = X'X - R_ZX'R_ZX
        xtvx = 0.5 * (xtvx + xtvx.T)
        if not np.min(np.diag(xtvx) / np.diag(self.XtX)) > XTVX_CANCEL_TOL:
            return self._solve_qr(lam)
        rhs = self.Xty - w_x.T @ minv_wy  # X'y - R_ZX'c_u
        try:
            RX = np.linalg.cholesky(xtvx)
        except np.linalg.LinAlgError:
            return self._solve_qr(lam)
        beta = np.linalg.solve(xtvx, rhs)
        cu2 = float(w_y @ minv_wy)
        cb2 = float(rhs @ beta)
        # u = L'^{-1}(c_u - R_ZX beta) = L'^{-1} L^{-1} (w_y - W_X beta) = M^{-1}(w_y - W_X beta)
        u = minv_wy - minv_wx @ beta
        pwrss = self.yty - cu2 - cb2
        if not pwrss > PWRSS_CANCEL_TOL * self.yty:
            # r^2 = y'y - c_u'c_u - c_b'c_b lost most of its digits to cancellation (residuals tiny
            # next to y, e.g. a nearly constant response): recompute it from its definition,
            # ||y - X beta - Z Lambda u||^2 + ||u||^2, at O(n) cost instead of O(q^3).
            resid = self.y - self.X @ beta - self.Z @ (lam @ u)
            pwrss = float(resid @ resid + u @ u)
        return PLSState(
            beta=beta,
            u=u,
            pwrss=pwrss,
            logdet_L2=2.0 * float(np.sum(np.log(np.diag(L)))),
            logdet_RX2=2.0 * float(np.sum(np.log(np.diag(RX)))),
            xtvx=xtvx,
        )

    def _solve_qr(self, lam: sp.csc_matrix) -> PLSState:
        """The same PLS solve by a Householder QR of the augmented system (numerically stable).

        R of ``[[Z Lambda, X, y], [I_q, 0, 0]]`` holds L' (q x q), R_ZX, R_X, c_u, c_beta and r in
        its last diagonal entry (lme4 paper Sec. 3.5), with no X'X - R_ZX'R_ZX subtraction: used
        when that subtraction has cancelled (a random effect dwarfing the residual, theta ~ 1e9).
        Dense in (n + q) x (q + p + 1), so refused above :data:`MAX_QR_CELLS`.
        """
        q, p, n = self.q, self.p, self.n
        if (n + q) * (q + p + 1) > MAX_QR_CELLS:
            raise np.linalg.LinAlgError("X'V^-1X lost its precision and the design is too large for QR")
        top = np.column_stack([np.asarray((self.Z @ lam).todense()), self.X, self.y])
        bottom = np.column_stack([np.eye(q), np.zeros((q, p + 1))])
        R = np.linalg.qr(np.vstack([top, bottom]), mode="r")
        r11, r12, r22 = R[:q, :q], R[:q, q : q + p], R[q : q + p, q : q + p]
        beta = np.linalg.solve(r22, R[q : q + p, -1])
        u = np.linalg.solve(r11, R[:q, -1] - r12 @ beta)
        return PLSState(
            beta=beta,
            u=u,
            pwrss=float(R[-1, -1] ** 2),
            logdet_L2=2.0 * float(np.sum(np.log(np.abs(np.diag(r11))))),
            logdet_RX2=2.0 * float(np.sum(np.log(np.abs(np.diag(r22))))),
            xtvx=r22.T @ r22,
        )

    def profiled_deviance(self, theta: np.ndarray, reml: bool = True) -> float:
        """Deviance profiled over beta and sigma: lme4's REML criterion / ML deviance (eqs. 34, 41)."""
        s = self.solve(theta)
        if not s.pwrss > 0.0:  # exact fit: the likelihood is unbounded, no finite deviance
            return float("inf")
        if reml:
            nmp = self.n - self.p
            return nmp * (1.0 + np.log(2.0 * np.pi * s.pwrss / nmp)) + s.logdet_L2 + s.logdet_RX2
        return self.n * (1.0 + np.log(2.0 * np.pi * s.pwrss / self.n)) + s.logdet_L2

    def sigma_hat(self, theta: np.ndarray, reml: bool = True) -> float:
        """Residual SD maximizing the (RE)ML likelihood at ``theta``."""
        s = self.solve(theta)
        return float(np.sqrt(s.pwrss / (self.n - self.p if reml else self.n)))

    def deviance_vp(self, varpar: np.ndarray, reml: bool = True) -> float:
        """Deviance at varpar = (theta..., sigma), sigma not profiled (lmerTest ``devfun_vp``)."""
        theta, sigma = np.asarray(varpar[:-1]), float(varpar[-1])
        if not sigma > 0.0:  # boundary sigma = 0 (or a numerical step past it): deviance is +inf
            return float("inf")
        s = self.solve(theta)
        s2 = sigma**2
        dev = s.logdet_L2 + s.pwrss / s2 + self.n * np.log(2.0 * np.pi * s2)
        if reml:
            dev += s.logdet_RX2 - self.p * np.log(2.0 * np.pi * s2)
        return float(dev)

    def vcov_beta(self, varpar: np.ndarray) -> np.ndarray:
        """Cov(beta_hat) = sigma^2 (X' V^{-1} X)^{-1} at varpar (lmerTest ``vcov_beta``)."""
        theta, sigma = np.asarray(varpar[:-1]), float(varpar[-1])
        s = self.solve(theta)
        return sigma**2 * np.linalg.inv(s.xtvx)

    def conditional_fitted(self, theta: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(X beta_hat + Z b_hat, b_hat) with b_hat = Lambda u_hat the conditional modes (BLUPs)."""
        s = self.solve(theta)
        b = self.lambda_matrix(theta) @ s.u
        return self.X @ s.beta + self.Z @ b, b

    def fit_theta(self, theta0: np.ndarray, reml: bool = True) -> tuple[np.ndarray, float, bool]:
        """Minimize the profiled deviance over theta from ``theta0`` within lme4's bounds.

        Used to polish the statsmodels optimum to lme4's precision: L-BFGS-B (finite-difference
        gradients) to get close, then bounded Nelder-Mead with tight tolerances (lme4 itself uses
        the derivative-free BOBYQA). Returns (theta, deviance, optimizer_success).
        """
        from scipy.optimize import minimize

        lb = theta_lower_bounds(self.blocks)
        bounds = [(lo if np.isfinite(lo) else None, None) for lo in lb]
        x0 = np.maximum(np.asarray(theta0, dtype=np.float64), np.where(np.isfinite(lb), lb, -np.inf))

        def f(t: np.ndarray) -> float:
            return self.profiled_deviance(t, reml)

        r1 = minimize(
            f, x0, method="L-BFGS-B", bounds=bounds, options={"ftol": 1e-14, "gtol": 1e-9, "maxiter": 500}
        )
        start = r1.x if r1.fun <= f(x0) else x0
        r2 = minimize(
            f,
            start,
            method="Nelder-Mead",
            bounds=bounds,
            options={
                "xatol": 1e-10,
                "fatol": 1e-12,
                "maxiter": 400 * max(1, start.size),
                "maxfev": 400 * max(1, start.size),
            },
        )
        best = min((r1, r2), key=lambda r: r.fun)
        return np.asarray(best.x), float(best.fun), bool(r1.success or r2.success)
