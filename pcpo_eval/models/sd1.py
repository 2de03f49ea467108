"""Adapter for Stable Diffusion 1.x (diffusers ``StableDiffusionPipeline``), local files only.

Components: the UNet (denoiser, eps prediction), the VAE (decode ``latents / scaling_factor``,
SD's 0.18215), the CLIP text encoder with its tokenizer (padded to ``model_max_length`` = 77, the
last hidden state is the cross-attention condition, as in diffusers' ``encode_prompt`` with
``clip_skip=None``), and a ``DDIMScheduler`` config derived from the pipeline's scheduler config
(DDPO samples SD-1.x with DDIM). CFG is the base class ``predict``. LoRA targets are diffusers'
/ DDPO's attention projections ``to_q, to_k, to_v, to_out.0``.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds


def _hf_cache_dir() -> str:
    from huggingface_hub.constants import HF_HUB_CACHE

    return str(HF_HUB_CACHE)


class SD1Adapter(ModelAdapter):
    """A diffusers SD-1.x pipeline behind :class:`ModelAdapter`."""

    name = "sd1"
    prediction = "eps"
    default_lora_targets = ["to_q", "to_k", "to_v", "to_out.0"]

    def __init__(self, pipe: Any, source: str = "") -> None:
        from diffusers import DDIMScheduler

        self.pipe = pipe
        self.denoiser = pipe.unet
        self.vae = pipe.vae.requires_grad_(False).eval()
        self.text_encoder = pipe.text_encoder.requires_grad_(False).eval()
        self.tokenizer = pipe.tokenizer
        sched = DDIMScheduler.from_config(pipe.scheduler.config)
        self.scheduler_config = {"_class_name": "DDIMScheduler", **dict(sched.config)}
        if self.scheduler_config.get("prediction_type", "epsilon") != "epsilon":
            raise MissingWeightsError(
                f"sd1 model {source!r} predicts {self.scheduler_config['prediction_type']!r}; "
                "only epsilon-prediction SD-1.x checkpoints are supported")
        size = int(self.denoiser.config.sample_size)
        self.latent_shape = (int(self.denoiser.config.in_channels), size, size)
        self.lora_target_modules = list(self.default_lora_targets)
        self.scaling_factor = float(getattr(self.vae.config, "scaling_factor", 0.18215))
        self.source = source

    @classmethod
    def from_pretrained(cls, path_or_id: str, device: str | torch.device = "cpu",
                        dtype: torch.dtype = torch.float32) -> SD1Adapter:
        """Load from a local pipeline directory or the HF cache (``local_files_only=True``)."""
        from diffusers import StableDiffusionPipeline

        is_dir = Path(path_or_id).expanduser().is_dir()
        where = (f"directory {Path(path_or_id).expanduser()}" if is_dir
                 else f"the Hugging Face cache {_hf_cache_dir()} (HF_HOME={os.environ.get('HF_HOME', 'unset')})")
        if not is_dir and (path_or_id.startswith(("/", ".", "~")) or os.sep in path_or_id.strip("/").split("/", 1)[-1]):
            raise MissingWeightsError(f"sd1 weights: directory {path_or_id} does not exist; pass an existing "
                                      "diffusers SD-1.x pipeline directory or a Hugging Face id already in the cache")
        from pcpo_eval.weights.folders import check_pipeline_folder, resolve_pipeline_dir

        local = resolve_pipeline_dir(path_or_id)
        if local is not None:  # name the missing sub-folder (unet/, vae/, ...) instead of diffusers' OSError
            check_pipeline_folder("sd1 weights", local)
        try:
            pipe = StableDiffusionPipeline.from_pretrained(
                str(Path(path_or_id).expanduser()) if is_dir else path_or_id,
                local_files_only=True, dtype=dtype, safety_checker=None, requires_safety_checker=False,
            )
        except (OSError, ValueError, EnvironmentError) as exc:  # noqa: UP024 (diffusers raises both)
            raise MissingWeightsError(
                f"sd1 weights {path_or_id!r} not found in {where} ({type(exc).__name__}); this machine cannot "
                f"download: fetch them elsewhere (`hf download {path_or_id}`) and copy the HF cache or a "
                "save_pretrained directory here, then pass sd1:DIR") from exc
        pipe.set_progress_bar_config(disable=True)
        pipe = pipe.to(device)
        return cls(pipe, source=str(path_or_id))

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        ids = self.tokenizer(list(prompts), padding="max_length", max_length=self.tokenizer.model_max_length,
                             truncation=True, return_tensors="pt").input_ids.to(self.device)
        hidden = self.text_encoder(ids)[0]
        return PromptEmbeds(hidden.to(self.dtype), None)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        if t.ndim == 0:
            t = t.expand(x_t.shape[0])
        return self.denoiser(x_t, t, encoder_hidden_states=cond.hidden).sample

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae_dtype = next(self.vae.parameters()).dtype
        x = self.vae.decode(latents.to(vae_dtype) / self.scaling_factor).sample
        return ((x.float().clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)
