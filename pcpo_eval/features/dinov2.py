"""DINOv2 ViT-L/14 features for FD-DINOv2 with dgm-eval's conventions (Stein et al., 2023).

dgm-eval's ``DINOv2Encoder`` (default ``clean_resize=False``):

1. ``torchvision.transforms.Resize((224, 224), BICUBIC)`` on the PIL RGB image, i.e. PIL's 8-bit
   bicubic resize (rounded to uint8; :func:`pcpo_eval.features.base.pil_uint8_resize`);
2. ``ToTensor`` (/255) and ImageNet mean/std normalization;
3. the CLS token after the final LayerNorm (hub ``x_norm_clstoken``; transformers'
   ``Dinov2Model`` ``pooler_output``), 1024-d for ViT-L/14, no L2 normalization.

Weights come from a local Hugging Face directory (``facebook/dinov2-large`` layout) loaded with
``local_files_only=True``; nothing is downloaded. The position embeddings (a 37 x 37 grid for 518 px)
are interpolated to the 16 x 16 patches of 224 px as dgm-eval's torch-hub model does
(:func:`hub_pos_encoding`: ``dinov2/models/vision_transformer.py``, ``interpolate_offset`` 0.1 given as a
scale factor, bicubic, no antialiasing), not as transformers' ``Dinov2Model`` does (``size=(16, 16)``):
the two map output patch 15 to source positions 35.34 and 35.12, a 4.2% difference of the interpolated
grid on a smooth stand-in and 0.44% of the CLS features of a tiny model (a review's script), so FD-DINOv2
values were not comparable with dgm-eval's.
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any

import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.features.base import FeatureExtractor, check_uint8_images, pil_uint8_resize
from pcpo_eval.io import sha256_file

ENV_VAR = "PCPO_DINOV2_PATH"
HF_REPO = "facebook/dinov2-large"
HOW_TO_GET = (
    f"run `hf download {HF_REPO}` on a connected machine and copy the snapshot into HF_HOME, "
    f"or point ${ENV_VAR} at the model directory"
)
INPUT_SIZE = 224
IMAGENET_MEAN = (0.485, 0.456, 0.406)
IMAGENET_STD = (0.229, 0.224, 0.225)


def locate_weights(weights_path: str | os.PathLike | None = None) -> Path:
    """Resolve the DINOv2 model folder with :func:`pcpo_eval.weights.locate` (backend ``dinov2``).

    Order: explicit path > ``$PCPO_DINOV2_PATH`` > ``$PCPO_WEIGHTS_DIR/dinov2-large`` > the HF hub
    cache snapshot of ``facebook/dinov2-large``.
    """
    from pcpo_eval.weights.locate import locate

    return locate("dinov2", weights_path)


def weights_digest(model_dir: Path) -> str:
    """sha256 of the weight files in ``model_dir`` (one file: its hash; several: hash of hashes)."""
    import hashlib

    files = sorted(p for p in model_dir.iterdir() if p.suffix in (".safetensors", ".bin"))
    if len(files) == 1:
        return sha256_file(files[0])
    h = hashlib.sha256()
    for p in files:
        h.update(f"{p.name}:{sha256_file(p)}\n".encode())
    return h.hexdigest()


#: dinov2's hub backbones' ``interpolate_offset`` (``dinov2/hub/backbones.py``), what dgm-eval loads
HUB_INTERPOLATE_OFFSET = 0.1


def hub_pos_encoding(position_embeddings: torch.Tensor, patch_size: int, height: int, width: int,
                     dtype: torch.dtype) -> torch.Tensor:
    """The position embeddings (1, 1 + M*M, dim) for a ``height`` x ``width`` input, as the torch-hub DINOv2
    interpolates them (``interpolate_pos_encoding``: in float32, ``scale_factor = ((h0 + 0.1) / M, (w0 + 0.1) / M)``
    with h0, w0 the patch counts, bicubic, ``antialias=False``; unchanged at M x M patches of a square input)."""
    n = position_embeddings.shape[1] - 1
    h0, w0 = height // patch_size, width // patch_size
    if h0 * w0 == n and height == width:
        return position_embeddings
    m = int(round(n**0.5))
    pos = position_embeddings.float()
    grid = pos[:, 1:].reshape(1, m, m, -1).permute(0, 3, 1, 2)
    scale = ((h0 + HUB_INTERPOLATE_OFFSET) / m, (w0 + HUB_INTERPOLATE_OFFSET) / m)
    grid = torch.nn.functional.interpolate(grid, scale_factor=scale, mode="bicubic", antialias=False)
    if grid.shape[-2:] != (h0, w0):
        raise ValueError(f"position grid {tuple(grid.shape[-2:])} for {h0}x{w0} patches")
    return torch.cat((pos[:, :1], grid.permute(0, 2, 3, 1).reshape(1, h0 * w0, -1)), dim=1).to(dtype)


def use_hub_pos_encoding(model: Any) -> None:
    """Make a transformers ``Dinov2Model`` interpolate its position embeddings as the hub model does."""
    emb = model.embeddings
    patch = int(model.config.patch_size)

    def interpolate(embeddings: torch.Tensor, height: int, width: int) -> torch.Tensor:
        return hub_pos_encoding(emb.position_embeddings, patch, height, width, embeddings.dtype)

    emb.interpolate_pos_encoding = interpolate


class DinoV2Extractor(FeatureExtractor):
    """dgm-eval DINOv2 features: PIL bicubic 224, ImageNet mean/std, final-LayerNorm CLS token."""

    name = "dinov2"

    def __init__(
        self, weights_path: str | os.PathLike | None = None, device: str | torch.device = "cpu"
    ) -> None:
        super().__init__()
        from transformers import Dinov2Model

        from pcpo_eval.weights.folders import check_model_folder

        path = locate_weights(weights_path)
        check_model_folder("DINOv2 weights", path)  # names config.json / the weights file if absent
        from safetensors import SafetensorError

        try:
            model = Dinov2Model.from_pretrained(str(path), local_files_only=True)
        except (OSError, ValueError, SafetensorError) as exc:  # a truncated model.safetensors: SafetensorError
            raise MissingWeightsError(
                f"cannot load DINOv2 from {path} ({type(exc).__name__}); {HOW_TO_GET}"
            ) from exc
        use_hub_pos_encoding(model)
        self.device = torch.device(device)
        self.model = model.eval().requires_grad_(False).to(self.device)
        self.dim = int(model.config.hidden_size)
        self.register_buffer("mean", torch.tensor(IMAGENET_MEAN).view(1, 3, 1, 1), persistent=False)
        self.register_buffer("std", torch.tensor(IMAGENET_STD).view(1, 3, 1, 1), persistent=False)
        self.to(self.device)
        self.info = {
            "weights_path": str(path),
            "weights_sha256": weights_digest(path),
            "model": "transformers Dinov2Model, position embeddings interpolated as the torch-hub model",
            "resize": f"dgm-eval: torchvision Resize(({INPUT_SIZE}, {INPUT_SIZE}), BICUBIC) on PIL RGB (uint8)",
            "normalize": "ToTensor (/255) then ImageNet mean/std",
            "features": "CLS token after final LayerNorm (pooler_output), no L2 normalization",
        }

    @torch.no_grad()
    def extract(self, images: torch.Tensor) -> dict[str, torch.Tensor]:
        """uint8 (N, 3, H, W) -> {"features": (N, hidden_size)} float32."""
        return self.extract_prepared(self.prepare(images))

    def prepare(self, images: torch.Tensor) -> torch.Tensor:
        """The host half: dgm-eval's PIL 8-bit bicubic resize to 224 (uint8, pinned for CUDA)."""
        check_uint8_images(images)
        x = pil_uint8_resize(images, INPUT_SIZE)
        return x.pin_memory() if self.device.type == "cuda" else x

    @torch.no_grad()
    def extract_prepared(self, prepared: torch.Tensor) -> dict[str, torch.Tensor]:
        """The device half: /255, ImageNet mean/std, the model's final-LayerNorm CLS token."""
        x = prepared.to(self.device, non_blocking=True).float() / 255.0
        x = (x - self.mean) / self.std
        out = self.model(pixel_values=x)
        return {"features": out.pooler_output.float().cpu()}


def make_dinov2(**options: Any) -> DinoV2Extractor:
    """Registry factory (options: ``weights_path``, ``device``)."""
    return DinoV2Extractor(**options)
