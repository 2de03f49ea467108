"""Pretraining and checking the toy flow model.

Pretraining (:func:`train_flow`) is conditional flow matching,
``E || u_theta(x_t, t, c) - (noise - x_0) ||^2`` with t ~ U(0, 1) (SD3 uses logit-normal t; uniform
suffices at this scale), prompt dropout ``p_uncond`` for CFG, AdamW with warm-up + cosine decay
and EMA weights — the toy diffusion recipe (:mod:`pcpo_eval.toy.pretrain`) with the velocity
loss. Weights: ``pcpo_eval/toy/weights/flow/`` in the toy layout (``unet/``, ``text_encoder*``,
``scheduler_config.json``, ``meta.json``).
"""


from __future__ import annotations

import copy
import math
import time
from dataclasses import asdict
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from pcpo_eval.models.toy_flow import WEIGHTS_DIR, flow_scheduler_config, load_toy_flow
from pcpo_eval.toy import data as toy_data
from pcpo_eval.toy import model as toy_model
from pcpo_eval.toy.text import ToyTokenizer
from pcpo_eval.toylab.pretrain import DiffusionTrainConfig, step_with_ema


def flow_matching_loss(unet: torch.nn.Module, hidden: torch.Tensor, pooled: torch.Tensor, x0: torch.Tensor,
                       t: torch.Tensor, noise: torch.Tensor, parameterization: str = "velocity",
                       gamma: float = 5.0) -> torch.Tensor:
    """Rectified-flow loss for ``x_t = (1-t) x0 + t noise``.

    ``velocity``: ``|| u_theta(x_t, t, c) - (noise - x0) ||^2`` (mean). ``sample``: the network
    predicts x0; since ``u - u_hat = (x0_hat - x0) / t`` the velocity loss is the x0 loss times
    ``1 / t^2``, capped at ``gamma`` (Min-SNR, Hang et al. 2023) so near-clean steps do not dominate.
    """
    tt = t.view(-1, 1, 1, 1)
    x_t = (1 - tt) * x0 + tt * noise
    pred = unet(x_t, 1000.0 * t, encoder_hidden_states=hidden, class_labels=pooled).sample
    if parameterization == "velocity":
        return F.mse_loss(pred, noise - x0)
    w = (1.0 / t.square().clamp_min(1e-8)).clamp(max=gamma)
    return (w * (pred - x0).square().mean(dim=(1, 2, 3))).mean()


def _lr_at(step: int, total: int, warmup: int, base: float) -> float:
    """Linear warm-up then cosine decay (the toy diffusion schedule)."""
    if step < warmup:
        return base * (step + 1) / warmup
    return base * 0.5 * (1 + math.cos(math.pi * (step - warmup) / max(1, total - warmup)))


def train_flow(cfg: DiffusionTrainConfig = DiffusionTrainConfig(), log=print) -> tuple[Any, Any, dict[str, Any]]:
    """Train UNet + text encoder from scratch for velocity; returns (ema_unet, ema_text_encoder, stats)."""
    gen = torch.Generator().manual_seed(cfg.seed)
    unet = toy_model.build_unet(seed=cfg.seed, widths=cfg.widths, patch=cfg.patch).train()
    enc = toy_model.build_text_encoder(seed=cfg.seed + 1).train()
    ema_unet, ema_enc = copy.deepcopy(unet).eval().requires_grad_(False), copy.deepcopy(enc).eval().requires_grad_(False)
    images, labels = toy_data.dataset(cfg.n_per_prompt)
    latents = toy_model.images_to_latents(images, cfg.patch)
    tok = ToyTokenizer(enc.config.max_length)
    ids_all, null_ids = tok(list(toy_data.TOY_PROMPTS)), tok([""])[0]
    params = list(unet.parameters()) + list(enc.parameters())
    opt = torch.optim.AdamW(params, lr=cfg.lr, weight_decay=cfg.weight_decay)
    ema_pairs = list(zip(list(ema_unet.parameters()) + list(ema_enc.parameters()), params, strict=True))
    param = "sample" if cfg.prediction_type == "sample" else "velocity"
    t0, losses = time.perf_counter(), []
    for step in range(cfg.steps):
        for g in opt.param_groups:
            g["lr"] = _lr_at(step, cfg.steps, cfg.warmup, cfg.lr)
        idx = torch.randint(0, len(latents), (cfg.batch_size,), generator=gen)
        ids = ids_all[labels[idx]].clone()
        ids[torch.rand(cfg.batch_size, generator=gen) < cfg.p_uncond] = null_ids
        t = torch.rand(cfg.batch_size, generator=gen)
        noise = torch.randn(latents[idx].shape, generator=gen)
        hidden, pooled = enc(ids)
        loss = flow_matching_loss(unet, hidden, pooled, latents[idx], t, noise, param, cfg.min_snr_gamma)
        step_with_ema(loss, opt, params, ema_pairs, step, cfg.grad_clip, cfg.ema_decay)
        losses.append(loss.item())
        if step % 100 == 0 or step == cfg.steps - 1:
            log(f"flow step {step} loss {sum(losses[-100:]) / len(losses[-100:]):.4f} ({time.perf_counter() - t0:.0f}s)")
    stats = {"flow_wall_time_s": time.perf_counter() - t0, "final_loss": sum(losses[-100:]) / len(losses[-100:]),
             "flow_config": asdict(cfg), "parameterization": param, "torch": torch.__version__, "threads": torch.get_num_threads()}
    return ema_unet, ema_enc, stats


def pretrain_flow(out: str | Path | None = None, cfg: DiffusionTrainConfig = DiffusionTrainConfig(),
                  log=print) -> dict[str, Any]:
    """Train and write the toy flow weights into ``out`` (default: the shipped ``weights/flow``)."""
    from pcpo_eval.io import atomic_write_json, check_own_folder

    out = Path(out) if out is not None else WEIGHTS_DIR
    check_own_folder(out, toy_model.WEIGHTS_ENTRIES, "toy model weights")  # not among a run's or a user's files
    unet, enc, stats = train_flow(cfg, log)
    toy_model.save_diffusion(out, unet, enc, stats)  # writes the DDIM scheduler config ...
    atomic_write_json(out / "scheduler_config.json", flow_scheduler_config())  # ... replaced by the flow one
    return stats


@torch.no_grad()
def check_flow(weights_dir: str | Path | None = None, n_seeds: int = 4, steps: int = 10, eta: float = 0.0,
               cfg: float = 3.0, batch_size: int = 45) -> dict[str, Any]:
    """Sample ``n_seeds`` images of every toy prompt; toy-classifier accuracy and sampling time."""
    from pcpo_eval.samplers.flow import sample_flow
    from pcpo_eval.toy.classifier import load_toy_classifier

    ad = load_toy_flow(weights_dir=weights_dir)
    clf = load_toy_classifier()
    prompts = [p for p in toy_data.TOY_PROMPTS for _ in range(n_seeds)]
    labels = torch.tensor([i for i in range(len(toy_data.TOY_PROMPTS)) for _ in range(n_seeds)])
    preds, t0 = [], time.perf_counter()
    for b in range(0, len(prompts), batch_size):
        bp = prompts[b:b + batch_size]
        gens = [torch.Generator().manual_seed(b + j) for j in range(len(bp))]
        s = sample_flow(ad, ad.encode_prompts(bp), ad.encode_prompts([""] * len(bp)), cfg=cfg, steps=steps, eta=eta,
                        generators=gens, sde="dance")
        preds.append(clf(ad.decode(s.latents))["logits"].argmax(1))
    elapsed = time.perf_counter() - t0
    acc = float((torch.cat(preds) == labels).float().mean())
    return {"images": len(prompts), "steps": steps, "eta": eta, "cfg": cfg, "accuracy": acc,
            "sampling_time_s": elapsed, "seconds_per_image": elapsed / len(prompts)}
