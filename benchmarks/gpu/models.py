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
from pathlib import Path
from typing import Any

import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pcpo_eval.io import scratch_dir  # noqa: E402

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
    from transformers import CLIPTextConfig, CLIPTextModel

    from pcpo_eval.testing import tiny_clip_tokenizer, tiny_sd1_components

    if tiny:
        parts = tiny_sd1_components(seed)
        for k in ("unet", "vae", "text_encoder"):
            parts[k] = parts[k].to(device, dtype)
        return parts
    torch.manual_seed(seed)
    with torch.device(device):
        unet = UNet2DConditionModel(**SD15_UNET)
        vae = AutoencoderKL(**SD15_VAE)
        tokenizer = tiny_clip_tokenizer()
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


#: Qwen/Qwen2.5-VL-3B-Instruct's config.json: the text model (3.09 B parameters with the vision tower:
#: 3.75 B) ...
QWEN25_VL_3B_TEXT = dict(
    vocab_size=151936, hidden_size=2048, intermediate_size=11008, num_hidden_layers=36, num_attention_heads=16,
    num_key_value_heads=2, max_position_embeddings=128000, rms_norm_eps=1e-6, tie_word_embeddings=True,
    rope_parameters={"rope_type": "default", "rope_theta": 1e6, "mrope_section": [16, 24, 24]},
)  # fmt: skip
#: ... its vision tower ...
QWEN25_VL_3B_VISION = dict(
    depth=32, hidden_size=1280, intermediate_size=3420, num_heads=16, out_hidden_size=2048, patch_size=14,
    spatial_merge_size=2, temporal_patch_size=2, window_size=112, fullatt_block_indexes=[7, 15, 23, 31],
    tokens_per_second=2, hidden_act="silu",
)  # fmt: skip
#: ... and its preprocessor_config.json's pixel bounds (a 512-px image: 504 x 504, 324 image tokens)
QWEN25_VL_PIXELS = (3136, 12845056)
#: microsoft/deberta-xlarge-mnli's config.json (bert-score keeps its first 40 of 48 layers)
DEBERTA_XLARGE_MNLI = dict(
    vocab_size=50265, hidden_size=1024, num_hidden_layers=48, num_attention_heads=16, intermediate_size=4096,
    max_position_embeddings=512, relative_attention=True, max_relative_positions=-1, pos_att_type=["c2p", "p2c"],
    position_biased_input=False, type_vocab_size=0, layer_norm_eps=1e-7,
)  # fmt: skip


def random_vlm_bertscore(captioner: str = "qwen25_vl", scorer: str = "deberta", component: str = "recall",
                         batch_size: int = 8, device: str = "cpu", captioner_dtype: str = "auto",
                         max_new_tokens: int = 64, tiny: bool = False):
    """Reward ``vlm_bertscore`` (setups 3-4) with random weights of the real sizes, as a ``module:function``
    reward for ``bench_train.py --reward vlm``: Qwen2.5-VL-3B-Instruct captions through
    :class:`~pcpo_eval.rewards.bertscore.VLMCaptioner` in the precision ``captioner_dtype`` resolves to (the
    checkpoint declares bf16), and DeBERTa-xlarge-MNLI's first 40 layers score through ``bert_score``
    in float32. Random weights rarely emit the end token, so captions run to ``max_new_tokens``: the
    reference's worst case. ``tiny``: the tests' tiny configurations (CPU, CI)."""
    from transformers import BertTokenizerFast, DebertaConfig, DebertaModel

    from pcpo_eval.precision import precision_dtype
    from pcpo_eval.rewards.bertscore import (
        SCORERS,
        BertScore,
        VLMBertScoreReward,
        VLMCaptioner,
        captioner_precision,
    )
    from pcpo_eval.testing import TINY_QWEN25_VL_TEXT, TINY_QWEN25_VL_VISION, qwen25_vl

    if (captioner, scorer) != ("qwen25_vl", "deberta"):
        raise ValueError("the benchmark reward builds the paper's captioner (qwen25_vl) and scorer (deberta)")
    prec = captioner_precision(captioner_dtype, device, "bf16")
    text, vision, pixels = ((TINY_QWEN25_VL_TEXT, TINY_QWEN25_VL_VISION, (56 * 56, 56 * 56)) if tiny
                            else (QWEN25_VL_3B_TEXT, QWEN25_VL_3B_VISION, QWEN25_VL_PIXELS))
    model, proc = qwen25_vl(text, vision, pixels, device=device, dtype=precision_dtype(prec))
    cap = VLMCaptioner(model, proc, max_new_tokens)
    folder = scratch_dir("bench_bertscore_")  # a word-level tokenizer (captions: unknown words)
    (folder / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", "the", "image", "contains"]))
    BertTokenizerFast(vocab_file=str(folder / "vocab.txt"), model_max_length=512).save_pretrained(folder)
    # bert_score loads the folder: it holds a tiny DeBERTa; at the real size the 3 GB of float32 weights are
    # built on the device and swapped in rather than written and read back
    small = dict(DEBERTA_XLARGE_MNLI, vocab_size=8, hidden_size=32, num_hidden_layers=2, num_attention_heads=2,
                 intermediate_size=64)
    DebertaModel(DebertaConfig(**small)).save_pretrained(folder)
    score = BertScore(str(folder), small["num_hidden_layers"], device=device)  # bert_score checks <= the folder's
    layers = small["num_hidden_layers"] if tiny else SCORERS["deberta"][1]
    if not tiny:
        with torch.device(device):  # the 40 layers bert_score.utils.get_model keeps (no transient 48 on the GPU)
            score.scorer._model = DebertaModel(DebertaConfig(**dict(DEBERTA_XLARGE_MNLI, num_hidden_layers=layers))).eval()
    settings = {"reward": "vlm_bertscore", "captioner": "qwen25_vl (random weights)", "captioner_dtype": prec,
                "scorer": "deberta (random weights)", "num_layers": layers, "component": component,
                "max_new_tokens": max_new_tokens}
    return VLMBertScoreReward(cap, score, component, batch_size, settings)
