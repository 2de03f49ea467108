"""Binomial (logit) GLMM with crossed random intercepts by the Laplace approximation, as lme4.

Reference: Bates, Maechler, Bolker, Walker (2015), "Fitting Linear Mixed-Effects Models Using
lme4", J. Stat. Softw. 67(1), Sec. 5 (generalized models), and lme4's sources (1.1-31):
``glmer(y ~ x + (1|g1) + (1|g2), family = binomial, nAGQ = 1)``.

Model and notation (lme4 -> code)::

    eta = X beta + Z Lambda_theta u,   u ~ N(0, I_q),   y_i ~ Bernoulli(logit^-1(eta_i))
    Lambda_theta = blockdiag_k(theta_k I_{levels_k})   (random intercepts: one theta per factor,
                                                          the random-effect SD itself, sigma = 1)
    M(u)         = Lambda' Z' W(u) Z Lambda + I_q = L L',   W = diag(mu (1 - mu))

Laplace deviance (lme4 ``glmerLaplace``: ``ldL2 + sqrL + aic``)::

    D(theta, beta) = -2 sum_i log p(y_i | mu_i(u*)) + ||u*||^2 + log|L(u*)|^2

where u* is the conditional mode of u given (theta, beta), found by penalized iteratively
reweighted least squares (PIRLS: Newton steps on the penalized deviance with step halving).

Fitting in lme4's two stages: (1) ``nAGQ = 0``: optimize theta alone, with beta found by PIRLS
jointly with u; (2) ``nAGQ = 1``: optimize (theta, beta) jointly from stage 1's values, PIRLS over
u only, theta >= 0 (bounded L-BFGS-B on central-difference gradients, see :func:`_minimize`;
lme4 uses BOBYQA then Nelder-Mead: the optimum is the same, the path is not). D is even in each
theta_k, so a zero SD is a stationary point a gradient method cannot leave even where D falls
beside it; every subset of zero SDs is probed and stage 2 restarts from a lower probe
(:func:`_escape_zero`), then Newton steps on lme4's ``deriv12`` derivatives land on the optimum
(:func:`_polish`). Then lme4's
``check.boundary`` (a theta at most 1e-5 is set to 0 if that is no worse), ``deriv12`` (central
differences, step 1e-4) for the gradient and Hessian of D at the optimum, ``vcov.merMod``'s
covariance ``Cov(beta) = 2 [H^-1]_{beta,beta}`` (falling back, as lme4, to the PIRLS
``(X'WX - X'WZ Lambda M^-1 Lambda'Z'WX)^-1`` when H is not positive definite), Wald
``z = beta / se`` with normal two-sided p (``summary.merMod``), ``isSingular`` (a theta below
1e-4) and ``checkConv`` (scaled gradient 2e-3, Hessian eigenvalues 1e-6).

Linear algebra is dense in the q random-effect columns: Z'WZ is accumulated by one bincount over
the rows per pair of grouping factors (O(n G^2 + q^2) per PIRLS step), never from Z itself.
"""

from __future__ import annotations

from dataclasses import dataclass, field

import numpy as np
import scipy.linalg as sla
from scipy.special import expit
from scipy.stats import norm

from pcpo_eval.errors import UserError
from pcpo_eval.stats.lmm_core import (
    BOUNDARY_TOL,
    DERIV_DELTA,
    GRAD_TOL,
    HESS_TOL,
    SINGULAR_TOL,
    deriv12,
)

PIRLS_TOL = 1e-20  # Newton decrement (penalized-deviance units) at which PIRLS stops
#: Newton steps smaller than this are taken without the step-halving check (round-off level). The
#: Laplace deviance is stationary in u only through its first two terms: log|L|^2 moves to first
#: order with u, so PIRLS must converge in u (not just in the penalized deviance) for the finite-
#: difference Hessian (step 1e-4, errors / 1e-8) to be right.
SMALL_STEP = 1e-8
PIRLS_MAXIT = 60  # lme4 allows 30 at its looser tolerance (1e-7 relative change of the deviance)
BETA_BOUND = 30.0  # |beta| bound inside the optimizer: a logit beyond it is separation
SEPARATION_BETA = 12.0  # |beta| above which the fit is reported as not estimable (separation)
STAGE1_GTOL = 1e-3  # projected gradient at which stage 1 stops: it only gives stage 2 its start
STAGE2_GTOL = 1e-8  # projected gradient at which stage 2 stops (the estimates)
#: Stepping off a zero random-effect SD (:func:`_escape_zero`): the local probe, the SDs probed
#: further out, the D gain that counts as lower, the most subsets of zero SDs probed (2^k - 1, k <= 3).
ZERO_PROBE = 1e-3
RESTART_THETAS = (0.05, 0.15, 0.4, 1.0)
RESTART_GAIN = 1e-10
MAX_RESTART_SUBSETS = 7
POLISH_STEPS = 3  # Newton steps after the optimizer (:func:`_polish`)
_ETA_THRESH = 30.0  # R's binomial linkinv: mu is clamped to [eps, 1 - eps] beyond |eta| = 30
_EPS = np.finfo(float).eps
_HUGE = 1e300


@dataclass(frozen=True)
class GLMMFit:
    """A fitted binomial GLMM (random intercepts only).

    ``theta[k]`` is the random-intercept SD of grouping ``groups[k]`` on the logit scale (with
    sigma = 1, lme4's relative factor is the SD). ``deviance`` is lme4's Laplace ``-2 logLik``.
    """

    names: tuple[str, ...]
    beta: np.ndarray
    se: np.ndarray
    z: np.ndarray
    p: np.ndarray
    vcov: np.ndarray
    groups: tuple[str, ...]
    theta: np.ndarray
    n_levels: tuple[int, ...]
    deviance: float
    n: int
    converged: bool
    singular: bool
    message: str
    vcov_source: str = "hessian"
    gradient: np.ndarray = field(default_factory=lambda: np.zeros(0))

    @property
    def loglik(self) -> float:
        """lme4's ``logLik``: -deviance / 2."""
        return -0.5 * self.deviance

    @property
    def aic(self) -> float:
        """lme4's AIC: deviance + 2 (number of theta + number of beta)."""
        return self.deviance + 2.0 * (self.theta.size + self.beta.size)

    @property
    def random_sd(self) -> dict[str, float]:
        """Random-intercept SD per grouping factor (logit scale)."""
        return {g: float(t) for g, t in zip(self.groups, self.theta, strict=True)}

    @property
    def estimable(self) -> bool:
        """Converged with finite standard errors."""
        return self.converged and bool(np.all(np.isfinite(self.se)))

    def coef(self, name: str) -> dict[str, float]:
        """Estimate, SE, z and p of one fixed effect by name."""
        i = self.names.index(name)
        return {"estimate": float(self.beta[i]), "se": float(self.se[i]), "z": float(self.z[i]),
                "p": float(self.p[i])}


class _Problem:
    """The data of one fit and the PIRLS machinery at a given (theta, beta)."""

    def __init__(self, y: np.ndarray, X: np.ndarray, codes: list[np.ndarray], n_levels: list[int]):
        self.y, self.X = y, X
        self.n, self.p = X.shape
        self.codes, self.n_levels = codes, n_levels
        self.offsets = np.cumsum([0] + n_levels)[:-1]
        self.q = int(sum(n_levels))
        self.owner = np.repeat(np.arange(len(codes)), n_levels)  # grouping factor of each column
        cols = [c + o for c, o in zip(codes, self.offsets, strict=True)]
        self.cols = np.stack(cols)  # (G, n) column of Z holding each row's 1, per factor
        g = len(codes)
        self._flat = np.concatenate(
            [self.cols[a] * self.q + self.cols[b] for a in range(g) for b in range(g)]
        )
        self._g2 = g * g
        self.u = np.zeros(self.q)  # warm start, as lme4 keeps u between evaluations

    def zt(self, r: np.ndarray) -> np.ndarray:
        """Z' r (q,)."""
        return np.bincount(self.cols.ravel(), weights=np.tile(r, len(self.codes)), minlength=self.q)

    def ztwz(self, w: np.ndarray) -> np.ndarray:
        """Z' W Z (q, q) by one bincount."""
        out = np.bincount(self._flat, weights=np.tile(w, self._g2), minlength=self.q * self.q)
        return out.reshape(self.q, self.q)

    def ztwx(self, w: np.ndarray) -> np.ndarray:
        """Z' W X (q, p)."""
        return np.column_stack([self.zt(w * self.X[:, j]) for j in range(self.p)])

    def zu(self, b: np.ndarray) -> np.ndarray:
        """Z b (n,) for b of length q."""
        return b[self.cols].sum(axis=0)


def _mu(eta: np.ndarray) -> np.ndarray:
    return np.clip(expit(eta), _EPS, 1.0 - _EPS)


def _dev_resid(y: np.ndarray, eta: np.ndarray) -> float:
    """-2 log-likelihood of 0/1 data (R's binomial ``aic``), stable for large |eta|."""
    e = np.clip(eta, -_ETA_THRESH, _ETA_THRESH)
    return float(2.0 * np.sum(np.logaddexp(0.0, np.where(y > 0.5, -e, e))))


def _state(prob: _Problem, lam: np.ndarray, off: np.ndarray, u: np.ndarray) -> tuple:
    """mu, W, the Cholesky factor of M, the penalized deviance and the u-gradient at u."""
    eta = off + prob.zu(lam * u)
    mu = _mu(eta)
    w = mu * (1.0 - mu)
    m = np.outer(lam, lam) * prob.ztwz(w)
    m[np.diag_indices_from(m)] += 1.0
    chol = sla.cho_factor(m, lower=True, check_finite=False)
    pdev = _dev_resid(prob.y, eta) + float(u @ u)
    grad = lam * prob.zt(prob.y - mu) - u  # -(1/2) d pdev / du
    return mu, w, chol, pdev, grad


def _logdet(chol: tuple) -> float:
    return float(2.0 * np.sum(np.log(np.diag(chol[0]))))


def pirls_u(prob: _Problem, theta: np.ndarray, beta: np.ndarray) -> tuple[float, np.ndarray, bool]:
    """Laplace deviance at (theta, beta): PIRLS over u (lme4 ``pwrssUpdate(uOnly = TRUE)``).

    Returns (deviance, conditional mode u*, converged). Warm-started from the last mode.
    """
    lam = theta[prob.owner]
    off = prob.X @ beta
    u = prob.u.copy()
    _, _, chol, pdev, grad = _state(prob, lam, off, u)
    for _ in range(PIRLS_MAXIT):
        step = sla.cho_solve(chol, grad, check_finite=False)
        if float(step @ grad) < PIRLS_TOL or np.max(np.abs(step)) < 1e-13:
            prob.u = u
            return pdev + _logdet(chol), u, True
        cand = _state(prob, lam, off, u + step)
        for _ in range(0 if np.max(np.abs(step)) < SMALL_STEP else 30):  # step halving
            if cand[3] <= pdev + 1e-10 * abs(pdev):
                break
            step = step / 2.0
            cand = _state(prob, lam, off, u + step)
        u = u + step
        _, _, chol, pdev, grad = cand
    return pdev + _logdet(chol), u, False


def pirls_joint(prob: _Problem, theta: np.ndarray, beta0: np.ndarray) -> tuple[float, np.ndarray, bool]:
    """Stage-1 (``nAGQ = 0``) deviance at theta: PIRLS over (beta, u) jointly.

    Returns (deviance, beta, converged); leaves the mode in ``prob.u``.
    """
    lam = theta[prob.owner]
    beta, u = beta0.copy(), prob.u.copy()
    q = prob.q
    dev = np.inf
    for _ in range(PIRLS_MAXIT):
        eta = prob.X @ beta + prob.zu(lam * u)
        mu = _mu(eta)
        w = mu * (1.0 - mu)
        pdev = _dev_resid(prob.y, eta) + float(u @ u)
        a = np.empty((q + prob.p, q + prob.p))
        a[:q, :q] = np.outer(lam, lam) * prob.ztwz(w)
        a[:q, :q][np.diag_indices(q)] += 1.0
        a[:q, q:] = lam[:, None] * prob.ztwx(w)
        a[q:, :q] = a[:q, q:].T
        a[q:, q:] = prob.X.T @ (w[:, None] * prob.X)
        dev = pdev + _logdet(sla.cho_factor(a[:q, :q], lower=True, check_finite=False))
        g = np.concatenate([lam * prob.zt(prob.y - mu) - u, prob.X.T @ (prob.y - mu)])
        try:
            step = sla.solve(a, g, assume_a="pos", check_finite=False)
        except (np.linalg.LinAlgError, ValueError):
            return np.inf, beta, False
        if float(step @ g) < PIRLS_TOL or np.max(np.abs(step)) < 1e-13:
            prob.u = u
            return dev, beta, True
        t = 1.0
        b2, u2 = beta + step[q:], u + step[:q]
        for _ in range(0 if np.max(np.abs(step)) < SMALL_STEP else 30):
            b2, u2 = beta + t * step[q:], u + t * step[:q]
            eta2 = prob.X @ b2 + prob.zu(lam * u2)
            if _dev_resid(prob.y, eta2) + float(u2 @ u2) <= pdev + 1e-10 * abs(pdev):
                break
            t /= 2.0
        beta, u = b2, u2
        if np.max(np.abs(beta)) > 10 * BETA_BOUND:
            return np.inf, beta, False
    return dev, beta, False


def _minimize(
    fn: object, x0: np.ndarray, lower: np.ndarray, upper: np.ndarray, gtol: float
) -> tuple[np.ndarray, float, bool]:
    """Bounded quasi-Newton (SciPy L-BFGS-B) with central-difference gradients; (x, f(x), success).

    The Laplace deviance is smooth in (theta, beta) and PIRLS evaluates it to ~1e-12, so central
    differences (relative step 1e-5) give gradients to ~1e-7. Measured on a 300-row crossed fit
    (stage 2 from stage 1's start): 99 evaluations to lme4's optimum (deviance equal to 1e-10),
    against ~75 for COBYQA (``lmm_core``'s choice, whose per-iteration overhead in Python made it
    2x slower here) and 190-450 for bounded Nelder-Mead (lme4's stage-2 default). A whole fit of
    150-300 rows takes ~0.04-0.06 s. ``success`` is False on a failed line search at the optimum,
    so :func:`_fit` judges convergence by the derivatives instead (:func:`_projected_grad`).
    """
    from scipy.optimize import Bounds, minimize

    def f(x: np.ndarray) -> float:
        v = float(fn(x))
        return v if np.isfinite(v) else _HUGE

    x0 = np.clip(x0, lower, upper)
    opts = {"ftol": 1e-15, "gtol": gtol, "finite_diff_rel_step": 1e-5, "maxfun": 500 * max(x0.size, 2)}
    res = minimize(f, x0, method="L-BFGS-B", jac="3-point", bounds=Bounds(lower, upper), options=opts)
    x = np.asarray(res.x, dtype=float)
    return x, f(x), bool(res.success)


def _prepare(y: np.ndarray, X: np.ndarray, groups: dict[str, np.ndarray], names: list[str]) -> tuple:
    """Validate the inputs (UserError) and encode the grouping factors as 0.. level codes."""
    y = np.asarray(y, dtype=float).ravel()
    X = np.asarray(X, dtype=float)
    if X.ndim == 1:
        X = X[:, None]
    n = y.size
    if X.shape[0] != n:
        raise UserError(f"X has {X.shape[0]} rows but y has {n}; pass one row of X per response")
    if len(names) != X.shape[1]:
        raise UserError(f"{len(names)} names for {X.shape[1]} columns of X; name every fixed effect once")
    if not np.all((y == 0) | (y == 1)):
        raise UserError("y must be 0/1 (binary responses); recode the outcome as 0 and 1")
    if not np.all(np.isfinite(X)):
        raise UserError("X has NaN or infinite entries; drop or impute those rows first")
    if not groups:
        raise UserError("no grouping factor given; a GLMM needs at least one random intercept")
    if n == 0 or y.min() == y.max():
        raise UserError(f"y is all {int(y[0]) if n else '-'}: the model is not estimable "
                        "(complete separation); "
                        "report the raw counts instead")
    if np.linalg.matrix_rank(X) < X.shape[1]:
        raise UserError("X is rank deficient (a constant or duplicated column); drop the redundant column")
    codes, levels = [], []
    for g, v in groups.items():
        v = np.asarray(v)
        if v.shape != (n,):
            raise UserError(f"grouping {g!r} has {v.size} entries for {n} rows; give one level per row")
        _, c = np.unique(v, return_inverse=True)
        if c.max() + 1 < 2:
            raise UserError(f"grouping {g!r} has a single level; a random intercept needs at least 2 levels")
        codes.append(c.astype(np.int64))
        levels.append(int(c.max() + 1))
    return y, X, codes, levels


def _conv_messages(g: np.ndarray, h: np.ndarray, singular: bool) -> list[str]:
    """lme4 ``checkConv`` on the (theta, beta) derivatives: failure messages (empty if none).

    As lme4, a singular fit skips the gradient and Hessian checks.
    """
    if singular:
        return []
    if not (np.all(np.isfinite(g)) and np.all(np.isfinite(h))):
        return ["gradient or Hessian contains NaNs"]
    out = []
    try:  # R: solve(chol(H), g), chol(H) = L' upper triangular
        scaled = sla.solve_triangular(np.linalg.cholesky(h), g, lower=True, trans="T")
        max_grad = float(np.max(np.minimum(np.abs(scaled), np.abs(g))))
        if max_grad > GRAD_TOL:
            out.append(
                f"failed to converge: max|grad| = {max_grad:.3g} > {GRAD_TOL:g} (lme4 check.conv.grad)"
            )
    except np.linalg.LinAlgError:
        out.append("unable to evaluate scaled gradient (Hessian not positive definite)")
    eig = np.linalg.eigvalsh(0.5 * (h + h.T))
    if np.sum(eig < -HESS_TOL):
        out.append(f"degenerate Hessian with {int(np.sum(eig < -HESS_TOL))} negative eigenvalues")
    return out


def _projected_grad(g: np.ndarray, theta: np.ndarray) -> float:
    """max |gradient| over the free parameters; a theta at 0 counts only if D decreases inward.

    Judges the optimizer's stop: L-BFGS-B reports a failed line search when it starts at (or
    reaches) the optimum within the gradient's finite-difference noise, e.g. when stage 1 already
    sits at a singular fit's optimum; the derivatives at the optimum decide instead.
    """
    k = theta.size
    free = np.abs(g).copy()
    at0 = np.concatenate([theta <= BOUNDARY_TOL, np.zeros(g.size - k, bool)])
    free[at0] = np.maximum(0.0, -g[at0])
    return float(np.max(free)) if np.all(np.isfinite(g)) else np.inf


def _vcov(prob: _Problem, theta: np.ndarray, beta: np.ndarray, h: np.ndarray) -> tuple[np.ndarray, str]:
    """lme4 ``vcov.merMod``: 2 [H^-1]_{beta,beta} if positive definite, else the PIRLS (RX) one."""
    k = theta.size
    try:
        hi = np.linalg.inv(h)[k:, k:]
        v = hi + hi.T
        if np.all(np.isfinite(v)) and np.linalg.eigvalsh(v).min() > 0:
            return v, "hessian"
    except np.linalg.LinAlgError:
        pass
    pirls_u(prob, theta, beta)
    lam = theta[prob.owner]
    mu = _mu(prob.X @ beta + prob.zu(lam * prob.u))
    w = mu * (1.0 - mu)
    m = np.outer(lam, lam) * prob.ztwz(w) + np.eye(prob.q)
    zx = lam[:, None] * prob.ztwx(w)
    xvx = prob.X.T @ (w[:, None] * prob.X) - zx.T @ np.linalg.solve(m, zx)
    try:
        return np.linalg.inv(xvx), "pirls (Hessian not positive definite)"
    except np.linalg.LinAlgError:
        return np.full((prob.p, prob.p), np.nan), "none (singular information matrix)"


def _stage1(prob: _Problem, k: int) -> tuple[np.ndarray, np.ndarray, bool]:
    """lme4 stage 1 (``nAGQ = 0``): theta by the bounded optimizer, beta by joint PIRLS."""
    beta = np.zeros(prob.p)
    state = {"beta": beta}

    def f(t: np.ndarray) -> float:
        d, b, ok = pirls_joint(prob, t, state["beta"] if np.all(np.isfinite(state["beta"])) else beta)
        if ok:
            state["beta"] = b
        return d if ok else _HUGE

    theta, _, ok = _minimize(f, np.ones(k), np.zeros(k), np.full(k, np.inf), STAGE1_GTOL)
    _, b, ok2 = pirls_joint(prob, theta, state["beta"])
    return theta, b, ok and ok2


def _stage2(prob: _Problem, theta0: np.ndarray, beta0: np.ndarray) -> tuple[np.ndarray, float, bool]:
    """lme4 stage 2 (``nAGQ = 1``): (theta, beta) jointly on the Laplace deviance, theta >= 0."""
    k = theta0.size
    lower = np.concatenate([np.zeros(k), np.full(prob.p, -BETA_BOUND)])
    upper = np.concatenate([np.full(k, np.inf), np.full(prob.p, BETA_BOUND)])

    def f(x: np.ndarray) -> float:
        d, _, ok = pirls_u(prob, x[:k], x[k:])
        return d if ok else _HUGE

    x, fx, ok = _minimize(f, np.concatenate([theta0, beta0]), lower, upper, STAGE2_GTOL)
    return x, fx, ok


def _laplace(prob: _Problem) -> object:
    """The stage-2 objective D(theta, beta) (``_HUGE`` where PIRLS fails)."""
    k = len(prob.codes)

    def f(x: np.ndarray) -> float:
        d, _, ok = pirls_u(prob, x[:k], x[k:])
        return d if ok else _HUGE

    return f


def _escape_zero(prob: _Problem, x: np.ndarray, fx: float, ok: bool) -> tuple[np.ndarray, float, bool]:
    """Step off a zero random-effect SD when that lowers D: restart stage 2 from there.

    D(theta, beta) is even in each theta_k (u_k -> -u_k), so dD/dtheta_k = 0 at theta_k = 0 whatever
    the data: a gradient-based optimizer that reaches theta_k = 0 stops there even where it is a
    saddle (D falls for theta_k > 0); lme4's derivative-free BOBYQA / Nelder-Mead steps off it.
    Evenness also makes the mixed second derivatives of theta_k with every other parameter vanish
    at theta_k = 0, so D(theta_k = delta) < D(0) at a small delta is the local test that 0 is not a
    minimum; larger :data:`RESTART_THETAS` catch a lower D further out. Every subset of the zero SDs
    is probed; stage 2 restarts from the best probe below D, until no probe is. Measured before
    this step on 60 simulated human-study fits (tests/stats/test_glmm.py): 4 fits stopped at
    theta = (0, 0), D up to 0.032 above the optimum (glmer: theta_rater 0.04-0.12).
    """
    from itertools import combinations

    k = len(prob.codes)
    f = _laplace(prob)
    for _ in range(2 * k + 1):
        zero = [i for i in range(k) if x[i] < SINGULAR_TOL]
        subsets = [list(c) for r in range(1, len(zero) + 1) for c in combinations(zero, r)]
        best_start, best_f = None, fx - RESTART_GAIN
        for sub in subsets[:MAX_RESTART_SUBSETS]:
            for t in (ZERO_PROBE, *RESTART_THETAS):
                start = x.copy()
                start[sub] = t
                fs = f(start)
                if fs < best_f:
                    best_start, best_f = start, fs
        if best_start is None:
            return x, fx, ok
        x2, f2, ok2 = _stage2(prob, best_start[:k], best_start[k:])
        if f2 >= fx - RESTART_GAIN:
            return x, fx, ok
        x, fx, ok = x2, f2, ok2
    return x, fx, ok


def _polish(prob: _Problem, x: np.ndarray, fx: float) -> tuple[np.ndarray, float, tuple | None]:
    """Newton steps on the free parameters from the derivatives lme4 itself uses (``deriv12``).

    L-BFGS-B on finite-difference gradients stops within ~1e-6 of the optimum in D, which leaves
    the estimates ~1e-4 relative from it where D is flat; a Newton step on the central-difference
    gradient and Hessian (step 1e-4: errors ~1e-8) lands on it. A theta that the step takes below 0
    is set to 0 (the bound) and held there; a step is kept only if D does not increase, and none is
    taken once its predicted gain is below 1e-10. Returns (x, D(x), (g, h) at x or None).
    """
    k = len(prob.codes)
    f = _laplace(prob)
    for _ in range(POLISH_STEPS):
        g, h = deriv12(f, x, fx, DERIV_DELTA)
        free = np.ones(x.size, bool)
        free[:k] = ~((x[:k] <= 0.0) & (g[:k] >= 0.0))  # at the bound and pushed into it: held
        hf = h[np.ix_(free, free)]
        if not (np.all(np.isfinite(g)) and np.all(np.isfinite(hf))):
            return x, fx, (g, h)
        try:
            step = -np.linalg.solve(hf, g[free])
        except np.linalg.LinAlgError:
            return x, fx, (g, h)
        if not np.all(np.linalg.eigvalsh(0.5 * (hf + hf.T)) > 0) or -0.5 * float(g[free] @ step) < 1e-10:
            return x, fx, (g, h)  # not a minimum's neighbourhood, or already at the optimum
        for _half in range(10):
            x2 = x.copy()
            x2[free] += step
            x2[:k] = np.maximum(x2[:k], 0.0)
            x2[k:] = np.clip(x2[k:], -BETA_BOUND, BETA_BOUND)
            f2 = f(x2)
            if f2 <= fx:
                x, fx = x2, f2
                break
            step = step / 2.0
        else:
            return x, fx, (g, h)
    return x, fx, None


def _check_boundary(prob: _Problem, x: np.ndarray, fx: float) -> tuple[np.ndarray, float]:
    """lme4 ``check.boundary``: a theta within :data:`BOUNDARY_TOL` of 0 is set to 0 if D is no worse."""
    k = len(prob.codes)
    f = _laplace(prob)
    for i in range(k):
        if 0.0 < x[i] <= BOUNDARY_TOL:
            x2 = x.copy()
            x2[i] = 0.0
            f2 = f(x2)
            if f2 <= fx:
                x, fx = x2, f2
    return x, fx


def fit_binomial_glmm(
    y: np.ndarray, X: np.ndarray, groups: dict[str, np.ndarray], names: list[str]
) -> GLMMFit:
    """Fit ``y ~ X + (1|g1) + (1|g2) + ...`` with ``family = binomial`` (logit) by Laplace (``nAGQ = 1``).

    ``y``: 0/1 responses (n,); ``X``: fixed-effect design (n, p) including the intercept column;
    ``groups``: grouping factor name -> level of each row (any labels); ``names``: the p fixed
    effect names. Bad input (non-binary y, constant y, rank-deficient X, a grouping with one level)
    raises :class:`UserError`; a fit that does not converge (including separation, a fixed effect
    beyond |logit| 12) is returned with ``converged = False`` and the reason in ``message``.
    """
    from threadpoolctl import threadpool_limits

    y, X, codes, levels = _prepare(y, X, groups, names)
    # Small dense algebra: BLAS threads only add contention (4x slower here, as in ``lmm.fit_lmm``).
    with threadpool_limits(limits=1, user_api="blas"):
        return _fit(_Problem(y, X, codes, levels), list(names), list(groups))


def _fit(prob: _Problem, names: list[str], groups: list[str]) -> GLMMFit:
    """The two stages, the derivatives at the optimum and lme4's checks (see the module docstring)."""
    k = len(prob.codes)
    theta1, beta1, _ = _stage1(prob, k)  # only a start: its own convergence does not matter
    if not np.all(np.isfinite(beta1)):
        beta1 = np.zeros(prob.p)
    x, dev, ok2 = _stage2(prob, theta1, np.clip(beta1, -BETA_BOUND, BETA_BOUND))
    x, dev, ok2 = _escape_zero(prob, x, dev, ok2)
    x, dev, derivs = _polish(prob, x, dev)
    x_polished = x.copy()
    x, dev = _check_boundary(prob, x, dev)
    theta, beta = x[:k], x[k:]

    def f(z: np.ndarray) -> float:
        d, _, ok = pirls_u(prob, z[:k], z[k:])
        return d if ok else np.nan

    dev = f(x)
    reuse = derivs is not None and np.array_equal(x, x_polished) and bool(np.all(np.abs(derivs[1]) < 1e100))
    g, h = derivs if reuse else deriv12(f, x, dev, DERIV_DELTA)  # the polish's, at this very point
    singular = bool(np.any(theta < SINGULAR_TOL))
    msgs = [] if ok2 or _projected_grad(g, theta) < GRAD_TOL else [
        f"optimizer stopped with projected gradient {_projected_grad(g, theta):.3g} > {GRAD_TOL:g}"]
    if np.max(np.abs(beta)) > SEPARATION_BETA:
        msgs.append(f"a fixed effect diverges (|logit| > {SEPARATION_BETA:g}): separation, not estimable")
    if not np.isfinite(dev):
        msgs.append("PIRLS did not converge at the optimum")
    msgs += _conv_messages(g, h, singular)
    v, source = _vcov(prob, theta, beta, h)
    se = np.sqrt(np.where(np.diag(v) > 0, np.diag(v), np.nan))
    converged = not msgs
    if not converged:
        se = np.full(prob.p, np.nan)
    z = beta / se
    p = 2.0 * norm.sf(np.abs(z))
    if singular:
        msgs.append("boundary (singular) fit: a random-effect SD is 0 (lme4 isSingular)")
    return GLMMFit(
        names=tuple(names), beta=beta, se=se, z=z, p=p, vcov=v, groups=tuple(groups), theta=theta,
        n_levels=tuple(prob.n_levels), deviance=float(dev), n=prob.n, converged=converged, singular=singular,
        message="; ".join(msgs) if msgs else "ok", vcov_source=source, gradient=g,
    )
