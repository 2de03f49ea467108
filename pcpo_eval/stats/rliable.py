"""rliable's three panels over runs (Agarwal et al. 2021, "Deep RL at the edge of the statistical
precipice"), as numbers: the interval estimates (IQM over runs with a percentile bootstrap CI), the
probability of improvement over the baseline arm (stratified bootstrap CI) and the performance
profiles (fraction of runs above tau, with a bootstrap band).

Each run is reduced to the verdict's per-run quantities with the verdict's own function
(:func:`pcpo_eval.stats.verdict.run_scalar`: final reward and paired gain over the last ``k`` epochs,
AUC over the run) on the verdict's table, so a panel and a verdict row never disagree on a run's value.
The study's stats stage writes :func:`rliable_panels` to ``results.json`` (``rliable``); the report
only draws it. Descriptive: the verdict's t and permutation tests are the inference
(:mod:`pcpo_eval.stats.runlevel`). Below :data:`MIN_INTERVAL_RUNS` runs per arm the panels carry no interval
(point estimates only): with few runs the percentile intervals are too narrow and read as tests. In 400
simulated A/A pairs of normal runs per size (``tests/stats/test_rliable_intervals.py``), the probability of
improvement's 95% interval excluded 0.5 in 16.8% at 3 runs per arm, 10.0% at 5 and 4.5% at 10 and 20.
"""

from __future__ import annotations

import math
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.stats.runlevel import iqm_interval, performance_profile, poi_interval
from pcpo_eval.stats.verdict import CONTROL_COLUMN, run_curves, run_scalar

#: Seed of every panel's bootstrap (the same numbers every time; each interval draws from a fresh
#: generator with this seed, so adding an arm changes no other arm's interval).
BOOTSTRAP_SEED = 20210825
#: Bootstrap resamples per interval or band.
N_BOOT = 2000
#: The fewest runs (per arm; both arms for the probability of improvement) an interval is drawn from
MIN_INTERVAL_RUNS = 10
#: Thresholds per performance profile (evenly spaced over the range of the quantity's per-run values).
PROFILE_TAUS = 101
#: Per-run quantities of the panels and how a panel titles them.
PANEL_QUANTITIES = {"paired_gain": "paired gain (reward - control)", "final_reward": "final reward",
                    "auc": "reward AUC (mean over training)"}


def _rng() -> np.random.Generator:
    return np.random.default_rng(BOOTSTRAP_SEED)


def _finite(xs: list[float | None]) -> list[float]:
    return [float(x) for x in xs if x is not None and math.isfinite(x)]


def run_values(table: pd.DataFrame, k: int) -> list[dict[str, Any]]:
    """Per run (arm, cell, seed) of the tidy verdict table its :data:`PANEL_QUANTITIES` (None where the
    run's value is missing: an AUC over a missing epoch, a paired gain without the control)."""
    out = []
    for run in run_curves(table):
        row: dict[str, Any] = {"cell": run.cell, "arm": run.arm, "seed": run.seed}
        for q in PANEL_QUANTITIES:
            v = run_scalar(run, q, k) if q != "paired_gain" or run.control is not None else math.nan
            row[q] = float(v) if math.isfinite(v) else None
        out.append(row)
    return out


def _groups(values: list[dict[str, Any]]) -> dict[tuple[str, str], dict[str, list[float]]]:
    out: dict[tuple[str, str], dict[str, list[float]]] = {}
    for v in values:
        g = out.setdefault((v["cell"], v["arm"]), {q: [] for q in PANEL_QUANTITIES})
        for q in PANEL_QUANTITIES:
            g[q] += _finite([v[q]])
    return out


def rliable_panels(table: pd.DataFrame, baseline: str, k: int) -> dict[str, Any]:
    """The three panels' numbers for ``results.json`` ``rliable`` from the tidy verdict table (every arm;
    ``baseline`` is the arm the others are compared with, ``k`` the verdict's last-epochs window).

    ``intervals``: per (cell, arm, quantity) the IQM over runs and its 95% CI; ``improvement``: per cell,
    other arm and quantity P(a run of the arm beats a baseline run) and its 95% CI (both CIs None below
    :data:`MIN_INTERVAL_RUNS` runs); ``profiles``: per
    (cell, arm, quantity) the fraction of runs above each tau of the quantity's ``taus`` with its band.
    A run whose value is missing is left out of that quantity's panels (``runs`` keeps it as None)."""
    values = run_values(table, k)
    groups = _groups(values)
    qs = [q for q in PANEL_QUANTITIES if any(g[q] for g in groups.values())]
    if CONTROL_COLUMN not in table.columns and "paired_gain" in qs:
        qs.remove("paired_gain")
    intervals, improvement, profiles = [], [], []
    taus = {}
    for q in qs:
        allv = [x for g in groups.values() for x in g[q]]
        pad = 0.05 * (max(allv) - min(allv)) or 0.05 * max(abs(allv[0]), 1.0)
        taus[q] = np.linspace(min(allv) - pad, max(allv) + pad, PROFILE_TAUS).tolist()
    for (cell, arm), g in sorted(groups.items()):
        for q in qs:
            if not g[q]:
                continue
            est, lo, hi = iqm_interval(g[q], n_boot=N_BOOT, rng=_rng())
            if len(g[q]) < MIN_INTERVAL_RUNS:
                lo = hi = None
            intervals.append({"cell": cell, "arm": arm, "quantity": q, "n_runs": len(g[q]), "iqm": est,
                              "ci_low": lo, "ci_high": hi})
            frac, blo, bhi = performance_profile(g[q], taus[q], n_boot=N_BOOT, rng=_rng())
            profiles.append({"cell": cell, "arm": arm, "quantity": q, "n_runs": len(g[q]), "fraction": frac.tolist(),
                             "band_low": blo.tolist(), "band_high": bhi.tolist()})
            base = groups.get((cell, baseline), {}).get(q)
            if arm != baseline and base:
                est, lo, hi = poi_interval(base, g[q], n_boot=N_BOOT, rng=_rng())
                if min(len(base), len(g[q])) < MIN_INTERVAL_RUNS:
                    lo = hi = None
                improvement.append({"cell": cell, "baseline": baseline, "arm": arm, "quantity": q,
                                    "n_baseline_runs": len(base), "n_runs": len(g[q]), "p_improvement": est,
                                    "ci_low": lo, "ci_high": hi})
    return {"k": k, "n_boot": N_BOOT, "seed": BOOTSTRAP_SEED, "min_interval_runs": MIN_INTERVAL_RUNS, "quantities": {q: PANEL_QUANTITIES[q] for q in qs},
            "taus": taus, "runs": values, "intervals": intervals, "improvement": improvement, "profiles": profiles}
