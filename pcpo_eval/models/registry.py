"""Model specs -> adapters: ``toy``, ``toy:PATH``, ``sd1:PATH_OR_HF_ID``, ``toyflow[:PATH]``,
``sd3[:PATH_OR_HF_ID]`` (default SD3.5-Medium), ``flux[:PATH_OR_HF_ID]`` (default FLUX.1-dev).

``load_model(spec)`` splits ``kind[:arg]`` and calls ``REGISTRY[kind](arg, device, dtype)``. Real
models load only from local files (a directory or the HF cache, ``local_files_only=True``).
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from dataclasses import dataclass

import torch

from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter

Factory = Callable[[str | None, str | torch.device, torch.dtype], ModelAdapter]


def _toy(arg: str | None, device: str | torch.device, dtype: torch.dtype) -> ModelAdapter:
    from pcpo_eval.models.toy import ToyAdapter

    return ToyAdapter.from_dir(arg or None, device=device, dtype=dtype)


#: pipeline kind -> weights backend (pcpo_eval/weights) whose env var / cache locate its folder
PIPELINE_BACKENDS = {"sd1": "sd1", "sd3": "sd35_medium", "flux": "flux_dev"}


@dataclass(frozen=True)
class FamilySize:
    """What a real pipeline kind weighs, for planning before any weights are loaded (``study --plan``)."""

    params: int  #: denoiser parameters (public architecture sizes)
    lora_params_per_rank: int | None  #: LoRA parameters per unit of rank on the adapter's targets; None: not known
    resolution: int  #: image side in pixels of the pipeline's default resolution


#: SD-1.x UNet 859.5M (LoRA on to_q/to_k/to_v/to_out.0, the sd1 adapter's targets: diffusers' rank-4 SD-1.5
#: LoRA has 797,184 = 4 x 199,296), SD3.5-Medium MMDiT transformer 2.24B, FLUX.1-dev transformer 11.9B
FAMILY_SIZES = {
    "sd1": FamilySize(859_520_964, 199_296, 512),
    "sd3": FamilySize(2_240_000_000, None, 1024),
    "flux": FamilySize(11_900_000_000, None, 1024),
}


def _sd1_backend(arg: str) -> str:
    """The SD-1.x backend an id names: sd14 / sd15 (their own variables), else any SD-1.x."""
    return "sd14" if "v1-4" in arg else "sd15" if "v1-5" in arg else "sd1"


def pipeline_location(kind: str, arg: str) -> str:
    """Where a real pipeline's weights are: ``arg`` itself when it is a directory or a hub id cached
    in the HF hub cache; else the folder the weights backend finds (its env var, e.g.
    ``PCPO_SD35_PATH`` / ``PCPO_FLUX_PATH`` / ``PCPO_SD15_PATH``, then ``$PCPO_WEIGHTS_DIR``).
    Raises :class:`~pcpo_eval.errors.MissingWeightsError` (one line: what, where looked, how) when absent."""
    from pathlib import Path

    from pcpo_eval.errors import MissingWeightsError
    from pcpo_eval.weights.locate import hf_snapshot_file, locate

    path = Path(arg).expanduser()
    if path.is_dir():
        return str(path)
    if arg.startswith(("/", ".", "~")):
        raise MissingWeightsError(f"{kind} weights: directory {arg} does not exist; pass an existing diffusers "
                                  "pipeline directory or a Hugging Face id already in the cache")
    if hf_snapshot_file(arg, "model_index.json") is not None:
        return arg
    backend = _sd1_backend(arg) if kind == "sd1" else PIPELINE_BACKENDS[kind]
    try:
        return str(locate(backend))
    except MissingWeightsError as exc:
        raise MissingWeightsError(f"{kind} weights {arg!r}: not in the HF cache, and {exc}") from None


def _sd1(arg: str | None, device: str | torch.device, dtype: torch.dtype) -> ModelAdapter:
    from pcpo_eval.models.sd1 import SD1Adapter

    if not arg:
        raise UserError("model spec 'sd1' needs a location: sd1:PATH_OR_HF_ID "
                        "(e.g. sd1:runwayml/stable-diffusion-v1-5 from the HF cache, or sd1:/models/sd15)")
    return SD1Adapter.from_pretrained(pipeline_location("sd1", arg), device=device, dtype=dtype)


def _toyflow(arg: str | None, device: str | torch.device, dtype: torch.dtype) -> ModelAdapter:
    from pcpo_eval.models.toy_flow import ToyFlowAdapter

    return ToyFlowAdapter.from_dir(arg or None, device=device, dtype=dtype)


def _sd3(arg: str | None, device: str | torch.device, dtype: torch.dtype) -> ModelAdapter:
    from pcpo_eval.models.sd3 import DEFAULT_SD3, SD3Adapter

    return SD3Adapter.from_pretrained(pipeline_location("sd3", arg or DEFAULT_SD3), device=device, dtype=dtype)


def _flux(arg: str | None, device: str | torch.device, dtype: torch.dtype) -> ModelAdapter:
    from pcpo_eval.models.flux import DEFAULT_FLUX, FluxAdapter

    return FluxAdapter.from_pretrained(pipeline_location("flux", arg or DEFAULT_FLUX), device=device, dtype=dtype)


#: kind -> factory(arg, device, dtype).
REGISTRY: dict[str, Factory] = {"toy": _toy, "sd1": _sd1, "toyflow": _toyflow, "sd3": _sd3, "flux": _flux}


def parse_spec(spec: str) -> tuple[str, str | None]:
    """``"toy"`` -> ("toy", None); ``"sd1:/x"`` -> ("sd1", "/x")."""
    kind, sep, arg = spec.partition(":")
    return kind.strip().lower(), (arg if sep else None)


#: kind -> "module:AdapterClass"; the class attribute ``prediction`` (eps | velocity) picks the sampler.
ADAPTER_CLASSES: dict[str, str] = {
    "toy": "pcpo_eval.models.toy:ToyAdapter", "sd1": "pcpo_eval.models.sd1:SD1Adapter",
    "toyflow": "pcpo_eval.models.toy_flow:ToyFlowAdapter", "sd3": "pcpo_eval.models.sd3:SD3Adapter",
    "flux": "pcpo_eval.models.flux:FluxAdapter",
}  # fmt: skip


def prediction_of(spec: str) -> str:
    """The prediction type (``eps`` | ``velocity``) of a model spec, from its adapter class (no weights loaded)."""
    kind, _ = parse_spec(spec)
    if kind not in ADAPTER_CLASSES:
        raise UserError(f"unknown model spec {spec!r}; valid kinds: {', '.join(sorted(REGISTRY))}")
    module, _, cls = ADAPTER_CLASSES[kind].partition(":")
    return str(getattr(importlib.import_module(module), cls).prediction)


def load_model(spec: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> ModelAdapter:
    """Load the adapter for ``spec`` (``toy``, ``toy:PATH``, ``sd1:PATH_OR_HF_ID``, ...)."""
    kind, arg = parse_spec(spec)
    if kind not in REGISTRY:
        raise UserError(f"unknown model spec {spec!r}; valid kinds: {', '.join(sorted(REGISTRY))} "
                        "(e.g. 'toy', 'toy:PATH', 'sd1:PATH_OR_HF_ID', 'toyflow', 'sd3:PATH_OR_HF_ID', 'flux:PATH_OR_HF_ID')")
    return REGISTRY[kind](arg, device, dtype)
