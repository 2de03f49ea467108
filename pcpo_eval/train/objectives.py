"""Policy-gradient objectives of the paper's ablation ladder (Sec. 2.2, Table "ablation").

Each objective maps one training step's tensors to a per-sample loss and ``log rho``:

===============  ==========================================================================
``ppo_clip``     DDPO / GRPO (Eq. ``eq:ppo-loss``): rho = exp(logp - logp_old),
                 loss = max(-A rho, -A clip(rho, 1 - xi, 1 + xi))
``log_hinge``    PCPO-base (Eq. ``eq:log-hinge-loss``): loss = max(0, xi |A| - A log rho),
                 log rho = logp - logp_old (difference of Gaussian log-probabilities)
``eps_matching`` Eq. ``eq:epsilon-matching``: the same hinge with log rho from the
                 decomposition of Prop. 1, log rho = -Delta(w, eps_theta, eps_old, eps)
                 (no exp, no difference of large log-densities)
``pcpo``         ``eps_matching`` on trajectories sampled with PCPO's sigma~ schedule, so the
                 native weight w(t) is w* at every step sigma~ can reach; the others are
                 scaled to w* inside the hinge (fallback ``cap``, docs/credit.md)
===============  ==========================================================================

Scale convention: log-probabilities are averaged over the latent dimensions (DDPO), so the
decomposition is averaged the same way and the clip range ``xi`` means the same thing for all
four objectives.

Flow models (paper Eq. ``eq:logrho-flow``, Prop. 2): ``pcpo`` keeps the sampler and rescales the
log ratio inside the hinge by ``s_i = w~(t_i) / w(t_i)`` with w~ = zeta * dt_i (credit module)::

    loss = max(0, xi |A| - A s_i log rho) = s_i * max(0, (xi / s_i) |A| - A log rho)
    s_i log rho = -[ w~ (u_theta - u_old) . eps + 1/2 w~ w ||u_theta - u_old||^2 ]

so the first-order (credit) term carries exactly the proportional weight zeta*dt_i, the gradient of
step i is scaled by s_i, and the hinge deactivates at |log rho| = xi / s_i. ``StepLoss.log_rho``
stays the unscaled log rho (the true policy ratio, for the rho statistics).
"""

from __future__ import annotations

from collections.abc import Callable
from dataclasses import dataclass

import torch

from pcpo_eval.errors import UserError

OBJECTIVES = ("ppo_clip", "log_hinge", "eps_matching", "pcpo")


@dataclass
class StepLoss:
    """Per-sample loss (B,), log rho (B,) and whether each sample was clipped (B,) bool; with
    ``diagnostics`` the trainer adds ``delta`` = the (dot, sq) terms of Eq. Delta per sample
    (:func:`pcpo_eval.train.diagnostics.delta_terms`)."""

    loss: torch.Tensor
    log_rho: torch.Tensor
    clipped: torch.Tensor
    delta: tuple[torch.Tensor, torch.Tensor] | None = None


def ppo_clip_loss(log_rho: torch.Tensor, adv: torch.Tensor, clip_range: float) -> StepLoss:
    """DDPO's clipped surrogate: max(-A rho, -A clip(rho, 1-xi, 1+xi)) (Eq. ``eq:ppo-loss``).

    ``clipped`` is DDPO's clipfrac indicator |rho - 1| > xi.
    """
    rho = torch.exp(log_rho)
    unclipped = -adv * rho
    clipped = -adv * torch.clamp(rho, 1.0 - clip_range, 1.0 + clip_range)
    return StepLoss(torch.maximum(unclipped, clipped), log_rho, (rho - 1.0).abs() > clip_range)


def log_hinge_loss(log_rho: torch.Tensor, adv: torch.Tensor, clip_range: float) -> StepLoss:
    """PCPO-base hinge max(0, xi |A| - A log rho) (Eq. ``eq:log-hinge-loss``).

    A sample is "clipped" when the hinge is inactive (its gradient is zero), the analogue of
    PPO's clipping: A log rho >= xi |A|, for A != 0. A sample with A = 0 (a GRPO group of equal rewards)
    has no gradient under any objective and is not clipped, as under PPO's |rho - 1| > xi at rho = 1:
    before, every such sample counted as clipped here and not under ``ppo_clip``, so the arms' clipfracs
    were not comparable.
    """
    margin = clip_range * adv.abs() - adv * log_rho
    return StepLoss(torch.clamp(margin, min=0.0), log_rho, (margin <= 0) & (adv != 0))


def delta_dot_sq(
    eps_theta: torch.Tensor, eps_old: torch.Tensor, noise: torch.Tensor, w: torch.Tensor | float
) -> tuple[torch.Tensor, torch.Tensor]:
    """The two terms of Eq. ``Delta`` per sample (B,): ``dot = w d . eps`` and ``sq = 1/2 ||w d||^2`` with
    ``d = eps_theta - eps_old``, each a mean over the non-batch dims (DDPO's log-prob scale); ``w`` a scalar
    or one weight per sample. log rho = -(dot + sq) (:func:`eps_matching_log_rho`)."""
    w = torch.as_tensor(w, dtype=eps_theta.dtype, device=eps_theta.device)
    if w.ndim == 1:
        w = w.reshape(-1, *([1] * (eps_theta.ndim - 1)))
    d = w * (eps_theta - eps_old)
    dims = tuple(range(1, eps_theta.ndim))
    return (d * noise).mean(dims), 0.5 * (d * d).mean(dims)


def eps_matching_log_rho(
    eps_theta: torch.Tensor, eps_old: torch.Tensor, noise: torch.Tensor, w: torch.Tensor | float
) -> torch.Tensor:
    """log rho = -[w (eps_theta - eps_old) . eps + 1/2 ||w (eps_theta - eps_old)||^2] (Prop. 1).

    ``noise`` is the unit Gaussian noise of the recorded step and ``w = C/sigma`` (the ``unit``
    convention; the residual convention gives the identical value, :mod:`pcpo_eval.credit.ddim`). Averaged over
    non-batch dims to match DDPO's log-prob scale. Also Eq. ``eq:logrho-flow`` with velocities.
    """
    dot, sq = delta_dot_sq(eps_theta, eps_old, noise, w)
    return -(dot + sq)


def hinge_from_log_rho(
    log_rho: torch.Tensor, adv: torch.Tensor, clip_range: float, weight_scale: torch.Tensor | float = 1.0
) -> StepLoss:
    """eps-matching loss max(0, xi|A| + A Delta) = log-hinge on log rho (Eq. ``eq:epsilon-matching``).

    ``weight_scale`` (flow PCPO, s_i = zeta dt_i / w(t_i)) multiplies log rho inside the hinge,
    ``max(0, xi|A| - A s_i log rho)``, so the step's effective weight is zeta*dt_i (module docstring).
    The returned ``log_rho`` is the unscaled one; ``clipped`` refers to the scaled hinge.
    """
    out = log_hinge_loss(log_rho * weight_scale, adv, clip_range)
    return StepLoss(out.loss, log_rho, out.clipped)


def get_objective(name: str) -> Callable[..., StepLoss]:
    """Loss function for an objective name (``eps_matching`` and ``pcpo`` share the hinge)."""
    table: dict[str, Callable[..., StepLoss]] = {
        "ppo_clip": ppo_clip_loss,
        "log_hinge": log_hinge_loss,
        "eps_matching": hinge_from_log_rho,
        "pcpo": hinge_from_log_rho,
    }
    if name not in table:
        raise UserError(f"unknown objective {name!r}; choose one of: {', '.join(OBJECTIVES)}")
    return table[name]


def uses_decomposition(name: str) -> bool:
    """Whether log rho comes from the eps-matching decomposition rather than log-prob differences."""
    return name in ("eps_matching", "pcpo")
