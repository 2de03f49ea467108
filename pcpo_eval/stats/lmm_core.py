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
per theta touches the n rows. The term with the most columns (the images, say) is ordered first:
its part of M is block diagonal (one k x k block per level, since each row has one level), so its
Cholesky factor L11 is a batch of k x k factors. The off-diagonal block L21 = M21 L11^{-T} has the
sparsity of M21, and the remaining terms see only the Schur complement S = M22 - L21 L21'.

A second elimination handles a term nested in the first (prompts, when each image has one
prompt): detected exactly from the level codes (:func:`_nested_parent`: every level of the first
term occurs with a single level of it), not by a numerical tolerance. Its part of Z'Z is block
diagonal, and each column of L21 (a first-term level) touches only the rows of its one enclosing
level, so its part of L21 L21' is block diagonal too (one k_p x k_p block per level): the nested
term's part D of S is a batch of small blocks. With the dense remainder C (runs, crossed seeds)
and B the nested x remainder part of S::

    S = [[D, B], [B', C]],   L_S = [[chol(D), 0], [B' chol(D)^{-T}, chol(C - B' D^{-1} B)]]

chol(D) is a batch of k_p x k_p factors and only C - B'D^{-1}B is factored densely, so a theta
step costs O(first-term levels + nested levels x remainder columns + remainder columns^3)
instead of O((nested + remainder columns)^3). Without a nested term (crossed designs) S is
factored densely as a whole. This is the factorization a sparse Cholesky finds for such designs
with a good ordering, in numpy/scipy alone: per theta it costs 0.3 ms (32k rows) and ~2 ms (1M
rows) on the crossed design of ``benchmarks/bench_lmm_scale.py``, where CHOLMOD (scikit-sparse
0.4.16, which needs Debian's libsuitesparse-dev and a compile) took 0.08 / 6 ms simplicial and
0.6 / 95 ms supernodal, a small part of a fit either way. Its limit is the dense Schur
complement: the columns outside the first term and the nested term must stay below
:data:`MAX_SCHUR`. :data:`NESTED_ELIMINATION` switches the second elimination off (tests).
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
#: Random-effect columns factored densely: outside the first term and the term nested in it
#: (dense Schur complement, 288 MB).
MAX_SCHUR = 6000
#: q2 x q1 cells (q2: all columns outside the first term) up to which the rows of L21 outside
#: the nested term are kept dense (80 MB); the nested term's rows are always sparse.
DENSE_L21_CELLS = 1e7
#: Eliminate a term nested in the first one blockwise (module docstring); False: dense Schur.
NESTED_ELIMINATION = True
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
class _NestedFactor:
    """The nested term's rows of L (module docstring); q_p = its columns, q_c = the dense rest's."""

    l21: sp.csr_matrix  # (q_p, q1): one k_p x k1 block per first-term level, in its parent's rows
    ld_inv: np.ndarray  # (m_p, k_p, k_p) inverses of the per-level factors of D
    lcd_t: np.ndarray  # (q_p, q_c): (B' chol(D)^{-T})', the remainder's rows of L below chol(D)


@dataclass(frozen=True)
class _Factor:
    """Cholesky factor of M at one theta, in the block-elimination layout (module docstring)."""

    t1: np.ndarray  # T of the first term (k1, k1)
    t2: tuple[np.ndarray, ...]  # T of each other term, in ``_CrossProducts.rest`` order
    l11_inv: np.ndarray  # (m1, k1, k1) inverses of the per-level factors
    l21: np.ndarray | sp.csr_matrix  # (q_c, q1): rows of the densely factored terms
    l22: np.ndarray  # (q_c, q_c)
    logdet: float  # log|L|^2
    nested: _NestedFactor | None  # the nested term's rows, None on the dense path


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


def _nested_parent(b1: REBlock, b: REBlock) -> np.ndarray | None:
    """Level of ``b`` enclosing each level of ``b1`` (m1,), or None when ``b`` is not nested in it.

    Exact, from the codes: nested when every row of a ``b1`` level has the same ``b`` level. Levels
    of ``b1`` with no rows get parent 0 (their columns of Z'Z are zero).
    """
    parent = np.zeros(b1.n_levels, dtype=np.int64)
    parent[b1.codes] = b.codes  # one of each level's rows wins; the check below compares them all
    return parent if np.array_equal(parent[b1.codes], b.codes) else None


def _find_nested(blocks: list[REBlock], first: int, rest: list[int]) -> tuple[int, np.ndarray] | None:
    """(index, parent map) of the largest term nested in the first one (:func:`_nested_parent`)."""
    if not NESTED_ELIMINATION:
        return None
    for i in sorted(rest, key=lambda i: -blocks[i].q):
        parent = _nested_parent(blocks[first], blocks[i])
        if parent is not None:
            return i, parent
    return None


def _zt_z_by_first(b1: REBlock, b: REBlock) -> np.ndarray:
    """Z_b'Z_1 of a term nested in the first, kept per first-term level (m1, k_b, k1): the only
    nonzero block of column block l sits in the row block of l's parent."""
    out = np.empty((b1.n_levels, b.k, b1.k))
    for a, c in np.ndindex(b.k, b1.k):
        out[:, a, c] = np.bincount(b1.codes, weights=b.design[:, a] * b1.design[:, c], minlength=b1.n_levels)
    return out


def _zt_z_dense(terms: list[REBlock]) -> np.ndarray:
    """Z'Z (q, q) of the stacked terms, dense (the densely factored part of M22)."""
    ro = np.cumsum([0] + [b.q for b in terms])
    out = np.zeros((ro[-1], ro[-1]))
    for i, bi in enumerate(terms):
        out[ro[i] : ro[i + 1], ro[i] : ro[i + 1]] = _block_diag_sparse(_zt_z_diag(bi)).toarray()
        for j in range(i):
            cross = _zt_z(bi, terms[j], True)
            out[ro[i] : ro[i + 1], ro[j] : ro[j + 1]] = cross
            out[ro[j] : ro[j + 1], ro[i] : ro[i + 1]] = cross.T
    return out


@dataclass(frozen=True)
class _NestedCross:
    """Cross-products of the term nested in the first one (module docstring)."""

    parent: np.ndarray  # (m1,) its level enclosing each first-term level
    m: int  # its levels
    k: int  # its coefficients per level
    a_pp: np.ndarray  # (m, k, k) diagonal blocks of Z_p'Z_p
    a_p1: np.ndarray  # (m1, k, k1) Z_p'Z_1 per first-term level (:func:`_zt_z_by_first`)
    a_pc: np.ndarray  # (m k, q_c) Z_p'Z_c with the densely factored terms

    @property
    def q(self) -> int:
        return self.m * self.k


def _nested_cross(b1: REBlock, bp: REBlock, parent: np.ndarray, dense: list[REBlock]) -> _NestedCross:
    a_pc = np.hstack([_zt_z(bp, b, True) for b in dense] + [np.zeros((bp.q, 0))])
    return _NestedCross(parent, bp.n_levels, bp.k, _zt_z_diag(bp), _zt_z_by_first(b1, bp), a_pc)


class _CrossProducts:
    """Z'Z, Z'X|y, X'X, X'y, y'y split as (first term, rest): everything a theta step needs.

    ``rest`` puts the term nested in the first one (if any, ``nested``) first; ``a21`` and ``a22``
    cover only the densely factored terms after it. Formed once from the level codes (bincounts
    over the n rows); Z itself is never built here.
    """

    def __init__(self, y: np.ndarray, X: np.ndarray, blocks: list[REBlock]):
        self.first = int(np.argmax([b.q for b in blocks]))
        self.rest = [i for i in range(len(blocks)) if i != self.first]
        found = _find_nested(blocks, self.first, self.rest)
        if found is not None:
            self.rest = [found[0]] + [i for i in self.rest if i != found[0]]
        offs = np.cumsum([0] + [b.q for b in blocks])
        self.idx1 = np.arange(offs[self.first], offs[self.first + 1])
        self.idx2 = np.concatenate([np.arange(offs[i], offs[i + 1]) for i in self.rest] + [np.zeros(0, int)])
        q1, q2 = self.idx1.size, self.idx2.size
        b1, rest = blocks[self.first], [blocks[i] for i in self.rest]
        dense_terms = rest[1:] if found is not None else rest
        q_dense = sum(b.q for b in dense_terms)
        if q_dense > MAX_SCHUR:
            raise UserError(
                f"{q_dense} random-effect columns outside the largest grouping"
                f"{' and the grouping nested in it' if found is not None else ''} exceed {MAX_SCHUR}; "
                "fit this design with R's lme4 (sparse CHOLMOD) or drop a grouping"
            )
        self.m1, self.k1 = b1.n_levels, b1.k
        self.a11 = _zt_z_diag(b1)
        self.nested = None if found is None else _nested_cross(b1, rest[0], found[1], dense_terms)
        dense = q1 * q2 <= DENSE_L21_CELLS
        parts = [_zt_z(b, b1, dense) for b in dense_terms]
        if parts:
            self.a21 = np.vstack(parts) if dense else sp.vstack(parts, format="csr")
        else:
            self.a21 = np.zeros((0, q1)) if dense else sp.csr_matrix((0, q1))
        self.a22 = _zt_z_dense(dense_terms)
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
        seg = x[off : off + m * k].reshape(m, k, x.shape[1])
        out[off : off + m * k] = np.einsum("ba,lbr->lar", t, seg).reshape(m * k, x.shape[1])
        off += m * k
    return out


def _sum_by_parent(x: np.ndarray, parent: np.ndarray, m: int) -> np.ndarray:
    """Per-parent sums (m, ...) of a per-first-term-level stack x (m1, ...), one bincount per entry."""
    flat = x.reshape(x.shape[0], -1)
    sums = [np.bincount(parent, weights=flat[:, j], minlength=m) for j in range(flat.shape[1])]
    return np.stack(sums, axis=1).reshape(m, *x.shape[1:])


def _blocks_at_parent(blocks: np.ndarray, parent: np.ndarray, m: int) -> sp.csr_matrix:
    """Sparse (m k_p, m1 k1) matrix with block l of ``blocks`` (m1, k_p, k1) at (parent[l], l)."""
    m1, kp, k1 = blocks.shape
    rows = np.broadcast_to((parent * kp)[:, None, None] + np.arange(kp)[None, :, None], blocks.shape)
    cols = np.broadcast_to((np.arange(m1) * k1)[:, None, None] + np.arange(k1)[None, None, :], blocks.shape)
    return sp.csr_matrix((blocks.ravel(), (rows.ravel(), cols.ravel())), shape=(m * kp, m1 * k1))


def _as_dense(x: np.ndarray | sp.spmatrix) -> np.ndarray:
    return x.toarray() if sp.issparse(x) else np.asarray(x)


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
        """L of M = Lambda'Z'Z Lambda + I by block elimination (module docstring): L11, L21, L22,
        and the nested term's rows when there is one."""
        cp = self._cp
        ts = self._t_factors(theta)
        t1, t2 = ts[cp.first], tuple(ts[i] for i in cp.rest)
        levels = [self.blocks[i].n_levels for i in cp.rest]
        m11 = np.einsum("ba,lbc,cd->lad", t1, cp.a11, t1) + np.eye(cp.k1)
        l11 = np.linalg.cholesky(m11)
        l11_inv = np.linalg.inv(l11)
        n_nested = 0 if cp.nested is None else 1
        tc, levels_c = t2[n_nested:], levels[n_nested:]
        l21, gram = self._l21(t1, tc, levels_c, l11_inv)
        m22 = _lam_t_rest(tc, levels_c, _lam_t_rest(tc, levels_c, cp.a22).T).T
        s22 = m22 + np.eye(m22.shape[0]) - gram
        nested, logdet_d = None, 0.0
        if cp.nested is not None:
            nested, update, logdet_d = self._nested_factor(t1, t2[0], tc, levels_c, l11_inv, l21)
            s22 -= update
        l22 = np.linalg.cholesky(s22)
        diag11 = np.diagonal(l11, axis1=1, axis2=2)
        logdet = 2.0 * float(np.sum(np.log(diag11)) + np.sum(np.log(np.diag(l22))) + logdet_d)
        return _Factor(t1, t2, l11_inv, l21, l22, logdet, nested)

    def _l21(
        self, t1: np.ndarray, tc: tuple[np.ndarray, ...], levels_c: list[int], l11_inv: np.ndarray
    ) -> tuple[np.ndarray | sp.csr_matrix, np.ndarray]:
        """L21 = M21 L11^{-T} for the rows of the densely factored terms, and L21 L21' (dense)."""
        cp = self._cp
        q1, qc = cp.idx1.size, cp.a21.shape[0]
        if isinstance(cp.a21, np.ndarray):
            m21 = np.einsum("rlb,bd->rld", _lam_t_rest(tc, levels_c, cp.a21).reshape(qc, cp.m1, cp.k1), t1)
            l21 = np.einsum("rla,lba->rlb", m21, l11_inv).reshape(qc, q1)
            return l21, l21 @ l21.T
        if qc == 0:
            return cp.a21, np.zeros((0, 0))
        lam1 = _block_diag_sparse(np.broadcast_to(t1, (cp.m1, cp.k1, cp.k1)))
        lam2 = sp.block_diag(
            [_block_diag_sparse(np.broadcast_to(t, (m, *t.shape))) for t, m in zip(tc, levels_c, strict=True)]
        )
        l21 = (lam2.T @ cp.a21 @ lam1 @ _block_diag_sparse(l11_inv.transpose(0, 2, 1))).tocsr()
        return l21, (l21 @ l21.T).toarray()

    def _nested_factor(
        self,
        t1: np.ndarray,
        tp: np.ndarray,
        tc: tuple[np.ndarray, ...],
        levels_c: list[int],
        l11_inv: np.ndarray,
        l21c: np.ndarray | sp.csr_matrix,
    ) -> tuple[_NestedFactor, np.ndarray, float]:
        """The nested term's rows of L (module docstring): its L21 rows (one block per first-term
        level), chol(D) per level, B' chol(D)^{-T}; with the update B'D^{-1}B of the dense block and
        log|chol(D)|."""
        nc = self._cp.nested
        m21 = np.einsum("ba,lbc,cd->lad", tp, nc.a_p1, t1)  # (m1, k_p, k1)
        l21 = np.einsum("lac,lbc->lab", m21, l11_inv)
        gram = _sum_by_parent(np.einsum("lab,lcb->lac", l21, l21), nc.parent, nc.m)
        d = np.einsum("ba,jbc,cd->jad", tp, nc.a_pp, tp) + np.eye(nc.k) - gram
        ld = np.linalg.cholesky(d)
        ld_inv = np.linalg.inv(ld)
        l21_sp = _blocks_at_parent(l21, nc.parent, nc.m)
        qc = l21c.shape[0]
        b = _lam_t_rest((tp,), [nc.m], _lam_t_rest(tc, levels_c, nc.a_pc.T).T) - _as_dense(l21_sp @ l21c.T)
        lcd_t = np.einsum("jab,jbr->jar", ld_inv, b.reshape(nc.m, nc.k, qc)).reshape(nc.q, qc)
        logdet_d = float(np.sum(np.log(np.diagonal(ld, axis1=1, axis2=2))))
        return _NestedFactor(l21_sp, ld_inv, lcd_t), lcd_t.T @ lcd_t, logdet_d

    def _forward(self, f: _Factor) -> np.ndarray:
        """[R_ZX, c_u] = L^{-1} Lambda' [Z'X, Z'y], rows in (first term, rest) order, shape (q, p + 1)."""
        cp = self._cp
        levels = [self.blocks[i].n_levels for i in cp.rest]
        r1 = np.einsum("lab,lbr->lar", f.l11_inv, np.einsum("ba,lbr->lar", f.t1, cp.w1))
        r1 = r1.reshape(cp.idx1.size, -1)
        rhs2 = _lam_t_rest(f.t2, levels, cp.w2)
        if f.nested is None:
            r2 = sla.solve_triangular(f.l22, rhs2 - f.l21 @ r1, lower=True, check_finite=False)
            return np.vstack([r1, r2])
        nf, nc = f.nested, cp.nested
        rp = (rhs2[: nc.q] - nf.l21 @ r1).reshape(nc.m, nc.k, -1)
        rp = np.einsum("jab,jbr->jar", nf.ld_inv, rp).reshape(nc.q, -1)
        rhs_c = rhs2[nc.q :] - f.l21 @ r1 - nf.lcd_t.T @ rp
        rc = sla.solve_triangular(f.l22, rhs_c, lower=True, check_finite=False)
        return np.vstack([r1, rp, rc])

    def _backward(self, f: _Factor, v: np.ndarray) -> np.ndarray:
        """u = L'^{-1} v for v in (first term, rest) order; returned in Z's column order."""
        cp = self._cp
        q1 = cp.idx1.size
        qp = 0 if cp.nested is None else cp.nested.q
        u2 = sla.solve_triangular(f.l22, v[q1 + qp :], lower=True, trans="T", check_finite=False)
        w1 = v[:q1] - f.l21.T @ u2
        if f.nested is not None:
            nf, nc = f.nested, cp.nested
            up = (v[q1 : q1 + qp] - nf.lcd_t @ u2).reshape(nc.m, nc.k)
            up = np.einsum("jba,jb->ja", nf.ld_inv, up).ravel()
            w1 = w1 - nf.l21.T @ up
            u2 = np.concatenate([up, u2])
        u1 = np.einsum("lba,lb->la", f.l11_inv, w1.reshape(cp.m1, cp.k1)).ravel()
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
