"""Benchmark: seconds to write one paper figure as 300-dpi PNG, SVG and PDF (pcpo_eval.figfiles), same run.

A 3-panel, 6.8 in figure with 18 lines of 200 points, as the report draws; the median of 3 saves of
each format, and the old 96-dpi PNG for comparison. Run: ``.venv/bin/python benchmarks/bench_figure_formats.py``.
"""

from __future__ import annotations

import io
import statistics
import time

import matplotlib

matplotlib.use("Agg")
import matplotlib.pyplot as plt  # noqa: E402
import numpy as np  # noqa: E402

from pcpo_eval.figfiles import figure_bytes  # noqa: E402


def _median_s(fn) -> float:
    out = []
    for _ in range(3):
        t = time.perf_counter()
        fn()
        out.append(time.perf_counter() - t)
    return statistics.median(out)


def main() -> None:
    rng = np.random.default_rng(0)
    fig, axes = plt.subplots(1, 3, figsize=(6.8, 2.2))
    for ax in axes:
        for _ in range(6):
            ax.plot(np.arange(200), np.cumsum(rng.normal(size=200)), marker="o", ms=2)
    for fmt in ("png", "svg", "pdf"):
        print(f"{fmt}: {_median_s(lambda f=fmt: figure_bytes(fig, f)):.3f} s")
    print(f"png at 96 dpi: {_median_s(lambda: fig.savefig(io.BytesIO(), format='png', dpi=96)):.3f} s")


if __name__ == "__main__":
    main()
