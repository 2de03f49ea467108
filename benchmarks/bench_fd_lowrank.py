"""Benchmark: per-prompt FD by the exact low-rank form vs the d x d eigendecomposition path, same run.

``frechet_distance_lowrank`` (sum of singular values of A^T B, O(n1 n2 d)) against the Gaussian-
statistics path (``_fd_of``: Cholesky or eigh of d x d covariances) on random features of a prompt's
few images; prints seconds of each, the ratio, and the relative difference of the values.
Run: ``.venv/bin/python benchmarks/bench_fd_lowrank.py``.
"""

from __future__ import annotations

import time

import numpy as np

from pcpo_eval.metrics.frechet import _fd_of, frechet_distance_lowrank
from pcpo_eval.metrics.state import GaussianStats


def main() -> None:
    rng = np.random.default_rng(0)
    for n1, n2, d in [(10, 12, 2048), (10, 10, 1024), (50, 50, 2048)]:
        x = rng.normal(size=(n1, d))
        y = rng.normal(1, 2, size=(n2, d)) @ rng.normal(size=(d, d)) / np.sqrt(d)
        t = time.perf_counter()
        low = frechet_distance_lowrank(x, y)
        t_low = time.perf_counter() - t
        t = time.perf_counter()
        full = _fd_of(GaussianStats(d).update(x), GaussianStats(d).update(y))
        t_full = time.perf_counter() - t
        rel = abs(low.value - full.value) / abs(full.value)
        print(f"n={n1}x{n2} d={d}: low-rank {t_low * 1e3:.1f} ms, {full.method} {t_full * 1e3:.0f} ms "
              f"({t_full / t_low:.0f}x); relative difference {rel:.1e}")


if __name__ == "__main__":
    main()
