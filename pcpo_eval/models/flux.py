"""FLUX.1 adapter (diffusers ``FluxPipeline``, ``FluxTransformer2DModel``), as DanceGRPO trains it.

Velocity prediction (``prediction = "velocity"``) on 2x2-packed latent tokens. The adapter keeps
unpacked latents (C, H, W) as its ``latent_shape`` (so samplers, noise and log-probs work on the
same tensors as for every other model) and packs/unpacks around the transformer with the
pipeline's own ``_pack_latents`` / ``_unpack_latents`` / ``_prepare_latent_image_ids``. The
transformer takes the continuous time t in [0, 1] directly (``FluxPipeline`` passes
``timestep / 1000``) and, for guidance-distilled checkpoints (FLUX.1-dev,
``guidance_embeds=True``), the distilled guidance scale (default 3.5, DanceGRPO's value) as an
embedding; real CFG (``cfg`` > 1) is separate and off in DanceGRPO (w_CFG = 1.0).

Prompts go through the pipeline's ``encode_prompt`` (T5 hidden states + CLIP pooled output).
"""

from __future__ import annotations

from typing import Any

import torch

from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.models.sd3 import (
    _to_uint8,
    load_local_pipeline,
    seeded,
    tiny_clip_config,
    tiny_clip_tokenizer,
    tiny_t5,
    tiny_vae,
)

#: DanceGRPO's FLUX LoRA targets (``train_grpo_flux_lora.py``: ``target_modules=["to_k", "to_q", "to_v",
#: "to_out.0"]``, the image-stream projections of the double- and single-stream blocks). The list held Flow-GRPO's
#: SD3 targets too (``add_k/q/v_proj``, ``to_add_out``): 11 LoRA modules instead of 7 on a tiny FLUX, about 40%
#: more LoRA parameters on FLUX.1-dev.
FLUX_LORA_TARGETS: list[str] = ["to_k", "to_q", "to_v", "to_out.0"]
#: DanceGRPO's FLUX LoRA starting weights: peft's default (``init_lora_weights=True``: Kaiming-uniform A, zero B)
FLUX_LORA_INIT: bool | str = True
DEFAULT_FLUX = "black-forest-labs/FLUX.1-dev"


class FluxAdapter(ModelAdapter):
    """A ``FluxPipeline`` as a velocity-prediction :class:`ModelAdapter`."""

    name = "flux"
    prediction = "velocity"

    def __init__(self, pipe: Any, resolution: int | None = None, guidance: float = 3.5,
                 max_sequence_length: int = 512) -> None:
        self.pipe = pipe
        self.denoiser = pipe.transformer
        self.scheduler_config = dict(pipe.scheduler.config)
        self.vae_scale_factor = int(pipe.vae_scale_factor)
        res = int(resolution or pipe.default_sample_size * self.vae_scale_factor)
        # FluxPipeline.prepare_latents: latent side = 2 * (pixels // (vae_scale_factor * 2))
        side = 2 * (res // (self.vae_scale_factor * 2))
        self.latent_shape = (int(self.denoiser.config.in_channels) // 4, side, side)
        self.guidance = float(guidance)
        self.max_sequence_length = int(max_sequence_length)
        self.lora_target_modules = list(FLUX_LORA_TARGETS)
        self.lora_init = FLUX_LORA_INIT

    @classmethod
    def from_pretrained(
        cls, spec: str = DEFAULT_FLUX, device: str | torch.device = "cpu", dtype: torch.dtype = torch.bfloat16,
        resolution: int | None = 720, guidance: float = 3.5,
    ) -> FluxAdapter:
        """Load a local FLUX diffusers pipeline (directory or cached repo id), no download."""
        from diffusers import FluxPipeline

        pipe = load_local_pipeline(FluxPipeline, spec, dtype, "FLUX")
        pipe.to(device)
        for m in (pipe.vae, pipe.text_encoder, pipe.text_encoder_2):
            m.requires_grad_(False)
        return cls(pipe, resolution, guidance)

    @property
    def image_seq_len(self) -> int:
        """Packed image tokens (H/2)(W/2): sets FLUX's dynamic time shift ``mu``."""
        return (self.latent_shape[1] // 2) * (self.latent_shape[2] // 2)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        pe, pooled, _ = self.pipe.encode_prompt(prompt=list(prompts), prompt_2=None, device=self.device,
                                                max_sequence_length=self.max_sequence_length)
        return PromptEmbeds(pe.to(self.dtype), pooled.to(self.dtype))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        """Velocity at continuous times ``t`` in [0, 1]; (B, C, H, W) in and out (packed inside)."""
        from diffusers import FluxPipeline

        B, C, H, W = x_t.shape
        dev, dt = x_t.device, x_t.dtype
        packed = FluxPipeline._pack_latents(x_t, B, C, H, W)
        img_ids = FluxPipeline._prepare_latent_image_ids(B, H // 2, W // 2, dev, dt)
        txt_ids = torch.zeros(cond.hidden.shape[1], 3, device=dev, dtype=dt)
        guidance = None
        if self.denoiser.config.guidance_embeds:
            guidance = torch.full((B,), self.guidance, device=dev, dtype=torch.float32)
        out = self.denoiser(
            hidden_states=packed, timestep=t.to(dev, torch.float32).to(dt), guidance=guidance,
            pooled_projections=cond.pooled, encoder_hidden_states=cond.hidden, txt_ids=txt_ids, img_ids=img_ids,
            return_dict=False,
        )[0]
        return FluxPipeline._unpack_latents(out, H * self.vae_scale_factor, W * self.vae_scale_factor,
                                            self.vae_scale_factor)

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = latents.to(vae.dtype) / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        return _to_uint8(vae.decode(z, return_dict=False)[0])


def tiny_flux_pipeline(seed: int = 0) -> Any:
    """A miniature FLUX pipeline: 1 double + 1 single block, 8x8x4 latents, 16x16 images, guidance embeds."""
    from diffusers import FlowMatchEulerDiscreteScheduler, FluxPipeline, FluxTransformer2DModel
    from transformers import CLIPTextModel

    tok = tiny_clip_tokenizer()
    V = len(tok)
    with seeded(seed):
        te1 = CLIPTextModel(tiny_clip_config(V)).eval()
    te2 = tiny_t5(V, 32, seed + 1)
    with seeded(seed + 2):
        transformer = FluxTransformer2DModel(
            patch_size=1, in_channels=16, num_layers=1, num_single_layers=1, attention_head_dim=16,
            num_attention_heads=2, joint_attention_dim=32, pooled_projection_dim=32, guidance_embeds=True,
            axes_dims_rope=(4, 6, 6),
        )
    sched = FlowMatchEulerDiscreteScheduler(shift=3.0, use_dynamic_shifting=True, base_shift=0.5, max_shift=1.15,
                                            base_image_seq_len=256, max_image_seq_len=4096)
    pipe = FluxPipeline(scheduler=sched, vae=tiny_vae(4, seed + 3), text_encoder=te1, tokenizer=tok,
                        text_encoder_2=te2, tokenizer_2=tok, transformer=transformer)
    for m in (te1, te2, pipe.vae):
        m.requires_grad_(False)
    return pipe


def tiny_flux_adapter(seed: int = 0) -> FluxAdapter:
    """:class:`FluxAdapter` over :func:`tiny_flux_pipeline` (16x16 images)."""
    return FluxAdapter(tiny_flux_pipeline(seed), resolution=16, max_sequence_length=16)
