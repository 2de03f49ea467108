"""Flow-matching sampling: DanceGRPO / Flow-GRPO SDE steps with log-probabilities, and the ODE.

Rectified-flow convention (diffusers' ``FlowMatchEulerDiscreteScheduler``, SD3, FLUX)::

    x_t = (1 - t) x_0 + t * noise,     velocity u = noise - x_0,     t: 1 (noise) -> 0 (data)

Sampling walks a time grid t_0 = 1 > t_1 > ... > t_N = 0 with positive steps
``dt_i = t_i - t_{i+1}``. The reverse SDE (paper Eq. ``eq:flow-sde``) discretized with
Euler-Maruyama (paper App. "Proof of Eq. logrho-flow")::

    notation here        paper / Flow-GRPO ``sde_step_with_logprob`` / DanceGRPO ``flux_step``
    t, dt                t_i, Delta t_i          sigma, -dt (they use dt < 0)
    sigma                sigma_{t_i}             std_dev_t / sqrt(-dt) (Flow-GRPO), eta (DanceGRPO)
    s_theta              score -(x + (1 - t) u) / t     from x0_hat = x - t u  (Eq. score-function)
    mu                   x - u dt + (sigma^2 / 2) s_theta dt
                       = x (1 - sigma^2 dt / (2 t)) - u dt (1 + sigma^2 (1 - t) / (2 t))
    std                  sigma * sqrt(dt)
    x_{i+1}              mu + std * eps,  eps ~ N(0, I)
    log p                Gaussian density of x_{i+1}, averaged over non-batch dims (both codebases)

``sigma`` per step (:func:`pcpo_eval.credit.flow.flow_sde_sigma`): ``dance`` sigma = eta (DanceGRPO);
``flowgrpo`` sigma_t = eta sqrt(t / (1 - t)) with Flow-GRPO's t = 1 handling (the ``t`` in
``1 - t`` is replaced by the first grid time below 1, ``sigma_max = t_1``, as in its
``sde_step_with_logprob``; the weight used for zeta follows the paper, see ``credit.flow.T1_CONVENTIONS``);
``ode`` (or eta = 0) the deterministic Euler step ``x - u dt`` of diffusers' scheduler (Flow-GRPO
evaluates with noise level 0).

Time grids (:func:`flow_time_grid`):

* ``shifted``: DanceGRPO's ``t = shift u / (1 + (shift - 1) u)``, u = linspace(1, 0, N + 1);
* ``scheduler``: the adapter's own ``FlowMatchEulerDiscreteScheduler`` after ``set_timesteps(N)``
  (SD3 / Flow-GRPO; FLUX's resolution-dependent dynamic shift with ``mu = calculate_shift(seq_len)``
  and ``sigmas = linspace(1, 1/N, N)`` exactly as ``FluxPipeline``), plus the terminal 0.

Model time: adapters of ``prediction == "velocity"`` take ``t`` as the continuous time in [0, 1]
(float, shape (B,)); each adapter converts to its network's convention (SD3: ``1000 t``). With
``quantize_time`` the model is fed ``floor(1000 t) / 1000`` in sampling and training, as DanceGRPO's
``train_grpo_flux.py`` does (``timestep = int(sigma * 1000)``, then ``timestep / 1000``); the SDE step
itself always uses the exact t (:func:`model_time_of`).

Randomness (same contract as :mod:`pcpo_eval.samplers.ddim`): each sample owns one
``torch.Generator``; its initial noise ``randn(latent_shape, generator=g)`` and then each stochastic
step's noise are drawn from it in order, so an image depends only on its generator.
"""

from __future__ import annotations

from dataclasses import dataclass
from typing import Any, ClassVar

import numpy as np
import torch

from pcpo_eval.credit.flow import (
    FLOW_SDES,
    KL_FORMS,
    T1_CONVENTIONS,
    flow_credit,
    flow_native_weight,
    flow_sde_sigma,
    shifted_sigmas,
    uniform_flow_scale,
)
from pcpo_eval.dist import to_device_async
from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.samplers.base import Recorder, Trajectory, per_sample_noise
from pcpo_eval.samplers.ddim import _bcast, gaussian_log_prob

#: what the flow sampler can run: the SDEs of :data:`pcpo_eval.credit.flow.FLOW_SDES` and the ODE (no noise)
SDES: tuple[str, ...] = (*FLOW_SDES, "ode")
GRIDS: tuple[str, ...] = ("auto", "shifted", "scheduler")


# --------------------------------------------------------------------------------------------
# one step (pure functions)
# --------------------------------------------------------------------------------------------


def flow_sde_mean(x: torch.Tensor, u: torch.Tensor, t, dt, sigma) -> torch.Tensor:
    """Euler-Maruyama mean of the reverse SDE for one step (t > 0, dt > 0), see module notation."""
    t, dt, sigma = _bcast(t, x), _bcast(dt, x), _bcast(sigma, x)
    return x * (1 - sigma**2 * dt / (2 * t)) - u * dt * (1 + sigma**2 * (1 - t) / (2 * t))


def flow_log_prob(x: torch.Tensor, u: torch.Tensor, x_next: torch.Tensor, t, dt, sigma) -> torch.Tensor:
    """log p(x_next | x) under the SDE step, averaged over non-batch dims (DanceGRPO/Flow-GRPO)."""
    std = _bcast(sigma, x) * torch.sqrt(_bcast(dt, x))
    return gaussian_log_prob(x_next, flow_sde_mean(x, u, t, dt, sigma), std)


#: What a sampled image decodes, per SDE (the value of a set's ``final_latent`` setting). DanceGRPO's sampler
#: (``run_sample_step`` in ``train_grpo_flux.py``) decodes the last step's prediction of x_0, ``pred_original``
#: = x_{N-1} - t_{N-1} u (:func:`x0_prediction`), not the last SDE sample, which still holds that step's noise
#: and the score term (toy flow, 8 steps, eta 0.3: rms 0.171 from x_0-hat against a latent SD of 0.49, and a
#: toy reward 6% higher on it); Flow-GRPO's ``pipeline_with_logprob`` decodes the last sample. The ODE's last
#: Euler step lands on x_0-hat itself.
FINAL_LATENT = {"ode": "sample", "dance": "x0_prediction", "flowgrpo": "sample"}


def x0_prediction(x: torch.Tensor, u: torch.Tensor, t: float) -> torch.Tensor:
    """The prediction of x_0 at time ``t`` from velocity ``u``: ``x - t u`` (x_t = (1 - t) x_0 + t noise, u = noise - x_0)."""
    return x.float() - float(t) * u.float()


def flow_ode_step(x: torch.Tensor, u: torch.Tensor, dt) -> torch.Tensor:
    """Deterministic Euler step ``x + (t_{i+1} - t_i) u`` (diffusers ``FlowMatchEulerDiscreteScheduler.step``)."""
    return x - u * _bcast(dt, x)


def flow_kl_to_reference(u: torch.Tensor, u_ref: torch.Tensor, t, dt, sigma, form: str = "paper") -> torch.Tensor:
    """KL penalty of one SDE step against the reference policy, averaged over dims (:data:`KL_FORMS`).

    With mu - mu_ref = -dt (1 + sigma^2 (1 - t) / (2 t)) (u - u_ref) (the mean's x-term cancels, so
    ``x`` is not needed):

    * ``paper``: ``||mu - mu_ref||^2 / (2 std^2)``, std = sigma sqrt(dt): the Gaussian KL of the step,
      equal to the PCPO appendix form ``dt/2 (sigma (1 - t) / (2 t) + 1 / sigma)^2 ||u - u_ref||^2``
      ``= w(t)^2 / 2 ||u - u_ref||^2`` (Flow-GRPO paper Eq. 3).
    * ``flowgrpo_code``: ``||mu - mu_ref||^2 / (2 sigma^2)``, what Flow-GRPO's ``scripts/train_sd3.py``
      computes (it divides by its ``std_dev_t`` = sigma_t, not by the step's std): ``paper * dt``.
    """
    if form not in KL_FORMS:
        raise UserError(f"unknown kl_form {form!r}; choose one of: {', '.join(KL_FORMS)}")
    t, dt, sigma = _bcast(t, u), _bcast(dt, u), _bcast(sigma, u)
    coef = dt * (1 + sigma**2 * (1 - t) / (2 * t))
    d = coef * (u - u_ref)
    var = 2 * sigma**2 * dt if form == "paper" else 2 * sigma**2
    return (d**2 / var).mean(dim=tuple(range(1, u.ndim)))


def model_time_of(t: torch.Tensor, quantize: bool) -> torch.Tensor:
    """The time fed to the velocity model (float32): t, or DanceGRPO's ``int(1000 t) / 1000`` (t >= 0, so int
    is floor), computed in float32 as DanceGRPO does on its float32 ``sigma_schedule``."""
    t = t.to(torch.float32)
    return torch.floor(t * 1000) / 1000 if quantize else t


# --------------------------------------------------------------------------------------------
# schedules
# --------------------------------------------------------------------------------------------


def scheduler_time_grid(scheduler_config: dict[str, Any], steps: int, image_seq_len: int | None = None) -> np.ndarray:
    """N+1 times from diffusers' ``FlowMatchEulerDiscreteScheduler`` (SD3 / FLUX pipelines).

    Without dynamic shifting this is ``set_timesteps(N)`` (SD3: static ``shift``); with it, FLUX's
    ``sigmas = linspace(1, 1/N, N)`` and ``mu = calculate_shift(image_seq_len, ...)``.
    """
    from diffusers import FlowMatchEulerDiscreteScheduler

    cfg = {k: v for k, v in dict(scheduler_config).items() if not k.startswith("_")}
    sched = FlowMatchEulerDiscreteScheduler.from_config(cfg)
    if sched.config.use_dynamic_shifting:
        from diffusers.pipelines.flux.pipeline_flux import calculate_shift

        if image_seq_len is None:
            raise ValueError("dynamic shifting needs image_seq_len")
        mu = calculate_shift(image_seq_len, sched.config.base_image_seq_len, sched.config.max_image_seq_len,
                             sched.config.base_shift, sched.config.max_shift)
        sched.set_timesteps(sigmas=np.linspace(1.0, 1.0 / steps, steps), mu=mu)
    else:
        sched.set_timesteps(steps)
    grid = sched.sigmas.double().numpy()
    return grid


def flow_time_grid(
    adapter: ModelAdapter | None, steps: int, grid: str = "shifted", shift: float | None = None
) -> np.ndarray:
    """The N+1 decreasing times t_0 = 1 ... t_N = 0 for ``grid`` ``shifted`` or ``scheduler``.

    ``shifted`` uses ``shift`` (default: the adapter's scheduler ``shift``, else 3.0 as DanceGRPO).
    """
    if not isinstance(steps, (int, np.integer)) or steps < 1:
        raise UserError(f"--steps must be an integer >= 1 (got {steps})")
    if grid == "shifted":
        if shift is None:
            shift = float((adapter.scheduler_config if adapter is not None else {}).get("shift", 3.0))
        if not shift > 0:
            raise UserError(f"--shift must be > 0 (got {shift})")
        return shifted_sigmas(int(steps), float(shift))
    if grid == "scheduler":
        if adapter is None:
            raise ValueError("the scheduler grid needs an adapter")
        seq = getattr(adapter, "image_seq_len", None)
        return scheduler_time_grid(adapter.scheduler_config, int(steps), seq)
    raise UserError(f"unknown flow time grid {grid!r}; choose one of: {', '.join(GRIDS[1:])}")


def default_grid(sde: str) -> str:
    """DanceGRPO samples on its shifted grid; Flow-GRPO and ODE evaluation (also eta = 0) on the model's scheduler."""
    return "shifted" if sde == "dance" else "scheduler"


def step_sigmas(times: np.ndarray, sde: str, eta: float) -> np.ndarray:
    """Per-step SDE sigma_{t_i} (N,) for a grid of N+1 times; zeros for the ODE / eta = 0."""
    if sde not in SDES:
        raise UserError(f"unknown --sde {sde!r}; choose one of: {', '.join(SDES)}")
    t, t_next = times[:-1], times[1:]
    if sde == "ode" or eta == 0:
        return np.zeros_like(t)
    if eta < 0:
        raise UserError(f"--eta must be >= 0 (got {eta})")
    return flow_sde_sigma(t, sde, float(eta), t_next)


# --------------------------------------------------------------------------------------------
# sampling loop
# --------------------------------------------------------------------------------------------


@dataclass(kw_only=True)
class FlowSample(Trajectory):
    """Output of :func:`sample_flow`: a :class:`~pcpo_eval.samplers.base.Trajectory` plus the flow
    grid: ``times`` the N+1 grid; per step (N,): ``t``, ``dt`` (> 0), ``std`` = sigma sqrt(dt)
    (``sigmas`` is the SDE sigma_{t_i}, 0 for the ODE); ``sde`` (``ode`` when eta = 0) and
    ``eta``. ``model_outputs`` are the guided velocities.
    """

    times: torch.Tensor
    t: torch.Tensor
    dt: torch.Tensor
    std: torch.Tensor
    sde: str
    eta: float


@torch.no_grad()
def sample_flow(
    adapter: ModelAdapter,
    cond: PromptEmbeds,
    uncond: PromptEmbeds | None,
    *,
    cfg: float,
    steps: int,
    eta: float,
    generators: list[torch.Generator],
    sde: str = "dance",
    shift: float | None = None,
    grid: str = "auto",
    record: bool = False,
    x_T: torch.Tensor | None = None,
    times: np.ndarray | None = None,
    quantize_time: bool = False,
) -> FlowSample:
    """Sample B latents of a velocity model with the SDE ``sde`` (or the ODE), optionally recorded.

    ``eta = 0`` or ``sde="ode"`` gives deterministic Euler sampling (evaluation). ``grid="auto"``
    is ``shifted`` for the DanceGRPO SDE and ``scheduler`` otherwise (Flow-GRPO, ODE / eta = 0); ``times`` (N+1 values, 1 -> 0)
    overrides the grid. ``x_T`` overrides the initial noise (a prompt group can share it); the
    step noise still comes from ``generators``. CFG is on the velocity: u_u + cfg (u_c - u_u).
    """
    if adapter.prediction != "velocity":
        raise UserError(f"model {adapter.name!r} predicts {adapter.prediction}; use the DDIM sampler")
    B = len(cond)
    if len(generators) != B:
        raise ValueError(f"need one generator per sample ({B}), got {len(generators)}")
    if sde not in SDES:
        raise UserError(f"unknown --sde {sde!r}; choose one of: {', '.join(SDES)}")
    if grid not in GRIDS:
        raise UserError(f"unknown flow time grid {grid!r}; choose one of: {', '.join(GRIDS)}")
    effective = "ode" if eta == 0 else sde
    if times is None:
        times = flow_time_grid(adapter, steps, default_grid(effective) if grid == "auto" else grid, shift)
    times = np.asarray(times, dtype=np.float64)
    if times.ndim != 1 or len(times) < 2 or not np.all(np.diff(times) < 0) or times[-1] < 0 or times[0] > 1:
        raise UserError("flow time grid must decrease strictly from <= 1 to >= 0")
    sig = step_sigmas(times, sde, eta)
    t_np, dt_np = times[:-1], times[:-1] - times[1:]
    std_np = sig * np.sqrt(dt_np)
    # Sampler state stays float32 whatever the network's precision (pcpo_eval.precision).
    device, dtype = adapter.device, adapter.dtype
    x = to_device_async(per_sample_noise(generators, adapter.latent_shape) if x_T is None else x_T.float().cpu(), device)
    rec = Recorder([x]) if record else None
    for i in range(len(t_np)):
        t, dt, s, sd = float(t_np[i]), float(dt_np[i]), float(sig[i]), float(std_np[i])
        tt = torch.full((B,), t, device=device, dtype=torch.float32)
        if quantize_time:
            tt = model_time_of(torch.full((B,), t, device=device, dtype=torch.float64), True)
        u = adapter.predict(x.to(dtype), tt, cond, uncond, cfg).float()
        z = logp = None
        if s > 0:
            mean = flow_sde_mean(x.float(), u.float(), t, dt, s)
            z = to_device_async(per_sample_noise(generators, adapter.latent_shape), device)
            x_next = mean + sd * z
            if rec is not None:
                logp = gaussian_log_prob(x_next, mean, sd)
        else:
            x_next = flow_ode_step(x, u, dt)
        if rec is not None:
            rec.step(x_next, u, z, logp)
        last = i == len(t_np) - 1 and FINAL_LATENT[effective] == "x0_prediction"  # the image: x_0-hat; the
        x = x0_prediction(x, u, t) if last else x_next  # recorded chain above keeps the SDE's last sample
    f64 = lambda a: torch.as_tensor(np.asarray(a), dtype=torch.float64)  # noqa: E731
    out = FlowSample(latents=x, times=f64(times), t=f64(t_np), dt=f64(dt_np), sigmas=f64(sig), std=f64(std_np),
                     sde=effective, eta=float(eta))
    if rec is not None:
        rec.fill(out)
    return out


def pcpo_flow_scale(t: np.ndarray, dt: np.ndarray, sigma: np.ndarray, sde: str, eta: float,
                    times: np.ndarray, t1: str = "neighbor") -> tuple[np.ndarray, np.ndarray, float]:
    """(native weight w(t_i), PCPO scale w~/w, zeta) for the steps of a sampled grid (Prop. 2).

    ``w`` is the weight of the sampler's actual step (Eq. logrho-flow with its sigma), so the
    decomposition reproduces log rho exactly; ``w~ = zeta dt_i`` with zeta from
    :func:`pcpo_eval.credit.flow.flow_credit` over all N steps of ``times`` (t1 convention for Flow-GRPO).
    """
    w = flow_native_weight(t, dt, sigma)
    credit = flow_credit(sde, len(times) - 1, eta, 1.0, times=times, t1=t1)
    return w, credit.pcpo_weight / w, float(credit.zeta)


@dataclass(frozen=True)
class FlowSampler:
    """Flow matching (DanceGRPO / Flow-GRPO SDE, or the ODE) as a :class:`~pcpo_eval.samplers.base.Sampler`.

    Schedules are the SDEs: ``ode`` (deterministic Euler, evaluation), ``dance`` (sigma = eta) or
    ``flowgrpo`` (sigma_t = eta sqrt(t / (1 - t))). Step j is the Gaussian
    N(mu(x, u; t_j, dt_j, sigma_j), sigma_j^2 dt_j) of :func:`flow_sde_mean`. PCPO keeps the sampler
    and reweights each step by w~/w = zeta dt_j / w(t_j) inside the hinge (Prop. 2).
    """

    shift: float | None = None  #: time shift of the ``shifted`` grid (None: the model's, else 3.0)
    grid: str = "auto"  #: time grid: auto | shifted | scheduler (:func:`flow_time_grid`)
    t1: str = "neighbor"  #: Flow-GRPO t = 1 weight convention for PCPO's zeta (credit.flow.T1_CONVENTIONS)
    quantize_time: bool = False  #: feed the model DanceGRPO's int(1000 t) / 1000 (:func:`model_time_of`)
    name: ClassVar[str] = "flow"
    prediction: ClassVar[str] = "velocity"
    schedules: ClassVar[tuple[str, ...]] = ("ode", *FLOW_SDES)

    def __post_init__(self) -> None:
        if self.t1 not in T1_CONVENTIONS:
            raise UserError(f"unknown flow t1 convention {self.t1!r}; choose one of: {', '.join(T1_CONVENTIONS)}")

    @classmethod
    def for_training(cls, run: Any) -> tuple[FlowSampler, str]:
        """The flow SDE ``sde`` on ``flow_grid`` (DanceGRPO / Flow-GRPO), the model fed DanceGRPO's quantized
        time if ``model_time_quantize``; PCPO keeps this sampler and reweights in the hinge (Prop. 2)."""
        return cls(shift=run.flow_shift, grid=run.flow_grid, t1=run.flow_t1, quantize_time=run.model_time_quantize), run.sde

    @classmethod
    def for_validation(cls, run: Any) -> tuple[FlowSampler, str]:
        """The flow ODE on the training grid (``auto``: the grid the run's ``sde`` samples on)."""
        grid = default_grid(run.sde) if run.flow_grid == "auto" else run.flow_grid
        return cls(shift=run.flow_shift, grid=grid, t1=run.flow_t1, quantize_time=run.model_time_quantize), "ode"

    def sample(self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float,
               steps: int, eta: float, generators: list[torch.Generator], schedule: str | None = None,
               record: bool = False, x_T: torch.Tensor | None = None) -> FlowSample:
        """:func:`sample_flow` with SDE ``schedule`` (default ``ode``) on this sampler's grid."""
        return sample_flow(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators,
                           sde=schedule or self.schedules[0], shift=self.shift, grid=self.grid, record=record, x_T=x_T,
                           quantize_time=self.quantize_time)

    def __call__(self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float,
                 steps: int, eta: float, generators: list[torch.Generator], schedule: str | None = None) -> torch.Tensor:
        """Latents only (generation)."""
        return self.sample(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators,
                           schedule=schedule).latents

    def model_time(self, traj: FlowSample, j: torch.Tensor) -> torch.Tensor:
        """The continuous times t_j in (0, 1] (float32) the velocity adapters take."""
        return model_time_of(traj.t[j], self.quantize_time)

    def _coefs(self, traj: FlowSample, j: torch.Tensor, like: torch.Tensor) -> tuple[torch.Tensor, ...]:
        """(t, dt, sigma) of steps ``j`` as float32 on ``like``'s device."""
        return tuple(to_device_async(v[j.cpu()].to(torch.float32), like.device) for v in (traj.t, traj.dt, traj.sigmas))

    def step_log_prob(self, traj: FlowSample, j: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor,
                      model_output: torch.Tensor) -> torch.Tensor:
        """log p(x_next | x) of the SDE step (:func:`flow_log_prob`)."""
        return flow_log_prob(x, model_output, x_next, *self._coefs(traj, j, x))

    def step_std(self, traj: FlowSample) -> torch.Tensor:
        """sigma_t sqrt(dt) of each step (S,)."""
        return traj.std

    def native_weight(self, traj: FlowSample, j: torch.Tensor) -> torch.Tensor:
        """w(t_j) = sqrt(dt_j) / sigma_j (1 + (1 - t_j) sigma_j^2 / (2 t_j)) (Eq. logrho-flow), float32."""
        w = flow_native_weight(traj.t.numpy(), traj.dt.numpy(), traj.sigmas.numpy())
        return torch.as_tensor(w)[j].to(torch.float32)

    def credit_scale(self, traj: FlowSample, j: torch.Tensor, objective: str,
                     weighting: str = "native") -> torch.Tensor:
        """PCPO (``objective == "pcpo"``): w~/w = zeta dt_j / w(t_j) over the sampled grid (Prop. 2); else ones.
        ``weighting="uniform_high_noise"`` (any objective): w_u / w(t_j), w_u = zeta / N
        (:func:`pcpo_eval.credit.flow.uniform_flow_scale`)."""
        if weighting != "native":
            scale = uniform_flow_scale(traj.t.numpy(), traj.dt.numpy(), traj.sigmas.numpy(), traj.sde, traj.eta,
                                       traj.times.numpy(), self.t1)
            return torch.as_tensor(scale)[j].to(torch.float32)
        if objective != "pcpo":
            return torch.ones(len(j), dtype=torch.float32)
        _, scale, _ = pcpo_flow_scale(traj.t.numpy(), traj.dt.numpy(), traj.sigmas.numpy(), traj.sde, traj.eta,
                                      traj.times.numpy(), self.t1)
        return torch.as_tensor(scale)[j].to(torch.float32)

    def kl_to_reference(self, traj: FlowSample, j: torch.Tensor, x: torch.Tensor, model_output: torch.Tensor,
                        ref_output: torch.Tensor, form: str = "paper") -> torch.Tensor:
        """KL of the SDE step against the reference velocity in ``form`` (:func:`flow_kl_to_reference`)."""
        return flow_kl_to_reference(model_output, ref_output, *self._coefs(traj, j, x), form=form)
