"""Flow-matching SDE step (DanceGRPO / Flow-GRPO) with Gaussian log-probabilities.

Rectified-flow convention x_t = (1 - t) x_0 + t * noise, velocity u = noise - x_0, sampling
from t = 1 down to 0 with positive step ``dt = t_i - t_{i+1}``. The reverse SDE (paper Eq.
``eq:flow-sde``) discretized with Euler-Maruyama (paper App. "Proof of Eq. logrho-flow")::

    s_theta   = -(x + (1 - t) u) / t                       score from x0_hat = x - t u
    mu        = x - u dt + (sigma^2 / 2) s_theta dt
              = x (1 - sigma^2 dt / (2 t)) - u dt (1 + sigma^2 (1 - t) / (2 t))
    std       = sigma * sqrt(dt)

identical to Flow-GRPO's ``sde_step_with_logprob`` (there with dt < 0) and DanceGRPO's
``flux_step`` (sigma = eta).
"""

from __future__ import annotations

import torch

from pcpo_eval.samplers.ddim import _bcast, gaussian_log_prob


def flow_sde_mean(x: torch.Tensor, u: torch.Tensor, t, dt, sigma) -> torch.Tensor:
    """Euler-Maruyama mean of the reverse SDE for one step (t > 0, dt > 0)."""
    t, dt, sigma = _bcast(t, x), _bcast(dt, x), _bcast(sigma, x)
    return x * (1 - sigma**2 * dt / (2 * t)) - u * dt * (1 + sigma**2 * (1 - t) / (2 * t))


def flow_sde_std(dt, sigma) -> torch.Tensor | float:
    """Per-step standard deviation sigma_t * sqrt(dt)."""
    return sigma * dt**0.5


def flow_log_prob(x: torch.Tensor, u: torch.Tensor, x_next: torch.Tensor, t, dt, sigma) -> torch.Tensor:
    """log p(x_next | x) under the SDE step, averaged over non-batch dims (DanceGRPO/Flow-GRPO)."""
    std = _bcast(sigma, x) * torch.sqrt(_bcast(dt, x))
    return gaussian_log_prob(x_next, flow_sde_mean(x, u, t, dt, sigma), std)
