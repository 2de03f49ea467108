"""Benchmark: what `pcpo-eval lmm` says about per-prompt tables that are not replicated across runs.

A/A tables (simulated): two arms of one method, 30 prompts, each run's rows offset by its training seed
(SD 0.03), prompt effects, residual SD 0.01; so the arms differ only by chance. For each table shape, the
share of tables whose ``algorithm`` term has p < 0.05 (``fit_lmm``, the command's fit) and the share the
command warns about (``design.replication_warnings``, the command's warnings), with exact 95% CIs:
one run per arm and no run column (two ``per_prompt.parquet`` files joined), three runs per arm in a column
named ``seed`` or ``run`` but not grouped, and three runs per arm grouped (the sound fit).
Run: ``.venv/bin/python benchmarks/bench_lmm_replication.py [N]`` (default 100 tables per row).
"""

from __future__ import annotations

import os
import sys
import time
from pathlib import Path

for _k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_k, "1")

import numpy as np  # noqa: E402
import pandas as pd  # noqa: E402

sys.path.insert(0, str(Path(__file__).resolve().parent.parent))
from pcpo_eval.stats.design import replication_warnings  # noqa: E402
from pcpo_eval.stats.lmm import fit_lmm  # noqa: E402
from pcpo_eval.stats.pairwise import clopper_pearson  # noqa: E402

SEED = 20261128
#: (label, runs per arm, run column or None, groups)
SHAPES = (("1 run per arm, no run column", 1, None, ["prompt"]),
          ("3 runs per arm, column `seed`, not grouped", 3, "seed", ["prompt"]),
          ("3 runs per arm, column `run`, not grouped", 3, "run", ["prompt"]),
          ("3 runs per arm, `--group run --group prompt`", 3, "run", ["run", "prompt"]))


def table(rng: np.random.Generator, runs_per_arm: int, column: str | None, prompts: int = 30) -> pd.DataFrame:
    """One A/A table: per run an offset N(0, 0.03^2), prompt effects 0.01 p, residual N(0, 0.01^2)."""
    rows, k = [], 0
    for arm in ("DDPO", "PCPO"):
        for _ in range(runs_per_arm):
            off = rng.normal(0, 0.03)
            for p in range(prompts):
                row = {"algorithm": arm, "prompt": f"p{p}", "value": 0.4 + 0.01 * p + off + rng.normal(0, 0.01)}
                rows.append(row | ({column: f"s{k}"} if column else {}))
            k += 1
    return pd.DataFrame(rows)


def main(n: int) -> None:
    t0 = time.perf_counter()
    lines = ["## Statistics: `lmm` on per-prompt tables without replication across runs", "",
             f"A/A tables (two arms of one method, 30 prompts, run offset SD 0.03, residual SD 0.01), {n} per row, "
             f"numpy seed {SEED}; `value ~ algorithm`, REML, Satterthwaite df; exact 95% CIs.", "",
             "| table | p < 0.05 | `lmm` warns |", "|---|---|---|"]
    for label, rpa, column, groups in SHAPES:
        rng = np.random.default_rng(SEED)
        hits = warned = 0
        for _ in range(n):
            d = table(rng, rpa, column)
            hits += fit_lmm(d, "value ~ algorithm", groups).term("algorithm[T.PCPO]").p < 0.05
            warned += bool(replication_warnings(d, "value ~ algorithm", groups))
        cells = []
        for h in (hits, warned):
            lo, hi = clopper_pearson(h, n)
            cells.append(f"{h}/{n} = {h / n:.2f} [{lo:.2f}, {hi:.2f}]")
        lines.append(f"| {label} | {cells[0]} | {cells[1]} |")
    lines += ["", f"Command: `python benchmarks/bench_lmm_replication.py {n}` ({time.perf_counter() - t0:.0f} s)."]
    print("\n".join(lines))


if __name__ == "__main__":
    main(int(sys.argv[1]) if len(sys.argv) > 1 else 100)
