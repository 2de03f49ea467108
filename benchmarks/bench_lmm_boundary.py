"""A/A rate of the LMM algorithm term when the run variance can be estimated at 0 (boundary).

Model (one study's image metric, A/A): ``value = prompt + image + run + e`` with P prompts, K images per
prompt per run (each image's noise shared by all runs: ``image``), prompt SD 0.5, image SD 0.5,
residual SD sigma = 1, run SD tau with tau^2 = c sigma^2 / (P K), k runs per arm, no true difference
(``--plant D`` adds D x sqrt(2 (1 + c) sigma^2 / (k P K)) to arm B: D SEs of the run-level contrast).

``--fits N``: N data sets per c, fitted by the study's own path (:func:`pcpo_eval.stats.fit_lmm` with
``coding="treatment", diagnostics=False`` as ``study.image_metrics._simple_effect`` calls it, then
:func:`pcpo_eval.stats.boundary.run_level_at_boundary`): ``--design prompt`` fits the per-prompt rows
(one row per (run, prompt), the mean of its K images) with ``(1|prompt) + (1|run)``, ``--design image``
the per-image rows with ``(1|prompt) + (1|image) + (1|run)``. Reports, per c, how often the run
variance is at 0 and the rate of p < alpha for lmerTest's p (before) and the study's p (after) at
alpha = 0.05, 0.0125 and 0.005 (the first Holm step of a family of 1, 4 and 10 rows), with 95%
Clopper-Pearson intervals.

``--analytic N``: the same rates from N draws of the balanced design's mean squares (on balanced data
the REML fit is the ANOVA fit: the algorithm t uses the between-run mean square with df 2k - 2 when
it exceeds the residual one, else the pooled residual with lmerTest's df; the fit path reproduces
this to 1e-8 in p, ``tests/stats/test_boundary.py``).

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lmm_boundary.py --analytic 2000000
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lmm_boundary.py --fits 600 --k 3 --design prompt
"""

from __future__ import annotations

import argparse
import sys
import time
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

ALPHAS = (0.05, 0.0125, 0.005)
CS = (0.0, 0.5, 1.0, 2.0, 5.0, 20.0)


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """95% Clopper-Pearson interval of a binomial rate."""
    lo = float(stats.beta.ppf(0.025, k, n - k + 1)) if k else 0.0
    hi = float(stats.beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def draw(rng: np.random.Generator, k: int, n_prompts: int, n_images: int, c: float, design: str,
         plant: float = 0.0) -> pd.DataFrame:
    """One A/A data set (arm B shifted by ``plant`` SEs of the run-level contrast)."""
    p_, k_img = n_prompts, n_images
    tau = np.sqrt(c / (p_ * k_img))
    shift = plant * np.sqrt(2 * (1 + c) / (k * p_ * k_img))
    pe, ie = rng.normal(0, 0.5, p_), rng.normal(0, 0.5, (p_, k_img))
    prompts = np.array([f"p{i}" for i in range(p_)])
    frames = []
    for arm in ("A", "B"):
        for j in range(k):
            v = pe[:, None] + ie + rng.normal(0, tau) + rng.normal(0, 1.0, (p_, k_img)) + (shift if arm == "B" else 0)
            if design == "image":
                frames.append(pd.DataFrame({"algorithm": arm, "run": f"{arm}{j}", "prompt": np.repeat(prompts, k_img),
                                            "image": [f"{q}s{s}" for q in prompts for s in range(k_img)],
                                            "value": v.ravel()}))
            else:
                frames.append(pd.DataFrame({"algorithm": arm, "run": f"{arm}{j}", "prompt": prompts,
                                            "value": v.mean(1)}))
    return pd.concat(frames, ignore_index=True)


def fit_path(d: pd.DataFrame, design: str) -> tuple[float, float, bool]:
    """(lmerTest's p, the study's p, run variance at 0) of the algorithm term, as the study fits it."""
    from pcpo_eval.stats import fit_lmm
    from pcpo_eval.stats.boundary import run_level_at_boundary, run_variance_at_zero

    groups = ["prompt", "image", "run"] if design == "image" else ["prompt", "run"]
    f = fit_lmm(d, "value ~ algorithm", groups, coding="treatment", diagnostics=False)
    g = run_level_at_boundary(f, d, "value ~ algorithm", groups, "treatment")
    return f.term("algorithm[T.B]").p, g.term("algorithm[T.B]").p, run_variance_at_zero(f)


def _rate(x: np.ndarray) -> str:
    k, n = int(np.sum(x)), len(x)
    lo, hi = clopper_pearson(k, n)
    return f"{100 * k / n:.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def fits(k: int, design: str, n_prompts: int, n_images: int, n: int, seed: int, plant: float, cs: tuple[float, ...]) -> None:
    for c in cs:
        t0 = time.time()
        rng = np.random.default_rng([seed, k, n_images, int(round(10 * c)), design == "image", int(round(10 * plant))])
        res = np.array([fit_path(draw(rng, k, n_prompts, n_images, c, design, plant), design) for _ in range(n)])
        old, new, zero = res[:, 0], res[:, 1], res[:, 2].astype(bool)
        cols = "; ".join(f"alpha {a:g}: lmerTest {_rate(old < a)}, study {_rate(new < a)}" for a in ALPHAS)
        print(f"[fits {design} k={k} P={n_prompts} K={n_images} c={c:g} plant={plant:g} n={n} seed={seed}] "
              f"run variance at 0 {100 * zero.mean():.0f}%; {cols} ({time.time() - t0:.0f} s)", flush=True)


def analytic(k: int, df_res: int, n: int, seed: int, plant: float) -> None:
    """Rates of p < alpha from mean-square draws (balanced design), lmerTest's rule vs the run-level test."""
    dfr = 2 * k - 2
    for c in CS:
        rng = np.random.default_rng([seed, k, df_res, int(round(10 * c)), int(round(10 * plant))])
        e = 1 + c  # E[between-run MS] / sigma^2 (rows-per-run units)
        diff2 = (rng.standard_normal(n) + plant) ** 2 * e  # squared contrast / (2 / (k m)), m rows per run
        msr, mse = e * rng.chisquare(dfr, n) / dfr, rng.chisquare(df_res, n) / df_res
        zero = msr <= mse
        pool = (dfr * msr + df_res * mse) / (dfr + df_res)
        p_run = 2 * stats.t.sf(np.sqrt(diff2 / msr), dfr)
        p_old = np.where(zero, 2 * stats.t.sf(np.sqrt(diff2 / pool), dfr + df_res), p_run)
        cols = "; ".join(f"alpha {a:g}: lmerTest {100 * np.mean(p_old < a):.2f}%, study {100 * np.mean(p_run < a):.2f}%"
                         for a in ALPHAS)
        print(f"[analytic k={k} residual df {df_res} c={c:g} plant={plant:g} n={n} seed={seed}] "
              f"run variance at 0 {100 * zero.mean():.1f}%; {cols}", flush=True)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("--fits", type=int, default=0, help="data sets per c through the study's fit path")
    ap.add_argument("--analytic", type=int, default=0, help="mean-square draws per setting")
    ap.add_argument("--k", type=int, default=3, help="runs per arm")
    ap.add_argument("--design", choices=("prompt", "image"), default="prompt")
    ap.add_argument("--prompts", type=int, default=20)
    ap.add_argument("--images", type=int, default=4, help="images per prompt per run (K)")
    ap.add_argument("--c", type=float, nargs="*", default=list(CS), help="run variance in sigma^2 / (P K)")
    ap.add_argument("--plant", type=float, default=0.0, help="effect in SEs of the run-level contrast")
    ap.add_argument("--seed", type=int, default=20261127)
    a = ap.parse_args()
    if a.analytic:
        for k in (3, 5):
            for df_res in ((2 * k - 1) * (a.prompts - 1), 100_000):
                analytic(k, df_res, a.analytic, a.seed, a.plant)
    if a.fits:
        fits(a.k, a.design, a.prompts, a.images, a.fits, a.seed, a.plant, tuple(a.c))


if __name__ == "__main__":
    main()
