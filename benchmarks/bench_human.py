"""Calibration of the human-study analysis: false positives in A/A studies, power at a planted preference.

The paper's design: two comparisons (PCPO against the two bracketing baseline checkpoints), 45
prompts x 10 seeds each, ~300 responses per comparison. Simulated raters
(:func:`pcpo_eval.human.analysis.simulate_responses`: 5% ties, per-rater and per-prompt log-odds
noise) answer 40 pairs each; 15 raters. For each setting we run ``N`` independent studies through
:func:`pcpo_eval.human.analysis.analyze` and count comparisons called significant (alpha 0.05) by
the exact binomial test and by the mixed logistic model (the verdict's test), with exact 95% CIs of
those rates, and the studies in which some comparison shows a preference: by each comparison's own
test at 0.05, and by the verdict (Holm over the study's comparisons, one family per study). Also the mean time of one mixed-model fit and, when ``Rscript`` with lme4 is present,
R's ``glmer`` on the same data in the same run (ratio).

Unequal and few raters (``--part raters``): one rater who gives most answers (``per_rater: null``),
two or four raters; each row's A/A rate, power, where the verdict's p came from and the detectable
win rate it printed. The rater-level test's column reads n/a on code without it.

The printed detectable win rate alone (``--part mde``): for the paper's design and the one with a
dominant rater (600 + 14 x 20), N A/A studies give the median rate the verdict prints, and N studies
with that preference planted in one comparison say how often the verdict finds it (the claim: 80%).

The printed intervals (``--part ci``): in A/A studies, how often each interval or p the human table prints
reads "significant" (the verdict; the raters' interval of the verdict sentence; the pooled answers' exact
interval; the mixed model's Wald p and odds-ratio interval; the Bradley-Terry Elo intervals over resampled
raters), and at a planted 0.6 how often the two win-rate intervals cover the population win rate.

Interim looks (``--part looks``): A/A studies analysed after each rater from the 5th to the 15th; how often
some look says "Raters preferred" against the last look alone.

Usage: ``python benchmarks/bench_human.py [N] [--part paper|raters|mde|ci|looks]`` (default 300 studies per
setting, the paper and raters parts).
"""

from __future__ import annotations

import subprocess
import sys
import tempfile
import time
from pathlib import Path

import numpy as np
import pandas as pd

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))
from pcpo_eval.human import PAIR_COLUMNS  # noqa: E402
from pcpo_eval.human.analysis import analyze, clopper_pearson, simulate_responses  # noqa: E402

COMPARISONS = ("PCPO@120 vs DDPO@180", "PCPO@120 vs DDPO@240")


def paper_pairs(seed: int = 0) -> pd.DataFrame:
    """2 comparisons x 45 prompts x 10 seeds, random sides, plus 10 + 10 attention checks."""
    rng = np.random.default_rng(seed)
    rows = []
    for comp in COMPARISONS:
        a, b = comp.split(" vs ")
        for p in range(45):
            for s in range(10):
                left, right = (a, b) if rng.integers(2) else (b, a)
                rows.append({"comparison": comp, "kind": "main", "prompt_id": p, "prompt": f"prompt {p}", "seed": s,
                             "left_method": left, "right_method": right, "expected": ""})
    for i in range(20):
        kind = "identical" if i < 10 else "degraded"
        rows.append({"comparison": f"check: {kind}", "kind": kind, "prompt_id": i, "prompt": f"prompt {i}",
                     "seed": 100 + i, "left_method": "DDPO@180", "right_method": "DDPO@180",
                     "expected": "tie" if kind == "identical" else ("left", "right")[i % 2]})
    df = pd.DataFrame(rows)
    df["pair_id"] = [f"{i:016x}" for i in range(len(df))]
    df["position"] = rng.permutation(len(df))
    df["left_image"] = [f"{2 * i:016x}" for i in range(len(df))]
    df["right_image"] = [f"{2 * i + 1:016x}" for i in range(len(df))]
    return df[list(PAIR_COLUMNS)]


def rates(pairs: pd.DataFrame, p_prefer: float | dict, n: int, sd: float,
          counts: list[int] | None = None, rater_sd: float | None = None) -> dict[str, tuple[int, int]]:
    """Significant comparisons / comparisons over ``n`` studies, per test; and studies with a
    preference somewhere / studies, by each comparison's own test at 0.05 (the verdict before the study
    family) and by the verdict (Holm over the study's comparisons). ``counts``: main answers per rater
    (default 15 x 40); ``rater_sd`` (default ``sd``) the raters' log-odds spread, ``sd`` the prompts'."""
    counts = [40] * 15 if counts is None else counts
    rater_sd = sd if rater_sd is None else rater_sd
    hits = {"binomial": 0, "mixed model": 0, "mixed model, Wald z": 0, "mixed model not estimable": 0,
            "rater-level": 0}
    study = {"own": 0, "verdict": 0}
    total, mdes, first, sources = 0, [], 0, {}
    for k in range(n):
        resp = simulate_responses(pairs, len(counts), counts, p_prefer, rng_seed=1000 + k, rater_sd=rater_sd,
                                  prompt_sd=sd)
        res = analyze(pairs, resp, bootstrap=0, seed=k)
        for c in res["comparisons"]:
            total += 1
            hits["binomial"] += c["p_binomial"] is not None and c["p_binomial"] < 0.05
            mm = c["mixed_model"]
            hits["mixed model"] += bool(mm["estimable"] and mm["p"] < 0.05)
            hits["mixed model, Wald z"] += bool(mm["estimable"] and mm["p_wald_z"] < 0.05)
            hits["mixed model not estimable"] += not mm["estimable"]
            rl = c.get("rater_level") or {}  # absent before the rater-level guard
            hits["rater-level"] += rl.get("p") is not None and rl["p"] < 0.05
            sources[c["p_source"]] = sources.get(c["p_source"], 0) + 1
            if c["mde_win_rate"] is not None:
                mdes.append(c["mde_win_rate"])
        study["own"] += any(c["p"] is not None and c["p"] < 0.05 for c in res["comparisons"])
        study["verdict"] += any(c["significant"] for c in res["comparisons"])
        first += res["comparisons"][0]["significant"]
    return ({k: (v, total) for k, v in hits.items()} | {f"study {k}": (v, n) for k, v in study.items()}
            | {"first verdict": (first, n), "mde": mdes, "sources": sources,
               "has rater-level": "rater_level" in res["comparisons"][0]})


def _cell(r: dict, k: str) -> str:
    hit, tot = r[k]
    lo, hi = clopper_pearson(hit, tot)
    return f"{hit / tot:.3f} [{lo:.3f}, {hi:.3f}]"


def mde_check(pairs: pd.DataFrame, aa_mdes: list[float], n: int, sd: float, counts: list[int] | None = None,
              design: str = "") -> str:
    """Is the detectable win rate the verdict prints right? Plant the median MDE the A/A studies
    reported in ONE comparison (PCPO@120 vs DDPO@180; the other stays A/A) and measure how often the
    verdict (Holm over both) finds it (the claim: 80%)."""
    q = float(np.median(aa_mdes))
    hit, tot = rates(pairs, {"DDPO@180": 1.0 - q}, n, sd, counts)["first verdict"]
    lo, hi = clopper_pearson(hit, tot)
    if not design:
        design = ", 15 raters x 40 answers"
    return (f"Detectable win rate printed by the verdict (\"detectable at 80% power after Holm over the 2 "
            f"comparisons\"){design}, rater / prompt SD {sd}: median {q:.3f} over the A/A studies (range "
            f"{min(aa_mdes):.3f}-{max(aa_mdes):.3f}); planted at {q:.3f} in one comparison (the other A/A), the "
            f"verdict finds it in {hit / tot:.3f} [{lo:.3f}, {hi:.3f}] of {tot} studies (the claim: 0.80).")


def glmer_ratio(pairs: pd.DataFrame) -> str:
    """Seconds per fit: ours vs R's glmer (same data, same process run), or n/a without R."""
    from pcpo_eval.human.analysis import mixed_model

    resp = simulate_responses(pairs, 15, 40, {"PCPO@120": 0.7}, rng_seed=7)
    d = resp.merge(pairs, on="pair_id")
    d = d[(d.kind == "main") & (d.comparison == COMPARISONS[0]) & (d.choice != "tie")]
    t0 = time.perf_counter()
    reps = 20
    for _ in range(reps):
        mm = mixed_model(d, "PCPO@120")
    ours = (time.perf_counter() - t0) / reps
    chose = ((d.choice == "left") & (d.left_method == "PCPO@120")) | ((d.choice == "right") & (d.right_method == "PCPO@120"))
    side = np.where(d.left_method == "PCPO@120", 0.5, -0.5)
    with tempfile.TemporaryDirectory() as tmp:
        csv = Path(tmp) / "d.csv"
        pd.DataFrame({"y": chose.astype(int), "side": side, "rater": d.rater_id, "prompt": d.prompt_id}).to_csv(csv)
        script = (f"suppressMessages(library(lme4)); d <- read.csv('{csv}'); d$rater <- factor(d$rater); "
                  "d$prompt <- factor(d$prompt); t0 <- proc.time()[[3]]; for (i in 1:20) m <- glmer(y ~ side + "
                  "(1|rater) + (1|prompt), d, family = binomial); cat((proc.time()[[3]] - t0) / 20, "
                  "fixef(m)[[1]], '\\n')")
        try:
            out = subprocess.run(["Rscript", "-e", script], capture_output=True, text=True, timeout=300)
        except (FileNotFoundError, subprocess.TimeoutExpired):
            return f"ours {ours * 1e3:.1f} ms per fit; R glmer n/a (Rscript with lme4 not found)"
    if out.returncode != 0:
        return f"ours {ours * 1e3:.1f} ms per fit; R glmer n/a (Rscript with lme4 not found)"
    r_sec, r_b = map(float, out.stdout.split())
    return (f"ours {ours * 1e3:.1f} ms per fit, R glmer {r_sec * 1e3:.1f} ms (ratio {ours / r_sec:.2f}); "
            f"log-odds of PCPO: ours {mm['log_odds_a']:.6f}, glmer {r_b:.6f}")


def paper_rows(pairs: pd.DataFrame, n: int) -> list[str]:
    """The paper's design, 15 raters x 40 answers: A/A and planted preferences, and the printed MDE."""
    lines = ["## Human study analysis: A/A false positives and power (bench_human)", "",
             f"{n} simulated studies per row; each: 2 comparisons x 450 pairs (45 prompts x 10 seeds), 15 raters x "
             "40 answers (~300 per comparison), 5% ties; alpha 0.05; simulation seeds 1000.. ; exact 95% CIs of the "
             "rates.", "",
             "| planted P(PCPO chosen) | rater / prompt SD (logit) | binomial test: significant | mixed model "
             "(Wald t, df raters - 1): significant | mixed model with a Wald z test instead | "
             "mixed model not estimable | rater-level t test: significant | studies with a preference, each "
             "comparison's verdict p at 0.05 (before Holm) | studies with a preference, the verdict (Holm over "
             "the 2) |", "|---|---|---|---|---|---|---|---|---|"]
    aa_mdes: list[float] = []
    for p, sd in ((0.5, 0.15), (0.5, 0.3), (0.6, 0.3), (0.7, 0.3)):
        r = rates(pairs, p if p == 0.5 else {"PCPO@120": p}, n, sd)
        if p == 0.5 and sd == 0.3:
            aa_mdes = r["mde"]
        label = f"{p} (A/A)" if p == 0.5 else f"{p}"
        rl = _cell(r, "rater-level") if r["has rater-level"] else "n/a"
        lines.append(f"| {label} | {sd} | {_cell(r, 'binomial')} | {_cell(r, 'mixed model')} | "
                     f"{_cell(r, 'mixed model, Wald z')} | {_cell(r, 'mixed model not estimable')} | {rl} | "
                     f"{_cell(r, 'study own')} | {_cell(r, 'study verdict')} |")
    lines += ["", mde_check(pairs, aa_mdes, n, 0.3)]
    lines += ["", f"Mixed-model fit (one comparison, ~280 decisive answers): {glmer_ratio(pairs)}."]
    return lines


#: unequal raters (``per_rater: null`` lets every rater rate every pair): name, main answers per rater,
#: rater log-odds SD, planted P(PCPO chosen) (0.5: A/A); prompt SD 0.3 throughout
RATER_MIXES = (
    ("one rater 600 + 14 x 20", [600] + [20] * 14, 0.3, 0.5),
    ("one rater 600 + 14 x 20", [600] + [20] * 14, 0.6, 0.5),
    ("one rater 600 + 14 x 20", [600] + [20] * 14, 0.3, 0.65),
    ("3 raters 600 + 12 x 20", [600] * 3 + [20] * 12, 0.3, 0.5),
    ("2 raters x 450", [450, 450], 0.3, 0.5),
    ("4 raters x 225", [225] * 4, 0.3, 0.5),
    ("4 raters x 225", [225] * 4, 0.3, 0.7),
)


def rater_mix_rows(pairs: pd.DataFrame, n: int) -> list[str]:
    """A rater who gives most answers, and few raters: A/A false positives, power, what the verdict
    says it could detect."""
    lines = ["## Human study analysis: unequal and few raters (bench_human --part raters)", "",
             f"{n} simulated studies per row; the paper's pairs (2 comparisons x 450); main answers per rater as "
             "listed (a rater rates each pair at most once), 5% ties, prompt log-odds SD 0.3; alpha 0.05; simulation "
             "seeds 1000.. ; exact 95% CIs.", "",
             "| raters (main answers each) | rater SD (logit) | planted P(PCPO chosen) | mixed model: significant | "
             "rater-level t test: significant | studies with a preference, the verdict (Holm over the 2) | "
             "verdict p from (comparisons) | detectable win rate printed (median, range) |",
             "|---|---|---|---|---|---|---|---|"]
    dominant_mdes: list[float] = []
    for name, counts, rsd, p in RATER_MIXES:
        r = rates(pairs, p if p == 0.5 else {"PCPO@120": p}, n, 0.3, counts, rsd)
        if name.startswith("one rater") and rsd == 0.3 and p == 0.5:
            dominant_mdes = r["mde"]
        rl = _cell(r, "rater-level") if r["has rater-level"] else "n/a"
        src = ", ".join(f"{k}: {v}" for k, v in sorted(r["sources"].items()))
        md = (f"{np.median(r['mde']):.3f} ({min(r['mde']):.3f}-{max(r['mde']):.3f}; "
              f"{len(r['mde'])} of {r['study verdict'][1] * 2})" if r["mde"] else "none")
        label = f"{p} (A/A)" if p == 0.5 else f"{p}"
        lines.append(f"| {name} | {rsd} | {label} | {_cell(r, 'mixed model')} | {rl} | {_cell(r, 'study verdict')} | "
                     f"{src} | {md} |")
    if dominant_mdes:
        lines += ["", mde_check(pairs, dominant_mdes, n, 0.3, [600] + [20] * 14, design=", one rater 600 + 14 x 20")]
    return lines


def mde_rows(pairs: pd.DataFrame, n: int) -> list[str]:
    """Only the check of the printed detectable win rate, in both designs (A/A studies, then planted)."""
    lines = ["## Human study analysis: the printed detectable win rate (bench_human --part mde)", ""]
    for counts, design in (([40] * 15, ""), ([600] + [20] * 14, ", one rater 600 + 14 x 20")):
        lines += [mde_check(pairs, rates(pairs, 0.5, n, 0.3, counts)["mde"], n, 0.3, counts, design=design), ""]
    return lines


def interval_counts(pairs: pd.DataFrame, n: int, counts: list[int], q: float, bootstrap: int = 400,
                    seed0: int = 5000) -> dict[str, tuple[int, int]]:
    """Each interval and p the human table prints, over ``n`` simulated studies (rater and prompt SD 0.3) with
    PCPO chosen with probability ``q`` by a typical rater and prompt: A/A (q = 0.5) counts the studies where it
    reads "significant" in some comparison; planted, each comparison's coverage of the population win rate."""
    from pcpo_eval.human.analysis import _population_rate

    truth = _population_rate(q, float(np.hypot(0.3, 0.3)))
    keys = ("verdict", "verdict sentence's interval", "raters' interval", "exact interval (answers)", "mixed model p",
            "mixed model OR interval", "Bradley-Terry Elo interval", "Bradley-Terry, answers resampled")
    hit = dict.fromkeys(keys, 0)
    total = 0
    for k in range(n):
        resp = simulate_responses(pairs, len(counts), counts, 0.5 if q == 0.5 else {"PCPO@120": q},
                                  rng_seed=seed0 + k, rater_sd=0.3, prompt_sd=0.3)
        res = analyze(pairs, resp, bootstrap=bootstrap if q == 0.5 else 0, seed=k)
        cs = res["comparisons"]
        if q == 0.5:  # A/A: anything that reads "significant" in the study
            cis = res["bradley_terry"]["bootstrap"]["elo_ci95"] or {}
            arena = _answers_resampled_bt(pairs, resp, res, bootstrap, k)
            found = {"verdict": any(c["significant"] for c in cs),
                     "verdict sentence's interval": any(not (c["ci95_verdict"][0] <= 0.5 <= c["ci95_verdict"][1])
                                                        for c in cs),
                     "raters' interval": any(not (lo <= 0.5 <= hi) for c in cs
                                             for lo, hi in [c["rater_level"]["ci95"]]),
                     "exact interval (answers)": any(not (c["ci95"][0] <= 0.5 <= c["ci95"][1]) for c in cs),
                     "mixed model p": any(c["mixed_model"]["estimable"] and c["mixed_model"]["p"] < 0.05 for c in cs),
                     "mixed model OR interval": any(c["mixed_model"]["estimable"] and not (
                         c["mixed_model"]["ci95"][0] <= 1 <= c["mixed_model"]["ci95"][1]) for c in cs),
                     "Bradley-Terry Elo interval": any(lo > 1000 or hi < 1000 for m, (lo, hi) in cis.items()
                                                       if m != res["bradley_terry"]["anchor"]),
                     "Bradley-Terry, answers resampled": any(lo > 1000 or hi < 1000 for m, (lo, hi) in arena.items()
                                                             if m != res["bradley_terry"]["anchor"])}
            total += 1
        else:  # coverage of the population win rate of PCPO (its side of each comparison)
            found = dict.fromkeys(keys, 0)
            for c in cs:
                t = truth if c["a"] == "PCPO@120" else 1.0 - truth
                found["verdict sentence's interval"] += c["ci95_verdict"][0] <= t <= c["ci95_verdict"][1]
                found["raters' interval"] += c["rater_level"]["ci95"][0] <= t <= c["rater_level"]["ci95"][1]
                found["exact interval (answers)"] += c["ci95"][0] <= t <= c["ci95"][1]
                total += 1
        for key in keys:
            hit[key] += int(found[key])
    return {key: (hit[key], total) for key in keys}


def looks_rows(pairs: pd.DataFrame, n: int) -> list[str]:
    """Interim looks: A/A studies of 15 raters x 40 whose answers arrive one rater at a time, analysed after
    each rater from the 5th to the 15th; how often some look says "Raters preferred" against the last alone."""
    some = last = 0
    for k in range(n):
        resp = simulate_responses(pairs, 15, 40, 0.5, rng_seed=30000 + k, rater_sd=0.3, prompt_sd=0.3)
        hits = [any(c["significant"] for c in analyze(pairs, resp[resp.rater_id < r], bootstrap=0,
                                                      seed=k)["comparisons"]) for r in range(5, 16)]
        some, last = some + any(hits), last + hits[-1]
    cells = []
    for h in (some, last):
        lo, hi = clopper_pearson(h, n)
        cells.append(f"{h / n:.3f} [{lo:.3f}, {hi:.3f}]")
    return ["## Human study analysis: interim looks (bench_human --part looks)", "",
            f"{n} simulated A/A studies, 15 raters x 40 answers arriving one rater at a time, rater and prompt SD 0.3, "
            "simulation seeds 30000.. ; the verdict after each rater from the 5th to the 15th (11 looks); exact "
            "95% CIs.", "", "| some look says \"Raters preferred\" | the last look (15 raters) alone |", "|---|---|",
            f"| {cells[0]} | {cells[1]} |"]


def _answers_resampled_bt(pairs: pd.DataFrame, resp: pd.DataFrame, res: dict, bootstrap: int,
                          seed: int) -> dict[str, list[float]]:
    """The Elo intervals of the same answers with every answer resampled alone (Chatbot Arena's bootstrap,
    the analysis' before it resampled raters): the main answers the analysis used, refitted."""
    from pcpo_eval.human.analysis import bradley_terry

    excluded = [r["rater_id"] for r in res["attention_checks"]["excluded"]]
    main = resp.merge(pairs, on="pair_id")
    main = main[(main.kind == "main") & ~main.rater_id.isin(excluded)]
    fit = bradley_terry(main, bootstrap, seed, by_raters=False) or {}
    return (fit.get("bootstrap") or {}).get("elo_ci95") or {}


INTERVAL_DESIGNS = (("15 raters x 40", [40] * 15), ("one rater 600 + 14 x 20", [600] + [20] * 14))


def interval_rows(pairs: pd.DataFrame, n: int) -> list[str]:
    """What each printed interval claims, checked: A/A studies where it reads significant, coverage at 0.6."""
    lines = ["## Human study analysis: the printed intervals (bench_human --part ci)", "",
             f"{n} simulated studies per row, the paper's pairs (2 comparisons x 450), rater and prompt log-odds SD "
             "0.3, 5% ties, simulation seeds 5000.. ; A/A rows: share of studies in which the statistic reads "
             "significant in some comparison (Bradley-Terry: 400 bootstrap resamples, an Elo interval excluding the "
             "anchor's 1000); planted rows: P(PCPO chosen) 0.6 for a typical rater and prompt, share of comparisons "
             "whose interval covers the population win rate (0.596); exact 95% CIs.", "",
             "| design | planted | verdict | verdict sentence's interval (hull of the next two) | raters' t interval | "
             "exact interval (answers) | mixed model p | mixed model OR interval | Bradley-Terry Elo interval (raters "
             "resampled) | Bradley-Terry, answers resampled (Chatbot Arena; before) |",
             "|---|---|---|---|---|---|---|---|---|---|"]
    for name, counts in INTERVAL_DESIGNS:
        for q in (0.5, 0.6):
            r = interval_counts(pairs, n, counts, q)
            intervals = ("verdict sentence's interval", "raters' interval", "exact interval (answers)")
            cells = [_cell(r, k) if (q == 0.5 or k in intervals) else "-"
                     for k in ("verdict", *intervals, "mixed model p", "mixed model OR interval",
                               "Bradley-Terry Elo interval", "Bradley-Terry, answers resampled")]
            lines.append(f"| {name} | {'0.5 (A/A)' if q == 0.5 else 'coverage at 0.6'} | " + " | ".join(cells) + " |")
    return lines


def main(n: int, part: str = "all") -> None:
    pairs = paper_pairs()
    t0 = time.perf_counter()
    lines = []
    if part in ("all", "paper"):
        lines += paper_rows(pairs, n) + [""]
    if part in ("all", "raters"):
        lines += rater_mix_rows(pairs, n) + [""]
    if part == "mde":
        lines += mde_rows(pairs, n)
    if part == "ci":
        lines += interval_rows(pairs, n)
    if part == "looks":
        lines += looks_rows(pairs, n)
    cmd = f"python benchmarks/bench_human.py {n}" + ("" if part == "all" else f" --part {part}")
    lines += [f"Command: `{cmd}` ({time.perf_counter() - t0:.0f} s)."]
    print("\n".join(lines))


if __name__ == "__main__":
    import argparse

    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("n", nargs="?", type=int, default=300, help="simulated studies per row")
    ap.add_argument("--part", choices=("all", "paper", "raters", "mde", "ci", "looks"), default="all")
    a = ap.parse_args()
    main(a.n, a.part)
