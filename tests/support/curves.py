"""Simulated training curves for the speed-up guards (tests/stats/test_speedup_guards.py and
benchmarks/bench_speedup_guards.py): paired runs of arms that learn alike, faster, or not at all."""

from __future__ import annotations

import numpy as np
import pandas as pd


def learning_study(rng: np.random.Generator, n: int, arms: dict[str, dict], k_rate: float = 0.08,
                   n_epochs: int = 40) -> pd.DataFrame:
    """A runs table (arm, cell, seed, epoch, reward_mean, control_reward_mean) of ``n`` paired seeds: a control
    shared per seed; per run gain = plateau (1 - exp(-k t)) + evaluation noise (``arms[a]["noise"]``), plateau
    = 0.06 m (1 + u_seed) + N(0, 0.035) with m = ``arms[a]["gain"]`` (default 1), k = k_rate exp(N(0, 0.2));
    ``gain: None``: no learning, noise only (a policy that drifted)."""
    e = np.arange(1, n_epochs + 1)
    parts = []
    for s in range(n):
        control = 0.3 + rng.normal(0, 0.02) + rng.normal(0, 0.02, n_epochs)
        u = rng.normal(0, 0.25)
        for arm, o in arms.items():
            noise = rng.normal(0, o["noise"], n_epochs)
            if o.get("gain", 1.0) is None:
                gain = np.zeros(n_epochs)
            else:
                k = k_rate * np.exp(rng.normal(0, 0.2))
                gain = (0.06 * o.get("gain", 1.0) * (1 + u) + rng.normal(0, 0.035)) * (1 - np.exp(-k * e))
            parts.append(pd.DataFrame({"arm": arm, "cell": "all", "seed": s, "epoch": e, "control_reward_mean": control,
                                       "reward_mean": control + gain + noise}))
    return pd.concat(parts, ignore_index=True)
