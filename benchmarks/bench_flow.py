"""Flow models: PCPO vs DanceGRPO epoch time / peak memory on the toy flow model, and zeta vs the paper.

Measured as ``objective_timing.py`` describes (each objective in its own subprocess, alternating
twice); the figure is the ratio of medians of per-epoch wall time and the ratio of peak RSS. Both
use the same DanceGRPO SDE sampler; PCPO only changes the objective (zeta * dt_i reweighting in the
hinge). If the shipped toy flow weights are absent, a randomly initialized toy flow model is timed
(the cost does not depend on the weights).
"""

from __future__ import annotations

import sys
from pathlib import Path

sys.path.insert(0, str(Path(__file__).resolve().parent))
from objective_timing import compare  # noqa: E402

#: run in each training process first: a random-init toy flow model when the shipped weights are absent
PREAMBLE = """
import pcpo_eval.models.registry as registry
from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.models.toy_flow import load_toy_flow
try:
    load_toy_flow()
    extra["weights"] = "shipped"
except MissingWeightsError:
    registry.REGISTRY["toyflow"] = lambda arg, device, dtype: load_toy_flow(device, random_init=True)
    extra["weights"] = "random-init"
"""

CONFIG = dict(model="toyflow", prompts="toy", reward="toy_aesthetic", epochs=4, sample_steps=8, sample_eta=0.3,
              sde="dance", flow_shift=3.0, cfg=3.0, advantage="group", images_per_prompt=4,
              sample_batch_size=12, sample_batches_per_epoch=2, train_batch_size=6, gradient_updates=2,
              timestep_fraction=0.6, train_last_step=False, learning_rate=3e-4, lora_rank=4, lora_alpha=4.0,
              checkpoint_every=100, device="cpu")


def zeta_table() -> list[tuple[str, float, float]]:
    from pcpo_eval.credit.flow import flow_credit

    return [("DanceGRPO SDE, N=16, eta=0.3, shift 3", flow_credit("dance", 16, 0.3, 3.0).zeta, 13.343),
            ("Flow-GRPO SDE, N=10, eta=0.7, shift 3 (t=1: neighbor)", flow_credit("flowgrpo", 10, 0.7, 3.0).zeta, 4.315)]


def main() -> None:
    med, rss, res = compare(CONFIG, preamble=PREAMBLE)
    n = CONFIG["sample_batch_size"] * CONFIG["sample_batches_per_epoch"]
    print("## Flow models: PCPO vs DanceGRPO on the toy flow model\n")
    print(f"Same config ({n} samples/epoch, {CONFIG['sample_steps']} DanceGRPO SDE steps, eta 0.3, shift 3, "
          f"60% of the first 7 steps trained, LoRA r=4, CFG 3), 2 runs x {CONFIG['epochs'] - 1} timed epochs each, "
          f"2 threads, {res['pcpo'][0]['weights']} weights.\n")
    print("| objective | median epoch time (s) | peak RSS (MB) |")
    print("|---|---|---|")
    for k, label in (("ppo_clip", "DanceGRPO (ppo_clip)"), ("pcpo", "PCPO (zeta*dt reweighting)")):
        print(f"| {label} | {med[k]:.2f} | {rss[k]:.0f} |")
    print(f"\nRatio pcpo / DanceGRPO: epoch time **{med['pcpo'] / med['ppo_clip']:.3f}**, "
          f"peak memory **{rss['pcpo'] / rss['ppo_clip']:.3f}**.\n")
    print("| SDE | zeta (ours) | zeta (paper) |")
    print("|---|---|---|")
    for name, ours, paper in zeta_table():
        print(f"| {name} | {ours:.3f} | {paper:.3f} |")


if __name__ == "__main__":
    main()
