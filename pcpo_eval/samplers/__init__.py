"""Samplers: one file per algorithm (:mod:`.ddim`, :mod:`.flow`) and THE sampler catalogue.

``SAMPLERS`` maps a sampler name to its sampling function, ``SCHEDULES`` to its noise-schedule choices
(first = default), and :func:`resolve_sampler` picks the sampler that fits a model's prediction type.
"""

from __future__ import annotations

from collections.abc import Callable

import torch

from pcpo_eval.errors import UserError


def _sample_ddim(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> torch.Tensor:
    """DDIM (:func:`pcpo_eval.samplers.ddim.sample_ddim`); ``schedule`` = sigma schedule ddim|pcpo."""
    from pcpo_eval.samplers.ddim import sample_ddim

    return sample_ddim(
        adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators, sigma_schedule=schedule
    ).latents


def _sample_flow(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> torch.Tensor:
    """Flow matching (:func:`pcpo_eval.samplers.flow.sample_flow`); ``schedule`` = SDE dance|flowgrpo|ode."""
    from pcpo_eval.samplers.flow import sample_flow

    return sample_flow(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators, sde=schedule).latents


#: Per sampler: its noise-schedule choices (first = default) for ``generate_set(schedule=...)``.
SCHEDULES: dict[str, tuple[str, ...]] = {"ddim": ("ddim", "pcpo"), "flow": ("ode", "dance", "flowgrpo")}

#: Sampler name -> fn(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> latents.
SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {"ddim": _sample_ddim, "flow": _sample_flow}
_PREDICTION_SAMPLER = {"eps": "ddim", "velocity": "flow"}


def resolve_sampler(name: str, prediction: str) -> str:
    """``auto`` -> ``ddim`` for eps models, ``flow`` for velocity models; check compatibility."""
    if name == "auto":
        return _PREDICTION_SAMPLER[prediction]
    if name not in SAMPLERS:
        raise UserError(f"unknown sampler {name!r}; choose one of: auto, {', '.join(SAMPLERS)}")
    if _PREDICTION_SAMPLER[prediction] != name:
        raise UserError(f"sampler {name!r} does not fit a {prediction}-prediction model; use --sampler auto")
    return name
