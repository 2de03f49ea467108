"""Procedural toy data: 45 prompts "<color> <shape>" (9 colors x 5 shapes).

Mirrors the paper's 45 ``simple_animals`` prompts (DDPO) with a world a CPU can learn. Each image
is a single filled shape of the prompt's color on a dim two-tone gradient background, at a random
position and size, anti-aliased by 4x supersampling. Every image is a pure function of
``(prompt_id, index)``: its generator is ``np.random.default_rng([SALT, prompt_id, index])``, so a
data set never depends on batch size, order or worker count.

Conventions: images are RGB uint8, channel-first ``(3, H, W)`` as torch tensors (the project's
image convention), ``IMAGE_SIZE`` = 32.
"""

from __future__ import annotations

import numpy as np
import torch

from pcpo_eval.errors import UserError

#: Name -> nominal RGB. Hues chosen to be far apart; each image jitters every channel by +-12.
COLORS: dict[str, tuple[int, int, int]] = {
    "red": (225, 35, 35),
    "orange": (245, 145, 20),
    "yellow": (240, 225, 40),
    "green": (40, 190, 45),
    "cyan": (40, 215, 225),
    "blue": (45, 70, 235),
    "purple": (135, 45, 205),
    "magenta": (230, 50, 200),
    "white": (240, 240, 240),
}
SHAPES: tuple[str, ...] = ("circle", "square", "triangle", "cross", "ring")
#: The 45 prompts; the class index of a prompt is its position here (color-major).
TOY_PROMPTS: tuple[str, ...] = tuple(f"{c} {s}" for c in COLORS for s in SHAPES)
PROMPT_TO_ID: dict[str, int] = {p: i for i, p in enumerate(TOY_PROMPTS)}
IMAGE_SIZE = 32
SALT = 20260  # fixed stream id of the procedural data
_SUPERSAMPLE = 4


def prompt_id(prompt: str) -> int:
    """Class index of a toy prompt (``"red circle"`` -> 0); UserError for anything else."""
    key = " ".join(prompt.lower().split())
    if key not in PROMPT_TO_ID:
        raise UserError(f"{prompt!r} is not a toy prompt; use '<color> <shape>' with colors "
                        f"{', '.join(COLORS)} and shapes {', '.join(SHAPES)}")
    return PROMPT_TO_ID[key]


def _shape_mask(shape: str, u: np.ndarray, v: np.ndarray) -> np.ndarray:
    """Boolean mask of ``shape`` in coordinates normalized by its radius (centre at 0, y down)."""
    if shape == "circle":
        return u * u + v * v <= 1.0
    if shape == "square":
        return (np.abs(u) <= 0.85) & (np.abs(v) <= 0.85)
    if shape == "triangle":  # apex up at v=-1, base at v=0.85
        return (v <= 0.85) & (np.abs(u) <= (v + 1.0) / 1.85 * 1.05)
    if shape == "cross":
        return ((np.abs(u) <= 0.32) & (np.abs(v) <= 1.0)) | ((np.abs(v) <= 0.32) & (np.abs(u) <= 1.0))
    if shape == "ring":
        r2 = u * u + v * v
        return (r2 <= 1.0) & (r2 >= 0.5**2)
    raise AssertionError(shape)


def render(pid: int, index: int, size: int = IMAGE_SIZE) -> np.ndarray:
    """Image ``index`` of prompt ``pid`` as uint8 (3, size, size); deterministic."""
    rng = np.random.default_rng([SALT, pid, index])
    color_name, shape = TOY_PROMPTS[pid].split()
    scale = size / IMAGE_SIZE
    radius = rng.uniform(6.0, 11.5) * scale
    margin = radius + 1.0 * scale
    cx, cy = rng.uniform(margin, size - margin, size=2)
    bg0, bg1 = rng.uniform(10, 75, size=(2, 3))
    fg = np.clip(np.asarray(COLORS[color_name], float) + rng.uniform(-12, 12, size=3), 0, 255)

    n = size * _SUPERSAMPLE
    coords = (np.arange(n) + 0.5) / _SUPERSAMPLE
    y, x = np.meshgrid(coords, coords, indexing="ij")
    cover = _shape_mask(shape, (x - cx) / radius, (y - cy) / radius).astype(np.float64)
    cover = cover.reshape(size, _SUPERSAMPLE, size, _SUPERSAMPLE).mean(axis=(1, 3))
    ramp = (np.arange(size) + 0.5)[:, None] / size  # vertical gradient, (size, 1)
    bg = bg0[:, None, None] + (bg1 - bg0)[:, None, None] * ramp[None]
    img = bg * (1.0 - cover[None]) + fg[:, None, None] * cover[None]
    return np.clip(np.rint(img), 0, 255).astype(np.uint8)


def render_batch(pids: list[int] | np.ndarray, indices: list[int] | np.ndarray,
                 size: int = IMAGE_SIZE) -> torch.Tensor:
    """Images for pairs ``(pids[i], indices[i])`` as a uint8 tensor (B, 3, size, size)."""
    out = np.stack([render(int(p), int(i), size) for p, i in zip(pids, indices, strict=True)])
    return torch.from_numpy(out)


def dataset(n_per_prompt: int, offset: int = 0, size: int = IMAGE_SIZE) -> tuple[torch.Tensor, torch.Tensor]:
    """All prompts x indices ``offset .. offset+n_per_prompt-1``: (uint8 images, int64 labels).

    Index ranges are the train/test split: pretraining uses offsets from 0, evaluation
    references (``toy check``'s fd_toy) use ``EVAL_OFFSET`` onwards.
    """
    pids = np.repeat(np.arange(len(TOY_PROMPTS)), n_per_prompt)
    idx = np.tile(np.arange(offset, offset + n_per_prompt), len(TOY_PROMPTS))
    return render_batch(pids, idx, size), torch.from_numpy(pids).long()


#: First data index reserved for evaluation (never used for training).
EVAL_OFFSET = 1_000_000
