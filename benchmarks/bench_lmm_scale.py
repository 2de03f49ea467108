"""Benchmark: ``pcpo-eval lmm`` vs R's lme4 + lmerTest on per-image crossed designs, 8k to 1M rows.

Design (simulated, as per-image scores of a study): ``value ~ algorithm * batch + (1|prompt) +
(1|seed)`` with 4 algorithms x 2 batch sizes x prompts x seeds, every cell filled; SDs prompt 1,
seed 0.3, residual 1. Per size, in the same run: the wall time of ``fit_lmm`` in this process
(design, fit, Satterthwaite df, residual diagnostics) and of the whole ``pcpo-eval lmm`` process
(interpreter start, imports, CSV read, fit, print); for R, ``lmer`` + ``summary`` (lmerTest's
Satterthwaite df) timed inside the script and the whole ``Rscript`` process (R start, library
load, ``read.csv``, fit, summary). lme4 runs with its defaults. Agreement: max over the fixed
effects of |ours - lme4| / max(|lme4|, SE) for estimates, relative for SE and df.
Everything single-threaded (``OMP_NUM_THREADS=1`` etc.); each size runs once.
Run: ``.venv/bin/python benchmarks/bench_lmm_scale.py`` (R's side needs ``r-cran-lmertest``).
"""

from __future__ import annotations

import os
import re
import shutil
import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

from pcpo_eval.stats.lmm import fit_lmm

SIZES = ((100, 10), (200, 20), (400, 40), (1250, 100))  # (prompts, seeds): 8 x P x S rows
FORMULA = "value ~ algorithm * batch"
R_SCRIPT = r"""
suppressMessages(library(lmerTest))
d <- read.csv(commandArgs(TRUE)[1], stringsAsFactors = TRUE)
t0 <- proc.time()[["elapsed"]]
m <- lmer(value ~ algorithm * batch + (1 | prompt) + (1 | seed), d)
co <- summary(m)$coefficients
cat("fit_seconds", proc.time()[["elapsed"]] - t0, "\n")
num <- function(x) paste(sprintf("%.17g", x), collapse = " ")
cat("names", rownames(co), "\n")
cat("estimate", num(co[, "Estimate"]), "\n")
cat("se", num(co[, "Std. Error"]), "\n")
cat("df", num(co[, "df"]), "\n")
"""
ONE_THREAD = {k: "1" for k in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS")}


def simulate(n_prompt: int, n_seed: int, seed: int = 0) -> pd.DataFrame:
    """Every (algorithm, batch, prompt, seed) cell once, with prompt and seed random intercepts."""
    rng = np.random.default_rng(seed)
    algs = np.array(["dancegrpo", "ddpo", "flowgrpo", "pcpo"])
    a, b, p, s = (
        v.ravel() for v in np.meshgrid(range(4), range(2), range(n_prompt), range(n_seed), indexing="ij")
    )
    effect = np.array([0.0, 0.1, 0.2, 0.35])[a] - 0.2 * b + np.array([0.0, 0.05, -0.05, 0.1])[a] * b
    y = (
        5.0
        + effect
        + rng.normal(0, 1.0, n_prompt)[p]
        + rng.normal(0, 0.3, n_seed)[s]
        + rng.normal(0, 1.0, a.size)
    )
    return pd.DataFrame(
        {"algorithm": algs[a], "batch": np.array(["large", "small"])[b], "prompt": p, "seed": s, "value": y}
    )


def _ours(csv: Path, df: pd.DataFrame) -> tuple[float, float, object]:
    """(fit_lmm seconds in this process, whole CLI process seconds, the fit)."""
    t = time.perf_counter()
    fit = fit_lmm(df, FORMULA, ["prompt", "seed"])
    t_fit = time.perf_counter() - t
    cmd = [sys.executable, "-c", "from pcpo_eval.cli import main; main()", "lmm", str(csv)]
    cmd += ["--formula", FORMULA, "--group", "prompt", "--group", "seed"]
    t = time.perf_counter()
    subprocess.run(cmd, check=True, capture_output=True, env={**os.environ, **ONE_THREAD})
    return t_fit, time.perf_counter() - t, fit


def _lme4(csv: Path, script: Path) -> tuple[float, float, dict[str, list[str]]]:
    """(lmer + summary seconds inside R, whole Rscript process seconds, R's numbers)."""
    t = time.perf_counter()
    r = subprocess.run(
        ["Rscript", str(script), str(csv)],
        check=True,
        capture_output=True,
        text=True,
        env={**os.environ, **ONE_THREAD},
    )
    t_proc = time.perf_counter() - t
    out = {line.split()[0]: line.split()[1:] for line in r.stdout.splitlines() if line.strip()}
    return float(out["fit_seconds"][0]), t_proc, out


def _agreement(fit: object, ref: dict[str, list[str]]) -> tuple[float, float, float]:
    """Max relative differences (estimate, SE, df) against lme4, matched by R's term names."""
    pos = {name: i for i, name in enumerate(ref["names"])}
    idx = [pos[re.sub(r"(\w+)\[T\.([^\]]+)\]", r"\1\2", fe.term)] for fe in fit.fixed]
    theirs = {k: np.array([float(ref[k][i]) for i in idx]) for k in ("estimate", "se", "df")}
    ours = {k: np.array([getattr(fe, k) for fe in fit.fixed]) for k in ("estimate", "se", "df")}
    est = np.max(
        np.abs(ours["estimate"] - theirs["estimate"]) / np.maximum(np.abs(theirs["estimate"]), theirs["se"])
    )
    return (
        float(est),
        float(np.max(np.abs(ours["se"] / theirs["se"] - 1))),
        float(np.max(np.abs(ours["df"] / theirs["df"] - 1))),
    )


def _row(n_prompt: int, n_seed: int, work: Path, have_r: bool) -> str:
    df = simulate(n_prompt, n_seed)
    csv = work / f"lmm_{len(df)}.csv"
    df.to_csv(csv, index=False)
    t_fit, t_proc, fit = _ours(csv, df)
    cells = [f"{len(df):,}", f"{n_prompt} x {n_seed}", f"{t_fit:.2f}", f"{t_proc:.2f}"]
    if have_r:
        r_fit, r_proc, ref = _lme4(csv, work / "fit.R")
        est, se, dfr = _agreement(fit, ref)
        cells += [
            f"{r_fit:.2f}",
            f"{r_proc:.2f}",
            f"{r_proc / t_proc:.1f}x",
            f"{est:.0e}",
            f"{se:.0e}",
            f"{dfr:.0e}",
        ]
    else:
        cells += ["n/a"] * 6
    csv.unlink()
    return "| " + " | ".join(cells) + " |"


def main() -> None:
    have_r = shutil.which("Rscript") is not None
    print("## Statistics: LMM at per-image scale, pcpo-eval vs lme4 + lmerTest\n")
    print(
        "| rows | prompts x seeds | fit_lmm (s) | pcpo-eval process (s) | lmer + summary (s) | Rscript process (s) "
        "| process speed-up | max rel diff estimate | SE | df |"
    )
    print("|---:|---:|---:|---:|---:|---:|---:|---:|---:|---:|")
    with tempfile.TemporaryDirectory() as tmp:
        work = Path(tmp)
        (work / "fit.R").write_text(R_SCRIPT)
        for n_prompt, n_seed in SIZES:
            print(_row(n_prompt, n_seed, work, have_r), flush=True)
    print(
        "\n`value ~ algorithm * batch + (1|prompt) + (1|seed)`, REML, Satterthwaite df; one run per size, "
        "single-threaded, on the shared machine. Process times include interpreter start, imports and "
        "reading the CSV; speed-up = Rscript process / pcpo-eval process. Estimate differences are relative "
        "to max(|estimate|, SE); lme4 runs with its default optimizer settings."
        + ("" if have_r else " Rscript not found: R columns not measured (apt-get install r-cran-lmertest).")
    )


if __name__ == "__main__":
    main()
