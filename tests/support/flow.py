"""A tiny deterministic velocity model for sampler / trainer-math tests (no toy world needed)."""

from __future__ import annotations

import torch
from torch import nn

from pcpo_eval.models.base import ModelAdapter, PromptEmbeds


class _Den(nn.Module):
    def __init__(self, c: int) -> None:
        super().__init__()
        g = torch.Generator().manual_seed(0)
        self.conv = nn.Conv2d(c, c, 1)
        self.emb = nn.Linear(4, c)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(0.3 * torch.randn(p.shape, generator=g))

    def forward(self, x, t, h):
        return self.conv(x) * (1 + t.view(-1, 1, 1, 1)) + self.emb(h).view(x.shape[0], -1, 1, 1)


class LinearVelocityAdapter(ModelAdapter):
    """u(x, t, c) = conv(x) (1 + t) + emb(c): smooth, cheap, prompt-dependent."""

    name = "linear_velocity"
    prediction = "velocity"

    def __init__(self, c: int = 3, hw: int = 4) -> None:
        self.denoiser = _Den(c)
        self.latent_shape = (c, hw, hw)
        self.scheduler_config = {"shift": 3.0, "num_train_timesteps": 1000}
        self.lora_target_modules = ["conv"]

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        h = torch.tensor([[len(p), p.count("a"), p.count("e"), 1.0] for p in prompts]) / 10
        return PromptEmbeds(h[:, None, :], h)

    def denoise(self, x_t, t, cond):
        return self.denoiser(x_t, t.float(), cond.pooled)

    def decode(self, latents):
        return ((latents.clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)
