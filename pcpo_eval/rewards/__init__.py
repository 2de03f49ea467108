"""Rewards and preference scores behind one registry, shared by the trainer and the metrics.

A reward is a callable ``fn(images, prompts) -> torch.Tensor`` of shape (B,) (float32, CPU), where
``images`` is a uint8 tensor (B, 3, H, W) and ``prompts`` a list of B strings, in the style of
ddpo-pytorch's ``rewards.py`` factories. Factories take keyword options (``device``, weight paths)
and load real models only from local files; a missing file raises
:class:`pcpo_eval.errors.MissingWeightsError` naming the file or variable to set.
"""

from __future__ import annotations

import importlib
from collections.abc import Callable
from typing import Any, Protocol

import torch

from pcpo_eval.errors import UserError


class RewardFn(Protocol):
    def __call__(self, images: torch.Tensor, prompts: list[str]) -> torch.Tensor: ...


#: name -> "module:factory"; factories are imported lazily so heavy deps load only when used.
REGISTRY: dict[str, str] = {
    # DDPO's JPEG rewards (kvablack/ddpo-pytorch rewards.py): size in kB at quality 95.
    "jpeg_compressibility": "pcpo_eval.rewards.jpeg:jpeg_compressibility",
    "jpeg_incompressibility": "pcpo_eval.rewards.jpeg:jpeg_incompressibility",
    # Toy-world rewards (pcpo_eval/toy): prompt alignment via the toy classifier, toy aesthetic.
    "toy_alignment": "pcpo_eval.rewards.toy:toy_alignment",
    "toy_aesthetic": "pcpo_eval.rewards.toy:toy_aesthetic",
    # Real preference models, loaded from local weights only.
    "aesthetic": "pcpo_eval.rewards.preference:laion_aesthetic",
    "hps": "pcpo_eval.rewards.preference:hpsv21",
    "hps_v20": "pcpo_eval.rewards.preference:hpsv20",
    "pickscore": "pcpo_eval.rewards.preference:pickscore",
    "imagereward": "pcpo_eval.rewards.preference:imagereward",
    "clipscore": "pcpo_eval.rewards.preference:clipscore",
    # DDPO's prompt-alignment reward (LLaVA answer + BERTScore recall) via a local LLaVA server.
    "llava_bertscore": "pcpo_eval.rewards.llava:llava_bertscore",
    # The same in process: a local VLM's caption + BERTScore (bert-score package), ddpo-pytorch conventions.
    "vlm_bertscore": "pcpo_eval.rewards.bertscore:vlm_bertscore",
    # Flow-GRPO's OCR reward (setup 8): 1 - capped edit distance of the quoted prompt text to OCR output.
    "ocr": "pcpo_eval.rewards.ocr:ocr",
}


def make_reward(name: str, **options: Any) -> RewardFn:
    """Build the reward ``name`` from :data:`REGISTRY` (options go to its factory)."""
    if name not in REGISTRY:
        raise UserError(f"unknown reward {name!r}; choose one of: {', '.join(sorted(REGISTRY))}")
    module_name, factory_name = REGISTRY[name].split(":")
    factory: Callable[..., RewardFn] = getattr(importlib.import_module(module_name), factory_name)
    return factory(**options)
