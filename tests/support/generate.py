"""A small stand-in ModelAdapter for the generator tests (no weights, built from a config).

A pixel-space tiny diffusers ``UNet2DConditionModel`` (3 x 8 x 8) with a hashed-word text
encoder. It is deliberately batch-shape sensitive on CPU like real models (batch 1 and batch 16
give ~1e-6 different outputs), so the generator's fixed micro-batching is actually exercised.
"""

from __future__ import annotations

import hashlib

import torch
from torch import nn

from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

SCHEDULER_CONFIG = {
    "num_train_timesteps": 1000,
    "beta_start": 0.00085,
    "beta_end": 0.012,
    "beta_schedule": "scaled_linear",
    "clip_sample": False,
    "set_alpha_to_one": False,
    "steps_offset": 1,
    "timestep_spacing": "leading",
    "prediction_type": "epsilon",
}


class _TextEncoder(nn.Module):
    def __init__(self, vocab: int = 97, dim: int = 32, length: int = 6) -> None:
        super().__init__()
        self.vocab, self.length = vocab, length
        self.emb = nn.Embedding(vocab, dim)
        self.proj = nn.Linear(dim, dim)

    def ids(self, prompts: list[str]) -> torch.Tensor:
        rows = []
        for p in prompts:
            words = p.lower().split()[: self.length]
            toks = [int(hashlib.md5(w.encode()).hexdigest(), 16) % (self.vocab - 1) + 1 for w in words]
            rows.append(toks + [0] * (self.length - len(toks)))
        return torch.tensor(rows, dtype=torch.long)

    def forward(self, prompts: list[str]) -> torch.Tensor:
        return self.proj(self.emb(self.ids(prompts)))


class StandInAdapter(ModelAdapter):
    """eps-prediction pixel-space model with random (seeded) weights."""

    def __init__(self, weight_seed: int = 0, name: str = "standin") -> None:
        from diffusers import UNet2DConditionModel

        # diffusers initializes weights from the global RNG: fork it so tests leave it untouched.
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(weight_seed)
            self.denoiser = UNet2DConditionModel(
                sample_size=8, in_channels=3, out_channels=3, layers_per_block=1,
                block_out_channels=(8, 16), down_block_types=("CrossAttnDownBlock2D", "DownBlock2D"),
                up_block_types=("UpBlock2D", "CrossAttnUpBlock2D"), cross_attention_dim=32,
                norm_num_groups=4, attention_head_dim=4,
            ).eval()  # fmt: skip
            self.text = _TextEncoder().eval()
        self.name = name
        self.prediction = "eps"
        self.scheduler_config = dict(SCHEDULER_CONFIG)
        self.latent_shape = (3, 8, 8)
        self.lora_target_modules = ["to_q", "to_k", "to_v", "to_out.0"]

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        hidden = self.text(list(prompts))
        return PromptEmbeds(hidden, hidden.mean(1))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        return self.denoiser(x_t, t, cond.hidden).sample

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return ((latents.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
