"""A compact policy-gradient trainer for diffusion models: DDPO, DanceGRPO-SD and PCPO.

Read top to bottom; each stage is a method tests can call on its own:

1. ``sample_epoch``   sample trajectories with per-step log-probs with the run's sampler
                      (``training_sampler``: DDIM, or PCPO's sigma~; for velocity models the
                      DanceGRPO / Flow-GRPO SDE), CFG as DDPO; rewards; advantages (DDPO
                      per-prompt tracker or GRPO groups). ``step_loss`` asks the sampler
                      (``samplers/base.py``) for log-probs, weights, PCPO's scale and the KL.
2. ``train_epoch``    per-sample shuffled timesteps (``timestep_fraction``), the selected
                      objective (``objectives.py``), gradient accumulation over samples x
                      timesteps so each of ``gradient_updates`` optimizer steps covers its share,
                      gradient all-reduce across processes, max-grad-norm, AdamW.
3. ``save_checkpoint`` LoRA (diffusers format) or full weights + optimizer/tracker state.
4. ``log_epoch``      one row per epoch in ``log.parquet`` and TensorBoard, with PPO health
                      (clipfrac, approx_kl and the log-ratio range per update and per timestep).

Paired control (``paired_control: true``): each epoch the UNTRAINED model (LoRA disabled, or the
frozen copy of a full fine-tune) also samples the same prompts with the same keyed generators,
sampler and schedule; its reward is ``control_reward_mean``. At epoch 1 policy and base are equal,
so the two rewards are equal there; afterwards ``reward_mean - control_reward_mean`` is the
learning signal with the prompt draw and the noise cancelled (and a sampler offset shows up as a
difference between arms' controls, not as learning).

Diagnostics and evaluation (docs/training.md): ``diagnostics`` adds the Taylor error of log rho ~
rho - 1 and the Eq. Delta terms per update (``diagnostics.py``; like the other ratio statistics,
from this process's samples); ``validation_every`` scores the policy after the epoch on held-out
prompts with fixed noise and a deterministic sampler (``validation_row``); ``wall_clock_s`` is the
cumulative sampling + training time and ``compute_s`` the run's own compute for it (process CPU
seconds on CPU, so other processes sharing the cores do not inflate it; wall seconds on a GPU); ``init_from`` starts a fresh run from a checkpoint's weights
(the reference policy stays the base model: :data:`INIT_REFERENCE`); ``step_weighting`` swaps the
hinge's per-step scale for the uniform high-noise one (``_credit_scale``).

Randomness: every draw comes from a generator keyed by (seed, epoch, rank, purpose, index), so a
resumed run repeats an uninterrupted one exactly. Multi-process (torchrun / accelerate launch):
``torch.distributed`` with gloo on CPU, nccl on GPU; each process samples its own share, rewards
are gathered for the advantage statistics, gradients are averaged.
"""

from __future__ import annotations

import math
import time
from collections.abc import Iterator
from contextlib import contextmanager, nullcontext
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd
import torch
import yaml

from pcpo_eval import dist
from pcpo_eval.credit.flow import KL_FORMS, uniform_flow_scale
from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_json, atomic_write_parquet, atomic_write_text
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.precision import deterministic_cuda
from pcpo_eval.progress import echo, progress_bar
from pcpo_eval.rundir import LOG_FILE, checkpoint_dir, config_path
from pcpo_eval.samplers import resolve_sampler
from pcpo_eval.samplers.base import Sampler, Trajectory
from pcpo_eval.samplers.ddim import DDIMSampler
from pcpo_eval.samplers.flow import FlowSampler, default_grid
from pcpo_eval.seeding import keyed_generator as _keyed_generator
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.advantages import (
    PerPromptStatTracker,
    batch_std_advantages,
    clamp_advantages,
    group_advantages,
)
from pcpo_eval.train.config import TrainConfig
from pcpo_eval.train.diagnostics import delta_terms, diagnostic_stats
from pcpo_eval.train.objectives import StepLoss, eps_matching_log_rho, get_objective, uses_decomposition
from pcpo_eval.train.tracking import RunTracking, open_tracking

#: config keys ``--resume`` lets differ from the run's config.yaml (neither changes what is trained)
RESUME_MAY_CHANGE = ("epochs", "device", "keep_checkpoints")
INIT_FILE = "init_from.json"  #: where a run started from ``init_from`` records its source and weights hash
#: the validation images' noise: keyed by image index only (the same for every run, seed and arm)
VALIDATION_STREAM = "train-validation/v1"
#: the reference policy (KL, paired control, validation control) of a run started from ``init_from``
INIT_REFERENCE = ("the base model `model` (LoRA disabled, or a frozen copy taken before init_from was loaded), "
                  "the same anchor as the run that wrote the checkpoint")


def keyed_generator(*parts: Any) -> torch.Generator:
    """The trainer's random streams: ``seeding.keyed_generator("train/v1", *parts)`` (no global RNG)."""
    return _keyed_generator("train/v1", *parts)


@dataclass
class EpochSamples:
    """One epoch's samples on this process (N samples, S steps).

    ``traj`` is the sampler's record of the N chains (:class:`~pcpo_eval.samplers.base.Trajectory`,
    float32): states, unit noise, the sampling policy's guided outputs (eps_hat or velocity), the
    log-probs and the sampler's own per-step schedule.
    """

    prompts: list[str]
    prompt_ids: np.ndarray  # (N,)
    cond: PromptEmbeds
    traj: Trajectory
    rewards: np.ndarray  # (N,)
    advantages: np.ndarray  # (N,)
    all_rewards: np.ndarray  # rewards of all processes (for logging)
    images: torch.Tensor  # (N, 3, H, W) uint8
    control_rewards: np.ndarray | None = None  # untrained model, same prompts and noises (all processes)
    control_time_s: float = 0.0  # seconds spent sampling the paired control
    control_cpu_s: float = 0.0  # process CPU seconds of the paired control
    #: a weighted reward's per-component means over all processes (``reward_<name>_mean``)
    reward_parts: dict[str, float] = field(default_factory=dict)
    control_parts: dict[str, float] = field(default_factory=dict)  # weighted reward: control_reward_<name>_mean


def training_sampler(cfg: TrainConfig, prediction: str) -> tuple[Sampler, str]:
    """The sampler and schedule a run trains with.

    eps models: DDIM with DDIM's sigma (DDPO) or, for ``objective=pcpo``, PCPO's re-solved sigma~
    in ``credit_convention`` with ``credit_fallback`` (Prop. 1; docs/credit.md). Velocity models: the
    flow SDE ``sde`` on ``flow_grid`` (DanceGRPO / Flow-GRPO), the model fed DanceGRPO's quantized
    time if ``model_time_quantize``; PCPO keeps that sampler and reweights in the hinge (Prop. 2).
    """
    if resolve_sampler("auto", prediction) == DDIMSampler.name:
        return DDIMSampler(convention=cfg.credit_convention, fallback=cfg.credit_fallback), cfg.sigma_schedule()
    return FlowSampler(shift=cfg.flow_shift, grid=cfg.flow_grid, t1=cfg.flow_t1,
                       quantize_time=cfg.model_time_quantize), cfg.sde


def guided_detached_uncond(adapter: ModelAdapter, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds,
                           uncond: PromptEmbeds, cfg: float) -> torch.Tensor:
    """CFG output ``sg(out_u) + cfg (out_c - sg(out_u))`` with the unconditional branch detached (sg): one 2B
    batch as :meth:`ModelAdapter.predict`, the same value, gradient only through the conditional branch
    (Flow-GRPO's ``compute_log_prob``: ``noise_pred_uncond.detach()``)."""
    if t.ndim == 0:
        t = t.expand(x_t.shape[0])
    if cfg == 1.0:
        return adapter.denoise(x_t, t, cond)
    both = adapter.denoise(torch.cat([x_t, x_t]), torch.cat([t, t]), PromptEmbeds.cat([uncond, cond]))
    out_u, out_c = both.chunk(2)
    out_u = out_u.detach()
    return out_u + cfg * (out_c - out_u)


class Trainer:
    def __init__(self, config: TrainConfig, out_dir: str | Path, resume: bool = False,
                 progress: bool | None = None) -> None:
        self.cfg = config.validate()
        self.progress = progress  #: epoch bar on stderr (rank 0); None: when stderr is a terminal
        self.out = Path(out_dir)
        self.rank, self.world = dist.init(config.device)
        if (msg := self.cfg.total_batch_problem(self.world)) is not None:  # launcher x per-process batch != paper's
            raise UserError(msg)
        self.device = dist.pick_device(config.device, self.rank)
        if self.device.type == "cuda":
            deterministic_cuda()  # bitwise resume on a GPU too (process-wide setting; docs/gpu.md)
        from pcpo_eval.models.registry import load_model
        from pcpo_eval.prompts import load_prompts
        from pcpo_eval.rewards import make_reward

        self.prompt_set = load_prompts(config.prompts)
        self.val_set = self._validation_prompts() if config.validation_every > 0 else None
        self._val_control: np.ndarray | None = None
        self._val_parts: dict[str, float] = {}  # weighted reward: val_reward_<name>_mean of the last validation
        self._val_control_parts: dict[str, float] = {}
        self.reward_fn = make_reward(config.reward, **config.reward_options)
        self.adapter: ModelAdapter = load_model(config.model, device=self.device)
        self.sampler, self.schedule = training_sampler(config, self.adapter.prediction)
        self.adapter.denoiser.train()
        if config.lora_rank > 0:
            # peft's LoRA init draws from the global RNG: fork it and seed from the config, so runs repeat
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                self.adapter.add_lora(config.lora_rank, config.lora_alpha)
        else:
            self.adapter.denoiser.requires_grad_(True)
        self.params = self.adapter.trainable_parameters()
        self.ref_denoiser = None
        if (config.beta_kl > 0 or config.paired_control) and config.lora_rank == 0:
            import copy

            self.ref_denoiser = copy.deepcopy(self.adapter.denoiser).requires_grad_(False).eval()
        self.init_record = self._init_from() if config.init_from and not resume else None
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.adam_weight_decay, eps=config.adam_epsilon,
        )
        self.tracker = PerPromptStatTracker(config.stat_buffer_size, config.stat_min_count)
        self.scaler = self._grad_scaler()
        self.objective = get_objective(config.objective)
        with torch.no_grad():
            self.null = self.adapter.encode_prompts([""])
        self.log_rows: list[dict[str, Any]] = []
        self.start_epoch = 1
        if resume:
            self._resume()
        elif self.is_main and (self.out / LOG_FILE).exists():
            raise UserError(f"{self.out} already holds a run; pass --resume to continue it or choose another --out")
        if self.is_main:
            self.out.mkdir(parents=True, exist_ok=True)
            atomic_write_text(config_path(self.out), yaml.safe_dump(self.cfg.to_dict(), sort_keys=False))
            if self.init_record is not None:
                atomic_write_json(self.out / INIT_FILE, self.init_record)
        self.tracking: RunTracking = open_tracking(self.out, self.cfg.to_dict(), self.cfg.log_to, self.cfg.log_project,
                                      self.cfg.wandb_mode, self.cfg.log_images_every, self.is_main, resume)

    @property
    def is_main(self) -> bool:
        return self.rank == 0

    # ------------------------------------------------------------------------------------
    # 1. sampling
    # ------------------------------------------------------------------------------------
    def _choose_prompts(self, epoch: int) -> list[int]:
        """Indices into the prompt set for this process's samples (uniform, DDPO; groups, GRPO)."""
        n, cfg = self.cfg.samples_per_epoch, self.cfg
        npr = len(self.prompt_set)
        if cfg.advantage == "group":
            k = n // cfg.images_per_prompt
            g = keyed_generator(cfg.seed, epoch, self.rank, "prompts")
            groups = torch.randint(npr, (k,), generator=g).tolist()
            return [p for p in groups for _ in range(cfg.images_per_prompt)]
        g = keyed_generator(cfg.seed, epoch, self.rank, "prompts")
        return torch.randint(npr, (n,), generator=g).tolist()

    @torch.no_grad()
    def sample_epoch(self, epoch: int) -> EpochSamples:
        """Sample this process's trajectories (with log-probs), score them, compute advantages."""
        cfg, ad = self.cfg, self.adapter
        ad.denoiser.eval()
        idx = self._choose_prompts(epoch)
        prompts = [self.prompt_set.prompts[i] for i in idx]
        pids = np.array([self.prompt_set.prompt_ids[i] for i in idx])
        B = cfg.sample_batch_size
        parts = [self._sample_batch(epoch, b * B, prompts[b * B:(b + 1) * B]) for b in range(cfg.sample_batches_per_epoch)]
        cond = PromptEmbeds.cat([p[0] for p in parts])
        images = torch.cat([p[2] for p in parts])
        rewards = self.reward_fn(images.cpu(), prompts).double().numpy()
        reward_parts = self._reward_part_means()
        all_rewards, adv = self._advantages(epoch, prompts, rewards, pids)
        traj = Trajectory.cat([p[1] for p in parts], dtype=torch.float32)
        t_control, c_control = time.perf_counter(), time.process_time()
        control = self._control_rewards(epoch, prompts) if cfg.paired_control else None
        control_parts = self._reward_part_means("control_") if cfg.paired_control else {}
        return EpochSamples(prompts=prompts, prompt_ids=pids, cond=cond, traj=traj, rewards=rewards,
                            advantages=adv, all_rewards=all_rewards, images=images.cpu(), control_rewards=control,
                            control_time_s=time.perf_counter() - t_control if cfg.paired_control else 0.0,
                            control_cpu_s=time.process_time() - c_control if cfg.paired_control else 0.0,
                            reward_parts=reward_parts, control_parts=control_parts)

    def _reward_part_means(self, prefix: str = "", mine: dict[str, list[float]] | None = None) -> dict[str, float]:
        """Each component's mean score over all processes' samples of the last reward call (or of the
        per-component scores ``mine`` collected over several calls); weighted rewards only, columns
        ``prefix`` + :func:`pcpo_eval.rewards.component_column` (``control_reward_aesthetic_mean``)."""
        from pcpo_eval.rewards import component_column, reward_components

        if getattr(self.reward_fn, "last_components", None) is None:  # the same reward on every process
            return {}
        if mine is None:
            mine = {k: v.tolist() for k, v in reward_components(self.reward_fn).items()}
        every = dist.gather_objects(mine)  # a process without images this call sends {}
        names = list(dict.fromkeys(k for part in every for k in part))
        return {prefix + component_column(k): float(np.mean([x for part in every for x in part.get(k, [])]))
                for k in names}

    def _control_rewards(self, epoch: int, prompts: list[str]) -> np.ndarray:
        """Rewards of the untrained model on this epoch's prompts and noises (all processes' samples)."""
        B = self.cfg.sample_batch_size
        with self._base_policy():
            images = torch.cat([self._sample_batch(epoch, b * B, prompts[b * B:(b + 1) * B], record=False)[2]
                                for b in range(self.cfg.sample_batches_per_epoch)])
        rewards = self.reward_fn(images.cpu(), prompts).double().numpy()
        return self._gather(prompts, rewards, np.zeros(len(prompts), dtype=np.int64))[1]

    def _sample_batch(self, epoch: int, start: int, prompts: list[str],
                      record: bool = True) -> tuple[PromptEmbeds, Trajectory, torch.Tensor]:
        """One recorded sampling batch (samples ``start``... of the epoch): prompt embeddings, trajectory, images.

        CFG as DDPO; ``same_noise_per_group`` shares x_T within a prompt group (DanceGRPO-SD).
        """
        cfg, ad = self.cfg, self.adapter
        cond = ad.encode_prompts(prompts)
        gens = [keyed_generator(cfg.seed, epoch, self.rank, "sample", start + j) for j in range(len(prompts))]
        x_T = None
        if cfg.same_noise_per_group:
            x_T = torch.stack([
                torch.randn(ad.latent_shape, generator=keyed_generator(cfg.seed, epoch, self.rank, "group",
                                                                          (start + j) // cfg.images_per_prompt))
                for j in range(len(prompts))
            ])
        with self._autocast():
            traj = self.sampler.sample(ad, cond, self.null.repeat(len(prompts)), cfg=cfg.cfg, steps=cfg.sample_steps,
                                       eta=cfg.sample_eta, generators=gens, schedule=self.schedule, record=record,
                                       x_T=x_T)
            images = ad.decode(traj.latents.float())  # the VAE under autocast too (SD-1.x's VAE is bf16/fp16-safe)
        return cond, traj, images

    def _advantages(self, epoch: int, prompts: list[str], rewards: np.ndarray,
                    pids: np.ndarray) -> tuple[np.ndarray, np.ndarray]:
        """(rewards of all processes, this process's clamped advantages): DDPO per-prompt tracker or GRPO groups.

        Rejects the epoch (UserError) if any process's reward is NaN/inf.
        """
        cfg = self.cfg
        all_prompts, all_rewards, all_pids = self._gather(prompts, rewards, pids)
        bad = ~np.isfinite(all_rewards)
        if bad.any():
            names = sorted({all_prompts[i] for i in np.flatnonzero(bad)})
            raise UserError(
                f"epoch {epoch}: reward {cfg.reward!r} returned NaN/inf for prompt(s) {names}; epoch rejected, "
                "no checkpoint written"
            )
        if cfg.advantage == "group" and cfg.adv_std == "batch":
            adv_all = batch_std_advantages(all_prompts, all_rewards)
        elif cfg.advantage == "group":
            groups = np.repeat(np.arange(len(all_rewards) // cfg.images_per_prompt), cfg.images_per_prompt)
            adv_all = group_advantages(groups, all_rewards)
        else:
            adv_all = self.tracker.update(all_prompts, all_rewards)
        adv_all = clamp_advantages(adv_all, cfg.adv_clip_max)
        n = len(prompts)
        return all_rewards, adv_all[self.rank * n:(self.rank + 1) * n]

    def _gather(self, prompts: list[str], rewards: np.ndarray, pids: np.ndarray):
        if self.world == 1:
            return prompts, rewards, pids
        out = dist.gather_objects((prompts, rewards.tolist(), pids.tolist()))
        return ([p for o in out for p in o[0]], np.array([r for o in out for r in o[1]], dtype=np.float64),
                np.array([i for o in out for i in o[2]]))

    # ------------------------------------------------------------------------------------
    # 2. training
    # ------------------------------------------------------------------------------------
    def _train_steps(self) -> list[int]:
        """Step indices that may be trained (DanceGRPO drops the last step)."""
        S = self.cfg.sample_steps
        return list(range(S if self.cfg.train_last_step else max(S - 1, 1)))

    def _trainable_steps(self, samples: EpochSamples) -> list[int]:
        """:meth:`_train_steps` without the steps PCPO gives no credit (DDIM fallback ``exclude``: scale 0)
        and without the steps whose transition std is below ``train_min_sigma``."""
        tr = samples.traj
        std = tr.std if hasattr(tr, "std") else tr.sigmas  # flow: sigma_t sqrt(dt); DDIM: sigma_t
        steps = [s for s in self._train_steps() if float(std[s]) >= self.cfg.train_min_sigma]
        if not steps:
            raise UserError(f"train_min_sigma={self.cfg.train_min_sigma:g} leaves no step to train (largest step "
                            f"std {float(std.max()):.4g}); lower train_min_sigma")
        scale = self.sampler.credit_scale(samples.traj, torch.tensor(steps), self.cfg.objective)
        kept = [s for s, c in zip(steps, scale.tolist(), strict=True) if c != 0]
        if not kept:
            raise UserError("every trainable step has credit 0 (credit_fallback=exclude); use credit_fallback=cap")
        return kept

    def _predict(self, x: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds, n: int) -> torch.Tensor:
        """The guided model output in training; the unconditional branch detached if ``cfg_detach_uncond``."""
        if self.cfg.cfg_detach_uncond:
            return guided_detached_uncond(self.adapter, x, t, cond, self.null.repeat(n), self.cfg.cfg)
        return self.adapter.predict(x, t, cond, self.null.repeat(n), self.cfg.cfg)

    def step_loss(
        self, samples: EpochSamples, rows: torch.Tensor, j: torch.Tensor, adv: torch.Tensor
    ) -> tuple[torch.Tensor, StepLoss, dict[str, torch.Tensor] | None]:
        """Per-sample loss, objective output and KLs (or None) of samples ``rows`` at steps ``j`` ((b,) long).

        One recipe for every sampler (``self.sampler``, :mod:`pcpo_eval.samplers.base`):

        * ``ppo_clip`` / ``log_hinge``: log rho = log p_theta - log p_old of the recorded step
          (``sampler.step_log_prob``; DDPO, DanceGRPO, Flow-GRPO).
        * ``eps_matching`` / ``pcpo``: log rho = -[w d . eps + 1/2 ||w d||^2], d = model output minus
          the recorded one, w the step's native weight (Prop. 1; Eq. logrho-flow), exact, no exp;
          scaled inside the hinge by ``sampler.credit_scale`` (flow PCPO: zeta dt_i / w(t_i), Prop. 2;
          DDIM: 1, or the fallback's w*/w_min at steps sigma~ cannot bring to w*).
        * ``beta_kl > 0``: + beta_kl * KL of the step against the reference policy (base weights: LoRA
          disabled, or a frozen copy) in ``kl_form``, ``sampler.kl_to_reference`` (Flow-GRPO; DPOK). The
          third value holds the KL in every form of :data:`~pcpo_eval.credit.flow.KL_FORMS` (for the log).
        """
        cfg, dev, sp, tr = self.cfg, self.device, self.sampler, samples.traj
        x = tr.trajectory[rows, j].to(dev)
        t = sp.model_time(tr, j).to(dev)
        cond = samples.cond.index(rows.to(samples.cond.hidden.device))
        with self._autocast():
            out = self._predict(x, t, cond, len(rows)).float()
        if uses_decomposition(cfg.objective):
            log_rho = eps_matching_log_rho(out, tr.model_outputs[rows, j].to(dev), tr.noise[rows, j].to(dev),
                                           sp.native_weight(tr, j).to(dev))
            res = self.objective(log_rho, adv, cfg.clip_range, weight_scale=self._credit_scale(tr, j).to(dev))
        else:
            logp = sp.step_log_prob(tr, j, x, tr.trajectory[rows, j + 1].to(dev), out)
            res = self.objective(logp - tr.log_probs[rows, j].to(dev), adv, cfg.clip_range)
        if cfg.diagnostics:
            res.delta = delta_terms(out, tr.model_outputs[rows, j].to(dev), tr.noise[rows, j].to(dev),
                                    sp.native_weight(tr, j).to(dev))
        loss, kls = res.loss, None
        if cfg.beta_kl > 0:
            with torch.no_grad(), self._reference():
                ref = self._ref_predict(x, t, cond, len(rows)).float()
            kls = {form: sp.kl_to_reference(tr, j, x, out, ref, form=form) for form in KL_FORMS}
            loss = loss + cfg.beta_kl * kls[cfg.kl_form]
        return loss, res, kls

    def _credit_scale(self, tr: Trajectory, j: torch.Tensor) -> torch.Tensor:
        """The per-step scale inside the hinge: the sampler's (PCPO's w~/w, or 1), or with
        ``step_weighting=uniform_high_noise`` w_u / w(t_j), w_u = zeta / N (credit.flow.uniform_flow_scale)."""
        if self.cfg.step_weighting == "native":
            return self.sampler.credit_scale(tr, j, self.cfg.objective)
        scale = uniform_flow_scale(tr.t.numpy(), tr.dt.numpy(), tr.sigmas.numpy(), tr.sde, tr.eta, tr.times.numpy(),
                                   self.cfg.flow_t1)
        return torch.as_tensor(scale)[j].to(torch.float32)

    def _micro_batches(self, perm: torch.Tensor, samples: EpochSamples, epoch: int) -> list[torch.Tensor]:
        """The epoch's micro-batches of ``train_batch_size`` rows in ``perm`` order, or with
        ``drop_zero_advantage`` Flow-GRPO's filter (``scripts/train_sd3.py``): samples whose advantage is
        exactly 0 leave; as many of them as needed come back (keyed draw, the same in every inner epoch)
        to make the kept count a multiple of the micro-batch count (at least one per micro-batch); the
        kept rows, in ``perm`` order, form the same number of smaller micro-batches, so the optimizer
        steps and their accumulation are unchanged."""
        tb, N = self.cfg.train_batch_size, len(perm)
        if not self.cfg.drop_zero_advantage:
            return [perm[i:i + tb] for i in range(0, N, tb)]
        n_micro = N // tb
        zero = np.asarray(samples.advantages) == 0  # by sample index
        n_kept = int((~zero).sum())
        need = n_micro if n_kept == 0 else -n_kept % n_micro
        g = keyed_generator(self.cfg.seed, epoch, self.rank, "drop_zero_advantage")
        zero_at = np.flatnonzero(zero)
        keep = ~zero
        keep[zero_at[torch.randperm(len(zero_at), generator=g)[:need].numpy()]] = True
        kept = perm[torch.as_tensor(keep[perm.numpy()])]
        size = len(kept) // n_micro
        return [kept[i * size:(i + 1) * size] for i in range(n_micro)]

    def train_epoch(self, epoch: int, samples: EpochSamples) -> dict[str, float]:
        cfg, ad = self.cfg, self.adapter
        ad.denoiser.train()
        steps = self._trainable_steps(samples)
        n_train = max(1, int(len(steps) * cfg.timestep_fraction))
        N = len(samples.prompts)
        adv_all = torch.as_tensor(samples.advantages, dtype=torch.float32)
        stats: dict[str, list[float]] = {"loss": [], "clip": [], "log_rho": [], "kl": [], "grad_norm": [],
                                         "g1_mean": [], "g1_var": [], "step": [], "update": [], "rows": [],
                                         "dot": [], "sq": []}
        kl_forms: dict[str, list[float]] = {form: [] for form in KL_FORMS}
        for inner in range(cfg.num_inner_epochs):
            g = keyed_generator(cfg.seed, epoch, self.rank, "train", inner)
            perm = torch.randperm(N, generator=g)
            # per-sample random timestep order; the first n_train of each are trained
            tsel = torch.stack([torch.tensor(steps)[torch.randperm(len(steps), generator=g)][:n_train] for _ in range(N)])
            micro = self._micro_batches(perm, samples, epoch)
            per_update = len(micro) // cfg.gradient_updates
            for u in range(cfg.gradient_updates):
                chunk = micro[u * per_update:(u + 1) * per_update]
                accum = len(chunk) * n_train
                for rows in chunk:
                    adv = adv_all[rows].to(self.device)
                    stats["rows"].append(len(rows))
                    for k in range(n_train):
                        j = tsel[rows, k]
                        loss, out, kls = self.step_loss(samples, rows, j, adv)
                        self._scaled(loss.mean() / accum).backward()
                        stats["loss"].append(float(loss.detach().mean()))
                        stats["clip"].extend(out.clipped.float().tolist())
                        stats["log_rho"].extend(out.log_rho.detach().float().tolist())
                        stats["step"].extend(j.tolist())
                        stats["update"].extend([inner * cfg.gradient_updates + u] * len(rows))
                        if out.delta is not None:
                            stats["dot"].extend(out.delta[0].tolist())
                            stats["sq"].extend(out.delta[1].tolist())
                        if kls is not None:
                            stats["kl"].extend(kls[cfg.kl_form].detach().tolist())
                            for form, v in kls.items():
                                kl_forms[form].extend(v.detach().tolist())
                gn, g1 = self._optimizer_step()
                stats["grad_norm"].append(gn)
                stats["g1_mean"].append(g1[0])
                stats["g1_var"].append(g1[1])
        return self._epoch_row(epoch, samples, stats, kl_forms)

    def _epoch_row(self, epoch: int, samples: EpochSamples, stats: dict[str, list[float]],
                   kl_forms: dict[str, list[float]]) -> dict[str, Any]:
        """The epoch's log row; the option-specific columns appear only when their option is on."""
        cfg = self.cfg
        lr = np.asarray(stats["log_rho"], dtype=np.float64)
        rho = np.exp(lr)
        control = samples.control_rewards
        row = {
            "epoch": epoch,
            "reward_mean": float(np.mean(samples.all_rewards)),
            "reward_std": float(np.std(samples.all_rewards)),
            "control_reward_mean": float(np.mean(control)) if control is not None else float("nan"),
            "control_reward_std": float(np.std(control)) if control is not None else float("nan"),
            "loss": float(np.mean(stats["loss"])),
            "clipfrac": float(np.mean(stats["clip"])),
            "approx_kl": float(0.5 * np.mean(lr**2)),
            "rho_mean": float(rho.mean()), "rho_min": float(rho.min()), "rho_max": float(rho.max()),
            "rho_std": float(rho.std()),
            "log_rho_abs_mean": float(np.abs(lr).mean()),
            "grad_norm": float(np.mean(stats["grad_norm"])),
            "grad_first_abs_mean": float(np.mean(stats["g1_mean"])),
            "grad_first_abs_var": float(np.mean(stats["g1_var"])),
            "kl_ref": float(np.mean(stats["kl"])) if stats["kl"] else float("nan"),
            "adv_abs_mean": float(np.abs(samples.advantages).mean()),
            **ppo_health_stats(lr, np.asarray(stats["clip"]), np.asarray(stats["update"]), np.asarray(stats["step"])),
        }
        row.update(samples.reward_parts)
        row.update(samples.control_parts)
        if cfg.beta_kl > 0:
            row.update({f"kl_ref_{form}": float(np.mean(v)) for form, v in kl_forms.items()})
        if cfg.diagnostics:
            row.update(diagnostic_stats(lr, np.asarray(stats["clip"]), np.asarray(stats["update"]),
                                        np.asarray(stats["step"]), np.asarray(stats["dot"]), np.asarray(stats["sq"])))
        if cfg.drop_zero_advantage:
            row["train_samples"] = int(sum(stats["rows"])) // max(cfg.num_inner_epochs, 1)
        if self.scaler is not None:
            row["loss_scale"] = float(self.scaler.get_scale())
        return row

    def _scaled(self, loss: torch.Tensor) -> torch.Tensor:
        """The loss to back-propagate: times the dynamic loss scale under fp16 (:meth:`_grad_scaler`)."""
        return loss if self.scaler is None else self.scaler.scale(loss)

    def _grad_scaler(self) -> torch.amp.GradScaler | None:
        """Dynamic loss scaling for fp16 autocast on CUDA (what accelerate's fp16 mixed precision does in
        ddpo-pytorch); None otherwise (fp32, bf16 or CPU: no scaling)."""
        if self.device.type != "cuda" or self.cfg.mixed_precision != "fp16":
            return None
        return torch.amp.GradScaler("cuda")

    def _optimizer_step(self) -> tuple[float, tuple[float, float]]:
        """All-reduce (average) gradients, unscale (fp16), clip, AdamW step (skipped by the scaler on inf/NaN
        gradients, which the all-reduce has spread to every process). Returns grad norm and first-layer |g| stats."""
        if self.world > 1:
            # One flat bucket, one all-reduce (not one collective per tensor).
            for p in self.params:
                if p.grad is None:
                    p.grad = torch.zeros_like(p)
            grads = [p.grad for p in self.params]
            flat = dist.all_reduce_sum(torch.cat([g.reshape(-1) for g in grads])) / self.world
            offset = 0
            for g in grads:
                g.copy_(flat[offset : offset + g.numel()].view_as(g))
                offset += g.numel()
        if self.scaler is not None:
            self.scaler.unscale_(self.optimizer)
        first = next((p for p in self.params if p.grad is not None), None)
        g1 = (float(first.grad.abs().mean()), float(first.grad.abs().var())) if first is not None else (0.0, 0.0)
        gn = torch.nn.utils.clip_grad_norm_(self.params, self.cfg.max_grad_norm)
        if self.scaler is not None:
            self.scaler.step(self.optimizer)
            self.scaler.update()
        else:
            self.optimizer.step()
        self.optimizer.zero_grad(set_to_none=True)
        return float(gn), g1

    # ------------------------------------------------------------------------------------
    # reference model (KL), autocast
    # ------------------------------------------------------------------------------------
    def _reference(self):
        den = self.adapter.denoiser
        if self.ref_denoiser is None and ck.is_lora(den):
            return _LoraDisabled(den)
        return nullcontext()

    @contextmanager
    def _base_policy(self) -> Iterator[None]:
        """The untrained model as the sampling policy: LoRA disabled, or the frozen copy swapped in."""
        if self.ref_denoiser is None:
            with self._reference():
                yield
            return
        live, self.adapter.denoiser = self.adapter.denoiser, self.ref_denoiser
        try:
            yield
        finally:
            self.adapter.denoiser = live

    def _ref_predict(self, x_t, t, cond, n):
        if self.ref_denoiser is None:
            return self.adapter.predict(x_t, t, cond, self.null.repeat(n), self.cfg.cfg)
        live = self.adapter.denoiser
        self.adapter.denoiser = self.ref_denoiser
        try:
            return self.adapter.predict(x_t, t, cond, self.null.repeat(n), self.cfg.cfg)
        finally:
            self.adapter.denoiser = live

    def _autocast(self):
        """``mixed_precision`` as autocast: fp16 / bf16 on CUDA, bf16 on CPU too (so CI runs this path);
        fp16 on CPU is ignored (CPU autocast covers few fp16 kernels), as is ``no``."""
        mp = self.cfg.mixed_precision
        if mp == "no" or (self.device.type != "cuda" and mp != "bf16"):
            return nullcontext()
        dtype = torch.float16 if mp == "fp16" else torch.bfloat16
        return torch.autocast(self.device.type, dtype=dtype)

    # ------------------------------------------------------------------------------------
    # 3./4. checkpoints, logs, resume
    # ------------------------------------------------------------------------------------
    def save_checkpoint(self, epoch: int, row: dict[str, Any]) -> Path | None:
        if not self.is_main:
            return None
        meta = {"epoch": epoch, "reward_mean": row["reward_mean"], "model": self.cfg.model,
                "objective": self.cfg.objective, "lora_rank": self.cfg.lora_rank}
        if self.cfg.init_from:
            meta["init_from"] = self.cfg.init_from
        state = {"epoch": epoch, "optimizer": self.optimizer.state_dict(), "tracker": self.tracker.state_dict()}
        if self.scaler is not None:
            state["scaler"] = self.scaler.state_dict()
        path = ck.save_checkpoint(checkpoint_dir(self.out, epoch), self.adapter.denoiser, meta, state)
        ck.apply_retention(self.out, self.cfg.keep_checkpoints)  # state in the newest only; keep_checkpoints
        return path

    def log_epoch(self, row: dict[str, Any]) -> None:
        if not self.is_main:
            return
        self.log_rows.append(row)
        atomic_write_parquet(self.out / LOG_FILE, log_frame(self.log_rows))

    def _resume(self) -> None:
        latest = ck.latest_checkpoint(self.out)
        if latest is None:
            raise UserError(f"--resume: no complete checkpoint in {self.out}/checkpoints; start without --resume")
        saved = ck.load_run_config(self.out)
        defaults = TrainConfig().to_dict()  # a key the run's config.yaml predates had its default value
        mismatch = [k for k, v in self.cfg.to_dict().items()
                    if k not in RESUME_MAY_CHANGE and saved.get(k, defaults[k]) != v]
        if mismatch:
            raise UserError(f"--resume: config differs from the run's config.yaml in {', '.join(mismatch)}; "
                            "resume with the same settings (only epochs and keep_checkpoints may change)")
        ck.check_resumable_weights(latest)
        state = ck.load_training_state(latest)
        if "peft_state" in state:
            from peft.utils import set_peft_model_state_dict

            set_peft_model_state_dict(self.adapter.denoiser, state["peft_state"])
        else:
            ck.load_weights_into(self.adapter, latest)
        self.optimizer.load_state_dict(state["optimizer"])
        self.tracker.load_state_dict(state["tracker"])
        if self.scaler is not None and "scaler" in state:
            self.scaler.load_state_dict(state["scaler"])
        self.start_epoch = int(state["epoch"]) + 1
        if (self.out / LOG_FILE).exists():
            log = pd.read_parquet(self.out / LOG_FILE)
            self.log_rows = log[log["epoch"] <= state["epoch"]].to_dict("records")

    # ------------------------------------------------------------------------------------
    # 5. held-out validation reward, init_from, cumulative wall clock
    # ------------------------------------------------------------------------------------
    def _validation_prompts(self):
        """The validation prompt set; a warning when it shares prompts with the training set."""
        from pcpo_eval.prompts import load_prompts

        vs = load_prompts(self.cfg.validation_prompts)
        shared = set(vs.prompts) & set(self.prompt_set.prompts)
        if shared and self.is_main:
            print(f"[pcpo-eval] warning: {len(shared)} of the {len(vs)} validation prompts are training prompts too "
                  f"(e.g. {sorted(shared)[0]!r}); the validation reward is then not held-out", flush=True)
        return vs

    def _validation_sampler(self) -> tuple[Sampler, str]:
        """The deterministic evaluation sampler on the training grid: DDIM eta 0, or the flow ODE."""
        cfg = self.cfg
        if self.adapter.prediction == "eps":
            return DDIMSampler(), "ddim"
        grid = default_grid(cfg.sde) if cfg.flow_grid == "auto" else cfg.flow_grid
        return FlowSampler(shift=cfg.flow_shift, grid=grid, t1=cfg.flow_t1, quantize_time=cfg.model_time_quantize), "ode"

    @torch.no_grad()
    def _validation_rewards(self) -> np.ndarray:
        """Rewards of the current policy on the validation images, in image order (all processes).

        Image i: prompt ``i mod P``, initial noise from the generator keyed by i alone
        (:data:`VALIDATION_STREAM`), deterministic sampler (eta 0), the run's steps and CFG.
        """
        cfg, ad, vs = self.cfg, self.adapter, self.val_set
        n = cfg.validation_images or len(vs)
        mine = list(range(self.rank, n, self.world))
        sampler, schedule = self._validation_sampler()
        ad.denoiser.eval()
        from pcpo_eval.rewards import reward_components

        scored: list[tuple[int, float]] = []
        parts: dict[str, list[float]] = {}
        for b in range(0, len(mine), cfg.sample_batch_size):
            idx = mine[b:b + cfg.sample_batch_size]
            prompts = [vs.prompts[i % len(vs)] for i in idx]
            gens = [_keyed_generator(VALIDATION_STREAM, i) for i in idx]
            with self._autocast():
                traj = sampler.sample(ad, ad.encode_prompts(prompts), self.null.repeat(len(idx)), cfg=cfg.cfg,
                                      steps=cfg.sample_steps, eta=0.0, generators=gens, schedule=schedule)
            rewards = self.reward_fn(ad.decode(traj.latents.float()).cpu(), prompts).double().numpy()
            scored.extend(zip(idx, rewards.tolist(), strict=True))
            for k, v in reward_components(self.reward_fn).items():  # weighted reward: each component too
                parts.setdefault(k, []).extend(v.tolist())
        self._val_parts = self._reward_part_means("val_", parts)
        everything = sorted(p for part in dist.gather_objects(scored) for p in part)
        out = np.array([r for _, r in everything], dtype=np.float64)
        if not np.isfinite(out).all():
            raise UserError(f"validation: reward {cfg.reward!r} returned NaN/inf on {int((~np.isfinite(out)).sum())} "
                            f"validation image(s) of {cfg.validation_prompts!r}")
        return out

    def validation_row(self) -> dict[str, float]:
        """``val_reward_mean`` / ``val_reward_sem`` (SD / sqrt(n), n images) of the policy after this epoch's
        updates (= the epoch's checkpoint); with ``paired_control`` the untrained model's on the same images
        (``val_control_reward_*``; computed once per process, it does not change)."""
        t0 = time.perf_counter()

        def stats(prefix: str, r: np.ndarray) -> dict[str, float]:
            sem = float(np.std(r, ddof=1) / math.sqrt(len(r))) if len(r) > 1 else float("nan")
            return {f"{prefix}_mean": float(np.mean(r)), f"{prefix}_sem": sem}

        row = {**stats("val_reward", self._validation_rewards()), **self._val_parts}  # + val_reward_<name>_mean
        if self.cfg.paired_control:
            if self._val_control is None:
                with self._base_policy():
                    self._val_control = self._validation_rewards()
                self._val_control_parts = {"val_control_" + k[len("val_"):]: v for k, v in self._val_parts.items()}
            row.update(stats("val_control_reward", self._val_control))
            row.update(self._val_control_parts)  # val_control_reward_<name>_mean
        row["val_images"] = int(self.cfg.validation_images or len(self.val_set))
        row["val_time_s"] = time.perf_counter() - t0
        return row

    def _init_from(self) -> dict[str, Any]:
        """Load ``init_from``'s weights into the fresh model (LoRA into the adapter, or the full denoiser);
        returns the record written to :data:`INIT_FILE`. The reference policy stays the base model."""
        cfg = self.cfg
        src = ck.init_source(cfg.init_from)
        ck.check_init_compatible(src, cfg.model, cfg.lora_rank, cfg.lora_alpha)
        ck.load_init_weights(self.adapter.denoiser, src)
        return {**src, "reference_policy": INIT_REFERENCE}

    def _wall_clock(self) -> float:
        """Cumulative seconds of sampling + training before this epoch (``wall_clock_s`` of the last row;
        a log from before that column: the sum of its ``wall_time_s``)."""
        if not self.log_rows:
            return 0.0
        last = self.log_rows[-1].get("wall_clock_s")
        if last is not None and math.isfinite(float(last)):
            return float(last)
        return float(np.nansum([float(r.get("wall_time_s", 0.0)) for r in self.log_rows]))

    def _compute(self) -> float:
        """Cumulative ``compute_s`` before this epoch (0 for a log from before that column)."""
        last = self.log_rows[-1].get("compute_s") if self.log_rows else None
        return float(last) if last is not None and math.isfinite(float(last)) else 0.0

    def _epoch_compute(self, row: dict[str, Any], samples: EpochSamples, cpu_s: float) -> float:
        """This epoch's own compute for sampling + training, without the paired control: process CPU seconds
        on CPU (unaffected by other processes sharing the cores), wall seconds on a GPU (the device is the
        compute; one process per GPU)."""
        if self.device.type == "cpu":
            return cpu_s - samples.control_cpu_s
        return row["wall_time_s"] - samples.control_time_s

    def run(self) -> pd.DataFrame:
        """Train epochs ``start_epoch..epochs``; returns the log."""
        cfg = self.cfg
        if self.is_main:
            n = cfg.samples_per_epoch * self.world
            print(f"[pcpo-eval] {cfg.objective} on {cfg.model}: {n} samples/epoch x {cfg.sample_steps} steps, "
                  f"{cfg.gradient_updates} updates/epoch, {sum(p.numel() for p in self.params):,} trainable params, "
                  f"{self.world} process(es), epochs {self.start_epoch}..{cfg.epochs}", flush=True)
        bar = progress_bar(cfg.epochs, "train", self.progress if self.is_main else False, unit="epoch",
                           initial=self.start_epoch - 1)
        try:
            for epoch in range(self.start_epoch, cfg.epochs + 1):
                self._run_epoch(epoch, bar)
        finally:
            bar.close()
        warning = ppo_health_warning(pd.DataFrame(self.log_rows)) if self.log_rows else None
        if self.is_main and warning:
            print(f"[pcpo-eval] warning: {warning}", flush=True)
        self.tracking.close()
        return pd.DataFrame(self.log_rows)

    def _run_epoch(self, epoch: int, bar: Any) -> None:
        """One epoch: sample, train, log, checkpoint (with retention), the console line; ``bar`` shows the phase."""
        cfg = self.cfg
        bar.set_postfix_str("sampling", refresh=True)
        t0, c0 = time.perf_counter(), time.process_time()
        samples = self.sample_epoch(epoch)
        t1 = time.perf_counter()
        bar.set_postfix_str("training", refresh=True)
        row = self.train_epoch(epoch, samples)
        row["sample_time_s"] = t1 - t0
        row["wall_time_s"] = time.perf_counter() - t0
        row["wall_clock_s"] = self._wall_clock() + row["wall_time_s"] - samples.control_time_s
        row["compute_s"] = self._compute() + self._epoch_compute(row, samples, time.process_time() - c0)
        if cfg.paired_control:
            row["control_time_s"] = samples.control_time_s
        if cfg.validation_every > 0 and (epoch % cfg.validation_every == 0 or epoch == cfg.epochs):
            row.update(self.validation_row())
        row["peak_rss_mb"] = _peak_rss_mb()
        self.log_epoch(row)
        self.tracking.log_epoch(row, samples.all_rewards, samples.images.cpu().numpy(), samples.prompts)
        if epoch % cfg.checkpoint_every == 0 or epoch == cfg.epochs:
            self.save_checkpoint(epoch, row)
        dist.barrier()
        if self.is_main:
            ctrl = f"  control {row['control_reward_mean']:+.4f}" if cfg.paired_control else ""
            echo(bar, f"epoch {epoch:4d}  reward {row['reward_mean']:+.4f} +- {row['reward_std']:.4f}{ctrl}  "
                      f"clipfrac {row['clipfrac']:.3f}  kl {row['approx_kl']:.2e}  {row['wall_time_s']:.1f}s")
        bar.set_postfix_str(f"reward {row['reward_mean']:+.4f}", refresh=False)
        bar.update(1)


def log_frame(rows: list[dict[str, Any]]) -> pd.DataFrame:
    """The log rows as written to ``log.parquet``: list columns (per update / per step) as float64 arrays.

    From Python lists pyarrow infers a column's type from its values, and pandas hands it NaN as null:
    a list column that is NaN throughout (``delta_ratio_per_update`` of a run with one on-policy update
    per epoch) became ``list<null>`` and read back as None. Float64 arrays keep it ``list<double>``; its
    NaNs are stored as null and read back as NaN."""
    df = pd.DataFrame(rows)
    for col in df.columns:
        vals = df[col]
        if vals.dtype != object or not any(isinstance(v, (list, tuple, np.ndarray)) for v in vals):
            continue
        try:
            df[col] = pd.Series([np.asarray(v, dtype=np.float64) if isinstance(v, (list, tuple, np.ndarray)) else None
                                 for v in vals], index=df.index, dtype=object)
        except (TypeError, ValueError):  # not a numeric list column: pyarrow's own inference
            continue
    return df


#: PPO health thresholds (the ranges PPO practice treats as healthy; cf. the issue's ddpo measurements).
HEALTHY_APPROX_KL = 0.05
HEALTHY_CLIPFRAC = 0.25


def ppo_health_stats(log_rho: np.ndarray, clipped: np.ndarray, update: np.ndarray, step: np.ndarray) -> dict[str, Any]:
    """Per epoch: the log-ratio range, approx_kl / clipfrac per optimizer update, and |log rho| per timestep.

    ``approx_kl = 0.5 mean(log rho^2)`` (ddpo-pytorch) computed within each update; lists are stored in
    ``log.parquet`` (one entry per update / per sampler step index) so a reader can see which update or
    which timestep carried the large ratios.
    """
    if log_rho.size == 0:
        return {}
    ups = np.unique(update)
    steps = np.unique(step)
    return {
        "log_rho_min": float(log_rho.min()),
        "log_rho_max": float(log_rho.max()),
        "approx_kl_per_update": [float(0.5 * np.mean(log_rho[update == u] ** 2)) for u in ups],
        "clipfrac_per_update": [float(np.mean(clipped[update == u])) for u in ups],
        "log_rho_abs_per_step": [float(np.mean(np.abs(log_rho[step == s]))) for s in steps],
    }


def ppo_health_warning(log: pd.DataFrame) -> str | None:
    """A one-line warning when the run's updates are too large (median approx_kl or mean clipfrac out of range)."""
    if "approx_kl" not in log or "clipfrac" not in log or log.empty:
        return None
    kl, cf = float(np.nanmedian(log["approx_kl"])), float(np.nanmean(log["clipfrac"]))
    fired = []  # only the condition(s) out of range
    if kl > HEALTHY_APPROX_KL:
        fired.append(f"median approx_kl {kl:.3g} > {HEALTHY_APPROX_KL}")
    if cf > HEALTHY_CLIPFRAC:
        fired.append(f"mean clipfrac {cf:.3g} > {HEALTHY_CLIPFRAC}")
    if not fired:
        return None
    return f"updates too large ({' and '.join(fired)}): lower the learning rate or the clip range"


class _LoraDisabled:
    """Context: run a peft-LoRA'd diffusers model with its adapters disabled (reference policy)."""

    def __init__(self, den: torch.nn.Module) -> None:
        self.den = den

    def __enter__(self) -> None:
        self.den.disable_adapters()

    def __exit__(self, *exc: Any) -> None:
        self.den.enable_adapters()


def _peak_rss_mb() -> float:
    import resource

    return resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024.0


def train(config: TrainConfig, out_dir: str | Path, resume: bool = False, progress: bool | None = None) -> pd.DataFrame:
    """Library entry point: train a run into ``out_dir`` (see module docstring); ``progress``: an epoch bar
    with ETA on stderr (rank 0; None = when stderr is a terminal)."""
    return Trainer(config, out_dir, resume=resume, progress=progress).run()
