"""Does the reward rise? Toy JPEG-compressibility runs of ppo_clip (DDPO) and pcpo, paired.

Epoch means of a 32-image toy epoch are dominated by *which* prompts and noises were drawn (the
spread between epochs of an untrained model is ~0.02 kB, larger than 10 epochs of progress). The
trainer draws every epoch's prompts and initial noises from keyed generators, so a run with
``learning_rate=1e-12`` (the base model, frozen in effect) sees exactly the same prompts and
noises; the per-epoch difference ``reward(run) - reward(base)`` is the paired gain over the
starting model. Printed: per-epoch gains, the mean gain over epochs 6-10 and how many of epochs
2-10 are above the base (epoch 1 samples from the untouched model in both runs: gain 0).

Usage: ``.venv/bin/python benchmarks/bench_toy_rl.py [--epochs 10] [--lr 3e-3]`` (the toy configs' lr)
"""

from __future__ import annotations

import argparse
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def run(config: str, out: Path, **overrides: object) -> list[float]:
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    cfg = load_config(ROOT / "train" / "configs" / config, [f"{k}={v}" for k, v in overrides.items()])
    log = train(cfg, out)
    return [float(x) for x in log["reward_mean"]]


def main(argv: list[str]) -> int:
    ap = argparse.ArgumentParser()
    ap.add_argument("--epochs", type=int, default=10)
    ap.add_argument("--lr", type=float, default=3e-3)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args(argv)
    torch.set_num_threads(args.threads)
    rows = []
    t0 = time.perf_counter()
    with tempfile.TemporaryDirectory() as tmp:
        for name, config in [("ppo_clip (DDPO)", "toy_ddpo.yaml"), ("pcpo", "toy_pcpo.yaml")]:
            common = dict(epochs=args.epochs, checkpoint_every=1000)
            base = run(config, Path(tmp) / f"{config}_base", learning_rate=1e-12, **common)
            tuned = run(config, Path(tmp) / f"{config}_lr", learning_rate=args.lr, **common)
            gains = [a - b for a, b in zip(tuned, base, strict=True)]
            late = gains[max(1, len(gains) - 5):]
            rows.append((name, base[0], sum(late) / len(late), sum(g > 0 for g in gains[1:]), len(gains) - 1, gains))
    print(f"## Toy RL: JPEG compressibility, paired gain over the base model ({args.epochs} epochs, "
          f"lr {args.lr:g}, {time.perf_counter() - t0:.0f} s total)\n")
    print("| objective | epoch-1 reward | mean gain, last 5 epochs | epochs above base | per-epoch gain |")
    print("|---|---|---|---|---|")
    for name, start, late, above, n, gains in rows:
        print(f"| {name} | {start:.4f} | {late:+.4f} | {above}/{n} | {' '.join(f'{g:+.3f}' for g in gains)} |")
    print("\nReward: minus the JPEG (quality 95) size in kB; gain = run minus a learning_rate=1e-12 run with "
          "the same prompts and noises (toy configs otherwise unchanged: 32 images/epoch, LoRA r4).")
    return 0


if __name__ == "__main__":
    sys.exit(main(sys.argv[1:]))
