"""Toy-world features (``fd_toy``), logits (``is_toy``) and layers (``lpips_toy``).

Wraps ``pcpo_eval.toy.classifier.load_toy_classifier()``: its ``forward(uint8 NCHW)`` returns
``{"features": (N, d), "logits": (N, 45), "layers": [(N, C_l, H_l, W_l), ...]}`` and resizes
internally. The weights hash is the sha256 of the state dict (names, dtypes, shapes, bytes), so it
identifies the network whatever file it was loaded from.
"""

from __future__ import annotations

import hashlib
from pathlib import Path
from typing import Any

import torch
from torch import nn

from pcpo_eval.features.base import FeatureExtractor, check_uint8_images


def state_dict_sha256(module: nn.Module) -> str:
    """Deterministic sha256 of a module's state dict."""
    h = hashlib.sha256()
    for key, value in sorted(module.state_dict().items()):
        t = value.detach().cpu().reshape(-1).contiguous()  # 1-d: 0-dim buffers cannot be viewed as bytes
        h.update(f"{key}:{value.dtype}:{tuple(value.shape)}\n".encode())
        h.update(t.view(torch.uint8).numpy().tobytes() if t.numel() else b"")
    return h.hexdigest()


class ToyExtractor(FeatureExtractor):
    """Toy classifier penultimate features, 45-way logits and intermediate layers."""

    name = "toy"

    def __init__(self, classifier: nn.Module | None = None, device: str | torch.device = "cpu") -> None:
        super().__init__()
        if classifier is None:
            from pcpo_eval.toy.classifier import load_toy_classifier

            classifier = load_toy_classifier(device=str(device))
        self.device = torch.device(device)
        self.classifier = classifier.eval().requires_grad_(False).to(self.device)
        probe = self.classifier(torch.zeros(1, 3, 32, 32, dtype=torch.uint8, device=self.device))
        self.dim = int(probe["features"].shape[1])
        self.info = {
            "weights_sha256": state_dict_sha256(self.classifier),
            "resize": "inside the toy classifier",
            "features": "toy classifier penultimate features",
            "logits": "toy classifier logits over the 45 toy prompts",
        }

    @property
    def has_logits(self) -> bool:
        return True

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """uint8 (N, 3, H, W) -> {"features": (N, d), "logits": (N, 45)} float32."""
        check_uint8_images(images)
        out = self.classifier(images.to(self.device))
        return {"features": out["features"].float().cpu(), "logits": out["logits"].float().cpu()}

    @torch.no_grad()
    def layers(self, images: torch.Tensor) -> list[torch.Tensor]:
        """Intermediate activations (for ``lpips_toy``)."""
        check_uint8_images(images)
        return [t.float() for t in self.classifier(images.to(self.device))["layers"]]


def make_toy(weights_path: str | Path | None = None, **options: Any) -> ToyExtractor:
    """Registry factory (options: ``classifier`` (a stand-in module), ``device``; ``weights_path``: a toy
    weights folder with ``classifier.safetensors`` + ``classifier_config.json``, default the shipped one)."""
    if weights_path is not None and options.get("classifier") is None:
        from pcpo_eval.errors import UserError
        from pcpo_eval.toy.classifier import load_classifier

        wd = Path(weights_path)
        if not (wd / "classifier_config.json").is_file() or not (wd / "classifier.safetensors").is_file():
            raise UserError(f"toy weights: {wd} is not a folder with classifier.safetensors and "
                            "classifier_config.json; pass such a folder (e.g. one written by `pcpo-eval toy pretrain`) "
                            "or leave --weights out for the shipped classifier")
        options["classifier"] = load_classifier(wd, options.get("device", "cpu"))
    return ToyExtractor(**options)
