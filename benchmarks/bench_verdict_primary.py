"""The primary endpoint's A/A false-positive rate on real toy runs, with many draws (tight intervals).

``bench_verdict_calibration.py`` runs whole studies (every row, 500 per setting); this script checks
the one number the verdict's per-study guarantee rests on, the primary endpoint (paired gain over the
untrained control, mean of the last 5 epochs), with 20,000 resampled A/A studies per setting through
the shipped :func:`pcpo_eval.stats.runlevel.compare_runs` (paired t when the arms carry the same seed
labels, Welch otherwise). Data: ``benchmarks/data/toy_demo_runs.parquet`` (40 seeds per arm).

Usage: ``.venv/bin/python benchmarks/bench_verdict_primary.py [--draws 20000]``
"""

from __future__ import annotations

import argparse
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import scipy.stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcpo_eval.stats.runlevel import compare_runs  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "toy_demo_runs.parquet"
SEED = 20261126


def gains(runs: pd.DataFrame, arm: str, k: int = 5) -> np.ndarray:
    d = runs[runs["arm"] == arm]
    return np.asarray([float((g["reward_mean"] - g["control_reward_mean"]).to_numpy()[-k:].mean())
                       for _, g in d.sort_values("epoch").groupby("seed")])


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--draws", type=int, default=20_000)
    a = ap.parse_args(argv)
    runs = pd.read_parquet(DATA)
    rng = np.random.default_rng(SEED)
    print("## Verdict calibration: the primary endpoint alone (A/A, many draws)\n")
    print(f"`benchmarks/bench_verdict_primary.py --draws {a.draws}` (numpy seed {SEED}): A/A studies of the paired gain "
          "drawn without replacement from the 40 seeds of one arm, tested by the shipped `compare_runs` at alpha 0.05; "
          "95% Clopper-Pearson intervals.\n")
    print("| pool | seeds/arm | paired t (same seed labels) | Welch (different seeds) |")
    print("|---|---:|---|---|")
    for arm in ("DDPO", "PCPO"):
        g = gains(runs, arm)
        for n in (3, 5, 10):
            hits = {True: 0, False: 0}
            for _ in range(a.draws):
                s = rng.choice(g.size, 2 * n, replace=False)
                for paired in (True, False):
                    c = compare_runs(g[s[:n]], g[s[n:]], n_boot=1, rng=rng, paired=paired)
                    hits[paired] += c.significant

            def ci(k: int) -> str:
                lo = scipy.stats.beta.ppf(0.025, k, a.draws - k + 1) if k else 0.0
                hi = scipy.stats.beta.ppf(0.975, k + 1, a.draws - k)
                return f"{k / a.draws:.4f} [{lo:.4f}, {hi:.4f}]"

            print(f"| {arm} | {n} | {ci(hits[True])} | {ci(hits[False])} |", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
