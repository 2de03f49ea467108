"""Inception-v3 (2015-12-05 TF graph) features for FID and logits for IS, clean-fid conventions.

Pipeline (clean-fid ``mode="clean"``, the convention for reported FIDs):

1. clean resize: PIL bicubic per channel in float mode to 299x299, clipped to [0, 255]
   (:func:`pcpo_eval.features.base.clean_resize`);
2. normalize ``(x - 128) / 128``;
3. the TF Inception graph up to the 2048-d average pool -> FID features;
   ``logits_unbiased = pool @ fc.weight.T`` (torch-fidelity's IS input: fc without bias).

Two weight files are accepted, never downloaded:

- NVIDIA's TorchScript ``inception-2015-12-05.pt`` (what clean-fid loads; clean-fid caches it in
  ``/tmp``): preferred when present. We call its ``layers`` exactly as ``cleanfid.
  inception_torchscript.InceptionV3W`` does with ``resize_inside=False``; logits use
  ``output.weight`` (the StyleGAN2-ADA ``no_output_bias=True`` convention).
- the converted TF weights ``pt_inception-2015-12-05-6726825d.pth`` (pytorch-fid) /
  ``weights-inception-2015-12-05-6726825d.pth`` (torch-fidelity), loaded into torch-fidelity's
  TF-compatible architecture blocks (same state-dict keys as ``FeatureExtractorInceptionV3``).

torchvision's ImageNet Inception is a different network and is NOT accepted.
"""

from __future__ import annotations

import os
import zipfile
from pathlib import Path
from typing import Any

import torch
import torch.nn.functional as F
from torch import nn

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.features.base import (
    FeatureExtractor,
    check_uint8_images,
    clean_resize,
    resolve_resize,
    torch_clean_resize,
)
from pcpo_eval.io import sha256_file

#: environment variable naming the Inception weights file (.pt TorchScript or .pth state dict)
ENV_VAR = "PCPO_INCEPTION_WEIGHTS"
TORCHSCRIPT_NAME = "inception-2015-12-05.pt"
CONVERTED_NAMES = ("pt_inception-2015-12-05-6726825d.pth", "weights-inception-2015-12-05-6726825d.pth")
HOW_TO_GET = (
    f"download {TORCHSCRIPT_NAME} (https://nvlabs-fi-cdn.nvidia.com/stylegan2-ada-pytorch/pretrained/metrics/"
    f"{TORCHSCRIPT_NAME}) or {CONVERTED_NAMES[0]} (pytorch-fid release) on a connected machine and point "
    f"${ENV_VAR} at it"
)
INPUT_SIZE = 299


def locate_weights(weights_path: str | os.PathLike | None = None) -> Path:
    """Resolve the Inception weights file with :func:`pcpo_eval.weights.locate` (backend ``inception``).

    Order: explicit path > ``$PCPO_INCEPTION_WEIGHTS`` > ``$PCPO_WEIGHTS_DIR`` > torch hub cache
    (``weights-/pt_inception-2015-12-05-6726825d.pth``) > clean-fid's ``/tmp/inception-2015-12-05.pt``.
    """
    from pcpo_eval.weights.locate import locate

    return locate("inception", weights_path)


def is_torchscript(path: Path) -> bool:
    """TorchScript archives carry a ``code/`` folder; plain ``torch.save`` state dicts do not."""
    if not zipfile.is_zipfile(path):
        return False
    with zipfile.ZipFile(path) as zf:
        return any("/code/" in name for name in zf.namelist())


class TFInceptionTrunk(nn.Module):
    """The TF Inception-v3 graph built from torch-fidelity's TF-compatible blocks.

    Module names and parameter keys equal torch-fidelity's ``FeatureExtractorInceptionV3`` (and
    pytorch-fid's ``FIDInceptionV3``), so the converted ``...-6726825d.pth`` loads unchanged. The
    input is already resized and normalized; the output is the 2048-d pool and the 1008 unbiased
    logits.
    """

    def __init__(self) -> None:
        super().__init__()
        from torch_fidelity.feature_extractor_inceptionv3 import (
            BasicConv2d,
            InceptionA,
            InceptionB,
            InceptionC,
            InceptionD,
            InceptionE_1,
            InceptionE_2,
        )

        self.Conv2d_1a_3x3 = BasicConv2d(3, 32, kernel_size=3, stride=2)
        self.Conv2d_2a_3x3 = BasicConv2d(32, 32, kernel_size=3)
        self.Conv2d_2b_3x3 = BasicConv2d(32, 64, kernel_size=3, padding=1)
        self.MaxPool_1 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Conv2d_3b_1x1 = BasicConv2d(64, 80, kernel_size=1)
        self.Conv2d_4a_3x3 = BasicConv2d(80, 192, kernel_size=3)
        self.MaxPool_2 = nn.MaxPool2d(kernel_size=3, stride=2)
        self.Mixed_5b = InceptionA(192, pool_features=32)
        self.Mixed_5c = InceptionA(256, pool_features=64)
        self.Mixed_5d = InceptionA(288, pool_features=64)
        self.Mixed_6a = InceptionB(288)
        self.Mixed_6b = InceptionC(768, channels_7x7=128)
        self.Mixed_6c = InceptionC(768, channels_7x7=160)
        self.Mixed_6d = InceptionC(768, channels_7x7=160)
        self.Mixed_6e = InceptionC(768, channels_7x7=192)
        self.Mixed_7a = InceptionD(768)
        self.Mixed_7b = InceptionE_1(1280)
        self.Mixed_7c = InceptionE_2(2048)
        self.AvgPool = nn.AdaptiveAvgPool2d(output_size=(1, 1))
        self.fc = nn.Linear(2048, 1008)

    def forward(self, x: torch.Tensor) -> tuple[torch.Tensor, torch.Tensor]:
        """(N, 3, 299, 299) normalized -> (pool (N, 2048), logits_unbiased (N, 1008))."""
        for name in (
            "Conv2d_1a_3x3", "Conv2d_2a_3x3", "Conv2d_2b_3x3", "MaxPool_1", "Conv2d_3b_1x1",
            "Conv2d_4a_3x3", "MaxPool_2", "Mixed_5b", "Mixed_5c", "Mixed_5d", "Mixed_6a", "Mixed_6b",
            "Mixed_6c", "Mixed_6d", "Mixed_6e", "Mixed_7a", "Mixed_7b", "Mixed_7c", "AvgPool",
        ):  # fmt: skip
            x = getattr(self, name)(x)
        pool = torch.flatten(x, 1)
        return pool, pool.mm(self.fc.weight.T)


class InceptionExtractor(FeatureExtractor):
    """clean-fid Inception features (2048-d) and torch-fidelity ``logits_unbiased`` (1008)."""

    name = "inception"
    dim = 2048

    def __init__(
        self, weights_path: str | os.PathLike | None = None, device: str | torch.device = "cpu", resize: str = "auto"
    ) -> None:
        super().__init__()
        self.device = torch.device(device)
        self.resize = resolve_resize(resize, self.device)  # features.base.RESIZES
        path = locate_weights(weights_path)
        if is_torchscript(path):
            try:
                base = torch.jit.load(str(path), map_location="cpu").eval()
            except Exception as exc:  # noqa: BLE001 - a damaged archive raises many types
                raise MissingWeightsError(
                    f"{path} is not a loadable TorchScript file ({type(exc).__name__}); {HOW_TO_GET}"
                ) from None
            if not hasattr(base, "layers") or not hasattr(base, "output"):
                raise MissingWeightsError(
                    f"{path} is a TorchScript file without 'layers'/'output'; expected NVIDIA's {TORCHSCRIPT_NAME}"
                )
            self.base = base
            self.trunk = None
            fmt = "torchscript (NVIDIA, clean-fid)"
        else:
            try:
                state = torch.load(str(path), map_location="cpu", weights_only=True)
                self.trunk = TFInceptionTrunk()
                self.trunk.load_state_dict(state)
            except Exception as exc:  # noqa: BLE001 - torch.load raises many types for a file that is not a state dict
                raise MissingWeightsError(
                    f"{path} is not a converted TF Inception state dict ({type(exc).__name__}); {HOW_TO_GET}"
                ) from exc
            self.trunk.eval().requires_grad_(False)
            self.base = None
            fmt = "converted TF state dict (pytorch-fid / torch-fidelity)"
        self.to(self.device)
        self.info = {
            "weights_path": str(path),
            "weights_sha256": sha256_file(path),
            "weights_format": fmt,
            "resize": (f"clean-fid clean: PIL bicubic per channel in float mode to {INPUT_SIZE}x{INPUT_SIZE}"
                       if self.resize == "pil" else
                       f"clean-fid clean as torch bicubic antialias (a=-0.5) in float32 to {INPUT_SIZE}x{INPUT_SIZE} "
                       "(within 1e-2 grey levels of PIL's)"),
            "normalize": "(x - 128) / 128",
            "features": "2048-d average pool",
            "logits": "logits_unbiased (fc without bias, 1008 classes)",
        }

    @property
    def has_logits(self) -> bool:
        return True

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """uint8 (N, 3, H, W) -> {"features": (N, 2048), "logits": (N, 1008)}, float32."""
        check_uint8_images(images)
        if self.resize == "torch":
            return self.extract_prepared(torch_clean_resize(images, INPUT_SIZE, self.device))
        return self.extract_prepared(self.prepare(images))

    def prepare(self, images: torch.Tensor) -> torch.Tensor | None:
        """The host half of the ``pil`` resize (clean-fid's, float32 299 px); ``None`` for ``torch``,
        which resizes on the device."""
        if self.resize == "torch":
            return None
        check_uint8_images(images)
        return clean_resize(images, INPUT_SIZE)

    @torch.no_grad()
    def extract_prepared(self, prepared: torch.Tensor) -> dict[str, torch.Tensor]:
        """The network on float32 (N, 3, 299, 299) images in [0, 255] (clean-resized)."""
        x = (prepared.to(self.device) - 128) / 128
        if self.trunk is not None:
            pool, logits = self.trunk(x)
        else:
            pool = self.base.layers.forward(x).view(x.shape[0], 2048)
            logits = F.linear(pool, self.base.output.weight)
        return {"features": pool.float().cpu(), "logits": logits.float().cpu()}


def make_inception(**options: Any) -> InceptionExtractor:
    """Registry factory (options: ``weights_path``, ``device``, ``resize``)."""
    return InceptionExtractor(**options)
