"""Run-level results of a study: the per-run curves, the verdict over runs, the sampler offset.

Runs (design cell x training seed), not prompts, are the replicates (rliable, Agarwal et al.
2021; :mod:`pcpo_eval.stats.runlevel`). Per comparison cell (e.g. one batch size) the baseline
arm's runs are compared with the PCPO arm's runs by :func:`pcpo_eval.stats.verdict.verdict_rows`:

* ``paired_gain`` -- mean of ``reward - control`` over the last ``k`` epochs (k = the smoothing
  window, 5, or fewer for shorter runs), when every compared run logged its paired untrained
  control (``paired_control: true``): the same prompts and noises through the untrained model
  and the arm's own sampler, so the sampler's offset and the prompt draw cancel;
* ``final_reward`` -- mean reward of the last ``k`` epochs;
* ``auc`` -- mean reward over training (normalised trapezoid area);
* ``speedup:<target>`` -- mean(E_base) / mean(E_pcpo) - 1 with Fieller's CI and censored runs
  explicit, for every *informative* target.

Estimates come with Welch t intervals over runs, exact permutation p-values over run
relabellings, and nothing is significant with one run per arm ("1 run per arm: differences
between runs"). Curves of a cell are cut to the epochs every run of that cell logged, so the arms
are compared over the same training length. The permutation and bootstrap draws use a fixed
generator (:data:`VERDICT_SEED`), so ``results.json`` is reproducible.

Guards: a target that every run's smoothed reward reaches at its first epoch says nothing about
learning speed ("uninformative"); it is kept in the speed-up table with that label and left out of
the verdict. The **sampler offset** per cell compares the arms' untrained controls: their mean
reward, the difference with its Welch interval, and the speed-up the control curves alone would
show, set against the trained runs' speed-up (PCPO samples with its own sigma~ schedule, so an
untrained PCPO model can score differently from an untrained DDPO model).
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.stats.runlevel import Speedup, compare_runs, epochs_to_target, speedup_runs
from pcpo_eval.stats.verdict import CONTROL_COLUMN, verdict_rows
from pcpo_eval.study.layout import StudyLayout
from pcpo_eval.study.spec import StudySpec

#: seed of the permutation (Monte Carlo above 10,000 relabellings) and bootstrap draws
VERDICT_SEED = 20240601
UNINFORMATIVE = "uninformative: every run's smoothed reward starts at or above this target"


def run_logs(sp: StudySpec, layout: StudyLayout) -> dict[str, pd.DataFrame]:
    """Each run's ``log.parquet`` (validated, in epoch order)."""
    from pcpo_eval.stats import load_log

    return {r.name: load_log(layout.run_dir(r) / "log.parquet") for r in sp.runs}


def _column(log: pd.DataFrame, col: str) -> list[float] | None:
    return log[col].astype(float).tolist() if col in log.columns else None


def _wall_clock(log: pd.DataFrame) -> list[float] | None:
    """Cumulative training wall-clock seconds per epoch: the trainer's ``wall_clock_s`` (sampling +
    training, without the paired control, validation and checkpoint writes), else the cumulative
    sum of ``wall_time_s`` (older runs: the whole epoch)."""
    if "wall_clock_s" in log.columns and np.isfinite(log["wall_clock_s"].to_numpy(np.float64)).all():
        return log["wall_clock_s"].astype(float).tolist()
    if "wall_time_s" in log.columns:
        return log["wall_time_s"].astype(float).fillna(0.0).cumsum().tolist()
    return None


def has_control(log: pd.DataFrame) -> bool:
    """The run logged a finite paired control every epoch."""
    return CONTROL_COLUMN in log.columns and bool(np.all(np.isfinite(log[CONTROL_COLUMN].to_numpy(np.float64))))


def ppo_health(log: pd.DataFrame) -> dict[str, Any]:
    """Median approx. KL, mean clip fraction and the trainer's 'updates too large' warning."""
    from pcpo_eval.train.trainer import ppo_health_warning

    kl = log["approx_kl"].to_numpy(np.float64) if "approx_kl" in log.columns else np.array([])
    cf = log["clipfrac"].to_numpy(np.float64) if "clipfrac" in log.columns else np.array([])
    return {"median_approx_kl": float(np.nanmedian(kl)) if np.isfinite(kl).any() else None,
            "mean_clipfrac": float(np.nanmean(cf)) if np.isfinite(cf).any() else None,
            "warning": ppo_health_warning(log)}


def runs_entries(sp: StudySpec, logs: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """``results.json`` ``runs``: per run its curves (wall time cumulative) and PPO health."""
    out = []
    for r in sp.runs:
        log = logs[r.name]
        wall = _wall_clock(log)
        out.append({
            "run": r.name, "cell": sp.cell_key(r), "arm": sp.arm(r), "seed": r.seed,
            "epochs": log["epoch"].astype(int).tolist(), "reward_mean": _column(log, "reward_mean"),
            "control_reward_mean": _column(log, CONTROL_COLUMN) if has_control(log) else None,
            "wall_time_s": wall, "approx_kl": _column(log, "approx_kl"), "clipfrac": _column(log, "clipfrac"),
            "ppo_health": ppo_health(log),
        })  # fmt: skip
    return out


def runs_table(sp: StudySpec, logs: dict[str, pd.DataFrame]) -> pd.DataFrame:
    """The tidy (arm, cell, seed, epoch, reward_mean[, control_reward_mean]) table of the compared runs,
    each cell cut to the epochs all its runs logged; the control column only if every run has one."""
    runs = [r for r in sp.runs if sp.role(r) in ("baseline", "pcpo")]
    with_control = all(has_control(logs[r.name]) for r in runs)
    frames = []
    for cell in sp.cells():
        in_cell = [r for r in runs if sp.cell_key(r) == cell]
        last = min((int(logs[r.name]["epoch"].max()) for r in in_cell), default=0)
        for r in in_cell:
            log = logs[r.name]
            log = log[log["epoch"] <= last]
            df = pd.DataFrame({"arm": sp.arm(r), "cell": cell, "seed": str(r.seed),
                               "epoch": log["epoch"].astype(int).to_numpy(),
                               "reward_mean": log["reward_mean"].astype(float).to_numpy()})
            if with_control:
                df[CONTROL_COLUMN] = log[CONTROL_COLUMN].astype(float).to_numpy()
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def target_status(sp: StudySpec, logs: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """Per target: ``informative``, or ``uninformative`` when every run reaches it at its first epoch."""
    out = []
    for t in sp.targets:
        at_start = [epochs_to_target(log["reward_mean"].to_numpy(), t, sp.window,
                                     epochs=log["epoch"].to_numpy()).at_start for log in logs.values()]
        ok = not all(at_start)
        out.append({"target": t, "status": "informative" if ok else "uninformative", "headline": ok,
                    "note": "" if ok else UNINFORMATIVE})
    return out


def _quantity(q: str) -> str:
    """stats.verdict's quantity names -> the results.json contract (``final_reward``, ``speedup:<t>``)."""
    if q == "final":
        return "final_reward"
    return q.replace("speedup@", "speedup:")


def verdict(sp: StudySpec, table: pd.DataFrame, targets: Sequence[float]) -> list[dict[str, Any]]:
    """Verdict rows over runs (PCPO arm vs baseline arm, per cell), see the module docstring."""
    k = max(1, min(sp.window, int(table.groupby(["arm", "cell", "seed"]).size().min())))
    rows = verdict_rows(table, sp.baseline, [sp.pcpo], rng=np.random.default_rng(VERDICT_SEED),
                        targets=list(targets), k=k, window=sp.window)
    return [v.to_dict() | {"quantity": _quantity(v.quantity)} for v in rows]


def _curves(table: pd.DataFrame, cell: str, arm: str, col: str) -> list[tuple[np.ndarray, np.ndarray]]:
    """(epochs, values) of column ``col`` for each run of ``arm`` in ``cell``."""
    d = table[(table["cell"] == cell) & (table["arm"] == arm)].sort_values("epoch")
    return [(g["epoch"].to_numpy(), g[col].to_numpy(np.float64)) for _, g in d.groupby("seed", sort=True)]


def _pct(x: float | None) -> str:
    return "?" if x is None else f"{x:.0%}"


def control_speedup_phrase(s: Speedup, target: float, trained: dict[str, Any] | None) -> str:
    """What the untrained control curves alone give as 'speed-up' to ``target`` (vs the trained runs')."""
    if s.n_censored_baseline == s.n_baseline and s.n_censored_treatment == s.n_treatment:
        text = f"neither arm's untrained control reaches {target:g}, so the samplers alone give no speed-up to it"
    elif s.uninformative:
        text = f"both arms' untrained controls start at or above {target:g}"
    elif s.estimate is None:
        text = f"the control-curve speed-up to {target:g} is not estimable ({s.reason})"
    else:
        word = {"lower": "at least ", "upper": "at most "}.get(s.bound, "")
        ci = "" if not s.estimable else (f", 95% CI {_pct(s.ci_low) if s.ci_low is not None else 'unbounded'} to "
                                         f"{_pct(s.ci_high) if s.ci_high is not None else 'unbounded'}")
        text = f"on the untrained control curves alone the speed-up to {target:g} is {word}{_pct(s.estimate)}{ci}"
    if trained is not None and trained.get("estimate") is not None:
        text += f" (trained runs: {_pct(trained['estimate'])})"
    return text


def sampler_offset(sp: StudySpec, table: pd.DataFrame, rows: Sequence[dict[str, Any]],
                   targets: Sequence[float]) -> dict[str, dict[str, Any]]:
    """Per cell: the arms' mean untrained-control reward, the difference (Welch CI over runs) and what
    the samplers alone explain; {} when the runs have no paired control."""
    if CONTROL_COLUMN not in table.columns:
        return {}
    out = {}
    for cell in sorted(table["cell"].unique()):
        cb, ct = (_curves(table, cell, arm, CONTROL_COLUMN) for arm in (sp.baseline, sp.pcpo))
        if not cb or not ct:
            continue
        mb = np.asarray([c.mean() for _, c in cb])
        mt = np.asarray([c.mean() for _, c in ct])
        cmp_ = compare_runs(mb, mt, rng=np.random.default_rng(VERDICT_SEED))
        phrases = []
        for t in targets:
            s = speedup_runs([epochs_to_target(c, t, sp.window, epochs=e) for e, c in cb],
                             [epochs_to_target(c, t, sp.window, epochs=e) for e, c in ct],
                             rng=np.random.default_rng(VERDICT_SEED))
            trained = next((r for r in rows if r["cell"] == cell and r["quantity"] == f"speedup:{t:g}"), None)
            phrases.append(control_speedup_phrase(s, t, trained))
        diff = float(mt.mean() - mb.mean())
        ci = (f", 95% CI {cmp_.ci_low:+.3g} to {cmp_.ci_high:+.3g}" if cmp_.estimable else
              f"; {cmp_.reason}")  # fmt: skip
        head = (f"untrained controls (same prompts and noises, each arm's sampler): {sp.pcpo} {mt.mean():.4g} vs "
                f"{sp.baseline} {mb.mean():.4g} (difference {diff:+.3g}{ci})")
        out[cell] = {"baseline_control_mean": float(mb.mean()), "treatment_control_mean": float(mt.mean()),
                     "difference": diff, "ci_low": cmp_.ci_low, "ci_high": cmp_.ci_high,
                     "significant": cmp_.significant, "explains": "; ".join([head, *phrases])}
    return out


def run_level(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """``runs``, ``verdict``, ``sampler_offset`` and ``targets`` of ``results.json``."""
    logs = run_logs(sp, layout)
    table = runs_table(sp, logs)
    status = target_status(sp, logs)
    informative = [s["target"] for s in status if s["headline"]]
    rows = verdict(sp, table, informative)
    notes = []
    if CONTROL_COLUMN not in table.columns:
        lacking = [r.name for r in sp.runs if not has_control(logs[r.name])]
        notes.append(f"no paired gain or sampler offset: {len(lacking)} run(s) lack control_reward_mean "
                     f"({', '.join(lacking[:4])}{', ...' if len(lacking) > 4 else ''}); train with paired_control: true")
    return {"runs": runs_entries(sp, logs), "verdict": rows, "sampler_offset": sampler_offset(sp, table, rows, informative),
            "targets": status, "verdict_notes": notes}
