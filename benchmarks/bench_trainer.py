"""Trainer: epoch time and peak memory of ``pcpo`` vs ``ppo_clip`` on the toy model, same config.

Measured as ``objective_timing.py`` describes (each objective in its own subprocess, alternating
twice); the figure is the ratio of medians of per-epoch wall time and the ratio of peak RSS.
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from objective_timing import compare  # noqa: E402

CONFIG = dict(model="toy", prompts="toy", reward="jpeg_compressibility", epochs=4, sample_steps=20, cfg=3.0,
              sample_batch_size=16, sample_batches_per_epoch=2, train_batch_size=8, gradient_updates=2,
              learning_rate=3e-4, lora_rank=4, lora_alpha=4.0, checkpoint_every=100)


def main() -> None:
    med, rss, _ = compare(CONFIG)
    n = CONFIG["sample_batch_size"] * CONFIG["sample_batches_per_epoch"]
    print("## Trainer: PCPO vs DDPO (ppo_clip) on the toy model\n")
    print(f"Same config ({n} samples/epoch, {CONFIG['sample_steps']} DDIM steps, LoRA r=4, CFG 3), "
          f"2 runs x {CONFIG['epochs'] - 1} timed epochs each, 2 threads.\n")
    print("| objective | median epoch time (s) | peak RSS (MB) |")
    print("|---|---|---|")
    for k in ("ppo_clip", "pcpo"):
        print(f"| {k} | {med[k]:.2f} | {rss[k]:.0f} |")
    print(f"\nRatio pcpo / ppo_clip: epoch time **{med['pcpo'] / med['ppo_clip']:.3f}**, "
          f"peak memory **{rss['pcpo'] / rss['ppo_clip']:.3f}** (target <= 1.0).")


if __name__ == "__main__":
    main()
