"""Toy-world speed budget (issue 3) against a reference 32x32 cross-attention UNet.

Measures, in one run with ``torch.set_num_threads(2)``:

1. one forward+backward of the shipped toy UNet on a batch of 32 (budget <= 0.15 s), and of a
   reference ~1.4M-parameter pixel-space 32x32 ``UNet2DConditionModel`` with cross-attention
   in every block (the kind of model issue 3 measured at ~1.7 s/step at batch 64) -> ratio;
2. sampling 45 prompts x 16 seeds with 20 DDIM steps and CFG through the shared sampler with
   the shipped weights (budget <= 60 s);
3. a matmul GFLOPS probe before and after, to show how contended the CPU was.

Prints a markdown section. Usage: ``.venv/bin/python benchmarks/bench_toy.py [--quick]``.
"""

from __future__ import annotations

import argparse
import os
import time

import torch


def gflops_probe(n: int = 512, reps: int = 20) -> float:
    a, b = torch.randn(n, n), torch.randn(n, n)
    a @ b
    t0 = time.perf_counter()
    for _ in range(reps):
        a @ b
    return reps * 2 * n**3 / (time.perf_counter() - t0) / 1e9


def reference_unet():
    """A 32x32 pixel-space UNet with a (self + cross) attention transformer at every level."""
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    return UNet2DConditionModel(
        sample_size=32, in_channels=3, out_channels=3, block_out_channels=(32, 64, 64), layers_per_block=1,
        down_block_types=("CrossAttnDownBlock2D",) * 3, up_block_types=("CrossAttnUpBlock2D",) * 3,
        norm_num_groups=8, cross_attention_dim=64, attention_head_dim=16)


def time_fwd_bwd(unet, x, t, hidden, pooled, reps: int) -> float:
    kwargs = {"class_labels": pooled} if pooled is not None else {}
    for _ in range(2):
        unet(x, t, encoder_hidden_states=hidden, **kwargs).sample.square().mean().backward()
    times = []
    for _ in range(reps):
        t0 = time.perf_counter()
        unet(x, t, encoder_hidden_states=hidden, **kwargs).sample.square().mean().backward()
        times.append(time.perf_counter() - t0)
    return sorted(times)[len(times) // 2]  # median


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("--quick", action="store_true", help="fewer repetitions, 4 seeds instead of 16")
    ap.add_argument("--threads", type=int, default=2, help="torch threads (issue budget: 2)")
    args = ap.parse_args()
    torch.set_num_threads(args.threads)
    from pcpo_eval.models.registry import load_model
    from pcpo_eval.toylab.check import DEFAULT_CFG, DEFAULT_ETA, DEFAULT_STEPS, sample_toy_images

    g0 = gflops_probe()
    adapter = load_model("toy")
    unet = adapter.denoiser.train()
    gen = torch.Generator().manual_seed(0)
    x = torch.randn(32, *adapter.latent_shape, generator=gen)
    t = torch.randint(0, 1000, (32,), generator=gen)
    emb = adapter.encode_prompts(["red circle"] * 32)
    reps = 3 if args.quick else 7
    toy_fb = time_fwd_bwd(unet, x, t, emb.hidden, emb.pooled, reps)
    unet.eval()
    ref = reference_unet()
    ref_fb = time_fwd_bwd(ref, torch.randn(32, 3, 32, 32, generator=gen), t, emb.hidden, None, max(2, reps // 2))
    n_toy = sum(p.numel() for p in unet.parameters())
    n_ref = sum(p.numel() for p in ref.parameters())
    del ref

    n_seeds = 4 if args.quick else 16
    pids = [p for p in range(45) for _ in range(n_seeds)]
    seeds = [s for _ in range(45) for s in range(n_seeds)]
    t0 = time.perf_counter()
    sample_toy_images(adapter, pids, seeds, steps=DEFAULT_STEPS, eta=DEFAULT_ETA, cfg=DEFAULT_CFG, batch_size=360)
    sample_s = time.perf_counter() - t0
    g1 = gflops_probe()
    load = os.getloadavg()[0]

    print("## Toy world speed (issue 3 budget)\n")
    print(f"torch {torch.__version__}, {args.threads} thread(s); CPU contention: 1-min load average {load:.1f}, "
          f"512^2 matmul probe {g0:.1f} / {g1:.1f} GFLOPS (before / after).\n")
    print("| measurement | toy model | reference | ratio (toy / ref) | budget |")
    print("|---|---|---|---|---|")
    print(f"| fwd+bwd, batch 32 (median s) | {toy_fb:.3f} ({n_toy / 1e6:.2f}M params, 48x8x8 latents) | "
          f"{ref_fb:.3f} ({n_ref / 1e6:.2f}M params, 32x32 pixels, self+cross-attn transformer at every level) | "
          f"{toy_fb / ref_fb:.3f} | <= 0.15 s |")
    scale = 16 / n_seeds
    note = "" if n_seeds == 16 else f" (measured {45 * n_seeds} images, x{scale:.0f} extrapolated)"
    print(f"| sample 45 prompts x 16 seeds, DDIM {DEFAULT_STEPS} steps, eta {DEFAULT_ETA}, CFG {DEFAULT_CFG} (s) | "
          f"{sample_s * scale:.1f}{note} | - | - | <= 60 s |")


if __name__ == "__main__":
    main()
