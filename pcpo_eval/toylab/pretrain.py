"""Pretraining of the toy world from scratch (``pcpo-eval toy pretrain``), reproducible by seed.

Two stages, each a pure function of its config and seed (explicit ``torch.Generator`` for data
order, noise and timesteps; parameter init under a forked, seeded RNG):

1. :func:`train_classifier`: the toy classifier, cross-entropy on procedural images with light
   Gaussian pixel noise (so it stays calibrated on imperfect model samples).
2. :func:`train_diffusion`: UNet + text encoder jointly. Default target x0 ("sample"), loss
   ``min(SNR_t + 1, gamma) || x0 - x0_theta(sqrt(ab_t) x0 + sqrt(1 - ab_t) eps, t, c) ||^2``, which
   is the v-prediction loss (Salimans & Ho 2022; it equals (SNR + 1) times the x0 loss) capped at
   gamma = 5 as in Min-SNR (Hang et al. 2023); ``prediction_type="v_prediction"`` trains the plain
   v loss. DDPM otherwise as in Ho et al. 2020, uniform t, the prompt replaced by ``""`` with
   probability ``p_uncond`` (CFG training, Ho & Salimans 2022); AdamW, linear warm-up + cosine
   decay, EMA weights are saved.

Bit-exact reproduction additionally requires the same torch build and thread count (float
reductions differ across BLAS thread counts); the run records both in ``meta.json``.
"""

from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from pcpo_eval.toy import data as toy_data
from pcpo_eval.toy import model as toy_model
from pcpo_eval.toy.classifier import ClassifierConfig, ToyClassifier, save_classifier
from pcpo_eval.toy.text import ToyTokenizer


@dataclass(frozen=True)
class ClassifierTrainConfig:
    seed: int = 0
    steps: int = 600
    batch_size: int = 64
    lr: float = 3e-3
    n_per_prompt: int = 200  # training images per prompt (indices 0..n-1)
    noise_std_max: float = 0.06  # max std of the Gaussian pixel-noise augmentation (in [-1,1] units)


@dataclass(frozen=True)
class DiffusionTrainConfig:
    seed: int = 0
    steps: int = 4000
    batch_size: int = 64
    lr: float = 2e-3
    warmup: int = 100
    weight_decay: float = 1e-4
    p_uncond: float = 0.1
    ema_decay: float = 0.998
    n_per_prompt: int = 300
    grad_clip: float = 1.0
    prediction_type: str = "sample"  # raw UNet target: "sample" (x0) or "v_prediction"
    min_snr_gamma: float = 5.0  # x0 loss weight min(SNR_t + 1, gamma) ("sample" only)
    widths: tuple[int, ...] = (48, 64)
    patch: int = 4

    def __post_init__(self) -> None:
        if self.prediction_type not in ("sample", "v_prediction"):
            raise ValueError(f"prediction_type must be 'sample' or 'v_prediction', not {self.prediction_type!r}")
        if self.patch not in (1, 2, 4, 8):
            raise ValueError(f"patch must divide 32 (1, 2, 4 or 8), not {self.patch}")


def _lr_at(step: int, total: int, warmup: int, base: float) -> float:
    if step < warmup:
        return base * (step + 1) / warmup
    frac = (step - warmup) / max(1, total - warmup)
    return base * (0.05 + 0.95 * 0.5 * (1 + math.cos(math.pi * frac)))


def train_classifier(cfg: ClassifierTrainConfig, log=print) -> tuple[ToyClassifier, dict[str, Any]]:
    """Train the toy classifier; returns it (eval mode) and stats (held-out accuracy)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(cfg.seed)
        net = ToyClassifier(ClassifierConfig())
    images, labels = toy_data.dataset(cfg.n_per_prompt)
    x_all = images.float() / 127.5 - 1.0
    opt = torch.optim.AdamW(net.parameters(), lr=cfg.lr, weight_decay=1e-4)
    t0 = time.perf_counter()
    net.train()
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg.steps, 50, cfg.lr)
        idx = torch.randint(0, len(x_all), (cfg.batch_size,), generator=gen)
        x = x_all[idx]
        std = torch.rand(cfg.batch_size, 1, 1, 1, generator=gen) * cfg.noise_std_max
        x = x + std * torch.randn(x.shape, generator=gen)
        loss = F.cross_entropy(net.forward_float(x)["logits"], labels[idx])
        opt.zero_grad(set_to_none=True)
        loss.backward()
        opt.step()
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"classifier step {step} loss {loss.item():.4f} ({time.perf_counter() - t0:.0f}s)")
    net.eval().requires_grad_(False)
    test_x, test_y = toy_data.dataset(10, offset=toy_data.EVAL_OFFSET)
    with torch.no_grad():
        acc = (net(test_x)["logits"].argmax(1) == test_y).float().mean().item()
    stats = {"classifier_test_accuracy": acc, "classifier_wall_time_s": time.perf_counter() - t0,
             "classifier_config": asdict(cfg)}
    log(f"classifier held-out accuracy {acc:.4f}")
    return net, stats


def step_with_ema(loss: torch.Tensor, opt: torch.optim.Optimizer, params: list[torch.nn.Parameter],
                  ema_pairs: list[tuple[torch.Tensor, torch.Tensor]], step: int, grad_clip: float,
                  ema_decay: float) -> None:
    """Backward, clip, optimizer step, then EMA update with warm-up decay min(d, (1+s)/(10+s))."""
    opt.zero_grad(set_to_none=True)
    loss.backward()
    torch.nn.utils.clip_grad_norm_(params, grad_clip)
    opt.step()
    decay = min(ema_decay, (1 + step) / (10 + step))
    with torch.no_grad():
        for pe, p in ema_pairs:
            pe.lerp_(p, 1 - decay)


def train_diffusion(cfg: DiffusionTrainConfig, log=print, checkpoint_dir: Path | None = None,
                    checkpoint_every: int = 0):
    """Train UNet + text encoder from scratch; returns (ema_unet, ema_text_encoder, stats)."""
    from diffusers import DDIMScheduler

    gen = torch.Generator().manual_seed(cfg.seed)
    unet = toy_model.build_unet(seed=cfg.seed, widths=cfg.widths, patch=cfg.patch)
    enc = toy_model.build_text_encoder(seed=cfg.seed + 1)
    unet.train()
    enc.train()
    ema_unet, ema_enc = copy.deepcopy(unet).eval(), copy.deepcopy(enc).eval()
    ema_unet.requires_grad_(False)
    ema_enc.requires_grad_(False)
    sched = DDIMScheduler.from_config(toy_model.scheduler_config())
    sqrt_ab = sched.alphas_cumprod.sqrt()
    sqrt_1mab = (1 - sched.alphas_cumprod).sqrt()
    n_train = sched.config.num_train_timesteps

    images, labels = toy_data.dataset(cfg.n_per_prompt)
    latents = toy_model.images_to_latents(images, cfg.patch)
    snr_w = (sched.alphas_cumprod / (1 - sched.alphas_cumprod) + 1).clamp(max=cfg.min_snr_gamma)
    tok = ToyTokenizer(enc.config.max_length)
    ids_all = tok(list(toy_data.TOY_PROMPTS))
    null_ids = tok([""])[0]

    params = list(unet.parameters()) + list(enc.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema_pairs = list(zip(list(ema_unet.parameters()) + list(ema_enc.parameters()), params, strict=True))
    t0 = time.perf_counter()
    losses: list[float] = []
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg.steps, cfg.warmup, cfg.lr)
        idx = torch.randint(0, len(latents), (cfg.batch_size,), generator=gen)
        x0 = latents[idx]
        ids = ids_all[labels[idx]].clone()
        drop = torch.rand(cfg.batch_size, generator=gen) < cfg.p_uncond
        ids[drop] = null_ids
        t = torch.randint(0, n_train, (cfg.batch_size,), generator=gen)
        eps = torch.randn(x0.shape, generator=gen)
        x_t = sqrt_ab[t].view(-1, 1, 1, 1) * x0 + sqrt_1mab[t].view(-1, 1, 1, 1) * eps
        hidden, pooled = enc(ids)
        pred = unet(x_t, t, encoder_hidden_states=hidden, class_labels=pooled).sample
        if cfg.prediction_type == "v_prediction":
            # v target (Salimans & Ho 2022): v = sqrt(ab) eps - sqrt(1 - ab) x0
            v = sqrt_ab[t].view(-1, 1, 1, 1) * eps - sqrt_1mab[t].view(-1, 1, 1, 1) * x0
            loss = F.mse_loss(pred, v)
        else:
            # x0 target, weight min(SNR + 1, gamma): the v loss (= (SNR + 1) x0 loss) capped as in
            # Min-SNR (Hang et al. 2023), so low-noise steps do not dominate
            per = (pred - x0).square().mean(dim=(1, 2, 3))
            loss = (snr_w[t] * per).mean()
        step_with_ema(loss, opt, params, ema_pairs, step, cfg.grad_clip, cfg.ema_decay)
        losses.append(loss.item())
        if step % 50 == 0 or step == cfg.steps - 1:
            recent = sum(losses[-50:]) / len(losses[-50:])
            log(f"diffusion step {step} loss {recent:.4f} ({time.perf_counter() - t0:.0f}s)")
        if checkpoint_dir is not None and checkpoint_every and (step + 1) % checkpoint_every == 0:
            toy_model.save_diffusion(checkpoint_dir / f"step_{step + 1}", ema_unet, ema_enc,
                                     {"step": step + 1, "partial": True}, cfg.prediction_type)
    stats = {"diffusion_wall_time_s": time.perf_counter() - t0, "final_loss": sum(losses[-100:]) / len(losses[-100:]),
             "diffusion_config": asdict(cfg)}
    return ema_unet, ema_enc, stats


def pretrain(out: Path | None = None, diffusion: DiffusionTrainConfig = DiffusionTrainConfig(),
             classifier: ClassifierTrainConfig = ClassifierTrainConfig(), log=print,
             stages: tuple[str, ...] = ("classifier", "diffusion"),
             checkpoint_dir: Path | None = None, checkpoint_every: int = 0) -> dict[str, Any]:
    """Run the pretraining stages and write the weights into ``out`` (default: shipped dir).

    Files are written atomically one by one; the stage that is skipped keeps its files.
    ``checkpoint_dir`` (optional) receives the EMA weights every ``checkpoint_every`` steps.
    """
    from pcpo_eval.io import check_own_folder

    out = Path(out) if out is not None else toy_model.WEIGHTS_DIR
    check_own_folder(out, toy_model.WEIGHTS_ENTRIES, "toy model weights")  # not among a run's or a user's files
    meta: dict[str, Any] = {"torch": torch.__version__, "threads": torch.get_num_threads()}
    if (out / "meta.json").is_file():
        import json

        try:
            meta = {**json.loads((out / "meta.json").read_text()), **meta}
        except json.JSONDecodeError:
            pass
    if "classifier" in stages:
        net, stats = train_classifier(classifier, log)
        save_classifier(out, net)
        meta.update(stats)
    if "diffusion" in stages:
        unet, enc, stats = train_diffusion(diffusion, log, checkpoint_dir, checkpoint_every)
        meta.update(stats)
        meta["parameterization"] = diffusion.prediction_type
        toy_model.save_diffusion(out, unet, enc, meta, diffusion.prediction_type)
    else:
        from pcpo_eval.io import atomic_write_json

        atomic_write_json(out / "meta.json", meta)
    return meta
