"""The study's ``stats`` stage: every number the report shows, assembled into ``results.json``.

All computation happens here by calling the statistics library (:mod:`pcpo_eval.stats`); the HTML
report (:mod:`pcpo_eval.report.html`) only formats the JSON written from :func:`build_results`.

* Speed-up (paper Table 1/5): per comparison cell (e.g. each batch size), epochs until the smoothed
  reward (trailing mean, window 5) reaches each target, baseline vs PCPO runs
  (:func:`pcpo_eval.stats.speedup_table`; several replicate seeds -> mean and spread).
* Raw scores (Table 2): overall metrics of each condition's reward-matched checkpoint set
  (mean over replicate seeds). **Significance** of PCPO vs baseline within a cell is the simple
  effect of the compared factor in ``value ~ <factor> + (1|prompt)`` fitted to that cell's
  per-prompt scores (REML, Satterthwaite df), with Holm (or BH) adjustment across metrics.
* LMM tables (Tables 3-4): the spec's formula per metric on all per-prompt scores, terms with
  estimate, SE, Satterthwaite df, t, p and adjusted p (per term across metrics); diagnostics.
* Preference table (Table 6), training traces (Fig. 5; smoothed with the same window), the
  credit-weight figure (Fig. 2), rho and |g| statistics (App. figures), image grids.
"""

from __future__ import annotations

import dataclasses
import json
import platform
import time
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_bytes, to_jsonable
from pcpo_eval.study.layout import StudyLayout, set_label
from pcpo_eval.study.spec import StudySpec

TRACE_COLUMNS = (
    "reward_mean", "reward_std", "clipfrac", "approx_kl", "rho_mean", "rho_min", "rho_max", "rho_std",
    "grad_first_abs_mean", "grad_first_abs_var", "wall_time_s",
)  # fmt: skip


def _metrics_json(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"{path} missing; run the metrics stage first")
    return json.loads(path.read_text())


def per_prompt_frame(sp: StudySpec, layout: StudyLayout) -> pd.DataFrame:
    """One row per (run, prompt) of the reward-matched sets: factor levels, prompt, metric columns."""
    frames = []
    by_name = {r.name: r for r in sp.runs}
    for c in layout.selection():
        pp = pd.read_parquet(layout.metrics_dir(set_label(c["name"], c["epoch"])) / "per_prompt.parquet")
        run = by_name[c["name"]]
        df = pd.DataFrame({"run": run.name, "prompt_id": pp["prompt_id"].astype(int),
                           "prompt": [f"p{int(i)}" for i in pp["prompt_id"]]})
        for f, lv in run.levels.items():
            df[f] = str(lv)
        for m in sp.metrics:
            if m in pp.columns:
                df[m] = pp[m].astype(float).to_numpy()
        frames.append(df)
    return pd.concat(frames, ignore_index=True)


def fit_metric_lmms(data: pd.DataFrame, metrics: list[str], formula: str, coding: str) -> tuple[dict[str, Any], dict[str, Any]]:
    """Fit the spec's LMM per metric; failures are recorded (message), never hidden or fatal."""
    from pcpo_eval.stats import adjust_across_metrics, fit_lmm
    from pcpo_eval.stats.formula import parse_lmm_formula

    fixed, groups, re_formula = parse_lmm_formula(formula)
    fits, errors = {}, {}
    for m in metrics:
        if m not in data.columns:
            errors[m] = f"no per-prompt values of {m}"
            continue
        d = data.assign(value=data[m].astype(float))
        try:
            fits[m] = fit_lmm(d, fixed, groups, coding=coding, re_formula=re_formula)
        except Exception as exc:  # recorded and shown in the report, never fatal or hidden
            errors[m] = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
    adjusted = adjust_across_metrics(fits) if fits else {}
    out = {m: dataclasses.asdict(f) | {"reml_criterion": f.reml_criterion} for m, f in fits.items()}
    out.update({m: {"error": e} for m, e in errors.items()})
    return out, adjusted


def simple_effects(sp: StudySpec, data: pd.DataFrame) -> dict[str, dict[str, Any]]:
    """Per cell: PCPO-vs-baseline effect per metric, ``value ~ factor + (1|groups)`` on the cell's rows."""
    from pcpo_eval.stats import adjust_across_metrics, fit_lmm
    from pcpo_eval.stats.formula import parse_lmm_formula

    _, groups, _ = parse_lmm_formula(sp.lmm.formula)
    out: dict[str, dict[str, Any]] = {}
    for cell in sp.cells():
        names = [r.name for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) in ("baseline", "pcpo")]
        d = data[data["run"].isin(names)]
        fits, errs = {}, {}
        for m in sp.metrics:
            if m not in d.columns:
                continue
            try:
                fits[m] = fit_lmm(d.assign(value=d[m].astype(float)), f"value ~ {sp.compare_factor}", groups,
                                  coding="treatment", diagnostics=False)
            except Exception as exc:  # recorded, never fatal
                errs[m] = str(exc) if isinstance(exc, UserError) else f"{type(exc).__name__}: {exc}"
        adj = adjust_across_metrics(fits) if fits else {}
        term = f"{sp.compare_factor}[T.{sp.pcpo}]"
        cell_out: dict[str, Any] = {}
        for m, f in fits.items():
            try:
                fe = f.term(term)
            except UserError as exc:
                errs[m] = str(exc)
                continue
            a = adj[m][term]
            p_adj = a["p_holm"] if sp.lmm.adjust == "holm" else a["p_bh"]
            cell_out[m] = {"estimate": fe.estimate, "se": fe.se, "df": fe.df, "p": fe.p if f.estimable else None,
                           "p_adj": p_adj, "significant": bool(f.estimable and p_adj is not None and p_adj < sp.lmm.alpha),
                           "converged": f.converged, "estimable": f.estimable, "reason": f.reason}
        cell_out.update({m: {"error": e} for m, e in errs.items()})
        out[cell] = cell_out
    return out


def raw_scores(sp: StudySpec, layout: StudyLayout, significance: dict[str, dict[str, Any]]) -> dict[str, Any]:
    """Table-2 rows: base, then per cell baseline and PCPO (mean over replicates; SD if several)."""
    sel = {c["name"]: c for c in layout.selection()}
    base = _metrics_json(layout.metrics_dir("base") / "metrics.json")["metrics"]
    rows = [{"cell": "", "method": "Base model", "role": "base", "n_runs": 1, "epochs": [],
             "values": {m: base.get(m) for m in sp.metrics}, "sd": {}, "significant": {}}]
    for cell in sp.cells():
        for role, level in (("baseline", sp.baseline), ("pcpo", sp.pcpo)):
            runs = [r for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) == role]
            vals: dict[str, list[float]] = {m: [] for m in sp.metrics}
            for r in runs:
                c = sel[r.name]
                mj = _metrics_json(layout.metrics_dir(set_label(r.name, c["epoch"])) / "metrics.json")["metrics"]
                for m in sp.metrics:
                    if mj.get(m) is not None:
                        vals[m].append(float(mj[m]))
            sig = significance.get(cell, {}) if role == "pcpo" else {}
            rows.append({
                "cell": cell, "method": level, "role": role, "n_runs": len(runs),
                "epochs": [int(sel[r.name]["epoch"]) for r in runs],
                "rewards": [float(sel[r.name]["reward"]) for r in runs],
                "values": {m: (float(np.mean(v)) if v else None) for m, v in vals.items()},
                "sd": {m: (float(np.std(v, ddof=1)) if len(v) > 1 else None) for m, v in vals.items()},
                "significant": {m: bool(sig.get(m, {}).get("significant", False)) for m in sp.metrics},
            })
    return {"columns": list(sp.metrics), "rows": rows, "significance": significance,
            "rule": (f"bold: PCPO differs from the baseline in that cell, simple-effect LMM "
                     f"value ~ {sp.compare_factor} + random intercepts on the cell's per-prompt scores "
                     f"(REML, Satterthwaite df), {sp.lmm.adjust.upper() if sp.lmm.adjust == 'bh' else 'Holm'}-adjusted "
                     f"across metrics, p < {sp.lmm.alpha:g}")}


def preference_table(sp: StudySpec, layout: StudyLayout) -> dict[str, Any] | None:
    """Table-6 rows: preference scores of the base model and each selected checkpoint (best marked)."""
    if sp.preference is None:
        return None
    rows = []
    for label, _, c in layout.eval_sets(sp.base_model):
        mj = _metrics_json(layout.metrics_dir(label, pref=True) / "metrics.json")["metrics"]
        rows.append({"label": "Base model" if c is None else f"{c['name']} (E{int(c['epoch'])})",
                     "role": "base" if c is None else c["role"], "cell": "" if c is None else c["cell"],
                     "values": {m: mj.get(m) for m in sp.preference.metrics}})
    for m in sp.preference.metrics:  # all preference scores are higher-is-better
        vals = [r["values"][m] for r in rows if r["values"].get(m) is not None]
        for r in rows:
            r.setdefault("best", {})[m] = bool(vals) and r["values"].get(m) == max(vals)
    return {"prompts": sp.preference.prompts, "seeds": sp.preference.seeds, "columns": list(sp.preference.metrics),
            "rows": rows}


def traces(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """Per run: log columns by epoch, and reward / clip fraction smoothed with the study's window."""
    from pcpo_eval.stats import load_log, moving_average

    out = []
    for r in sp.runs:
        log = load_log(layout.run_dir(r) / "log.parquet")
        tr: dict[str, Any] = {"run": r.name, "role": sp.role(r), "cell": sp.cell_key(r),
                              "levels": r.levels, "epoch": log["epoch"].astype(int).tolist()}
        for col in TRACE_COLUMNS:
            if col in log.columns:
                tr[col] = log[col].astype(float).tolist()
        tr["reward_smoothed"] = moving_average(log["reward_mean"].to_numpy(), sp.window).tolist()
        if "clipfrac" in log.columns:
            tr["clipfrac_smoothed"] = moving_average(log["clipfrac"].to_numpy(), sp.window).tolist()
        out.append(tr)
    return out


def grids(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """Same prompts and seeds for base / baseline / PCPO at matched reward, per cell (paths into OUT)."""
    from pcpo_eval.imageset import image_rel_path

    man = pd.read_parquet(layout.set_dir("base") / "manifest.parquet")
    pids = sorted(man["prompt_id"].unique().tolist())[: sp.grid.prompts]
    seeds = sorted(man["seed"].unique().tolist())[: sp.grid.seeds]
    prompts = dict(zip(man["prompt_id"], man["prompt"], strict=False))
    sel = layout.selection()
    out = []
    for cell in sp.cells():
        cols = [{"label": "Base model", "role": "base", "set": "sets/base", "epoch": None, "reward": None}]
        for role in ("baseline", "pcpo"):
            c = next((c for c in sel if c["cell"] == cell and c["role"] == role), None)
            if c is not None:
                cols.append({"label": f"{c['levels'][sp.compare_factor]} (E{int(c['epoch'])})", "role": role,
                             "set": f"sets/{set_label(c['name'], c['epoch'])}", "epoch": int(c["epoch"]),
                             "reward": float(c["reward"])})
        rows = [{"prompt_id": int(p), "prompt": str(prompts[p]), "seeds": [int(s) for s in seeds],
                 "images": [[f"{col['set']}/{image_rel_path(int(p), int(s))}" for s in seeds] for col in cols]}
                for p in pids]
        out.append({"cell": cell, "columns": cols, "rows": rows})
    return out


def speedups(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """Per cell: the speed-up table (paper Table 1/5) of its baseline vs PCPO runs."""
    from pcpo_eval.stats import speedup_table

    out = []
    for cell in sp.cells():
        b = [layout.run_dir(r) for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) == "baseline"]
        p = [layout.run_dir(r) for r in sp.runs if sp.cell_key(r) == cell and sp.role(r) == "pcpo"]
        if b and p:
            t = speedup_table(b, p, list(sp.targets), sp.window)
            out.append({"cell": cell, "baseline": sp.baseline, "pcpo": sp.pcpo, "table": t.to_dict()})
    return out


def build_results(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """Everything the report formats (JSON-able), from the spec and the files under ``layout.out``."""
    from pcpo_eval.credit.plot import credit_figure_png
    from pcpo_eval.metrics.base import METRIC_LABELS

    data = per_prompt_frame(sp, layout)
    fits, adjusted = fit_metric_lmms(data, list(sp.metrics), sp.lmm.formula, sp.lmm.coding)
    sig = simple_effects(sp, data)
    fig = layout.credit_figure
    if not fig.is_file():
        atomic_write_bytes(fig, credit_figure_png())
    spec_yaml = Path(sp.source).read_text() if Path(sp.source).is_file() else ""
    results = {
        "study": {"name": sp.name, "description": sp.description, "source": sp.source, "spec_yaml": spec_yaml,
                  "created": time.strftime("%Y-%m-%d %H:%M:%S"), "factors": {k: list(v) for k, v in sp.factors.items()},
                  "compare": {"factor": sp.compare_factor, "baseline": sp.baseline, "pcpo": sp.pcpo},
                  "replicate": sp.replicate, "runs": [{"name": r.name, "levels": r.levels, "run_dir": str(layout.run_dir(r)),
                                                       "trained_by_study": r.run_dir is None} for r in sp.runs],
                  "sampling": sp.sampling(), "eval": dataclasses.asdict(sp.eval), "targets": list(sp.targets),
                  "select_target": sp.select_target, "window": sp.window,
                  "versions": {"python": platform.python_version()}},
        "metric_labels": {**METRIC_LABELS},
        "metrics": list(sp.metrics),
        "speedup": speedups(sp, layout),
        "selection": json.loads(layout.selection_file.read_text()),
        "raw_scores": raw_scores(sp, layout, sig),
        "lmm": {"formula": sp.lmm.formula, "coding": sp.lmm.coding, "df_method": "Satterthwaite (lmerTest)",
                "estimation": "REML", "adjust": sp.lmm.adjust, "alpha": sp.lmm.alpha, "fits": fits,
                "adjusted": adjusted, "n_rows": len(data)},
        "preference": preference_table(sp, layout),
        "traces": traces(sp, layout),
        "figures": {"credit": fig.relative_to(layout.out).as_posix()},
        "grids": grids(sp, layout),
    }
    return to_jsonable(results)
