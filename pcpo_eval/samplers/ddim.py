"""DDIM sampling with per-step Gaussian log-probabilities (DDPO's ``ddim_step_with_logprob``).

Notation follows diffusers' ``DDIMScheduler.step`` and the PCPO paper (Prop. 1)::

    ab_t, ab_prev   alpha_bar at t and at the previous inference timestep (credit.DDIMSchedule)
    x0_hat          (x_t - sqrt(1 - ab_t) eps_hat) / sqrt(ab_t)                (DDIM Eq. 12)
    mu              sqrt(ab_prev) x0_hat + sqrt(1 - ab_prev - sigma_t^2) eps_hat
    x_{t-1}         mu + sigma_t * eps,   eps ~ N(0, I)
    log p           Gaussian density of x_{t-1}, averaged over non-batch dims (DDPO convention)

``sigma_t`` is DDIM's eta-schedule, or PCPO's re-solved sigma~_t (``sigma_schedule="pcpo"``,
see :func:`pcpo_eval.credit.pcpo_ddim_credit`) that makes every step's credit weight equal.

Randomness: each sample owns one ``torch.Generator``; its initial noise
``randn(latent_shape, generator=g)`` and then each stochastic step's noise are drawn from it in
order, so an image depends only on its generator, never on the batch it was sampled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass

import numpy as np
import torch

from pcpo_eval.credit.ddim import DDIMSchedule, ddim_schedule, pcpo_ddim_credit
from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

SIGMA_SCHEDULES = ("ddim", "pcpo")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _bcast(v: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """Scalar or (B,) -> broadcastable against ``like`` (B, ...)."""
    v = torch.as_tensor(v, dtype=like.dtype, device=like.device)
    return v.reshape(-1, *([1] * (like.ndim - 1))) if v.ndim == 1 else v


def ddim_mean(
    x_t: torch.Tensor, eps_hat: torch.Tensor, ab_t: torch.Tensor | float, ab_prev: torch.Tensor | float,
    sigma: torch.Tensor | float,
) -> torch.Tensor:
    """DDIM posterior mean mu_theta(x_t) (DDIM Eq. 12 with sigma_t; diffusers ``step`` 3.-6.)."""
    ab_t, ab_prev, sigma = _bcast(ab_t, x_t), _bcast(ab_prev, x_t), _bcast(sigma, x_t)
    x0_hat = (x_t - torch.sqrt(1 - ab_t) * eps_hat) / torch.sqrt(ab_t)
    direction = torch.sqrt(torch.clamp(1 - ab_prev - sigma**2, min=0)) * eps_hat
    return torch.sqrt(ab_prev) * x0_hat + direction


def gaussian_log_prob(x: torch.Tensor, mean: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
    """log N(x; mean, std^2 I) per element, averaged over all non-batch dims (DDPO)."""
    std = _bcast(std, x)
    lp = -((x - mean) ** 2) / (2 * std**2) - torch.log(std) - _LOG_SQRT_2PI
    return lp.mean(dim=tuple(range(1, x.ndim)))


def ddim_log_prob(
    x_t: torch.Tensor, eps_hat: torch.Tensor, x_prev: torch.Tensor, ab_t, ab_prev, sigma
) -> torch.Tensor:
    """log p_theta(x_{t-1} | x_t) of a recorded transition (DDPO's ``ddim_step_with_logprob``)."""
    return gaussian_log_prob(x_prev, ddim_mean(x_t, eps_hat, ab_t, ab_prev, sigma), sigma)


@dataclass
class DDIMSample:
    """Output of :func:`sample_ddim`.

    ``latents`` is the final x_0 (B, C, H, W). With ``record=True`` also (S = steps):
    ``trajectory`` (B, S+1, C, H, W) from x_T to x_0, ``noise`` (B, S, C, H, W) the unit noise of
    each step, ``model_outputs`` (B, S, C, H, W) the guided eps_hat of the sampling policy,
    ``log_probs`` (B, S) and per-step ``timesteps``, ``alpha_bar``, ``alpha_bar_prev``,
    ``sigmas`` (S,).
    """

    latents: torch.Tensor
    timesteps: torch.Tensor
    alpha_bar: torch.Tensor
    alpha_bar_prev: torch.Tensor
    sigmas: torch.Tensor
    trajectory: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    model_outputs: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None


def step_sigmas(
    schedule: DDIMSchedule, sigma_schedule: str = "ddim", convention: str = "residual"
) -> np.ndarray:
    """Per-step sigma: DDIM's eta schedule or PCPO's constant-weight sigma~ (credit module)."""
    if sigma_schedule not in SIGMA_SCHEDULES:
        raise UserError(f"unknown sigma schedule {sigma_schedule!r}; choose one of: {', '.join(SIGMA_SCHEDULES)}")
    if sigma_schedule == "ddim" or schedule.eta == 0:
        return schedule.sigma
    return pcpo_ddim_credit(schedule, convention).pcpo_sigma  # type: ignore[arg-type]


def initial_noise(generators: list[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    """x_T: one ``randn(shape)`` per sample from its own generator (float32, CPU)."""
    return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in generators])


@torch.no_grad()
def sample_ddim(
    adapter: ModelAdapter,
    cond: PromptEmbeds,
    uncond: PromptEmbeds | None,
    *,
    cfg: float,
    steps: int,
    eta: float,
    generators: list[torch.Generator],
    sigma_schedule: str = "ddim",
    convention: str = "residual",
    record: bool = False,
    x_T: torch.Tensor | None = None,
) -> DDIMSample:
    """Sample B latents with DDIM (eta >= 0), optionally recording the trajectory and log-probs.

    ``x_T`` overrides the initial noise (DanceGRPO-SD shares it within a prompt group); the step
    noise still comes from ``generators``.
    """
    if adapter.prediction != "eps":
        raise UserError(f"model {adapter.name!r} predicts {adapter.prediction}; use the flow sampler")
    B = len(cond)
    if len(generators) != B:
        raise ValueError(f"need one generator per sample ({B}), got {len(generators)}")
    sched = ddim_schedule(adapter.scheduler_config, steps, eta, stochastic=False)
    sig = step_sigmas(sched, sigma_schedule, convention)
    device, dtype = adapter.device, adapter.dtype
    x = (initial_noise(generators, adapter.latent_shape) if x_T is None else x_T.float().cpu()).to(device, dtype)
    traj, noises, logps, outs = [x], [], [], []
    for i, t in enumerate(sched.timesteps):
        ab_t, ab_prev, s = float(sched.alpha_bar[i]), float(sched.alpha_bar_prev[i]), float(sig[i])
        tt = torch.full((B,), int(t), device=device, dtype=torch.long)
        eps_hat = adapter.predict(x, tt, cond, uncond, cfg).to(x.dtype)
        mean = ddim_mean(x, eps_hat, ab_t, ab_prev, s)
        if record:
            outs.append(eps_hat)
        if s > 0:
            z = torch.stack([torch.randn(adapter.latent_shape, generator=g, dtype=torch.float32) for g in generators])
            z = z.to(device, dtype)
            x_prev = mean + s * z
            if record:
                noises.append(z)
                logps.append(gaussian_log_prob(x_prev.float(), mean.float(), s))
        else:
            x_prev = mean
            if record:
                noises.append(torch.zeros_like(x))
                logps.append(torch.zeros(B, device=device))
        x = x_prev
        if record:
            traj.append(x)
    f64 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    out = DDIMSample(
        latents=x,
        timesteps=torch.as_tensor(sched.timesteps.copy()),
        alpha_bar=f64(sched.alpha_bar),
        alpha_bar_prev=f64(sched.alpha_bar_prev),
        sigmas=f64(sig),
    )
    if record:
        out.trajectory = torch.stack(traj, dim=1)
        out.noise = torch.stack(noises, dim=1)
        out.model_outputs = torch.stack(outs, dim=1)
        out.log_probs = torch.stack(logps, dim=1)
    return out
