"""Per-arm table of a finished study's runs (paired gain, final reward, PPO health) + its verdict rows.

Usage: ``python benchmarks/study_table.py STUDY_DIR [--last 5]`` -> markdown on stdout. Reads only
``STUDY_DIR/results.json`` (``runs`` and ``verdict``), so the numbers are the study's own; used for the
toy credit-convention ablation (``pcpo-eval study analysis/toy_credit_ablation.yaml``) in RESULTS.md.
Not a timing benchmark, so ``run_all.py`` skips it (its name does not start with ``bench_``).
"""

from __future__ import annotations

import argparse
import json
from collections import defaultdict
from pathlib import Path

import numpy as np


def main() -> None:
    ap = argparse.ArgumentParser()
    ap.add_argument("study_dir", type=Path)
    ap.add_argument("--last", type=int, default=5, help="epochs averaged for the paired gain")
    args = ap.parse_args()
    res = json.loads((args.study_dir / "results.json").read_text())
    by_run: dict[tuple[str, str], list[dict]] = defaultdict(list)
    for r in res["runs"]:
        by_run[(r["cell"], r["arm"])].append(r)
    print(f"| cell | arm | runs | paired gain (last {args.last} epochs) mean +- SD | gain/SD | final reward mean +- SD |"
          " median approx_kl | mean clipfrac |")
    print("|---|---|---|---|---|---|---|---|")
    for (cell, arm), runs in sorted(by_run.items()):
        gains = np.array([np.mean((np.array(r["reward_mean"]) - np.array(r["control_reward_mean"]))[-args.last:])
                          for r in runs])
        final = np.array([np.mean(r["reward_mean"][-args.last:]) for r in runs])
        kl = [r["ppo_health"]["median_approx_kl"] for r in runs]
        cf = [r["ppo_health"]["mean_clipfrac"] for r in runs]
        sd = gains.std(ddof=1) if len(gains) > 1 else float("nan")
        print(f"| {cell} | {arm} | {len(runs)} | {gains.mean():+.4f} +- {sd:.4f} | {gains.mean() / sd:.1f} | "
              f"{final.mean():.4f} +- {final.std(ddof=1):.4f} | {max(kl):.2g} | {np.mean(cf):.3f} |")
    print()
    for v in res.get("verdict", []):
        print(f"- [{v['cell']}] {v['sentence']}")


if __name__ == "__main__":
    main()
