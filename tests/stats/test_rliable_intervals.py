"""Why the rliable panels draw no interval below ``MIN_INTERVAL_RUNS`` runs per arm: in A/A pairs of runs the
probability of improvement's 95% stratified bootstrap interval excludes 0.5 far more often than 5% with few
runs (a review found panels excluding 0.5 under "no evidence" verdicts of 3-vs-3 A/A studies), and close to 5%
from 10 runs on. The figures quoted in ``pcpo_eval.stats.rliable`` and
the report come from this simulation (400 pairs of normal runs per size, numpy seed 20261128)."""

from __future__ import annotations

import numpy as np

from pcpo_eval.stats.rliable import MIN_INTERVAL_RUNS
from pcpo_eval.stats.runlevel import poi_interval


def _excludes_half(n: int, pairs: int = 400) -> float:
    rng = np.random.default_rng(20261128)
    hits = 0
    for s in range(pairs):
        b, t = rng.normal(size=n), rng.normal(size=n)
        _, lo, hi = poi_interval(b, t, n_boot=2000, rng=np.random.default_rng(s))
        hits += lo > 0.5 or hi < 0.5
    return hits / pairs


def test_the_poi_interval_is_a_test_in_disguise_with_few_runs_and_near_nominal_from_the_minimum():
    few, enough = _excludes_half(3), _excludes_half(MIN_INTERVAL_RUNS)
    assert few > 0.12, few  # 3 runs per arm: 0.168 in this simulation
    assert enough < 0.08, enough  # 10 runs per arm: 0.045
