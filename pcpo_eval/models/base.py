"""The model adapter contract shared by the toy model and real diffusers pipelines.

An adapter wraps a denoiser (``eps`` prediction for DDPM/DDIM models, ``velocity`` for flow
matching) together with its prompt encoder and decoder. Samplers, objectives, the trainer and
the generator see only this interface.

Classifier-free guidance follows the paper's footnote to Prop. 1::

    eps_hat = (1 - w_cfg) * eps(x, t, null) + w_cfg * eps(x, t, c)
            = eps_u + w_cfg * (eps_c - eps_u)

(identical to diffusers' convention), evaluated in one batched call of size 2B.
"""

from __future__ import annotations

import abc
from dataclasses import dataclass
from typing import Any, Literal

import torch
from torch import nn


@dataclass
class PromptEmbeds:
    """Encoded prompts: whatever the denoiser consumes as conditioning.

    ``hidden`` is (B, L, D) token states (used for cross-attention) and ``pooled`` an optional
    (B, D') vector (toy model, SDXL/SD3/FLUX pooled projections). Both are on the model device.
    """

    hidden: torch.Tensor
    pooled: torch.Tensor | None = None

    def __len__(self) -> int:
        return self.hidden.shape[0]

    def index(self, idx: Any) -> PromptEmbeds:
        """Rows ``idx`` (slice, index tensor or list)."""
        return PromptEmbeds(self.hidden[idx], None if self.pooled is None else self.pooled[idx])

    def repeat(self, n: int) -> PromptEmbeds:
        """Repeat every row ``n`` times consecutively (repeat_interleave)."""
        return PromptEmbeds(
            self.hidden.repeat_interleave(n, 0),
            None if self.pooled is None else self.pooled.repeat_interleave(n, 0),
        )

    @staticmethod
    def cat(items: list[PromptEmbeds]) -> PromptEmbeds:
        pooled = None if items[0].pooled is None else torch.cat([i.pooled for i in items])
        return PromptEmbeds(torch.cat([i.hidden for i in items]), pooled)

    def to(self, device: torch.device | str) -> PromptEmbeds:
        return PromptEmbeds(self.hidden.to(device), None if self.pooled is None else self.pooled.to(device))


class ModelAdapter(abc.ABC):
    """A text-to-image denoiser with encoder and decoder, as the samplers and trainer see it.

    Subclasses set the attributes below in ``__init__`` and implement the abstract methods.

    Attributes:
        name: registry name (``toy``, ``sd1``, ...).
        prediction: ``"eps"`` (DDPM/DDIM noise prediction) or ``"velocity"`` (flow matching).
        denoiser: the trainable ``nn.Module`` (UNet or transformer); LoRA attaches here.
        scheduler_config: diffusers scheduler config dict (DDIMScheduler for ``eps`` models,
            FlowMatchEulerDiscreteScheduler for ``velocity`` models).
        latent_shape: (C, H, W) of one latent (pixels for pixel-space models).
        lora_target_modules: module-name patterns peft's ``LoraConfig`` targets by default.
    """

    name: str
    prediction: Literal["eps", "velocity"]
    denoiser: nn.Module
    scheduler_config: dict[str, Any]
    latent_shape: tuple[int, int, int]
    lora_target_modules: list[str]
    #: peft's ``init_lora_weights`` for :meth:`add_lora`: ``"gaussian"`` (ddpo-pytorch's and Flow-GRPO's LoRA start,
    #: B = 0), or the model's reference (DanceGRPO's FLUX: ``True``)
    lora_init: bool | str = "gaussian"

    @property
    def device(self) -> torch.device:
        return next(self.denoiser.parameters()).device

    @property
    def dtype(self) -> torch.dtype:
        return next(self.denoiser.parameters()).dtype

    @abc.abstractmethod
    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        """Encode prompts (the empty string gives the CFG null condition)."""

    def check_prompts(self, prompts: list[str]) -> None:
        """A :class:`~pcpo_eval.errors.UserError` for a prompt this model cannot encode, raised before a set or a
        run writes anything (``generate`` calls it on every prompt first). Default: every prompt encodes (the
        real models' tokenizers truncate); the toy tokenizer refuses an unknown word. Before, that error came
        mid-render, after set.json was marked ``rendering``: a complete set was left unfinished."""
        return None

    @abc.abstractmethod
    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        """Raw model output (eps or velocity) for latents ``x_t`` at timesteps ``t`` (B,)."""

    @abc.abstractmethod
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        """Latents (B, C, h, w) -> images uint8 (B, 3, H, W) (rounded, clamped)."""

    def predict(
        self,
        x_t: torch.Tensor,
        t: torch.Tensor,
        cond: PromptEmbeds,
        uncond: PromptEmbeds | None = None,
        cfg: float = 1.0,
    ) -> torch.Tensor:
        """Guided prediction ``eps_u + cfg * (eps_c - eps_u)`` (one 2B batch); no CFG if cfg == 1."""
        if t.ndim == 0:
            t = t.expand(x_t.shape[0])
        if uncond is None or cfg == 1.0:
            return self.denoise(x_t, t, cond)
        both = self.denoise(torch.cat([x_t, x_t]), torch.cat([t, t]), PromptEmbeds.cat([uncond, cond]))
        out_u, out_c = both.chunk(2)
        return out_u + cfg * (out_c - out_u)

    def trainable_parameters(self) -> list[nn.Parameter]:
        """Parameters with ``requires_grad`` (LoRA weights once LoRA is attached)."""
        return [p for p in self.denoiser.parameters() if p.requires_grad]

    def add_lora(self, rank: int, alpha: float, target_modules: list[str] | None = None) -> None:
        """Attach a peft LoRA adapter to the denoiser and freeze everything else."""
        from peft import LoraConfig

        self.denoiser.requires_grad_(False)
        config = LoraConfig(
            r=rank,
            lora_alpha=alpha,
            init_lora_weights=self.lora_init,
            target_modules=target_modules or self.lora_target_modules,
        )
        self.denoiser.add_adapter(config)
