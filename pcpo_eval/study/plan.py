"""Plan a study before training: the seeds per arm that detect a stated effect, the compute, the disk.

``pcpo-eval study SPEC --plan [--pilot STUDY_DIR | --cv CV] [--effect 0.25]``

* The spread: from a **pilot** (a finished study folder: its ``results.json`` runs, i.e. the per-
  epoch rewards and paired controls of every run, and its verdict), or from a stated run-to-run
  coefficient of variation ``--cv`` (SD / mean of a per-run quantity) when there is no pilot.
* The effect (``--effect``, default 0.25): a relative change, i.e. a paired gain 25% above the
  baseline's, and a 25% speed-up to each gain / reward target.
* The seeds: :func:`pcpo_eval.stats.power.seeds_needed` (80% power, the same t test the verdict
  uses, two-sided at the endpoint's family level ``0.05 / m``: the verdict's rows must pass Holm over
  their family; ``m`` from the pilot's verdict rows when it has them (it knows which targets are
  informative), else :func:`pcpo_eval.stats.verdict.planned_family_sizes` with every target counted,
  so conservative): paired by seed when the spec's arms share seeds (the pilot's SD of the per-seed
  differences), else Welch. With ``--cv`` the SD of a per-seed difference is taken as
  ``cv * mean * sqrt(2)``, i.e. no benefit from pairing (conservative).
* Disk and GPU-hours from the spec alone (:mod:`.footprint`): checkpoint sizes from parameter counts
  (optimizer state in each run's newest checkpoint only, ``keep_checkpoints``), image sets from
  images x PNG bytes at the model's resolution, GPU-hours from the measured GPU figures
  (``not measured`` where none exists).
* Compute and disk: from the pilot's logged time per epoch (``wall_time_s``, sampling + training +
  control) and its bytes per run (checkpoints, logs, sets), scaled to the spec's runs and epochs.
  Without a pilot they are not estimated (the command says so).

The same numbers appear in every verdict row (``mde``, and the seeds a 25% speed-up needs), computed
from the study's own runs; this command gives them before any training.
"""

from __future__ import annotations

import json
import math
from pathlib import Path
from typing import Any

import numpy as np

from pcpo_eval.errors import UserError
from pcpo_eval.stats.power import family_level, seeds_needed
from pcpo_eval.study.footprint import footprint_lines
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import RESULTS_FILE, RUN_COMPUTE_KEY, StudyLayout, upgrade_runs

#: the relative effect planned for when --effect is not given (the paper's speed-ups are 25-41%)
PLAN_DEFAULT_EFFECT = 0.25


def _pilot(path: Path) -> dict[str, Any]:
    f = path / RESULTS_FILE
    if not f.is_file():
        raise UserError(f"--pilot {path} has no {RESULTS_FILE}; give a finished study folder (pcpo-eval study ... --out DIR)")
    try:
        res = json.loads(f.read_text())
    except (OSError, ValueError) as exc:
        raise UserError(f"cannot read {f}: {exc}; re-run the pilot's stats stage (--stages stats,report)") from None
    if not isinstance(res, dict) or not res.get("verdict"):
        raise UserError(f"the pilot {path} has no run-level verdict; it needs >= 2 runs per arm with paired controls")
    return upgrade_runs(res)


def _row_sd(row: dict[str, Any]) -> float | None:
    """The SD behind a verdict row: back out of its CI half-width (t quantile x SE) and its n."""
    from scipy import stats

    if row.get("ci_low") is None or row.get("ci_high") is None or not row.get("details", {}).get("df"):
        return None
    df = float(row["details"]["df"])
    se = (float(row["ci_high"]) - float(row["ci_low"])) / (2 * float(stats.t.ppf(0.975, df)))
    n = int(row["n_baseline_runs"])
    return se * math.sqrt(n) if row.get("paired") else se * math.sqrt(n / 2)


def _speedup_sd(row: dict[str, Any], crossing: str = "") -> tuple[float, float] | None:
    """(baseline restricted-mean epochs, SD of the per-seed difference in epochs) of a speed-up row, from its
    first crossings or (``crossing="midpoint_"``) its midpoint crossings (``stats.speedup.bound_by_midpoint``)."""
    d = row.get("details") or {}
    b, t = np.asarray(d.get(f"{crossing}baseline_epochs") or []), np.asarray(d.get(f"{crossing}treatment_epochs") or [])
    if b.size < 2 or t.size < 2:
        return None
    sd = float(np.std(b - t, ddof=1)) if row.get("paired") and b.size == t.size else \
        math.sqrt(float(np.var(b, ddof=1)) + float(np.var(t, ddof=1)))
    return float(b.mean()), sd


#: the verdict's significance level (:func:`pcpo_eval.study.verdicts.verdict` runs at the default)
PLAN_ALPHA = 0.05


def family_levels(sp: StudySpec) -> dict[str, tuple[float, int]]:
    """Row name -> (its family's test level ``alpha / m``, ``m``) in this spec's verdict."""
    from pcpo_eval.stats.verdict import planned_family_sizes

    sizes, fam = planned_family_sizes(sp.paired_control, sp.gain_targets, sp.targets, sp.primary, len(sp.cells()))
    return {q: (family_level(PLAN_ALPHA, sizes[f]), sizes[f]) for q, f in fam.items()}


def plan_rows(sp: StudySpec, pilot: dict[str, Any] | None, cv: float | None, effect: float) -> list[dict[str, Any]]:
    """Per endpoint: the baseline level, the SD used, the effect, its family's level and the seeds per
    arm it needs at that level."""
    paired = len({tuple(v) for v in sp.seeds.values()}) == 1
    levels = family_levels(sp)
    out = []
    pv = (pilot or {}).get("verdict") or []
    # a pilot analysed before the sampler offset was a secondary row (2026-11-28) counted one row less per cell
    stale = (any(r["quantity"] == "paired_gain" for r in pv) and not any(r["quantity"] == "sampler_offset" for r in pv))
    extra = len({(r["cell"], r.get("treatment")) for r in pv if r["quantity"] == "paired_gain"}) if stale else 0

    def need(q: str, delta: float, sd: float, paired_: bool, row: dict[str, Any] | None = None) -> dict[str, Any]:
        a, m = levels.get(q, (PLAN_ALPHA, 1))
        seen = ((row or {}).get("details") or {}).get("family_size")
        if seen and (row or {}).get("family") == "secondary":
            seen = int(seen) + extra
        if seen and seen <= m:  # the pilot's verdict knows which targets are informative: its family
            a, m = family_level(PLAN_ALPHA, int(seen)), int(seen)
        measured = None  # a pilot's spread is itself measured from its few runs: plan over its uncertainty
        if row is not None and row.get("n_baseline_runs"):
            nb = int(row["n_baseline_runs"])
            measured = nb if paired_ else (nb, int(row.get("n_treatment_runs") or nb))
        return {"seeds": seeds_needed(delta, sd, paired=paired_, alpha=a, measured=measured), "level": a,
                "family_size": m}

    if pilot is not None:
        for row in pilot["verdict"]:
            q = row["quantity"]
            if q == "sampler_offset":  # in the secondary family (its size counts it), but not an effect to plan for
                continue
            if q.startswith("speedup"):
                # "sooner" needs the first-crossing and the midpoint test: plan for the one that needs more seeds
                plans = []
                for crossing in ("", "midpoint_"):
                    got = _speedup_sd(row, crossing)
                    if got is None:
                        continue
                    base, sd = got
                    delta = base - base / (1 + effect)
                    n = need(q, delta, sd, True, row) if row.get("paired") else need(q, delta, sd / math.sqrt(2), False, row)
                    plans.append({"endpoint": q, "baseline": base, "sd": sd, "effect": f"{effect:+.0%} speed-up", **n})
                if plans:
                    out.append(max(plans, key=lambda x: math.inf if x["seeds"] is None else x["seeds"]))
            else:
                sd = _row_sd(row)
                base = row.get("baseline_value")
                if sd is None or base is None or base == 0:
                    continue
                delta = effect * abs(float(base))
                out.append({"endpoint": q, "baseline": float(base), "sd": sd, "effect": f"{effect:+.0%} of the baseline",
                            **need(q, delta, sd, bool(row.get("paired")), row)})
        return out
    assert cv is not None
    sd_rel = cv * math.sqrt(2)  # SD of a per-seed difference relative to the mean, no benefit from pairing
    gains = sp.gain_targets if sp.paired_control else ()  # no control: no gain curve, final reward is primary
    for q in ("paired_gain" if sp.paired_control else "final_reward", *[f"speedup_gain:{g:g}" for g in gains],
              *[f"speedup_reward:{t:g}" for t in sp.targets]):
        rel = effect if not q.startswith("speedup") else 1 - 1 / (1 + effect)
        out.append({"endpoint": q, "baseline": None, "sd": None, "effect": f"{effect:+.0%}" + (" speed-up" if q.startswith("speedup") else ""),
                    **(need(q, rel, sd_rel, True) if paired else need(q, rel, cv, False))})
    return out


def gate_lines(sp: StudySpec, rows: list[dict[str, Any]]) -> list[str]:
    """What the seeds of a secondary speed-up row presume: the secondary family is tested only once every
    primary row is significant (serial gate), so a pure speed-up (the same plateau reached sooner) leaves a
    paired-gain primary nothing to find. The plan printed "speedup_gain:0.06 ... 29 seeds per arm" as if
    that row stood alone; with such a speed-up it was significant in 3-8% of simulated studies."""
    from pcpo_eval.stats.verdict import planned_family_sizes

    _, fam = planned_family_sizes(sp.paired_control, sp.gain_targets, sp.targets, sp.primary, len(sp.cells()))
    gated = [r["endpoint"] for r in rows if r["endpoint"].startswith("speedup") and fam.get(r["endpoint"]) != "primary"]
    if not gated:
        return []
    primary = sorted(q for q, f in fam.items() if f == "primary")
    return [f"  the speed-up rows ({', '.join(dict.fromkeys(gated))}) are secondary: tested only once the primary "
            f"({', '.join(primary)}) is significant, so their seeds presume it is; a faster arm that reaches the same "
            f"plateau leaves the primary nothing to find. If speed is the claim, name it the primary "
            f"(primary: [{gated[0]}]) in a new study"]


def _dir_bytes(path: Path) -> int:
    return sum(f.stat().st_size for f in path.rglob("*") if f.is_file())


def resources(sp: StudySpec, pilot_dir: Path | None, pilot: dict[str, Any] | None, seeds: int) -> list[str]:
    """Compute and disk of the spec at ``seeds`` seeds per arm, scaled from the pilot."""
    if pilot is None or pilot_dir is None:
        return ["compute and disk: give --pilot STUDY_DIR (a small finished study of this spec) to estimate them"]
    runs = pilot.get("runs") or []
    per_epoch = [float(np.mean(np.diff([0.0, *r[RUN_COMPUTE_KEY]]))) for r in runs if r.get(RUN_COMPUTE_KEY)]
    n_runs = len({(cell, a) for cell, a in ((r.get("cell"), r.get("arm")) for r in runs)}) * seeds
    epochs = max(int(r.train.epochs) for r in sp.runs if r.train is not None) if any(r.train for r in sp.runs) else 0
    lines = []
    if per_epoch:
        core_s = float(np.mean(per_epoch)) * epochs * n_runs
        lines.append(f"compute: {n_runs} runs x {epochs} epochs x {np.mean(per_epoch):.2f} s/epoch (pilot's logged "
                     f"training time, one process) = {core_s / 3600:.2f} process-hours of training, before evaluation")
    run_root = StudyLayout(pilot_dir).runs_root
    if run_root.is_dir() and runs:
        per_run = _dir_bytes(run_root) / max(1, len(runs))
        total = _dir_bytes(pilot_dir) - _dir_bytes(run_root) + per_run * n_runs
        lines.append(f"disk: about {total / 1e9:.2f} GB ({per_run / 1e6:.1f} MB per run as in the pilot, "
                     f"{n_runs} runs, plus the pilot's sets and metrics)")
    return lines


def plan_text(sp: StudySpec, pilot_dir: Path | None = None, cv: float | None = None,
              effect: float = PLAN_DEFAULT_EFFECT) -> str:
    """The plan as printed by ``pcpo-eval study SPEC --plan``."""
    if (pilot_dir is None) == (cv is None):
        raise UserError("--plan needs either --pilot STUDY_DIR (a finished pilot study) or --cv CV (a stated "
                        "run-to-run SD / mean), not both and not neither")
    if cv is not None and not (math.isfinite(cv) and cv > 0):
        raise UserError(f"--cv must be a positive number (run-to-run SD / mean), got {cv}")
    if not (math.isfinite(effect) and effect > 0):
        raise UserError(f"--effect must be a positive fraction (0.25 = 25%), got {effect}")
    pilot = _pilot(pilot_dir) if pilot_dir is not None else None
    rows = plan_rows(sp, pilot, cv, effect)
    paired = len({tuple(v) for v in sp.seeds.values()}) == 1
    src = f"pilot {pilot_dir}" if pilot is not None else f"stated CV {cv:g} (no pairing benefit assumed)"
    lines = [f"plan for {sp.name}: seeds per arm for 80% power at two-sided 5%, Holm within the verdict's families "
             f"(each row at 5% / its family's rows: {'as in the pilot' if pilot is not None else 'every target counted'}) ({'paired by seed' if paired else 'unpaired'}), "
             f"spread from the {src}"]
    for r in rows:
        lvl = "" if r["baseline"] is None else f" (baseline {r['baseline']:.4g}, SD {r['sd']:.3g})"
        need = "more than 10000" if r["seeds"] is None else str(r["seeds"])
        fam = f" (at {r['level']:.3g}: Holm over {r['family_size']} rows)" if r["family_size"] > 1 else ""
        lines.append(f"  {r['endpoint']}: {r['effect']}{lvl} -> {need} seeds per arm{fam}")
    lines += gate_lines(sp, rows)
    now = {len(v) for v in sp.seeds.values()}
    lines.append(f"  the spec trains {', '.join(map(str, sorted(now)))} seed(s) per arm")
    need = max((r["seeds"] for r in rows if r["seeds"] is not None), default=None)
    lines += ["  " + x for x in resources(sp, pilot_dir, pilot, need or max(now))]
    lines += footprint_lines(sp)  # disk and GPU-hours from the spec itself (study/footprint.py)
    return "\n".join(lines)
