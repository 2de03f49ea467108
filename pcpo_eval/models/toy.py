"""Adapter for the embedded toy text-to-image model (see ``pcpo_eval/toy/model.py``)."""

from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.toy import model as toy_model
from pcpo_eval.toy.text import ToyTextEncoder, ToyTokenizer


class ToyAdapter(ModelAdapter):
    """The toy UNet + text encoder behind :class:`ModelAdapter`.

    ``encode_prompts`` accepts toy prompts ("red circle") and ``""`` (the CFG null prompt); an
    unknown word raises :class:`pcpo_eval.errors.UserError`. The text encoder is frozen (it is not
    part of ``denoiser``), as in DDPO where only the UNet (LoRA) is trained.
    """

    name = "toy"
    prediction = "eps"
    #: LoRA targets: the mid-block attention projections plus every ResNet conv and time/text
    #: projection (the toy UNet has one attention block, so attention-only LoRA would be tiny).
    default_lora_targets = ["to_q", "to_k", "to_v", "to_out.0", "conv1", "conv2", "time_emb_proj"]

    def __init__(self, unet: torch.nn.Module, text_encoder: ToyTextEncoder,
                 scheduler_config: dict[str, Any], source: str = "toy") -> None:
        self.denoiser = unet
        self.text_encoder = text_encoder.requires_grad_(False).eval()
        self.tokenizer = ToyTokenizer(text_encoder.config.max_length)
        # the raw UNet may predict v; the adapter always returns eps (see denoise), so the config
        # it exposes to samplers says epsilon; raw_scheduler_config is the UNet's own.
        self.raw_scheduler_config = dict(scheduler_config)
        self.raw_prediction = scheduler_config.get("prediction_type", "epsilon")
        self.scheduler_config = {**scheduler_config, "prediction_type": "epsilon"}
        from diffusers import DDIMScheduler

        acp = DDIMScheduler.from_config(self.scheduler_config).alphas_cumprod
        self._sqrt_ab, self._sqrt_1mab = acp.sqrt(), (1 - acp).sqrt()
        if self.raw_prediction not in ("epsilon", "v_prediction", "sample"):
            from pcpo_eval.errors import UserError

            raise UserError(f"toy scheduler prediction_type {self.raw_prediction!r} is not supported; "
                            "use epsilon, v_prediction or sample in scheduler_config.json")
        ucfg = unet.config
        self.patch = round((ucfg.in_channels // 3) ** 0.5)
        self.latent_shape = (ucfg.in_channels, ucfg.sample_size, ucfg.sample_size)
        self.lora_target_modules = list(self.default_lora_targets)
        self.source = source

    @classmethod
    def from_dir(cls, weights_dir: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ToyAdapter:
        """Load from a toy weights directory (default: the shipped weights)."""
        wd = Path(weights_dir) if weights_dir is not None else toy_model.WEIGHTS_DIR
        unet = toy_model.load_unet(wd).to(device)
        enc = toy_model.load_text_encoder(wd).to(device)
        if dtype != torch.float32:
            unet, enc = unet.to(dtype=dtype), enc.to(dtype=dtype)
        sched = toy_model.load_json(wd / "scheduler_config.json")
        return cls(unet, enc, sched, source=str(wd))

    @torch.no_grad()
    def check_prompts(self, prompts: list[str]) -> None:
        self.tokenizer(list(prompts))  # an unknown word or a prompt too long: one UserError

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        ids = self.tokenizer(list(prompts)).to(self.device)
        hidden, pooled = self.text_encoder(ids)
        return PromptEmbeds(hidden.to(self.dtype), pooled.to(self.dtype))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        if t.ndim == 0:
            t = t.expand(x_t.shape[0])
        out = self.denoiser(x_t, t, encoder_hidden_states=cond.hidden, class_labels=cond.pooled).sample
        if self.raw_prediction == "epsilon":
            return out
        if self._sqrt_ab.device != out.device:  # the tables live where the model runs: no host sync per call
            self._sqrt_ab, self._sqrt_1mab = self._sqrt_ab.to(out.device), self._sqrt_1mab.to(out.device)
        idx = t.to(out.device).long()
        a = self._sqrt_ab[idx].to(out.dtype).view(-1, 1, 1, 1)
        s = self._sqrt_1mab[idx].to(out.dtype).view(-1, 1, 1, 1)
        if self.raw_prediction == "v_prediction":
            # eps = sqrt(ab_t) v + sqrt(1 - ab_t) x_t  (exact inverse of the v target)
            return a * out + s * x_t.to(out.dtype)
        # "sample" (x0 prediction): eps = (x_t - sqrt(ab_t) x0) / sqrt(1 - ab_t)
        return (x_t.to(out.dtype) - a * out) / s

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return toy_model.latents_to_images(latents)
