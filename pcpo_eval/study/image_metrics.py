"""Image metrics of the study's arms: raw scores with significance, and the LMM tables (paper Tables 2-4).

At **matched reward** (each run's reward-matched checkpoint; runs that never reached ``select_target``
have none and are left out) and at **matched epoch** (every run at ``selection.json``'s ``epoch``):

* raw scores (Table 2): overall metrics per condition, mean +- SD over runs;
* per-prompt metrics: the spec's LMM per metric (Tables 3-4) on one row per (run, prompt);
  per-image metrics (preference / reward scores) on one row per (run, image) with the image's
  initial noise as a further random intercept ``(1|image)`` (:func:`per_image_frame`).
  With >= 2 runs per arm in every cell the random intercept ``(1|run)`` is added (crossed with
  ``(1|prompt)``), so the algorithm effect is tested against the between-run variation (on the
  run means when the run variance is estimated at 0: :mod:`pcpo_eval.stats.boundary`); with 1
  run per arm the fit is reported but marked not estimable ("1 run per arm: these are
  differences between runs"), p null. Holm (or BH) across metrics per fixed term, one family
  per term over both comparisons (:func:`lmm_study_family`);
* significance of PCPO vs baseline within a cell: the simple effect ``value ~ <factor> +
  (1|prompt) [+ (1|run)]`` on that cell's per-prompt scores; for ``overall_only`` metrics
  (undefined per prompt, e.g. FD of 4 images in 128-d) a Welch t interval over the runs'
  overall values (:func:`pcpo_eval.stats.runlevel.compare_runs`); bold = Holm (or BH) in one
  family over every cell, comparison and metric of the table and the LMM terms of the compared
  factor (:func:`arm_family`), never where it contradicts its own cell's values
  (:func:`_unbold_conflicts`); every row's ``mde`` at its family's level (:func:`family_mdes`).

:func:`image_metrics` returns results.json's ``raw_scores`` and ``lmm``.
"""

from __future__ import annotations

import dataclasses
import json
from pathlib import Path
from typing import Any, NamedTuple

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.metrics.base import METRIC_LABELS, METRICS
from pcpo_eval.metricsdir import metrics_path, per_image_path, per_prompt_path
from pcpo_eval.stats.design import IMAGE_COLUMN
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import StudyLayout, set_label

#: why the algorithm terms of an LMM on 1 run per arm have no p-value
ONE_RUN_LMM = ("1 run per arm: these are differences between runs, not algorithms; train >= 2 seeds per arm "
               "(seeds: [0, 1, 2])")  # fmt: skip


def metrics_json(path: Path) -> dict[str, Any]:
    """A metrics folder's ``metrics.json``; a missing one is an ``error:`` naming the stage to run."""
    if not path.is_file():
        raise UserError(f"{path} missing; run the metrics stage first")
    return json.loads(path.read_text())


def _error(exc: Exception) -> str:
    return str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"


# ------------------------------------------------------------------------------------------------
# per-prompt data and LMMs
# ------------------------------------------------------------------------------------------------


def per_prompt_frame(sp: StudySpec, layout: StudyLayout, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (run, prompt) of the selected sets: run, seed, factor levels, prompt, metric columns."""
    frames = []
    by_name = {r.name: r for r in sp.runs}
    for c in rows:
        pp = pd.read_parquet(per_prompt_path(layout.metrics_dir(set_label(c["name"], c["epoch"]))))
        run = by_name[c["name"]]
        df = pd.DataFrame({"run": run.name, "seed": str(run.seed), "prompt_id": pp["prompt_id"].astype(int),
                           "prompt": [f"p{int(i)}" for i in pp["prompt_id"]]})
        for f, lv in run.levels.items():
            df[f] = str(lv)
        for m in sp.per_prompt_metrics:
            if m in pp.columns:
                df[m] = pp[m].astype(float).to_numpy()
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def per_image_metrics(sp: StudySpec) -> tuple[str, ...]:
    """LMM metrics with one value per image (preference / reward scores: catalogue kind ``reward``);
    the others (LPIPS diversity, FD, IS) are defined per prompt at most."""
    return tuple(m for m in sp.per_prompt_metrics if METRICS[m].is_preference)


def per_image_frame(sp: StudySpec, layout: StudyLayout, rows: list[dict[str, Any]]) -> pd.DataFrame:
    """One row per (run, image) of the selected sets, from each set's ``per_image.parquet``.

    Columns: run, seed (the training seed), prompt, ``image`` (the initial noise: generation seeds
    are keyed by (prompt id, seed) in :func:`pcpo_eval.seeding.sample_generator`, so the images of
    all runs with the same prompt and seed share x_T, and one seed across prompts shares nothing),
    factor levels, the per-image metric columns.
    """
    frames = []
    by_name = {r.name: r for r in sp.runs}
    metrics = per_image_metrics(sp)
    for c in rows:
        pi = pd.read_parquet(per_image_path(layout.metrics_dir(set_label(c["name"], c["epoch"]))))
        run = by_name[c["name"]]
        pid, iseed = pi["prompt_id"].astype(int), pi["seed"].astype(int)
        df = pd.DataFrame({"run": run.name, "seed": str(run.seed), "prompt_id": pid,
                           "prompt": [f"p{i}" for i in pid],
                           IMAGE_COLUMN: [f"p{i}s{k}" for i, k in zip(pid, iseed, strict=True)]})
        for f, lv in run.levels.items():
            df[f] = str(lv)
        for m in metrics:
            if m in pi.columns:
                df[m] = pi[m].astype(float).to_numpy()
        frames.append(df)
    return pd.concat(frames, ignore_index=True) if frames else pd.DataFrame()


def per_image_groups(groups: list[str]) -> list[str]:
    """The spec's groupings plus ``(1|image)`` (the shared initial noise) for per-image rows."""
    return [*groups, IMAGE_COLUMN] if IMAGE_COLUMN not in groups else list(groups)


def runs_per_arm(sp: StudySpec, data: pd.DataFrame) -> int:
    """The fewest runs of any (cell, compared level) in ``data`` (0 when empty)."""
    if data.empty:
        return 0
    cells = data[sp.cell_factors].astype(str).agg("|".join, axis=1) if sp.cell_factors else pd.Series("", data.index)
    return int(data.assign(_cell=cells).groupby(["_cell", sp.compare_factor])["run"].nunique().min())


class LMMSetup(NamedTuple):
    """How an LMM is fitted: fixed part, groupings, slopes, the lme4 formula, a forced not-estimable reason."""

    fixed: str
    groups: list[str]
    re_formula: str | None
    formula: str
    not_estimable: str | None


def lmm_setup(fixed: str, groups: list[str], re_formula: str | None, n_runs: int) -> LMMSetup:
    """Add ``(1|run)`` with >= 2 runs per arm; with 1 run per arm the algorithm terms are not estimable."""
    groups = list(groups)
    reason = None
    if n_runs < 2:
        reason = ONE_RUN_LMM
    elif "run" not in groups:
        if re_formula is None:
            groups.append("run")
        else:
            reason = ("random slopes take a single grouping, so (1|run) could not be added and the algorithm "
                      "effect would be tested against prompts, not runs; use random intercepts only")
    slopes = f"({re_formula.lstrip('~')}|{groups[0]})" if re_formula else None
    terms = [slopes] if slopes else [f"(1|{g})" for g in groups]
    return LMMSetup(fixed, groups, re_formula, " + ".join([fixed, *terms]), reason)


def fit_record(fit: Any, forced: str | None) -> dict[str, Any]:
    """A fit as results.json holds it: estimable / reason, and p null when not estimable (each fixed
    effect's ``mde`` is added once its family is known: :func:`family_mdes`)."""
    d = dataclasses.asdict(fit) | {"reml_criterion": fit.reml_criterion}
    reasons = [r for r in (forced, fit.reason) if r]
    ok = not reasons
    d |= {"estimable": ok, "reason": "; ".join(reasons) or None}
    if not ok:  # no inference: the p-values and intervals would treat prompts as replicates
        for fe in d["fixed"]:
            fe.update(p=None, z_p=None, ci_low=None, ci_high=None, z_ci_low=None, z_ci_high=None)
    return d


def _finite(*xs: Any) -> bool:
    return all(x is not None and np.isfinite(float(x)) for x in xs)


def fit_metric_lmms(frames: dict[str, tuple[pd.DataFrame, LMMSetup]],
                    coding: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """The LMM per metric on its own rows (``frames``: metric -> (data, setup); per-prompt or
    per-image); failures are recorded (message), never hidden or fatal. Holm/BH per term across
    the estimable fits of all metrics (one family); a fit marked not estimable gets p None."""
    from pcpo_eval.stats import adjust_across_metrics, fit_lmm
    from pcpo_eval.stats.boundary import run_level_at_boundary

    fits, out = {}, {}
    for m, (data, setup) in frames.items():
        if m not in data.columns:
            out[m] = {"error": f"no per-prompt or per-image values of {m}"}
            continue
        try:
            dm = data.assign(value=data[m].astype(float))
            fits[m] = fit_lmm(dm, setup.fixed, setup.groups, coding=coding, re_formula=setup.re_formula)
            if setup.re_formula is None:  # run variance at 0: the runs stay the replicates
                fits[m] = run_level_at_boundary(fits[m], dm, setup.fixed, setup.groups, coding)
        except Exception as exc:  # recorded and shown in the report, never fatal or hidden
            out[m] = {"error": _error(exc)}
    family = {m: f for m, f in fits.items() if frames[m][1].not_estimable is None}
    adjusted: dict[str, Any] = adjust_across_metrics(family) if family else {}
    for m, f in fits.items():
        data, setup = frames[m]
        out[m] = fit_record(f, setup.not_estimable) | {"formula": setup.formula, "n_rows": len(data)}
        adjusted.setdefault(m, {fe.term: {"p": None, "p_holm": None, "p_bh": None} for fe in f.fixed})
    return {m: out[m] for m in frames if m in out}, adjusted


def _simple_effect(sp: StudySpec, d: pd.DataFrame, m: str, setup: LMMSetup) -> tuple[Any, dict[str, Any]]:
    """One metric's PCPO - baseline effect in one cell: (fit or None, row without p_adj). ``mde``: the
    |effect| its t test detects with 80% power at the fitted SE and df, before any adjustment."""
    from pcpo_eval.stats import fit_lmm
    from pcpo_eval.stats.boundary import run_level_at_boundary

    arms = set(d[sp.compare_factor].astype(str)) if sp.compare_factor in d.columns else set()
    absent = [a for a in (sp.baseline, sp.pcpo) if str(a) not in arms]
    if absent:  # e.g. no run of the arm reached the matched-reward target: nothing to fit, not a failure
        return None, {"estimate": None, "se": None, "df": None, "ci_low": None, "ci_high": None, "mde": None,
                      "p": None, "estimable": False, "converged": False,
                      "reason": f"no {' or '.join(map(str, absent))} runs in this comparison (none has a checkpoint "
                                "here: a run that never reached the matched target is left out)"}
    try:
        dm = d.assign(value=d[m].astype(float))
        lmer = fit_lmm(dm, setup.fixed, setup.groups, coding="treatment", diagnostics=False)
        f = run_level_at_boundary(lmer, dm, setup.fixed, setup.groups, "treatment")
        fe = f.term(f"{sp.compare_factor}[T.{sp.pcpo}]")
    except Exception as exc:  # recorded, never fatal
        return None, {"error": _error(exc)}
    reasons = [r for r in (setup.not_estimable, f.reason) if r]
    ok = not reasons
    from pcpo_eval.stats.power import mde_from_se

    p_runs, means = run_means_test(sp, dm) if ok and "run" in setup.groups else (None, None)
    return (f if ok else None), {
        "estimate": fe.estimate, "se": fe.se, "df": fe.df, "ci_low": fe.ci_low if ok else None,
        "mde": mde_from_se(fe.se, fe.df, alpha=sp.lmm.alpha, measured=True) if ok else None, "run_means": means,
        "ci_high": fe.ci_high if ok else None, "p": fe.p if ok else None, "p_run_means": p_runs,
        "converged": f.converged, "estimable": ok, "reason": "; ".join(reasons) or None,
        "method": f"LMM {setup.formula} (REML, Satterthwaite df)" if f is lmer else
                  f"LMM {setup.formula} (REML); run variance at 0: t on the run means",
    }  # fmt: skip


#: the caveat of a significant simple effect that Welch's t on the runs' means does not confirm at the same
#: adjusted level (:func:`flag_unequal_spreads`)
UNEQUAL_SPREADS = ("significant by the LMM, whose (1|run) gives both arms one run-to-run variance; Welch's t on the "
                   "runs' means, which does not, gives p = {p} (adjusted alike {p_adj}): the finding rests on the arms "
                   "varying alike between seeds (run SD {sd_t} vs {sd_b})")


def flag_unequal_spreads(significance: dict[str, dict[str, Any]], alpha: float) -> dict[str, dict[str, Any]]:
    """Rows significant by the LMM whose runs' means, tested by Welch (``p_run_means``, adjusted by the row's
    own Holm/BH factor ``p_adj / p``), are not: ``caveat`` says so. The decision stays the LMM's (lmerTest's
    model; bounding it by Welch's cost most of the power at the family's level: 43 -> 27 of 50 planted
    studies in ``benchmarks/bench_lmm_calibration.py``); the caveat names the equal-spread assumption the
    finding needs. New dicts."""
    from pcpo_eval.stats.fmt import p_value

    out = {c: {m: dict(r) for m, r in per.items()} for c, per in significance.items()}
    for per in out.values():
        for r in per.values():
            pw, p, pa = r.get("p_run_means"), r.get("p"), r.get("p_adj")
            if not r.get("significant") or pw is None or not p or pa is None:
                continue
            welch_adj = min(1.0, pw * pa / p)
            if welch_adj >= alpha:
                sd = [float(np.std(r["run_means"][k], ddof=1)) for k in ("treatment", "baseline")]
                r["caveat"] = UNEQUAL_SPREADS.format(p=p_value(pw, alpha), p_adj=p_value(welch_adj, alpha),
                                                     sd_t=f"{sd[0]:.3g}", sd_b=f"{sd[1]:.3g}")
    return out


def run_means_test(sp: StudySpec, d: pd.DataFrame) -> tuple[float | None, dict[str, list[float]] | None]:
    """(p, the runs' means per arm) of Welch's t (bounded by the exact relabelling test where a t test is not trusted alone:
    :func:`pcpo_eval.stats.runlevel.compare_runs`) of PCPO - baseline on each run's mean value over its
    rows. The LMM with ``(1|run)`` tests the same between-run contrast under ONE run variance for both
    arms: at 3 vs 3 runs and 16 prompts, equal arm means, run SD 0.15 in one arm and 0 in the other, its
    p was below 0.05 in 27 of 300 simulations (9.0%), below 0.05 without a caveat (this p below 0.05 too)
    in 14 (4.7%)
    (``tests/study/test_run_means_bound.py``); a significant row Welch does not confirm gets a caveat
    (:func:`flag_unequal_spreads`). (None, None) when an arm has fewer than 2 runs or no spread."""
    from pcpo_eval.stats.runlevel import compare_runs

    means = d.groupby("run", sort=True).agg(value=("value", "mean"), arm=(sp.compare_factor, "first"))
    b = means.loc[means["arm"].astype(str) == str(sp.baseline), "value"].to_numpy(np.float64)
    t = means.loc[means["arm"].astype(str) == str(sp.pcpo), "value"].to_numpy(np.float64)
    c = compare_runs(b, t, rng=np.random.default_rng(0), alpha=sp.lmm.alpha)
    if not c.estimable or c.p is None:
        return None, None
    return float(c.p), {"baseline": b.tolist(), "treatment": t.tolist()}


def simple_effects(sp: StudySpec, data: pd.DataFrame, images: pd.DataFrame | None = None) -> dict[str, dict[str, Any]]:
    """Per cell: PCPO-vs-baseline effect per per-prompt metric, ``value ~ factor + (1|prompt) [+ (1|run)]``;
    per-image metrics on ``images`` with ``(1|image)`` added."""
    from pcpo_eval.stats.adjust import benjamini_hochberg, holm
    from pcpo_eval.stats.formula import parse_lmm_formula

    _, groups, _ = parse_lmm_formula(sp.lmm.formula)
    out: dict[str, dict[str, Any]] = {}
    if data.empty:
        return out
    for cell in sp.cells():
        names = [r.name for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) in ("baseline", "pcpo")]
        d = data[data["run"].isin(names)]
        base_groups = [g for g in groups if g != "run"]
        setup = lmm_setup(f"value ~ {sp.compare_factor}", base_groups, None, runs_per_arm(sp, d))
        rows = {m: _simple_effect(sp, d, m, setup) for m in sp.per_prompt_metrics
                if m in d.columns and (images is None or m not in images.columns)}
        if images is not None and not images.empty:
            di = images[images["run"].isin(names)]
            isetup = lmm_setup(f"value ~ {sp.compare_factor}", per_image_groups(base_groups), None,
                               runs_per_arm(sp, di))
            rows |= {m: _simple_effect(sp, di, m, isetup) for m in per_image_metrics(sp) if m in di.columns}
        est = [m for m, (f, _) in rows.items() if f is not None]
        adj = (holm if sp.lmm.adjust == "holm" else benjamini_hochberg)([rows[m][1]["p"] for m in est]) if est else []
        p_adj = dict(zip(est, (float(a) for a in adj), strict=True))
        cell_out = {}
        for m, (_, row) in rows.items():
            if "error" not in row:
                row |= {"p_adj": p_adj.get(m), "significant": bool(m in p_adj and p_adj[m] < sp.lmm.alpha)}
            cell_out[m] = row
        out[cell] = cell_out
    return out


# ------------------------------------------------------------------------------------------------
# overall metrics per run
# ------------------------------------------------------------------------------------------------


def overall_values(sp: StudySpec, layout: StudyLayout, rows: list[dict[str, Any]]) -> dict[str, dict[str, float]]:
    """Run name -> {metric: overall value} of its selected set."""
    out = {}
    for c in rows:
        mj = metrics_json(metrics_path(layout.metrics_dir(set_label(c["name"], c["epoch"]))))["metrics"]
        out[c["name"]] = {m: float(mj[m]) for m in sp.metrics if mj.get(m) is not None}
    return out


def overall_effects(sp: StudySpec, rows: list[dict[str, Any]], values: dict[str, dict[str, float]]) -> dict[str, dict[str, Any]]:
    """Per cell, for each ``overall_only`` metric: PCPO - baseline of the runs' overall values, Welch t
    interval and Welch t-test p over runs (:func:`pcpo_eval.stats.runlevel.compare_runs`, whose MDE at
    the runs' spread is ``mde``), Holm (or BH) across the overall-only metrics; 1 run per arm: not
    estimable. Where the t test is not trusted alone (:func:`pcpo_eval.stats.permutation.t_not_robust`) p is
    the larger of Welch's and the exact permutation test's, as in every run-level row."""
    from pcpo_eval.stats.adjust import benjamini_hochberg, holm
    from pcpo_eval.stats.runlevel import compare_runs

    out: dict[str, dict[str, Any]] = {}
    for cell in sp.cells():
        per: dict[str, Any] = {}
        for m in sp.overall_only:
            b, t = ([values[c["name"]][m] for c in rows if c["cell"] == cell and c["role"] == role
                     and m in values.get(c["name"], {})] for role in ("baseline", "pcpo"))
            c = compare_runs(b, t, rng=np.random.default_rng(0), alpha=sp.lmm.alpha)
            # compare_runs' p: the Welch p of the CI, bounded below by the exact relabelling test where a t
            # test is not trusted alone (2 runs in an arm, one arm without spread); that test's p without spread
            p = c.p if c.estimable else None
            per[m] = {"estimate": c.estimate, "se": None, "df": c.df, "ci_low": c.ci_low, "ci_high": c.ci_high,
                      "mde": c.mde, "run_values": {"baseline": b, "treatment": t},
                      "p": p, "estimable": c.estimable, "reason": c.reason or None, "converged": True,
                      "method": f"Welch t over runs of the overall {m} ({c.n_treatment} vs {c.n_baseline} runs)"}
        est = [m for m, r in per.items() if r["estimable"]]
        fn = holm if sp.lmm.adjust == "holm" else benjamini_hochberg
        adj = dict(zip(est, (float(a) for a in fn([per[m]["p"] for m in est])), strict=True)) if est else {}
        for m, r in per.items():
            r |= {"p_adj": adj.get(m), "significant": bool(m in adj and adj[m] < sp.lmm.alpha)}
        out[cell] = per
    return out


# ------------------------------------------------------------------------------------------------
# one image-metric comparison (matched reward or matched epoch)
# ------------------------------------------------------------------------------------------------


def fd_small_sets(sp: StudySpec) -> dict[str, dict[str, int]]:
    """Fréchet metrics whose eval sets hold no more images than the feature dimension (prompts x seeds <= d):
    the set's covariance is rank-deficient (rank <= n - 1 < d), so the whole-set value carries a large
    small-sample bias (FD's bias grows as the set shrinks). Computed anyway, as the paper's per-prompt
    protocol is; the report says so."""
    from pcpo_eval.generate.plan import parse_seeds
    from pcpo_eval.prompts import load_prompts

    try:
        n = len(parse_seeds(sp.eval.seeds)) * len(load_prompts(sp.eval.prompts, limit=sp.eval.max_prompts))
    except (UserError, OSError):
        return {}
    return {m: {"images": n, "dim": int(METRICS[m].feature_dim)} for m in sp.metrics
            if METRICS[m].kind == "fd" and METRICS[m].feature_dim and n <= int(METRICS[m].feature_dim)}


def _direction(m: str) -> str:
    """How to read metric ``m``'s values. A distance to the base model's images (the study's FD reference,
    ``needs_reference``) has no better side: a policy that learned nothing sits at 0. It read "lower is better",
    so a frozen arm's bold FD (0 against DDPO's 15, 5 seeds, Holm p 0.025) read as the better arm (a review)."""
    if METRICS[m].needs_reference:
        return "lower is closer to the base model (not better: an arm that learned nothing scores 0)"
    return "higher is better" if METRICS[m].higher_is_better else "lower is better"


def raw_score_rows(sp: StudySpec, rows: list[dict[str, Any]], values: dict[str, dict[str, float]],
                   significance: dict[str, dict[str, Any]], suffix: str) -> list[dict[str, Any]]:
    """Table-2 rows per cell and arm: mean (SD) over the runs that have a selected checkpoint."""
    out = []
    for cell in sp.cells():
        for role, level in (("baseline", sp.baseline), ("pcpo", sp.pcpo)):
            n_all = sum(1 for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) == role)
            sel = [c for c in rows if c["cell"] == cell and c["role"] == role]
            vals = {m: [values[c["name"]][m] for c in sel if m in values[c["name"]]] for m in sp.metrics}
            sig = significance.get(f"{cell}{suffix}", {}) if role == "pcpo" else {}
            out.append({
                "cell": f"{cell}{suffix}", "method": level, "role": role, "n_runs": len(sel),
                "n_without_checkpoint": n_all - len(sel), "epochs": [int(c["epoch"]) for c in sel],
                "rewards": [float(c["reward"]) for c in sel],
                "values": {m: (float(np.mean(v)) if v else None) for m, v in vals.items()},
                "sd": {m: (float(np.std(v, ddof=1)) if len(v) > 1 else None) for m, v in vals.items()},
                "significant": {m: bool(sig.get(m, {}).get("significant", False)) for m in sp.metrics},
            })  # fmt: skip
        if len(out) >= 2 and out[-1]["role"] == "pcpo" and out[-2]["role"] == "baseline":
            _unbold_conflicts(sp, out[-2], out[-1], significance.get(f"{cell}{suffix}", {}))
    return out


def _unbold_conflicts(sp: StudySpec, base: dict[str, Any], pcpo: dict[str, Any], sig: dict[str, Any]) -> None:
    """A bold cell shows the arms' overall values, but a per-prompt metric's bold comes from the per-prompt
    test, which can point the other way (IS of a whole set is diversity across prompts; per prompt, within
    one): a policy that collapses each prompt had a bold, "worse" overall IS* while the per-prompt test found
    it significantly lower (a review's simulation; ``tests/study/test_image_rows.py`` replays the case),
    one label with two opposite findings. Such a cell is not bold
    and ``conflicts`` says why."""
    for m, bold in pcpo["significant"].items():
        est, vb, vt = sig.get(m, {}).get("estimate"), base["values"].get(m), pcpo["values"].get(m)
        if not bold or est is None or vb is None or vt is None or est * (vt - vb) >= 0:
            continue
        pcpo["significant"][m] = False
        within = " (IS per prompt is diversity within a prompt; the set's IS, across prompts)" if m.startswith("is") else ""
        pcpo.setdefault("conflicts", {})[m] = (
            f"{METRIC_LABELS[m]} in {pcpo['cell']}: the per-prompt test finds {sp.pcpo} {'higher' if est > 0 else 'lower'} "
            f"(estimate {est:+.3g}, adjusted p {sig[m].get('p_adj'):.3g}) while the overall values go the other way "
            f"({sp.pcpo} {vt:.4g}, {sp.baseline} {vb:.4g}): the two measure different things{within}, so the cell is "
            "not bold; read the per-prompt effect below for what was tested")


def comparison(sp: StudySpec, layout: StudyLayout, match: str) -> dict[str, Any]:
    """LMMs, simple / overall effects and raw-score rows of one comparison (``reward`` or ``epoch``)."""
    from pcpo_eval.stats.formula import parse_lmm_formula

    rows = layout.matched(match)
    values = overall_values(sp, layout, rows)
    data = per_prompt_frame(sp, layout, rows)
    images = per_image_frame(sp, layout, rows) if per_image_metrics(sp) else None
    fixed, groups, re_formula = parse_lmm_formula(sp.lmm.formula)
    setup = lmm_setup(fixed, groups, re_formula, runs_per_arm(sp, data))
    frames = {m: (data, setup) for m in sp.per_prompt_metrics}
    isetup = None
    if images is not None and not images.empty:
        isetup = lmm_setup(fixed, per_image_groups(groups), re_formula, runs_per_arm(sp, images))
        frames |= {m: (images, isetup) for m in per_image_metrics(sp) if m in images.columns}
    fits, adjusted = fit_metric_lmms(frames, sp.lmm.coding) if rows else ({}, {})
    sig = simple_effects(sp, data, images)
    for cell, per in overall_effects(sp, rows, values).items():
        sig.setdefault(cell, {}).update(per)
    n_images = len(images) if isetup is not None else 0
    return {"rows": rows, "values": values, "n_rows": len(data) + n_images, "formula": setup.formula,
            "image_formula": isetup.formula if isetup else None, "n_image_rows": n_images, "fits": fits,
            "adjusted": adjusted, "significance": sig}


def lmm_study_family(adjusted: dict[str, dict[str, dict[str, Any]]]) -> dict[str, dict[str, dict[str, Any]]]:
    """The LMM tables' Holm and BH families per fixed term across every metric of BOTH comparisons
    (``adjusted`` keys carry the `` @ epoch E`` suffix), not per comparison: one family per term per
    study, so the matched-epoch fits do not add a second 5% chance; the terms of the compared factor
    then join the raw-score rows' family (:func:`arm_family`)."""
    from pcpo_eval.stats.adjust import benjamini_hochberg, holm

    out = {m: {t: dict(v) for t, v in terms.items()} for m, terms in adjusted.items()}
    for term in {t for terms in adjusted.values() for t in terms}:
        keys = [m for m, terms in adjusted.items() if terms.get(term, {}).get("p") is not None]
        if not keys:
            continue
        pv = np.array([adjusted[m][term]["p"] for m in keys], dtype=float)
        for m, a, b in zip(keys, holm(pv), benjamini_hochberg(pv), strict=True):
            out[m][term] |= {"p_holm": float(a), "p_bh": float(b), "family_size": len(keys)}
    return out


def involves(term: str, factor: str) -> bool:
    """Whether a fixed-effect term (``algorithm[T.PCPO]``, ``algorithm[T.PCPO]:batch[T.b]``) is or
    contains the compared factor: the terms that compare the arms, in treatment or sum coding
    (``C(algorithm, Sum)[S.DDPO]``; :func:`pcpo_eval.stats.design.term_factors`)."""
    from pcpo_eval.stats.design import term_factors

    return factor in term_factors(term)


def same_tests(significance: dict[str, dict[str, Any]], adjusted: dict[str, dict[str, Any]],
               fits: dict[str, Any], factor: str, suffix: str) -> dict[tuple[str, str], tuple[str, str]]:
    """LMM-table entries ``(metric, term)`` that ARE a raw-score row ``(cell, metric)``: the same test
    printed twice (a one-cell study whose LMM is the simple-effect model), known by an equal estimate,
    SE and p. Keys and values carry ``suffix`` (the comparison)."""
    out = {}
    for cell, per in significance.items():
        for m, row in per.items():
            fit = fits.get(m) or {}
            for fe in fit.get("fixed") or []:
                p = adjusted.get(m, {}).get(fe["term"], {}).get("p")
                if (involves(fe["term"], factor) and p is not None and row.get("p") is not None
                        and all(row.get(k) is not None and fe.get(k) is not None
                                and np.isclose(row[k], fe[k], rtol=1e-9, atol=0) for k in ("estimate", "se", "p"))):
                    out[(f"{m}{suffix}", fe["term"])] = (f"{cell}{suffix}", m)
    return out


def arm_family(significance: dict[str, dict[str, Any]], adjusted: dict[str, dict[str, Any]], factor: str,
               same: dict[tuple[str, str], tuple[str, str]], adjust: str,
               alpha: float) -> tuple[dict[str, dict[str, Any]], dict[str, dict[str, Any]]]:
    """ONE multiplicity family per study for every arm comparison the image-metric sections mark: the
    raw-score rows (every cell, comparison and metric; simple-effect LMMs and Welch rows) and the LMM
    tables' terms that involve the compared factor (:func:`involves`), Holm and BH over them at once.
    An LMM entry that is the same test as a raw-score row (``same``, :func:`same_tests`) counts once
    and shows that row's adjusted p. Other LMM terms keep their per-term family
    (:func:`lmm_study_family`). Returns new (significance, adjusted); the inputs are not modified.

    Why: the raw-score bold and the LMM tables were two families, so an A/A study showed some
    significant arm comparison in up to alpha (1 + W / (L + W)) of studies (6.0% [2.2, 12.6]
    measured on real toy runs, 3 vs 3).
    """
    from pcpo_eval.stats.adjust import benjamini_hochberg, holm

    members: dict[tuple[str, str, str], float] = {}
    for c, per in significance.items():
        for m, r in per.items():
            if "error" not in r and r.get("estimable") and r.get("p") is not None:
                members[("row", c, m)] = float(r["p"])
    for mk, terms in adjusted.items():
        for t, v in terms.items():
            if involves(t, factor) and v.get("p") is not None and (mk, t) not in same:
                members[("lmm", mk, t)] = float(v["p"])
    keys = list(members)
    pv = np.array([members[k] for k in keys], dtype=float)
    h = dict(zip(keys, holm(pv), strict=True)) if keys else {}
    b = dict(zip(keys, benjamini_hochberg(pv), strict=True)) if keys else {}
    sig = {c: {m: dict(r) for m, r in per.items()} for c, per in significance.items()}
    for (_, c, m) in (k for k in keys if k[0] == "row"):
        p_adj = float((h if adjust == "holm" else b)[("row", c, m)])
        sig[c][m] |= {"p_adj": p_adj, "significant": p_adj < alpha, "family_size": len(keys)}
    adj = {mk: {t: dict(v) for t, v in terms.items()} for mk, terms in adjusted.items()}
    for mk, terms in adj.items():
        for t in terms:
            key = ("row", *same[(mk, t)]) if (mk, t) in same else ("lmm", mk, t)
            if key in h:
                terms[t] |= {"p_holm": float(h[key]), "p_bh": float(b[key]), "family_size": len(keys)}
    return sig, adj


def _row_mde(r: dict[str, Any], level: float) -> float | None:
    """A raw-score row's MDE at test level ``level``: the Welch t over its runs' overall values
    (``run_values``, :func:`overall_effects`), else the LMM t at its SE and df."""
    from pcpo_eval.stats.power import mde_from_se
    from pcpo_eval.stats.runlevel import trimmed_mde

    if r.get("run_values"):
        b, t = (np.asarray(r["run_values"][k], dtype=float) for k in ("baseline", "treatment"))
        return trimmed_mde(b, t, paired=False, trim=0.0, alpha=level)
    return mde_from_se(float(r["se"]), float(r["df"]), alpha=level, measured=True) if _finite(r.get("se"), r.get("df")) else None


def family_mdes(significance: dict[str, dict[str, Any]], fits: dict[str, Any], adjusted: dict[str, dict[str, Any]],
                alpha: float) -> tuple[dict[str, dict[str, Any]], dict[str, Any]]:
    """Every raw-score row's and LMM fixed effect's ``mde`` at its family's level ``alpha / m``
    (:func:`pcpo_eval.stats.power.family_level`; ``m`` = ``family_size`` from :func:`arm_family` and
    :func:`lmm_study_family`), with ``mde_level``: a row is bold only when its adjusted p passes, so the
    effect it detects with 80% power is its test's at that level (the unadjusted MDE would promise power
    the family does not have). Rows or terms outside any family (not estimable) get None. New dicts."""
    from pcpo_eval.stats.power import family_level, mde_from_se

    sig = {c: {m: dict(r) for m, r in per.items()} for c, per in significance.items()}
    for per in sig.values():
        for r in per.values():
            n = r.get("family_size")
            if n and r.get("mde") is not None:
                r |= {"mde": _row_mde(r, family_level(alpha, n)), "mde_level": family_level(alpha, n)}
    out = {mk: dict(f) for mk, f in fits.items()}
    for mk, f in out.items():
        if not isinstance(f.get("fixed"), (list, tuple)):  # an error record
            continue
        f["fixed"] = [dict(fe) for fe in f["fixed"]]
        for fe in f["fixed"]:
            n = adjusted.get(mk, {}).get(fe["term"], {}).get("family_size")
            ok = bool(n) and f.get("estimable", True) is not False and _finite(fe.get("se"), fe.get("df"))
            level = family_level(alpha, n) if n else None
            fe |= {"mde": mde_from_se(float(fe["se"]), float(fe["df"]), alpha=level, measured=True) if ok else None,
                   "mde_level": level if ok else None}
    return sig, out


def _suffixed(d: dict[str, Any], suffix: str) -> dict[str, Any]:
    return {f"{k}{suffix}": v for k, v in d.items()}


def image_metrics(sp: StudySpec, layout: StudyLayout) -> tuple[dict[str, Any], dict[str, Any], dict[str, str]]:
    """``raw_scores`` and ``lmm`` of results.json for both comparisons, and extra metric labels.

    Matched-epoch entries carry the suffix `` @ epoch E``: cells in the raw-score table, metrics in
    the LMM tables. Every comparison of the arms (bold cells, LMM terms of the compared factor) of both
    comparisons and all cells forms one multiplicity family per study (:func:`arm_family`); the LMM
    tables' other terms one per term (:func:`lmm_study_family`).
    """

    base = metrics_json(metrics_path(layout.metrics_dir("base")))["metrics"]
    raw = [{"cell": "", "method": "Base model", "role": "base", "n_runs": 1, "epochs": [],
            "values": {m: base.get(m) for m in sp.metrics}, "sd": {}, "significant": {}}]
    fits: dict[str, Any] = {}
    adjusted: dict[str, Any] = {}
    significance: dict[str, Any] = {}
    labels: dict[str, str] = {}
    formulas, image_formulas, n_rows = {}, {}, 0
    pending: list[tuple[list[dict[str, Any]], dict[str, dict[str, float]], str]] = []
    same: dict[tuple[str, str], tuple[str, str]] = {}
    epoch = json.loads(layout.selection_file.read_text()).get("epoch")
    for match in ("reward", "epoch"):
        if match == "epoch" and epoch is None:
            continue
        # an explicit per-arm selection carries its label ("DanceGRPO E180, PCPO E120"), not one epoch
        where = epoch if isinstance(epoch, str) else f"epoch {epoch}"
        suffix = "" if match == "reward" else f" @ {where}"
        c = comparison(sp, layout, match)
        same |= same_tests(c["significance"], c["adjusted"], c["fits"], sp.compare_factor, suffix)
        significance.update(_suffixed(c["significance"], suffix))
        pending.append((c["rows"], c["values"], suffix))
        fits.update(_suffixed(c["fits"], suffix))
        adjusted.update(_suffixed(c["adjusted"], suffix))
        labels.update({f"{m}{suffix}": f"{METRIC_LABELS[m]}{suffix}" for m in c["fits"]} if suffix else {})
        key = "matched reward" if match == "reward" else where
        formulas[key] = c["formula"]
        if c["image_formula"]:
            image_formulas[key] = c["image_formula"]
        n_rows += c["n_rows"]
    # one family per study: every arm comparison (bold rows and the LMM terms of the compared factor)
    # together; the LMM tables' other terms per term; then the rows
    adjusted = lmm_study_family(adjusted)
    significance, adjusted = arm_family(significance, adjusted, sp.compare_factor, same, sp.lmm.adjust, sp.lmm.alpha)
    significance = flag_unequal_spreads(significance, sp.lmm.alpha)
    significance, fits = family_mdes(significance, fits, adjusted, sp.lmm.alpha)
    for rows, values, suffix in pending:
        raw += raw_score_rows(sp, rows, values, significance, suffix)
    for m in sp.per_prompt_rank_deficient_ok:
        labels[m] = f"{METRIC_LABELS[m]} (per-prompt rank-deficient, opted in)"
    raw_scores = {"columns": list(sp.metrics), "rows": raw, "significance": significance, "rule": _rule(sp),
                  "direction": {m: _direction(m) for m in sp.metrics},
                  # distances to the base model's images of the same prompts and seeds (the metrics stage's
                  # reference): lower is closer to the untrained model, where a policy that learned nothing sits
                  "against_base": [m for m in sp.metrics if METRICS[m].needs_reference],
                  "small_sets": fd_small_sets(sp)}
    lmm = {"formula": formulas.get("matched reward", sp.lmm.formula), "formulas": formulas,
           "image_formula": image_formulas.get("matched reward"), "image_formulas": image_formulas,
           "per_image_metrics": list(per_image_metrics(sp)), "spec_formula": sp.lmm.formula, "coding": sp.lmm.coding, "df_method": "Satterthwaite (lmerTest)",
           "estimation": "REML", "adjust": sp.lmm.adjust, "alpha": sp.lmm.alpha, "fits": fits,
           "adjusted": adjusted, "n_rows": n_rows, "overall_only": list(sp.overall_only),
           "per_prompt_rank_deficient_ok": list(sp.per_prompt_rank_deficient_ok)}
    return raw_scores, lmm, labels


def _rule(sp: StudySpec) -> str:
    """The bold rule of the raw-score table, with the guards that apply to this study."""
    adj = "BH" if sp.lmm.adjust == "bh" else "Holm"
    text = (f"bold: {sp.pcpo} differs from {sp.baseline} in that cell, {adj}-adjusted p < {sp.lmm.alpha:g} in one family "
            "over every metric, cell and comparison of this table (so an A/A study shows a bold cell in at most "
            f"{sp.lmm.alpha:g} of studies; this table is a family of its own beside the verdict and the balance "
            "check, so a significant result somewhere in the report has a larger chance, up to three times that, "
            "and a bold cell under a verdict of no evidence is not evidence of a difference between the arms): "
            f"per-prompt metrics by the simple-effect LMM value ~ {sp.compare_factor} + (1|prompt) (+ (1|run) with "
            ">= 2 runs per arm; 1 run per arm: not estimable, never bold) on the cell's per-prompt scores (REML, "
            "Satterthwaite df)")
    if sp.overall_only:
        text += (f"; overall-only metrics ({', '.join(sp.overall_only)}) by a Welch t-test over the runs' overall "
                 "values")
    if sp.per_prompt_rank_deficient_ok:
        text += (f"; per-prompt {', '.join(sp.per_prompt_rank_deficient_ok)} uses fewer images per prompt than "
                 "feature dimensions (rank-deficient covariance), opted in by per_prompt_rank_deficient_ok")
    return text + ". Runs without a checkpoint (reward target not reached) are left out of their rows"  # the report adds "."
