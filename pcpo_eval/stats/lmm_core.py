"""lme4's formulation of a linear mixed model: profiled (RE)ML deviance in theta, n-free per theta.

Reference: Bates, Maechler, Bolker, Walker (2015), "Fitting Linear Mixed-Effects Models Using
lme4", J. Stat. Softw. 67(1), Sec. 3 (eqs. 5-6 model, 16-19 PLS, 34 ML and 41 REML profiled
deviances); lmerTest (Kuznetsova et al. 2017) for ``devfun_vp`` / ``vcov_beta``.

Notation (lme4 paper -> code)::

    y = X beta + Z b + e,   b = Lambda_theta u,  u ~ N(0, sigma^2 I_q),  e ~ N(0, sigma^2 I_n)
    theta   -> ``theta``: entries of the lower-triangular relative Cholesky factors T_k (one per
               term, Lambda = blockdiag_k(I_{levels_k} kron T_k)), column-major lower triangle
    L_theta -> lower Cholesky factor of M = Lambda' Z'Z Lambda + I_q
    R_ZX    -> L^{-1} Lambda' Z'X;   R_X -> Cholesky factor of X'X - R_ZX'R_ZX (= X'V^{-1}X)
    r^2     -> ``pwrss`` = min_{beta,u} ||y - X beta - Z Lambda u||^2 + ||u||^2

Deviances (lme4 eqs. 34, 41 and lmerTest ``devfun_vp``)::

    ML   (theta, sigma):  log|L|^2 + r^2/sigma^2 + n log(2 pi sigma^2)
    REML (theta, sigma):  log|L|^2 + r^2/sigma^2 + (n-p) log(2 pi sigma^2) + log|R_X|^2
    profiled over sigma:  sigma^2 = r^2/n (ML) or r^2/(n-p) (REML)
    Cov(beta_hat)      =  sigma^2 (R_X' R_X)^{-1}

Sparse Cholesky by block elimination. Z'Z, Z'X, X'X, Z'y, X'y and y'y are formed once; nothing
per theta touches the n rows. The term with the most columns (the prompts, say) is ordered first:
its part of M is block diagonal (one k x k block per level, since each row has one level), so its
Cholesky factor L11 is a batch of k x k factors. The off-diagonal block L21 = M21 L11^{-T} has the
sparsity of M21, and the remaining terms (seeds, runs) see only the Schur complement
S = M22 - L21 L21', factored densely. This is the factorization a sparse Cholesky finds for such
designs with a good ordering, in numpy/scipy alone: per theta it costs 0.3 ms (32k rows) and
~2 ms (1M rows) on the crossed design of ``benchmarks/bench_lmm_scale.py``, where CHOLMOD
(scikit-sparse 0.4.16, which needs Debian's libsuitesparse-dev and a compile) took 0.08 / 6 ms
simplicial and 0.6 / 95 ms supernodal, a small part of a fit either way. Its limit is the dense
Schur complement: the columns outside the first term must stay below :data:`MAX_SCHUR`.
"""

from __future__ import annotations

from collections import OrderedDict
from dataclasses import dataclass
from functools import cached_property

import numpy as np
import scipy.linalg as sla
import scipy.sparse as sp

from pcpo_eval.errors import UserError

#: Relative size of r^2 next to y'y below which r^2 is recomputed from residuals (see ``solve``).
PWRSS_CANCEL_TOL = 1e-6
#: diag(X'V^-1X) / diag(X'X) below which the blocked Cholesky solve is redone by QR.
XTVX_CANCEL_TOL = 1e-8
MAX_QR_CELLS = 5e7  # (n + q) x (q + p + 1) doubles for the QR fallback (400 MB)
MAX_SCHUR = 6000  # random-effect columns outside the first term (dense Schur complement, 288 MB)
DENSE_L21_CELLS = 1e7  # q2 x q1 cells up to which the off-diagonal block is kept dense (80 MB)
_CACHE = 16  # PLS solutions kept per core (the Satterthwaite derivatives revisit thetas)
BOUNDARY_TOL = 1e-5  # lme4: lmerControl(boundary.tol) and restart_edge's btol
SINGULAR_TOL = 1e-4  # lme4: check.conv.singular tol (isSingular) on the diagonals of T
GRAD_TOL = 2e-3  # lme4: check.conv.grad tol on min(|H^-1 g|, |g|)
HESS_TOL = 1e-6  # lme4: check.conv.hess tol on the Hessian's eigenvalues
DERIV_DELTA = 1e-4  # lme4: deriv12's step
#: Methods of :func:`minimize_bounded`: COBYQA (Powell's successor to BOBYQA, in SciPy) first.
METHODS = ("cobyqa", "nelder-mead")
_HUGE = 1e300  # stands in for an infinite deviance inside the optimizers
RESCALE_ABOVE = 10.0  # |theta| above which fit_theta reruns the optimizer in relative units


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

    @property
    def q(self) -> int:
        """Columns of Z for this term (levels x k)."""
        return self.n_levels * self.k


def build_z(blocks: list[REBlock]) -> sp.csc_matrix:
    """Sparse random-effects design Z (n, q); columns level-major within each block (lme4 order)."""
    mats = []
    for b in blocks:
        n = b.design.shape[0]
        rows = np.repeat(np.arange(n), b.k)
        cols = (b.codes[:, None] * b.k + np.arange(b.k)[None, :]).ravel()
        mats.append(sp.csc_matrix((b.design.ravel(), (rows, cols)), shape=(n, b.q)))
    return sp.hstack(mats, format="csc")


def tril_from_theta(theta_k: np.ndarray, k: int) -> np.ndarray:
    """Lower-triangular T (k, k) from its column-major lower-triangle entries (lme4's theta order)."""
    t = np.zeros((k, k))
    rows, cols = np.tril_indices(k)
    order = np.lexsort((rows, cols))  # column-major
    t[rows[order], cols[order]] = theta_k
    return t


def theta_lower_bounds(blocks: list[REBlock]) -> np.ndarray:
    """lme4 bounds: 0 for diagonal entries of each T, -inf for off-diagonal ones."""
    lb = []
    for b in blocks:
        for j in range(b.k):
            for i in range(j, b.k):
                lb.append(0.0 if i == j else -np.inf)
    return np.asarray(lb)


def theta_start(blocks: list[REBlock]) -> np.ndarray:
    """lme4's default start: 1 on the diagonals of each T, 0 off them."""
    return np.where(np.isfinite(theta_lower_bounds(blocks)), 1.0, 0.0)


@dataclass(frozen=True)
class PLSState:
    """Penalized least squares solution at one theta (see module notation)."""

    beta: np.ndarray
    u: np.ndarray
    pwrss: float
    logdet_L2: float
    logdet_RX2: float
    xtvx: np.ndarray  # R_X' R_X = X' V^{-1} X


@dataclass(frozen=True)
class _Factor:
    """Cholesky factor of M at one theta, in the block-elimination layout (module docstring)."""

    t1: np.ndarray  # T of the first term (k1, k1)
    t2: tuple[np.ndarray, ...]  # T of each other term, in ``_CrossProducts.rest`` order
    l11_inv: np.ndarray  # (m1, k1, k1) inverses of the per-level factors
    l21: np.ndarray | sp.csr_matrix  # (q2, q1)
    l22: np.ndarray  # (q2, q2)
    logdet: float  # log|L|^2


def _zt_w(b: REBlock, w: np.ndarray) -> np.ndarray:
    """Z_b' W (q_b, r) by one bincount per (coefficient, column of W): O(n k r), Z never formed."""
    out = np.empty((b.n_levels, b.k, w.shape[1]))
    for a in range(b.k):
        for j in range(w.shape[1]):
            out[:, a, j] = np.bincount(b.codes, weights=b.design[:, a] * w[:, j], minlength=b.n_levels)
    return out.reshape(b.q, -1)


def _zt_z_diag(b: REBlock) -> np.ndarray:
    """The k x k diagonal blocks (m, k, k) of Z_b'Z_b (one level per row, so the rest is zero)."""
    out = np.empty((b.n_levels, b.k, b.k))
    for a, c in np.ndindex(b.k, b.k):
        out[:, a, c] = np.bincount(b.codes, weights=b.design[:, a] * b.design[:, c], minlength=b.n_levels)
    return out


def _zt_z(bi: REBlock, bj: REBlock, dense: bool) -> np.ndarray | sp.csr_matrix:
    """Z_i'Z_j (q_i, q_j) of two different terms from their level codes: dense by bincount, else
    sparse (one entry per row and coefficient pair, duplicates summed)."""
    if dense:
        cell = bi.codes * bj.n_levels + bj.codes
        out = np.empty((bi.n_levels, bi.k, bj.n_levels, bj.k))
        for a, c in np.ndindex(bi.k, bj.k):
            w = bi.design[:, a] * bj.design[:, c]
            out[:, a, :, c] = np.bincount(cell, weights=w, minlength=bi.n_levels * bj.n_levels).reshape(
                bi.n_levels, bj.n_levels
            )
        return out.reshape(bi.q, bj.q)
    rows = (bi.codes[:, None, None] * bi.k + np.arange(bi.k)[None, :, None]) + np.zeros((1, 1, bj.k), int)
    cols = (bj.codes[:, None, None] * bj.k + np.arange(bj.k)[None, None, :]) + np.zeros((1, bi.k, 1), int)
    vals = bi.design[:, :, None] * bj.design[:, None, :]
    return sp.coo_matrix((vals.ravel(), (rows.ravel(), cols.ravel())), shape=(bi.q, bj.q)).tocsr()


class _CrossProducts:
    """Z'Z, Z'X|y, X'X, X'y, y'y split as (first term, rest): everything a theta step needs.

    Formed once from the level codes (bincounts over the n rows); Z itself is never built here.
    """

    def __init__(self, y: np.ndarray, X: np.ndarray, blocks: list[REBlock]):
        self.first = int(np.argmax([b.q for b in blocks]))
        self.rest = [i for i in range(len(blocks)) if i != self.first]
        offs = np.cumsum([0] + [b.q for b in blocks])
        self.idx1 = np.arange(offs[self.first], offs[self.first + 1])
        self.idx2 = np.concatenate([np.arange(offs[i], offs[i + 1]) for i in self.rest] + [np.zeros(0, int)])
        q1, q2 = self.idx1.size, self.idx2.size
        if q2 > MAX_SCHUR:
            raise UserError(
                f"{q2} random-effect columns outside the largest grouping exceed {MAX_SCHUR}; "
                "fit this design with R's lme4 (sparse CHOLMOD) or drop a grouping"
            )
        b1, rest = blocks[self.first], [blocks[i] for i in self.rest]
        self.m1, self.k1 = b1.n_levels, b1.k
        self.a11 = _zt_z_diag(b1)
        dense = q1 * q2 <= DENSE_L21_CELLS
        parts = [_zt_z(b, b1, dense) for b in rest]
        self.a21 = (
            (np.vstack(parts) if dense else sp.vstack(parts, format="csr")) if parts else np.zeros((0, q1))
        )
        self.a22 = np.zeros((q2, q2))
        ro = np.cumsum([0] + [b.q for b in rest])
        for i, bi in enumerate(rest):
            diag = _zt_z_diag(bi)
            self.a22[ro[i] : ro[i + 1], ro[i] : ro[i + 1]] = _block_diag_sparse(diag).toarray()
            for j in range(i):
                cross = _zt_z(bi, rest[j], True)
                self.a22[ro[i] : ro[i + 1], ro[j] : ro[j + 1]] = cross
                self.a22[ro[j] : ro[j + 1], ro[i] : ro[i + 1]] = cross.T
        xy = np.column_stack([X, y])
        self.w1 = _zt_w(b1, xy).reshape(self.m1, self.k1, -1)
        self.w2 = np.vstack([_zt_w(b, xy) for b in rest] + [np.zeros((0, xy.shape[1]))])
        self.XtX = X.T @ X
        self.Xty = X.T @ y
        self.yty = float(y @ y)


def _lam_t_rest(ts: tuple[np.ndarray, ...], levels: list[int], x: np.ndarray) -> np.ndarray:
    """Lambda_2' x for the stacked rows of the non-first terms (per level, T_b' times a k_b slice)."""
    out = np.empty_like(x)
    off = 0
    for t, m in zip(ts, levels, strict=True):
        k = t.shape[0]
        seg = x[off : off + m * k].reshape(m, k, -1)
        out[off : off + m * k] = np.einsum("ba,lbr->lar", t, seg).reshape(m * k, -1)
        off += m * k
    return out


def _block_diag_sparse(blocks: np.ndarray) -> sp.csr_matrix:
    """Sparse block-diagonal matrix from a (m, k, k) stack of blocks (vectorized sp.block_diag)."""
    m, k, _ = blocks.shape
    base = (np.arange(m) * k)[:, None, None]
    rows = np.broadcast_to(base + np.arange(k)[None, :, None], blocks.shape)
    cols = np.broadcast_to(base + np.arange(k)[None, None, :], blocks.shape)
    return sp.csr_matrix((blocks.ravel(), (rows.ravel(), cols.ravel())), shape=(m * k, m * k))


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
        self.blocks = list(blocks)
        self.n, self.p = self.X.shape
        self.q = sum(b.q for b in self.blocks)
        self.n_theta = sum(b.n_theta for b in self.blocks)
        self._cp = _CrossProducts(self.y, self.X, self.blocks)
        self._cache: OrderedDict[bytes, PLSState] = OrderedDict()
        self._lind, self._lam_indices, self._lam_indptr = self._lambda_template()

    @cached_property
    def Z(self) -> sp.csc_matrix:
        """Sparse Z (n, q), built on first use (the QR fallback only; fits use cross-products)."""
        return build_z(self.blocks)

    def z_times(self, v: np.ndarray) -> np.ndarray:
        """Z v (n,) from the level codes, without forming Z."""
        out, off = np.zeros(self.n), 0
        for b in self.blocks:
            vb = np.asarray(v[off : off + b.q]).reshape(b.n_levels, b.k)
            out += np.einsum("ik,ik->i", b.design, vb[b.codes])
            off += b.q
        return out

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
        data = np.asarray(theta, dtype=np.float64)[self._lind]
        return sp.csc_matrix((data, self._lam_indices, self._lam_indptr), shape=(self.q, self.q))

    def _t_factors(self, theta: np.ndarray) -> list[np.ndarray]:
        """T_k of every term, in block order."""
        out, i = [], 0
        for b in self.blocks:
            out.append(tril_from_theta(theta[i : i + b.n_theta], b.k))
            i += b.n_theta
        return out

    def block_covariances(self, theta: np.ndarray, sigma: float) -> list[np.ndarray]:
        """Cov(b) per block: sigma^2 T_k T_k'."""
        return [sigma**2 * t @ t.T for t in self._t_factors(np.asarray(theta, dtype=np.float64))]

    # -- the factorization ----------------------------------------------------------------
    def _factor(self, theta: np.ndarray) -> _Factor:
        """L of M = Lambda'Z'Z Lambda + I by block elimination (module docstring): L11, L21, L22."""
        cp = self._cp
        ts = self._t_factors(theta)
        t1, t2 = ts[cp.first], tuple(ts[i] for i in cp.rest)
        levels = [self.blocks[i].n_levels for i in cp.rest]
        m11 = np.einsum("ba,lbc,cd->lad", t1, cp.a11, t1) + np.eye(cp.k1)
        l11 = np.linalg.cholesky(m11)
        l11_inv = np.linalg.inv(l11)
        q1, q2 = cp.idx1.size, cp.idx2.size
        if isinstance(cp.a21, np.ndarray):
            m21 = np.einsum("rlb,bd->rld", _lam_t_rest(t2, levels, cp.a21).reshape(q2, cp.m1, cp.k1), t1)
            l21 = np.einsum("rla,lba->rlb", m21, l11_inv).reshape(q2, q1)
            gram = l21 @ l21.T
        else:
            lam1 = _block_diag_sparse(np.broadcast_to(t1, (cp.m1, cp.k1, cp.k1)))
            lam2 = sp.block_diag(
                [
                    _block_diag_sparse(np.broadcast_to(t, (m, *t.shape)))
                    for t, m in zip(t2, levels, strict=True)
                ]
            )
            l21 = (lam2.T @ cp.a21 @ lam1 @ _block_diag_sparse(l11_inv.transpose(0, 2, 1))).tocsr()
            gram = (l21 @ l21.T).toarray()
        m22 = _lam_t_rest(t2, levels, _lam_t_rest(t2, levels, cp.a22).T).T
        l22 = np.linalg.cholesky(m22 + np.eye(q2) - gram)
        diag11 = np.diagonal(l11, axis1=1, axis2=2)
        logdet = 2.0 * float(np.sum(np.log(diag11)) + np.sum(np.log(np.diag(l22))))
        return _Factor(t1, t2, l11_inv, l21, l22, logdet)

    def _forward(self, f: _Factor) -> np.ndarray:
        """[R_ZX, c_u] = L^{-1} Lambda' [Z'X, Z'y], rows in (first term, rest) order, shape (q, p + 1)."""
        cp = self._cp
        levels = [self.blocks[i].n_levels for i in cp.rest]
        r1 = np.einsum("lab,lbr->lar", f.l11_inv, np.einsum("ba,lbr->lar", f.t1, cp.w1))
        r1 = r1.reshape(cp.idx1.size, -1)
        rhs2 = _lam_t_rest(f.t2, levels, cp.w2) - f.l21 @ r1
        r2 = sla.solve_triangular(f.l22, rhs2, lower=True, check_finite=False)
        return np.vstack([r1, r2])

    def _backward(self, f: _Factor, v: np.ndarray) -> np.ndarray:
        """u = L'^{-1} v for v in (first term, rest) order; returned in Z's column order."""
        cp = self._cp
        q1 = cp.idx1.size
        u2 = sla.solve_triangular(f.l22, v[q1:], lower=True, trans="T", check_finite=False)
        w1 = (v[:q1] - f.l21.T @ u2).reshape(cp.m1, cp.k1)
        u1 = np.einsum("lba,lb->la", f.l11_inv, w1).ravel()
        u = np.empty(self.q)
        u[cp.idx1], u[cp.idx2] = u1, u2
        return u

    # -- penalized least squares ----------------------------------------------------------
    def solve(self, theta: np.ndarray) -> PLSState:
        """PLS solution at ``theta`` by the blocked Cholesky of lme4's Sec. 3.5 (cached per theta).

        R_X'R_X = X'X - R_ZX'R_ZX, c_beta = R_X^{-T}(X'y - R_ZX'c_u), r^2 = y'y - c_u'c_u -
        c_beta'c_beta, u = L'^{-1}(c_u - R_ZX beta). When a subtraction has cancelled (a random
        effect dwarfing the residual, or residuals tiny next to y) the solve is redone stably.
        """
        theta = np.asarray(theta, dtype=np.float64)
        key = theta.tobytes()
        if key in self._cache:
            self._cache.move_to_end(key)
            return self._cache[key]
        state = self._solve_blocked(theta)
        self._cache[key] = state
        if len(self._cache) > _CACHE:
            self._cache.popitem(last=False)
        return state

    def _solve_blocked(self, theta: np.ndarray) -> PLSState:
        cp = self._cp
        f = self._factor(theta)
        r = self._forward(f)
        rzx, cu = r[:, :-1], r[:, -1]
        xtvx = cp.XtX - rzx.T @ rzx
        xtvx = 0.5 * (xtvx + xtvx.T)
        if not np.min(np.diag(xtvx) / np.diag(cp.XtX)) > XTVX_CANCEL_TOL:
            return self._solve_qr(self.lambda_matrix(theta))
        try:
            RX = np.linalg.cholesky(xtvx)
        except np.linalg.LinAlgError:
            return self._solve_qr(self.lambda_matrix(theta))
        rhs = cp.Xty - rzx.T @ cu
        cb = sla.solve_triangular(RX, rhs, lower=True, check_finite=False)
        beta = sla.solve_triangular(RX, cb, lower=True, trans="T", check_finite=False)
        u = self._backward(f, cu - rzx @ beta)
        pwrss = cp.yty - float(cu @ cu) - float(cb @ cb)
        if not pwrss > PWRSS_CANCEL_TOL * cp.yty:
            # r^2 lost its digits to cancellation (residuals tiny next to y): recompute it from its
            # definition ||y - X beta - Z Lambda u||^2 + ||u||^2, once, at O(n) cost.
            resid = self.y - self.X @ beta - self.z_times(self.lambda_matrix(theta) @ u)
            pwrss = float(resid @ resid + u @ u)
        return PLSState(
            beta=beta,
            u=u,
            pwrss=pwrss,
            logdet_L2=f.logdet,
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

    # -- deviances and their by-products --------------------------------------------------
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
        return self.X @ s.beta + self.z_times(b), b

    # -- optimization (lme4's optimizeLmer and checkConv) ------------------------------------
    def fit_theta(
        self, theta0: np.ndarray | None = None, reml: bool = True, method: str = "cobyqa"
    ) -> tuple[np.ndarray, float, bool]:
        """Minimize the profiled deviance over theta within lme4's bounds, as lme4's ``optimizeLmer``.

        From lme4's start (1 on the diagonals of T, 0 off them) unless ``theta0`` is given, with a
        derivative-free trust-region method (:func:`minimize_bounded`; lme4 uses BOBYQA), then
        lme4's ``restart_edge`` (restart once when a parameter sits on its bound with a negative
        slope inward) and ``boundary.tol`` step (a parameter within 1e-5 of its bound is put on
        it when that does not raise the deviance). Returns (theta, deviance, optimizer_success).
        """
        lb = theta_lower_bounds(self.blocks)
        x0 = (
            theta_start(self.blocks)
            if theta0 is None
            else np.maximum(np.asarray(theta0, dtype=np.float64), lb)
        )

        def f(t: np.ndarray) -> float:
            return self.profiled_deviance(t, reml)

        x, fun, ok = minimize_bounded(f, x0, lb, method)
        if np.max(np.abs(x), initial=0.0) > RESCALE_ABOVE:
            # A trust region in absolute units crawls where theta is large (a random effect
            # dwarfing the residual, theta ~ 1e9): rerun with each theta in units of itself.
            x, fun, ok = minimize_bounded(f, x, lb, method, scale=np.maximum(np.abs(x), 1.0))
        on_bound = np.flatnonzero(x == lb)
        if on_bound.size and any(f(x + _unit(x.size, i, BOUNDARY_TOL)) < fun for i in on_bound):
            x, fun, ok = minimize_bounded(f, x, lb, method)
        for i in np.flatnonzero((x - lb > 0.0) & (x - lb < BOUNDARY_TOL)):
            trial = x.copy()
            trial[i] = lb[i]
            if f(trial) < fun:
                x, fun = trial, f(trial)
        return x, float(fun), ok


def _unit(k: int, i: int, h: float) -> np.ndarray:
    e = np.zeros(k)
    e[i] = h
    return e


def minimize_bounded(
    fn: object, x0: np.ndarray, lower: np.ndarray, method: str = "cobyqa", scale: np.ndarray | None = None
) -> tuple[np.ndarray, float, bool]:
    """Derivative-free minimization of ``fn`` subject to x >= lower (lme4's bounded theta problem).

    ``cobyqa``: SciPy's COBYQA, a derivative-free trust-region method with quadratic models
    (Ragonneau & Zhang; Powell's successor to lme4's BOBYQA), initial radius 0.2 as minqa's
    ``rhobeg``, final 1e-8. ``nelder-mead``: SciPy's bounded Nelder-Mead, as lme4's
    ``Nelder_Mead`` alternative. ``scale``: optimize over x / scale (lower bounds are 0 or -inf,
    so they are unchanged). Returns (x, fn(x), the optimizer's success flag).
    """
    from scipy.optimize import Bounds, minimize

    k = x0.size
    sc = np.ones(k) if scale is None else np.asarray(scale, dtype=np.float64)

    def f(xi: np.ndarray) -> float:
        v = float(fn(xi * sc))
        return v if np.isfinite(v) else _HUGE

    x0 = x0 / sc
    bounds = Bounds(np.where(np.isfinite(lower), lower, -np.inf), np.full(k, np.inf))
    if method == "cobyqa":
        opts = {"initial_tr_radius": 0.2, "final_tr_radius": 1e-8, "maxfev": 1000 * max(k, 2)}
        res = minimize(f, x0, method="COBYQA", bounds=bounds, options=opts)
    elif method == "nelder-mead":
        opts = {"xatol": 1e-10, "fatol": 1e-12, "maxfev": 2000 * max(k, 2), "adaptive": k > 2}
        res = minimize(f, x0, method="Nelder-Mead", bounds=bounds, options=opts)
    else:
        raise ValueError(f"unknown method {method!r}; valid: {', '.join(METHODS)}")
    x = np.asarray(res.x, dtype=np.float64) * sc
    fun = float(fn(x))
    return x, fun, bool(res.success) and np.isfinite(fun)


def deriv12(
    fn: object, x: np.ndarray, fx: float, delta: float = DERIV_DELTA
) -> tuple[np.ndarray, np.ndarray]:
    """Gradient and Hessian by central differences with step ``delta`` (lme4's ``deriv12``)."""
    k = x.size
    g, h = np.zeros(k), np.zeros((k, k))
    for j in range(k):
        ej = _unit(k, j, delta)
        fa, fs = float(fn(x + ej)), float(fn(x - ej))
        h[j, j] = (fa - 2.0 * fx + fs) / delta**2
        g[j] = (fa - fs) / (2.0 * delta)
        for i in range(j):
            ei = _unit(k, i, delta)
            h[i, j] = h[j, i] = (
                float(fn(x + ei + ej))
                - float(fn(x + ei - ej))
                - float(fn(x - ei + ej))
                + float(fn(x - ei - ej))
            ) / (2.0 * delta) ** 2
    return g, h


@dataclass(frozen=True)
class ConvergenceCheck:
    """lme4's ``checkConv`` at a fitted theta: singularity, scaled gradient, Hessian."""

    singular: bool
    max_grad: float  # max over theta of min(|H^{-1} g|, |g|) (lme4's "max|grad|")
    failed: tuple[str, ...]  # lme4's "failed to converge" messages (gradient, negative eigenvalues)
    warnings: tuple[str, ...]  # lme4's other Hessian messages (singular Hessian, large eigenvalues)


def check_convergence(core: LMMCore, theta: np.ndarray, reml: bool = True) -> ConvergenceCheck:
    """lme4 ``checkConv`` (1.1-31) with its default tolerances, on the profiled deviance in theta.

    Singular (a diagonal entry of some T below 1e-4): lme4 stops there, so no gradient or Hessian
    verdict is given (``max_grad`` is still reported). Otherwise the fit has failed when
    max min(|H^{-1} g|, |g|) > 2e-3 (H from a Cholesky factor as lme4) or H has eigenvalues
    < -1e-6; a numerically singular H or an eigenvalue ratio below 1e-6 are warnings.
    """
    lb = theta_lower_bounds(core.blocks)
    theta = np.asarray(theta, dtype=np.float64)
    singular = bool(np.any(theta[lb == 0.0] < SINGULAR_TOL))

    def f(t: np.ndarray) -> float:
        return core.profiled_deviance(t, reml)

    g, h = deriv12(f, theta, f(theta))
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
        return ConvergenceCheck(singular, float("nan"), () if singular else ("gradient contains NaNs",), ())
    try:  # R: solve(chol(H), g) with chol(H) = L' upper triangular
        scaled = sla.solve_triangular(np.linalg.cholesky(h), g, lower=True, trans="T")
        max_grad = float(np.max(np.minimum(np.abs(scaled), np.abs(g))))
    except np.linalg.LinAlgError:
        scaled, max_grad = None, float(np.max(np.abs(g)))
    if singular:
        return ConvergenceCheck(True, max_grad, (), ())
    failed, warned = [], []
    if scaled is None:
        failed.append("unable to evaluate scaled gradient (Hessian not positive definite)")
    elif max_grad > GRAD_TOL:
        failed.append(
            f"model failed to converge: max|grad| = {max_grad:.3g} > {GRAD_TOL:g} (lme4 check.conv.grad)"
        )
    eig = np.linalg.eigvalsh(0.5 * (h + h.T))
    if np.sum(eig < -HESS_TOL):
        failed.append(
            f"model failed to converge: degenerate Hessian with {int(np.sum(eig < -HESS_TOL))} negative eigenvalues"
        )
    elif np.any(np.abs(eig) < HESS_TOL):
        warned.append("Hessian is numerically singular: parameters are not uniquely determined")
    elif eig.max() * HESS_TOL > 1 or eig.min() / eig.max() < HESS_TOL:
        warned.append("model is nearly unidentifiable: very large eigenvalue or eigenvalue ratio")
    return ConvergenceCheck(False, max_grad, tuple(failed), tuple(warned))
