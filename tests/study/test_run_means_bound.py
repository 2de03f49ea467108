"""A per-prompt simple effect's p is bounded by Welch's t on the runs' means.

The LMM ``value ~ algorithm + (1|prompt) + (1|run)`` gives both arms one run-to-run variance. With
equal arm means but the spread all in one arm (a stable arm against one that varies by seed), 3 vs 3
runs and 16 prompts, its p fell below 0.05 in 27 of 300 simulations (9.0%); the larger of it and
Welch's p on the runs' means in 14 (4.7%). Run ``python -m tests.study.test_run_means_bound 300`` for
those numbers (numpy seed 7; ``200 1 0.1 0.1 0`` and ``200 2 0.1 0.1 0.25``: equal spreads, no shift and
a 0.25 shift, docs/statistics.md); the test runs 100.
"""

from __future__ import annotations

import sys
import types

import numpy as np
import pandas as pd

from pcpo_eval.study.results import RUN_MEANS_REASON, _simple_effect, lmm_setup

RUNS, PROMPTS = 3, 16


def rates(n: int, seed: int = 7, sd: tuple[float, float] = (0.15, 0.0), effect: float = 0.0) -> tuple[int, int, int]:
    """(studies, LMM p < 0.05, bounded p < 0.05) over ``n`` simulated cells: prompt effects N(0, 0.3^2),
    run effects N(0, sd^2) per arm, residual N(0, 0.05^2), arm B shifted by ``effect``."""
    rng = np.random.default_rng(seed)
    sp = types.SimpleNamespace(compare_factor="algorithm", pcpo="B", baseline="A",
                               lmm=types.SimpleNamespace(alpha=0.05))
    setup = lmm_setup("value ~ algorithm", ["prompt"], None, RUNS)
    used = lmm = bounded = 0
    for _ in range(n):
        pe = rng.normal(0, 0.3, PROMPTS)
        rows = []
        for arm, run_sd, shift in (("A", sd[0], 0.0), ("B", sd[1], effect)):
            for r in range(RUNS):
                u = rng.normal(0, run_sd)
                rows.append(pd.DataFrame({"algorithm": arm, "run": f"{arm}{r}", "prompt": [f"p{j}" for j in range(PROMPTS)],
                                          "m": pe + u + shift + rng.normal(0, 0.05, PROMPTS)}))
        fit, row = _simple_effect(sp, pd.concat(rows, ignore_index=True), "m", setup)
        if fit is None or row.get("p") is None:
            continue
        used += 1
        lmm += row["p_lmm"] < 0.05
        bounded += row["p"] < 0.05
        assert row["p"] >= row["p_lmm"] and (row["p"] > row["p_lmm"]) == (RUN_MEANS_REASON in (row["reason"] or ""))
    return used, lmm, bounded


def test_unequal_run_spreads_keep_the_false_positive_rate():
    used, lmm, bounded = rates(100)
    assert used >= 95
    assert bounded / used <= 0.06 < lmm / used  # the LMM alone: about 9%, as in 300 draws


def test_the_row_records_both_tests_and_detects_what_both_detect():
    sp = types.SimpleNamespace(compare_factor="algorithm", pcpo="B", baseline="A", lmm=types.SimpleNamespace(alpha=0.05))
    rng = np.random.default_rng(3)
    d = pd.concat([pd.DataFrame({"algorithm": arm, "run": f"{arm}{r}", "prompt": [f"p{j}" for j in range(8)],
                                 "m": rng.normal(0.3 * (arm == "B") + rng.normal(0, 0.1), 0.05, 8)})
                   for arm in "AB" for r in range(3)], ignore_index=True)
    _, row = _simple_effect(sp, d, "m", lmm_setup("value ~ algorithm", ["prompt"], None, 3))
    assert row["p"] == max(row["p_lmm"], row["p_run_means"])
    assert len(row["run_means"]["baseline"]) == len(row["run_means"]["treatment"]) == 3
    from pcpo_eval.stats.power import mde_from_se

    assert row["mde"] >= mde_from_se(row["se"], row["df"], alpha=0.05)


if __name__ == "__main__":  # N [SEED SD_A SD_B EFFECT], e.g. 200 2 0.1 0.1 0.25 (power, equal spreads)
    a = sys.argv[1:]
    n = int(a[0]) if a else 300
    kw = {"seed": int(a[1]), "sd": (float(a[2]), float(a[3])), "effect": float(a[4])} if len(a) == 5 else {}
    used, lmm, bounded = rates(n, **kw)
    print(f"{used} cells: LMM p < 0.05 in {lmm} ({100 * lmm / used:.1f}%), bounded p in {bounded} "
          f"({100 * bounded / used:.1f}%)")
