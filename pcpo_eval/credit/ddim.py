"""DDIM credit math (paper Prop. 1, Fig. 2a-b): native per-step weights and PCPO's sigma~ schedule.

Pure numpy; no model needed. Every function cites the equation of the PCPO paper
(``shared/paper/pcpo-paper.tex``) it implements.

Notation (DDIM, paper Prop. 1 / Eq. ``eq:logrho``; diffusers' ``DDIMScheduler.step`` notation)::

    ab_t       alpha_bar_t      cumulative product of (1 - beta) at the current timestep t
    ab_prev    alpha_bar_{t-1}  the same at the previous (less noisy) inference timestep
    alpha_t    ab_t / ab_prev   the per-inference-step alpha of the DDIM mean
    sigma_t    std of x_{t-1}   eta * sqrt((1-ab_prev)/(1-ab_t)) * sqrt(1 - ab_t/ab_prev)
    C(t)       sqrt(1-ab_t)/sqrt(alpha_t) - sqrt(1-ab_prev-sigma_t^2)   (> 0)

so that mu_theta - mu_old = -C(t) (eps_theta - eps_old) and, with x_{t-1} = mu_old + sigma_t eps,

    log rho_t = -[ w (eps_theta - eps_old) . eps + 1/2 || w (eps_theta - eps_old) ||^2 ]   (Eq. logrho)

Two conventions name the weight ``w`` multiplying the dot product:

* ``unit``: the Gaussian noise ``eps`` ~ N(0, I) is the "noise"; ``w = C / sigma`` (Prop. 1 as
  derived in the appendix). SD-1.x, 50 steps, eta 1: mean ~0.52, range 0.37..3.3.
* ``residual``: the residual ``x_{t-1} - mu_old = sigma eps`` is the "noise"; ``w = C / sigma^2``.
  This is what the paper's Figure 2(a) plots (mean ~4.46, range 1.1..83) and is the default.

PCPO's sigma~ (docs/credit.md): w(sigma) is unimodal with its least value w_min(t) at sigma*_t
(:func:`least_weight_sigma`; for ``unit`` sigma* is DDIM's eta = 1 sigma); sigma~ solves w = w* on the
decreasing branch sigma~ <= sigma*_t (:func:`branch_root`, continuous in t), and steps with
w* < w_min(t) follow a named :data:`FALLBACKS` rule (default ``cap``: weight w* via the hinge scale).

The flow-SDE weights (Eq. ``eq:logrho-flow``, Prop. 2) live in :mod:`pcpo_eval.credit.flow`.
"""


from __future__ import annotations

import json
import math
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, Literal

import numpy as np

from pcpo_eval.errors import UserError

Convention = Literal["residual", "unit"]

#: The two readings of Prop. 1's weight, each tied to the equation that defines it (docs/credit.md).
CONVENTIONS: dict[str, str] = {
    "residual": "w = C/sigma^2, the dot-product weight on the residual x_{t-1} - mu_old = sigma eps_old "
                "(what Fig. 2a plots: mean 4.456 at SD-1.x 50 steps, the figure's w* = 4.5)",
    "unit": "w = C/sigma, the weight on the unit noise eps_old ~ N(0, I) (Eq. logrho as derived in App. A.1; "
            "the scale of the step's policy gradient)",
}

#: Default convention: the residual reading, the scale of the paper's Fig. 2a (its w* = 4.5).
DEFAULT_CONVENTION: Convention = "residual"

#: What a step gets when w* is below the least weight w_min(t) it can reach (no sigma solves w = w*).
#: All but ``native`` sample it with the least-weight sigma*_t, the end of the root branch.
FALLBACKS: dict[str, str] = {
    "cap": "sigma*_t, and the step's log-ratio is scaled by w*/w_min(t) inside the hinge, so its effective "
           "weight is w* (the reweighting of Prop. 2)",
    "exclude": "sigma*_t, and the step is not trained (weight 0)",
    "nearest": "sigma*_t, trained with its weight w_min(t) > w*",
    "native": "DDIM's own sigma_t, trained with its native weight",
}

#: Default fallback: measured in docs/credit.md, the only choice (with ``exclude``) that keeps every
#: step's weight <= 2 w* on the SD-1.x and toy schedules at 8, 20 and 50 steps.
DEFAULT_FALLBACK = "cap"


@dataclass(frozen=True)
class DDIMSchedulerConfig:
    """A diffusers ``DDIMScheduler`` configuration; the defaults are Stable Diffusion 1.x's
    (``scheduler/scheduler_config.json``), the schedule of the paper's Fig. 2a-b.

    Field names follow the ``pcpo-eval credit ddim`` flags; :meth:`to_dict` gives diffusers' keys.
    """

    train_steps: int = 1000  #: num_train_timesteps
    beta_start: float = 0.00085
    beta_end: float = 0.012
    beta_schedule: str = "scaled_linear"  #: linear | scaled_linear | squaredcos_cap_v2
    spacing: str = "leading"  #: timestep_spacing: leading | trailing | linspace
    offset: int = 1  #: steps_offset
    set_alpha_to_one: bool = False

    def to_dict(self) -> dict[str, Any]:
        """The diffusers scheduler-config dict (``DDIMScheduler.from_config``)."""
        return {
            "num_train_timesteps": self.train_steps,
            "beta_start": self.beta_start,
            "beta_end": self.beta_end,
            "beta_schedule": self.beta_schedule,
            "set_alpha_to_one": self.set_alpha_to_one,
            "steps_offset": self.offset,
            "timestep_spacing": self.spacing,
            "clip_sample": False,
            "prediction_type": "epsilon",
        }


#: Stable Diffusion 1.x DDIM configuration (diffusers ``scheduler/scheduler_config.json``).
SD1_DDIM_CONFIG: dict[str, Any] = DDIMSchedulerConfig().to_dict()


def read_scheduler_config(path: str | Path) -> dict[str, Any]:
    """A diffusers ``scheduler_config.json`` as a dict; unreadable files are a :class:`UserError`."""
    try:
        cfg = json.loads(Path(path).read_text())
    except (OSError, json.JSONDecodeError) as exc:
        why = exc.strerror if isinstance(exc, OSError) and exc.strerror else str(exc)
        raise UserError(f"cannot read --scheduler-config {path} ({why}); give a diffusers scheduler_config.json "
                        "(MODEL/scheduler/scheduler_config.json), or leave it out for SD-1.x's schedule") from None
    if not isinstance(cfg, dict):
        raise UserError(f"--scheduler-config {path} must hold a JSON object of scheduler settings")
    return cfg


def check_scheduler_types(cfg: dict[str, Any]) -> None:
    """UserError (naming the key, its value and what it must be) for a scheduler setting of the wrong type
    or range: what a hand-written ``scheduler_config.json`` gets wrong (before, diffusers or torch raised)."""
    import math

    def whole(v: Any, least: int) -> bool:
        return isinstance(v, int) and not isinstance(v, bool) and v >= least

    def unit(v: Any) -> bool:
        return isinstance(v, int | float) and not isinstance(v, bool) and math.isfinite(v) and 0 <= v < 1

    rules = {
        "num_train_timesteps": (lambda v: whole(v, 1), "a whole number >= 1"),
        "steps_offset": (lambda v: whole(v, 0), "a whole number >= 0"),
        "beta_start": (unit, "a number in [0, 1)"),
        "beta_end": (unit, "a number in [0, 1)"),
        "beta_schedule": (lambda v: isinstance(v, str), "a string"),
        "timestep_spacing": (lambda v: isinstance(v, str), "a string"),
        "prediction_type": (lambda v: isinstance(v, str), "a string"),
        "set_alpha_to_one": (lambda v: isinstance(v, bool), "true or false"),
        "clip_sample": (lambda v: isinstance(v, bool), "true or false"),
        "thresholding": (lambda v: isinstance(v, bool), "true or false"),
        "rescale_betas_zero_snr": (lambda v: isinstance(v, bool), "true or false"),
        "trained_betas": (lambda v: v is None or (isinstance(v, list) and len(v) > 0 and all(unit(b) for b in v)),
                          "null or a list of numbers in [0, 1)"),
    }
    for key, (ok, what) in rules.items():
        if key in cfg and not ok(cfg[key]):
            raise UserError(f"scheduler setting {key}={json.dumps(cfg[key])[:40]} must be {what}; "
                            "fix the --scheduler-config file (or the flag)")
    if unit(cfg.get("beta_start", 0.0)) and unit(cfg.get("beta_end", 0.5)) and \
            cfg.get("beta_start", 0.0) > cfg.get("beta_end", 1.0):
        raise UserError(f"scheduler setting beta_start={cfg['beta_start']} is above beta_end={cfg['beta_end']}; "
                        "beta_start must be <= beta_end")


# --------------------------------------------------------------------------------------------
# DDIM
# --------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class DDIMSchedule:
    """Per-inference-step DDIM quantities, ordered as sampling runs (noisiest step first).

    ``timesteps[i]`` is the model timestep t of step i, ``prev_timesteps[i]`` the one it moves
    to (negative at the last step, where ``ab_prev`` is diffusers' ``final_alpha_cumprod``).
    """

    timesteps: np.ndarray
    prev_timesteps: np.ndarray
    alpha_bar: np.ndarray
    alpha_bar_prev: np.ndarray
    eta: float
    config: dict[str, Any] = field(default_factory=dict)

    @property
    def alpha(self) -> np.ndarray:
        """Per-step alpha_t = ab_t / ab_{t-1} (the DDIM mean's 1/sqrt(alpha_t) factor)."""
        return self.alpha_bar / self.alpha_bar_prev

    @property
    def sigma(self) -> np.ndarray:
        """DDIM sigma_t(eta) (DDIM paper Eq. 16; diffusers ``_get_variance`` times eta)."""
        return ddim_sigma(self.alpha_bar, self.alpha_bar_prev, self.eta)

    def __len__(self) -> int:
        return len(self.timesteps)


def _validate_ddim(steps: int, eta: float) -> None:
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {steps}); pass a positive step count")
    if not (eta > 0 and math.isfinite(eta)):
        raise UserError(f"--eta must be a finite number > 0 for a stochastic sampler with log-probabilities "
                        f"(got {eta}); pass e.g. --eta 1")


def check_ddim_eta(eta: float, what: str = "eta") -> None:
    """DDIM's eta runs from deterministic DDIM (0) to DDPM's posterior variance (1) (Song et al. 2021,
    Eq. 16). Above 1 a step's sigma^2 exceeds 1 - alpha_bar_prev (at the last step always), so the
    direction term sqrt(1 - alpha_bar_prev - sigma^2) does not exist (diffusers gives NaN; clamping it
    would sample another process without a word): refused, naming the option ``what``."""
    if eta > 1:
        raise UserError(f"{what} {eta}: DDIM's eta must be at most 1 (1 = DDPM's posterior variance); "
                        f"pass {what} 1 or less")


def ddim_schedule(
    config: dict[str, Any] | None = None, steps: int = 50, eta: float = 1.0, stochastic: bool = True
) -> DDIMSchedule:
    """DDIM inference schedule for any diffusers DDIM scheduler config.

    Uses diffusers' own ``DDIMScheduler`` for betas, spacing and offset, so every beta schedule
    and ``timestep_spacing`` it supports is supported here. Unknown keys or schedule names give a
    :class:`UserError` listing the valid ones. ``prev_t = t - num_train_timesteps // steps``
    (diffusers / ddpo-pytorch convention). ``stochastic=False`` admits eta = 0 (plain DDIM
    sampling, which has no log-probabilities and no credit weights).
    """
    from diffusers import DDIMScheduler

    if stochastic:
        _validate_ddim(steps, eta)
    elif not (isinstance(steps, (int, np.integer)) and steps >= 1 and eta >= 0):
        raise UserError(f"DDIM needs steps >= 1 and eta >= 0 (got steps={steps}, eta={eta})")
    check_ddim_eta(eta, "--eta" if stochastic else "eta")
    cfg = dict(SD1_DDIM_CONFIG if config is None else config)
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    check_scheduler_types(cfg)
    valid_betas = ("linear", "scaled_linear", "squaredcos_cap_v2")
    if cfg.get("beta_schedule", "linear") not in valid_betas:
        raise UserError(
            f"unknown --beta-schedule {cfg.get('beta_schedule')!r}; choose one of: {', '.join(valid_betas)}"
        )
    valid_spacing = ("leading", "trailing", "linspace")
    if cfg.get("timestep_spacing", "leading") not in valid_spacing:
        raise UserError(
            f"unknown --spacing {cfg.get('timestep_spacing')!r}; choose one of: {', '.join(valid_spacing)}"
        )
    sched = DDIMScheduler.from_config(cfg)
    if steps > sched.config.num_train_timesteps:
        raise UserError(f"--steps {steps} exceeds the model's num_train_timesteps "
                        f"{sched.config.num_train_timesteps}; use --steps <= {sched.config.num_train_timesteps}")
    sched.set_timesteps(steps)
    ts = sched.timesteps.numpy().astype(np.int64)
    if ts.max() >= sched.config.num_train_timesteps or ts.min() < 0:
        raise UserError(f"the schedule's timesteps reach {int(ts.max())}, beyond num_train_timesteps "
                        f"{sched.config.num_train_timesteps} (steps_offset {sched.config.steps_offset}); lower --offset "
                        "or use more train timesteps")
    step_ratio = sched.config.num_train_timesteps // steps
    prev = ts - step_ratio
    acp = sched.alphas_cumprod.numpy().astype(np.float64)
    final = float(sched.final_alpha_cumprod)
    ab = acp[ts]
    ab_prev = np.where(prev >= 0, acp[np.clip(prev, 0, None)], final)
    return DDIMSchedule(ts, prev, ab, ab_prev, float(eta), dict(sched.config))


def ddim_sigma(alpha_bar: np.ndarray, alpha_bar_prev: np.ndarray, eta: float) -> np.ndarray:
    """sigma_t = eta * sqrt((1 - ab_prev)/(1 - ab_t) * (1 - ab_t/ab_prev)) (DDIM Eq. 16)."""
    var = (1.0 - alpha_bar_prev) / (1.0 - alpha_bar) * (1.0 - alpha_bar / alpha_bar_prev)
    return eta * np.sqrt(var)


def ddim_C(alpha_bar: np.ndarray, alpha_bar_prev: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """C(t) = sqrt(1-ab_t)/sqrt(alpha_t) - sqrt(1 - ab_{t-1} - sigma_t^2) (paper Prop. 1)."""
    alpha = alpha_bar / alpha_bar_prev
    return np.sqrt(1.0 - alpha_bar) / np.sqrt(alpha) - np.sqrt(np.maximum(1.0 - alpha_bar_prev - sigma**2, 0.0))


def ddim_weight(C: np.ndarray, sigma: np.ndarray, convention: Convention = DEFAULT_CONVENTION) -> np.ndarray:
    """Native weight in ``convention``: ``C/sigma`` (``unit``, Eq. logrho) or ``C/sigma^2`` (``residual``, Fig. 2a)."""
    _check_convention(convention)
    return C / sigma if convention == "unit" else C / sigma**2


def _check_convention(convention: str) -> None:
    if convention not in CONVENTIONS:
        raise UserError(f"unknown --convention {convention!r}; choose one of: {', '.join(CONVENTIONS)}")


def _check_fallback(fallback: str) -> None:
    if fallback not in FALLBACKS:
        raise UserError(f"unknown --fallback {fallback!r}; choose one of: {', '.join(FALLBACKS)}")


def least_weight_sigma(alpha_bar: np.ndarray, alpha_bar_prev: np.ndarray, convention: Convention) -> np.ndarray:
    """sigma*_t minimising the weight w(sigma) over (0, sqrt(1-ab_{t-1})] (closed form, docs/credit.md).

    With a = sqrt(1-ab_t)/sqrt(alpha_t), b = 1-ab_{t-1} and y = sqrt(b - sigma^2) (so C = a - y), w is
    unimodal in sigma: it decreases from +inf (sigma -> 0) to w_min(t) = w(sigma*_t), then increases.

    * ``unit``: dw/dsigma = 0 <=> b / y = a, so sigma*^2 = b (a^2 - b) / a^2 = (1-ab_{t-1})/(1-ab_t)
      (1 - alpha_t): DDIM's eta = 1 variance (DDPM's posterior). w_min = sqrt(SNR_{t-1}/SNR_t - 1).
    * ``residual``: dw/dsigma = 0 <=> b/y + y = 2a, so y = a - sqrt(a^2 - b) = b / (a + sqrt(a^2 - b)).
    """
    _check_convention(convention)
    ab, abp = np.asarray(alpha_bar, dtype=np.float64), np.asarray(alpha_bar_prev, dtype=np.float64)
    a2 = (1.0 - ab) * abp / ab
    b = 1.0 - abp
    if convention == "unit":
        return np.sqrt(b * (a2 - b) / a2)
    y = b / (np.sqrt(a2) + np.sqrt(a2 - b))
    return np.sqrt(b - y * y)


def pcpo_sigma_roots(
    alpha_bar: float, alpha_bar_prev: float, w_target: float, convention: Convention = DEFAULT_CONVENTION
) -> np.ndarray:
    """All valid sigma in (0, sqrt(1-ab_{t-1})] with ``w(sigma) = w_target`` (closed form).

    With a = sqrt(1-ab_t)/sqrt(alpha_t), b = 1 - ab_{t-1} and C(sigma) = a - sqrt(b - sigma^2):

    * ``unit`` (C = w sigma): (1+w^2) s^2 - 2 a w s + (a^2 - b) = 0 in s = sigma,
      s = (a w +- sqrt(b (1+w^2) - a^2)) / (1+w^2).
    * ``residual`` (C = w sigma^2): w^2 u^2 + (1 - 2 a w) u + (a^2 - b) = 0 in u = sigma^2.

    Squaring admits spurious roots; a root is kept only if ``a - w * (s or u) >= 0`` and
    ``0 < sigma^2 <= b``. Returns the valid sigmas in increasing order (0, 1 or 2 of them).
    """
    _check_convention(convention)
    a = np.sqrt(1.0 - alpha_bar) / np.sqrt(alpha_bar / alpha_bar_prev)
    b = 1.0 - alpha_bar_prev
    w = float(w_target)
    if convention == "unit":
        disc = b * (1.0 + w * w) - a * a
        if disc < 0:
            return np.empty(0)
        r = np.sqrt(disc)
        cands = np.array([(a * w - r) / (1 + w * w), (a * w + r) / (1 + w * w)])
        sig = cands
        ok = (cands > 0) & (cands**2 <= b * (1 + 1e-12)) & (a - w * cands >= -1e-12)
    else:
        qa, qb, qc = w * w, 1.0 - 2.0 * a * w, a * a - b
        disc = qb * qb - 4 * qa * qc
        if disc < 0:
            return np.empty(0)
        r = np.sqrt(disc)
        u = np.array([(-qb - r) / (2 * qa), (-qb + r) / (2 * qa)])
        ok = (u > 0) & (u <= b * (1 + 1e-12)) & (a - w * u >= -1e-12)
        sig = np.sqrt(np.clip(u, 0, None))
    return np.unique(np.sort(sig[ok]))


def branch_root(
    alpha_bar: float, alpha_bar_prev: float, w_target: float, convention: Convention, sigma_star: float
) -> float | None:
    """The sigma~ solving w(sigma) = w* on the decreasing branch 0 < sigma <= sigma*_t, or None.

    That branch holds a root exactly when w* >= w_min(t) (w runs from +inf down to w_min on it) and
    ends at sigma*_t, so following it is continuous in t up to and into the fallback (which samples
    sigma*_t). The other branch (sigma > sigma*_t) need not exist (sigma <= sqrt(1-ab_{t-1})).
    """
    roots = pcpo_sigma_roots(alpha_bar, alpha_bar_prev, w_target, convention)
    roots = roots[roots <= sigma_star * (1.0 + 1e-9)]
    return float(roots[0]) if roots.size else None


def fallback_scale(weight: np.ndarray, w_target: float, fallback_steps: list[int], fallback: str) -> np.ndarray:
    """Per-step scale of the log-ratio inside the hinge: w*/w at ``cap`` steps, 0 at ``exclude`` steps, else 1."""
    _check_fallback(fallback)
    scale = np.ones_like(np.asarray(weight, dtype=np.float64))
    fb = np.asarray(fallback_steps, dtype=np.int64)
    if fallback == "cap":
        scale[fb] = w_target / np.asarray(weight)[fb]
    elif fallback == "exclude":
        scale[fb] = 0.0
    return scale


@dataclass(frozen=True)
class DDIMCredit:
    """Native and PCPO credit weights of a DDIM schedule (one entry per inference step).

    ``pcpo_weight`` is the weight w(sigma~_t) the sampled schedule has; ``credit_scale`` the factor the
    trainer applies inside the hinge (:data:`FALLBACKS`); their product is the step's effective weight.
    """

    schedule: DDIMSchedule
    convention: str
    sigma: np.ndarray
    C: np.ndarray
    native_weight: np.ndarray
    w_target: float
    least_sigma: np.ndarray
    pcpo_sigma: np.ndarray
    pcpo_C: np.ndarray
    pcpo_weight: np.ndarray
    credit_scale: np.ndarray
    fallback_steps: list[int]
    fallback: str

    @property
    def mean_native_weight(self) -> float:
        return float(np.mean(self.native_weight))

    @property
    def effective_weight(self) -> np.ndarray:
        """The weight each step trains with: w(sigma~_t) * credit_scale_t."""
        return self.pcpo_weight * self.credit_scale

    @property
    def sigma_ratio(self) -> np.ndarray:
        """sigma~_t / sigma_t."""
        return self.pcpo_sigma / self.sigma

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the ``pcpo-eval credit ddim --json`` format)."""
        s = self.schedule
        eff, fb = self.effective_weight, set(self.fallback_steps)
        eff_share, nat_share = eff / eff.sum(), self.native_weight / self.native_weight.sum()
        steps = [
            {
                "index": i, "timestep": int(s.timesteps[i]), "prev_timestep": int(s.prev_timesteps[i]),
                "alpha_bar": float(s.alpha_bar[i]), "alpha_bar_prev": float(s.alpha_bar_prev[i]),
                "sigma": float(self.sigma[i]), "C": float(self.C[i]), "native_weight": float(self.native_weight[i]),
                "native_share": float(nat_share[i]), "least_weight_sigma": float(self.least_sigma[i]),
                "pcpo_sigma": float(self.pcpo_sigma[i]), "sigma_ratio": float(self.sigma_ratio[i]),
                "pcpo_weight": float(self.pcpo_weight[i]), "credit_scale": float(self.credit_scale[i]),
                "effective_weight": float(eff[i]), "pcpo_share": float(eff_share[i]), "fallback": i in fb,
            }
            for i in range(len(s))
        ]
        return {
            "sampler": "ddim", "convention": self.convention, "convention_equation": CONVENTIONS[self.convention],
            "eta": s.eta, "num_steps": len(s),
            "scheduler_config": {k: v for k, v in s.config.items() if not k.startswith("_")},
            "w_target": self.w_target, "mean_native_weight": self.mean_native_weight,
            "mean_pcpo_weight": float(np.mean(self.pcpo_weight)), "mean_effective_weight": float(np.mean(eff)),
            "max_effective_weight_over_w_target": float(eff.max() / self.w_target),
            "root": "decreasing branch 0 < sigma~ <= sigma* (continuous in t)",
            "fallback": self.fallback, "fallback_rule": FALLBACKS[self.fallback],
            "fallback_steps": list(self.fallback_steps),
            "fallback_weight_share": float(eff_share[list(fb)].sum()) if fb else 0.0,
            "sigma_ratio_median": float(np.median(self.sigma_ratio)),
            "steps": steps,
        }


def pcpo_ddim_credit(
    schedule: DDIMSchedule,
    convention: Convention = DEFAULT_CONVENTION,
    w_target: float | None = None,
    fallback: str = DEFAULT_FALLBACK,
) -> DDIMCredit:
    """PCPO's re-solved DDIM variance schedule sigma~_t giving a constant weight ``w*`` (Sec. 2.2).

    Set w(t) = C(t)/sigma_t (``unit``) or C(t)/sigma_t^2 (``residual``) equal to ``w*`` and solve for
    sigma_t with the DDIM alphas fixed; ``w*`` defaults to the mean of the native weights (the
    paper's mean-matching). The root is taken on the decreasing branch 0 < sigma <= sigma*_t
    (:func:`branch_root`) at every step, so sigma~ is continuous in t (no jumps between roots).

    Steps with w* < w_min(t) have no root; they are listed in ``fallback_steps`` and handled by
    ``fallback`` (:data:`FALLBACKS`; default ``cap``, chosen by the measurement in docs/credit.md).
    """
    _check_convention(convention)
    _check_fallback(fallback)
    with np.errstate(divide="ignore", invalid="ignore"):  # a degenerate schedule is reported below, in one line
        sigma = schedule.sigma
        C = ddim_C(schedule.alpha_bar, schedule.alpha_bar_prev, sigma)
        native = ddim_weight(C, sigma, convention)
    if not np.all(np.isfinite(native)):
        bad = [int(i) for i in np.flatnonzero(~np.isfinite(native))]
        raise UserError(f"the native credit weights of this schedule are not finite at steps {bad[:5]} (alpha_bar "
                        "reaches 0 or 1 there: betas too large or too small); fix --beta-start / --beta-end / "
                        "--beta-schedule (or the --scheduler-config file)")
    wt = float(np.mean(native)) if w_target is None else float(w_target)
    if not (wt > 0 and math.isfinite(wt)):
        raise UserError(f"--w-target must be a finite number > 0 (got {wt}); pass a weight, or leave it out for "
                        "the mean native weight")
    star = least_weight_sigma(schedule.alpha_bar, schedule.alpha_bar_prev, convention)
    new_sigma = np.empty_like(sigma)
    fallback_steps: list[int] = []
    for i in range(len(schedule)):
        root = branch_root(schedule.alpha_bar[i], schedule.alpha_bar_prev[i], wt, convention, star[i])
        if root is None:
            fallback_steps.append(i)
            root = sigma[i] if fallback == "native" else star[i]
        new_sigma[i] = root
    new_C = ddim_C(schedule.alpha_bar, schedule.alpha_bar_prev, new_sigma)
    weight = ddim_weight(new_C, new_sigma, convention)
    return DDIMCredit(
        schedule=schedule, convention=convention, sigma=sigma, C=C, native_weight=native, w_target=wt,
        least_sigma=star, pcpo_sigma=new_sigma, pcpo_C=new_C, pcpo_weight=weight,
        credit_scale=fallback_scale(weight, wt, fallback_steps, fallback), fallback_steps=fallback_steps,
        fallback=fallback,
    )
