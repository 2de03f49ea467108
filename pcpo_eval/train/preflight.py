"""What a training run needs from outside the checkout, checked before anything loads.

:func:`missing_assets` lists every absent prompt set, reward / model weight of a
:class:`~pcpo_eval.train.config.TrainConfig` at once (the same checks a study spec runs,
:func:`pcpo_eval.study.spec._check_weights`), so ``pcpo-eval train`` names them all in one error
(:class:`pcpo_eval.errors.ProblemList`, one item per line) instead of one per attempt.
"""

from __future__ import annotations

from typing import Any


def missing_assets(cfg: Any) -> list[str]:
    """One line per missing item (where it was looked for, how to get it); [] when all are present."""
    from pcpo_eval.study.spec import _backend_missing, _model_missing, _prompts_missing, reward_backends

    problems = []
    for role, pset in (("training prompts", cfg.prompts), ("validation_prompts", cfg.validation_prompts)):
        if pset and (msg := _prompts_missing(role, str(pset))) is not None:
            problems.append(msg)
    backends = reward_backends(cfg.reward, dict(cfg.reward_options or {}))
    problems += [f"training reward {cfg.reward}: {m}" for m in _backend_missing(backends)]
    if (msg := _model_missing(str(cfg.model))) is not None:
        problems.append(msg)
    return problems
