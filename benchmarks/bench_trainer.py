"""Trainer: epoch time and peak memory of ``pcpo`` vs ``ppo_clip`` on the toy model, same config.

Each objective runs in its own subprocess (peak RSS is per process), alternating twice so
machine noise hits both; the figure is the ratio of medians of per-epoch wall time (first epoch
of each run dropped as warm-up) and the ratio of peak RSS.
"""

from __future__ import annotations

import json
import statistics
import subprocess
import sys
import tempfile

CHILD = r"""
import json, resource, sys, torch
torch.set_num_threads(2)
from pcpo_eval.train_config import config_from_dict
from pcpo_eval.trainer import train
cfg = config_from_dict(json.loads(sys.argv[1]))
log = train(cfg, sys.argv[2])
print(json.dumps({"epoch_s": log["wall_time_s"].tolist()[1:],
                  "peak_rss_mb": resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 1024}))
"""

CONFIG = dict(model="toy", prompts="toy", reward="jpeg_compressibility", epochs=4, sample_steps=20, cfg=3.0,
              sample_batch_size=16, sample_batches_per_epoch=2, train_batch_size=8, gradient_updates=2,
              learning_rate=3e-4, lora_rank=4, lora_alpha=4.0, checkpoint_every=100)


def run(objective: str) -> dict:
    with tempfile.TemporaryDirectory() as d:
        out = subprocess.run([sys.executable, "-c", CHILD, json.dumps({**CONFIG, "objective": objective}), d + "/run"],
                             capture_output=True, text=True, check=True)
    return json.loads(out.stdout.strip().splitlines()[-1])


def main() -> None:
    res: dict[str, list[dict]] = {"ppo_clip": [], "pcpo": []}
    for _ in range(2):
        for obj in ("ppo_clip", "pcpo"):
            res[obj].append(run(obj))
    med = {k: statistics.median([t for r in v for t in r["epoch_s"]]) for k, v in res.items()}
    rss = {k: max(r["peak_rss_mb"] for r in v) for k, v in res.items()}
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
