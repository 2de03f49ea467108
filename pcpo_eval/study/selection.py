"""The study's select stage: which checkpoint of each run enters the image-quality comparison.

Two comparisons, each with one checkpoint per run:

* **matched reward** (paper Sec. 3.1: quality "at matched reward levels"): a run's first saved
  checkpoint whose smoothed training reward (trailing mean, window 5) reaches ``select_target``
  over a full window, as the speed-up counts epochs to a target
  (:func:`pcpo_eval.stats.select.match_checkpoint`). A run that never reaches it has **no**
  reward-matched checkpoint: its row says "not reached" with its best smoothed reward, and it is
  left out of the matched-reward metrics, never replaced by its nearest checkpoint (a run whose
  reward fell would otherwise be compared at a reward it never had).
  With ``select_on: eval`` the reward is the held-out validation reward (``val_reward_mean``,
  smoothed over the trailing ``window`` validation points) and only checkpoints saved at a
  validation epoch are candidates (:func:`pcpo_eval.stats.select.run_checkpoints`).
* **matched epoch**: every run at the same epoch, ``select_epoch`` (``final`` = the last epoch at
  which every run saved a checkpoint), so a method that reaches the target early is also compared
  after the same amount of training. ``select_epoch: null`` turns it off.
* **explicit epochs** (``select_epoch: {DanceGRPO: 180, PCPO: 120}``): each arm at its own stated
  checkpoint, the paper's protocol where it compares fixed checkpoints (Table raw-scores-merged (b):
  PCPO at a higher-reward checkpoint than DanceGRPO, l.615-617; preference tables at E200 /
  E120 vs E180). ``selection.json`` then holds ``epoch`` as a label (``"DanceGRPO E180, PCPO E120"``)
  and ``epochs`` as the mapping; the rows are the ``at_epoch`` rows.

A ``select_target`` that every run reaches at its first full-window checkpoint makes the
matched-reward checkpoint simply that checkpoint; the selection says so (``target_uninformative``).
A raw ``select_target`` that a run's paired untrained control reaches by the run's matched checkpoint
is reached by the sampler alone: the row says so (``control_reaches``) and the selection carries the
warning (``control_reaches_note``); ``select_on: gain`` matches on the gain over the control instead.
"""

from __future__ import annotations

from collections.abc import Sequence
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.rundir import checkpoint_dir
from pcpo_eval.stats.select import RunCheckpoint, control_reaches, match_checkpoint, run_checkpoints
from pcpo_eval.study.spec import RunSpec, StudySpec
from pcpo_eval.studydir import StudyLayout, set_label


def _identity(sp: StudySpec, run: RunSpec) -> dict[str, Any]:
    return {"name": run.name, "levels": run.levels, "role": sp.role(run), "arm": sp.arm(run), "seed": run.seed,
            "cell": sp.cell_key(run)}


def reward_row(sp: StudySpec, run: RunSpec, cks: Sequence[RunCheckpoint], source: str) -> dict[str, Any]:
    """The run's reward-matched checkpoint, or a "not reached" row without one."""
    c = match_checkpoint(cks, sp.select_target, source)
    row = {**_identity(sp, run), "match": "reward", "target": sp.select_target, "reward_source": source,
           "reached": c.reached, "reward": c.reward, "gap": c.gap}
    if c.reached:
        by_control = control_reaches(cks, sp.select_target, c.epoch)
        centred = next(k.centred for k in cks if k.epoch == c.epoch)
        return row | {"epoch": c.epoch, "path": c.path, "control_reaches": by_control, "reward_centred": centred,
                      "status": "reached (so does its untrained control)" if by_control else "reached"}
    why = (f"best smoothed reward {c.reward:.4g} at epoch {c.epoch} < target {sp.select_target:g}" if c.full_window
           else f"the run has no checkpoint after {sp.window} logged epochs (the smoothing window), so none can "
                "reach it")
    return row | {"epoch": None, "path": None, "best_epoch": c.epoch,
                  "status": f"not reached: {why}; no reward-matched checkpoint"}


def matched_epoch(select_epoch: int | str, cks: dict[str, Sequence[RunCheckpoint]]) -> int:
    """``final`` -> the last epoch every run saved; an epoch -> itself if every run saved it."""
    common = set.intersection(*({c.epoch for c in v} for v in cks.values()))
    if select_epoch == "final":
        if not common:
            raise UserError("select_epoch final: the runs share no checkpoint epoch; align checkpoint_every/epochs "
                            "or set select_epoch: null")
        return max(common)
    missing = [name for name, v in cks.items() if int(select_epoch) not in {c.epoch for c in v}]
    if missing:
        raise UserError(f"select_epoch {select_epoch}: no checkpoint at that epoch in {', '.join(missing)}; choose one "
                        f"of the shared epochs ({', '.join(map(str, sorted(common))) or 'none'}) or final")
    return int(select_epoch)


def epochs_label(epochs: dict[str, int]) -> str:
    """``DanceGRPO E180, PCPO E120``: the label of an explicit per-arm selection."""
    return ", ".join(f"{arm} E{int(e)}" for arm, e in epochs.items())


def explicit_epochs(sp: StudySpec, cks: dict[str, Sequence[RunCheckpoint]], epochs: dict[str, int],
                    what: str = "select_epoch") -> dict[str, int]:
    """Run name -> its arm's stated epoch; a UserError naming every run that did not save it."""
    out = {r.name: int(epochs[sp.arm(r)]) for r in sp.runs if sp.arm(r) in epochs}
    missing = [f"{n} (E{e})" for n, e in out.items() if e not in {c.epoch for c in cks[n]}]
    if missing:
        raise UserError(f"{what} {epochs_label(epochs)}: no checkpoint at that epoch in {', '.join(missing)}; "
                        "train with a checkpoint_every that divides it, or change the epochs")
    return out


def epoch_row(sp: StudySpec, run: RunSpec, cks: Sequence[RunCheckpoint], epoch: int) -> dict[str, Any]:
    """The run's checkpoint at the matched (or its arm's explicit) epoch (its smoothed reward there)."""
    c = next(c for c in cks if c.epoch == epoch)
    return {**_identity(sp, run), "match": "epoch", "epoch": epoch, "path": c.path, "reward": c.reward,
            "reached": True, "status": f"epoch {epoch}"}


def explicit_sets(sp: StudySpec, layout: StudyLayout, epochs: dict[str, int],
                  what: str) -> list[tuple[str, str, dict[str, Any] | None]]:
    """(label, model, row) of the base model and of every run at its arm's stated epoch (the paper's fixed
    checkpoints: ``preference[].epochs``, ``grid[].epochs``); a missing checkpoint is one UserError."""
    out: list[tuple[str, str, dict[str, Any] | None]] = [("base", sp.base_model, None)]
    missing = []
    for run in sp.runs:
        if sp.arm(run) not in epochs:
            continue
        e = int(epochs[sp.arm(run)])
        path = checkpoint_dir(layout.run_dir(run), e)
        if not path.is_dir():
            missing.append(f"{run.name} (E{e})")
        out.append((set_label(run.name, e), str(path), {**_identity(sp, run), "epoch": e, "path": str(path),
                                                         "reward": None, "match": "explicit"}))
    if missing:
        raise UserError(f"{what} {epochs_label(epochs)}: no checkpoint at that epoch in {', '.join(missing)}; "
                        "train with a checkpoint_every that divides it, or change the epochs")
    return out


def control_note(sp: StudySpec, rows: Sequence[dict[str, Any]]) -> str | None:
    """The warning for reward-matched checkpoints whose paired untrained control reaches the target too (by
    the matched epoch): the sampler alone gets there, so "matched reward" does not mean matched learning; a
    frozen policy would be matched, and compared where it equals the base model. None when no run's does."""
    hit = [r for r in rows if r.get("control_reaches")]
    if not hit:
        return None
    reached = [r for r in rows if r.get("reached")]
    arms = sorted({r["arm"] for r in hit})
    return (f"the untrained control of {len(hit)} of {len(reached)} reward-matched runs ({', '.join(arms)}) reaches "
            f"select_target {sp.select_target:g} by the matched checkpoint: the sampler alone gets there, so these "
            "checkpoints are not matched on learning (a frozen policy would be matched too, and look like the base "
            "model); match on the gain over the control (select_on: gain, select_target a gain such as 0.04) or "
            "raise select_target above what the controls reach")


def _ema_decay(run: RunSpec) -> float:
    """The run's ``ema_decay``: from its resolved config when the study trains it, else from its run folder's
    ``config.yaml`` (0 when unreadable or absent: a run from before the setting, or an import)."""
    if run.train is not None:
        return float(run.train.ema_decay)
    if not run.run_dir:
        return 0.0
    from pcpo_eval.train.checkpoints import load_run_config

    try:
        return float(load_run_config(run.run_dir).get("ema_decay") or 0.0)
    except (UserError, TypeError, ValueError):
        return 0.0


def averaged_weights_note(sp: StudySpec) -> str | None:
    """A note when runs keep a moving average of their weights (``ema_decay``, Flow-GRPO's EMA) and the
    checkpoints are matched on a reward of the raw policy (``select_on`` train or gain): each checkpoint holds
    the average, which lags the reward it was matched on. None with ``select_on: eval`` (the validation
    reward scores the average itself) or when no trained run keeps one."""
    if sp.select_on == "eval":
        return None
    averaged = [r.name for r in sp.runs if _ema_decay(r) > 0]
    if not averaged:
        return None
    return (f"{len(averaged)} of {len(sp.runs)} runs keep a moving average of their weights (ema_decay), which "
            f"their checkpoints hold, while select_on: {sp.select_on} matches on the raw policy's training reward: "
            "the matched checkpoints' weights lag the reward they were matched on (more in an arm that learns "
            "faster); select_on: eval matches on the average's own held-out reward")


def select(sp: StudySpec, layout: StudyLayout) -> dict[str, Any]:
    """The content of ``selection.json``: reward-matched rows (``runs``) and matched-epoch rows (``at_epoch``)."""
    cks: dict[str, Sequence[RunCheckpoint]] = {}
    rows = []
    starts_above = []
    for run in sp.runs:
        ck, source = run_checkpoints(layout.run_dir(run), sp.window, sp.select_on)
        cks[run.name] = ck
        rows.append(reward_row(sp, run, ck, source))
        first = next((c for c in ck if c.full_window), None)
        starts_above.append(first is not None and first.reward >= sp.select_target)
    if not any(r["reached"] for r in rows):
        if not any(c.full_window for ck in cks.values() for c in ck):
            raise UserError(f"no run has logged {sp.window} epochs (the smoothing window) by a saved checkpoint, so none "
                            f"can reach select_target on a full-window average (the rule the speed-up counts by); "
                            f"train at least {sp.window} epochs, or set a smaller window")
        raise UserError(f"select_target {sp.select_target:g} is reached by no run; lower it or train longer")
    if isinstance(sp.select_epoch, dict):
        per_run = explicit_epochs(sp, cks, sp.select_epoch)
        at_epoch = [epoch_row(sp, r, cks[r.name], per_run[r.name]) | {"status": f"explicit epoch {per_run[r.name]}"}
                    for r in sp.runs if r.name in per_run]
        epoch: int | str | None = epochs_label(sp.select_epoch)
    else:
        epoch = None if sp.select_epoch is None else matched_epoch(sp.select_epoch, cks)
        at_epoch = [] if epoch is None else [epoch_row(sp, r, cks[r.name], int(epoch)) for r in sp.runs]
    return {"target": sp.select_target, "window": sp.window, "on": sp.select_on, "target_uninformative": all(starts_above),
            "control_reaches": [r["name"] for r in rows if r.get("control_reaches")],
            "control_reaches_note": control_note(sp, rows), "averaged_weights_note": averaged_weights_note(sp),
            "runs": rows, "epoch": epoch, "at_epoch": at_epoch,
            "epochs": dict(sp.select_epoch) if isinstance(sp.select_epoch, dict) else None}
