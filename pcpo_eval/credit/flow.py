"""Flow-SDE credit math (paper Eq. logrho-flow, Prop. 2, Fig. 2c-d): native weights and zeta*dt.

    w(t_i) = sqrt(dt_i) / sigma_{t_i} * (1 + (1 - t_i) sigma_{t_i}^2 / (2 t_i))
    zeta   = sum_i w(t_i);   PCPO weight w~(t_i) = zeta * dt_i

with ``sigma = eta`` (DanceGRPO) or ``sigma_t = eta sqrt(t / (1 - t))`` (Flow-GRPO).

The high-noise uniform reweighting of Fig. naive-acceleration (c, d) (setup 10) gives every step the
same weight ``w_u = zeta / N`` (the mean native weight, so the total equals PCPO's and the native one):
relative to the interval, w_u / dt_i, it favours the short high-noise steps of the shifted grid even
more than DanceGRPO's native ``w ~ sqrt(dt_i)`` does, the direction opposite to PCPO's ``zeta dt_i``.
"""


from __future__ import annotations

import math
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np

from pcpo_eval.errors import UserError

FLOW_SDES: tuple[str, ...] = ("dance", "flowgrpo")

#: Per-step weight targets inside the decomposed hinge (train config ``step_weighting``).
STEP_WEIGHTINGS: dict[str, str] = {
    "native": "the objective's own weight: w(t_i) of the sampler (eps_matching), zeta*dt_i (pcpo, Prop. 2)",
    "uniform_high_noise": "the constant zeta/N at every step (mean native weight; Fig. naive-acceleration c-d): "
                          "relative to dt_i it emphasises the short high-noise (t ~ 1) steps of a shifted grid",
}


# --------------------------------------------------------------------------------------------
# Flow-matching SDEs
# --------------------------------------------------------------------------------------------


def shifted_sigmas(steps: int, shift: float) -> np.ndarray:
    """DanceGRPO / SD3 time shift: ``t = shift u / (1 + (shift-1) u)``, u = linspace(1, 0, N+1).

    Returns the N+1 times t_0 = 1 > t_1 > ... > t_N = 0 (reference notes, DanceGRPO FLUX).
    """
    u = np.linspace(1.0, 0.0, steps + 1)
    return shift * u / (1.0 + (shift - 1.0) * u)


def flow_sde_sigma(t: np.ndarray, sde: str, eta: float, t_next: np.ndarray | None = None) -> np.ndarray:
    """SDE noise scale sigma_{t_i} per step.

    * ``dance``: sigma = eta (DanceGRPO).
    * ``flowgrpo``: sigma_t = eta * sqrt(t / (1 - t)). At t = 1 (division by zero) Flow-GRPO's
      ``sde_step_with_logprob`` substitutes the next time: sigma = eta * sqrt(1 / (1 - t_1)),
      i.e. t in the denominator is replaced by ``sigma_max = t_1`` (the first sigma below 1).
      We follow that convention (``t_next`` gives t_1; defaults to the next entry of ``t``).
    """
    t = np.asarray(t, dtype=np.float64)
    if sde == "dance":
        return np.full_like(t, float(eta))
    if sde == "flowgrpo":
        if t_next is None:
            t_next = np.append(t[1:], 0.0)
        sigma_max = float(np.max(t[t < 1.0])) if np.any(t < 1.0) else float(t_next[0])
        denom_t = np.where(t >= 1.0, sigma_max, t)
        return eta * np.sqrt(t / (1.0 - denom_t))
    raise UserError(f"unknown --sde {sde!r}; choose one of: {', '.join(FLOW_SDES)}")


def flow_native_weight(t: np.ndarray, dt: np.ndarray, sigma: np.ndarray) -> np.ndarray:
    """w(t_i) = sqrt(dt_i)/sigma_{t_i} * (1 + (1 - t_i) sigma_{t_i}^2 / (2 t_i)) (Eq. logrho-flow)."""
    return np.sqrt(dt) / sigma * (1.0 + (1.0 - t) * sigma**2 / (2.0 * t))


@dataclass(frozen=True)
class FlowCredit:
    """Native and proportional (PCPO) weights of a flow-matching SDE (Prop. 2)."""

    sde: str
    eta: float
    shift: float
    t: np.ndarray  # (N,) current times t_i (1 -> ~0)
    dt: np.ndarray  # (N,) positive step sizes t_i - t_{i+1}
    sigma: np.ndarray
    native_weight: np.ndarray
    pcpo_weight: np.ndarray  # zeta * dt_i
    zeta: float
    t1: str = "neighbor"

    @property
    def mean_native_weight(self) -> float:
        return float(np.mean(self.native_weight))

    def to_dict(self) -> dict[str, Any]:
        """JSON-ready summary (the ``pcpo-eval credit flow --json`` format)."""
        steps = [
            {
                "index": i,
                "t": float(self.t[i]),
                "dt": float(self.dt[i]),
                "sigma": float(self.sigma[i]),
                "native_weight": float(self.native_weight[i]),
                "pcpo_weight": float(self.pcpo_weight[i]),
                "uniform_weight": float(self.zeta / len(self.t)),
            }
            for i in range(len(self.t))
        ]
        d = {k: v for k, v in asdict(self).items() if k in ("sde", "eta", "shift")}
        return {
            "sampler": "flow_sde",
            **d,
            "num_steps": len(self.t),
            "t1_convention": self.t1 if self.sde == "flowgrpo" else None,
            "t1_convention_note": T1_CONVENTIONS[self.t1] if self.sde == "flowgrpo" else None,
            "zeta": self.zeta,
            "mean_native_weight": self.mean_native_weight,
            "steps": steps,
        }


#: KL of one SDE step against the reference policy: name -> definition (docs/credit.md). Both average
#: over the latent dims; mu = the step mean, sigma_t the SDE's noise scale, std = sigma_t sqrt(dt).
KL_FORMS: dict[str, str] = {
    "paper": "||mu - mu_ref||^2 / (2 sigma_t^2 dt): the Gaussian KL of the step (PCPO App., Flow-GRPO paper Eq. 3)",
    "flowgrpo_code": "||mu - mu_ref||^2 / (2 sigma_t^2): Flow-GRPO's scripts/train_sd3.py (std_dev_t without "
                     "sqrt(dt)); = paper * dt",
}


T1_CONVENTIONS: dict[str, str] = {
    "neighbor": (
        "Flow-GRPO sigma_t = eta*sqrt(t/(1-t)) is infinite at t=1; the weight of the t=1 step is approximated "
        "by the weight of the next step (t_1). This reproduces the paper's zeta = 4.315 (N=10, eta=0.7, shift 3)."
    ),
    "sigma_max": (
        "Flow-GRPO sigma_t = eta*sqrt(t/(1-t)) is infinite at t=1; as in Flow-GRPO's sde_step_with_logprob the "
        "t in the denominator is replaced by the first time below 1 (sigma_max = t_1); zeta = 4.297 for N=10, "
        "eta=0.7, shift 3 (0.4% below the paper's 4.315)."
    ),
}


#: The largest noise scale eta taken (the paper: 0.3-0.7; --eta 1e300 printed a table of inf and NaN, exit 0).
MAX_ETA = 100.0


def _validate_flow(steps: int, eta: float, shift: float) -> None:
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {steps}); pass a positive step count")
    if not (0 < eta <= MAX_ETA and math.isfinite(eta)):
        raise UserError(f"--eta must be a number in (0, {MAX_ETA:g}] (got {eta}); pass e.g. --eta 0.3")
    if not (shift > 0 and math.isfinite(shift)):
        raise UserError(f"--shift must be a finite number > 0 (got {shift}); pass e.g. --shift 3")


def flow_credit(
    sde: str = "dance",
    steps: int = 16,
    eta: float = 0.3,
    shift: float = 3.0,
    times: np.ndarray | None = None,
    t1: str = "neighbor",
) -> FlowCredit:
    """Native weights and PCPO proportional weights ``zeta * dt_i`` for a flow SDE (Prop. 2).

    ``times`` (N+1 decreasing values from 1 to 0) overrides the shifted schedule of
    :func:`shifted_sigmas`. zeta sums the native weights over all N steps, so the proportional
    weights have the same total (the proof of Prop. 2).

    ``t1`` picks how the Flow-GRPO step at t = 1 is weighted (see :data:`T1_CONVENTIONS`):
    ``neighbor`` (default; the paper's figure and zeta) or ``sigma_max`` (the sampler's sigma).
    The sampler itself always uses the ``sigma_max`` sigma; only the weight differs.
    """
    _validate_flow(steps, eta, shift)
    if t1 not in T1_CONVENTIONS:
        raise UserError(f"unknown --t1 {t1!r}; choose one of: {', '.join(T1_CONVENTIONS)}")
    if sde not in FLOW_SDES:
        raise UserError(f"unknown --sde {sde!r}; choose one of: {', '.join(FLOW_SDES)}")
    grid = shifted_sigmas(steps, shift) if times is None else np.asarray(times, dtype=np.float64)
    t, t_next = grid[:-1], grid[1:]
    dt = t - t_next
    sigma = flow_sde_sigma(t, sde, eta, t_next)
    native = flow_native_weight(t, dt, sigma)
    if sde == "flowgrpo" and t1 == "neighbor" and len(t) > 1:
        native = np.where(t >= 1.0, native[np.argmax(t < 1.0)], native)
    pcpo, zeta = proportional_weights(dt, native)
    return FlowCredit(sde, float(eta), float(shift), t, dt, sigma, native, pcpo, zeta, t1)


def proportional_weights(dt: np.ndarray, native: np.ndarray) -> tuple[np.ndarray, float]:
    """``(zeta * dt_i, zeta)`` with ``zeta = sum_i native_i`` (Prop. 2, Eq. optimalw)."""
    zeta = float(np.sum(native))
    return zeta * np.asarray(dt, dtype=np.float64), zeta


def uniform_weights(native: np.ndarray) -> np.ndarray:
    """The high-noise uniform weights: ``w_u = mean_i native_i = zeta / N`` at every step (Fig.
    naive-acceleration c; rescaled to the native mean as PCPO's w* is, Sec. 3, so the totals agree)."""
    native = np.asarray(native, dtype=np.float64)
    return np.full_like(native, float(np.mean(native)))


def uniform_flow_scale(t: np.ndarray, dt: np.ndarray, sigma: np.ndarray, sde: str, eta: float,
                       times: np.ndarray, t1: str = "neighbor") -> np.ndarray:
    """Per-step scale ``w_u / w(t_i)`` that turns the sampler's native weight into the uniform one.

    ``w(t_i)`` is the weight of the sampled step (Eq. logrho-flow with the sampler's sigma, so
    ``scale * log rho`` has first-order weight exactly ``w_u``); ``w_u = zeta / N`` with zeta from
    :func:`flow_credit` over all N steps of ``times`` (``t1`` convention for Flow-GRPO), the same zeta
    PCPO's ``zeta dt_i`` uses. Applied inside the hinge like PCPO's scale (train/objectives.py).
    """
    w = flow_native_weight(np.asarray(t, np.float64), np.asarray(dt, np.float64), np.asarray(sigma, np.float64))
    credit = flow_credit(sde, len(times) - 1, eta, 1.0, times=np.asarray(times, np.float64), t1=t1)
    return uniform_weights(credit.native_weight) / w
