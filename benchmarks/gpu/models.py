"""Real-size architectures with random weights for the GPU benchmarks (nothing is downloaded).

``sd15_components(tiny=False)`` builds Stable Diffusion 1.5's UNet, VAE and CLIP ViT-L/14 text
encoder with the published configs and random weights (``tiny=True``: the test suite's tiny
configs, for the CPU mode CI runs). Throughput and memory depend on shapes, not on weight values,
so these give the real models' speed; the character-level tokenizer changes no tensor shape
(prompts are padded to 77 tokens either way).

``unet_flops_per_row`` counts one UNet row with ``torch.utils.flop_counter.FlopCounterMode``
(multiply-add = 2 FLOPs), the unit of the FLOP limits in docs/gpu.md.
"""

from __future__ import annotations

import os
import sys
import tempfile
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

#: SD-1.5's UNet2DConditionModel config (runwayml/stable-diffusion-v1-5 unet/config.json).
SD15_UNET = dict(
    sample_size=64, in_channels=4, out_channels=4, layers_per_block=2,
    block_out_channels=(320, 640, 1280, 1280), cross_attention_dim=768, attention_head_dim=8,
    down_block_types=("CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "CrossAttnDownBlock2D", "DownBlock2D"),
    up_block_types=("UpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D", "CrossAttnUpBlock2D"),
)  # fmt: skip
#: SD-1.5's AutoencoderKL config (vae/config.json).
SD15_VAE = dict(
    in_channels=3, out_channels=3, latent_channels=4, sample_size=512, layers_per_block=2,
    block_out_channels=(128, 256, 512, 512), down_block_types=("DownEncoderBlock2D",) * 4,
    up_block_types=("UpDecoderBlock2D",) * 4,
)  # fmt: skip
#: CLIP ViT-L/14's text tower (text_encoder/config.json).
SD15_TEXT = dict(
    hidden_size=768, intermediate_size=3072, num_attention_heads=12, num_hidden_layers=12,
    max_position_embeddings=77, vocab_size=49408, hidden_act="quick_gelu", projection_dim=768,
)  # fmt: skip


def sd15_components(tiny: bool, device: str, dtype: torch.dtype, seed: int = 0) -> dict[str, Any]:
    """UNet, VAE, text encoder, tokenizer and SD's DDIM scheduler; random weights on ``device``."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel, CLIPTokenizer

    from pcpo_eval.testing import tiny_sd1_components, write_tiny_clip_tokenizer

    if tiny:
        parts = tiny_sd1_components(seed)
        for k in ("unet", "vae", "text_encoder"):
            parts[k] = parts[k].to(device, dtype)
        return parts
    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel(**SD15_UNET)
        vae = AutoencoderKL(**SD15_VAE)
        tok_dir = write_tiny_clip_tokenizer(tempfile.mkdtemp(prefix="bench_clip_tok_"))
        tokenizer = CLIPTokenizer(str(tok_dir / "vocab.json"), str(tok_dir / "merges.txt"), model_max_length=77)
        text = CLIPTextModel(CLIPTextConfig(**SD15_TEXT, bos_token_id=0, eos_token_id=1, pad_token_id=1))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return {"unet": unet.to(dtype).eval(), "vae": vae.to(dtype).eval(), "text_encoder": text.to(dtype).eval(),
            "tokenizer": tokenizer, "scheduler": scheduler}


def sd15_pipeline(tiny: bool, device: str, dtype: torch.dtype, seed: int = 0):
    """A diffusers ``StableDiffusionPipeline`` of :func:`sd15_components` (no safety checker)."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(**sd15_components(tiny, device, dtype, seed), safety_checker=None,
                                   feature_extractor=None, requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def unet_flops_per_row(unet: torch.nn.Module, cross_dim: int) -> float:
    """FLOPs of one UNet row (one latent, one condition), counted by ``FlopCounterMode``."""
    from torch.utils.flop_counter import FlopCounterMode

    p = next(unet.parameters())
    c, s = unet.config.in_channels, unet.config.sample_size
    x = torch.zeros(1, c, s, s, device=p.device, dtype=p.dtype)
    h = torch.zeros(1, 77, cross_dim, device=p.device, dtype=p.dtype)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        unet(x, torch.tensor([500], device=p.device), encoder_hidden_states=h)
    return float(counter.get_total_flops())


def device_info() -> dict[str, Any]:
    """The device the numbers were measured on (name, memory, torch / CUDA versions, CPU count)."""
    info: dict[str, Any] = {"torch": torch.__version__, "cpus": os.cpu_count()}
    if torch.cuda.is_available():
        props = torch.cuda.get_device_properties(0)
        info.update(device=props.name, memory_gib=round(props.total_memory / 2**30, 1), cuda=torch.version.cuda)
    else:
        info["device"] = "cpu"
    return info


def sync(device: str) -> None:
    """Wait for queued GPU work (no-op on CPU), so wall-clock times are complete."""
    if torch.device(device).type == "cuda":
        torch.cuda.synchronize()


def peak_gib(device: str) -> float | None:
    """Peak allocated GPU memory since the last reset (GiB), None on CPU."""
    if torch.device(device).type != "cuda":
        return None
    return round(torch.cuda.max_memory_allocated() / 2**30, 2)


def reset_peak(device: str) -> None:
    if torch.device(device).type == "cuda":
        torch.cuda.empty_cache()
        torch.cuda.reset_peak_memory_stats()


def write_profile(prof: Any, wall_s: float, path: Path, title: str) -> dict[str, float]:
    """Append a ``torch.profiler`` run's tables to ``path`` (top ops by device time and by host time, with the
    device-busy fraction: kernel seconds over ``wall_s``); returns wall, kernel seconds and that fraction."""
    ka = prof.key_averages()
    dev_s = sum(getattr(k, "self_device_time_total", 0) for k in ka) / 1e6
    out = {"wall_s": wall_s, "kernel_s": dev_s, "busy_fraction": dev_s / wall_s}
    with open(path, "a") as fh:
        fh.write(f"== {title}: wall {wall_s:.2f} s, device kernels {dev_s:.2f} s, busy {out['busy_fraction']:.2f}\n")
        for key in ("self_device_time_total", "self_cpu_time_total"):
            fh.write(ka.table(sort_by=key, row_limit=18, max_name_column_width=60) + "\n")
    return out
