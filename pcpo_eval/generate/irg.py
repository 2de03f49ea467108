"""Implicit Reward Guidance (paper App. "Implicit Reward Guidance", Eq. irg-multi-mix)::

    eps_IRG = eps_ref + sum_i lambda_i (eps_theta_i - eps_ref)      (velocity alike for flows)

selected with the model spec ``irg:CKPT_1=LAMBDA_1,CKPT_2=LAMBDA_2[@REFERENCE]``.

Owns :class:`IRGSpec` / :func:`parse_irg_spec` (the spec), :func:`irg_combine` (the formula, a
pure function), :class:`IRGAdapter` (the formula as a model) and :func:`default_irg_reference`
(a checkpoint's base model). Loading the models of a spec is :mod:`.loading`'s.
"""

from collections.abc import Sequence
from dataclasses import dataclass
from typing import Any

import numpy as np
import torch
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

#: Largest |lambda_i| taken, as generate's :data:`~pcpo_eval.generate.plan.MAX_CFG` for the guidance weight: the
#: paper sweeps 0-1.5; a weight of 1e308 overflows the float32 combined prediction to inf (float32's max is 3.4e38)
MAX_LAMBDA = 1000.0


def lambda_problem(lam: object) -> str | None:
    """Why ``lam`` cannot be an IRG weight (None: it can): a finite number within +-:data:`MAX_LAMBDA`."""
    if not isinstance(lam, int | float) or isinstance(lam, bool) or not np.isfinite(lam) or abs(lam) > MAX_LAMBDA:
        return f"use a finite weight within +-{MAX_LAMBDA:g} (the paper sweeps 0 to 1.5)"
    return None


@dataclass(frozen=True)
class IRGSpec:
    """Parsed ``irg:`` model spec: fine-tuned components with weights, and the reference."""

    components: tuple[tuple[str, float], ...]
    reference: str | None = None


def parse_irg_spec(spec: str) -> IRGSpec:
    """Parse ``irg:CKPT_1=L_1,CKPT_2=L_2[@REF]`` (``=L`` defaults to 1.0; ``@REF`` to the base).

    Each ``CKPT`` and ``REF`` is any model spec :func:`load_generation_model` accepts
    (``base``, ``toy``, ``sd1:PATH``, ``RUN/checkpoints/epoch_0010``). Commas separate components;
    the weight is the text after the last ``=``; the reference is the text after the last ``@``.
    Example: ``irg:runs/a/checkpoints/epoch_0010=0.5,runs/b/checkpoints/epoch_0020=0.5@base``.
    """
    body = spec[4:] if spec.startswith("irg:") else spec
    reference: str | None = None
    if "@" in body:
        body, reference = body.rsplit("@", 1)
        reference = reference.strip()
        if not reference:
            raise UserError(f"IRG spec {spec!r}: empty reference after '@'; write irg:CKPT=LAMBDA@REF")
    components = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise UserError(f"IRG spec {spec!r}: empty component; write irg:CKPT=LAMBDA[,CKPT=LAMBDA][@REF]")
        path, lam = part, 1.0
        if "=" in part:
            path, lam_s = part.rsplit("=", 1)
            try:
                lam = float(lam_s)
            except ValueError:
                raise UserError(f"IRG spec {spec!r}: weight {lam_s!r} is not a number") from None
            if problem := lambda_problem(lam):
                raise UserError(f"IRG spec {spec!r}: weight {lam_s!r}: {problem}")
        if not path.strip():
            raise UserError(f"IRG spec {spec!r}: component {part!r} has no checkpoint")
        components.append((path.strip(), lam))
    return IRGSpec(tuple(components), reference)


def irg_combine(ref_out: torch.Tensor, outs: Sequence[torch.Tensor], lambdas: Sequence[float]) -> torch.Tensor:
    """eps_ref + sum_i lambda_i (eps_i - eps_ref)   (paper Eq. irg-multi-mix; pure function)."""
    total = ref_out.clone()
    for out, lam in zip(outs, lambdas, strict=True):
        total += lam * (out - ref_out)
    return total


class IRGAdapter(ModelAdapter):
    """Implicit Reward Guidance over a reference and one or more fine-tuned denoisers.

    Prompt encoding and decoding come from the reference (RL fine-tuning changes only the
    denoiser). CFG is applied on top by :meth:`ModelAdapter.predict`; both are linear, so the
    order does not matter.
    """

    def __init__(self, reference: ModelAdapter, components: Sequence[tuple[ModelAdapter, float]]) -> None:
        if not components:
            raise UserError("IRG needs at least one fine-tuned checkpoint")
        for comp, _ in components:
            if comp.prediction != reference.prediction or tuple(comp.latent_shape) != tuple(reference.latent_shape):
                raise UserError(
                    f"IRG component {comp.name!r} ({comp.prediction}, latent {tuple(comp.latent_shape)}) does not "
                    f"match the reference ({reference.prediction}, latent {tuple(reference.latent_shape)}); "
                    "use checkpoints of the same base model"
                )
        self.reference = reference
        self.components = [c for c, _ in components]
        self.lambdas = [float(lam) for _, lam in components]
        self.name = f"irg({reference.name})"
        self.prediction = reference.prediction
        self.denoiser = nn.ModuleList([reference.denoiser, *(c.denoiser for c in self.components)])
        self.scheduler_config = reference.scheduler_config
        self.latent_shape = tuple(reference.latent_shape)
        self.lora_target_modules = list(getattr(reference, "lora_target_modules", []))

    def __getattr__(self, name: str) -> Any:
        """Other adapter attributes (``image_seq_len``, ...) come from the reference."""
        if name == "reference":
            raise AttributeError(name)
        return getattr(self.reference, name)

    def check_prompts(self, prompts: list[str]) -> None:
        self.reference.check_prompts(prompts)

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        return self.reference.encode_prompts(prompts)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        ref = self.reference.denoise(x_t, t, cond)
        return irg_combine(ref, [c.denoise(x_t, t, cond) for c in self.components], self.lambdas)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.reference.decode(latents)


def default_irg_reference(checkpoint_spec: str) -> str:
    """The base model a checkpoint was fine-tuned from (the IRG reference when ``@REF`` is omitted).

    Read from the checkpoint's ``checkpoint.json`` (``model``) or its run's ``config.yaml``
    (``model``); ``toy`` when the spec is not a checkpoint (the toy model, formerly called ``base``).
    """
    from pcpo_eval.rundir import run_dir_of
    from pcpo_eval.train import checkpoints

    ckpt = checkpoints.resolve_checkpoint(checkpoint_spec)
    if ckpt is None:
        return "toy"
    meta = checkpoints.read_meta(ckpt)
    return str(meta.get("model") or checkpoints.load_run_config(run_dir_of(ckpt)).get("model", "toy"))
