"""DDPO's JPEG rewards (kvablack/ddpo-pytorch ``rewards.py``).

``jpeg_incompressibility(image)`` = size in kB (bytes / 1000, DDPO's ``buffer.tell() / 1000``) of
the image saved by PIL as JPEG at quality 95; ``jpeg_compressibility`` is its negative.
Non-differentiable; prompts are ignored.
"""

from __future__ import annotations

import io

import numpy as np
import torch
from PIL import Image

from pcpo_eval.errors import UserError

JPEG_QUALITY = 95


def _check(images: torch.Tensor) -> None:
    if not (isinstance(images, torch.Tensor) and images.dtype == torch.uint8 and images.ndim == 4
            and images.shape[1] == 3):
        got = (getattr(images, "dtype", type(images)), tuple(getattr(images, "shape", ())))
        raise UserError(f"rewards take uint8 images (B, 3, H, W); got {got}")


def jpeg_bytes(image: np.ndarray, quality: int) -> bytes:
    """One (H, W, 3) uint8 image saved by PIL as JPEG at ``quality`` (what DDPO's rewards encode)."""
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(image)).save(buf, format="JPEG", quality=int(quality))
    return buf.getvalue()


def jpeg_size_kb(images: torch.Tensor, quality: int = JPEG_QUALITY) -> torch.Tensor:
    """JPEG (quality 95) file size in kB of each uint8 (B, 3, H, W) image -> float32 (B,)."""
    _check(images)
    arr = images.detach().cpu().permute(0, 2, 3, 1).numpy()
    return torch.tensor([len(jpeg_bytes(img, quality)) / 1000.0 for img in arr], dtype=torch.float32)


def jpeg_round_trip(images: torch.Tensor, quality: int) -> torch.Tensor:
    """uint8 (B, 3, H, W) images as a receiver of their JPEG at ``quality`` sees them: encoded and decoded
    by PIL (ddpo-pytorch's ``llava_bertscore`` sends quality-80 JPEGs, which LLaVA-server opens with PIL)."""
    _check(images)
    arr = images.detach().cpu().permute(0, 2, 3, 1).numpy()
    out = [jpeg_decode(jpeg_bytes(img, quality)) for img in arr]
    return torch.from_numpy(np.stack(out)).permute(0, 3, 1, 2).contiguous()


def jpeg_decode(data: bytes) -> np.ndarray:
    """JPEG bytes as PIL decodes them (LLaVA-server: ``Image.open(BytesIO(d), formats=["jpeg"])``), (H, W, 3) uint8."""
    return np.asarray(Image.open(io.BytesIO(data), formats=["jpeg"]).convert("RGB"))


def jpeg_incompressibility():
    """Reward factory: JPEG size in kB (larger = less compressible)."""

    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return jpeg_size_kb(images)

    return fn


def jpeg_compressibility():
    """Reward factory: minus the JPEG size in kB (larger = more compressible)."""

    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return -jpeg_size_kb(images)

    return fn
