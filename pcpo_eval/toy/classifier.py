"""The toy classifier: the toy world's feature network (``fd_toy``, ``is_toy``, ``lpips_toy``).

A small CNN (conv-BN-ReLU, ~75k parameters) over the 45 toy classes (color x shape, :data:`pcpo_eval.toy.data.TOY_PROMPTS`
order), trained on procedural data only. ``forward(images_uint8_nchw)`` returns a dict

* ``"features"``: (N, 128) penultimate features (for the toy Frechet distance, ``fd_toy``),
* ``"logits"``:   (N, 45) class logits (softmax for ``is_toy``, the alignment reward),
* ``"layers"``:   [(N, 16, 32, 32), (N, 32, 16, 16), (N, 64, 8, 8)] ReLU activations of the
  three stages (for the LPIPS-style ``lpips_toy``: unit-normalize channels, squared diff, mean).

Inputs of another size are resized to 32x32 with antialiased bilinear interpolation first.
The numbers it produces are *toy* numbers and must never be reported as Inception/DINOv2/LPIPS.
"""

from __future__ import annotations

from dataclasses import asdict, dataclass
from pathlib import Path

import torch
from torch import nn
from torch.nn import functional as F

from pcpo_eval.toy.data import IMAGE_SIZE, TOY_PROMPTS


@dataclass(frozen=True)
class ClassifierConfig:
    """Architecture of :class:`ToyClassifier` (saved as ``classifier_config.json``)."""

    widths: tuple[int, int, int] = (16, 32, 64)
    feature_dim: int = 128
    num_classes: int = len(TOY_PROMPTS)
    image_size: int = IMAGE_SIZE

    def to_dict(self) -> dict:
        return asdict(self)


def _conv(c_in: int, c_out: int) -> list[nn.Module]:
    return [nn.Conv2d(c_in, c_out, 3, padding=1), nn.BatchNorm2d(c_out), nn.ReLU()]


class ToyClassifier(nn.Module):
    """conv-BN-ReLU stages at 32x32 -> 16x16 -> 8x8, [avg, max] global pooling, 128-d features.

    Max pooling next to average pooling makes "is there a corner / a hole anywhere" cheap to
    express; with average pooling alone and no normalization the net learned shapes ~10x slower.
    """

    def __init__(self, config: ClassifierConfig = ClassifierConfig()) -> None:
        super().__init__()
        self.config = config
        w1, w2, w3 = config.widths
        self.stage1 = nn.Sequential(*_conv(3, w1))
        self.stage2 = nn.Sequential(nn.MaxPool2d(2), *_conv(w1, w2), *_conv(w2, w2))
        self.stage3 = nn.Sequential(nn.MaxPool2d(2), *_conv(w2, w3), *_conv(w3, w3))
        self.fc = nn.Sequential(nn.Linear(2 * w3, config.feature_dim), nn.ReLU())
        self.head = nn.Linear(config.feature_dim, config.num_classes)

    def preprocess(self, images: torch.Tensor) -> torch.Tensor:
        """uint8 (N, 3, H, W) -> float in [-1, 1] at the classifier's size, on its device."""
        p = next(self.parameters())
        x = images.to(p.device).float() / 127.5 - 1.0
        s = self.config.image_size
        if x.shape[-2:] != (s, s):
            x = F.interpolate(x, size=(s, s), mode="bilinear", antialias=True, align_corners=False)
        return x.to(p.dtype)

    def forward_float(self, x: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        """Same as :meth:`forward` for already preprocessed float input in [-1, 1]."""
        l1 = self.stage1(x)
        l2 = self.stage2(l1)
        l3 = self.stage3(l2)
        feats = self.fc(torch.cat([l3.mean(dim=(2, 3)), l3.amax(dim=(2, 3))], dim=1))
        return {"features": feats, "logits": self.head(feats), "layers": [l1, l2, l3]}

    def forward(self, images: torch.Tensor) -> dict[str, torch.Tensor | list[torch.Tensor]]:
        return self.forward_float(self.preprocess(images))


def load_classifier(weights_dir: str | Path | None = None, device: str | torch.device = "cpu") -> ToyClassifier:
    """The trained toy classifier from ``weights_dir`` (default: shipped weights), eval mode."""
    from pcpo_eval.toy import model as toy_model

    wd = Path(weights_dir) if weights_dir is not None else toy_model.WEIGHTS_DIR
    raw = toy_model.load_json(wd / "classifier_config.json")
    cfg = ClassifierConfig(**{k: tuple(v) if isinstance(v, list) else v for k, v in raw.items()})
    net = ToyClassifier(cfg)
    state = toy_model.load_safetensors(wd / "classifier.safetensors")
    try:
        net.load_state_dict(state)
    except RuntimeError as exc:
        from pcpo_eval.errors import MissingWeightsError

        raise MissingWeightsError(f"toy weight file {wd / 'classifier.safetensors'} does not match its config; "
                                  f"{toy_model.FIX}") from exc
    return net.eval().requires_grad_(False).to(device)


def load_toy_classifier(device: str | torch.device = "cpu") -> ToyClassifier:
    """The shipped toy classifier (shared contract: eval mode, dict output; see module doc)."""
    return load_classifier(None, device)


def save_classifier(weights_dir: str | Path, net: ToyClassifier) -> None:
    """Write ``classifier.safetensors`` (byte-reproducible) + ``classifier_config.json`` atomically."""
    from pcpo_eval.io import atomic_write_bytes, atomic_write_json, safetensors_bytes

    wd = Path(weights_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in net.state_dict().items()}
    atomic_write_bytes(wd / "classifier.safetensors", safetensors_bytes(state))
    atomic_write_json(wd / "classifier_config.json", net.config.to_dict())
