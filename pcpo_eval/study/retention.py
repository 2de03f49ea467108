"""Checkpoint retention in a study: a run's ``keep_checkpoints`` must never delete a checkpoint the study selects.

A trained run saves a checkpoint every ``checkpoint_every`` epochs and at its last epoch; with
``keep_checkpoints: N`` (N > 0) only the newest N survive training (:func:`pcpo_eval.train.checkpoints.retained`).
The study then selects from what survived:

* **reward-matched** (``select_target``, always on): the *first* saved checkpoint whose smoothed reward
  reaches the target, which may be any saved epoch, unknown before training. Selecting among the
  survivors only would pick a later checkpoint than the protocol's, so every saved checkpoint is needed;
* **explicit epochs**: ``select_epoch`` (an epoch, ``final`` = the last epoch every run saved, or
  ``{arm: epoch}``), ``preference[].epochs``, ``grid[].epochs``.

:func:`retention_problems` names each run whose ``keep_checkpoints`` would delete one of them, so
:func:`pcpo_eval.study.spec.load_spec` refuses the spec (one ``error:`` line, exit 2) before any training.
Whatever ``keep_checkpoints``, only a run's newest checkpoint keeps its optimizer state, so a study's
older checkpoints cost their weights alone (docs/training.md#checkpoint-retention).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from typing import Any


def saved_epochs(cfg: Any) -> list[int]:
    """Epochs at which a run with TrainConfig ``cfg`` saves a checkpoint (every ``checkpoint_every``, and the last)."""
    every, last = max(1, int(cfg.checkpoint_every)), int(cfg.epochs)
    return [e for e in range(1, last + 1) if e % every == 0 or e == last]


def kept_epochs(cfg: Any) -> list[int]:
    """The saved epochs still on disk after training: the newest ``keep_checkpoints`` (0 = all)."""
    from pcpo_eval.train.checkpoints import retained

    return retained(saved_epochs(cfg), int(getattr(cfg, "keep_checkpoints", 0)))


def _explicit(select_epoch: Any, epoch_maps: Sequence[tuple[str, dict[str, int] | None]], arm: str,
              final: int | None) -> list[tuple[str, int]]:
    """(key, epoch) pairs a run of arm ``arm`` must keep by explicit selection."""
    out: list[tuple[str, int]] = []
    if isinstance(select_epoch, dict) and arm in select_epoch:
        out.append(("select_epoch", int(select_epoch[arm])))
    elif isinstance(select_epoch, int) and not isinstance(select_epoch, bool):
        out.append(("select_epoch", select_epoch))
    elif select_epoch == "final" and final is not None:
        out.append(("select_epoch final", final))
    for key, m in epoch_maps:
        if m and arm in m:
            out.append((key, int(m[arm])))
    return out


def retention_problems(runs: Sequence[Any], arm_of: Callable[[Any], str], select_target: float, select_epoch: Any,
                       epoch_maps: Sequence[tuple[str, dict[str, int] | None]]) -> list[str]:
    """One problem line when a trained run's ``keep_checkpoints`` would delete a checkpoint the study selects,
    else []. ``epoch_maps``: (spec key, {arm: epoch}) of the preference sets and grids."""
    trained = [r for r in runs if r.train is not None]
    if not trained:
        return []
    common = set.intersection(*(set(saved_epochs(r.train)) for r in trained))
    final = max(common) if common else None
    bad = []
    for r in trained:
        saved, kept = saved_epochs(r.train), kept_epochs(r.train)
        if kept == saved:
            continue
        lost = [f"{key} E{e}" for key, e in _explicit(select_epoch, epoch_maps, arm_of(r), final)
                if e in saved and e not in kept]
        why = ", ".join([*lost, f"reward-matched selection (select_target {select_target:g}) may pick any of them"])
        bad.append(f"run {r.name} keeps only E{', E'.join(map(str, kept))} of its {len(saved)} checkpoints "
                   f"(keep_checkpoints={r.train.keep_checkpoints}), but {why}")
    if not bad:
        return []
    need = max(len(saved_epochs(r.train)) for r in trained)
    more = f" (and {len(bad) - 1} more run(s))" if len(bad) > 1 else ""
    return [f"keep_checkpoints would delete checkpoints this study selects: {bad[0]}{more}; set keep_checkpoints: 0 "
            f"(keep all; older checkpoints keep weights only, no optimizer state) or >= {need} in train.overrides"]


def epoch_maps(preferences: Sequence[Any], grids: Sequence[Any]) -> list[tuple[str, dict[str, int] | None]]:
    """(spec key, {arm: epoch}) of every preference set and grid that names explicit epochs."""
    return [*((f"preference {p.name}.epochs" if p.name else "preference.epochs", p.epochs) for p in preferences),
            *((f"grid {g.name}.epochs" if g.name else "grid.epochs", g.epochs) for g in grids)]
