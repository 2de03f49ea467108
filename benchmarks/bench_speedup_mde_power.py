"""Power at the printed "detectable" speed-up, on real toy runs: does a speed-up row's 80% mean 80%?

Each replicate draws a study of two arms from the 40 DDPO seeds of ``benchmarks/data/toy_demo_runs.parquet``
(disjoint seeds, so the arms differ only by chance), runs the verdict's own code on it
(:func:`pcpo_eval.stats.verdict.verdict_rows` with the demo's window and ``k``, one gain target named as
the primary endpoint, so its row is tested alone at 0.05: first crossings, midpoint crossings and the
learning bound, as a study runs it) and reads the speed-up it prints as detectable at 80% power. When that
is a number, a *fresh* study of the same design gets exactly that speed-up planted into its treatment arm
and is tested the same way. Planting: each treatment run's gain over its untrained control is replayed
``1 + s`` times faster (``gain(e (1 + s))``, linear between epochs, the last epoch's gain beyond the end),
which is not yet the speed-up the row estimates: the trailing smoothing window lags and no run can reach
a target before its first full-window epoch, so replaying 77% faster gives a restricted-mean speed-up
of only +33% over the 40 seeds (gain 0.03; +45% at 0.06). So ``s`` is chosen per target such that the
whole pool, replayed, shows exactly the printed speed-up (:func:`plant_map`: a grid of ``s``, inverted
by interpolation; a printed figure beyond what any replay reaches is counted, not planted). The share
found is the power the printed figure delivers over the studies that printed one; the share of null
studies printing one says how often there was a figure at all (otherwise "no speed-up is detectable").

Usage: ``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_speedup_mde_power.py [--reps 200]``
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

from bench_verdict_calibration import clopper, pool  # noqa: E402  (this folder is on sys.path)

from pcpo_eval.stats.runlevel import no_power_figures  # noqa: E402
from pcpo_eval.stats.verdict import verdict_rows  # noqa: E402
from pcpo_eval.study.spec import load_spec  # noqa: E402

DATA = ROOT / "benchmarks" / "data" / "toy_demo_runs.parquet"
SPEC = ROOT / "analysis" / "toy_study.yaml"
SEED = 20261128
#: (pairing, runs per arm): "paired labels" gives both arms the same seed labels (the paired t on runs
#: that share nothing), "unpaired" different labels (Welch)
DESIGNS = (("paired labels", 5), ("paired labels", 10), ("unpaired", 5), ("unpaired", 10))


def faster(g: pd.DataFrame, s: float) -> pd.DataFrame:
    """The run with its gain over the control replayed ``1 + s`` times faster (module docstring)."""
    e = g["epoch"].to_numpy(dtype=float)
    r, c = g["reward_mean"].to_numpy(), g["control_reward_mean"].to_numpy()
    gain = np.interp(e[0] + (e - e[0]) * (1 + s), e, r - c)
    return g.assign(reward_mean=c + gain)


def study(rng: np.random.Generator, runs: list[pd.DataFrame], design: tuple[str, int], s: float = 0.0) -> pd.DataFrame:
    """One study: 2n distinct seeds, the treatment arm ``B`` replayed with speed-up ``s``."""
    kind, n = design
    pick = rng.choice(len(runs), 2 * n, replace=False)
    parts = []
    for i, j in enumerate(pick):
        arm = "A" if i < n else "B"
        label = str(i % n) if kind == "paired labels" else str(i)
        g = faster(runs[j], s) if arm == "B" and s else runs[j]
        parts.append(g[["epoch", "reward_mean", "control_reward_mean"]].assign(arm=arm, cell="all", seed=label))
    return pd.concat(parts, ignore_index=True)


def plant_map(runs: list[pd.DataFrame], target: float, window: int) -> tuple[np.ndarray, np.ndarray]:
    """(pool speed-ups, replay factors ``s``): the restricted-mean speed-up of all runs replayed ``s``
    faster against themselves, paired, over a grid of ``s`` (non-decreasing, for :func:`numpy.interp`)."""
    from pcpo_eval.stats.speedup import epochs_to_target, speedup_runs
    from pcpo_eval.stats.verdict import run_curves

    grid = np.arange(0.0, 4.01, 0.05)
    est = []
    for s in grid:
        parts = [g[["epoch", "reward_mean", "control_reward_mean"]].assign(arm=arm, cell="all", seed=str(i))
                 for i, g0 in enumerate(runs) for arm, g in (("A", g0), ("B", faster(g0, s)))]
        rc = run_curves(pd.concat(parts, ignore_index=True))
        times = {a: [epochs_to_target(r.curve("gain"), target, window, epochs=r.epochs) for r in rc if r.arm == a]
                 for a in ("A", "B")}
        est.append(speedup_runs(times["A"], times["B"], target=target, paired=True).estimate or 0.0)
    return np.maximum.accumulate(np.asarray(est)), grid


def speed_row(table: pd.DataFrame, target: float, settings: dict) -> object:
    rows = verdict_rows(table, "A", ["B"], rng=np.random.default_rng(0), n_boot=20, gain_targets=[target],
                        primary=[f"speedup_gain:{target:g}"], **settings)
    return next((v for v in rows if v.quantity == f"speedup_gain:{target:g}"), None)


def ci(k: int, n: int) -> str:
    """A rate with its 95% Clopper-Pearson interval and its counts."""
    return f"{clopper(k, n)} ({k}/{n})" if n else "–"


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--reps", type=int, default=200)
    a = ap.parse_args(argv)
    runs = list(pool(pd.read_parquet(DATA), "DDPO").values())
    sp = load_spec(SPEC, check_weights=False)
    settings = {"window": sp.window, "k": sp.window}
    print("## Power at the printed speed-up MDE on real toy runs\n")
    print(f"`benchmarks/bench_speedup_mde_power.py --reps {a.reps}` (numpy seed {SEED}; {len(runs)} DDPO seeds of the "
          f"demo regime, window {sp.window}): the speed-up each A/A study prints as detectable at 80% power (its row the "
          "primary endpoint, tested alone at 0.05), planted into a fresh study of the same design (each treatment run's "
          "gain replayed faster, by the factor that gives the whole pool exactly that speed-up) and tested by the same "
          "verdict code. 95% Clopper-Pearson intervals.\n")
    print("| design | gain target | studies printing a number | power at the printed speed-up | median printed "
          "| printed beyond any replay |")
    print("|---|---:|---|---|---:|---:|")
    t0 = time.perf_counter()
    maps = {t: plant_map(runs, t, sp.window) for t in sp.gain_targets}
    for design in DESIGNS:
        for target in sp.gain_targets:
            est, grid = maps[target]
            rng = np.random.default_rng([SEED, design[1], int(design[0] == "unpaired"), int(1000 * target)])
            printed, found, beyond = [], 0, 0
            for _ in range(a.reps):
                v = speed_row(study(rng, runs, design), target, settings)
                m = None if v is None else v.mde
                if m is None:
                    continue
                if m > est[-1]:
                    beyond += 1
                    continue
                printed.append(m)
                with no_power_figures():
                    w = speed_row(study(rng, runs, design, float(np.interp(m, est, grid))), target, settings)
                found += bool(w is not None and w.significant and (w.estimate or 0) > 0)
            med = f"{np.median(printed):+.0%}" if printed else "–"
            print(f"| {design[0]}, {design[1]} per arm | {target:g} | {ci(len(printed) + beyond, a.reps)} | "
                  f"{ci(found, len(printed))} | {med} | {beyond} |", flush=True)
    print(f"\n{time.perf_counter() - t0:.0f} s.")
    return 0


if __name__ == "__main__":
    sys.exit(main())
