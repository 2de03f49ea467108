"""Verdicts over runs: one machine-readable row and one plain sentence per comparison.

Input: a tidy table with one row per (arm, cell, seed, epoch) and columns ``arm``, ``cell``,
``seed``, ``epoch``, ``reward_mean`` and optionally ``control_reward_mean`` (the untrained model
on the same prompts and noises that epoch). A *run* is one (arm, cell, seed); runs, not prompts,
are the replicates (rliable, Agarwal et al. 2021). For every cell and every treatment arm,
:func:`verdict_rows` compares the treatment's runs with the baseline's runs on

* ``final`` -- mean reward of the last ``k`` epochs of each run;
* ``auc`` -- mean reward over training (normalised area under the curve);
* ``paired_gain`` -- mean of ``reward - control`` over the last ``k`` epochs (when logged);
* ``speedup@<target>`` -- mean(E_base) / mean(E_treat) - 1, E = epochs to reach the target
  (window-5 trailing mean, paper App. Tab. 6), censored runs explicit.

The statistics are those of :mod:`pcpo_eval.stats.runlevel` (Welch/Yuen t CI, exact permutation
p, Fieller CI for the speed-up; see there for the measured false-positive rates). Rows are not
adjusted for multiplicity; pass the ``p`` column to :func:`pcpo_eval.stats.adjust.holm` if a
family of rows is tested together.

Row keys (:data:`VERDICT_KEYS`): ``baseline``/``treatment`` are the arm names, ``estimate`` is
treatment - baseline (a fraction for the speed-up: 0.58 = 58%), ``ci_low``/``ci_high`` are None
when there is no CI or that side is unbounded, ``p`` is None when not estimable. For estimable
speed-ups with censored runs, ``reason`` says that the estimate is a bound and which runs never
reached the target.
"""

from __future__ import annotations

from collections.abc import Sequence
from dataclasses import asdict, dataclass
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError, require
from pcpo_eval.stats.runlevel import (
    ONE_RUN_PER_ARM,
    Comparison,
    Speedup,
    Stat,
    TimeToTarget,
    auc,
    compare_runs,
    epochs_to_target,
    final,
    paired_gain,
    speedup_runs,
)

VERDICT_KEYS = (
    "cell", "quantity", "baseline", "treatment", "estimate", "ci_low", "ci_high", "n_baseline_runs",
    "n_treatment_runs", "p", "estimable", "reason", "significant", "sentence",
)  # fmt: skip
TABLE_COLUMNS = ("arm", "cell", "seed", "epoch", "reward_mean")
CONTROL_COLUMN = "control_reward_mean"
#: quantity -> how a sentence names it
QUANTITIES = {"final": "final reward", "auc": "reward AUC", "paired_gain": "paired gain"}


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


def run_curves(table: pd.DataFrame) -> tuple[RunCurve, ...]:
    """Validate the tidy table and split it into runs (one per arm, cell, seed)."""
    missing = [c for c in TABLE_COLUMNS if c not in table.columns]
    require(not missing, f"runs table lacks column {missing[0] if missing else ''!r}; "
            f"needs {', '.join(TABLE_COLUMNS)} (+ optional {CONTROL_COLUMN})")  # fmt: skip
    require(len(table) > 0, "runs table has no rows")
    for c in ("epoch", "reward_mean", *([CONTROL_COLUMN] if CONTROL_COLUMN in table.columns else [])):
        require(
            pd.api.types.is_numeric_dtype(table[c]),
            f"runs table column {c!r} is not numeric ({table[c].dtype})",
        )
    key = ["arm", "cell", "seed", "epoch"]
    dup = table.duplicated(key)
    if dup.any():
        row = table.loc[dup, key].iloc[0].to_dict()
        raise UserError(f"runs table has more than one row for {row}; one row per arm, cell, seed and epoch")
    has_control = CONTROL_COLUMN in table.columns
    out = []
    for (arm, cell, seed), g in table.sort_values("epoch").groupby(["arm", "cell", "seed"], sort=True):
        ctrl = g[CONTROL_COLUMN].to_numpy(np.float64) if has_control else None
        out.append(
            RunCurve(
                str(arm),
                str(cell),
                str(seed),
                g["epoch"].to_numpy(),
                g["reward_mean"].to_numpy(np.float64),
                ctrl,
            )
        )
    return tuple(out)


def _scalar(run: RunCurve, quantity: str, k: int) -> float:
    if quantity == "final":
        return final(run.reward, k)
    if quantity == "auc":
        return auc(run.reward, epochs=run.epochs)
    assert run.control is not None  # checked in _quantities
    return paired_gain(run.reward, run.control, k)


def _quantities(quantities: Sequence[str] | None, has_control: bool) -> tuple[str, ...]:
    if quantities is None:
        return ("final", "auc", *(("paired_gain",) if has_control else ()))
    bad = [q for q in quantities if q not in QUANTITIES]
    require(not bad, f"unknown quantity {bad[0] if bad else ''!r}; choose from {', '.join(QUANTITIES)}")
    require(has_control or "paired_gain" not in quantities,
            f"paired_gain needs a {CONTROL_COLUMN!r} column (the untrained model's reward each epoch)")  # fmt: skip
    return tuple(quantities)


def _arms(runs: Sequence[RunCurve], baseline: str, treatments: Sequence[str] | None) -> tuple[str, ...]:
    arms = sorted({r.arm for r in runs})
    require(baseline in arms, f"baseline arm {baseline!r} is not in the table; arms: {', '.join(arms)}")
    if treatments is None:
        return tuple(a for a in arms if a != baseline)
    bad = [a for a in treatments if a not in arms]
    require(not bad, f"treatment arm {bad[0] if bad else ''!r} is not in the table; arms: {', '.join(arms)}")
    return tuple(treatments)


# ---------------------------------------------------------------------------------------------
# sentences
# ---------------------------------------------------------------------------------------------


def _decimals(scale: float) -> int:
    """Decimals that show a quantity of size ``scale`` with about two significant digits."""
    if not np.isfinite(scale) or scale <= 0:
        return 3
    return int(np.clip(1 - np.floor(np.log10(scale)), 0, 6))


def _level(alpha: float) -> str:
    return f"{100 * (1 - alpha):g}%"


def _p_note(significant: bool, p: float | None, p_min: float | None, alpha: float, runs: str) -> str:
    """Say so when the permutation p and the interval disagree (3 vs 3 runs: p >= 0.1 always)."""
    if p is None or significant == (p <= alpha):
        return ""
    if p_min is not None and p_min > alpha:
        return f"; exact permutation p = {p:.2f} (cannot be below {p_min:.2f} with {runs})"
    return f"; permutation p = {p:.3f}"


def comparison_sentence(c: Comparison, label: str, baseline: str, treatment: str) -> str:
    """One plain sentence for a :class:`Comparison` of ``label`` (e.g. "final reward")."""
    runs = f"{c.n_treatment} vs {c.n_baseline} runs"
    if not c.estimable:
        if c.reason == ONE_RUN_PER_ARM and c.estimate is not None:
            d = _decimals(abs(c.estimate))
            return f"1 run per arm: differences between runs, not algorithms ({treatment} - {baseline} {label}: {c.estimate:+.{d}f})"
        return f"{label} of {treatment} vs {baseline} is not estimable: {c.reason}"
    assert c.estimate is not None and c.ci_low is not None and c.ci_high is not None
    assert c.baseline_value is not None and c.treatment_value is not None
    d = _decimals(c.ci_high - c.ci_low)
    note = _p_note(c.significant, c.p, c.p_min, c.alpha, runs)
    ci = f"{c.estimate:+.{d}f}, {_level(c.alpha)} CI {c.ci_low:+.{d}f} to {c.ci_high:+.{d}f}, {runs}"
    if not c.significant:
        return f"no evidence of a difference in {label} between {treatment} and {baseline} ({ci}){note}"
    way = "higher" if c.estimate > 0 else "lower"
    return (f"{treatment}'s {label} is {way} than {baseline}'s: {c.treatment_value:.{d}f} vs "
            f"{c.baseline_value:.{d}f} ({ci}){note}")  # fmt: skip


def _epochs(x: float | None) -> str:
    return "?" if x is None else (f"{x:.0f}" if float(x).is_integer() else f"{x:.1f}")


def _pct(x: float | None, unbounded: str) -> str:
    if x is None:
        return unbounded
    return f"{x:.1%}" if abs(x) < 0.1 else f"{x:.0%}"  # no "-0%" for a limit just below 0


def _censor_note(n_cens: int, runs: Sequence[TimeToTarget], arm: str, target: float) -> str:
    last = sorted({r.last_epoch for r in runs if r.censored})
    within = f"within {last[0]} epochs" if len(last) == 1 else "within their logged epochs"
    return f"{n_cens} of {len(runs)} {arm} runs never reach {target:g} {within}"


def speedup_sentence(
    s: Speedup,
    target: float,
    b_runs: Sequence[TimeToTarget],
    t_runs: Sequence[TimeToTarget],
    baseline: str,
    treatment: str,
) -> str:
    """One plain sentence for a :class:`Speedup` to ``target``."""
    runs = f"{s.n_treatment} vs {s.n_baseline} runs"
    if not s.estimable:
        if s.reason == ONE_RUN_PER_ARM:
            return (f"1 run per arm: differences between runs, not algorithms ({treatment} reaches {target:g} "
                    f"in {_epochs(s.treatment_mean)} epochs vs {_epochs(s.baseline_mean)})")  # fmt: skip
        return f"epochs to reach {target:g}, {treatment} vs {baseline}, are not estimable: {s.reason}"
    head = "" if s.significant else f"no evidence of a difference in epochs to reach {target:g}: "
    lvl = _level(s.alpha)
    tail = f"{runs}){_p_note(s.significant, s.p, s.p_min, s.alpha, runs)}"
    if s.bound == "lower":
        what = _censor_note(s.n_censored_baseline, b_runs, baseline, target)
        return (f"{head}{treatment} reaches {target:g} in {_epochs(s.treatment_mean)} epochs; {what} (speed-up at "
                f"least {_pct(s.estimate, '?')}, {lvl} lower limit {_pct(s.ci_low, '?')}, {tail}")  # fmt: skip
    if s.bound == "upper":
        what = _censor_note(s.n_censored_treatment, t_runs, treatment, target)
        return (f"{head}{what}; {baseline} reaches it in {_epochs(s.baseline_mean)} epochs (speed-up at most "
                f"{_pct(s.estimate, '?')}, {lvl} upper limit {_pct(s.ci_high, 'unbounded')}, {tail}")  # fmt: skip
    ci = f"{lvl} CI {_pct(s.ci_low, '?')} to {_pct(s.ci_high, 'unbounded')}"
    if not s.significant:
        return (f"{head}{_epochs(s.treatment_mean)} vs {_epochs(s.baseline_mean)} epochs "
                f"(speed-up {_pct(s.estimate, '?')}, {ci}, {tail}")  # fmt: skip
    return (f"{treatment} reaches {target:g} in {_epochs(s.treatment_mean)} epochs vs {_epochs(s.baseline_mean)} "
            f"(speed-up {_pct(s.estimate, '?')}, {ci}, {tail}")  # fmt: skip


# ---------------------------------------------------------------------------------------------
# rows
# ---------------------------------------------------------------------------------------------


def _bound_reason(
    s: Speedup, b_runs: Sequence[TimeToTarget], t_runs: Sequence[TimeToTarget], target: float
) -> str:
    """The reason field of a speed-up row: why not estimable, or which runs are censored."""
    if not s.estimable or s.bound == "point":
        return s.reason
    if s.bound == "lower":
        return f"estimate is a lower bound: {_censor_note(s.n_censored_baseline, b_runs, 'baseline', target)} (censored)"
    return f"estimate is an upper bound: {_censor_note(s.n_censored_treatment, t_runs, 'treatment', target)} (censored)"


def _speedup_row(cell: str, b: Sequence[RunCurve], t: Sequence[RunCurve], names: tuple[str, str],
                 target: float, window: int, alpha: float, rng: np.random.Generator) -> Verdict:  # fmt: skip
    bt = [epochs_to_target(r.reward, target, window, epochs=r.epochs) for r in b]
    tt = [epochs_to_target(r.reward, target, window, epochs=r.epochs) for r in t]
    s = speedup_runs(bt, tt, rng=rng, alpha=alpha)
    return Verdict(
        cell, f"speedup@{target:g}", names[0], names[1], s.estimate, s.ci_low, s.ci_high, s.n_baseline,
        s.n_treatment, s.p, s.estimable, _bound_reason(s, bt, tt, target), s.significant,
        speedup_sentence(s, target, bt, tt, names[0], names[1]),
    )  # fmt: skip


def _comparison_row(cell: str, q: str, c: Comparison, names: tuple[str, str]) -> Verdict:
    label = QUANTITIES[q] if c.stat == "mean" else f"IQM {QUANTITIES[q]}"
    return Verdict(
        cell, q, names[0], names[1], c.estimate, c.ci_low, c.ci_high, c.n_baseline, c.n_treatment, c.p,
        c.estimable, c.reason, c.significant, comparison_sentence(c, label, names[0], names[1]),
    )  # fmt: skip


def verdict_rows(
    table: pd.DataFrame,
    baseline: str,
    treatments: Sequence[str] | None = None,
    *,
    rng: np.random.Generator,
    quantities: Sequence[str] | None = None,
    targets: Sequence[float] = (),
    k: int = 5,
    window: int = 5,
    stat: Stat = "mean",
    alpha: float = 0.05,
    n_boot: int = 2000,
) -> tuple[Verdict, ...]:
    """Verdicts for every cell x treatment arm x quantity (then x target), in that order.

    ``treatments`` defaults to every arm but the baseline; ``quantities`` to final, auc and
    (when ``control_reward_mean`` is present) paired_gain; each target adds a speed-up row.
    """
    runs = run_curves(table)
    qs = _quantities(quantities, runs[0].control is not None)
    arms = _arms(runs, baseline, treatments)
    out: list[Verdict] = []
    for cell in sorted({r.cell for r in runs}):
        b = [r for r in runs if r.cell == cell and r.arm == baseline]
        for arm in arms:
            t = [r for r in runs if r.cell == cell and r.arm == arm]
            for q in qs:
                xb = np.asarray([_scalar(r, q, k) for r in b], dtype=np.float64)
                xt = np.asarray([_scalar(r, q, k) for r in t], dtype=np.float64)
                c = compare_runs(xb, xt, stat, n_boot, rng=rng, alpha=alpha)
                out.append(_comparison_row(cell, q, c, (baseline, arm)))
            out.extend(
                _speedup_row(cell, b, t, (baseline, arm), float(x), window, alpha, rng) for x in targets
            )
    return tuple(out)
