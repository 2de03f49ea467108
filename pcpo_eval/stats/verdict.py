"""Verdicts over runs: one machine-readable row and one plain sentence per comparison, a headline.

Input: a tidy table with one row per (arm, cell, seed, epoch) and columns ``arm``, ``cell``,
``seed``, ``epoch``, ``reward_mean`` and optionally ``control_reward_mean`` (the untrained model
on the same prompts and noises that epoch). An epoch between a run's first and last that has no row
is NaN (:func:`pcpo_eval.stats.speedup.on_epoch_grid`), so no window, AUC or last-``k`` mean spans it. A *run* is one (arm, cell, seed); runs, not prompts,
are the replicates (rliable, Agarwal et al. 2021). For every cell and treatment arm,
:func:`verdict_rows` compares the treatment's runs with the baseline's on

* ``paired_gain`` -- mean of ``reward - control`` over the last ``k`` epochs: what the run
  *learned*, with the sampler and the prompt/noise draw cancelled (needs the control);
* ``final_reward`` -- mean reward of the last ``k`` epochs; ``auc`` -- mean reward over training;
* ``speedup_gain:<g>`` -- speed-up to a *gain* of ``g`` over the paired control (the speed-up that
  measures learning), for every informative gain target;
* ``speedup_reward:<t>`` -- speed-up to a raw reward ``t`` (what the paper reports), for every
  informative reward target. Both speed-ups: :mod:`pcpo_eval.stats.speedup` (full-window
  smoothing, Kaplan-Meier restricted mean epochs, Fieller CI from the same t test).

Pairing: when both arms of a cell trained the same seeds (a study's default), run ``i`` of one arm
and run ``i`` of the other drew the same prompts and initial noises, so the comparison uses the
per-seed differences (paired t; sign-flip permutation as a check). When the arms share only some
seeds, the shared seeds are paired and the others left out (:func:`pair_runs`: the seeds, not the
outcomes, decide) if they are at least 2 and at least half of each arm; otherwise Welch over all runs.

Targets (:func:`target_status`): a reward target that any untrained control curve reaches is
*uninformative* (the sampler reaches it without learning: a frozen policy would look fast); so is
every reward target when no control was logged (nothing tells learning from the sampler), and a
target every run reaches at its first full-window epoch. Uninformative targets get no row.

With the controls logged, ``sampler_offset`` compares the runs' mean untrained-control reward
(:func:`control_mean`: each arm's sampler before any training; paired by seed, the same prompts and
noises): a claim that the arms differ like any other, so it is a secondary row under the same gate and
Holm (tested outside the family, it added a 5% claim of its own: resampled unpaired 3-seed A/A studies of
real toy runs claimed something in 5.2%, the verdict alone in 3.6%; ``benchmarks/bench_verdict_calibration.py``).

Families: ``primary`` names the study's primary endpoint(s) (default ``paired_gain`` when the
controls were logged, else ``final_reward``); every other row is secondary. ``p_adjusted`` is
Holm's adjustment within the row's family. The families are tested in sequence (serial
gatekeeping): a primary row is significant when ``p_adjusted < alpha``; the secondary family is
tested only when every primary row is significant (``details["gated"]`` marks the rows of a closed
gate, never significant). So a study whose arms differ only by chance shows a significant row of
any family in at most ``alpha`` of studies, not one ``alpha`` per family.
Every row carries ``mde``, the smallest effect it is found significant for with 80% power at the
measured run-to-run spread (:mod:`pcpo_eval.stats.power`): in a family of ``m`` estimable rows at
the family's level ``alpha / m`` (:func:`pcpo_eval.stats.power.family_level`, Holm's first step;
``details["family_size"]``, ``details["mde_level"]``), since the row must pass Holm, not its own
test; a secondary row's also presumes the gate opens.

Row keys (:data:`VERDICT_KEYS`): ``estimate`` is treatment - baseline (a fraction for speed-ups:
0.25 = 25%), ``ci_low``/``ci_high`` None when there is no CI or that side is unbounded, ``p`` (the
t test behind the CI) None when not estimable. A speed-up's CI is clipped above at the largest
speed-up the design allows, and when Fieller's set has two pieces ``ci_low``/``ci_high`` is its hull
and ``details["ci_gap"]`` the hole (the sentence prints both pieces). No spread but a consistent
nonzero difference: no CI, and ``p`` is the exact permutation p (``reason`` says so).
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass, field, replace
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError, require
from pcpo_eval.rundir import CONTROL_COLUMN
from pcpo_eval.stats.adjust import holm
from pcpo_eval.stats.fmt import ci_decimals, decimals, p_value
from pcpo_eval.stats.power import family_level
from pcpo_eval.stats.runlevel import (
    EQUAL_IN_EVERY_SEED,
    ONE_RUN_PER_ARM,
    Comparison,
    Stat,
    auc,
    compare_runs,
    comparison_at_level,
    final,
    paired_gain,
)
from pcpo_eval.stats.speedup import (
    SMOOTHING_WINDOW,
    Speedup,
    TimeToTarget,
    at_level,
    bound_by_learning,
    bound_by_midpoint,
    ci_text,
    control_has_window,
    epochs_to_target,
    on_epoch_grid,
    pct,
    speedup_runs,
)
from pcpo_eval.stats.speedup import control_reaches as speedup_control_reaches

VERDICT_KEYS = (
    "cell", "quantity", "baseline", "treatment", "estimate", "ci_low", "ci_high", "n_baseline_runs",
    "n_treatment_runs", "p", "estimable", "reason", "significant", "sentence", "paired", "mde", "family",
    "p_adjusted", "p_permutation", "baseline_value", "treatment_value", "details",
)  # fmt: skip
TABLE_COLUMNS = ("arm", "cell", "seed", "epoch", "reward_mean")
#: quantity -> how a sentence names it
QUANTITIES = {"final_reward": "final reward", "auc": "reward AUC", "paired_gain": "paired gain",
              "sampler_offset": "untrained-control reward"}
#: the speed-up the report says how many seeds would detect
REFERENCE_SPEEDUP = 0.25
#: why a secondary row is not significant when its family was not tested (:func:`adjust_families`;
#: ``details["gate"]`` says which primary row closed the gate)
GATED = "not tested as a secondary row"


@dataclass(frozen=True)
class Verdict:
    """One comparison of a treatment arm with the baseline arm in one cell (keys: VERDICT_KEYS)."""

    cell: str
    quantity: str
    baseline: str
    treatment: str
    estimate: float | None
    ci_low: float | None
    ci_high: float | None
    n_baseline_runs: int
    n_treatment_runs: int
    p: float | None
    estimable: bool
    reason: str
    significant: bool
    sentence: str
    paired: bool = False
    mde: float | None = None
    family: str = "secondary"
    p_adjusted: float | None = None
    p_permutation: float | None = None
    baseline_value: float | None = None
    treatment_value: float | None = None
    details: dict[str, Any] = field(default_factory=dict)

    def to_dict(self) -> dict[str, Any]:
        """The JSON shape: exactly :data:`VERDICT_KEYS`."""
        return asdict(self)


@dataclass(frozen=True, eq=False)
class RunCurve:
    """One run's per-epoch curves, in epoch order."""

    arm: str
    cell: str
    seed: str
    epochs: np.ndarray
    reward: np.ndarray
    control: np.ndarray | None

    def curve(self, kind: str) -> np.ndarray:
        """``reward`` or ``gain`` (reward - control)."""
        if kind == "gain":
            assert self.control is not None
            return self.reward - self.control
        return self.reward


def run_curves(table: pd.DataFrame) -> tuple[RunCurve, ...]:
    """Validate the tidy table and split it into runs (one per arm, cell, seed)."""
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    require(not missing, f"runs table lacks column {missing[0] if missing else ''!r}; "
            f"needs {', '.join(TABLE_COLUMNS)} (+ optional {CONTROL_COLUMN})")  # fmt: skip
    require(len(table) > 0, "runs table has no rows")
    for c in ("epoch", "reward_mean", *([CONTROL_COLUMN] if CONTROL_COLUMN in table.columns else [])):
        require(pd.api.types.is_numeric_dtype(table[c]), f"runs table column {c!r} is not numeric ({table[c].dtype})")
    key = ["arm", "cell", "seed", "epoch"]
    dup = table.duplicated(key)
    if dup.any():
        row = table.loc[dup, key].iloc[0].to_dict()
        raise UserError(f"runs table has more than one row for {row}; one row per arm, cell, seed and epoch")
    has_control = CONTROL_COLUMN in table.columns
    out = []
    for (arm, cell, seed), g in table.sort_values("epoch").groupby(["arm", "cell", "seed"], sort=True):
        e = g["epoch"].to_numpy()
        reward, grid = on_epoch_grid(g["reward_mean"].to_numpy(np.float64), e)  # a missing epoch is NaN
        ctrl = on_epoch_grid(g[CONTROL_COLUMN].to_numpy(np.float64), e)[0] if has_control else None
        out.append(RunCurve(str(arm), str(cell), str(seed), grid, reward, ctrl))
    return tuple(out)


def run_scalar(run: RunCurve, quantity: str, k: int) -> float:
    """One run's ``quantity`` (:data:`QUANTITIES`): final reward or paired gain over its last ``k`` epochs, AUC
    over the run (:mod:`pcpo_eval.stats.runlevel`)."""
    if quantity == "final_reward":
        return final(run.reward, k)
    if quantity == "auc":
        return auc(run.reward, epochs=run.epochs)
    assert run.control is not None  # checked in _quantities
    if quantity == "sampler_offset":
        return control_mean(run.control)
    return paired_gain(run.reward, run.control, k)


def control_mean(control: np.ndarray) -> float:
    """A run's mean untrained-control reward over the epochs that logged one (NaN when none did): the
    ``sampler_offset`` row's per-run value, each arm's sampler before any training."""
    c = np.asarray(control, dtype=np.float64)
    return float(c[np.isfinite(c)].mean()) if np.isfinite(c).any() else float("nan")


def _quantities(quantities: Sequence[str] | None, has_control: bool) -> tuple[str, ...]:
    if quantities is None:
        return (*(("paired_gain",) if has_control else ()), "final_reward", "auc",
                *(("sampler_offset",) if has_control else ()))
    bad = [q for q in quantities if q not in QUANTITIES]
    require(not bad, f"unknown quantity {bad[0] if bad else ''!r}; choose from {', '.join(QUANTITIES)}")
    need = next((q for q in quantities if q in ("paired_gain", "sampler_offset")), None)
    require(has_control or need is None,
            f"{need} needs a {CONTROL_COLUMN!r} column (the untrained model's reward each epoch)")  # fmt: skip
    return tuple(quantities)


def _arms(runs: Sequence[RunCurve], baseline: str, treatments: Sequence[str] | None) -> tuple[str, ...]:
    arms = sorted({r.arm for r in runs})
    require(baseline in arms, f"baseline arm {baseline!r} is not in the table; arms: {', '.join(arms)}")
    if treatments is None:
        return tuple(a for a in arms if a != baseline)
    bad = [a for a in treatments if a not in arms]
    require(not bad, f"treatment arm {bad[0] if bad else ''!r} is not in the table; arms: {', '.join(arms)}")
    return tuple(treatments)


def pair_runs(b: Sequence[RunCurve], t: Sequence[RunCurve]) -> tuple[list[RunCurve], list[RunCurve], bool]:
    """The runs to compare and whether they pair: the seeds both arms trained, in seed order, when they are
    at least 2 and at least half of each arm (the unshared runs are left out: a design decision on seed
    labels, not outcomes); else every run, unpaired."""
    sb, st = {r.seed: r for r in b}, {r.seed: r for r in t}
    shared = sorted(set(sb) & set(st))
    if len(shared) >= 2 and 2 * len(shared) >= max(len(sb), len(st)):
        return [sb[s] for s in shared], [st[s] for s in shared], True
    return list(b), list(t), False


def unpaired_seeds(b: Sequence[RunCurve], t: Sequence[RunCurve]) -> tuple[list[str], list[str]]:
    """The seeds of each arm that :func:`pair_runs` leaves out when it pairs on the shared seeds."""
    kb, kt, paired = pair_runs(b, t)
    if not paired:
        return [], []
    keep = {r.seed for r in kb}
    return sorted(r.seed for r in b if r.seed not in keep), sorted(r.seed for r in t if r.seed not in keep)


def default_primary(has_control: bool) -> tuple[str, ...]:
    """The primary endpoint when a spec names none: what the runs learned, if the controls say it."""
    return ("paired_gain",) if has_control else ("final_reward",)


# ---------------------------------------------------------------------------------------------
# targets
# ---------------------------------------------------------------------------------------------


def quantity_name(kind: str, target: float) -> str:
    """``speedup_gain:<g>`` or ``speedup_reward:<t>`` (the results.json contract)."""
    return f"speedup_{kind}:{target:g}"


def control_reaches(run: RunCurve, target: float, window: int) -> bool:
    """Whether the run's untrained control reaches ``target`` in some full window of ``window`` logged
    values (a window with a missing control epoch decides nothing; the other windows still count, so a
    control missing one epoch cannot make a target the sampler reaches look informative)."""
    return run.control is not None and speedup_control_reaches(run.control, target, window)


def control_decides(run: RunCurve, window: int) -> bool:
    """Whether the run's untrained control has some full window of ``window`` finite values, so that
    :func:`control_reaches` can say no. Before, a frozen arm whose controls were all missing (or logged every
    other epoch) "did not reach" a raw target its better sampler reaches, so that target got a speed-up
    row, which called the frozen arm faster (tests/stats/test_speedup_guards.py)."""
    return control_has_window(run.control, window)


def target_status(runs: Sequence[RunCurve], targets: Sequence[float], gain_targets: Sequence[float],
                  window: int) -> list[dict[str, Any]]:
    """Per target and curve: ``informative``, or ``uninformative`` with the reason (module docstring)."""
    out = []
    for kind, levels in (("reward", targets), ("gain", gain_targets)):
        if kind == "gain" and (not runs or runs[0].control is None):
            out += [{"target": float(t), "curve": "gain", "quantity": quantity_name("gain", t), "status": "uninformative",
                     "headline": False, "note": "no paired control logged: a gain curve needs paired_control: true"}
                    for t in levels]  # fmt: skip
            continue
        short = bool(runs) and all(r.epochs.size < window for r in runs)
        for t in levels:
            note = ""
            if kind == "reward" and runs and runs[0].control is None:
                note = ("uninformative: no paired untrained control logged, so reaching a raw reward cannot be told "
                        "from the sampler reaching it (a frozen policy with a better sampler would look fast); "
                        "train with paired_control: true")
            elif short:
                note = (f"uninformative: the runs have at most {max(r.epochs.size for r in runs)} epochs, fewer than the "
                        f"smoothing window ({window}), so no run can reach a target")
            elif kind == "gain" and t <= 0:
                note = "a gain target must be > 0 (the untrained control has gain 0 by definition)"
            elif kind == "reward" and runs[0].control is not None:
                hits = [r for r in runs if control_reaches(r, t, window)]
                blind = [r for r in runs if not control_decides(r, window)]
                if blind and not hits:  # a missing control "does not reach" nothing: unknown, not informative
                    note = (f"uninformative: {len(blind)} of {len(runs)} runs have no full window of their untrained "
                            f"control ({', '.join(f'{r.arm} seed {r.seed}' for r in blind[:3])}"
                            f"{', ...' if len(blind) > 3 else ''}), so whether the sampler alone reaches {t:g} cannot "
                            "be told; log control_reward_mean every epoch (paired_control: true)")
                elif hits:
                    note = (f"uninformative: the untrained control reaches {t:g} in {len(hits)} of {len(runs)} runs, "
                            "so the sampler reaches it without learning")
            if not note and runs and all(epochs_to_target(r.curve(kind), t, window, epochs=r.epochs).at_start
                                         for r in runs):
                note = (f"uninformative: every run's smoothed {kind} reaches {t:g} at its first full-window epoch; "
                        "choose a higher target")
            out.append({"target": float(t), "curve": kind, "quantity": quantity_name(kind, t),
                        "status": "uninformative" if note else "informative", "headline": not note, "note": note})
    return out


# ---------------------------------------------------------------------------------------------
# sentences
# ---------------------------------------------------------------------------------------------


def _level(alpha: float) -> str:
    return f"{100 * (1 - alpha):g}%"


def _design(paired: bool, n_t: int, n_b: int) -> str:
    return f"{n_b} seeds per arm, paired by seed" if paired else f"{n_t} vs {n_b} runs, unpaired"


def _p_text(v: Verdict, alpha: float) -> str:
    """'; p = ..., Holm-adjusted p = ... (family)', each with the digits that keep its side of ``alpha``."""
    if v.p is None:
        return ""
    adj = f", Holm-adjusted p = {p_value(v.p_adjusted, alpha)} ({v.family})" if v.p_adjusted is not None else ""
    return f"; p = {p_value(v.p, alpha)}{adj}"


def _why_not(v: Verdict, own_test_significant: bool, has_ci: bool = True) -> str:
    """Why a row is not significant when its own test is (Holm, or the closed gate of the secondary family)."""
    own = ("the CI excludes 0, but " if has_ci else "p < alpha, but ") if own_test_significant else ""
    if v.details.get("gated"):
        return f" ({own}{GATED}: {v.details.get('gate', 'the primary endpoint is not significant')})"
    return f" ({own}not after the family's Holm adjustment)" if own_test_significant else ""


#: said after a t interval whose row the exact permutation test decides (too few runs: the interval can
#: exclude 0 beside a p above alpha; an A/A study printed "speed-up +33%, 95% CI +4.1% to +78%" by p 0.114)
CI_NOT_DECIDING = "that is the t interval, which does not decide this row alone"


def comparison_sentence(v: Verdict, c: Comparison, label: str) -> str:
    """One plain sentence for a comparison row (after the family adjustment).

    With ``stat="iqm"`` and pairing the estimate is the IQM of the per-seed differences, which can have
    the other sign than the difference of the arms' IQMs: the sentence then names that estimate and
    prints no arm values. Without a CI (no spread, :func:`pcpo_eval.stats.runlevel.no_spread_difference`)
    the CI part is the reason: the exact permutation p.
    """
    b, t = v.baseline, v.treatment
    if not c.estimable:
        if c.reason == EQUAL_IN_EVERY_SEED:  # e.g. two arms' one sampler: a finding of no difference, not a failure
            return (f"no difference in {label} between {t} and {b}: equal in every seed "
                    f"({_design(True, c.n_treatment, c.n_baseline)}), so there is nothing to test")
        if c.reason == ONE_RUN_PER_ARM and c.estimate is not None:
            d = decimals(abs(c.estimate))
            return f"1 run per arm: differences between runs, not algorithms ({t} - {b} {label}: {c.estimate:+.{d}f})"
        return f"{label} of {t} vs {b} is not estimable: {c.reason}"
    assert c.estimate is not None
    by_seed = c.paired and c.stat == "iqm"
    what = "IQM of the per-seed differences " if by_seed else ""
    design = _design(c.paired, c.n_treatment, c.n_baseline)
    if c.ci_low is None or c.ci_high is None:  # no spread: the permutation p, no CI
        d = decimals(abs(c.estimate))
        ci = f"{what}{c.estimate:+.{d}f}, {c.reason}, {design}"
    else:
        d = ci_decimals(c.estimate, c.ci_low, c.ci_high)
        ci = f"{what}{c.estimate:+.{d}f}, {_level(c.alpha)} CI {c.ci_low:+.{d}f} to {c.ci_high:+.{d}f}, {design}"
        # the t test not trusted alone (permutation.t_not_robust): its interval does not decide the row
        ci += f"; {CI_NOT_DECIDING}: {c.reason}" if c.reason else ""
    power = (f"; {detectable(v)}: ±{c.mde:.{d}f}" if c.mde is not None else
             _undetectable(v, c.p_floor, "effect", c.alpha) if c.p_floor is not None or c.ci_low is None else "")
    if not v.significant:
        return (f"no evidence of a difference in {label} between {t} and {b} ({ci}{_p_text(v, c.alpha)}{power})"
                f"{_why_not(v, c.significant, c.ci_low is not None)}")
    way = "higher" if c.estimate > 0 else "lower"
    if by_seed:
        name = label.removeprefix("IQM ")
        return f"{t}'s {name} is {way} than {b}'s, seed for seed ({ci}{_p_text(v, c.alpha)}{power})"
    assert c.baseline_value is not None and c.treatment_value is not None
    return f"{t}'s {label} is {way} than {b}'s: {c.treatment_value:.{d}f} vs {c.baseline_value:.{d}f} ({ci}{_p_text(v, c.alpha)}{power})"


def _epochs(x: float | None) -> str:
    return "?" if x is None else f"{x:.1f}"


def _undetectable(v: Verdict, floor: float | None, what: str, alpha: float) -> str:
    """The power clause of a row without an MDE: the exact test's floor when it cannot reach the family's
    level (``mde_level``, else ``alpha``; :attr:`pcpo_eval.stats.runlevel.Comparison.p_floor`), else that
    no spread was measured."""
    level = float(v.details.get("mde_level") or alpha)
    if floor is not None and floor >= level:
        return (f"; no {what} is detectable with {_seeds(v)}: the exact permutation test's smallest p is "
                f"{floor:.2g}, not below {level:.3g}")
    return f"; no spread measured, so no detectable {what}"


def _seeds(v: Verdict) -> str:
    n = min(v.n_baseline_runs, v.n_treatment_runs)
    return f"{n} seed{'s' if n != 1 else ''} per arm"


def detectable(v: Verdict) -> str:
    """"detectable at 80% power", naming the Holm family when the MDE is at its level ``alpha / m``, and, for a
    secondary row, that it is tested only once the primary is significant (the gate): a pure speed-up (the same
    plateau reached sooner) leaves a paired-gain primary nothing to find, so its speed-up row, printed
    "detectable: +17%", was significant in 3-8% of 200 simulated studies each at 5, 10 and 20 seeds."""
    m = int(v.details.get("family_size") or 1)
    holm = f" after Holm over the {m} {v.family} rows" if m > 1 else ""
    gate = ", once the primary is significant" if v.family == "secondary" else ""
    return f"detectable at 80% power{holm}{gate}"


def _mde_epochs(v: Verdict, s: Speedup) -> str:
    """What the speed-up MDE asks of the treatment, in epochs: its restricted mean at that speed-up
    (``baseline_mean / (1 + mde)``) beside the earliest it can have (:attr:`Speedup.earliest`). An MDE
    near ``max_speedup`` needs a treatment at its first full-window epochs, faster than replaying the
    baseline's learning faster reaches on the toy runs (benchmarks/RESULTS.md, "Power at the printed
    speed-up MDE on real toy runs"); the epochs let a reader judge whether such learning is plausible."""
    if s.mde is None or s.baseline_mean is None or s.earliest is None:
        return ""
    return (f" ({v.treatment} reaching it in {s.baseline_mean / (1 + s.mde):.1f} epochs on average; "
            f"the earliest its runs can is {s.earliest:.1f})")


def _speedup_power(v: Verdict, s: Speedup) -> tuple[str, str]:
    """The sentence's power and seeds parts: the MDE, or "no speed-up is detectable" when none is or
    the MDE exceeds the largest possible speed-up (:attr:`Speedup.max_speedup`: no run reaches a target
    before its first full-window epoch); the seeds a 25% speed-up needs, or that it is not possible.
    With the exact permutation p there is no spread to plan with, and neither is given."""
    if s.p_floor is not None and s.p_floor >= float(v.details.get("mde_level") or s.alpha):
        return _undetectable(v, s.p_floor, "speed-up", s.alpha), ""
    if s.ci_low is None:  # estimable without a CI: the exact permutation p (Speedup.p_method)
        return "; no spread measured, so no detectable effect or seed count", ""
    limit = (f" (at most {pct(s.max_speedup)} is possible against the baseline's measured mean with this window; "
             "the CI also covers a baseline slower than measured)" if s.max_speedup is not None else "")
    power = (f"; {detectable(v)}: {pct(s.mde)}{_mde_epochs(v, s)}" if s.mde is not None
             # a significant slow-down beside "no speed-up is detectable" read as a contradiction (a frozen arm,
             # -48%): what the row found needs no power clause; the seeds a speed-up needs still follow
             else "" if v.significant and (s.estimate or 0) < 0 else f"; no speed-up is {detectable(v)}{limit}")
    if not s.reference_feasible:
        return power, f"; a {REFERENCE_SPEEDUP:.0%} speed-up is not possible with this window and baseline"
    need = (f"; a {REFERENCE_SPEEDUP:.0%} speed-up needs {s.seeds_for_reference} seeds per arm"
            if s.seeds_for_reference is not None else "")
    return power, need


def speedup_sentence(v: Verdict, s: Speedup, kind: str) -> str:
    """One plain sentence for a speed-up row (after the family adjustment)."""
    b, t, what = v.baseline, v.treatment, f"{kind} {s.target:g}"
    if not s.estimable:
        if s.reason == ONE_RUN_PER_ARM:
            return (f"1 run per arm: differences between runs, not algorithms ({t} reaches {what} in "
                    f"{_epochs(s.treatment_mean)} epochs vs {_epochs(s.baseline_mean)})")  # fmt: skip
        return f"speed-up to {what}, {t} vs {b}, is not estimable: {s.reason}"
    cens = [f"{n} of {m} {arm} runs never reach it" for n, m, arm in
            ((s.n_censored_treatment, s.n_treatment, t), (s.n_censored_baseline, s.n_baseline, b)) if n]
    epochs = (f"{t} {_epochs(s.treatment_mean)} vs {b} {_epochs(s.baseline_mean)} epochs (restricted mean to epoch {s.tau}"
              + (f"; {', '.join(cens)}" if cens else "") + ")")
    ci = f"speed-up {pct(s.estimate)}, {ci_text(s)}" + (f"; {CI_NOT_DECIDING}: {s.reason}"
                                                       if s.reason and s.ci_low is not None else "")
    power, need = _speedup_power(v, s)
    tail = f"{ci}, {_design(s.paired, s.n_treatment, s.n_baseline)}{_p_text(v, s.alpha)}{power}{need}"
    if not v.significant:
        return f"no evidence of a difference in epochs to reach {what}: {epochs}; {tail}{_why_not(v, s.significant, s.ci_low is not None)}"
    way = "sooner" if (s.estimate or 0) > 0 else "later"
    return f"{t} reaches {what} {way} than {b}: {epochs}; {tail}"


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------


def _speedup(cell: str, b: Sequence[RunCurve], t: Sequence[RunCurve], paired: bool, names: tuple[str, str],
             kind: str, target: float, window: int, alpha: float) -> tuple[Verdict, Speedup]:
    def times(runs: Sequence[RunCurve], crossing: str) -> list[TimeToTarget]:
        return [epochs_to_target(r.curve(kind), target, window, epochs=r.epochs, crossing=crossing) for r in runs]

    def test(crossing: str) -> Speedup:
        return speedup_runs(times(b, crossing), times(t, crossing), target=target, paired=paired, alpha=alpha,
                            reference_effect=REFERENCE_SPEEDUP)

    first, mid = test("first"), test("midpoint")
    s = bound_by_midpoint(first, mid)
    if all(r.control is not None for r in (*b, *t)):
        s = bound_by_learning(s, [r.curve("gain") for r in b], [r.curve("gain") for r in t], names)
    details = {"curve": kind, "target": target, "tau": s.tau, "baseline_epochs": list(s.baseline_epochs),
               "treatment_epochs": list(s.treatment_epochs), "n_censored_baseline": s.n_censored_baseline,
               "n_censored_treatment": s.n_censored_treatment, "df": s.df,
               "reference_speedup": REFERENCE_SPEEDUP, "seeds_for_reference": s.seeds_for_reference,
               "reference_feasible": s.reference_feasible, "max_speedup": s.max_speedup, "p_method": s.p_method,
               "ci_gap": [s.ci_gap_low, s.ci_gap_high], "ci_high_clipped": s.ci_high_clipped,
               "ci_low_clipped": s.ci_low_clipped, "p_floor": s.p_floor, "p_learned": s.p_learned, "p_first_crossing": first.p,
               "midpoint_baseline_epochs": list(mid.baseline_epochs), "midpoint_treatment_epochs": list(mid.treatment_epochs),
               "p_midpoint": s.p_midpoint, "midpoint_speedup": s.midpoint.estimate if s.midpoint else None}
    v = Verdict(cell, quantity_name(kind, target), *names, s.estimate, s.ci_low, s.ci_high, s.n_baseline, s.n_treatment,
                s.p, s.estimable, s.reason, s.significant, "", s.paired, s.mde, "secondary", None,
                s.p if s.p_method.startswith("exact") else None,
                s.baseline_mean, s.treatment_mean, details)  # fmt: skip
    return v, s


def _comparison(cell: str, q: str, c: Comparison, names: tuple[str, str]) -> Verdict:
    details = {"df": c.df, "ci_method": c.ci_method, "p_method": c.p_method, "p_min_permutation": c.p_min,
               "poi": c.poi, "poi_ci": [c.poi_ci_low, c.poi_ci_high], "stat": c.stat, "p_floor": c.p_floor}
    return Verdict(cell, q, *names, c.estimate, c.ci_low, c.ci_high, c.n_baseline, c.n_treatment, c.p, c.estimable,
                   c.reason, c.significant, "", c.paired, c.mde, "secondary", None, c.p_permutation,
                   c.baseline_value, c.treatment_value, details)  # fmt: skip


def _base(quantity: str) -> str:
    """``speedup_gain:0.05`` -> ``speedup_gain`` (a primary may name the kind or the exact row)."""
    return quantity.split(":", 1)[0]


def family_of(quantity: str, primary: Sequence[str]) -> str:
    """``primary`` when the row's quantity (or its speed-up kind) is a primary endpoint, else ``secondary``."""
    return "primary" if (quantity in primary or _base(quantity) in primary) else "secondary"


def planned_family_sizes(has_control: bool, gain_targets: Sequence[float], targets: Sequence[float],
                         primary: Sequence[str], n_cells: int) -> tuple[dict[str, int], dict[str, str]]:
    """Before any run: (family -> the rows Holm will adjust together, row name -> its family) of a
    design with one treatment arm per cell, as :func:`verdict_rows` forms them. Every target is
    counted informative and every row estimable (an uninformative target gets no row), so the sizes
    are upper bounds: a plan at ``alpha / m`` is conservative. ``primary`` empty: the default."""
    names = [*_quantities(None, has_control), *(quantity_name("gain", g) for g in (gain_targets if has_control else ())),
             *(quantity_name("reward", t) for t in targets)]
    prim = tuple(primary) or default_primary(has_control)
    fam = {q: family_of(q, prim) for q in names}
    sizes: dict[str, int] = {}
    for f in fam.values():
        sizes[f] = sizes.get(f, 0) + n_cells
    return sizes, fam


def adjust_families(rows: Sequence[Verdict], primary: Sequence[str], alpha: float) -> list[Verdict]:
    """Mark each row primary/secondary, Holm-adjust p within each family, set ``significant``: the
    secondary family only when every primary row is significant (serial gatekeeping; module docstring),
    else its rows keep their Holm-adjusted p for reading and get ``details["gated"] = True``."""
    fam = [family_of(r.quantity, primary) for r in rows]
    out = [replace(r, family=f, significant=False) for r, f in zip(rows, fam, strict=True)]
    for name in ("primary", "secondary"):
        prim = [r for r in out if r.family == "primary"]
        gate = name == "primary" or (bool(prim) and all(r.significant for r in prim))
        idx = [i for i, r in enumerate(out) if r.family == name and r.estimable and r.p is not None]
        adj = holm([out[i].p for i in idx]) if idx else []
        for i, pa in zip(idx, adj, strict=True):
            out[i] = replace(out[i], p_adjusted=float(pa), significant=gate and bool(pa < alpha))
        if not gate:
            why = gate_reason(prim, alpha)
            out = [replace(r, details={**r.details, "gated": True, "gate": why, "holm_below_alpha":
                                       r.p_adjusted is not None and r.p_adjusted < alpha})
                   if r.family == name else r for r in out]
    return out


def gate_reason(prim: Sequence[Verdict], alpha: float = 0.05) -> str:
    """Why the secondary family was not tested: no primary row, or the (first) primary row that is not
    estimable or not significant (with its Holm-adjusted p: its CI may exclude 0 before Holm, so "shows no
    difference" would misstate it), with its cell when the primary rows span several cells."""
    if not prim:
        return "the study has no primary row"
    r = next(x for x in prim if not x.significant)
    where = f" in {r.cell}" if len({x.cell for x in prim}) > 1 else ""
    what = ("shows no difference: equal in every seed" if r.reason == EQUAL_IN_EVERY_SEED else
            "is not estimable" if not r.estimable or r.p is None else
            f"is not significant (Holm-adjusted p = {p_value(r.p_adjusted, alpha)})" if r.p_adjusted is not None else
            "is not significant")
    return f"the primary endpoint ({r.quantity}){where} {what}"


def _epochs_by_arm(runs: Sequence[RunCurve], cell: str, arms: Sequence[str], at: int) -> dict[str, set[int]]:
    """Arm -> the first (``at=0``) or last (``at=-1``) logged epochs of its runs in ``cell``."""
    out: dict[str, set[int]] = {}
    for r in runs:
        if r.cell == cell and r.arm in arms:
            out.setdefault(r.arm, set()).add(int(r.epochs[at]))
    return out


def _which(by_arm: dict[str, set[int]]) -> str:
    return ", ".join(f"{a}: {'/'.join(map(str, sorted(v)))}" for a, v in by_arm.items())


def _check_common_epochs(runs: Sequence[RunCurve], baseline: str, arms: Sequence[str]) -> None:
    """UserError when the compared runs of a cell end or start at different epochs. Ending at different
    epochs: the final reward, AUC and paired gain would compare different stages of training (an A/A table
    whose PCPO logs stop at epoch 8 and DDPO's run to 40 read 'PCPO's paired gain is lower', p = 0.0005);
    ``pcpo-eval study`` cuts its runs to a common last epoch first and says so (``study.verdicts.runs_table``).
    Starting at different epochs: a log from epoch 6 beside others from 1 reaches its first full window 5
    epochs later, so its arm reads slower (tests/stats/test_speedup_guards.py)."""
    compared = (baseline, *arms)
    for cell in sorted({r.cell for r in runs}):
        last = _epochs_by_arm(runs, cell, compared, -1)
        ends = sorted(set().union(*last.values()))
        if len(ends) > 1:
            raise UserError(f"cell {cell!r}: the compared runs end at different epochs ({_which(last)}); cut the "
                            f"table to a common last epoch first (e.g. table[table['epoch'] <= {ends[0]}]), as "
                            "`pcpo-eval study` does, so every run is compared at the same stage of training")
        first = _epochs_by_arm(runs, cell, compared, 0)
        starts = sorted(set().union(*first.values()))
        if len(starts) > 1:
            raise UserError(f"cell {cell!r}: the compared runs' logs start at different epochs ({_which(first)}); a "
                            "run's first full window would end later and its speed-ups read slower; give every run "
                            "its epochs from the first (a missing epoch as an empty reward) or cut the table to a "
                            f"common first epoch (table[table['epoch'] >= {starts[-1]}])")


def verdict_rows(
    table: pd.DataFrame,
    baseline: str,
    treatments: Sequence[str] | None = None,
    *,
    rng: np.random.Generator,
    quantities: Sequence[str] | None = None,
    targets: Sequence[float] = (),
    gain_targets: Sequence[float] = (),
    primary: Sequence[str] | None = None,
    k: int = 5,
    window: int = SMOOTHING_WINDOW,
    stat: Stat = "mean",
    alpha: float = 0.05,
    n_boot: int = 2000,
) -> tuple[Verdict, ...]:
    """Verdicts for every cell x treatment arm: the quantities, then the informative gain and reward
    targets (:func:`target_status`); families adjusted, sentences written (module docstring). The compared
    runs of a cell must end at one epoch (a UserError names them otherwise)."""
    runs = run_curves(table)
    has_control = runs[0].control is not None
    qs = _quantities(quantities, has_control)
    arms = _arms(runs, baseline, treatments)
    _check_common_epochs(runs, baseline, arms)
    status = target_status(runs, targets, gain_targets, window)
    speed = [(s["curve"], s["target"]) for s in status if s["headline"]]
    speed = [x for x in speed if x[0] == "gain"] + [x for x in speed if x[0] == "reward"]
    rows: list[Verdict] = []
    objs: list[tuple[str, Comparison | Speedup, tuple[np.ndarray, np.ndarray] | None]] = []
    for cell in sorted({r.cell for r in runs}):
        b_all = [r for r in runs if r.cell == cell and r.arm == baseline]
        for arm in arms:
            b, t, paired = pair_runs(b_all, [r for r in runs if r.cell == cell and r.arm == arm])
            for q in qs:
                xb = np.asarray([run_scalar(r, q, k) for r in b], dtype=np.float64)
                xt = np.asarray([run_scalar(r, q, k) for r in t], dtype=np.float64)
                c = compare_runs(xb, xt, stat, n_boot, rng=rng, alpha=alpha, paired=paired)
                rows.append(_comparison(cell, q, c, (baseline, arm)))
                objs.append((QUANTITIES[q] if stat == "mean" else f"IQM {QUANTITIES[q]}", c, (xb, xt)))
            for kind, x in speed:
                v, s = _speedup(cell, b, t, paired, (baseline, arm), kind, x, window, alpha)
                rows.append(v)
                objs.append((kind, s, None))
    if not primary:  # the default primary endpoint, or the first quantity asked for when it is not among them
        primary = [q for q in default_primary(has_control) if q in qs] or list(qs[:1])
    rows = adjust_families(rows, tuple(primary), alpha)
    out = []
    for v, (lab, o, runs) in zip(rows, objs, strict=True):
        v, o = at_family_level(v, o, runs, family_sizes(rows), alpha)
        out.append(replace(v, sentence=speedup_sentence(v, o, lab) if isinstance(o, Speedup)
                           else comparison_sentence(v, o, lab)))
    return tuple(out)


def family_sizes(rows: Sequence[Verdict]) -> dict[str, int]:
    """Family -> the number of its rows Holm adjusts together (estimable, with a p)."""
    out: dict[str, int] = {}
    for r in rows:
        if r.estimable and r.p is not None:
            out[r.family] = out.get(r.family, 0) + 1
    return out


def at_family_level(v: Verdict, o: Comparison | Speedup, runs: tuple[np.ndarray, np.ndarray] | None,
                    sizes: dict[str, int], alpha: float) -> tuple[Verdict, Comparison | Speedup]:
    """The row and its comparison with the MDE (and a speed-up's seeds for the reference effect) at its
    family's level ``alpha / m`` (module docstring); ``details`` records ``family_size`` and ``mde_level``."""
    m = sizes.get(v.family, 1)
    level = family_level(alpha, m)
    if m > 1:
        o = at_level(o, level) if isinstance(o, Speedup) else comparison_at_level(o, *runs, level)  # type: ignore[misc]
    details = {**v.details, "family_size": m, "mde_level": level}
    if isinstance(o, Speedup):
        details["seeds_for_reference"] = o.seeds_for_reference
    return replace(v, mde=o.mde, details=details), o


# ---------------------------------------------------------------------------------------------
# headline
# ---------------------------------------------------------------------------------------------


def headline(rows: Sequence[dict[str, Any]], offsets: dict[str, dict[str, Any]] | None = None,
             caveats: Sequence[str] = (), no_primary: str = "") -> str:
    """The study's answer in a few sentences: the primary endpoint(s) with CI, design and power, the
    ``caveats`` (what limits the comparison, e.g. runs cut short), then per cell the learning speed-up
    (gain) and, if the raw-reward speed-up is the sampler's, that (``offsets``: per cell, from the study's
    sampler-offset check). Without a primary row: ``no_primary`` says why (default: none is estimable)."""
    tail = [c for c in caveats if c]
    # the sampler offset's own line says it was not tested (study.verdicts.sampler_offset); a real sampler
    # change would otherwise repeat this warning in the headline of every study whose primary is not significant
    untested = [r for r in rows if (r.get("details") or {}).get("holm_below_alpha") and r["quantity"] != "sampler_offset"]
    if untested:
        names = ", ".join(dict.fromkeys(QUANTITIES.get(r["quantity"], r["quantity"].replace("_", " "))
                                        for r in untested))
        tail.append(f"Not evidence of a difference: {len(untested)} secondary row(s) ({names}) have a Holm-adjusted p "
                    f"below alpha but were not tested, because {untested[0]['details']['gate']}; naming one primary "
                    "after seeing these results would not keep the 5% error rate (test it as the primary endpoint of "
                    "a new study, with new seeds)")
    prim = [r for r in rows if r.get("family") == "primary"]
    if not prim:
        why = no_primary or "the study has no estimable primary endpoint"
        return " ".join(p.rstrip(".") + "." for p in [f"No run-level verdict: {why}", *tail])
    cells = sorted({r["cell"] for r in rows})
    several = len(cells) > 1
    parts = []
    for r in prim:
        where = [r["cell"]] if several else []
        if r["quantity"] not in QUANTITIES:
            where.append(r["quantity"].replace("_", " "))
        parts.append(f"On this study{' (' + ', '.join(where) + ')' if where else ''}, {r['sentence']}")
    parts += tail
    for cell in cells:
        gains = [r for r in rows if r["cell"] == cell and r["quantity"].startswith("speedup_gain:")
                 and r["family"] != "primary"]
        name = f"{cell}: " if several else ""
        if gains:
            g = gains[0]
            parts.append(f"Learning speed ({name}{g['quantity'].split(':')[1]} gain over the untrained control): "
                         f"{g['sentence']}")
        off = (offsets or {}).get(cell) or {}
        if off.get("explains_raw_speedup"):
            parts.append(f"{'In ' + cell + ': ' if several else ''}{off['explains_raw_speedup']}")
    return " ".join(p.rstrip(".") + "." for p in parts)
