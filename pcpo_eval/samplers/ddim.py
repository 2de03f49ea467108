"""DDIM sampling with per-step Gaussian log-probabilities (DDPO's ``ddim_step_with_logprob``).

Notation follows diffusers' ``DDIMScheduler.step`` and the PCPO paper (Prop. 1)::

    ab_t, ab_prev   alpha_bar at t and at the previous inference timestep (credit.ddim.DDIMSchedule)
    x0_hat          (x_t - sqrt(1 - ab_t) eps_hat) / sqrt(ab_t)                (DDIM Eq. 12)
    mu              sqrt(ab_prev) x0_hat + sqrt(1 - ab_prev - sigma_t^2) eps_hat
    x_{t-1}         mu + sigma_t * eps,   eps ~ N(0, I)
    log p           Gaussian density of x_{t-1}, averaged over non-batch dims (DDPO convention)

``sigma_t`` is DDIM's eta-schedule, or PCPO's re-solved sigma~_t (``sigma_schedule="pcpo"``,
see :func:`pcpo_eval.credit.ddim.pcpo_ddim_credit`) that makes every step's credit weight equal to
w* in the chosen convention; steps no sigma can bring down to w* follow the ``fallback`` rule
(default ``cap``: their log-ratio is scaled by w*/w inside the hinge, ``credit_scales``).

Randomness: each sample owns one ``torch.Generator``; its initial noise
``randn(latent_shape, generator=g)`` and then each stochastic step's noise are drawn from it in
order, so an image depends only on its generator, never on the batch it was sampled in.
"""

from __future__ import annotations

import math
from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from pcpo_eval.credit.ddim import (
    CONVENTIONS,
    DEFAULT_CONVENTION,
    DEFAULT_FALLBACK,
    FALLBACKS,
    DDIMSchedule,
    check_ddim_eta,
    ddim_C,
    ddim_schedule,
    pcpo_ddim_credit,
)
from pcpo_eval.credit.flow import KL_FORMS
from pcpo_eval.dist import to_device_async
from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.samplers.base import Recorder, Trajectory, gaussian_kl_same_std, per_sample_noise

SIGMA_SCHEDULES = ("ddim", "pcpo")
_LOG_SQRT_2PI = 0.5 * math.log(2 * math.pi)


def _bcast(v: torch.Tensor | float, like: torch.Tensor) -> torch.Tensor:
    """Scalar or (B,) -> broadcastable against ``like`` (B, ...).

    A Python number becomes a 0-dim CPU tensor of ``like``'s dtype, which CUDA kernels take as an
    argument: ``torch.as_tensor(float, device="cuda")`` is a blocking host-to-device copy, which made
    the host wait for the GPU to drain at every sampling step (the same values either way on one device).
    """
    if not isinstance(v, torch.Tensor) or (v.ndim == 0 and v.device.type == "cpu"):
        return torch.as_tensor(v, dtype=like.dtype)
    v = v.to(like.device, like.dtype)
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


@dataclass(kw_only=True)
class DDIMSample(Trajectory):
    """Output of :func:`sample_ddim`: a :class:`~pcpo_eval.samplers.base.Trajectory` plus DDIM's
    per-step schedule (S = steps): ``timesteps`` (model timesteps), ``alpha_bar``,
    ``alpha_bar_prev`` (float64); ``sigmas`` is DDIM's or PCPO's sigma_t, ``model_outputs`` the
    guided eps_hat. ``credit_scales`` (S,) float64 is PCPO's per-step scale of the log-ratio inside the
    hinge (:func:`pcpo_eval.credit.ddim.fallback_scale`; ones for the ``ddim`` schedule).
    """

    timesteps: torch.Tensor
    alpha_bar: torch.Tensor
    alpha_bar_prev: torch.Tensor
    credit_scales: torch.Tensor


def step_sigmas(
    schedule: DDIMSchedule, sigma_schedule: str = "ddim", convention: str = DEFAULT_CONVENTION,
    fallback: str = DEFAULT_FALLBACK,
) -> tuple[np.ndarray, np.ndarray]:
    """Per-step (sigma, credit scale): DDIM's eta schedule (scale 1) or PCPO's constant-weight sigma~
    with its fallback scale (:func:`pcpo_eval.credit.ddim.pcpo_ddim_credit`)."""
    if sigma_schedule not in SIGMA_SCHEDULES:
        raise UserError(f"unknown sigma schedule {sigma_schedule!r}; choose one of: {', '.join(SIGMA_SCHEDULES)}")
    if sigma_schedule == "ddim" or schedule.eta == 0:
        return schedule.sigma, np.ones(len(schedule))
    credit = pcpo_ddim_credit(schedule, convention, fallback=fallback)  # type: ignore[arg-type]
    return credit.pcpo_sigma, credit.credit_scale


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
    convention: str = DEFAULT_CONVENTION,
    fallback: str = DEFAULT_FALLBACK,
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
    sig, scales = step_sigmas(sched, sigma_schedule, convention, fallback)
    # Sampler state stays float32 whatever the network's precision (pcpo_eval.precision).
    device, dtype = adapter.device, adapter.dtype
    x = to_device_async(per_sample_noise(generators, adapter.latent_shape) if x_T is None else x_T.float().cpu(), device)
    rec = Recorder([x]) if record else None
    for i, t in enumerate(sched.timesteps):
        ab_t, ab_prev, s = float(sched.alpha_bar[i]), float(sched.alpha_bar_prev[i]), float(sig[i])
        tt = torch.full((B,), int(t), device=device, dtype=torch.long)
        eps_hat = adapter.predict(x.to(dtype), tt, cond, uncond, cfg).float()
        mean = ddim_mean(x, eps_hat, ab_t, ab_prev, s)
        z = logp = None
        if s > 0:
            z = to_device_async(per_sample_noise(generators, adapter.latent_shape), device)
            x_prev = mean + s * z
            if rec is not None:
                logp = gaussian_log_prob(x_prev.float(), mean.float(), s)
        else:
            x_prev = mean
        if rec is not None:
            rec.step(x_prev, eps_hat, z, logp)
        x = x_prev
    f64 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    out = DDIMSample(
        latents=x,
        timesteps=torch.as_tensor(sched.timesteps.copy()),
        alpha_bar=f64(sched.alpha_bar),
        alpha_bar_prev=f64(sched.alpha_bar_prev),
        sigmas=f64(sig),
        credit_scales=f64(scales),
    )
    if rec is not None:
        rec.fill(out)
    return out


@dataclass(frozen=True)
class DDIMSampler:
    """DDIM with per-step log-probabilities as a :class:`~pcpo_eval.samplers.base.Sampler`.

    Schedules: ``ddim`` (DDIM's eta schedule, DDPO) or ``pcpo`` (PCPO's re-solved sigma~_t with a
    constant native weight in ``convention``, paper Prop. 1; ``fallback`` for the steps w* cannot
    reach). Step j is the Gaussian N(mu(x_t, eps_hat; ab_t, ab_prev, sigma_t), sigma_t^2) of
    :func:`ddim_mean`.
    """

    convention: str = DEFAULT_CONVENTION  #: weight convention of PCPO's sigma~ (credit.ddim.CONVENTIONS)
    fallback: str = DEFAULT_FALLBACK  #: steps without a root (credit.ddim.FALLBACKS)
    name: ClassVar[str] = "ddim"
    prediction: ClassVar[str] = "eps"
    schedules: ClassVar[tuple[str, ...]] = SIGMA_SCHEDULES

    def __post_init__(self) -> None:
        if self.convention not in CONVENTIONS:
            raise UserError(f"unknown credit convention {self.convention!r}; choose one of: {', '.join(CONVENTIONS)}")
        if self.fallback not in FALLBACKS:
            raise UserError(f"unknown credit fallback {self.fallback!r}; choose one of: {', '.join(FALLBACKS)}")

    @classmethod
    def for_training(cls, run: Any) -> tuple[DDIMSampler, str]:
        """DDIM with DDIM's sigma (DDPO) or, for ``objective=pcpo``, PCPO's re-solved sigma~ in
        ``credit_convention`` with ``credit_fallback`` (Prop. 1; docs/credit.md). ``sample_eta`` above
        1 is refused here, before the run writes anything."""
        check_ddim_eta(run.sample_eta, "sample_eta")
        return cls(convention=run.credit_convention, fallback=run.credit_fallback), run.sigma_schedule()

    @classmethod
    def for_validation(cls, run: Any) -> tuple[DDIMSampler, str]:
        """DDIM with eta 0 (deterministic)."""
        return cls(), "ddim"

    def sample(self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float,
               steps: int, eta: float, generators: list[torch.Generator], schedule: str | None = None,
               record: bool = False, x_T: torch.Tensor | None = None) -> DDIMSample:
        """:func:`sample_ddim` with sigma schedule ``schedule`` (default ``ddim``)."""
        return sample_ddim(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators,
                           sigma_schedule=schedule or self.schedules[0], convention=self.convention,
                           fallback=self.fallback, record=record, x_T=x_T)

    def __call__(self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float,
                 steps: int, eta: float, generators: list[torch.Generator], schedule: str | None = None) -> torch.Tensor:
        """Latents only (generation)."""
        return self.sample(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators,
                           schedule=schedule).latents

    def model_time(self, traj: DDIMSample, j: torch.Tensor) -> torch.Tensor:
        """The integer model timesteps t of steps ``j``."""
        return traj.timesteps[j]

    def _coefs(self, traj: DDIMSample, j: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(ab_t, ab_prev, sigma_t) of steps ``j`` as float32 on ``like``'s device."""
        return tuple(to_device_async(v[j.cpu()].to(torch.float32), like.device)
                     for v in (traj.alpha_bar, traj.alpha_bar_prev, traj.sigmas))

    def step_log_prob(self, traj: DDIMSample, j: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor,
                      model_output: torch.Tensor) -> torch.Tensor:
        """log p_theta(x_{t-1} | x_t) (DDPO's ``ddim_step_with_logprob``)."""
        ab, abp, sig = self._coefs(traj, j, x)
        return gaussian_log_prob(x_next, ddim_mean(x, model_output, ab, abp, sig), sig)

    def step_std(self, traj: DDIMSample) -> torch.Tensor:
        """sigma_t of each step (S,)."""
        return traj.sigmas

    def native_weight(self, traj: DDIMSample, j: torch.Tensor) -> torch.Tensor:
        """w = C(t) / sigma_t (``unit`` convention, paper Prop. 1), float32."""
        C = ddim_C(traj.alpha_bar[j].numpy(), traj.alpha_bar_prev[j].numpy(), traj.sigmas[j].numpy())
        return torch.as_tensor(C, dtype=torch.float32) / traj.sigmas[j].to(torch.float32)

    def credit_scale(self, traj: DDIMSample, j: torch.Tensor, objective: str,
                     weighting: str = "native") -> torch.Tensor:
        """PCPO (``objective == "pcpo"``): the sampled schedule's fallback scale (w*/w at ``cap`` steps, 0 at
        ``exclude`` steps, 1 where sigma~ reaches w*: Prop. 1 acts through the sampled sigma~); else ones.
        Only the ``native`` weighting (``step_weighting`` is defined for flow SDEs)."""
        if weighting != "native":
            raise UserError(f"step_weighting={weighting} is defined for flow SDEs (velocity models); use native")
        if objective != "pcpo":
            return torch.ones(len(j), dtype=torch.float32)
        return traj.credit_scales[j].to(torch.float32)

    def kl_to_reference(self, traj: DDIMSample, j: torch.Tensor, x: torch.Tensor, model_output: torch.Tensor,
                        ref_output: torch.Tensor, form: str = "paper") -> torch.Tensor:
        """KL of the two DDIM step Gaussians (shared sigma_t; DPOK). A DDIM step's std is sigma_t itself (no
        dt), so both :data:`~pcpo_eval.credit.flow.KL_FORMS` give this same value."""
        if form not in KL_FORMS:
            raise UserError(f"unknown kl_form {form!r}; choose one of: {', '.join(KL_FORMS)}")
        ab, abp, sig = self._coefs(traj, j, x)
        return gaussian_kl_same_std(ddim_mean(x, model_output, ab, abp, sig), ddim_mean(x, ref_output, ab, abp, sig),
                                    sig)
