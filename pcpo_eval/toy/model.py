"""The toy text-to-image diffusion model: architecture, configs and weight files.

Design (chosen to meet the CPU budget of issue 3, measured in ``benchmarks/bench_toy.py``):

* **Pixel space with a fixed 4x4 space-to-depth "VAE".** The 3x32x32 image in [-1, 1] is viewed as
  a 48x8x8 latent by ``pixel_unshuffle(., 4)``; ``decode`` is ``pixel_shuffle``. The map is an
  exact permutation of pixels, so Gaussian noise in latent space is Gaussian noise in pixel space
  and the model *is* a pixel-space DDPM; it only lets the UNet work at 8x8/4x4, which cuts the
  cost per image ~4-15x against a 32x32 UNet (a 1.4M-param 32x32 UNet cost ~530 MFLOP/img).
* **Denoiser**: a diffusers ``UNet2DConditionModel`` (so peft LoRA, ``add_adapter`` and
  diffusers' LoRA save/load work), widths (48, 64), one ResNet per level, GroupNorm(8).
  The first width must be >= the 48 latent channels: with 32 the UNet cannot even represent
  the identity x_t -> eps at high noise (a first try plateaued at eps-MSE 0.36 ~ 1 - 32/48).
  Text conditioning enters twice: the pooled text embedding is added to the time embedding
  (``class_embed_type="projection"``) and the token states are attended to by one
  cross-attention transformer in the mid block (lowest resolution, 4x4).
* **x0-prediction** (diffusers ``prediction_type="sample"``): the UNet predicts x0 and the adapter
  returns eps = (x_t - sqrt(ab) x0_hat) / sqrt(1 - ab), so samplers, objectives and credit math see
  an eps model. eps-prediction makes the UNet pass x_t through at high noise (eps ~ x_t) and
  v-prediction at low noise (v ~ eps); a 48-channel UNet did neither well (eps: samples were noise;
  v: samples kept grain, 0.69 class accuracy). x0 needs no pass-through (1.0 accuracy, docs/toy-world.md).
* **Scheduler**: diffusers ``DDIMScheduler`` config (prediction_type sample for the raw UNet;
  the adapter exposes it as epsilon), 1000 train steps, cosine
  ("squaredcos_cap_v2") betas (Nichol & Dhariwal: better than linear for small pixel images),
  ``leading`` spacing with ``steps_offset=1`` like SD, ``set_alpha_to_one=False``, no clipping.

Weight directory layout (``pcpo_eval/toy/weights`` is the shipped one)::

    unet/config.json, unet/diffusion_pytorch_model.safetensors   (diffusers save_pretrained)
    text_encoder_config.json, text_encoder.safetensors
    scheduler_config.json
    classifier_config.json, classifier.safetensors
    meta.json   (pretraining settings, wall time, seed)
"""

from __future__ import annotations

import json
from pathlib import Path
from typing import Any

import torch
from torch.nn import functional as F

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.toy.text import ToyTextConfig, ToyTextEncoder

WEIGHTS_DIR = Path(__file__).resolve().parent / "weights"
PATCH = 4
LATENT_SHAPE = (3 * PATCH * PATCH, 32 // PATCH, 32 // PATCH)
FIX = "run `pcpo-eval toy pretrain` to rebuild the toy weights"
#: what a toy weights folder holds: :func:`save_diffusion`'s files, the toy classifier's
#: (:func:`pcpo_eval.toy.classifier.save_classifier`) and the toy flow model's folder
WEIGHTS_ENTRIES = ("unet", "text_encoder.safetensors", "text_encoder_config.json", "scheduler_config.json", "meta.json",
                   "classifier.safetensors", "classifier_config.json", "flow")


def unet_config(widths: tuple[int, ...] = (48, 64), patch: int = PATCH) -> dict[str, Any]:
    """``UNet2DConditionModel`` kwargs of the toy denoiser (``patch``: space-to-depth factor)."""
    return dict(
        sample_size=32 // patch,
        in_channels=3 * patch * patch,
        out_channels=3 * patch * patch,
        block_out_channels=tuple(widths),
        layers_per_block=1,
        down_block_types=("DownBlock2D",) * len(widths),
        up_block_types=("UpBlock2D",) * len(widths),
        mid_block_type="UNetMidBlock2DCrossAttn",
        norm_num_groups=8,
        cross_attention_dim=ToyTextConfig.dim,
        attention_head_dim=16,
        class_embed_type="projection",
        projection_class_embeddings_input_dim=ToyTextConfig.dim,
    )


def scheduler_config(prediction_type: str = "sample") -> dict[str, Any]:
    """diffusers ``DDIMScheduler`` config of the toy model's raw UNet output (the adapter exposes eps)."""
    return dict(
        _class_name="DDIMScheduler",
        num_train_timesteps=1000,
        beta_schedule="squaredcos_cap_v2",
        beta_start=0.0001,
        beta_end=0.02,
        prediction_type=prediction_type,
        clip_sample=False,
        set_alpha_to_one=False,
        steps_offset=1,
        timestep_spacing="leading",
    )


def build_unet(seed: int | None = None, widths: tuple[int, ...] = (48, 64), patch: int = PATCH):
    """A randomly initialized toy UNet (``seed`` makes the init reproducible)."""
    from diffusers import UNet2DConditionModel

    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return UNet2DConditionModel(**unet_config(widths, patch))
    return UNet2DConditionModel(**unet_config(widths, patch))


def build_text_encoder(seed: int | None = None) -> ToyTextEncoder:
    """A randomly initialized toy text encoder."""
    if seed is not None:
        with torch.random.fork_rng(devices=[]):
            torch.manual_seed(seed)
            return ToyTextEncoder(ToyTextConfig())
    return ToyTextEncoder(ToyTextConfig())


def images_to_latents(images: torch.Tensor, patch: int = PATCH) -> torch.Tensor:
    """uint8 (B, 3, 32, 32) -> latents (B, 3 p^2, 32/p, 32/p) in [-1, 1] (exact space-to-depth)."""
    return F.pixel_unshuffle(images.float() / 127.5 - 1.0, patch)


def latents_to_images(latents: torch.Tensor) -> torch.Tensor:
    """Latents (B, 3 p^2, 32/p, 32/p) -> uint8 images (B, 3, 32, 32), rounded and clamped."""
    x = F.pixel_shuffle(latents.float(), round((latents.shape[1] // 3) ** 0.5))
    return ((x.clamp(-1, 1) + 1.0) * 127.5).round().to(torch.uint8)


# --------------------------------------------------------------------------------------- files
def _require(path: Path) -> Path:
    if not path.is_file():
        raise MissingWeightsError(f"toy weight file {path} is missing; {FIX}")
    return path


def load_safetensors(path: Path) -> dict[str, torch.Tensor]:
    """Read a safetensors file; missing/corrupt -> MissingWeightsError naming it and the fix."""
    from safetensors.torch import load_file

    _require(path)
    try:
        return load_file(str(path))
    except Exception as exc:  # safetensors raises SafetensorError/OSError on truncated files
        raise MissingWeightsError(f"toy weight file {path} is corrupt ({type(exc).__name__}); {FIX}") from exc


def load_json(path: Path) -> dict[str, Any]:
    """Read a JSON config; missing/corrupt -> MissingWeightsError."""
    _require(path)
    try:
        return json.loads(path.read_text())
    except (json.JSONDecodeError, UnicodeDecodeError) as exc:
        raise MissingWeightsError(f"toy config file {path} is corrupt ({exc.msg if hasattr(exc, 'msg') else exc}); {FIX}") from exc


def load_unet(weights_dir: Path):
    """The toy UNet from ``weights_dir/unet`` (config + safetensors), in eval mode."""
    from diffusers import UNet2DConditionModel

    cfg = load_json(weights_dir / "unet" / "config.json")
    cfg = {k: v for k, v in cfg.items() if not k.startswith("_")}
    unet = UNet2DConditionModel(**cfg)
    state = load_safetensors(weights_dir / "unet" / "diffusion_pytorch_model.safetensors")
    try:
        unet.load_state_dict(state)
    except RuntimeError as exc:
        raise MissingWeightsError(f"toy weight file {weights_dir / 'unet'} does not match its config; {FIX}") from exc
    return unet.eval()


def load_text_encoder(weights_dir: Path) -> ToyTextEncoder:
    """The toy text encoder from ``weights_dir``, in eval mode."""
    cfg = ToyTextConfig(**load_json(weights_dir / "text_encoder_config.json"))
    enc = ToyTextEncoder(cfg)
    state = load_safetensors(weights_dir / "text_encoder.safetensors")
    try:
        enc.load_state_dict(state)
    except RuntimeError as exc:
        raise MissingWeightsError(f"toy weight file {weights_dir / 'text_encoder.safetensors'} does not match its config; {FIX}") from exc
    return enc.eval()


def save_diffusion(weights_dir: Path, unet, text_encoder: ToyTextEncoder, meta: dict[str, Any],
                   prediction_type: str = "sample") -> None:
    """Write UNet, text encoder, scheduler config and meta into ``weights_dir`` (atomic files;
    byte-reproducible safetensors via :func:`pcpo_eval.io.safetensors_bytes`)."""
    from pcpo_eval.io import atomic_write_bytes, atomic_write_json, safetensors_bytes

    weights_dir = Path(weights_dir)
    state = {k: v.detach().contiguous().cpu() for k, v in unet.state_dict().items()}
    atomic_write_bytes(weights_dir / "unet" / "diffusion_pytorch_model.safetensors", safetensors_bytes(state))
    atomic_write_json(weights_dir / "unet" / "config.json", {"_class_name": "UNet2DConditionModel", **dict(unet.config)})
    tstate = {k: v.detach().contiguous().cpu() for k, v in text_encoder.state_dict().items()}
    atomic_write_bytes(weights_dir / "text_encoder.safetensors", safetensors_bytes(tstate))
    atomic_write_json(weights_dir / "text_encoder_config.json", text_encoder.config.to_dict())
    atomic_write_json(weights_dir / "scheduler_config.json", scheduler_config(prediction_type))
    atomic_write_json(weights_dir / "meta.json", meta)
