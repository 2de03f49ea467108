"""Per-study false positives of the study's image-metric comparisons, on real toy runs and synthetic draws.

What is checked: every PCPO-vs-baseline comparison the report prints besides the run-level verdict
(calibrated in ``bench_verdict_calibration.py``): the LMM algorithm term per metric (Holm across
metrics), the bold simple effects of the raw-score table (in a one-cell study the same model and the
same family as the LMM rows) and the overall-only Welch rows, at matched reward and at matched epoch.
A study is a false positive when ANY of those rows is significant.

Pool (real runs): ONE algorithm (DDPO's ``ppo_clip``) trained with 14 seeds in the demo regime cut to
12 epochs without the paired control (``benchmarks/lmm_pool.yaml``), selected, generated and scored
by the study's own stages::

    OMP_NUM_THREADS=1 .venv/bin/python -m pcpo_eval study benchmarks/lmm_pool.yaml --out /tmp/lmm_pool \\
        --stages train,select,generate,metrics

Per-image scores: ``toy_aesthetic`` and ``toy_alignment`` of every eval image (the toy world has no
catalogue preference metric; these are its per-image reward scores), fitted with ``(1|image)`` as the
study fits preference scores. ``lpips_toy`` is the per-prompt metric, ``fd_toy`` / ``is_toy`` the
overall-only ones (Welch).

Resampling: ``--studies`` A/A studies of k vs k runs drawn without replacement from the pool; each
LMM row is fitted as :func:`pcpo_eval.study.image_metrics._simple_effect` fits it and tested three ways:
lmerTest's Satterthwaite df (``old``, the study before the boundary rule), the df capped at the run
level (``new``: runs - 2, the containment df; a candidate, not adopted) and the study's rule now
(:func:`pcpo_eval.stats.boundary.run_level_at_boundary`: the run means' t when the run variance is
estimated at 0); the overall-only rows by :func:`pcpo_eval.study.image_metrics.overall_effects`'s Welch
test. "As the study reports now" is one Holm family over every row of both comparisons
(:func:`pcpo_eval.study.image_metrics.arm_family`; in this one-cell study the LMM tables' algorithm terms
are the same tests as the rows). ``--check N`` (default 2) runs the first N studies through
``fit_metric_lmms``, ``_simple_effect``, ``same_tests``, ``lmm_study_family`` and ``arm_family``
themselves and fails on any difference in p or in the decision. ``--plant D`` adds D residual SDs of each metric to
arm B (power). ``--synthetic N``: N draws from the variance components estimated on the whole pool.

Usage::

    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lmm_calibration.py /tmp/lmm_pool --k 3 --studies 100
    OMP_NUM_THREADS=1 .venv/bin/python benchmarks/bench_lmm_calibration.py /tmp/lmm_pool --synthetic 200 --k 3
"""

from __future__ import annotations

import argparse
import json
import sys
from pathlib import Path

import numpy as np
import pandas as pd
from scipy import stats

ROOT = Path(__file__).resolve().parents[1]
sys.path.insert(0, str(ROOT))

PER_PROMPT = ("lpips_toy",)
PER_IMAGE = ("toy_aesthetic", "toy_alignment")
OVERALL = ("fd_toy", "is_toy")
ALPHA = 0.05


def clopper_pearson(k: int, n: int) -> tuple[float, float]:
    """95% Clopper-Pearson interval of a binomial rate."""
    lo = float(stats.beta.ppf(0.025, k, n - k + 1)) if k else 0.0
    hi = float(stats.beta.ppf(0.975, k + 1, n - k)) if k < n else 1.0
    return lo, hi


def image_scores(layout, rows) -> pd.DataFrame:
    """toy_aesthetic / toy_alignment of every image of the selected sets (run, prompt, image, scores)."""
    from pcpo_eval.imageset import ImageSet
    from pcpo_eval.rewards.toy import toy_aesthetic, toy_alignment
    from pcpo_eval.studydir import set_label

    aest, align = toy_aesthetic(), toy_alignment()
    frames = []
    for c in rows:
        s = ImageSet.load(layout.set_dir(set_label(c["name"], c["epoch"])))
        m = s.manifest
        imgs = s.read_batch(list(range(len(s))))
        prompts = m["prompt"].tolist()
        pid, seed = m["prompt_id"].astype(int), m["seed"].astype(int)
        frames.append(pd.DataFrame({
            "run": c["name"], "prompt": [f"p{i}" for i in pid],
            "image": [f"p{i}s{k}" for i, k in zip(pid, seed, strict=True)],
            "toy_aesthetic": aest(imgs, prompts).numpy().astype(float),
            "toy_alignment": align(imgs, prompts).numpy().astype(float)}))
    return pd.concat(frames, ignore_index=True)


def load_pool(pool: Path) -> dict[str, dict]:
    """Per comparison (reward, epoch): per-prompt rows, per-image rows, overall values per run."""
    from pcpo_eval.study.image_metrics import overall_values, per_prompt_frame
    from pcpo_eval.study.spec import load_spec
    from pcpo_eval.studydir import StudyLayout

    cache = pool / "lmm_calibration_pool.pkl"
    if cache.is_file():
        return pd.read_pickle(cache)
    sp = load_spec(pool / "study.yaml", check_weights=False)
    layout = StudyLayout(pool)
    out = {}
    for match in ("reward", "epoch"):
        rows = layout.matched(match)
        out[match] = {"prompt": per_prompt_frame(sp, layout, rows), "image": image_scores(layout, rows),
                      "overall": overall_values(sp, layout, rows), "epochs": {c["name"]: c["epoch"] for c in rows}}
    pd.to_pickle(out, cache)
    return out


def _fit_p(data: pd.DataFrame, metric: str, groups: list[str]) -> tuple[float, float, float, float, bool]:
    """(p with lmerTest's df, p with the df capped at the run level, lmerTest df, p as the study tests
    it now, whether the study's boundary rule applied) of the algorithm term.

    The study's p: the fit of ``results._simple_effect`` (``fit_lmm(..., coding="treatment",
    diagnostics=False)``) then :func:`pcpo_eval.stats.boundary.run_level_at_boundary` (the run means'
    t with runs - 2 df when the run variance is estimated at 0), as ``_simple_effect`` and
    ``fit_metric_lmms`` call it (``--check`` runs those functions themselves and compares)."""
    from pcpo_eval.stats import fit_lmm
    from pcpo_eval.stats.boundary import run_level_at_boundary

    dm = data.assign(value=data[metric].astype(float))
    f = fit_lmm(dm, "value ~ algorithm", groups, coding="treatment", diagnostics=False)
    fe = f.term("algorithm[T.B]")
    if not f.estimable:
        return np.nan, np.nan, fe.df, np.nan, False
    cap = data["run"].nunique() - 2  # the between-run (containment) df of the algorithm term
    g = run_level_at_boundary(f, dm, "value ~ algorithm", groups, "treatment")
    return fe.p, float(2 * stats.t.sf(abs(fe.t), min(fe.df, cap))), fe.df, g.term("algorithm[T.B]").p, g is not f


def holm_any(ps: list[float]) -> bool:
    """Any Holm-adjusted p < ALPHA among the finite ps."""
    from pcpo_eval.stats.adjust import holm

    ps = [p for p in ps if np.isfinite(p)]
    return bool(ps) and bool(np.any(holm(np.array(ps)) < ALPHA))


def analyse(comp: dict, runs_a: list[str], runs_b: list[str], plant: float = 0.0) -> dict[str, bool]:
    """One A/A study at one comparison: any significant LMM/bold row (old, new df), any Welch row;
    the LMM rows' ps by lmerTest's rule (``p_all``, before the boundary rule) and by the study's rule
    now (``p_study``: LMM rows then Welch rows), and how many fits hit the boundary rule."""
    lab = {r: "A" for r in runs_a} | {r: "B" for r in runs_b}
    p_old, p_new, p_st, boundary = [], [], [], 0
    for kind, metrics, groups in (("prompt", PER_PROMPT, ["prompt", "run"]),
                                  ("image", PER_IMAGE, ["prompt", "image", "run"])):
        d = comp[kind][comp[kind]["run"].isin(lab)].copy()
        d["algorithm"] = d["run"].map(lab)
        for m in metrics:
            if plant:
                d.loc[d["algorithm"] == "B", m] += plant * comp.get("sd", {}).get(m, 0.0)
            po, pn, _, ps, hit = _fit_p(d, m, groups)
            p_old.append(po)
            p_new.append(pn)
            p_st.append(ps)
            boundary += hit
    welch = []
    for m in OVERALL:
        a = [comp["overall"][r][m] for r in runs_a if m in comp["overall"][r]]
        b = [comp["overall"][r][m] for r in runs_b if m in comp["overall"][r]]
        welch.append(float(stats.ttest_ind(b, a, equal_var=False).pvalue) if len(a) > 1 and len(b) > 1 else np.nan)
    return {"lmm_old": holm_any(p_old), "lmm_new": holm_any(p_new), "lmm_study": holm_any(p_st),
            "welch": holm_any(welch), "p_all": p_old + welch, "p_study": p_st + welch, "boundary": boundary,
            "row_old": [p < ALPHA for p in p_old if np.isfinite(p)], "row_new": [p < ALPHA for p in p_new if np.isfinite(p)],
            "row_study": [p < ALPHA for p in p_st if np.isfinite(p)],
            "row_welch": [p < ALPHA for p in welch if np.isfinite(p)]}


def study_path_check(sp, comp_by_match: dict, runs_a: list[str], runs_b: list[str], per: list[dict]) -> str:
    """The same A/A study through the study's own functions: ``fit_metric_lmms`` (LMM tables, with the
    boundary rule), ``_simple_effect`` (raw-score rows), ``same_tests``, ``lmm_study_family`` and
    ``arm_family`` (one family per study); Welch rows as :func:`analyse` computes them. Raises when a
    p or the per-study decision differs from :func:`analyse`'s ``p_study`` / one-family decision."""
    from pcpo_eval.study.image_metrics import (
        _simple_effect,
        _suffixed,
        arm_family,
        fit_metric_lmms,
        lmm_setup,
        lmm_study_family,
        same_tests,
    )

    lab = {r: "A" for r in runs_a} | {r: "B" for r in runs_b}
    significance, adjusted, same = {}, {}, {}
    for match, suffix, pr in (("reward", "", per[0]), ("epoch", " @ epoch 12", per[1])):
        comp, frames, rows = comp_by_match[match], {}, {}
        for kind, metrics, groups in (("prompt", PER_PROMPT, ["prompt"]), ("image", PER_IMAGE, ["prompt", "image"])):
            d = comp[kind][comp[kind]["run"].isin(lab)].copy()
            d["algorithm"] = d["run"].map(lab)
            setup = lmm_setup("value ~ algorithm", groups, None, len(runs_a))
            for m in metrics:
                frames[m] = (d, setup)
                rows[m] = _simple_effect(sp, d, m, setup)[1]
        fits, adj = fit_metric_lmms(frames, "treatment")
        ours = pr["p_study"][:len(frames)]
        for i, m in enumerate(frames):
            for got in (rows[m]["p"], adj[m]["algorithm[T.B]"]["p"]):
                if not np.isclose(got, ours[i], rtol=1e-6, atol=1e-12):
                    raise AssertionError(f"{match} {m}: study path p {got} != benchmark p {ours[i]}")
        for i, m in enumerate(OVERALL):
            p = pr["p_study"][len(frames) + i]
            rows[m] = {"p": p, "estimable": bool(np.isfinite(p))}
        sig = {"": rows}
        same |= same_tests(sig, adj, fits, "algorithm", suffix)
        significance |= _suffixed(sig, suffix)
        adjusted |= _suffixed(adj, suffix)
    significance, adjusted = arm_family(significance, lmm_study_family(adjusted), "algorithm", same, "holm", ALPHA)
    any_sig = (any(r.get("significant") for per_c in significance.values() for r in per_c.values())
               or any(v.get("p_holm") is not None and v["p_holm"] < ALPHA
                      for terms in adjusted.values() for t, v in terms.items() if t.startswith("algorithm[")))
    ours = holm_any([q for p in per for q in p["p_study"]])
    n_family = next(iter(next(iter(significance.values())).values())).get("family_size")
    if any_sig != ours:
        raise AssertionError(f"study path decision {any_sig} != benchmark decision {ours}")
    return f"ok: same ps, same decision ({any_sig}), family size {n_family}, {len(same)} LMM entries counted once"


def resample(pool: dict, k: int, n_studies: int, seed: int, plant: float, sp=None,
             check: int = 0) -> dict[str, list[bool]]:
    """n_studies A/A studies of k vs k runs; per study: any significant row (both comparisons).
    The first ``check`` studies are also run through the study's own functions (:func:`study_path_check`)."""
    rng = np.random.default_rng(seed)
    runs = sorted(set(pool["reward"]["prompt"]["run"]) & set(pool["epoch"]["prompt"]["run"]))
    res: dict[str, list] = {"old": [], "new": [], "welch": [], "any_old": [], "any_new": [], "rows_old": [],
                            "rows_new": [], "rows_welch": [], "one_family": [], "per_comparison": [], "fixed": [],
                            "rows_study": [], "fixed_study": [], "now": [], "boundary_fits": [], "flipped": []}
    for i in range(n_studies):
        pick = rng.choice(runs, size=2 * k, replace=False).tolist()
        per = [analyse(pool[m], pick[:k], pick[k:], plant) for m in ("reward", "epoch")]
        if i < check and plant == 0:  # the study path reads the pool's (unplanted) scores
            print(f"[check study {i}] {study_path_check(sp, pool, pick[:k], pick[k:], per)}", flush=True)
        res["old"].append(any(p["lmm_old"] for p in per))
        res["new"].append(any(p["lmm_new"] for p in per))
        res["welch"].append(any(p["welch"] for p in per))
        res["any_old"].append(res["old"][-1] or res["welch"][-1])
        res["any_new"].append(res["new"][-1] or res["welch"][-1])
        res["rows_old"] += [r for p in per for r in p["row_old"]]
        res["rows_new"] += [r for p in per for r in p["row_new"]]
        res["rows_welch"] += [r for p in per for r in p["row_welch"]]
        res["rows_study"] += [r for p in per for r in p["row_study"]]
        # before the boundary rule (lmerTest's p): one Holm family over the study's rows, which is
        # what arm_family makes of a one-cell study (its LMM terms are the same tests as the rows)
        res["one_family"].append(holm_any([q for p in per for q in p["p_all"]]))
        # two families (bold; LMM tables per term over both comparisons), as before arm_family
        n_lmm = len(PER_PROMPT) + len(PER_IMAGE)
        p_lmm = [q for p in per for q in p["p_all"][:n_lmm]]
        res["fixed"].append(holm_any([q for p in per for q in p["p_all"]]) or holm_any(p_lmm))
        p_lmm_st = [q for p in per for q in p["p_study"][:n_lmm]]
        res["fixed_study"].append(holm_any([q for p in per for q in p["p_study"]]) or holm_any(p_lmm_st))
        # the study now: one family (arm_family) with the LMM rows tested by the boundary rule
        res["now"].append(holm_any([q for p in per for q in p["p_study"]]))
        res["boundary_fits"].append(sum(p["boundary"] for p in per))
        res["flipped"].append(res["now"][-1] != res["one_family"][-1])
        res["per_comparison"] += [p["lmm_old"] or p["welch"] for p in per]
        if (i + 1) % 10 == 0:
            print(f"[progress] {i + 1}/{n_studies} studies; now {sum(res['now'])}, before {sum(res['one_family'])}, "
                  f"boundary fits {sum(res['boundary_fits'])}", flush=True)
    return res


def components(pool: dict) -> dict[str, dict[str, dict[str, float]]]:
    """Variance components (SDs) of each metric fitted on all runs of the pool (one arm)."""
    from pcpo_eval.stats import fit_lmm

    out: dict[str, dict[str, dict[str, float]]] = {}
    for match, comp in pool.items():
        out[match] = {}
        for kind, metrics, groups in (("prompt", PER_PROMPT, ["prompt", "run"]),
                                      ("image", PER_IMAGE, ["prompt", "image", "run"])):
            for m in metrics:
                f = fit_lmm(comp[kind].assign(value=comp[kind][m].astype(float)), "value ~ 1", groups,
                            diagnostics=False)
                out[match][m] = dict(f.random_sd) | {"singular": float(f.singular)}
    return out


def synthetic(sd: dict[str, float], kind: str, k: int, n_prompts: int, n_seeds: int, n: int, seed: int,
              plant: float = 0.0) -> dict[str, list[bool]]:
    """n draws of one metric's rows with the pool's SDs (run, prompt, image, residual); k vs k runs."""
    rng = np.random.default_rng(seed)
    groups = ["prompt", "run"] + (["image"] if kind == "image" else [])
    prompts = np.repeat(np.arange(n_prompts), n_seeds if kind == "image" else 1)
    images = np.arange(prompts.size)
    out: dict[str, list] = {"old": [], "new": [], "singular": [], "df_old": []}
    for _ in range(n):
        pe, ie = rng.normal(0, sd["prompt"], n_prompts), rng.normal(0, sd.get("image", 0.0), images.size)
        frames = []
        for arm in ("A", "B"):
            for r in range(k):
                v = (pe[prompts] + ie + rng.normal(0, sd["run"]) + rng.normal(0, sd["Residual"], images.size)
                     + (plant * sd["Residual"] if arm == "B" else 0.0))
                frames.append(pd.DataFrame({"algorithm": arm, "run": f"{arm}{r}", "prompt": [f"p{i}" for i in prompts],
                                            "image": [f"i{i}" for i in images], "v": v}))
        d = pd.concat(frames, ignore_index=True)
        po, pn, dfo = _fit_p(d, "v", groups)
        out["old"].append(po < ALPHA)
        out["new"].append(pn < ALPHA)
        out["df_old"].append(dfo)
    return out


def analytic(k: int, n_prompts: int, n_seeds: int, n: int, seed: int) -> list[str]:
    """Per-row A/A rate of the algorithm term in the balanced Gaussian model, from mean squares.

    Rows per (run, image), k runs per arm, ``n_prompts`` x ``n_seeds`` images shared by all runs;
    components run (tau), run x prompt (unmodelled by the study's fit, lambda) and residual (1).
    The REML fit of ``(1|prompt) + (1|image) + (1|run)`` on balanced data is the ANOVA fit: with
    MS_run > MS_res the algorithm t has SE^2 = 2 MS_run / (k P S) and df 2k - 2 (exact); otherwise
    the run variance is 0 (singular) and t uses the pooled residual with the residual df (lmerTest)
    or, as a candidate fix, df 2k - 2. ``n`` draws of the sufficient statistics per setting.
    """
    rng = np.random.default_rng(seed)
    p, s = n_prompts, n_seeds
    dfr, dfrp, dfe = 2 * k - 2, (2 * k - 1) * (p - 1), (2 * k - 1) * p * (s - 1)
    lines = []
    for lam in (0.0, 1.0, 4.0):
        for rho in (0.0, 0.25, 1.0, 2.0, 4.0):  # rho = P S tau^2 / sigma^2
            e_run = 1 + s * lam + rho
            z = rng.standard_normal(n)
            ss_run, ss_rp, ss_e = (e_run * rng.chisquare(dfr, n), (1 + s * lam) * rng.chisquare(dfrp, n),
                                   rng.chisquare(dfe, n))
            diff = z * np.sqrt(2 * e_run / (k * p * s))
            ms_run, ms_res = ss_run / dfr, (ss_rp + ss_e) / (dfrp + dfe)
            sing = ms_run <= ms_res
            t_ns = np.abs(diff) / np.sqrt(2 * ms_run / (k * p * s))
            t_s = np.abs(diff) / np.sqrt(2 * (ss_run + ss_rp + ss_e) / (dfr + dfrp + dfe) / (k * p * s))
            rej_ns = t_ns > stats.t.ppf(0.975, dfr)
            old = np.where(sing, t_s > stats.t.ppf(0.975, dfr + dfrp + dfe), rej_ns).mean()
            cap = np.where(sing, t_s > stats.t.ppf(0.975, dfr), rej_ns).mean()
            lines.append(f"[analytic k={k} P={p} S={s} lambda={lam:g} rho={rho:g}] singular {sing.mean():.2f}; "
                         f"p<0.05 lmerTest df {100 * old:.2f}%, df capped {100 * cap:.2f}% ({n} draws)")
    return lines


def _rate(xs: list[bool]) -> str:
    k, n = int(np.sum(xs)), len(xs)
    lo, hi = clopper_pearson(k, n)
    return f"{k}/{n} = {100 * k / max(n, 1):.1f}% [{100 * lo:.1f}, {100 * hi:.1f}]"


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n\n")[0])
    ap.add_argument("pool", type=Path, nargs="?", help="the pool study directory (benchmarks/lmm_pool.yaml, 4 stages run)")
    ap.add_argument("--k", type=int, default=3, help="runs per arm")
    ap.add_argument("--studies", type=int, default=0, help="A/A studies resampled from the real pool")
    ap.add_argument("--plant", type=float, default=0.0, help="effect added to arm B, in residual SDs of each metric")
    ap.add_argument("--synthetic", type=int, default=0, help="draws per metric from the pool's variance components")
    ap.add_argument("--seed", type=int, default=20261127)
    ap.add_argument("--components", action="store_true", help="print the pool's variance components")
    ap.add_argument("--analytic", type=int, default=0, help="draws of the balanced-model mean squares per setting")
    ap.add_argument("--check", type=int, default=2,
                    help="the first N studies also through the study's own functions (fit_metric_lmms, "
                         "_simple_effect, arm_family); fails on any difference (A/A only: not with --plant)")
    a = ap.parse_args()
    if a.analytic:
        for k in (3, 5):
            print("\n".join(analytic(k, 16, 4, a.analytic, a.seed)))
    if a.pool is None:
        return
    pool = load_pool(a.pool)
    comps_file = a.pool / "lmm_calibration_components.json"
    if a.components or a.synthetic or a.plant:
        if not comps_file.is_file():
            comps_file.write_text(json.dumps(components(pool), indent=1))
        comps = json.loads(comps_file.read_text())
        for match in pool:
            pool[match]["sd"] = {m: v["Residual"] for m, v in comps[match].items()}
        if a.components:
            print(json.dumps(comps, indent=1))
    if a.studies:
        from pcpo_eval.study.spec import load_spec

        sp = load_spec(a.pool / "study.yaml", check_weights=False)
        r = resample(pool, a.k, a.studies, a.seed, a.plant, sp, a.check)
        tag = f"k={a.k} plant={a.plant:g} seed={a.seed}"
        print(f"[real pool {tag}] any LMM/bold row, Satterthwaite (old): {_rate(r['old'])}")
        print(f"[real pool {tag}] any LMM/bold row, df capped at run level (new): {_rate(r['new'])}")
        print(f"[real pool {tag}] any overall-only Welch row: {_rate(r['welch'])}")
        print(f"[real pool {tag}] any row of the study, old: {_rate(r['any_old'])}; new: {_rate(r['any_new'])}")
        print(f"[real pool {tag}] per LMM row (unadjusted p<0.05), old: {_rate(r['rows_old'])}; new: {_rate(r['rows_new'])}")
        print(f"[real pool {tag}] per Welch row (unadjusted p<0.05): {_rate(r['rows_welch'])}")
        print(f"[real pool {tag}] any row of one comparison (its LMM + Welch families): {_rate(r['per_comparison'])}")
        print(f"[real pool {tag}] any row, one Holm family over the study's rows: {_rate(r['one_family'])}")
        print(f"[real pool {tag}] any row, bold family + LMM family per term (two families, before arm_family), "
              f"lmerTest p: {_rate(r['fixed'])}; boundary rule: {_rate(r['fixed_study'])}")
        print(f"[real pool {tag}] per LMM row (unadjusted p<0.05), study's boundary rule: {_rate(r['rows_study'])}")
        nb = np.asarray(r["boundary_fits"])
        print(f"[real pool {tag}] LMM fits at run variance 0 (boundary rule applied): {int(nb.sum())} of "
              f"{len(r['rows_study'])}; studies with >= 1: {_rate(list(nb > 0))}; decision changed vs lmerTest p: "
              f"{_rate(r['flipped'])}")
        print(f"[real pool {tag}] AS THE STUDY REPORTS NOW (one family, arm_family; boundary rule): {_rate(r['now'])}; "
              f"same family with lmerTest p (before the boundary rule): {_rate(r['one_family'])}")
    if a.synthetic:
        meta = pool["epoch"]
        n_prompts = meta["prompt"]["prompt"].nunique()
        n_seeds = len(meta["image"]) // meta["image"]["run"].nunique() // n_prompts
        for match, per in comps.items():
            for m, sd in per.items():
                kind = "image" if m in PER_IMAGE else "prompt"
                r = synthetic(sd, kind, a.k, n_prompts, n_seeds, a.synthetic, a.seed, a.plant)
                print(f"[synthetic {match} {m} k={a.k} plant={a.plant:g} seed={a.seed}] per-row p<0.05 old: "
                      f"{_rate(r['old'])}; new: {_rate(r['new'])}; median lmerTest df {np.median(r['df_old']):.0f}")


if __name__ == "__main__":
    main()
