"""Reward-matched checkpoint selection (paper Sec. 3.1: quality "at matched reward levels"; App.
"Human Preference Study": PCPO epoch 120 vs the two baseline checkpoints that bracket its reward,
epochs 180 (lower) and 240 (higher)).

For each run directory (``RUN/log.parquet`` + ``RUN/checkpoints/epoch_XXXX/checkpoint.json``):

* the reward of a saved checkpoint is the run's smoothed training reward at that epoch (trailing
  moving average of ``reward_mean``, window 5, as in :mod:`pcpo_eval.stats.speedup`); without a
  log the raw ``reward_mean`` of ``checkpoint.json`` is used and ``reward_source`` says so;
* ``on="eval"``: the reward is instead the held-out validation reward (``val_reward_mean``, logged
  every ``validation_every`` epochs by the trainer), smoothed over the trailing ``window``
  validation points; only checkpoints saved at a validation epoch are candidates (Flow-GRPO
  judges its runs on held-out prompts, paper l.1299-1302);
* ``on="gain"``: the reward is the training reward minus the paired untrained control's
  (``control_reward_mean``: the base model on the epoch's prompts and noises), smoothed alike:
  checkpoints matched on learning. A raw target that a run's untrained control reaches
  (:func:`control_reaches`) is matched by the sampler alone: a frozen policy, or a sampler whose
  own level is higher (PCPO's sigma~), would look "reward-matched" without learning;
* matched checkpoint: the first saved checkpoint (in epoch order) whose reward reaches the target
  over a *full* window (``full_window``: from the ``window``-th logged epoch, or validation point,
  on), the rule :mod:`pcpo_eval.stats.speedup` counts epochs to a target by, so a run's matched
  checkpoint is where its time to target ends. A checkpoint before a full window carries the
  average of what is logged so far (shown, as on the curves) but never "reaches": a single noisy
  first epoch is not a 5-epoch average (an untrained or frozen policy would otherwise be matched at
  epoch 1 whenever its first epoch's noise crosses the target). If none reaches, the full-window
  checkpoint whose reward is nearest to it (any checkpoint when the run has no full window;
  ``reached = False``); the gap is ``reward - target``;
* bracketing: given a reference checkpoint (PCPO) with reward r*, each other run's ``above`` is
  its first saved full-window checkpoint with reward >= r* and ``below`` the saved checkpoint just
  before it; a run that never reaches r* has ``below`` = its last checkpoint and no ``above``; one
  whose first full-window checkpoint is its first checkpoint and already reaches r* has no ``below``.
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.rundir import CONTROL_COLUMN, checkpoints_root, epoch_dirs, load_log, log_path, meta_path
from pcpo_eval.stats.speedup import SMOOTHING_WINDOW, check_window, moving_average

#: what a checkpoint is matched on -> the log.parquet column(s) holding it (``gain``: the training reward
#: minus the paired untrained control's, the learning alone; the sampler's own level cancels)
MATCH_ON = {"train": "reward_mean", "eval": "val_reward_mean", "gain": f"reward_mean - {CONTROL_COLUMN}"}


@dataclass(frozen=True)
class RunCheckpoint:
    """A saved checkpoint with the reward used for matching."""

    run: str
    epoch: int
    path: str
    reward: float
    reward_raw: float
    #: the smoothed reward averages a full window (may count as reaching a target); False for the
    #: first ``window - 1`` logged epochs (validation points), whose average is partial
    full_window: bool = True
    #: ``on="train"``: the paired untrained control's highest smoothed reward over a full window at any
    #: logged epoch up to this one (None without the control or before a full window): a target it reaches
    #: needs no learning
    control: float | None = None
    #: the matching curve's centred mean at this epoch (``window`` logged epochs around it, or None): the
    #: trailing mean lags a rising curve by about (window - 1) / 2 epochs of its slope, so a faster arm's
    #: "matched" checkpoint is further along; the centred mean does not lag (:func:`centred_by_epoch`)
    centred: float | None = None


@dataclass(frozen=True)
class CheckpointChoice:
    """The checkpoint matched to a target reward."""

    run: str
    epoch: int
    path: str
    reward: float
    target: float
    gap: float
    reached: bool
    reward_source: str
    #: the chosen checkpoint's reward averages a full window (False: logged before the window-th epoch,
    #: so it cannot count as reaching the target, whatever its partial average)
    full_window: bool = True


@dataclass(frozen=True)
class Bracket:
    """Checkpoints of one run just below / above a reference reward (either may be None)."""

    run: str
    reference_reward: float
    below: RunCheckpoint | None
    above: RunCheckpoint | None


def matched_noun(on: str) -> str:
    """What checkpoints matched ``on`` (train | eval | gain) are matched on, as printed: a gain over the untrained
    control is no reward (``select --on gain`` printed "Target reward 0.04" over gains)."""
    return {"gain": "gain", "eval": "validation reward"}.get(on, "reward")


@dataclass(frozen=True)
class Selection:
    """Result of :func:`select_checkpoints`."""

    target: float
    window: int
    choices: tuple[CheckpointChoice, ...]
    reference: CheckpointChoice | None
    brackets: tuple[Bracket, ...]
    #: runs matched at a checkpoint by which their paired untrained control reaches the target too
    control_reaches: tuple[str, ...] = ()
    #: what was matched: ``train`` (training reward), ``eval`` (validation reward) or ``gain`` (over the control)
    on: str = "train"

    @property
    def noun(self) -> str:
        """The matched quantity as printed (:func:`matched_noun`)."""
        return matched_noun(self.on)

    def to_dict(self) -> dict[str, Any]:
        """JSON shape of ``pcpo-eval select --json``."""
        return {
            "target": self.target,
            "window": self.window,
            "runs": [asdict(c) for c in self.choices],
            "reference": asdict(self.reference) if self.reference else None,
            "brackets": [asdict(b) for b in self.brackets],
            "control_reaches": list(self.control_reaches),
            "on": self.on,
        }

    def to_frame(self) -> pd.DataFrame:
        """One row per run: chosen epoch, reward, gap, reached."""
        return pd.DataFrame([asdict(c) for c in self.choices])

    def to_markdown(self) -> str:
        """Small markdown table (plus the bracketing rows when a reference was given)."""
        lines = [
            f"Target {self.noun} {self.target:g} (smoothed, window {self.window})",
            "",
            f"| Run | Epoch | {self.noun.capitalize()} | Gap | Reached |",
            "|---|---:|---:|---:|:---:|",
        ]
        for c in self.choices:
            reached = "yes" if c.reached else ("no" if c.full_window else "no (partial window)")
            lines.append(f"| {c.run} | {c.epoch} | {c.reward:.4g} | {c.gap:+.3g} | {reached} |")
        if self.control_reaches:
            lines += ["", f"warning: the paired untrained control of {', '.join(self.control_reaches)} reaches the "
                          "target by the matched checkpoint: the sampler alone gets there, so these checkpoints are not "
                          "matched on learning; match on the gain (--on gain) or raise the target"]
        if any(not c.full_window for c in self.choices):
            lines += ["", f"partial window: the run has logged fewer than {self.window} epochs by that checkpoint, so "
                          "its reward averages what is logged and cannot reach the target (the speed-up's rule); train "
                          "longer or pass a smaller --window"]
        if self.reference is not None:
            r = self.reference
            lines += [
                "",
                f"Bracketing around reference {r.run} epoch {r.epoch} ({self.noun} {r.reward:.4g}):",
                "",
                f"| Run | Below (epoch, {self.noun}) | Above (epoch, {self.noun}) |",
                "|---|---:|---:|",
            ]
            for b in self.brackets:

                def fmt(c: RunCheckpoint | None) -> str:
                    return "-" if c is None else f"{c.epoch}, {c.reward:.4g}"

                lines.append(f"| {b.run} | {fmt(b.below)} | {fmt(b.above)} |")
        return "\n".join(lines)


def _eval_checkpoints(run: Path, dirs: list[tuple[int, Path]], window: int) -> tuple[list[RunCheckpoint], str]:
    """Checkpoints at validation epochs with the trailing mean of ``val_reward_mean`` over validation points."""
    log_file = log_path(run)
    if not log_file.is_file():
        raise UserError(f"run {run} has no log.parquet; matching on the eval reward needs its val_reward_mean column")
    log = load_log(log_file)
    col = MATCH_ON["eval"]
    if col not in log.columns or not np.isfinite(log[col].to_numpy(np.float64)).any():
        raise UserError(f"run {run} logged no held-out validation reward ({col}); train with validation_every=N "
                        "and validation_prompts=SET, or match on the training reward (--on train)")
    val = log[np.isfinite(log[col].to_numpy(np.float64))]
    epochs = val["epoch"].astype(int).to_numpy()
    sm = dict(zip(epochs, moving_average(val[col].to_numpy(np.float64), window), strict=True))
    rw = dict(zip(epochs, val[col].astype(float), strict=True))
    full = _full_windows(epochs, window)
    out = [RunCheckpoint(str(run), ep, str(d), float(sm[ep]), float(rw[ep]), full[ep]) for ep, d in dirs if ep in sm]
    if not out:
        raise UserError(f"run {run}: no checkpoint was saved at a validation epoch ({', '.join(map(str, epochs))}); "
                        "make checkpoint_every divide validation_every")
    return out, f"log.parquet {col} (moving average over {window} validation points)"


def _gain_checkpoints(run: Path, dirs: list[tuple[int, Path]], window: int) -> tuple[list[RunCheckpoint], str]:
    """Checkpoints with the trailing mean of the per-epoch gain ``reward_mean - control_reward_mean`` (the
    paired untrained control on the same prompts and noises): matched learning, whatever the sampler's
    own level. An epoch without its control counts as missing, so a window over it is not full."""
    log_file = log_path(run)
    if not log_file.is_file():
        raise UserError(f"run {run} has no log.parquet; matching on the gain needs its {CONTROL_COLUMN} column")
    log = load_log(log_file)
    _check_finite_rewards(run, log)
    if CONTROL_COLUMN not in log.columns or not np.isfinite(log[CONTROL_COLUMN].to_numpy(np.float64)).any():
        raise UserError(f"run {run} logged no paired untrained control ({CONTROL_COLUMN}); train with "
                        "paired_control: true, or match on the training reward (select_on: train)")
    epochs = log["epoch"].astype(int).to_numpy()
    gain = log["reward_mean"].to_numpy(np.float64) - log[CONTROL_COLUMN].to_numpy(np.float64)
    sm, full = trailing_by_epoch(epochs, gain, window)
    centred = centred_by_epoch(epochs, gain, window)
    rw = dict(zip(epochs.tolist(), gain.tolist(), strict=True))
    out = []
    for ep, d in dirs:
        if ep not in sm:
            raise UserError(f"run {run}: checkpoint epoch {ep} is not in log.parquet (epochs {min(sm)}..{max(sm)})")
        out.append(RunCheckpoint(str(run), ep, str(d), float(sm[ep]), float(rw[ep]), full[ep],
                                 centred=centred.get(ep)))
    return out, (f"log.parquet reward_mean - {CONTROL_COLUMN} (gain over the paired untrained control; moving "
                 f"average, window {window}; reached over full windows only)")


def _running_peak(values: dict[int, float], full: dict[int, bool]) -> dict[int, float]:
    """Per logged epoch, the highest full-window value at any logged epoch up to it (epochs before the first
    full window are left out)."""
    out, best = {}, -math.inf
    for ep in sorted(values):
        if full.get(ep) and math.isfinite(values[ep]):
            best = max(best, values[ep])
        if best > -math.inf:
            out[ep] = best
    return out


def control_reaches(cks: Sequence[RunCheckpoint], target: float, epoch: int | None) -> bool:
    """Whether the run's paired untrained control reaches ``target`` (smoothed, full window) at any logged
    epoch up to ``epoch`` (None: any; :attr:`RunCheckpoint.control` is its peak so far): the sampler alone
    gets there, so a checkpoint matched to it may not have learned anything (a frozen policy would be
    "matched" too). Before, only the saved checkpoints' epochs were looked at: a control that reached the
    target at epoch 15, between checkpoints 12 and 16, went unseen."""
    return any(c.control is not None and c.control >= target for c in cks if epoch is None or c.epoch <= epoch)


def _full_windows(epochs: Sequence[int] | np.ndarray, window: int) -> dict[int, bool]:
    """Epoch -> whether its trailing mean covers a full ``window`` of logged values (the ``window``-th
    logged value on: :func:`pcpo_eval.stats.speedup.full_window_average`'s rule)."""
    return {int(ep): i >= window - 1 for i, ep in enumerate(epochs)}


def trailing_by_epoch(epochs: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray,
                      window: int) -> tuple[dict[int, float], dict[int, bool]]:
    """Per logged epoch, the mean of the logged values among the trailing ``window`` *epochs*, and whether
    all of them are logged (a full window: :func:`pcpo_eval.stats.speedup.full_window_average`'s rule).

    Counted in epochs, not log rows: a log missing epochs (merged by hand after a crash) would otherwise
    average values many epochs apart and call that window full. On a log without gaps it is
    :func:`~pcpo_eval.stats.speedup.moving_average` to the bit (the same running sums)."""
    ep = np.asarray(epochs, dtype=np.int64)
    first = int(ep.min())
    a = np.full(int(ep.max()) - first + 1, np.nan)
    a[ep - first] = np.asarray(values, dtype=np.float64)
    have = np.isfinite(a)
    c, n = np.cumsum(np.r_[0.0, np.where(have, a, 0.0)]), np.cumsum(np.r_[0, have.astype(np.int64)])
    idx = ep - first + 1
    lo = np.maximum(idx - window, 0)
    counts = n[idx] - n[lo]
    with np.errstate(invalid="ignore", divide="ignore"):  # a window with no finite value: NaN, said by the caller
        means = (c[idx] - c[lo]) / counts
    return ({int(e): float(m) for e, m in zip(ep, means, strict=True)},
            {int(e): bool(k == window) for e, k in zip(ep, counts, strict=True)})


def centred_by_epoch(epochs: Sequence[int] | np.ndarray, values: Sequence[float] | np.ndarray,
                     window: int) -> dict[int, float]:
    """Per logged epoch, the mean of the values at the ``window`` epochs centred on it (``window // 2`` on each
    side, and the epoch itself: ``2 (window // 2) + 1`` epochs), where all of them are logged and finite. On a
    straight curve it is the value at that epoch, where the trailing mean of :func:`trailing_by_epoch` sits
    ``(window - 1) / 2`` epochs of slope below it."""
    h = window // 2
    val = {int(e): float(v) for e, v in zip(epochs, values, strict=True)}
    out = {}
    for e in val:
        around = [val.get(k, math.nan) for k in range(e - h, e + h + 1)]
        if all(math.isfinite(x) for x in around):
            out[e] = float(np.mean(around))
    return out


def _check_finite_rewards(run: Path, log: pd.DataFrame) -> None:
    """A log with an infinite ``reward_mean`` (NaN is refused by the log reader) cannot rank checkpoints:
    every trailing mean over that epoch is infinite and "reaches" any target, so it is refused by name."""
    bad = log["epoch"].astype(int).to_numpy()[~np.isfinite(log["reward_mean"].to_numpy(np.float64))]
    if bad.size:
        raise UserError(f"run {run}: log.parquet column 'reward_mean' is infinite at epoch(s) "
                        f"{', '.join(map(str, bad[:6]))}{', ...' if bad.size > 6 else ''}; a smoothed reward over "
                        "those epochs would reach any target. Fix or drop those epochs, or leave the run out")


def run_checkpoints(run_dir: str | Path, window: int = SMOOTHING_WINDOW, on: str = "train") -> tuple[list[RunCheckpoint], str]:
    """Saved checkpoints of a run, in epoch order, with smoothed rewards; and the reward source.

    ``on``: ``train`` (the training reward) or ``eval`` (the held-out validation reward)."""
    if on not in MATCH_ON:
        raise UserError(f"unknown match on {on!r}; choose one of: {', '.join(MATCH_ON)}")
    run = Path(run_dir)
    if not run.is_dir():
        state = "is a file, not a run folder" if run.exists() else "does not exist"
        raise UserError(f"run directory {run} {state}; give a run folder written by `pcpo-eval train` "
                        "(RUN/log.parquet, RUN/checkpoints/)")
    ck_root = checkpoints_root(run)
    dirs = epoch_dirs(run, complete=False)
    if not dirs:
        raise UserError(f"run {run} has no saved checkpoints (expected {ck_root}/epoch_XXXX/)")
    if on == "eval":
        return _eval_checkpoints(run, dirs, window)
    if on == "gain":
        return _gain_checkpoints(run, dirs, window)
    raw: dict[int, float] = {}
    for ep, d in dirs:
        meta = meta_path(d)
        if meta.is_file():
            try:
                info = json.loads(meta.read_text())
            except json.JSONDecodeError as exc:
                raise UserError(f"{meta} is not valid JSON: {exc.msg}") from None
            if "reward_mean" in info and info["reward_mean"] is not None:
                raw[ep] = float(info["reward_mean"])
    log_file = log_path(run)
    out: list[RunCheckpoint] = []
    if log_file.is_file():
        log = load_log(log_file)
        _check_finite_rewards(run, log)
        epochs = log["epoch"].astype(int).to_numpy()
        sm, full = trailing_by_epoch(epochs, log["reward_mean"].to_numpy(), window)
        ctl, ctl_full = (trailing_by_epoch(epochs, log[CONTROL_COLUMN].to_numpy(np.float64), window)
                         if CONTROL_COLUMN in log.columns else ({}, {}))
        rw = dict(zip(log["epoch"].astype(int), log["reward_mean"].astype(float), strict=True))
        peak = _running_peak(ctl, ctl_full)
        centred = centred_by_epoch(epochs, log["reward_mean"].to_numpy(np.float64), window)
        source = f"log.parquet (moving average, window {window}; a target is reached over full windows only)"
        for ep, d in dirs:
            if ep not in sm:
                raise UserError(
                    f"run {run}: checkpoint epoch {ep} is not in log.parquet (epochs {min(sm)}..{max(sm)})"
                )
            out.append(RunCheckpoint(str(run), ep, str(d), float(sm[ep]), float(rw[ep]), full[ep], peak.get(ep),
                                     centred.get(ep)))
    else:
        source = "checkpoint.json reward_mean (unsmoothed: no log.parquet)"
        for ep, d in dirs:
            if ep not in raw:
                raise UserError(f"run {run}: no log.parquet and {d}/checkpoint.json lacks 'reward_mean'")
            out.append(RunCheckpoint(str(run), ep, str(d), raw[ep], raw[ep]))
    return out, source


def _reaching(cks: Sequence[RunCheckpoint], level: float) -> np.ndarray:
    """Indices of the checkpoints whose full-window reward reaches ``level``."""
    return np.nonzero([c.full_window and c.reward >= level for c in cks])[0]


def match_checkpoint(cks: Sequence[RunCheckpoint], target: float, source: str) -> CheckpointChoice:
    """First full-window checkpoint reaching ``target``, else the nearest one (pure; see module docstring)."""
    rewards = np.array([c.reward for c in cks])
    hit = _reaching(cks, target)
    full = np.array([c.full_window for c in cks])
    pool = np.nonzero(full)[0] if full.any() else np.arange(len(cks))  # nearest among full windows if any
    i = int(hit[0]) if hit.size else int(pool[np.argmin(np.abs(rewards[pool] - target))])
    c = cks[i]
    return CheckpointChoice(
        c.run, c.epoch, c.path, c.reward, float(target), c.reward - float(target), bool(hit.size), source,
        c.full_window,
    )


def bracket(cks: Sequence[RunCheckpoint], reference_reward: float) -> Bracket:
    """Checkpoints just below / above ``reference_reward`` around the first full-window crossing (pure)."""
    hit = _reaching(cks, reference_reward)
    if not hit.size:
        return Bracket(cks[-1].run, reference_reward, cks[-1], None)
    i = int(hit[0])
    return Bracket(cks[i].run, reference_reward, cks[i - 1] if i > 0 else None, cks[i])


def select_checkpoints(
    run_dirs: Sequence[str | Path], target: float, window: int = SMOOTHING_WINDOW, reference: str | Path | None = None,
    on: str = "train",
) -> Selection:
    """Reward-matched checkpoint per run; with ``reference`` (a PCPO run) also the bracketing.
    ``on``: match on the training reward (``train``), the held-out validation reward (``eval``) or the gain
    over the paired untrained control (``gain``)."""
    if not run_dirs:
        raise UserError("give at least one run directory")
    check_window(window)
    choices = []
    per_run = []
    for rd in run_dirs:
        cks, src = run_checkpoints(rd, window, on)
        per_run.append(cks)
        choices.append(match_checkpoint(cks, target, src))
    ref_choice = None
    brackets: list[Bracket] = []
    if reference is not None:
        rcks, rsrc = run_checkpoints(reference, window, on)
        ref_choice = match_checkpoint(rcks, target, rsrc)
        brackets = [bracket(cks, ref_choice.reward) for cks in per_run]
    by_control = tuple(c.run for c, cks in zip(choices, per_run, strict=True)
                       if c.reached and control_reaches(cks, target, c.epoch))
    return Selection(float(target), window, tuple(choices), ref_choice, tuple(brackets), by_control, on)
