"""The sampler contract: what generation and training ask of a sampling algorithm.

Every sampler here walks a chain x_T -> x_0 of Gaussian transitions (DDPO's
``ddim_step_with_logprob``, DanceGRPO's ``flux_step``, Flow-GRPO's ``sde_step_with_logprob``)::

    x_next = mu_theta(x, model_output; step j) + std_j * eps,      eps ~ N(0, I)

Generation needs only the final latents; policy-gradient training needs, per recorded step j
(paper Eq. ``eq:logrho`` / Prop. 1 for DDIM, Eq. ``eq:logrho-flow`` / Prop. 2 for flow SDEs):

* ``step_log_prob``: log p_theta(x_next | x) of a recorded transition under a new model output
  (ppo_clip / log_hinge: log rho = log p_theta - log p_old);
* ``native_weight``: the weight w of the decomposition log rho = -[w d . eps + 1/2 ||w d||^2],
  d = model output - recorded output, eps the step's unit noise (``unit`` convention);
* ``credit_scale``: PCPO's per-step reweighting s_j inside the hinge, w~/w = zeta dt_j / w(t_j) for
  flow SDEs (Prop. 2); for DDIM 1 where the sigma~ schedule reaches w* (Prop. 1) and the fallback's
  scale elsewhere (``cap``: w*/w_min, ``exclude``: 0; :data:`pcpo_eval.credit.ddim.FALLBACKS`); 1 for
  every objective other than ``pcpo`` (DDPO, DanceGRPO, Flow-GRPO); a step of scale 0 is not trained;
* ``kl_to_reference``: KL of the step against the reference policy, ||mu - mu_ref||^2 / (2 std_j^2)
  averaged over dims (Flow-GRPO Eq. 3; DPOK for DDIM), or in Flow-GRPO's code form
  (``form="flowgrpo_code"``, :data:`pcpo_eval.credit.flow.KL_FORMS`).

A sampler also names the model prediction it fits (``eps`` or ``velocity``) and its noise
schedules (first = default). Its output, the :class:`Trajectory`, holds what every sampler records;
each sampler's subclass adds its own per-step schedule (DDIM's alpha_bar, the flow grid's t, dt).
"""

from __future__ import annotations

import dataclasses
from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any, ClassVar, Protocol, TypeVar, runtime_checkable

import torch

from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

#: Per-sample fields of a :class:`Trajectory` (batch dimension first); the rest is per step.
PER_SAMPLE_FIELDS: tuple[str, ...] = ("latents", "trajectory", "noise", "model_outputs", "log_probs")

T = TypeVar("T", bound="Trajectory")


@dataclass(kw_only=True)
class Trajectory:
    """A batch of sampled chains (B samples, S steps): the record every sampler returns.

    ``latents`` (B, C, H, W) is the final x_0 (the image; DanceGRPO's flow SDE: the last step's prediction of
    x_0, :data:`pcpo_eval.samplers.flow.FINAL_LATENT`) and ``sigmas`` (S,) float64 the per-step SDE noise
    scale (0 for deterministic steps). With ``record=True`` also ``trajectory`` (B, S+1, C, H, W)
    from x_T to x_0, ``noise`` (B, S, C, H, W) the unit noise of each step (zeros when
    deterministic), ``model_outputs`` (B, S, C, H, W) the guided outputs of the sampling policy
    (eps_hat or velocity) and ``log_probs`` (B, S) (zeros when deterministic).
    """

    latents: torch.Tensor
    sigmas: torch.Tensor
    trajectory: torch.Tensor | None = None
    noise: torch.Tensor | None = None
    model_outputs: torch.Tensor | None = None
    log_probs: torch.Tensor | None = None

    @classmethod
    def cat(cls: type[T], parts: Sequence[T], dtype: torch.dtype | None = None) -> T:
        """Join batches sampled with one schedule: per-sample tensors concatenated (cast to
        ``dtype`` if given), the per-step schedule taken from the first batch."""
        first = parts[0]

        def join(name: str) -> torch.Tensor | None:
            if getattr(first, name) is None:
                return None
            out = torch.cat([getattr(p, name) for p in parts])
            return out if dtype is None else out.to(dtype)

        return dataclasses.replace(first, **{name: join(name) for name in PER_SAMPLE_FIELDS})


def per_sample_noise(generators: list[torch.Generator], shape: tuple[int, ...]) -> torch.Tensor:
    """Unit Gaussian noise, one ``randn(shape)`` per sample from its own generator (float32, CPU):
    every sampler's x_T and the eps of each stochastic step, so a sample's chain depends on its
    generator alone (not on the batch it is drawn in)."""
    return torch.stack([torch.randn(shape, generator=g, dtype=torch.float32) for g in generators])


@dataclass
class Recorder:
    """What a sampler keeps with ``record=True``, step by step, and how it lands in a :class:`Trajectory`.

    ``states`` starts with x_T; :meth:`step` appends x_next, the guided model output, the step's unit
    noise and log-prob (zeros for a deterministic step, as :class:`Trajectory` documents);
    :meth:`fill` stacks them along dim 1.
    """

    states: list[torch.Tensor]
    outputs: list[torch.Tensor] = dataclasses.field(default_factory=list)
    noises: list[torch.Tensor] = dataclasses.field(default_factory=list)
    log_probs: list[torch.Tensor] = dataclasses.field(default_factory=list)

    def step(self, x_next: torch.Tensor, model_output: torch.Tensor, noise: torch.Tensor | None = None,
             log_prob: torch.Tensor | None = None) -> None:
        """Record one step; ``noise`` / ``log_prob`` None: a deterministic step (zeros)."""
        self.states.append(x_next)
        self.outputs.append(model_output)
        self.noises.append(torch.zeros_like(x_next) if noise is None else noise)
        self.log_probs.append(torch.zeros(x_next.shape[0], device=x_next.device) if log_prob is None else log_prob)

    def fill(self, out: Trajectory) -> None:
        """Set ``out``'s ``trajectory`` (B, S+1, ...), ``noise``, ``model_outputs`` (B, S, ...) and ``log_probs`` (B, S)."""
        out.trajectory = torch.stack(self.states, dim=1)
        out.noise = torch.stack(self.noises, dim=1)
        out.model_outputs = torch.stack(self.outputs, dim=1)
        out.log_probs = torch.stack(self.log_probs, dim=1)


@runtime_checkable
class Sampler(Protocol):
    """A sampling algorithm for one model prediction type (module docstring).

    ``j`` is a (b,) long tensor of step indices (one per sample); ``x``/``x_next`` are the recorded
    states at j and j+1, ``model_output`` the (new) guided model output at ``x``. Methods that take
    tensors return them on the tensors' device; the schedule-only methods (``model_time``,
    ``native_weight``, ``credit_scale``) return CPU tensors.
    """

    name: ClassVar[str]  #: catalogue name (``--sampler``)
    prediction: ClassVar[str]  #: the model prediction it fits: ``eps`` or ``velocity``
    schedules: ClassVar[tuple[str, ...]]  #: its noise-schedule choices, first = default

    def sample(
        self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float, steps: int,
        eta: float, generators: list[torch.Generator], schedule: str | None = None, record: bool = False,
        x_T: torch.Tensor | None = None,
    ) -> Trajectory:
        """Sample B latents (one generator per sample); ``record`` keeps the chain and log-probs."""
        ...

    def __call__(
        self, adapter: ModelAdapter, cond: PromptEmbeds, uncond: PromptEmbeds | None, *, cfg: float, steps: int,
        eta: float, generators: list[torch.Generator], schedule: str | None = None,
    ) -> torch.Tensor:
        """Latents only (generation): ``sample(...).latents``."""
        ...

    @classmethod
    def for_training(cls, run: Any) -> tuple[Sampler, str]:
        """The sampler and schedule a training run samples with; ``run`` holds the run's options (a
        :class:`~pcpo_eval.train.config.TrainConfig`: ``objective``, ``credit_*``, ``flow_*``, ``sde``, ...)."""
        ...

    @classmethod
    def for_validation(cls, run: Any) -> tuple[Sampler, str]:
        """The deterministic sampler and schedule (eta 0) that scores a training run's held-out prompts."""
        ...

    def model_time(self, traj: Trajectory, j: torch.Tensor) -> torch.Tensor:
        """The time the adapter is called with at steps ``j`` (DDIM: integer timestep; flow: t in [0, 1])."""
        ...

    def step_log_prob(
        self, traj: Trajectory, j: torch.Tensor, x: torch.Tensor, x_next: torch.Tensor, model_output: torch.Tensor
    ) -> torch.Tensor:
        """log p(x_next | x) (b,) under ``model_output``, averaged over non-batch dims (DDPO)."""
        ...

    def step_std(self, traj: Trajectory) -> torch.Tensor:
        """The std of each recorded step's transition (S,) (DDIM: sigma_t; flow: sigma_t sqrt(dt))."""
        ...

    def native_weight(self, traj: Trajectory, j: torch.Tensor) -> torch.Tensor:
        """The decomposition weight w of steps ``j`` (b,) float32 (``unit`` convention)."""
        ...

    def credit_scale(self, traj: Trajectory, j: torch.Tensor, objective: str,
                     weighting: str = "native") -> torch.Tensor:
        """PCPO's reweighting s_j (b,) float32 inside the hinge; ones unless it applies. ``weighting`` other
        than ``native`` (``step_weighting``, flow SDEs only) swaps it for another per-step scale."""
        ...

    def kl_to_reference(
        self, traj: Trajectory, j: torch.Tensor, x: torch.Tensor, model_output: torch.Tensor, ref_output: torch.Tensor,
        form: str = "paper",
    ) -> torch.Tensor:
        """KL (b,) of the step under ``model_output`` against the one under ``ref_output``, in ``form``."""
        ...


def gaussian_kl_same_std(mu: torch.Tensor, mu_ref: torch.Tensor, std: torch.Tensor | float) -> torch.Tensor:
    """KL(N(mu, s^2) || N(mu_ref, s^2)) = ||mu - mu_ref||^2 / (2 s^2), averaged over non-batch dims.

    Flow-GRPO's KL penalty (Eq. 3) and DPOK's for DDIM; ``std`` a scalar or (B,).
    """
    std = torch.as_tensor(std, dtype=mu.dtype, device=mu.device)
    if std.ndim == 1:
        std = std.reshape(-1, *([1] * (mu.ndim - 1)))
    return ((mu - mu_ref) ** 2 / (2 * std**2)).mean(dim=tuple(range(1, mu.ndim)))
