"""Common shell of the feature extractors: uint8 NCHW images in, (N, d) float features out.

Every extractor owns its resize and normalization (the place where FID libraries disagree), so the
metric code never touches pixels. Besides ``forward`` (features only) an extractor offers
``extract(images) -> {"features": (N, d), "logits": (N, K)?}`` so the Inception Score can reuse the
same forward pass, and ``settings()`` naming the weights file, its sha256 and the resize, which
are recorded with every metric value.

An extractor whose preprocessing runs on the host (PIL resizes) splits ``extract`` into
``prepare(images)`` (host work, run ahead on the decode thread by
:func:`pcpo_eval.metrics.extract.extract_sets`, so it overlaps the device's forward of the previous
batch) and ``extract_prepared(prepared)`` (the network); ``extract(x) == extract_prepared(prepare(x))``.
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

    def prepare(self, images: torch.Tensor) -> Any | None:
        """Host-side preprocessing of ``images`` that may run ahead on another thread, for
        :meth:`extract_prepared`; ``None`` when the extractor has none (then only :meth:`extract`)."""
        return None

    def extract_prepared(self, prepared: Any) -> dict[str, torch.Tensor]:
        """:meth:`extract` from what :meth:`prepare` returned."""
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


#: implementations of clean-fid's resize: ``pil`` (clean-fid's own, on the CPU) or ``torch`` (the same
#: antialiased bicubic kernel, a = -0.5, as ``F.interpolate(..., antialias=True)`` on the extractor's
#: device); ``auto`` is ``torch`` on CUDA and ``pil`` elsewhere.
RESIZES = ("auto", "pil", "torch")
#: bound on max |torch - pil| of :func:`clean_resize` in grey levels (float32 sums in another order).
#: Measured on white noise to 299 px: 0.0027 from 512 px, 0.0035 from 256, 0.0009 from 64, 0.0088 from
#: 300, 0 at 299 (tests/features/test_inception.py asserts the bound); far below FID's seed noise
TORCH_RESIZE_TOLERANCE = 1e-2


def resolve_resize(resize: str, device: torch.device) -> str:
    """``auto`` -> ``torch`` on CUDA, ``pil`` elsewhere; a UserError for an unknown name."""
    from pcpo_eval.errors import UserError

    if resize not in RESIZES:
        raise UserError(f"unknown resize {resize!r}; choose one of: {', '.join(RESIZES)}")
    if resize == "auto":
        return "torch" if device.type == "cuda" else "pil"
    return resize


def torch_clean_resize(images: torch.Tensor, size: int, device: torch.device | str = "cpu") -> torch.Tensor:
    """:func:`clean_resize` on ``device``: float32 bicubic with antialiasing (PIL's kernel, a = -0.5),
    clipped to [0, 255]. Agrees with the PIL path within :data:`TORCH_RESIZE_TOLERANCE` grey levels and
    moves the host's largest per-image cost onto the GPU (docs/gpu.md)."""
    import torch.nn.functional as F

    check_uint8_images(images)
    x = images.to(device, non_blocking=True).float()
    if tuple(x.shape[-2:]) == (size, size):
        return x  # PIL returns an unchanged copy at the target size
    return F.interpolate(x, size=(size, size), mode="bicubic", antialias=True, align_corners=False).clamp_(0, 255)


def pil_uint8_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """torchvision ``Resize((size, size), BICUBIC)`` on PIL RGB images (dgm-eval's default path).

    The PIL RGB resize works on 8-bit data and rounds to uint8, unlike :func:`clean_resize`.
    Returns uint8 (N, 3, size, size).
    """
    check_uint8_images(images)
    # a strided channel-last view: PIL's fromarray gathers each image in its worker thread (numpy's tobytes,
    # ~1.4 ms per 512-px image), in parallel; one contiguous torch copy up front instead was slower on
    # 2 cores (0.18 vs 0.13 s for 64 images, 1 or 2 torch threads; benchmarks/bench_metrics_consume.py)
    arr = images.cpu().permute(0, 2, 3, 1).numpy()
    out = np.empty((arr.shape[0], size, size, 3), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = np.asarray(Image.fromarray(arr[i]).resize((size, size), resample=Image.BICUBIC))

    parallel_map(one, list(range(arr.shape[0])))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()
