"""Toy flow-matching model: a small pixel-space velocity network for CPU DanceGRPO-vs-PCPO studies.

The toy world's images (3 x 32 x 32 RGB, prompts ``"<color> <shape>"``) are modelled directly in
pixel space, x in [-1, 1], with the rectified-flow convention of :mod:`pcpo_eval.samplers.flow`:
``x_t = (1 - t) x_0 + t noise`` and the network predicts ``u = noise - x_0``.

Architecture (``ToyFlowNet``, ~0.1 M parameters): a two-level conv U-Net (32 -> 16 px, 16/32 channels) whose
residual blocks are FiLM-modulated by ``MLP(time embedding) + MLP(pooled prompt)``. Prompts are
encoded by a bag of hashed word embeddings (``ToyWordEncoder``; the empty prompt is the CFG null
condition, trained with 10% prompt dropout). Pretraining (:func:`pretrain_toy_flow`) is plain
conditional flow matching, ``E ||u_theta(x_t, t, c) - (noise - x_0)||^2`` with t ~ U(0, 1), on
batches from a data function ``(generator, n) -> (uint8 images, prompts)``.

Weights ship in ``pcpo_eval/toy/weights/flow/toy_flow.safetensors`` with ``toy_flow.json``
(architecture + training record); ``load_toy_flow`` reads them, ``random_init=True`` skips them.
"""

from __future__ import annotations

import hashlib
import json
import math
import time
from collections.abc import Callable
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from diffusers import ConfigMixin, ModelMixin
from diffusers.configuration_utils import register_to_config
from diffusers.loaders import PeftAdapterMixin
from torch import nn
from torch.nn import functional as F

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

WEIGHTS_DIR = Path(__file__).parent / "weights" / "flow"
WEIGHTS_FILE = "toy_flow.safetensors"
META_FILE = "toy_flow.json"
#: toy flow scheduler: static shift 1 (32 px images; DanceGRPO's ``flow_shift`` applies on top when chosen)
TOY_FLOW_SCHEDULER: dict[str, Any] = {"num_train_timesteps": 1000, "shift": 1.0, "use_dynamic_shifting": False}


@dataclass(frozen=True)
class ToyFlowConfig:
    """Architecture of :class:`ToyFlowNet` (saved next to the weights)."""

    image_size: int = 32
    channels: int = 16
    embed_dim: int = 64
    vocab_buckets: int = 256
    max_words: int = 4


def _word_bucket(word: str, buckets: int) -> int:
    """Stable hash of a lower-cased word into [1, buckets) (0 is padding / empty prompt)."""
    h = int.from_bytes(hashlib.sha256(word.lower().encode()).digest()[:4], "little")
    return 1 + h % (buckets - 1)


class ToyWordEncoder(nn.Module):
    """Bag of hashed word embeddings: hidden (B, L, D) token states and pooled (B, D) mean."""

    def __init__(self, cfg: ToyFlowConfig) -> None:
        super().__init__()
        self.cfg = cfg
        self.embed = nn.Embedding(cfg.vocab_buckets, cfg.embed_dim, padding_idx=0)

    def tokenize(self, prompts: list[str]) -> torch.Tensor:
        ids = torch.zeros(len(prompts), self.cfg.max_words, dtype=torch.long)
        for i, p in enumerate(prompts):
            for j, w in enumerate(p.split()[: self.cfg.max_words]):
                ids[i, j] = _word_bucket(w, self.cfg.vocab_buckets)
        return ids

    def forward(self, ids: torch.Tensor) -> PromptEmbeds:
        h = self.embed(ids)
        n = (ids > 0).sum(1, keepdim=True).clamp(min=1)
        return PromptEmbeds(h, h.sum(1) / n)


def time_embedding(t: torch.Tensor, dim: int) -> torch.Tensor:
    """Sinusoidal embedding of the continuous time t in [0, 1] (scaled by 1000, as DDPM/SD3)."""
    half = dim // 2
    freqs = torch.exp(-math.log(10000.0) * torch.arange(half, device=t.device, dtype=torch.float32) / half)
    a = 1000.0 * t.float()[:, None] * freqs[None]
    return torch.cat([a.sin(), a.cos()], dim=1)


class _ResBlock(nn.Module):
    def __init__(self, ch: int, emb: int) -> None:
        super().__init__()
        self.n1, self.c1 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.n2, self.c2 = nn.GroupNorm(8, ch), nn.Conv2d(ch, ch, 3, padding=1)
        self.film = nn.Linear(emb, 2 * ch)

    def forward(self, x: torch.Tensor, e: torch.Tensor) -> torch.Tensor:
        scale, shift = self.film(e)[:, :, None, None].chunk(2, dim=1)
        h = self.c1(F.silu(self.n1(x)))
        h = self.n2(h) * (1 + scale) + shift
        return x + self.c2(F.silu(h))


class ToyFlowNet(nn.Module):
    """Velocity network u_theta(x_t, t, c) on 3 x 32 x 32 pixels (see module docstring)."""

    def __init__(self, cfg: ToyFlowConfig = ToyFlowConfig()) -> None:
        super().__init__()
        c, e = cfg.channels, cfg.embed_dim
        self.cfg = cfg
        self.time_mlp = nn.Sequential(nn.Linear(e, e), nn.SiLU(), nn.Linear(e, e))
        self.text_mlp = nn.Sequential(nn.Linear(e, e), nn.SiLU(), nn.Linear(e, e))
        self.conv_in = nn.Conv2d(3, c, 3, padding=1)
        self.block1 = _ResBlock(c, e)
        self.down = nn.Conv2d(c, 2 * c, 3, stride=2, padding=1)
        self.mid1 = _ResBlock(2 * c, e)
        self.mid2 = _ResBlock(2 * c, e)
        self.up = nn.Conv2d(2 * c, c, 3, padding=1)
        self.merge = nn.Conv2d(2 * c, c, 1)
        self.block2 = _ResBlock(c, e)
        self.conv_out = nn.Sequential(nn.GroupNorm(8, c), nn.SiLU(), nn.Conv2d(c, 3, 3, padding=1))

    def forward(self, x: torch.Tensor, t: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        e = self.time_mlp(time_embedding(t, self.cfg.embed_dim)) + self.text_mlp(pooled)
        h0 = self.block1(self.conv_in(x), e)
        h = self.mid2(self.mid1(self.down(h0), e), e)
        h = self.up(F.interpolate(h, scale_factor=2.0, mode="nearest"))
        h = self.block2(self.merge(torch.cat([h, h0], dim=1)), e)
        return self.conv_out(h)


class ToyFlowModel(ModelMixin, ConfigMixin, PeftAdapterMixin):
    """The denoiser of the adapter: velocity net + word encoder.

    A diffusers ``ModelMixin`` so peft LoRA attaches, disables (KL reference) and saves exactly as
    for the SD3/FLUX transformers (``add_adapter`` / ``disable_adapters`` / ``load_lora_adapter``).
    """

    @register_to_config
    def __init__(self, image_size: int = 32, channels: int = 16, embed_dim: int = 64, vocab_buckets: int = 256,
                 max_words: int = 4) -> None:
        super().__init__()
        cfg = ToyFlowConfig(image_size, channels, embed_dim, vocab_buckets, max_words)
        self.net = ToyFlowNet(cfg)
        self.text = ToyWordEncoder(cfg)

    def forward(self, x: torch.Tensor, t: torch.Tensor, pooled: torch.Tensor) -> torch.Tensor:
        return self.net(x, t, pooled)


def images_to_x(images: torch.Tensor) -> torch.Tensor:
    """uint8 (B, 3, H, W) -> float in [-1, 1]."""
    return images.float() / 127.5 - 1.0


def x_to_images(x: torch.Tensor) -> torch.Tensor:
    """[-1, 1] -> uint8 (round, clamp)."""
    return ((x.float().clamp(-1, 1) + 1) * 127.5).round().to(torch.uint8)


class ToyFlowAdapter(ModelAdapter):
    """:class:`ModelAdapter` of the toy flow model (``prediction = "velocity"``, pixel space)."""

    name = "toyflow"
    prediction = "velocity"

    def __init__(self, model: ToyFlowModel) -> None:
        self.model = model
        self.denoiser = model
        s = model.net.cfg.image_size
        self.latent_shape = (3, s, s)
        self.scheduler_config = dict(TOY_FLOW_SCHEDULER)
        self.lora_target_modules = ["c1", "c2", "film", "down", "up", "merge"]

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        with torch.no_grad():
            return self.model.text(self.model.text.tokenize(list(prompts)).to(self.device))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        return self.model(x_t, t.to(x_t.device, torch.float32), cond.pooled)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return x_to_images(latents)



def load_toy_flow(device: str | torch.device = "cpu", weights_dir: str | Path | None = None,
                  random_init: bool = False, seed: int = 0, **config: Any) -> ToyFlowAdapter:
    """The pretrained toy flow model (``random_init=True``: fresh weights from ``seed`` and ``config``
    overrides of :class:`ToyFlowConfig`, e.g. ``image_size=16`` for fast tests)."""
    d = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
    if random_init:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            model = ToyFlowModel(**config)
    else:
        if not (d / WEIGHTS_FILE).is_file() or not (d / META_FILE).is_file():
            raise MissingWeightsError(
                f"toy flow weights not found in {d}; create them with `pcpo-eval toy-flow pretrain`"
            )
        from safetensors.torch import load_file

        meta = json.loads((d / META_FILE).read_text())
        model = ToyFlowModel(**meta["config"])
        model.load_state_dict(load_file(str(d / WEIGHTS_FILE)))
    return ToyFlowAdapter(model.eval().to(device))


# --------------------------------------------------------------------------------------------
# pretraining (conditional flow matching)
# --------------------------------------------------------------------------------------------

DataFn = Callable[[torch.Generator, int], tuple[torch.Tensor, list[str]]]


def flow_matching_loss(model: ToyFlowModel, images: torch.Tensor, prompts: list[str], g: torch.Generator,
                       p_uncond: float = 0.1) -> torch.Tensor:
    """Rectified-flow loss ||u_theta(x_t, t, c) - (noise - x_0)||^2, t ~ U(0,1), prompt dropout p_uncond."""
    x0 = images_to_x(images)
    B = x0.shape[0]
    noise = torch.randn(x0.shape, generator=g)
    t = torch.rand(B, generator=g)
    drop = torch.rand(B, generator=g) < p_uncond
    prompts = ["" if d else p for p, d in zip(prompts, drop.tolist(), strict=True)]
    tt = t[:, None, None, None]
    x_t = (1 - tt) * x0 + tt * noise
    cond = model.text(model.text.tokenize(prompts))
    return F.mse_loss(model(x_t, t, cond.pooled), noise - x0)


def pretrain_toy_flow(data: DataFn, out_dir: str | Path | None = None, steps: int = 3000, batch_size: int = 64,
                      lr: float = 2e-3, seed: int = 0, log_every: int = 250) -> dict[str, Any]:
    """Train :class:`ToyFlowModel` from scratch and save weights + record atomically; returns the record."""
    from safetensors.torch import save_file

    from pcpo_eval.io import atomic_write_text

    g = torch.Generator().manual_seed(seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        model = ToyFlowModel()
    opt = torch.optim.AdamW(model.parameters(), lr=lr, weight_decay=0.0)
    sched = torch.optim.lr_scheduler.OneCycleLR(opt, max_lr=lr, total_steps=steps, pct_start=0.05)
    t0, losses = time.perf_counter(), []
    for step in range(1, steps + 1):
        images, prompts = data(g, batch_size)
        loss = flow_matching_loss(model, images, prompts, g)
        opt.zero_grad(set_to_none=True)
        loss.backward()
        torch.nn.utils.clip_grad_norm_(model.parameters(), 1.0)
        opt.step()
        sched.step()
        losses.append(float(loss))
        if log_every and step % log_every == 0:
            print(f"step {step:6d}  loss {sum(losses[-log_every:]) / log_every:.4f}", flush=True)
    record = {"config": asdict(model.net.cfg), "steps": steps, "batch_size": batch_size, "lr": lr, "seed": seed,
              "final_loss": sum(losses[-100:]) / min(len(losses), 100), "train_seconds": time.perf_counter() - t0,
              "params": sum(p.numel() for p in model.parameters())}
    if out_dir is not None:
        d = Path(out_dir)
        d.mkdir(parents=True, exist_ok=True)
        tmp = d / f".{WEIGHTS_FILE}.tmp"
        save_file({k: v.contiguous() for k, v in model.state_dict().items()}, str(tmp))
        tmp.replace(d / WEIGHTS_FILE)
        atomic_write_text(d / META_FILE, json.dumps(record, indent=2) + "\n")
    return record
