"""Samplers: the contract (:mod:`.base`), one file per algorithm (:mod:`.ddim`, :mod:`.flow`) and THE
sampler catalogue.

``SAMPLERS`` maps a sampler name to its :class:`~pcpo_eval.samplers.base.Sampler` (default options;
calling one returns latents, as the generator does), ``SCHEDULES`` to its noise-schedule choices
(first = default), and :func:`resolve_sampler` picks the sampler that fits a model's prediction type.
"""

from __future__ import annotations

from pcpo_eval.errors import UserError
from pcpo_eval.samplers.base import Sampler, Trajectory
from pcpo_eval.samplers.ddim import DDIMSampler
from pcpo_eval.samplers.flow import FlowSampler

#: Sampler name -> the sampler with its default options.
SAMPLERS: dict[str, Sampler] = {s.name: s for s in (DDIMSampler(), FlowSampler())}

#: Per sampler: its noise-schedule choices (first = default) for ``generate_set(schedule=...)``.
SCHEDULES: dict[str, tuple[str, ...]] = {name: s.schedules for name, s in SAMPLERS.items()}

#: Model prediction type -> the sampler that fits it.
PREDICTION_SAMPLER: dict[str, str] = {s.prediction: name for name, s in SAMPLERS.items()}

__all__ = ["PREDICTION_SAMPLER", "SAMPLERS", "SCHEDULES", "Sampler", "Trajectory", "resolve_sampler"]


def resolve_sampler(name: str, prediction: str) -> str:
    """``auto`` -> ``ddim`` for eps models, ``flow`` for velocity models; check compatibility."""
    if prediction not in PREDICTION_SAMPLER:
        raise UserError(f"no sampler fits a {prediction!r}-prediction model; samplers fit: "
                        f"{', '.join(PREDICTION_SAMPLER)}")
    if name == "auto":
        return PREDICTION_SAMPLER[prediction]
    if name not in SAMPLERS:
        raise UserError(f"unknown sampler {name!r}; choose one of: auto, {', '.join(SAMPLERS)}")
    if PREDICTION_SAMPLER[prediction] != name:
        raise UserError(f"sampler {name!r} does not fit a {prediction}-prediction model; use --sampler auto")
    return name
