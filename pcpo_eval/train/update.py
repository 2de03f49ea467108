"""The update: per-step loss, micro-batches and one epoch of optimizer steps, and the epoch's log row
(a part of :class:`pcpo_eval.train.trainer.Trainer`).

``train_epoch``: per-sample shuffled timesteps (``timestep_fraction``), the selected objective
(``objectives.py``), gradient accumulation over samples x timesteps so each of ``gradient_updates``
optimizer steps covers its share, gradient all-reduce across processes, max-grad-norm, AdamW.
``step_loss`` asks the sampler (``samplers/base.py``) for log-probs, weights, PCPO's scale and the KL.
"""

from __future__ import annotations

from collections.abc import Callable
from typing import Any

import numpy as np
import torch

from pcpo_eval.credit.flow import KL_FORMS
from pcpo_eval.dist import to_device_async
from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter
from pcpo_eval.samplers.base import Sampler, Trajectory
from pcpo_eval.train.config import TrainConfig
from pcpo_eval.train.diagnostics import approx_kl, delta_terms, diagnostic_stats, ppo_health_stats
from pcpo_eval.train.ema import ParamEMA
from pcpo_eval.train.objectives import StepLoss, eps_matching_log_rho, uses_decomposition
from pcpo_eval.train.rollout import EpochSamples, keyed_generator


class _Rows:
    """Rows ``rows`` at steps ``j`` (+ ``shift``) of the epoch's recorded (N, S, ...) tensors.

    The recorded tensors live where the sampler left them (the policy's device); the CPU index tensors
    are copied there once per micro-step, without blocking (:func:`pcpo_eval.dist.to_device_async`)."""

    def __init__(self, tr: Trajectory, rows: torch.Tensor, j: torch.Tensor) -> None:
        device = tr.trajectory.device
        self.rows, self.j = to_device_async(rows, device), to_device_async(j, device)

    def take(self, recorded: torch.Tensor, shift: int = 0) -> torch.Tensor:
        """``recorded[rows, j + shift]``."""
        return recorded[self.rows, self.j + shift]


def _step_groups(n_train: int, per_forward: int) -> list[list[int]]:
    """The positions 0..n_train-1 of each sample's selected steps, ``per_forward`` to a forward
    (``train_steps_per_forward``; the last group may be smaller)."""
    return [list(range(k, min(k + per_forward, n_train))) for k in range(0, n_train, per_forward)]


def _to_lists(values: dict[str, list[torch.Tensor]]) -> dict[str, list[float]]:
    """Each key's device tensors concatenated and copied to the host once, as Python floats (the values
    the per-step ``tolist()`` calls gave)."""
    return {k: torch.cat(v).tolist() if v else [] for k, v in values.items()}


class UpdateMixin:
    """Trainer methods that turn an epoch's samples into optimizer steps; they read the names declared here
    (set by :class:`pcpo_eval.train.trainer.Trainer` and :meth:`pcpo_eval.train.policy.PolicyMixin._init_policy`)
    and the policy's methods."""

    cfg: TrainConfig
    adapter: ModelAdapter
    sampler: Sampler
    objective: Callable[..., StepLoss]
    device: torch.device
    rank: int
    scaler: torch.amp.GradScaler | None
    ema: ParamEMA | None

    def _train_steps(self) -> list[int]:
        """Step indices that may be trained (DanceGRPO drops the last step)."""
        S = self.cfg.sample_steps
        return list(range(S if self.cfg.train_last_step else max(S - 1, 1)))

    def _trainable_steps(self, samples: EpochSamples) -> list[int]:
        """:meth:`_train_steps` without the steps PCPO gives no credit (DDIM fallback ``exclude``: scale 0)
        and without the steps whose transition std is below ``train_min_sigma``."""
        tr = samples.traj
        std = self.sampler.step_std(tr)  # flow: sigma_t sqrt(dt); DDIM: sigma_t
        steps = [s for s in self._train_steps() if float(std[s]) >= self.cfg.train_min_sigma]
        if not steps:
            raise UserError(f"train_min_sigma={self.cfg.train_min_sigma:g} leaves no step to train (largest step "
                            f"std {float(std.max()):.4g}); lower train_min_sigma")
        scale = self.sampler.credit_scale(samples.traj, torch.tensor(steps), self.cfg.objective)
        kept = [s for s, c in zip(steps, scale.tolist(), strict=True) if c != 0]
        if not kept:
            raise UserError("every trainable step has credit 0 (credit_fallback=exclude); use credit_fallback=cap")
        return kept

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
        # Every host-to-device copy of a micro-step is pinned and non-blocking (dist.to_device_async), so the
        # host queues this forward while the GPU still runs the last backward. The recorded chains live on
        # the device; the indices and the schedule's values go there (a blocking copy, or indexing a CUDA
        # tensor with CPU indices, would wait for the GPU to drain at every micro-step).
        at = _Rows(tr, rows, j)
        x = at.take(tr.trajectory)
        t = to_device_async(sp.model_time(tr, j), dev)
        cond = samples.cond.index(at.rows.to(samples.cond.hidden.device))  # the indices already copied (same device)
        with self._autocast():
            out = self._predict(x, t, cond, len(rows)).float()
        if uses_decomposition(cfg.objective) or cfg.diagnostics:
            recorded, noise = at.take(tr.model_outputs), at.take(tr.noise)
            weight = to_device_async(sp.native_weight(tr, j), dev)
        if uses_decomposition(cfg.objective):
            log_rho = eps_matching_log_rho(out, recorded, noise, weight)
            res = self.objective(log_rho, adv, cfg.clip_range,
                                 weight_scale=to_device_async(self._credit_scale(tr, j), dev))
        else:
            logp = sp.step_log_prob(tr, j, x, at.take(tr.trajectory, 1), out)
            res = self.objective(logp - at.take(tr.log_probs), adv, cfg.clip_range)
        if cfg.diagnostics:
            res.delta = delta_terms(out, recorded, noise, weight)
        loss, kls = res.loss, None
        if cfg.beta_kl > 0:
            # the reference in the policy's precision: in fp32 beside a bf16 / fp16 policy, the KL of two
            # equal networks would be their rounding difference, not 0
            with torch.no_grad(), self._autocast(), self._reference():
                ref = self._ref_predict(x, t, cond, len(rows)).float()
            kls = {form: sp.kl_to_reference(tr, j, x, out, ref, form=form) for form in KL_FORMS}
            loss = loss + cfg.beta_kl * kls[cfg.kl_form]
        return loss, res, kls

    def _credit_scale(self, tr: Trajectory, j: torch.Tensor) -> torch.Tensor:
        """The per-step scale inside the hinge: the sampler's (PCPO's w~/w, or 1), or with
        ``step_weighting=uniform_high_noise`` w_u / w(t_j), w_u = zeta / N (credit.flow.uniform_flow_scale)."""
        return self.sampler.credit_scale(tr, j, self.cfg.objective, self.cfg.step_weighting)

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
        groups = _step_groups(n_train, cfg.train_steps_per_forward)  # each sample's steps, per forward
        N = len(samples.prompts)
        adv_all = torch.as_tensor(samples.advantages, dtype=torch.float32)
        stats: dict[str, list[float]] = {"loss": [], "clip": [], "log_rho": [], "kl": [], "grad_norm": [],
                                         "g1_mean": [], "g1_var": [], "step": [], "update": [], "rows": [],
                                         "dot": [], "sq": []}
        kl_forms: dict[str, list[float]] = {form: [] for form in KL_FORMS}
        # Per-step values stay on the device until the epoch ends (one transfer, :func:`_to_lists`): a
        # ``float()`` / ``tolist()`` per step would make the host wait for each backward before it could
        # queue the next forward, leaving the GPU idle while Python prepares every step.
        dev_stats: dict[str, list[torch.Tensor]] = {k: [] for k in ("loss", "clip", "log_rho", "dot", "sq", "kl")}
        dev_kls: dict[str, list[torch.Tensor]] = {form: [] for form in KL_FORMS}
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
                for i, rows in enumerate(chunk):
                    stats["rows"].append(len(rows))
                    adv_rows, steps_of_rows = to_device_async(adv_all[rows], self.device), tsel[rows]
                    for ks in groups:
                        # ``len(ks)`` of each row's selected steps in one forward, step-major (all rows at
                        # the first step, then at the next): the same per-step losses, summed into the
                        # same accumulated gradient, as one forward per step
                        fused, j = rows.repeat(len(ks)), steps_of_rows[:, ks].T.reshape(-1)
                        adv = adv_rows if len(ks) == 1 else adv_rows.repeat(len(ks))
                        loss, out, kls = self.step_loss(samples, fused, j, adv)
                        step_sum = loss.mean() if len(ks) == 1 else loss.mean() * len(ks)  # sum of per-step means
                        self._scaled(step_sum / accum).backward()
                        dev_stats["loss"].append(loss.detach().view(len(ks), len(rows)).mean(1))
                        dev_stats["clip"].append(out.clipped.detach().float().reshape(-1))
                        dev_stats["log_rho"].append(out.log_rho.detach().float().reshape(-1))
                        stats["step"].extend(j.tolist())
                        stats["update"].extend([inner * cfg.gradient_updates + u] * len(fused))
                        if out.delta is not None:
                            dev_stats["dot"].append(out.delta[0].detach().reshape(-1))
                            dev_stats["sq"].append(out.delta[1].detach().reshape(-1))
                        if kls is not None:
                            dev_stats["kl"].append(kls[cfg.kl_form].detach().reshape(-1))
                            for form, v in kls.items():
                                dev_kls[form].append(v.detach().reshape(-1))
                    last = i == len(chunk) - 1
                    if last:  # the update's last micro-batch: its optimizer step
                        gn, g1 = self._optimizer_step()
                        stats["grad_norm"].append(gn)
                        stats["g1_mean"].append(g1[0])
                        stats["g1_var"].append(g1[1])
                    self._ema_step(last)  # after every training batch, as Flow-GRPO calls it (train/ema.py)
        stats.update(_to_lists(dev_stats))
        kl_forms.update(_to_lists(dev_kls))
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
            "approx_kl": approx_kl(lr),
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
        if self.ema is not None:
            row["ema_updates"] = self.ema.updates  # averaging steps so far (ema_decay; train/ema.py)
        return row
