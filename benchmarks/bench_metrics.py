"""Benchmark of the metric kernels against the reference paths, printed as a markdown section.

1. Frechet distance at d = 2048, N = 5000 random features per set: our eigenvalue trace
   (``pcpo_eval.metrics.frechet``) vs the ``scipy.linalg.sqrtm(S1 @ S2)`` path of clean-fid /
   dgm-eval (statistics computed once, outside the timings). Target: >= 5x, same value to 1e-6.
2. LPIPS diversity at 64 images per prompt: per-image embeddings + Gram identity vs naive
   ``lpips.LPIPS.forward`` on all 2016 unordered pairs (batched 64 pairs per call). Random AlexNet
   trunk with the wheel's v0.1 linear layers (timing does not depend on the weights). Target: >= 50x,
   same value to 1e-5.

Single-threaded BLAS / torch for both sides of each ratio. Usage:
    .venv/bin/python benchmarks/bench_metrics.py [--lpips-size 128] [--fd-dim 2048] [--fd-n 5000]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import time  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402

from pcpo_eval.metrics.frechet import frechet_distance, frechet_distance_sqrtm, gaussian_stats  # noqa: E402
from pcpo_eval.metrics.lpips_diversity import lpips_diversity, make_lpips_embedder, naive_lpips_diversity  # noqa: E402


def _time(fn, repeat: int = 1) -> tuple[float, object]:
    best, out = float("inf"), None
    for _ in range(repeat):
        t0 = time.perf_counter()
        out = fn()
        best = min(best, time.perf_counter() - t0)
    return best, out


def bench_fd(d: int, n: int) -> dict[str, float]:
    rng = np.random.default_rng(0)
    a = rng.normal(size=(d, d)) / np.sqrt(d)
    x = rng.normal(size=(n, d))
    y = rng.normal(size=(n, d)) @ a + 0.1
    s = (*gaussian_stats(x), *gaussian_stats(y))
    t_ours, v_ours = _time(lambda: frechet_distance(*s), repeat=3)
    t_ref, v_ref = _time(lambda: frechet_distance_sqrtm(*s))
    return {"t_ours": t_ours, "t_ref": t_ref, "v_ours": float(v_ours), "v_ref": float(v_ref)}


def bench_lpips(n: int, size: int) -> dict[str, float]:
    emb = make_lpips_embedder("random", seed=0)
    imgs = torch.randint(
        0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    t_ours, v_ours = _time(lambda: lpips_diversity(emb, imgs, batch=16), repeat=3)
    t_ref, v_ref = _time(lambda: naive_lpips_diversity(emb.model, imgs, batch=64))
    return {"t_ours": t_ours, "t_ref": t_ref, "v_ours": float(v_ours), "v_ref": float(v_ref)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--fd-dim", type=int, default=2048)
    p.add_argument("--fd-n", type=int, default=5000)
    p.add_argument("--lpips-n", type=int, default=64)
    p.add_argument("--lpips-size", type=int, default=128)
    args = p.parse_args()
    torch.set_num_threads(1)
    fd = bench_fd(args.fd_dim, args.fd_n)
    lp = bench_lpips(args.lpips_n, args.lpips_size)
    pairs = args.lpips_n * (args.lpips_n - 1) // 2
    print("## Metric kernels (FD trace-sqrt, LPIPS diversity)\n")
    print(
        f"Measured on this machine, 1 thread (torch {torch.__version__}); best of 3 for ours, 1 run for the reference.\n"
    )
    print("| kernel | setting | reference path | ref time (s) | ours (s) | speed-up | rel. diff |")
    print("|---|---|---|---|---|---|---|")
    print(
        f"| Frechet distance | d={args.fd_dim}, N={args.fd_n} | scipy.linalg.sqrtm(S1 S2) | {fd['t_ref']:.2f} | "
        f"{fd['t_ours']:.2f} | {fd['t_ref'] / fd['t_ours']:.1f}x | {abs(fd['v_ours'] - fd['v_ref']) / abs(fd['v_ref']):.1e} |"
    )
    print(
        f"| LPIPS diversity | {args.lpips_n} images ({pairs} pairs), {args.lpips_size}px, AlexNet v0.1 | naive lpips per pair "
        f"| {lp['t_ref']:.2f} | {lp['t_ours']:.3f} | {lp['t_ref'] / lp['t_ours']:.0f}x | "
        f"{abs(lp['v_ours'] - lp['v_ref']) / abs(lp['v_ref']):.1e} |"
    )
    print(
        f"\nFD value {fd['v_ours']:.6f} (ours) vs {fd['v_ref']:.6f} (sqrtm); LPIPS {lp['v_ours']:.6f} vs {lp['v_ref']:.6f}."
    )


if __name__ == "__main__":
    main()
