"""Feature extractors behind one registry: uint8 NCHW images -> (N, d) float features.

=========== ============================================ =====================================
name        network / weights                            convention
=========== ============================================ =====================================
inception   TF Inception-v3 2015-12-05 (TorchScript or   clean-fid "clean" (FID); torch-fidelity
            converted state dict, local file)            ``logits_unbiased`` (IS)
dinov2      DINOv2 ViT-L/14 (local HF directory)         dgm-eval (FD-DINOv2)
toy         the toy-world classifier                     toy world (fd_toy, is_toy, lpips_toy)
=========== ============================================ =====================================

Add an extractor by writing one file with a factory and one entry in :data:`REGISTRY`.
"""

from __future__ import annotations

import importlib
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.features.base import FeatureExtractor

#: name -> "module:factory" (imported lazily: torch_fidelity / transformers load only when used)
REGISTRY: dict[str, str] = {
    "inception": "pcpo_eval.features.inception:make_inception",
    "dinov2": "pcpo_eval.features.dinov2:make_dinov2",
    "toy": "pcpo_eval.features.toy:make_toy",
}


def make_extractor(name: str, **options: Any) -> FeatureExtractor:
    """Build the extractor ``name`` (options such as ``weights_path``/``device`` go to its factory)."""
    if name not in REGISTRY:
        raise UserError(f"unknown feature extractor {name!r}; choose one of: {', '.join(sorted(REGISTRY))}")
    module_name, factory = REGISTRY[name].split(":")
    return getattr(importlib.import_module(module_name), factory)(**options)


__all__ = ["REGISTRY", "FeatureExtractor", "make_extractor"]
