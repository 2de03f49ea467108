"""The toy flow-matching model's adapter (velocity prediction on the toy diffusion architecture).

Same world and parts as the toy diffusion model (:mod:`pcpo_eval.toy.model`), so the two toy
models differ only in what the network predicts:

* latents: the exact 4x4 space-to-depth view of the 3x32x32 image in [-1, 1] (48 x 8 x 8);
* denoiser: the toy ``UNet2DConditionModel`` (``toy_model.unet_config()``), LoRA targets as the
  toy adapter's; text: the toy tokenizer and text encoder, trained jointly;
* prediction: rectified-flow velocity ``u = noise - x_0`` for ``x_t = (1 - t) x_0 + t noise``
  (convention of :mod:`pcpo_eval.samplers.flow`); the UNet receives ``1000 t`` as its (float)
  timestep, like SD3's transformer;
* scheduler: a ``FlowMatchEulerDiscreteScheduler`` config with static ``shift = 1`` (32-px images;
  DanceGRPO's ``flow_shift`` applies on top on the ``shifted`` grid).

Pretraining and checks live in :mod:`pcpo_eval.toylab.flow`.
"""


from __future__ import annotations

from pathlib import Path
from typing import Any

import torch

from pcpo_eval.models.base import PromptEmbeds
from pcpo_eval.models.toy import ToyAdapter
from pcpo_eval.toy import model as toy_model

WEIGHTS_DIR = toy_model.WEIGHTS_DIR / "flow"
FIX = "run `pcpo-eval toy-flow pretrain` to rebuild the toy flow weights"


def flow_scheduler_config() -> dict[str, Any]:
    """diffusers ``FlowMatchEulerDiscreteScheduler`` config of the toy flow model."""
    return {"_class_name": "FlowMatchEulerDiscreteScheduler", "num_train_timesteps": 1000, "shift": 1.0,
            "use_dynamic_shifting": False}


class ToyFlowAdapter(ToyAdapter):
    """The toy UNet + text encoder as a velocity (flow-matching) :class:`ModelAdapter`."""

    name = "toyflow"
    prediction = "velocity"

    def __init__(self, unet: torch.nn.Module, text_encoder: Any, scheduler_config: dict[str, Any],
                 source: str = "toyflow", parameterization: str = "velocity") -> None:
        super().__init__(unet, text_encoder, {}, source=source)
        # ToyAdapter rewrites its scheduler config to eps prediction; the flow model keeps its own
        self.scheduler_config = dict(scheduler_config)
        if parameterization not in ("velocity", "sample"):
            from pcpo_eval.errors import UserError

            raise UserError(f"toy flow parameterization {parameterization!r} is not supported; "
                            "use velocity or sample in the weights' meta.json")
        #: what the raw UNet predicts: ``velocity`` (u = noise - x0) or ``sample`` (x0; the adapter
        #: returns u = (x_t - x0_hat) / t, exact for x_t = (1 - t) x0 + t noise)
        self.raw_prediction = parameterization

    @classmethod
    def from_dir(cls, weights_dir: str | Path | None = None, device: str | torch.device = "cpu",
                 dtype: torch.dtype = torch.float32) -> ToyFlowAdapter:
        """Load from a toy flow weights directory (default: the shipped ``weights/flow``)."""
        wd = Path(weights_dir) if weights_dir is not None else WEIGHTS_DIR
        if not (wd / "unet" / "config.json").is_file():
            from pcpo_eval.errors import MissingWeightsError

            raise MissingWeightsError(f"toy flow weights not found in {wd}; {FIX}")
        from diffusers.utils import logging as diffusers_logging

        level = diffusers_logging.get_verbosity()
        diffusers_logging.set_verbosity_error()  # its "modules ... kept in float32: []" note: a second stderr line
        try:
            unet = toy_model.load_unet(wd).to(device=device, dtype=dtype)
        finally:
            diffusers_logging.set_verbosity(level)
        enc = toy_model.load_text_encoder(wd).to(device=device, dtype=dtype)
        sched = toy_model.load_json(wd / "scheduler_config.json")
        meta = toy_model.load_json(wd / "meta.json") if (wd / "meta.json").is_file() else {}
        return cls(unet, enc, sched, source=str(wd), parameterization=meta.get("parameterization", "velocity"))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        """Velocity at continuous times ``t`` in [0, 1] (the UNet gets the float timestep 1000 t)."""
        if t.ndim == 0:
            t = t.expand(x_t.shape[0])
        timestep = 1000.0 * t.to(x_t.device, torch.float32)
        out = self.denoiser(x_t, timestep, encoder_hidden_states=cond.hidden, class_labels=cond.pooled).sample
        if self.raw_prediction == "velocity":
            return out
        # x0 prediction: u = (x_t - x0_hat) / t (samplers never evaluate t = 0)
        return (x_t - out) / t.to(out.device, out.dtype).clamp_min(1e-4).view(-1, 1, 1, 1)


def load_toy_flow(device: str | torch.device = "cpu", weights_dir: str | Path | None = None,
                  random_init: bool = False, seed: int = 0) -> ToyFlowAdapter:
    """The pretrained toy flow model; ``random_init=True`` builds fresh weights from ``seed`` (tests)."""
    if not random_init:
        return ToyFlowAdapter.from_dir(weights_dir, device=device)
    unet = toy_model.build_unet(seed=seed).eval()
    enc = toy_model.build_text_encoder(seed=seed + 1)
    return ToyFlowAdapter(unet.to(device), enc.to(device), flow_scheduler_config(), source="random")
