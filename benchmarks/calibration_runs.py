"""Train many seeds per arm of the demo regime once, and keep their learning curves.

The calibration benchmark (``bench_verdict_calibration.py``) resamples A/A, planted and negative-
control studies from *real* toy runs instead of a simulated curve process. This script trains
them: for every arm of ``analysis/toy_study.yaml`` (DDPO = ``ppo_clip``, PCPO = ``pcpo``) and every
seed ``0..N-1`` it trains the spec's resolved train config (the demo regime: 24 epochs, paired
untrained control) with that seed, keeps the per-epoch ``reward_mean``, ``control_reward_mean``,
``approx_kl``, ``clipfrac`` and the run's CPU seconds, and deletes the run directory.

Output: ``benchmarks/data/toy_demo_runs.parquet``, one row per (arm, seed, epoch). It is written
after every run (atomically), so the script resumes where it stopped; runs already in the file
are skipped. Seeds are shared between arms, exactly as a study with ``seeds: [...]`` pairs them:
the same seed draws the same prompts and initial noises in both arms.

Usage (two worker processes, one thread each; ~25 core-seconds per run on this machine):
``OMP_NUM_THREADS=1 .venv/bin/python benchmarks/calibration_runs.py --seeds 40 --workers 2``
"""

from __future__ import annotations

import argparse
import dataclasses
import os
import shutil
import sys
import tempfile
import time
from concurrent.futures import ProcessPoolExecutor, as_completed
from pathlib import Path

import pandas as pd

ROOT = Path(__file__).resolve().parents[1]
SPEC = ROOT / "analysis" / "toy_study.yaml"
OUT = ROOT / "benchmarks" / "data" / "toy_demo_runs.parquet"
COLUMNS = ("reward_mean", "control_reward_mean", "approx_kl", "clipfrac")


def _configs() -> dict[str, object]:
    """Arm -> the spec's resolved TrainConfig (seed replaced per run)."""
    from pcpo_eval.study.spec import load_spec

    sp = load_spec(SPEC, check_weights=False)
    out = {}
    for r in sp.runs:
        out.setdefault(sp.arm(r), r.train)
    return out


def train_one(arm: str, seed: int, config: object) -> pd.DataFrame:
    """Train one (arm, seed) of the demo regime (``config``: the arm's resolved TrainConfig, read once by
    the parent so that editing the spec meanwhile cannot change a running calibration) in a temporary
    directory; its per-epoch curves."""
    import torch

    from pcpo_eval.train.trainer import train

    torch.set_num_threads(1)
    cfg = dataclasses.replace(config, seed=seed, checkpoint_every=10_000, log_to="none")
    tmp = Path(tempfile.mkdtemp(prefix=f"calib-{arm}-{seed}-"))
    try:
        c0 = time.process_time()
        log = train(cfg, tmp / "run")
        cpu = time.process_time() - c0
    finally:
        shutil.rmtree(tmp, ignore_errors=True)
    df = pd.DataFrame({"arm": arm, "seed": seed, "epoch": log["epoch"].astype(int)})
    for c in COLUMNS:
        df[c] = log[c].astype(float).to_numpy()
    df["run_cpu_s"] = cpu
    return df


def main(argv: list[str] | None = None) -> int:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--seeds", type=int, default=40, help="seeds per arm: 0..N-1")
    ap.add_argument("--workers", type=int, default=2)
    ap.add_argument("--out", type=Path, default=OUT)
    a = ap.parse_args(argv)
    from pcpo_eval.io import atomic_write_parquet

    done = pd.read_parquet(a.out) if a.out.is_file() else pd.DataFrame(columns=["arm", "seed"])
    have = set(zip(done["arm"], done["seed"].astype(int), strict=True))
    configs = _configs()
    todo = [(arm, s) for s in range(a.seeds) for arm in configs if (arm, s) not in have]
    print(f"{len(have)} runs cached, {len(todo)} to train -> {a.out}", flush=True)
    os.environ.update(OMP_NUM_THREADS="1", MKL_NUM_THREADS="1")
    t0 = time.perf_counter()
    frames = [done] if len(done) else []
    with ProcessPoolExecutor(max_workers=a.workers) as ex:
        futs = {ex.submit(train_one, arm, s, configs[arm]): (arm, s) for arm, s in todo}
        for i, f in enumerate(as_completed(futs), 1):
            frames.append(f.result())
            a.out.parent.mkdir(parents=True, exist_ok=True)
            table = pd.concat(frames, ignore_index=True).sort_values(["arm", "seed", "epoch"])
            atomic_write_parquet(a.out, table.reset_index(drop=True))
            arm, s = futs[f]
            print(f"[{i}/{len(todo)}] {arm} seed {s} done ({time.perf_counter() - t0:.0f} s)", flush=True)
    return 0


if __name__ == "__main__":
    sys.exit(main())
