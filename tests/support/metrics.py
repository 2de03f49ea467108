"""Test helpers for the metric workers: image sets in the contract layout and a toy stand-in.

Not a test module. ``make_image_set`` writes PNGs and ``manifest.parquet`` exactly as the
generator's contract says (``SET/images/p{prompt_id:05d}/s{seed:07d}.png``), so the metrics can be
tested before the generator exists. ``StandInToyClassifier`` has the toy classifier's interface
(uint8 NCHW -> {"features", "logits", "layers"}) with deterministic random weights.
"""

from __future__ import annotations

import hashlib
import io
import json
from collections.abc import Callable
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image
from torch import nn


def default_image(prompt_id: int, seed: int, size: int = 32) -> np.ndarray:
    """A (size, size, 3) uint8 image whose colour depends on the prompt and texture on the seed."""
    rng = np.random.default_rng(prompt_id * 100_003 + seed)
    base = np.array(
        [(prompt_id * 53) % 256, (prompt_id * 97) % 256, (prompt_id * 29) % 256], dtype=np.float64
    )
    img = base + rng.normal(0, 40, size=(size, size, 3))
    return np.clip(img, 0, 255).astype(np.uint8)


def make_image_set(
    root: Path,
    prompts: dict[int, str],
    seeds: list[int],
    size: int = 32,
    image_fn: Callable[[int, int, int], np.ndarray] = default_image,
    model: str = "toy-test",
) -> Path:
    """Write an image set in the generator's contract layout; returns ``root``."""
    root.mkdir(parents=True, exist_ok=True)
    rows = []
    for pid, prompt in prompts.items():
        for seed in seeds:
            rel = f"images/p{pid:05d}/s{seed:07d}.png"
            path = root / rel
            path.parent.mkdir(parents=True, exist_ok=True)
            buf = io.BytesIO()
            Image.fromarray(image_fn(pid, seed, size)).save(buf, format="PNG")
            path.write_bytes(buf.getvalue())
            rows.append(
                {
                    "prompt_id": pid,
                    "prompt": prompt,
                    "seed": seed,
                    "path": rel,
                    "image_sha256": hashlib.sha256(buf.getvalue()).hexdigest(),
                    "model": model,
                    "model_hash": "0" * 64,
                    "num_steps": 10,
                }
            )
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    (root / "set.json").write_text(json.dumps({"model": model, "size": size}))
    return root


def rewrite_image(
    root: Path, row: int, arr_or_bytes: np.ndarray | bytes, mode: str | None = None, update_sha: bool = True
) -> None:
    """Replace one image of a set (optionally keeping the manifest hash stale)."""
    df = pd.read_parquet(root / "manifest.parquet")
    path = root / df.loc[row, "path"]
    if isinstance(arr_or_bytes, bytes):
        data = arr_or_bytes
    else:
        buf = io.BytesIO()
        img = Image.fromarray(arr_or_bytes) if mode is None else Image.fromarray(arr_or_bytes, mode=mode)
        img.save(buf, format="PNG")
        data = buf.getvalue()
    path.write_bytes(data)
    if update_sha:
        df.loc[row, "image_sha256"] = hashlib.sha256(data).hexdigest()
        df.to_parquet(root / "manifest.parquet", index=False)


class StandInToyClassifier(nn.Module):
    """Same interface as ``pcpo_eval.toy.classifier.load_toy_classifier()``; random weights from ``seed``."""

    def __init__(self, seed: int = 0, n_classes: int = 45, size: int = 32) -> None:
        super().__init__()
        gen = torch.Generator().manual_seed(seed)
        self.size = size
        self.conv1 = nn.Conv2d(3, 8, 3, padding=1)
        self.conv2 = nn.Conv2d(8, 16, 3, stride=2, padding=1)
        self.fc = nn.Linear(16, 12)
        self.head = nn.Linear(12, n_classes)
        with torch.no_grad():
            for p in self.parameters():
                p.copy_(torch.randn(p.shape, generator=gen) * 0.3)
        self.eval()

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        x = images.float() / 255.0
        if x.shape[-1] != self.size or x.shape[-2] != self.size:
            x = nn.functional.interpolate(
                x, size=(self.size, self.size), mode="bilinear", align_corners=False
            )
        a1 = torch.relu(self.conv1(x))
        a2 = torch.relu(self.conv2(a1))
        feats = torch.tanh(self.fc(a2.mean(dim=(2, 3))))
        return {"features": feats, "logits": self.head(feats) * 3.0, "layers": [a1, a2]}


TOY_PROMPTS = {0: "red circle", 1: "blue square", 2: "green triangle"}


class SlowStandInToyClassifier(StandInToyClassifier):
    """The stand-in with a pause per call (so a test can SIGKILL a run mid-way); same weights/hash."""

    def __init__(self, seed: int = 0, pause: float = 0.3) -> None:
        super().__init__(seed)
        self.pause = pause

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        import time

        time.sleep(self.pause)
        return super().forward(images)


def fake_reward(**options: object) -> Callable[[torch.Tensor, list[str]], torch.Tensor]:
    """A reward with the shared signature: mean brightness plus prompt length / 100."""

    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return images.float().mean(dim=(1, 2, 3)) / 255.0 + torch.tensor([len(p) / 100 for p in prompts])

    return fn


def file_reward(weights: str, **options: object) -> Callable[[torch.Tensor, list[str]], torch.Tensor]:
    """A reward whose "weights" file holds the score of every image; records the path the way the
    preference rewards do (``settings["weights"]``), not the file's content."""
    value = float(Path(weights).read_text())

    def fn(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
        return torch.full((images.shape[0],), value)

    fn.settings = {"model": "file reward", "weights": str(weights)}  # type: ignore[attr-defined]
    return fn
