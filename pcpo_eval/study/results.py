"""The study's ``stats`` stage: every number the report shows, assembled into ``results.json``.

All computation happens here by calling the statistics library (:mod:`pcpo_eval.stats`); the HTML
report (:mod:`pcpo_eval.report.html`) only formats the JSON written from :func:`build_results`.

* **Verdict over runs** (:mod:`.verdicts`): paired gain, final reward, AUC and the speed-up per
  informative target, baseline arm vs PCPO arm per cell, with runs (training seeds) as the
  replicates; the per-run curves and PPO health; the sampler offset of the untrained controls.
* Speed-up table (paper Tables 1 and 10): per cell, epochs until the smoothed reward (trailing mean,
  window 5) reaches each target (:func:`pcpo_eval.stats.speedup_table`); targets every run starts
  above are labelled uninformative (speed-up left empty, not "+0.0%").
* Image metrics at matched reward and at matched epoch (:mod:`.image_metrics`): raw scores with
  significance (Table 2) and one LMM per metric (Tables 3-4); the matched checkpoints' reward
  balance (:mod:`.balance`).
* Preference table (Table 5; best by each metric's direction), training traces (Fig. 3), the
  credit-weight figure (Fig. 2), image grids at matched reward.
"""

from __future__ import annotations

import dataclasses
import json
import math
import platform
import time
from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pcpo_eval.io import atomic_write_bytes, to_jsonable
from pcpo_eval.metrics.base import METRIC_LABELS, METRICS
from pcpo_eval.metricsdir import metrics_path
from pcpo_eval.rundir import load_log, log_path
from pcpo_eval.study.balance import reward_balance
from pcpo_eval.study.image_metrics import image_metrics, metrics_json
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import StudyLayout

TRACE_COLUMNS = (
    "reward_mean", "reward_std", "clipfrac", "approx_kl", "rho_mean", "rho_min", "rho_max", "rho_std",
    "grad_first_abs_mean", "grad_first_abs_var", "wall_time_s", "wall_clock_s", "val_reward_mean", "val_reward_sem",
    "val_control_reward_mean", "kl_ref", "taylor_rel_err_max", "taylor_rel_err_active_max", "delta_ratio_first_offpolicy",
)  # fmt: skip
#: per-update list columns of ``diagnostics: true`` runs (train/diagnostics.py), carried as lists per epoch
PER_UPDATE_COLUMNS = ("taylor_rel_err_per_update", "delta_ratio_per_update")


# ------------------------------------------------------------------------------------------------
# preference, traces, grids
# ------------------------------------------------------------------------------------------------


def preference_sets(sp: StudySpec, layout: StudyLayout, pr: Any) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(label, model, row) scored on preference set ``pr``: its stated epochs, else every selected set."""
    from pcpo_eval.study.selection import explicit_sets

    if pr.epochs is not None:
        return explicit_sets(sp, layout, pr.epochs, f"preference {pr.name}".strip() + ".epochs")
    return layout.eval_sets(sp.base_model)


def mark_best(rows: list[dict[str, Any]], metrics: Sequence[str]) -> None:
    """Set each row's ``best[m]``: its value ranks first among its cell's rows by the metric's
    direction (the base model, cell ``""``, competes in every cell; it is best if it is in any)."""
    for m in metrics:
        for cell in {r["cell"] for r in rows if r["cell"]} or {""}:
            group = [r for r in rows if r["cell"] in (cell, "")]
            vals = [r["values"][m] for r in group if r["values"].get(m) is not None]
            best = (max if METRICS[m].higher_is_better else min)(vals) if vals else None
            for r in group:
                mark = r.setdefault("best", {})
                mark[m] = mark.get(m, False) or (bool(vals) and r["values"].get(m) == best)


def preference_table(sp: StudySpec, layout: StudyLayout, pr: Any = None) -> dict[str, Any] | None:
    """Table-6 rows on one preference set (default: the first): base and each checkpoint; ``best`` marks
    the highest-ranked value per metric and cell (a ranking of single checkpoints, not a test: the
    arms' tested comparisons are the raw-score rows)."""
    pr = pr if pr is not None else sp.preference
    if pr is None:
        return None
    rows = []
    for label, _, c in preference_sets(sp, layout, pr):
        mj = metrics_json(metrics_path(layout.metrics_dir(label, True, pr.name)))["metrics"]
        rows.append({"label": "Base model" if c is None else f"{c['name']} (E{int(c['epoch'])})",
                     "role": "base" if c is None else c["role"], "cell": "" if c is None else c["cell"],
                     "values": {m: mj.get(m) for m in pr.metrics}})
    mark_best(rows, pr.metrics)
    return {"name": pr.name, "prompts": pr.prompts, "seeds": pr.seeds, "columns": list(pr.metrics), "rows": rows,
            "epochs": pr.epochs}


def _per_update_values(v: Any) -> list[float]:
    """One epoch's per-update list as floats; a missing value (null in log.parquet: a NaN that pandas
    wrote as null, read back as None) becomes NaN (null in results.json); an epoch without the list, []."""
    if v is None or isinstance(v, (str, bytes)) or not hasattr(v, "__len__"):
        return []
    return [math.nan if x is None else float(x) for x in v]


def traces(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """Per run: log columns by epoch, and reward / clip fraction smoothed with the study's window."""
    from pcpo_eval.report.kl_ref import running_mean
    from pcpo_eval.stats import moving_average

    out = []
    for r in sp.runs:
        log = load_log(log_path(layout.run_dir(r)))
        tr: dict[str, Any] = {"run": r.name, "role": sp.role(r), "cell": sp.cell_key(r), "seed": r.seed,
                              "arm": sp.arm(r), "levels": r.levels, "epoch": log["epoch"].astype(int).tolist()}
        for col in TRACE_COLUMNS:
            if col in log.columns:
                tr[col] = log[col].astype(float).tolist()
        for col in PER_UPDATE_COLUMNS:
            if col in log.columns:
                tr[col] = [_per_update_values(v) for v in log[col]]
        tr["reward_smoothed"] = moving_average(log["reward_mean"].to_numpy(), sp.window).tolist()
        if "clipfrac" in log.columns:
            tr["clipfrac_smoothed"] = moving_average(log["clipfrac"].to_numpy(), sp.window).tolist()
        if "kl_ref" in log.columns:  # Fig. sd3_flowgrpo (c, d): KL to the reference as a running mean (l.1304-1307)
            tr["kl_ref_running_mean"] = running_mean(log["kl_ref"].tolist())
        out.append(tr)
    return out


def grids(sp: StudySpec, layout: StudyLayout) -> list[dict[str, Any]]:
    """Same prompts and seeds for base / baseline / PCPO per grid and cell (:mod:`.grids`)."""
    from pcpo_eval.study.grids import grid_blocks

    return grid_blocks(sp, layout)


# ------------------------------------------------------------------------------------------------
# results.json
# ------------------------------------------------------------------------------------------------


def study_block(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """``results.json`` ``study``: what was run and how it was evaluated."""
    spec_yaml = Path(sp.source).read_text() if Path(sp.source).is_file() else ""
    return {"name": sp.name, "description": sp.description, "source": sp.source, "spec_yaml": spec_yaml,
            "created": time.strftime("%Y-%m-%d %H:%M:%S"), "factors": {k: list(v) for k, v in sp.factors.items()},
            "compare": {"factor": sp.compare_factor, "baseline": sp.baseline, "pcpo": sp.pcpo},
            "seeds": {arm: list(s) for arm, s in sp.seeds.items()}, "paired_control": sp.paired_control,
            "runs": [{"name": r.name, "levels": {**r.levels, "seed": str(r.seed)}, "run_dir": str(layout.run_dir(r)),
                      "trained_by_study": r.run_dir is None} for r in sp.runs],
            "sampling": sp.sampling(), "eval": dataclasses.asdict(sp.eval), "targets": list(sp.targets),
            "gain_targets": list(sp.gain_targets), "primary": list(sp.primary), "select_target": sp.select_target, "select_epoch": sp.select_epoch, "window": sp.window,
            "versions": {"python": platform.python_version()}}


def trained_credit(sp: StudySpec) -> tuple[Any, Any, str]:
    """The credit figure's panels for the schedule and convention the PCPO arm trained (DDIM: its
    steps, eta, convention and fallback on the model's scheduler; flow: its SDE, steps, eta, shift);
    the other panels keep the paper's settings. Returns (ddim, flows, caption)."""
    from pcpo_eval.credit.ddim import SD1_DDIM_CONFIG, ddim_schedule, pcpo_ddim_credit
    from pcpo_eval.credit.flow import flow_credit
    from pcpo_eval.models.registry import parse_spec, prediction_of

    cfg = next((r.train for r in sp.runs if r.train is not None and sp.arm(r) == sp.pcpo), None)
    if cfg is None:
        return None, None, "paper settings (the PCPO arm's runs were not trained by the study)"
    if prediction_of(cfg.model) == "velocity":
        f = flow_credit(cfg.sde, cfg.sample_steps, cfg.sample_eta, cfg.flow_shift)
        return None, [f], (f"panel ({'c' if cfg.sde == 'dance' else 'd'}) as trained: {cfg.sde} SDE, "
                           f"{cfg.sample_steps} steps, eta {cfg.sample_eta:g}, shift {cfg.flow_shift:g}")
    kind, arg = parse_spec(cfg.model)
    sched = SD1_DDIM_CONFIG
    if kind == "toy":
        from pcpo_eval.toy import model as toy_model

        sched = toy_model.load_json(Path(arg or toy_model.WEIGHTS_DIR) / "scheduler_config.json")
    d = pcpo_ddim_credit(ddim_schedule(sched, cfg.sample_steps, cfg.sample_eta), cfg.credit_convention,
                         fallback=cfg.credit_fallback)
    return d, None, (f"panels (a)-(b) as trained: {cfg.model} scheduler, {cfg.sample_steps} DDIM steps, eta "
                     f"{cfg.sample_eta:g}, {cfg.credit_convention} convention, fallback {cfg.credit_fallback}")

def build_results(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """Everything the report formats (JSON-able), from the spec and the files under ``layout.out``."""
    from pcpo_eval.credit.plot import save_credit_figure
    from pcpo_eval.report.kl_ref import kl_ref_png
    from pcpo_eval.study.history import history_caveat, run_epochs
    from pcpo_eval.study.verdicts import run_level

    level = run_level(sp, layout)
    looks = history_caveat(sp, layout, level["verdict"], run_epochs(level["runs"]))  # a chosen verdict says so
    if looks is not None and looks["note"]:
        level = {**level, "headline": f"{level['headline'].rstrip()} {looks['note']}.",
                 "verdict_notes": [*level["verdict_notes"], looks["note"]]}
    raw, lmm, labels = image_metrics(sp, layout)
    if looks is not None and looks["image_note"]:
        raw = {**raw, "history_note": looks["image_note"]}
    fig = layout.credit_figure
    credit_note = trained_credit(sp)
    save_credit_figure(fig, *credit_note[:2])  # figures/credit.png (300 dpi) + credit.svg + credit.pdf
    trace_rows = traces(sp, layout)
    kl_png = kl_ref_png(trace_rows)
    if kl_png is not None:
        atomic_write_bytes(layout.out / "figures" / "kl_ref_reward.png", kl_png)
    results = {
        "study": study_block(sp, layout),
        "headline": level["headline"],
        "verdict": level["verdict"],
        "verdict_notes": level["verdict_notes"],
        "sampler_offset": level["sampler_offset"],
        "targets": level["targets"],
        "runs": level["runs"],
        "rliable": level["rliable"],
        "metric_labels": {**METRIC_LABELS, **labels},
        "metrics": list(sp.metrics),
        "speedup": level["speedup"],
        "selection": (sel := json.loads(layout.selection_file.read_text())) | {
            "balance": reward_balance(sp, sel.get("runs") or [], sp.lmm.alpha)},
        "raw_scores": raw,
        "lmm": lmm,
        "preference": preference_table(sp, layout),
        "preferences": [preference_table(sp, layout, p) for p in sp.preferences],
        "traces": trace_rows,
        "figures": {"credit": fig.relative_to(layout.out).as_posix(), "credit_note": credit_note[2],
                    "kl_ref": "figures/kl_ref_reward.png" if kl_png is not None else None},
        "grids": grids(sp, layout),
        "human": json.loads(layout.human_file.read_text()) if layout.human_file.is_file() else None,
        "analysis_history": looks,
    }
    return to_jsonable(results)
