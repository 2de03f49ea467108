"""The policy being trained: the adapter with its LoRA or full weights, the reference / base policy, mixed
precision and the optimizer step (a part of :class:`pcpo_eval.train.trainer.Trainer`).

``_init_policy`` adds LoRA (or unfreezes the denoiser), keeps a frozen copy of a full fine-tune when the
reference policy is needed (``beta_kl > 0`` or ``paired_control``), loads ``init_from``, builds AdamW and
the weights' moving average (``ema_decay``);
the reference policy of a LoRA run is the same model with its adapters disabled (:class:`_LoraDisabled`).
"""

from __future__ import annotations

import copy
from collections.abc import Iterator
from contextlib import AbstractContextManager, contextmanager, nullcontext
from typing import Any

import torch

from pcpo_eval import dist
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import TrainConfig
from pcpo_eval.train.ema import ParamEMA

#: the reference policy (KL, paired control, validation control) of a run started from ``init_from``
INIT_REFERENCE = ("the base model `model` (LoRA disabled, or a frozen copy taken before init_from was loaded), "
                  "the same anchor as the run that wrote the checkpoint")


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


class _LoraDisabled:
    """Context: run a peft-LoRA'd diffusers model with its adapters disabled (reference policy)."""

    def __init__(self, den: torch.nn.Module) -> None:
        self.den = den

    def __enter__(self) -> None:
        self.den.disable_adapters()

    def __exit__(self, *exc: Any) -> None:
        self.den.enable_adapters()


class PolicyMixin:
    """Trainer methods on the policy's weights; they read ``cfg``, ``adapter``, ``device``, ``world`` and ``null``
    (set by :class:`pcpo_eval.train.trainer.Trainer`) and set the rest of the names declared here."""

    # read: set by the Trainer before _init_policy
    cfg: TrainConfig
    adapter: ModelAdapter
    device: torch.device
    world: int
    null: PromptEmbeds  #: the empty prompt's embedding (CFG's unconditional branch)
    # set by _init_policy
    params: list[torch.nn.Parameter]
    ref_denoiser: torch.nn.Module | None  #: frozen copy of a fully trained denoiser (None with LoRA: adapters off)
    init_record: dict[str, Any] | None
    optimizer: torch.optim.AdamW
    scaler: torch.amp.GradScaler | None
    ema: ParamEMA | None  #: the weights' moving average (``ema_decay > 0``; ``train/ema.py``)
    optimizer_steps: int  #: optimizer steps taken by the run (Flow-GRPO's global_step; the EMA's clock)

    def _init_policy(self, resume: bool) -> None:
        """LoRA or full weights trainable, the frozen reference copy, ``init_from``, AdamW and the loss scaler."""
        config = self.cfg
        self.adapter.denoiser.train()
        if config.lora_rank > 0:
            # peft's LoRA init draws from the global RNG: fork it and seed from the config, so runs repeat
            with torch.random.fork_rng(devices=[]):
                torch.manual_seed(config.seed)
                self.adapter.add_lora(config.lora_rank, config.lora_alpha)
        else:
            self.adapter.denoiser.requires_grad_(True)
        self._store_frozen_weights()
        self.params = self.adapter.trainable_parameters()
        self.ref_denoiser = None
        if (config.beta_kl > 0 or config.paired_control) and config.lora_rank == 0:
            self.ref_denoiser = copy.deepcopy(self.adapter.denoiser).requires_grad_(False).eval()
        self.init_record = self._init_from() if config.init_from and not resume else None
        self.optimizer = torch.optim.AdamW(
            self.params, lr=config.learning_rate, betas=(config.adam_beta1, config.adam_beta2),
            weight_decay=config.adam_weight_decay, eps=config.adam_epsilon,
        )
        self.scaler = self._grad_scaler()
        # after init_from: the average starts at the weights training starts from
        self.ema = ParamEMA(self.params, config.ema_decay, config.ema_every) if config.ema_decay > 0 else None
        self.optimizer_steps = 0

    def _ema_step(self, after_step: bool) -> None:
        """After each training batch (micro-batch; ``after_step``: the one that ended with the optimizer step):
        the moving average's update at the run's optimizer step count, where Flow-GRPO's ``train_sd3.py``
        calls it, or ``ema_repeats`` updates right after the step (:class:`pcpo_eval.train.ema.ParamEMA`)."""
        if self.ema is None:
            return
        if self.cfg.ema_repeats == 0:
            self.ema.step(self.params, self.optimizer_steps)
        elif after_step:
            self.ema.step(self.params, self.optimizer_steps, repeats=self.cfg.ema_repeats)

    def _ema_weights(self) -> AbstractContextManager[None]:
        """The averaged weights in place for the block (validation, a checkpoint's weights); the raw ones
        otherwise (or always, without ``ema_decay``)."""
        return nullcontext() if self.ema is None else self.ema.swapped_in(self.params)

    def _predict(self, x: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds, n: int) -> torch.Tensor:
        """The guided model output in training; the unconditional branch detached if ``cfg_detach_uncond``.

        ``x`` goes in at the network's dtype, as the samplers give it (``samplers.ddim`` / ``flow``): the same
        forward, so rho = 1 at theta = theta_old. Before, a float32 ``x`` beside bf16 frozen weights
        (``frozen_weights: autocast``) took another path through the toy UNet (its class embedding is cast to
        the input's dtype): |log rho| 2e-3 and 92% of the first micro-batch clipped before any update."""
        x = x.to(self.adapter.dtype)
        if self.cfg.cfg_detach_uncond:
            return guided_detached_uncond(self.adapter, x, t, cond, self.null.repeat(n), self.cfg.cfg)
        return self.adapter.predict(x, t, cond, self.null.repeat(n), self.cfg.cfg)

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
        self.optimizer_steps += 1  # also when the fp16 scaler skipped the step, as accelerate's sync count does
        return float(gn), g1

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

    def _autocast_dtype(self) -> torch.dtype | None:
        """The dtype ``mixed_precision`` autocasts to on this device, or None where it does not (``no``;
        fp16 on a CPU)."""
        mp = self.cfg.mixed_precision
        if mp == "no" or (self.device.type != "cuda" and mp != "bf16"):
            return None
        return torch.float16 if mp == "fp16" else torch.bfloat16

    def _store_frozen_weights(self) -> None:
        """``frozen_weights: autocast``: the denoiser's frozen parameters stored in the autocast dtype once
        (ddpo-pytorch's ``inference_dtype``), the trainable LoRA weights left float32. Every call of the
        denoiser runs under :meth:`_autocast`, which casts its inputs to the same dtype."""
        dtype = self._autocast_dtype()
        if self.cfg.frozen_weights != "autocast" or dtype is None:
            return
        for p in self.adapter.denoiser.parameters():
            if not p.requires_grad and p.is_floating_point():
                p.data = p.data.to(dtype)

    def _autocast(self):
        """``mixed_precision`` as autocast: fp16 / bf16 on CUDA, bf16 on CPU too (so CI runs this path);
        fp16 on CPU is ignored (CPU autocast covers few fp16 kernels), as is ``no``."""
        dtype = self._autocast_dtype()
        return nullcontext() if dtype is None else torch.autocast(self.device.type, dtype=dtype)

    def _init_from(self) -> dict[str, Any]:
        """Load ``init_from``'s weights into the fresh model (LoRA into the adapter, or the full denoiser);
        returns the record written to :data:`pcpo_eval.rundir.INIT_FILE`. The reference policy stays the base model."""
        cfg = self.cfg
        src = ck.init_source(cfg.init_from)
        ck.check_init_compatible(src, cfg.model, cfg.lora_rank, cfg.lora_alpha)
        ck.load_init_weights(self.adapter.denoiser, src)
        return {**src, "reference_policy": INIT_REFERENCE}
