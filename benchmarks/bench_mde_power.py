"""Power at the printed "detectable" effect (MDE), on real toy runs: does 80% mean 80%?

Each replicate draws a study from the 40 seeds per arm of ``benchmarks/data/toy_demo_runs.parquet``,
takes the MDE the verdict's function prints for it (:func:`pcpo_eval.stats.runlevel.compare_runs`, the
test of every verdict row and of the sampler offset), then draws a *fresh* study of the same design,
plants exactly that effect into its treatment arm and tests it with the same function. The share found
is the power the printed MDE delivers over the studies that could have printed it -- what a reviewer
replicating the design sees. Beside it, the plug-in MDE (the measured spread taken as the truth,
``stats.power.mde(measured=False)``, what the verdict printed before 2026-11-28) on the same draws.

Quantities (each a per-run scalar, as the verdict computes it): the paired gain over the untrained
control and the final reward (means of the last 5 epochs), the control's mean reward (the sampler
offset). Designs: *paired* = DDPO and PCPO runs of the same seeds (the real pairing; PCPO's pool mean
difference removed so there is no true effect before the plant), *unpaired* = disjoint DDPO seeds.
Test level 0.05; 95% Clopper-Pearson intervals.

Usage: ``.venv/bin/python benchmarks/bench_mde_power.py [--reps 400]``
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

from pcpo_eval.stats.pairwise import clopper_pearson  # noqa: E402
from pcpo_eval.stats.power import mde  # noqa: E402
from pcpo_eval.stats.runlevel import compare_runs  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "toy_demo_runs.parquet"
SEED = 20261128
K = 5  # the verdict's last-epochs window in the toy study
QUANTITIES = ("paired_gain", "final_reward", "control_offset")
DESIGNS = (("paired", 3, 3), ("paired", 5, 5), ("paired", 10, 10), ("unpaired", 3, 3), ("unpaired", 5, 5),
           ("unpaired", 3, 6), ("unpaired", 2, 10))


def scalars(runs: pd.DataFrame, arm: str) -> dict[int, dict[str, float]]:
    """Seed -> each quantity's per-run scalar."""
    out = {}
    for seed, g in runs[runs["arm"] == arm].sort_values("epoch").groupby("seed"):
        r, c = g["reward_mean"].to_numpy(), g["control_reward_mean"].to_numpy()
        out[int(seed)] = {"paired_gain": float((r - c)[-K:].mean()), "final_reward": float(r[-K:].mean()),
                          "control_offset": float(c.mean())}
    return out


def draw(rng: np.random.Generator, design: tuple[str, int, int], ddpo: dict, pcpo: dict, centre: dict, q: str):
    """(baseline, treatment) scalars of one study of ``design`` without a true difference."""
    kind, nb, nt = design
    if kind == "paired":
        s = rng.choice(sorted(set(ddpo) & set(pcpo)), nb, replace=False)
        return np.array([ddpo[x][q] for x in s]), np.array([pcpo[x][q] - centre[q] for x in s])
    s = rng.choice(sorted(ddpo), nb + nt, replace=False)
    return np.array([ddpo[x][q] for x in s[:nb]]), np.array([ddpo[x][q] for x in s[nb:]])


def plug_in(b: np.ndarray, t: np.ndarray, paired: bool) -> float | None:
    if paired:
        return mde(float(np.std(t - b, ddof=1)), b.size, paired=True)
    return mde(float(np.std(b, ddof=1)), b.size, sd_t=float(np.std(t, ddof=1)), n_t=t.size, paired=False)


def ci(k: int, n: int) -> str:
    if n == 0:
        return "–"
    lo, hi = clopper_pearson(k, n)
    return f"{k / n:.3f} [{lo:.3f}, {hi:.3f}]"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=400)
    a = ap.parse_args(argv)
    runs = pd.read_parquet(DATA)
    ddpo, pcpo = scalars(runs, "DDPO"), scalars(runs, "PCPO")
    shared = sorted(set(ddpo) & set(pcpo))
    centre = {q: float(np.mean([pcpo[x][q] - ddpo[x][q] for x in shared])) for q in QUANTITIES}
    print("## Power at the printed MDE on real toy runs\n")
    print(f"`benchmarks/bench_mde_power.py --reps {a.reps}` (numpy seed {SEED}; {len(ddpo)} DDPO and {len(pcpo)} PCPO "
          "seeds): the effect each null study prints as detectable at 80% power, planted into a fresh study of the same "
          "design and tested by the same `compare_runs` at level 0.05. \"printed\": the verdict's MDE (80% power averaged "
          "over the uncertainty of the measured spread); \"plug-in\": the measured spread taken as the truth (before). "
          "95% Clopper-Pearson intervals.\n")
    print("| design | quantity | power at printed MDE | power at plug-in MDE | median printed / plug-in |")
    print("|---|---|---|---|---:|")
    t0 = time.perf_counter()
    for design in DESIGNS:
        kind, nb, nt = design
        paired = kind == "paired"
        for q in QUANTITIES:
            rng = np.random.default_rng([SEED, nb, nt, QUANTITIES.index(q), int(paired)])
            hits, plug_hits, n_m, n_p, ratio = 0, 0, 0, 0, []
            for _ in range(a.reps):
                b, t = draw(rng, design, ddpo, pcpo, centre, q)
                printed = compare_runs(b, t, n_boot=1, rng=rng, paired=paired).mde
                before = plug_in(b, t, paired)
                fb, ft = draw(rng, design, ddpo, pcpo, centre, q)
                for m, count in ((printed, "printed"), (before, "plug")):
                    if m is None:
                        continue
                    found = bool(compare_runs(fb, ft + m, n_boot=1, rng=rng, paired=paired).significant)
                    if count == "printed":
                        hits, n_m = hits + found, n_m + 1
                    else:
                        plug_hits, n_p = plug_hits + found, n_p + 1
                if printed is not None and before:
                    ratio.append(printed / before)
            med = f"{np.median(ratio):.2f}" if ratio else "–"
            label = f"{kind} {nb}" if paired else f"{kind} {nb} vs {nt}"
            print(f"| {label} | {q} | {ci(hits, n_m)} | {ci(plug_hits, n_p)} | {med} |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
