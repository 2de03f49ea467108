"""What a training run needs from outside the checkout, checked before anything loads.

The one home of the asset checks a run and a study share: :func:`prompts_missing` (a prompt file
or dataset), :func:`backend_missing` (weights backends, :mod:`pcpo_eval.weights`) and
:func:`model_missing` (a real base pipeline). :func:`missing_assets` lists every absent item of a
:class:`~pcpo_eval.train.config.TrainConfig` at once, so ``pcpo-eval train`` names them all in one
error (:class:`pcpo_eval.errors.ProblemList`, one item per line) instead of one per attempt; the
study spec (:mod:`pcpo_eval.study.spec`) runs the same checks over all its runs and metrics.
"""

from __future__ import annotations

from collections.abc import Sequence
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError


def backend_missing(backends: Sequence[str]) -> list[str]:
    """Names of weights backends that cannot be located (with the locator's one-line hint)."""
    from pcpo_eval.weights.locate import status

    out = []
    for b in backends:
        st = status(b)
        if not st.found:
            out.append(st.error or f"{b} weights not found")
    return out


def model_missing(model: str) -> str | None:
    """A problem string if a real base model's weights are absent (toy models ship theirs)."""
    from pcpo_eval.models.flux import DEFAULT_FLUX
    from pcpo_eval.models.registry import PIPELINE_BACKENDS, pipeline_location
    from pcpo_eval.models.sd3 import DEFAULT_SD3

    kind, _, arg = str(model).partition(":")
    if kind not in PIPELINE_BACKENDS:
        return None
    arg = arg or {"sd3": DEFAULT_SD3, "flux": DEFAULT_FLUX}.get(kind, "")
    if not arg:
        return f"base model {model!r}: give its location, {kind}:PATH_OR_HF_ID"
    try:
        pipeline_location(kind, arg)
    except UserError as exc:
        return f"base model {model!r}: {exc}; see `pcpo-eval weights`"
    return None


def prompts_missing(role: str, pset: str) -> str | None:
    """A prompt file that does not exist, or a prompt dataset (:data:`pcpo_eval.prompts.DATASETS`)
    found nowhere: one line with where it was looked for and how to get it; None when present."""
    from pcpo_eval.prompts import DATASETS, locate_dataset

    if pset in DATASETS:
        try:
            locate_dataset(pset)
        except UserError as exc:
            return f"{role} {pset}: {exc}"
        return None
    if Path(pset).suffix and not Path(pset).is_file():
        return f"{role} file {pset} not found"
    return None


def missing_assets(cfg: Any) -> list[str]:
    """One line per missing item (where it was looked for, how to get it); [] when all are present."""
    from pcpo_eval.rewards import required_backends, reward_label

    problems = []
    for role, pset in (("training prompts", cfg.prompts), ("validation_prompts", cfg.validation_prompts)):
        if pset and (msg := prompts_missing(role, str(pset))) is not None:
            problems.append(msg)
    backends = required_backends(cfg.reward, dict(cfg.reward_options or {}))
    problems += [f"training reward {reward_label(cfg.reward)}: {m}" for m in backend_missing(backends)]
    if (msg := model_missing(str(cfg.model))) is not None:
        problems.append(msg)
    return problems
