"""Toy-world rewards.

``toy_alignment`` (prompt alignment): the toy classifier's softmax probability of the prompt's
class, ``p(y = prompt | image)`` in [0, 1] -- the toy analogue of a CLIP/VQA alignment score.
Prompts must be toy prompts ("<color> <shape>"); others raise :class:`UserError`.

``toy_aesthetic`` (aesthetic-like, prompt-independent, our design): the Hasler & Suesstrunk (2003)
*colorfulness* of the image divided by 100::

    rg = R - G,  yb = (R + G) / 2 - B                  (per pixel, R, G, B in 0..255)
    M  = sqrt(std(rg)^2 + std(yb)^2) + 0.3 * sqrt(mean(rg)^2 + mean(yb)^2)
    r  = M / 100

It is a published perceptual statistic that, like the LAION aesthetic predictor, prefers vivid,
saturated, high-contrast pictures regardless of the prompt. It is hackable in the same way
(larger, more saturated objects, color drift away from the prompt, e.g. white shapes score low):
pair it with ``toy_alignment`` to watch the trade-off. Typical values on the procedural data are
~0.3-1.2 (see docs/toy-world.md).
"""

from __future__ import annotations

import torch

from pcpo_eval.rewards.jpeg import _check


def colorfulness(images: torch.Tensor) -> torch.Tensor:
    """Hasler & Suesstrunk (2003) colorfulness M of uint8 (B, 3, H, W) images -> float32 (B,)."""
    _check(images)
    x = images.detach().cpu().double()
    r, g, b = x[:, 0], x[:, 1], x[:, 2]
    rg = (r - g).flatten(1)
    yb = (0.5 * (r + g) - b).flatten(1)
    std = torch.sqrt(rg.var(dim=1, unbiased=False) + yb.var(dim=1, unbiased=False))
    mean = torch.sqrt(rg.mean(dim=1) ** 2 + yb.mean(dim=1) ** 2)
    return (std + 0.3 * mean).float()


def toy_aesthetic():
    """Reward factory: colorfulness / 100 (see module doc)."""

    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return colorfulness(images) / 100.0

    return fn


def toy_alignment(device: str | torch.device = "cpu", weights_dir: str | None = None, classifier=None):
    """Reward factory: toy classifier probability of each prompt's class.

    ``classifier`` (an ``nn.Module`` with the toy classifier's dict output) overrides the shipped
    weights, e.g. a tiny random one in tests.
    """
    from pcpo_eval.toy.classifier import load_classifier
    from pcpo_eval.toy.data import prompt_id

    net = classifier if classifier is not None else load_classifier(weights_dir, device)

    @torch.no_grad()
    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        _check(images)
        if len(prompts) != images.shape[0]:
            raise ValueError(f"{images.shape[0]} images but {len(prompts)} prompts")
        labels = torch.tensor([prompt_id(p) for p in prompts])
        probs = net(images)["logits"].float().softmax(dim=1).cpu()
        return probs[torch.arange(len(prompts)), labels].float()

    return fn
