"""Run-level results of a study: the per-run curves, the verdict over runs, the sampler offset.

Runs (design cell x training seed), not prompts, are the replicates (rliable, Agarwal et al.
2021). Per comparison cell the baseline arm's runs are compared with the PCPO arm's runs by
:func:`pcpo_eval.stats.verdict.verdict_rows`, paired by seed when both arms trained the same seeds
(a study's default): ``paired_gain`` (the primary endpoint unless ``primary:`` says otherwise),
``final_reward``, ``auc``, ``speedup_gain:<g>`` for ``gain_targets`` (learning speed) and
``speedup_reward:<t>`` for ``targets`` (the paper's raw-reward speed-up), with Holm adjustment
within the primary and within the secondary family, and the power of every row.

Curves of a cell are cut to the epochs every run of that cell logged, so the arms are compared over
the same training length; a cut says so in the notes and in the headline (which run stopped where).
A run that logged its paired control but misses it at some epochs keeps its control: only the rows
that need those epochs become not estimable (the paired gain needs the last ``k`` epochs), and a note
names the run and the epochs. The permutation and bootstrap draws use a fixed generator
(:data:`VERDICT_SEED`), so ``results.json`` is reproducible.

The **sampler offset** per cell compares the arms' untrained controls (same prompts and noises,
each arm's own sampler), paired by seed: PCPO samples with its own sigma~ schedule, so an untrained
PCPO model can score differently from an untrained DDPO model, and a raw-reward speed-up can then
be the sampler's. When the offset is significant and the raw-reward speed-up is not matched by a
learning (gain) speed-up, a sentence says that the offset explains it.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import replace
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.rundir import load_log, log_path
from pcpo_eval.stats.fmt import p_value, pct
from pcpo_eval.stats.rliable import rliable_panels
from pcpo_eval.stats.runlevel import compare_runs
from pcpo_eval.stats.speedup import separated, speedup_cell_epochs
from pcpo_eval.stats.verdict import (
    CONTROL_COLUMN,
    GATED,
    RunCurve,
    Verdict,
    control_mean,
    detectable,
    headline,
    pair_runs,
    run_curves,
    run_scalar,
    target_status,
    unpaired_seeds,
    verdict_rows,
)
from pcpo_eval.study.spec import StudySpec
from pcpo_eval.studydir import RUN_COMPUTE_KEY, StudyLayout

#: seed of the permutation (Monte Carlo above 10,000 relabellings) and bootstrap draws
VERDICT_SEED = 20240601
#: the verdict's level (:func:`verdict_rows`' default, which :func:`verdict` uses)
ALPHA = 0.05


def run_logs(sp: StudySpec, layout: StudyLayout) -> dict[str, pd.DataFrame]:
    """Each run's ``log.parquet`` (validated, in epoch order)."""
    return {r.name: load_log(log_path(layout.run_dir(r))) for r in sp.runs}


def _column(log: pd.DataFrame, col: str) -> list[float] | None:
    return log[col].astype(float).tolist() if col in log.columns else None


def _wall_clock(log: pd.DataFrame) -> list[float] | None:
    """Cumulative seconds of each run's own compute per epoch for the time axis: the trainer's ``compute_s``
    (sampling + training without the paired control; process CPU seconds on CPU, so runs sharing cores do
    not look slow; wall seconds on a GPU), else its ``wall_clock_s`` (older runs), else the cumulative sum
    of ``wall_time_s``."""
    for col in ("compute_s", "wall_clock_s"):
        if col in log.columns and np.isfinite(log[col].to_numpy(np.float64)).all():
            return log[col].astype(float).tolist()
    if "wall_time_s" in log.columns:
        return log["wall_time_s"].astype(float).fillna(0.0).cumsum().tolist()
    return None


def has_control(log: pd.DataFrame) -> bool:
    """The run logged the paired control (the column, with a finite value at some epoch)."""
    return CONTROL_COLUMN in log.columns and bool(np.isfinite(log[CONTROL_COLUMN].to_numpy(np.float64)).any())


def epoch_gaps(log: pd.DataFrame, last: int) -> list[int]:
    """Epochs ``1..last`` for which a run's log has no row (a log merged by hand after a crash, or an import
    from a sampled history): :func:`runs_table` gives them NaN, so a smoothing window never spans them."""
    return sorted(set(range(1, int(last) + 1)) - set(log["epoch"].astype(int)))


def control_gaps(log: pd.DataFrame) -> list[int]:
    """Epochs at which a run that logged the paired control has none (NaN)."""
    if not has_control(log):
        return []
    bad = ~np.isfinite(log[CONTROL_COLUMN].to_numpy(np.float64))
    return log["epoch"].astype(int).to_numpy()[bad].tolist()


def ppo_health(log: pd.DataFrame) -> dict[str, Any]:
    """Median approx. KL, mean clip fraction and the trainer's 'updates too large' warning."""
    from pcpo_eval.train.trainer import ppo_health_warning

    kl = log["approx_kl"].to_numpy(np.float64) if "approx_kl" in log.columns else np.array([])
    cf = log["clipfrac"].to_numpy(np.float64) if "clipfrac" in log.columns else np.array([])
    return {"median_approx_kl": float(np.nanmedian(kl)) if np.isfinite(kl).any() else None,
            "mean_clipfrac": float(np.nanmean(cf)) if np.isfinite(cf).any() else None,
            "warning": ppo_health_warning(log)}


def runs_entries(sp: StudySpec, logs: dict[str, pd.DataFrame]) -> list[dict[str, Any]]:
    """``results.json`` ``runs``: per run its curves (cumulative compute, :data:`RUN_COMPUTE_KEY`) and PPO health."""
    out = []
    for r in sp.runs:
        log = logs[r.name]
        wall = _wall_clock(log)
        out.append({
            "run": r.name, "cell": sp.cell_key(r), "arm": sp.arm(r), "seed": r.seed,
            "epochs": log["epoch"].astype(int).tolist(), "reward_mean": _column(log, "reward_mean"),
            "control_reward_mean": _column(log, CONTROL_COLUMN) if has_control(log) else None,
            RUN_COMPUTE_KEY: wall, "approx_kl": _column(log, "approx_kl"), "clipfrac": _column(log, "clipfrac"),
            "ppo_health": ppo_health(log),
        })  # fmt: skip
    return out


def _compared(sp: StudySpec) -> list[Any]:
    return [r for r in sp.runs if sp.role(r) in ("baseline", "pcpo")]


def epoch_cuts(sp: StudySpec, logs: dict[str, pd.DataFrame]) -> dict[str, dict[str, Any]]:
    """Per cell whose runs logged different numbers of epochs: the common last epoch, the longest run's
    last epoch and the runs that stopped at the common one (every run of the cell is cut there)."""
    out = {}
    for cell in sp.cells():
        last = {r.name: int(logs[r.name]["epoch"].max()) for r in _compared(sp) if sp.cell_key(r) == cell}
        if last and min(last.values()) < max(last.values()):
            common = min(last.values())
            out[cell] = {"last_epoch": common, "longest": max(last.values()),
                         "short_runs": sorted(n for n, e in last.items() if e == common)}
    return out


def runs_table(sp: StudySpec, logs: dict[str, pd.DataFrame], every_arm: bool = False) -> pd.DataFrame:
    """The tidy (arm, cell, seed, epoch, reward_mean[, control_reward_mean]) table of the compared runs,
    each cell cut to the epochs all its runs logged; the control column if every run logged it (a missing
    epoch stays NaN there). Every run has one row per epoch ``1..last``: an epoch its log lacks is NaN
    (:func:`epoch_gaps`), so the rows that need it are not estimable instead of averaging across the gap.
    ``every_arm``: the other arms' runs too (the rliable panels), on the compared runs' epochs."""
    runs = _compared(sp)
    with_control = all(has_control(logs[r.name]) for r in runs)
    frames = []
    for cell in sp.cells():
        in_cell = [r for r in runs if sp.cell_key(r) == cell]
        last = min((int(logs[r.name]["epoch"].max()) for r in in_cell), default=0)
        if every_arm:
            in_cell = [r for r in sp.runs if sp.cell_key(r) == cell]
        for r in in_cell:
            log = logs[r.name]
            log = log[log["epoch"] <= last].set_index("epoch").reindex(range(1, last + 1)).reset_index()
            df = pd.DataFrame({"arm": sp.arm(r), "cell": cell, "seed": str(r.seed),
                               "epoch": log["epoch"].astype(int).to_numpy(),
                               "reward_mean": log["reward_mean"].astype(float).to_numpy()})
            if with_control:
                df[CONTROL_COLUMN] = (log[CONTROL_COLUMN].astype(float).to_numpy() if CONTROL_COLUMN in log.columns
                                      else np.nan)
            frames.append(df)
    return pd.concat(frames, ignore_index=True)


def compared_runs(sp: StudySpec, table: pd.DataFrame) -> tuple[RunCurve, ...]:
    """The runs of the compared arms, as verdict curves."""
    return run_curves(table[table["arm"].isin([sp.baseline, sp.pcpo])])


def verdict_k(sp: StudySpec, table: pd.DataFrame) -> int:
    """The last epochs a final reward or paired gain averages: the spec's window, at most the runs' epochs."""
    return max(1, min(sp.window, int(table.groupby(["arm", "cell", "seed"]).size().min())))


def verdict(sp: StudySpec, table: pd.DataFrame) -> list[dict[str, Any]]:
    """Verdict rows over runs (PCPO arm vs baseline arm, per cell), see the module docstring."""
    k = verdict_k(sp, table)
    rows = verdict_rows(table, sp.baseline, [sp.pcpo], rng=np.random.default_rng(VERDICT_SEED),
                        targets=list(sp.targets), gain_targets=list(sp.gain_targets) if CONTROL_COLUMN in table else [],
                        primary=sp.primary or None, k=k, window=sp.window)
    return [v.to_dict() for v in rows]


def speedup_blocks(sp: StudySpec, rows: Sequence[dict[str, Any]], status: Sequence[dict[str, Any]]) -> list[dict[str, Any]]:
    """``results.json`` ``speedup``: per cell the speed-up table (paper Tables 1 and 10), gain and reward
    targets, from the verdict's speed-up rows; uninformative targets keep a labelled row."""
    out = []
    for cell in sorted({r["cell"] for r in rows}):
        table = []
        for st in status:
            row = next((r for r in rows if r["cell"] == cell and r["quantity"] == st["quantity"]), None)
            if row is None:
                table.append({"quantity": st["quantity"], "curve": st["curve"], "target": st["target"],
                              "uninformative": True, "status": st["note"], "speedup": None})
                continue
            d = row["details"]
            table.append({"quantity": row["quantity"], "curve": d["curve"], "target": d["target"], "uninformative": False,
                          "baseline_epochs": speedup_cell_epochs(row["baseline_value"], d["n_censored_baseline"],
                                                                 len(d["baseline_epochs"])),
                          "pcpo_epochs": speedup_cell_epochs(row["treatment_value"], d["n_censored_treatment"],
                                                             len(d["treatment_epochs"])),
                          "speedup": row["estimate"], "ci_low": row["ci_low"], "ci_high": row["ci_high"],
                          "ci_gap": d.get("ci_gap"),
                          "p": row["p"], "p_adjusted": row["p_adjusted"], "significant": row["significant"],
                          "mde": row["mde"], "seeds_for_reference": d["seeds_for_reference"], "tau": d["tau"],
                          "status": row["reason"] or "ok"})
        out.append({"cell": cell, "baseline": sp.baseline, "pcpo": sp.pcpo, "window": sp.window, "unit": "epochs",
                    "rows": table})
    return out


def _control_means(runs: Sequence[RunCurve]) -> np.ndarray:
    """Each run's mean untrained-control reward over the epochs it logged one (:func:`control_mean`)."""
    return np.asarray([control_mean(r.control) for r in runs], dtype=np.float64)


#: The verdict rows measured on the raw reward, which an untrained sampler's offset moves without any learning.
RAW_REWARD_ROWS = ("final_reward", "auc")


def _raw_speedup_explained(sp: StudySpec, cell: str, diff: float, significant: bool,
                           rows: Sequence[dict[str, Any]], paired: bool = True,
                           bound: float | dict[str, float] | None = None) -> str:
    """A sentence when a significant raw-reward row (a raw-reward speed-up, the final reward, the reward
    AUC) goes the significant sampler offset's way (a raw-reward row without evidence needs no explanation):
    "is the sampler's, not learning" when no learning measure goes that way, else "mixes the sampler and
    learning", naming the learning rows (before, any significant learning row silenced it: a +0.08 sampler
    with 10% more learning printed a +185% raw speed-up, the learning alone +11%). Before, only speed-ups were
    explained: a frozen PCPO whose sampler scored 0.15 higher untrained, against a learning DDPO (8 paired
    seeds), had a "higher final reward" and "higher reward AUC" (p = 3.5e-05) with nothing pointing at the
    sampler.

    ``bound``: the largest offset the offset's 95% CI admits (its size when it has no CI), one number or one
    per raw quantity: the controls' own final reward (same last epochs) and AUC (:func:`control_bounds`). A
    final-reward or AUC difference, in the reward's own units, larger than that is not the sampler's alone:
    it is said to exceed the offset, unexplained by any learning measure (before, a 1e6 reward spike in one
    arm was "the sampler's" beside a 0.03 offset). Per quantity because the controls' difference changes over
    training epochs: a pure sampler change (both arms frozen) whose controls differed by 0.0445 over the last
    5 epochs and 0.0332 over all 16 had its final-reward difference, 0.0445, called "larger than the
    sampler's offset (at most 0.0375)"."""
    raw = [r for r in rows if r["cell"] == cell and r["significant"] and r["estimate"] is not None
           and (r["quantity"].startswith("speedup_reward:") or r["quantity"] in RAW_REWARD_ROWS)
           and r["estimate"] * diff > 0]
    if not raw or not significant:
        return ""
    gain = [r for r in rows if r["cell"] == cell and r["quantity"].startswith("speedup_gain:") and r["significant"]
            and r["estimate"] is not None and r["estimate"] * diff > 0]
    learned = next((r for r in rows if r["cell"] == cell and r["quantity"] == "paired_gain"), None)
    learned = learned if learned is not None and learned["significant"] and (learned["estimate"] or 0) * diff > 0 else None
    who = sp.pcpo if diff > 0 else sp.baseline
    offset = f"untrained, {who}'s sampler already scores {abs(diff):.3g} higher ({'paired by seed' if paired else 'unpaired'})"
    if gain or learned is not None:
        # learning goes the same way: the raw row still holds the offset (a +0.08 sampler with 10% more learning
        # printed a +185% raw speed-up with no caveat, where the same learning alone gives +11%)
        measures = ([f"paired gain {learned['estimate']:+.3g}"] if learned is not None else []) + [
            f"gain speed-up to {r['quantity'].split(':')[1]}: {pct(r['estimate'])}" for r in gain]
        return (f"The {_raw_head(raw)} ({_raw_what(raw)}) mixes the sampler and learning: {offset}. What {who} learned "
                f"beyond its untrained control is measured by the learning rows: {', '.join(measures)}.")
    given = bound if isinstance(bound, dict) else dict.fromkeys(RAW_REWARD_ROWS, bound)
    limits = {q: max(abs(diff), given.get(q) or 0.0) for q in RAW_REWARD_ROWS}
    beyond = [r for r in raw if r["quantity"] in RAW_REWARD_ROWS and abs(r["estimate"]) > limits[r["quantity"]]]
    within = [r for r in raw if r not in beyond]
    out = []
    if within:
        out.append(f"The {_raw_head(within)} ({_raw_what(within)}) is the sampler's, not learning: {offset}, and no "
                   "learning measure (paired gain, gain speed-up) shows a difference in that direction.")
    if beyond:
        most = ", ".join(f"{_RAW_NAMES[r['quantity']]} at most {limits[r['quantity']]:.3g}" for r in beyond)
        out.append(f"The raw-reward difference ({_raw_what(beyond)}) is larger than the sampler's offset ({offset}; "
                   f"the untrained controls admit a {most} within the 95% CI), yet no learning measure (paired gain, "
                   "gain speed-up) "
                   "shows a difference in that direction: what lies beyond the offset is not shown to be learning "
                   "(look for a run whose reward jumps or whose control is missing).")
    return " ".join(out)


def _raw_head(raw: Sequence[dict[str, Any]]) -> str:
    """'raw-reward speed-up' when every row is a speed-up, else 'raw-reward difference'."""
    return "raw-reward speed-up" if all(r["quantity"] not in RAW_REWARD_ROWS for r in raw) else "raw-reward difference"


#: the raw-reward rows' names in sentences
_RAW_NAMES = {"final_reward": "final reward", "auc": "reward AUC"}


def _raw_what(raw: Sequence[dict[str, Any]]) -> str:
    """The raw rows named with their estimates: 'speed-up to 0.5: +40%, final reward: +0.1'."""
    names = _RAW_NAMES
    return ", ".join(f"speed-up to {r['quantity'].split(':')[1]}: {pct(r['estimate'])}" if r["quantity"] not in names
                     else f"{names[r['quantity']]}: {r['estimate']:+.3g}" for r in raw)


def _one_way_untested(mb: np.ndarray, mt: np.ndarray, paired: bool, ci_low: float | None,
                      p_floor: float | None) -> bool:
    """Whether the arms' untrained controls differ one way in every seed (paired) or without overlap (unpaired)
    where their t test could not decide (no spread, or a t test not trusted alone): the offset then still
    explains a raw-reward row. Before, a frozen arm whose sampler scored exactly +0.10 in each of 5 seeds had
    a "higher reward AUC" (p = 0.002) and no explanation: the offset's exact p, 2/2^5 = 0.0625, is not below
    alpha (tests/stats/test_speedup_guards.py)."""
    return (ci_low is None or p_floor is not None) and separated(mb, mt, paired)


def control_bounds(b: Sequence[RunCurve], t: Sequence[RunCurve], paired: bool, diff: float, k: int,
                   fallback: float | None = None) -> dict[str, float]:
    """Per raw quantity (final reward over the last ``k`` epochs, AUC), the largest difference of the arms'
    untrained controls in the offset's direction (``diff``'s sign) that its 95% CI admits (its size without
    a CI): what a sampler alone can put into that raw row. A quantity whose controls miss an epoch keeps
    ``fallback``, the all-epoch offset's bound (leaving it out fell back to the bare point estimate)."""
    out = {q: fallback for q in RAW_REWARD_ROWS if fallback is not None}
    for q in RAW_REWARD_ROWS:
        vb = np.asarray([run_scalar(replace(r, reward=r.control), q, k) for r in b], dtype=np.float64)
        vt = np.asarray([run_scalar(replace(r, reward=r.control), q, k) for r in t], dtype=np.float64)
        if not (np.isfinite(vb).all() and np.isfinite(vt).all()):
            continue  # a control missing at some epoch: the offset's own bound (fallback) stands
        c = compare_runs(vb, vt, rng=np.random.default_rng(VERDICT_SEED), paired=paired)
        d = float(vt.mean() - vb.mean())
        ci = c.ci_low is not None and c.ci_high is not None
        out[q] = max(abs(d), (c.ci_high if diff > 0 else -c.ci_low) if ci else abs(d))
    return out


def sampler_offset(sp: StudySpec, table: pd.DataFrame, rows: Sequence[dict[str, Any]]) -> dict[str, dict[str, Any]]:
    """Per cell: the arms' mean untrained-control reward and their difference, paired by seed when the
    arms share seeds (else Welch), and whether that offset explains the raw-reward speed-up.

    Whether the samplers *differ* (``significant``, the p's Holm and the detectable offset) is the
    verdict's ``sampler_offset`` row: a secondary row, tested only once the primary is significant, so
    an A/A study claims a difference in at most alpha of studies with the offset counted (it was a
    5% test of its own beside the verdict: 5.2% of unpaired 3-seed A/A studies of real toy runs claimed
    something, 3.6% without it; ``benchmarks/bench_verdict_calibration.py``). Explaining a raw-reward row
    away needs no such control (it withdraws a claim): that uses the row's own p at alpha. One test, one
    p: the line used to run the test again, whose Monte Carlo relabelling p could differ from the row's."""
    if CONTROL_COLUMN not in table.columns:
        return {}
    runs = compared_runs(sp, table)
    out = {}
    for cell in sorted({r.cell for r in runs}):
        b, t, paired = pair_runs([r for r in runs if r.cell == cell and r.arm == sp.baseline],
                                 [r for r in runs if r.cell == cell and r.arm == sp.pcpo])
        row = next((r for r in rows if r["cell"] == cell and r["quantity"] == "sampler_offset"
                    and r["treatment"] == sp.pcpo), None)
        if not b or not t or row is None:
            continue
        v = Verdict(**row)  # the offset's one test: its p, CI, Holm p, gate and MDE
        mb, mt = _control_means(b), _control_means(t)
        diff = float(mt.mean() - mb.mean())
        head = (f"untrained controls ({_same(paired)}): {sp.pcpo} {mt.mean():.4g} vs "
                f"{sp.baseline} {mb.mean():.4g} (difference {diff:+.3g}{_offset_test(v, paired)})")
        bound = (v.ci_high if diff > 0 else -v.ci_low) if v.ci_low is not None and v.ci_high is not None else None
        own = v.p is not None and v.p < ALPHA  # the guard's level: it withdraws a claim (docstring)
        floor = v.details.get("p_floor")
        explained = _raw_speedup_explained(sp, cell, diff, own or _one_way_untested(mb, mt, paired, v.ci_low, floor),
                                           rows, paired, control_bounds(b, t, paired, diff, verdict_k(sp, table), bound))
        out[cell] = {"baseline_control_mean": float(mb.mean()), "treatment_control_mean": float(mt.mean()),
                     "difference": diff, "ci_low": v.ci_low, "ci_high": v.ci_high, "p": v.p, "paired": paired,
                     "p_adjusted": v.p_adjusted, "mde": v.mde, "significant": v.significant,
                     "gated": bool(v.details.get("gated")), "explains_raw_speedup": explained,
                     "explains": head + (f". {explained}" if explained else "")}
    return out


def _same(paired: bool) -> str:
    return ("same prompts and noises per seed, each arm's sampler" if paired else
            "each arm's own seeds and sampler: unpaired, so a difference may be the seeds' noise as well as the "
            "samplers'")


def _offset_test(v: Verdict, paired: bool) -> str:
    """The offset row's CI, p, Holm-adjusted p and verdict (its family's level, the gate), and what it could
    detect."""
    design = f"{v.n_baseline_runs} seeds, paired by seed" if paired else \
        f"{v.n_treatment_runs} vs {v.n_baseline_runs} runs, unpaired"
    sig = "" if not v.estimable or v.p is None else "; significant" if v.significant else "; not significant"
    if v.p_adjusted is not None:
        sig = f", Holm-adjusted p = {p_value(v.p_adjusted)} (secondary){sig}"
        if v.details.get("gated"):
            sig = sig.replace("; not significant", f"; {GATED}: {v.details.get('gate')}")
    ci = (f", 95% CI {v.ci_low:+.3g} to {v.ci_high:+.3g}{f'; {v.reason}' if v.reason else ''}, "
          f"p = {p_value(v.p)}{sig}, {design}" if v.ci_low is not None and v.ci_high is not None
          else f"; {v.reason}, p = {p_value(v.p)}{sig}, {design}" if v.estimable and v.p is not None
          else f"; {v.reason}")
    floor, level = v.details.get("p_floor"), float(v.details.get("mde_level") or ALPHA)
    return ci + (f"; {detectable(v)}: ±{v.mde:.3g}" if v.mde is not None else
                 f"; no offset is detectable: the exact permutation test's smallest p is {floor:.2g}, not below "
                 f"{level:.3g}" if floor is not None and floor >= level else "")  # what it could have found


def _notes(sp: StudySpec, logs: dict[str, pd.DataFrame], table: pd.DataFrame, runs: Sequence[RunCurve],
           cuts: dict[str, dict[str, Any]]) -> tuple[list[str], list[str]]:
    """``verdict_notes`` (what limits the comparison) and the headline's caveats (the ones that change
    what the verdict is about: cut runs, a missing control)."""
    notes, caveats = [], []
    for text in sp.epoch_caveats:  # allowed by unequal_epochs_ok: true, said first
        said = (f"{text}: every row compares per epoch (unequal_epochs_ok: true), so a difference may be "
                "the extra samples or compute, not the algorithm")
        notes.append(said)
        caveats.append(said[0].upper() + said[1:])
    for text in sp.unchecked_caveats:  # existing runs that record too few settings to be compared
        notes.append(text)
        caveats.append(text[0].upper() + text[1:])
    if CONTROL_COLUMN not in table.columns:
        lacking = [r.name for r in _compared(sp) if not has_control(logs[r.name])]
        text = (f"no paired gain, gain speed-up or sampler offset: {len(lacking)} run(s) lack control_reward_mean "
                f"({', '.join(lacking[:4])}{', ...' if len(lacking) > 4 else ''}); train with paired_control: true")
        raw = ("the final reward and reward AUC then compare each arm's sampler together with what it learned: a policy "
               "that learned nothing but samples higher rewards would lead them")
        notes.append(f"{text}; {raw}")
        # before, a frozen PCPO (learning rate 1e-12) whose sampler scored higher had a "higher final reward"
        # (p = 0.0008, 20 paired seeds) with only "no learning measure" beside it
        caveats.append("No learning measure: " + text.split(": ", 1)[1] + ". " + raw[0].upper() + raw[1:])
    for r in _compared(sp):
        gaps = [e for e in control_gaps(logs[r.name]) if e <= int(table["epoch"].max())]
        if gaps and CONTROL_COLUMN in table.columns:
            notes.append(f"{r.name} has no paired control at epoch(s) {', '.join(map(str, gaps[:6]))}"
                         f"{', ...' if len(gaps) > 6 else ''}: rows that need its gain at those epochs are not "
                         "estimable; its sampler offset averages its other epochs")
    for r in _compared(sp):
        gaps = epoch_gaps(logs[r.name], int(table.loc[table["cell"] == sp.cell_key(r), "epoch"].max()))
        if gaps:
            notes.append(f"{r.name} has no log row for epoch(s) {', '.join(map(str, gaps[:6]))}"
                         f"{', ...' if len(gaps) > 6 else ''}: rows that need its reward at those epochs (a smoothing "
                         "window over them, AUC, the last epochs) are not estimable")
    for cell, c in cuts.items():
        who = ", ".join(c["short_runs"][:3]) + (", ..." if len(c["short_runs"]) > 3 else "")
        text = (f"compared over epochs up to {c['last_epoch']} only{' in ' + cell if len(sp.cells()) > 1 else ''}: "
                f"{who} logged {c['last_epoch']} of the {c['longest']} epochs of the longest run, and every run of "
                "the cell is cut there")
        notes.append(text)
        caveats.append(text[0].upper() + text[1:])
    for cell in sorted({r.cell for r in runs}):
        b = [r for r in runs if r.cell == cell and r.arm == sp.baseline]
        t = [r for r in runs if r.cell == cell and r.arm == sp.pcpo]
        xb, xt = unpaired_seeds(b, t)
        shared = {r.seed for r in b} & {r.seed for r in t}
        if xb or xt:
            text = (f"the arms share {len(shared)} seeds; the runs are paired on those and the others are left out "
                    f"({sp.baseline} seeds {', '.join(xb) or 'none'}; {sp.pcpo} seeds {', '.join(xt) or 'none'})")
            notes.append(f"{cell}: {text}")
            caveats.append(f"{'In ' + cell + ', t' if len(sp.cells()) > 1 else 'T'}{text[1:]}")
        elif b and t and not pair_runs(b, t)[2]:
            notes.append(f"{cell}: the arms share {len(shared)} of {len(b)} and {len(t)} seeds (pairing needs at least "
                         "2 shared seeds and half of each arm), so runs are compared unpaired (Welch); a study with "
                         "the same seeds in both arms pairs them and needs fewer seeds")
    return notes, caveats


def _no_primary(sp: StudySpec, rows: Sequence[dict[str, Any]], status: Sequence[dict[str, Any]],
                table: pd.DataFrame) -> str:
    """Why a primary endpoint the spec names has no row ('' when every one has)."""
    for q in sp.primary:
        if any(r["quantity"] == q or r["quantity"].split(":", 1)[0] == q for r in rows):
            continue
        st = next((x for x in status if x["quantity"] == q), None)
        if st is not None and st["note"]:
            return f"the primary endpoint {q} has no row ({st['note']})"
        if q.split(":", 1)[0] in ("paired_gain", "speedup_gain") and CONTROL_COLUMN not in table.columns:
            return f"the primary endpoint {q} needs the paired untrained control, which not every run logged"
        return f"the primary endpoint {q} has no row"
    return ""


def run_level(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """``runs``, ``verdict``, ``rliable`` (the numbers of the report's rliable panels), ``headline``, ``sampler_offset``, ``targets``, ``speedup`` and ``verdict_notes``
    of ``results.json``."""
    logs = run_logs(sp, layout)
    table = runs_table(sp, logs)
    runs = compared_runs(sp, table)
    gains = list(sp.gain_targets) if CONTROL_COLUMN in table.columns else []
    status = target_status(runs, list(sp.targets), gains, sp.window)
    rows = verdict(sp, table)
    notes, caveats = _notes(sp, logs, table, runs, epoch_cuts(sp, logs))
    offset = sampler_offset(sp, table, rows)
    panels = rliable_panels(runs_table(sp, logs, every_arm=True), sp.baseline, verdict_k(sp, table))
    return {"runs": runs_entries(sp, logs), "verdict": rows, "rliable": panels,
            "headline": headline(rows, offset, caveats, _no_primary(sp, rows, status, table)),
            "sampler_offset": offset, "targets": status, "speedup": speedup_blocks(sp, rows, status),
            "verdict_notes": notes}
