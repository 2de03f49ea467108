"""Calibration of the matched-reward balance check on real toy runs (``results.selection.balance``).

Each run's reward-matched checkpoint is its first saved checkpoint whose smoothed training reward
reaches ``select_target``; the study compares the arms' selected rewards per cell
(:func:`pcpo_eval.study.balance.reward_balance`). This script resamples studies from the 40 DDPO
and 40 PCPO seeds of the demo regime (``benchmarks/data/toy_demo_runs.parquet``, the runs
``bench_verdict_calibration.py`` uses), selects checkpoints exactly as the select stage does
(:func:`pcpo_eval.stats.select.match_checkpoint` on the window-5 trailing mean at the demo's
checkpoint epochs, every 2nd), and counts studies flagged ``imbalanced``:

* A/A (both arms DDPO, or both PCPO), unpaired (different seeds, Welch: the protocol of an A/A spec)
  and with paired labels (the paired t on unrelated runs);
* PCPO vs DDPO paired by seed: how often the check fires on the real pair, beside the pool's truth
  (the mean selected reward per arm over all 40 seeds, with its paired t CI).

The check tests both the trailing reward the checkpoints were matched on and the reward's mean over a window
centred on the matched epoch (no lag), one Holm family; a study is flagged when either is.

Usage: ``python benchmarks/bench_balance_calibration.py [--studies 500] [--target 0.8]``.
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path
from types import SimpleNamespace

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pcpo_eval.stats.pairwise import clopper_pearson  # noqa: E402
from pcpo_eval.stats.runlevel import compare_runs  # noqa: E402
from pcpo_eval.stats.select import RunCheckpoint, centred_by_epoch, match_checkpoint  # noqa: E402
from pcpo_eval.stats.speedup import moving_average  # noqa: E402
from pcpo_eval.study.balance import reward_balance  # noqa: E402

POOL = Path(__file__).resolve().parent / "data" / "toy_demo_runs.parquet"
CHECKPOINT_EVERY = 2  # analysis/toy_study.yaml
WINDOW = 5
SP = SimpleNamespace(cells=lambda: ["all"], pcpo="PCPO", baseline="DDPO", select_on="train")


def selected(pool: pd.DataFrame, target: float) -> dict[tuple[str, int], tuple[float, bool, float | None]]:
    """(arm, seed) -> (smoothed reward of its reward-matched checkpoint, reached, the reward's centred mean at
    that epoch: :func:`pcpo_eval.stats.select.centred_by_epoch`, which the balance check also tests)."""
    out = {}
    for (arm, seed), d in pool.groupby(["arm", "seed"]):
        d = d.sort_values("epoch")
        sm = moving_average(d["reward_mean"].to_numpy(), WINDOW)
        centred = centred_by_epoch(d["epoch"].to_numpy(), d["reward_mean"].to_numpy(), WINDOW)
        cks = [RunCheckpoint(f"{arm}-{seed}", int(e), "", float(r), float(r), centred=centred.get(int(e)))
               for e, r in zip(d["epoch"], sm, strict=True) if int(e) % CHECKPOINT_EVERY == 0]
        c = match_checkpoint(cks, target, "log")
        out[(str(arm), int(seed))] = (c.reward, c.reached, next(k.centred for k in cks if k.epoch == c.epoch))
    return out


def _rows(sel: dict, b: list[tuple[str, int]], t: list[tuple[str, int]], paired_labels: bool) -> list[dict]:
    def row(k: tuple[str, int], role: str, label: int) -> dict:
        return {"cell": "all", "role": role, "seed": label, "reward": sel[k][0], "reached": sel[k][1],
                "reward_centred": sel[k][2]}

    tb = [row(k, "baseline", i) for i, k in enumerate(b)]
    tt = [row(k, "pcpo", i if paired_labels else 1000 + i) for i, k in enumerate(t)]
    return tb + tt


def rate(sel: dict, rng: np.random.Generator, scenario: str, n_seeds: int, studies: int) -> tuple[int, int]:
    """Studies flagged imbalanced / studies."""
    hits = 0
    for _ in range(studies):
        if scenario.startswith("A/A"):
            arm = scenario.split()[1]
            seeds = rng.choice(sorted(s for a, s in sel if a == arm), 2 * n_seeds, replace=False)
            b, t = [(arm, int(s)) for s in seeds[:n_seeds]], [(arm, int(s)) for s in seeds[n_seeds:]]
            rows = _rows(sel, b, t, paired_labels="paired" in scenario)
        else:
            seeds = rng.choice(sorted(s for a, s in sel if a == "DDPO"), n_seeds, replace=False)
            rows = _rows(sel, [("DDPO", int(s)) for s in seeds], [("PCPO", int(s)) for s in seeds], True)
        hits += reward_balance(SP, rows)["all"]["imbalanced"]
    return hits, studies


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--studies", type=int, default=500)
    ap.add_argument("--target", type=float, default=0.8)
    ap.add_argument("--seed", type=int, default=20261126)
    a = ap.parse_args()
    t0 = time.perf_counter()
    pool = pd.read_parquet(POOL)
    sel = selected(pool, a.target)
    seeds = sorted(s for arm, s in sel if arm == "DDPO")
    both = [s for s in seeds if sel[("DDPO", s)][1] and sel[("PCPO", s)][1]]
    truth = compare_runs([sel[("DDPO", s)][0] for s in both], [sel[("PCPO", s)][0] for s in both],
                         rng=np.random.default_rng(0), paired=True, n_boot=200)
    reached = {arm: sum(v[1] for (x, _), v in sel.items() if x == arm) for arm in ("DDPO", "PCPO")}
    lines = ["## Matched-reward balance on real toy runs (bench_balance_calibration)", "",
             f"Pool: {POOL.relative_to(POOL.parents[2])} (40 DDPO and 40 PCPO seeds of the demo regime); target "
             f"{a.target:g}, window {WINDOW}, checkpoints every {CHECKPOINT_EVERY} epochs; reached by {reached['DDPO']} "
             f"DDPO and {reached['PCPO']} PCPO runs. Pool truth over the {len(both)} seeds where both reached it: "
             f"selected reward PCPO {truth.treatment_value:.4f} vs DDPO {truth.baseline_value:.4f}, difference "
             f"{truth.estimate:+.4f} (paired 95% CI {truth.ci_low:+.4f} to {truth.ci_high:+.4f}).", "",
             f"{a.studies} resampled studies per row (numpy seed {a.seed}); share flagged imbalanced (p < 0.05) "
             "with 95% Clopper-Pearson intervals.", "",
             "| scenario | seeds/arm | flagged imbalanced |", "|---|---:|---|"]
    rng = np.random.default_rng(a.seed)
    for scenario in ("A/A DDPO unpaired", "A/A DDPO paired labels", "A/A PCPO unpaired", "A/A PCPO paired labels",
                     "PCPO vs DDPO paired by seed"):
        for n in (3, 5, 10):
            hit, tot = rate(sel, rng, scenario, n, a.studies)
            lo, hi = clopper_pearson(hit, tot)
            lines.append(f"| {scenario} | {n} | {hit / tot:.3f} [{lo:.3f}, {hi:.3f}] |")
    lines += ["", f"Command: `python benchmarks/bench_balance_calibration.py --studies {a.studies}` "
              f"({time.perf_counter() - t0:.0f} s)."]
    print("\n".join(lines))


if __name__ == "__main__":
    main()
