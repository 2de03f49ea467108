"""Common shell of the feature extractors: uint8 NCHW images in, (N, d) float features out.

Every extractor owns its resize and normalization (the place where FID libraries disagree), so the
metric code never touches pixels. Besides ``forward`` (features only) an extractor offers
``extract(images) -> {"features": (N, d), "logits": (N, K)?}`` so the Inception Score can reuse the
same forward pass, and ``settings()`` naming the weights file, its sha256 and the resize, which
are recorded with every metric value.
"""

from __future__ import annotations

from typing import Any

import numpy as np
import torch
from PIL import Image
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.io import parallel_map


class FeatureExtractor(nn.Module):
    """Base class: subclasses implement :meth:`extract` and fill :attr:`info`."""

    #: registry name ("inception", "dinov2", "toy")
    name: str = ""
    #: feature dimension d
    dim: int = 0

    def __init__(self) -> None:
        super().__init__()
        #: recorded with every metric value (weights file, sha256, resize, normalization)
        self.info: dict[str, Any] = {}

    def extract(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """Return ``{"features": (N, d) float32}`` plus ``"logits"`` (N, K) when available."""
        raise NotImplementedError

    @torch.no_grad()
    def forward(self, images: torch.Tensor) -> torch.Tensor:
        """(N, 3, H, W) uint8 -> (N, d) float32 features."""
        return self.extract(images)["features"]

    @property
    def has_logits(self) -> bool:
        """Whether :meth:`extract` also returns class logits (for the Inception Score)."""
        return False

    def settings(self) -> dict[str, Any]:
        """Everything that determines the features, for the metrics JSON and the cache key."""
        return {"extractor": self.name, "dim": self.dim, **self.info}


def check_uint8_images(images: torch.Tensor) -> None:
    """Validate the extractor input contract: uint8 tensor (N, 3, H, W)."""
    if not (
        torch.is_tensor(images) and images.dtype == torch.uint8 and images.dim() == 4 and images.shape[1] == 3
    ):
        shape = tuple(images.shape) if torch.is_tensor(images) else type(images).__name__
        dtype = images.dtype if torch.is_tensor(images) else "-"
        raise UserError(f"feature extractors take uint8 images of shape (N, 3, H, W); got {shape} {dtype}")


def clean_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """clean-fid's "clean" resize: PIL bicubic on each channel in float mode ('F'), clipped to [0, 255].

    Mirrors ``cleanfid.resize.make_resizer("PIL", quantize_after=False, "bicubic", (size, size))``
    (Parmar et al., "On Aliased Resizing and Surprising Subtleties in GAN Evaluation"): no
    quantization after resizing, antialiased PIL kernel. Returns float32 (N, 3, size, size) in
    [0, 255]. PIL returns an unchanged copy when the image already has the target size.
    """
    check_uint8_images(images)
    arr = images.permute(0, 2, 3, 1).cpu().numpy()
    out = np.empty((arr.shape[0], size, size, 3), dtype=np.float32)

    def one(i: int) -> None:  # PIL resamples with the GIL released: images in parallel threads
        for c in range(3):
            img = Image.fromarray(arr[i, :, :, c].astype(np.float32), mode="F")
            out[i, :, :, c] = np.asarray(img.resize((size, size), resample=Image.BICUBIC)).clip(0, 255)

    parallel_map(one, list(range(arr.shape[0])))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def pil_uint8_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision ``Resize((size, size), BICUBIC)`` on PIL RGB images (dgm-eval's default path).

    The PIL RGB resize works on 8-bit data and rounds to uint8, unlike :func:`clean_resize`.
    Returns uint8 (N, 3, size, size).
    """
    check_uint8_images(images)
    arr = images.permute(0, 2, 3, 1).cpu().numpy()
    out = np.empty((arr.shape[0], size, size, 3), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = np.asarray(Image.fromarray(arr[i], mode="RGB").resize((size, size), resample=Image.BICUBIC))

    parallel_map(one, list(range(arr.shape[0])))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
