"""lme4's ``glmer`` front end for the binomial GLMM: a formula and a data frame in, ``summary()`` out.

``fit_glmm("win ~ 1 + side + (1|rater) + (1|prompt)", data)`` builds the response, the fixed-effect
design and the grouping factors from the columns of ``data`` and fits them with
:func:`pcpo_eval.stats.glmm.fit_binomial_glmm` (the numerics live there; this module only reads the
formula). The result is a :class:`GLMMResult`: every attribute of the fit
(:class:`~pcpo_eval.stats.glmm.GLMMFit`: ``beta``, ``se``, ``p``, ``random_sd``, ``estimable``, ...)
plus the formula and lme4's ``summary()`` text.

Formulas in lme4 syntax (Bates, Maechler, Bolker, Walker 2015, J. Stat. Softw. 67(1), Sec. 2.1),
the subset this model fits: a 0/1 (or boolean) response column, fixed terms that are numeric
columns joined by ``+`` with the intercept ``1`` implied (``0`` or ``-1`` drops it), and random
intercepts ``(1|g)`` for one or more grouping columns (crossed or nested by their labels). Factors,
interactions and random slopes are not read (code such columns as numbers first).

:func:`between_within_df` is the denominator df of Wald t tests on such a fit (SAS GLIMMIX's
"between-within" rule), for designs whose effect of interest varies between the levels of the
smallest grouping factor.
"""

from __future__ import annotations

import math
import re
from dataclasses import dataclass
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.stats.formula import parse_lmm_formula
from pcpo_eval.stats.glmm import GLMMFit, fit_binomial_glmm

_NAME = re.compile(r"^[A-Za-z_][A-Za-z0-9_.]*$")


def between_within_df(groups: dict[str, np.ndarray]) -> int:
    """Denominator df of the Wald tests: levels of the smallest grouping factor - 1 (at least 1).

    An effect that varies between the levels of a grouping factor (a preference between raters)
    has information that grows with the number of levels, not of rows (SAS GLIMMIX's
    "between-within" df). With ~15 raters the Wald z-test was anticonservative in simulated A/A
    studies (6-8% at alpha 0.05, benchmarks/bench_human.py); the t reference with these df brings
    it back to the nominal rate.
    """
    return max(1, min(int(np.unique(g).size) for g in groups.values()) - 1)


def parse_glmm_formula(formula: str) -> tuple[str, list[str], list[str], bool]:
    """``y ~ 1 + x + (1|g)`` -> (response, fixed terms, grouping columns, intercept?)."""
    fixed, groups, slopes = parse_lmm_formula(formula)
    if slopes is not None:
        raise UserError(f"formula {formula!r}: only random intercepts (1|g) are fitted; drop random slopes")
    lhs, tilde, rhs = fixed.partition("~")
    response = lhs.strip()
    if not tilde or not _NAME.match(response):
        raise UserError(f"formula {formula!r} is not of the form 'y ~ terms + (1|g)'")
    if not groups:
        raise UserError(f"formula {formula!r} has no random intercept (1|g); a GLMM needs at least one")
    terms, intercept = [], True
    for raw in re.split(r"\s*\+\s*", rhs.strip()) if rhs.strip() else []:
        t = raw.strip()
        if t == "1":
            continue
        if t in ("0", "-1"):
            intercept = False
        elif _NAME.match(t):
            terms.append(t)
        else:
            raise UserError(f"formula {formula!r}: term {t!r} is not a column name; code it as a numeric column")
    return response, terms, groups, intercept


def _column(data: pd.DataFrame, name: str, formula: str) -> pd.Series:
    if name not in data.columns:
        raise UserError(f"formula {formula!r} names column {name!r}, which the data lacks "
                        f"(columns: {', '.join(map(str, data.columns))})")
    return data[name]


@dataclass(frozen=True)
class GLMMResult:
    """A fitted ``glmer`` model: the formula and the fit (its attributes are the result's own)."""

    formula: str
    fit: GLMMFit

    def __getattr__(self, name: str) -> Any:
        if name.startswith("__") or name in ("formula", "fit"):
            raise AttributeError(name)
        return getattr(self.fit, name)

    @property
    def bic(self) -> float:
        """lme4's BIC: deviance + log(n) (number of theta + number of beta)."""
        return self.fit.deviance + math.log(self.fit.n) * (self.fit.theta.size + self.fit.beta.size)

    def summary(self) -> str:
        """lme4's ``summary(glmer(...))``: fit criteria, random effects, fixed effects with Wald z."""
        f = self.fit
        lines = [
            "Generalized linear mixed model fit by maximum likelihood (Laplace Approximation) ['glmerMod']",
            " Family: binomial  ( logit )",
            f"Formula: {self.formula}",
            "",
            f"{'AIC':>10} {'BIC':>10} {'logLik':>10} {'deviance':>10}",
            f"{f.aic:>10.1f} {self.bic:>10.1f} {f.loglik:>10.1f} {f.deviance:>10.1f}",
            "",
            "Random effects:",
            f" {'Groups':<10} {'Name':<12} {'Std.Dev.':>9}",
            *(f" {g:<10} {'(Intercept)':<12} {sd:>9.4f}" for g, sd in f.random_sd.items()),
            "Number of obs: " + f"{f.n}, groups:  "
            + "; ".join(f"{g}, {k}" for g, k in zip(f.groups, f.n_levels, strict=True)),
            "",
            "Fixed effects:",
            f"{'':<12} {'Estimate':>10} {'Std. Error':>10} {'z value':>8} {'Pr(>|z|)':>10}",
        ]
        lines += [f"{name:<12} {b:>10.4f} {se:>10.4f} {z:>8.3f} {p:>10.3g}"
                  for name, b, se, z, p in zip(f.names, f.beta, f.se, f.z, f.p, strict=True)]
        if f.message != "ok":
            lines += ["", f"note: {f.message}"]
        return "\n".join(lines)


def fit_glmm(formula: str, data: pd.DataFrame) -> GLMMResult:
    """Fit the binomial (logit) GLMM of an lme4 formula on the columns of ``data`` (module docstring).

    Same numerics as :func:`~pcpo_eval.stats.glmm.fit_binomial_glmm` (Laplace, lme4's ``nAGQ = 1``)
    on ``y = data[response]``, ``X = [1, data[terms]...]`` (names ``(Intercept)`` and the column
    names) and ``groups = {g: data[g]}`` in formula order. Bad input raises :class:`UserError`.
    """
    response, terms, groups, intercept = parse_glmm_formula(formula)
    n = len(data)
    y = _column(data, response, formula).to_numpy(float)
    cols, names = ([np.ones(n)], ["(Intercept)"]) if intercept else ([], [])
    for t in terms:
        cols.append(_column(data, t, formula).to_numpy(float))
        names.append(t)
    if not cols:
        raise UserError(f"formula {formula!r} has no fixed effect; keep the intercept or name a column")
    fit = fit_binomial_glmm(y, np.column_stack(cols), {g: _column(data, g, formula).to_numpy() for g in groups},
                            names)
    return GLMMResult(formula=formula, fit=fit)
