"""Rollout: sampling an epoch, its rewards, the paired control, advantages and the held-out validation
(a part of :class:`pcpo_eval.train.trainer.Trainer`).

``sample_epoch`` samples trajectories with per-step log-probs with the run's sampler
(:func:`training_sampler`, the :class:`~pcpo_eval.samplers.base.Sampler` contract's ``for_training``), CFG as
DDPO; rewards; advantages (DDPO per-prompt tracker or GRPO groups), gathered across processes.
``validation_row`` scores the policy on held-out prompts with fixed noise and the sampler's deterministic
``for_validation``.
"""

from __future__ import annotations

import math
import time
from dataclasses import dataclass, field
from typing import TYPE_CHECKING, Any

import numpy as np
import torch

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.samplers import SAMPLERS, resolve_sampler
from pcpo_eval.samplers.base import Sampler, Trajectory
from pcpo_eval.seeding import keyed_generator as _keyed_generator
from pcpo_eval.train.advantages import (
    PerPromptStatTracker,
    batch_std_advantages,
    clamp_advantages,
    group_advantages,
)
from pcpo_eval.train.config import TrainConfig

if TYPE_CHECKING:  # annotations only: the Trainer imports these when it builds a run
    from pcpo_eval.prompts import PromptSet
    from pcpo_eval.rewards import RewardFn

#: the validation images' noise: keyed by image index only (the same for every run, seed and arm)
VALIDATION_STREAM = "train-validation/v1"


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
    reward_time_s: float = 0.0  # seconds this process spent scoring its samples (part of the sampling phase)
    control_cpu_s: float = 0.0  # process CPU seconds of the paired control
    #: a weighted reward's per-component means over all processes (``reward_<name>_mean``)
    reward_parts: dict[str, float] = field(default_factory=dict)
    control_parts: dict[str, float] = field(default_factory=dict)  # weighted reward: control_reward_<name>_mean


def training_sampler(cfg: TrainConfig, prediction: str) -> tuple[Sampler, str]:
    """The sampler and schedule a run trains with: the sampler that fits the model's ``prediction``
    (:func:`pcpo_eval.samplers.resolve_sampler`), built by its ``for_training`` from the run's options
    (eps models: DDIM, or PCPO's sigma~, Prop. 1; velocity models: the DanceGRPO / Flow-GRPO SDE, Prop. 2)."""
    return SAMPLERS[resolve_sampler("auto", prediction)].for_training(cfg)


class RolloutMixin:
    """Trainer methods that sample and score; they read the names declared here (set by
    :class:`pcpo_eval.train.trainer.Trainer`) and the policy's methods (:class:`pcpo_eval.train.policy.PolicyMixin`)."""

    cfg: TrainConfig
    adapter: ModelAdapter
    sampler: Sampler
    schedule: str
    reward_fn: RewardFn
    rank: int
    world: int
    device: torch.device
    null: PromptEmbeds
    prompt_set: PromptSet
    val_set: PromptSet | None
    tracker: PerPromptStatTracker
    # validation state: the paired control's rewards, and the weighted reward's parts (last validation)
    _val_control: np.ndarray | None
    _val_parts: dict[str, float]
    _val_control_parts: dict[str, float]

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
        if cfg.reward_overlap:
            parts, images, rewards, reward_time_s, components = self._sample_and_score(epoch, prompts)
            reward_parts = self._reward_part_means(mine=components)
        else:
            parts = [self._sample_batch(epoch, b * B, prompts[b * B:(b + 1) * B])
                     for b in range(cfg.sample_batches_per_epoch)]
            images = torch.cat([p[2] for p in parts]).cpu()  # the one host copy (it waits for the last decode)
            t_reward = time.perf_counter()
            rewards = self.reward_fn(images, prompts).double().numpy()
            reward_time_s = time.perf_counter() - t_reward
            reward_parts = self._reward_part_means()
        cond = PromptEmbeds.cat([p[0] for p in parts])
        all_rewards, adv = self._advantages(epoch, prompts, rewards, pids)
        traj = Trajectory.cat([p[1] for p in parts], dtype=torch.float32)
        t_control, c_control = time.perf_counter(), time.process_time()
        control = self._control_rewards(epoch, prompts) if cfg.paired_control else None
        control_parts = self._reward_part_means("control_") if cfg.paired_control else {}
        return EpochSamples(prompts=prompts, prompt_ids=pids, cond=cond, traj=traj, rewards=rewards,
                            advantages=adv, all_rewards=all_rewards, images=images, control_rewards=control,
                            control_time_s=time.perf_counter() - t_control if cfg.paired_control else 0.0,
                            control_cpu_s=time.process_time() - c_control if cfg.paired_control else 0.0,
                            reward_time_s=reward_time_s, reward_parts=reward_parts, control_parts=control_parts)

    def _sample_and_score(self, epoch: int, prompts: list[str]) -> tuple[list, torch.Tensor, np.ndarray, float, dict]:
        """``reward_overlap``: sample batch after batch while a one-thread pool scores each finished batch
        (ddpo-pytorch's reward executor). Returns the sampled parts, the images on the host and their
        rewards in sample order, the seconds the pool spent scoring, and a weighted reward's per-component
        scores (empty otherwise)."""
        from concurrent.futures import ThreadPoolExecutor

        from pcpo_eval.rewards import reward_components

        gpu = dist.gpu_index(self.device)  # read here: a new thread's current GPU is cuda:0, this process's cuda:<rank>

        def score(images: torch.Tensor, batch_prompts: list[str]) -> tuple[torch.Tensor, np.ndarray, dict, float]:
            if gpu is not None:
                torch.cuda.set_device(gpu)
            host = images.cpu()  # waits for this batch's decode here, not in the sampling thread
            t0 = time.perf_counter()
            r = self.reward_fn(host, batch_prompts).double().numpy()
            parts = {k: v.tolist() for k, v in reward_components(self.reward_fn).items()}
            return host, r, parts, time.perf_counter() - t0

        B, parts, futures = self.cfg.sample_batch_size, [], []
        with ThreadPoolExecutor(max_workers=1, thread_name_prefix="reward") as pool:
            for b in range(self.cfg.sample_batches_per_epoch):
                parts.append(self._sample_batch(epoch, b * B, prompts[b * B:(b + 1) * B]))
                futures.append(pool.submit(score, parts[-1][2], prompts[b * B:(b + 1) * B]))
            scored = [f.result() for f in futures]  # in sample order; a reward's error is raised here
        components: dict[str, list[float]] = {}
        for *_, c, _ in scored:
            for k, v in c.items():
                components.setdefault(k, []).extend(v)
        return (parts, torch.cat([h for h, *_ in scored]), np.concatenate([r for _, r, *_ in scored]),
                float(sum(t for *_, t in scored)), components)

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
        """The deterministic evaluation sampler on the training grid (the training sampler's ``for_validation``:
        DDIM eta 0, or the flow ODE)."""
        return self.sampler.for_validation(self.cfg)

    @torch.no_grad()
    def _validation_rewards(self) -> np.ndarray:
        """Rewards of the current policy on the validation images, in image order (all processes).

        Image i: prompt ``i mod P``, initial noise from the generator keyed by i alone
        (:data:`VALIDATION_STREAM`), deterministic sampler (eta 0), ``validation_steps`` (default: the run's steps)
        and the run's CFG.
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
                                      steps=cfg.validation_steps or cfg.sample_steps, eta=0.0, generators=gens,
                                      schedule=schedule)
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
