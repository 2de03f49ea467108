"""Stable Diffusion 3 / 3.5 adapter (diffusers ``StableDiffusion3Pipeline``, ``SD3Transformer2DModel``).

Flow matching with velocity prediction (``prediction = "velocity"``): the transformer takes the
model time as ``1000 t`` (diffusers' ``FlowMatchEulerDiscreteScheduler.timesteps``); our samplers
pass the continuous time t in [0, 1] (see :mod:`pcpo_eval.samplers.flow`). Prompts are encoded
with the pipeline's own ``encode_prompt`` (CLIP-L + CLIP-G hidden states concatenated and padded
to the T5 width, then T5 tokens appended; pooled = CLIP-L and CLIP-G pooled projections), so
conditioning is exactly what the pipeline feeds its transformer. Latents are decoded as the
pipeline does: ``vae.decode(latents / scaling_factor + shift_factor)``.

Weights load only from local files (a directory or the Hugging Face cache,
``local_files_only=True``); :func:`tiny_sd3_pipeline` builds a randomly initialized miniature from
configs (tokenizers written to a temporary directory) for tests.
"""

from __future__ import annotations

import contextlib
import json
import string
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds

#: Flow-GRPO's SD3 LoRA targets (joint-attention projections of every MMDiT block).
SD3_LORA_TARGETS: list[str] = [
    "attn.add_k_proj", "attn.add_q_proj", "attn.add_v_proj", "attn.to_add_out",
    "attn.to_k", "attn.to_out.0", "attn.to_q", "attn.to_v",
]
DEFAULT_SD3 = "stabilityai/stable-diffusion-3.5-medium"
#: T5 tokens per prompt: Flow-GRPO's (``train_sd3.py`` samples, trains and evaluates with ``max_sequence_length=128``),
#: the one reference for SD3 here (setups 8-9); diffusers' pipeline default is 256, which made every prompt
#: 77 + 256 tokens instead of 77 + 128 and shifted every sample and reward of those setups
SD3_MAX_SEQUENCE_LENGTH = 128


def _to_uint8(images: torch.Tensor) -> torch.Tensor:
    """VAE output in [-1, 1] -> uint8 (B, 3, H, W), as diffusers' ``VaeImageProcessor`` (round, clamp)."""
    return ((images.float() / 2 + 0.5).clamp(0, 1) * 255).round().to(torch.uint8)


def load_local_pipeline(cls: Any, spec: str, dtype: torch.dtype, what: str) -> Any:
    """``cls.from_pretrained(spec, local_files_only=True)`` with a one-line error when absent.

    A local folder (or cached snapshot) missing a sub-folder or file is named first (``transformer/``,
    ``vae/config.json``, ...)."""
    from pcpo_eval.weights.folders import check_pipeline_folder, resolve_pipeline_dir

    local = resolve_pipeline_dir(spec)
    if local is not None:
        check_pipeline_folder(f"{what} weights", local)
    try:
        return cls.from_pretrained(spec, torch_dtype=dtype, local_files_only=True)
    except (OSError, ValueError) as exc:
        raise MissingWeightsError(
            f"{what} weights {spec!r} not found locally ({type(exc).__name__}); pass a local diffusers directory "
            f"or put the repo in the Hugging Face cache (HF_HOME) first"
        ) from None


class SD3Adapter(ModelAdapter):
    """A ``StableDiffusion3Pipeline`` as a velocity-prediction :class:`ModelAdapter`."""

    name = "sd3"
    prediction = "velocity"

    def __init__(self, pipe: Any, resolution: int | None = None,
                 max_sequence_length: int = SD3_MAX_SEQUENCE_LENGTH) -> None:
        self.pipe = pipe
        self.denoiser = pipe.transformer
        self.scheduler_config = dict(pipe.scheduler.config)
        self.vae_scale_factor = int(pipe.vae_scale_factor)
        res = int(resolution or pipe.default_sample_size * self.vae_scale_factor)
        c = int(self.denoiser.config.in_channels)
        self.latent_shape = (c, res // self.vae_scale_factor, res // self.vae_scale_factor)
        self.max_sequence_length = int(max_sequence_length)
        self.lora_target_modules = list(SD3_LORA_TARGETS)

    @classmethod
    def from_pretrained(
        cls, spec: str = DEFAULT_SD3, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32,
        resolution: int | None = 512,
    ) -> SD3Adapter:
        """Load a local SD3(.5) diffusers pipeline (directory or cached repo id), no download."""
        from diffusers import StableDiffusion3Pipeline

        pipe = load_local_pipeline(StableDiffusion3Pipeline, spec, dtype, "SD3")
        pipe.to(device)
        pipe.vae.requires_grad_(False)
        for enc in (pipe.text_encoder, pipe.text_encoder_2, pipe.text_encoder_3):
            if enc is not None:
                enc.requires_grad_(False)
        return cls(pipe, resolution)

    @property
    def image_seq_len(self) -> int:
        """Number of transformer image tokens (for dynamically shifted schedules)."""
        p = int(self.denoiser.config.patch_size)
        return (self.latent_shape[1] // p) * (self.latent_shape[2] // p)

    @torch.no_grad()
    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        pe, _, pooled, _ = self.pipe.encode_prompt(
            prompt=list(prompts), prompt_2=None, prompt_3=None, device=self.device,
            do_classifier_free_guidance=False, max_sequence_length=self.max_sequence_length,
        )
        return PromptEmbeds(pe.to(self.dtype), pooled.to(self.dtype))

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        """Velocity u = noise - x_0 at continuous times ``t`` in [0, 1] (transformer gets 1000 t in float32, as
        diffusers' ``StableDiffusion3Pipeline`` passes its scheduler's timesteps: the transformer casts after
        the sinusoidal projection, so a bf16 timestep would move t by up to 2 units of 1000)."""
        timestep = t.to(x_t.device, torch.float32) * 1000.0
        return self.denoiser(
            hidden_states=x_t, encoder_hidden_states=cond.hidden, pooled_projections=cond.pooled,
            timestep=timestep, return_dict=False,
        )[0]

    @torch.no_grad()
    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        vae = self.pipe.vae
        z = latents.to(vae.dtype) / vae.config.scaling_factor + (vae.config.shift_factor or 0.0)
        return _to_uint8(vae.decode(z, return_dict=False)[0])


# --------------------------------------------------------------------------------------------
# tiny, randomly initialized pipelines for tests (no download)
# --------------------------------------------------------------------------------------------


@contextlib.contextmanager
def seeded(seed: int) -> Iterator[None]:
    """diffusers/transformers initialize weights from the global RNG: fork it, seed, restore."""
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        yield


def tiny_clip_tokenizer(max_length: int = 77) -> Any:
    """A character-level ``CLIPTokenizer`` written to a temp dir (lower-case letters, digits, space)."""
    from transformers import CLIPTokenizer

    chars = list(string.ascii_lowercase + string.digits + ".,!?'-")
    vocab = {"<|startoftext|>": 0, "<|endoftext|>": 1}
    for c in chars:
        vocab[c] = len(vocab)
    for c in chars:
        vocab[c + "</w>"] = len(vocab)
    with tempfile.TemporaryDirectory(prefix="pcpo_tiny_tok_") as tmp:  # read by the constructor, then removed
        d = Path(tmp)
        (d / "vocab.json").write_text(json.dumps(vocab))
        (d / "merges.txt").write_text("#version: 0.2\n")
        return CLIPTokenizer(str(d / "vocab.json"), str(d / "merges.txt"), model_max_length=max_length)


def tiny_vae(latent_channels: int, seed: int = 0) -> Any:
    """A 2-level ``AutoencoderKL`` (vae_scale_factor 2) with SD3-style scaling/shift factors."""
    from diffusers import AutoencoderKL

    with seeded(seed):
        return AutoencoderKL(
            in_channels=3, out_channels=3, down_block_types=("DownEncoderBlock2D",) * 2,
            up_block_types=("UpDecoderBlock2D",) * 2, block_out_channels=(8, 16), layers_per_block=1,
            latent_channels=latent_channels, norm_num_groups=4, sample_size=16,
            scaling_factor=1.5035, shift_factor=0.0609, use_quant_conv=False, use_post_quant_conv=False,
        ).eval()


def tiny_clip_config(vocab_size: int, hidden: int = 32, projection: int = 32) -> Any:
    from transformers import CLIPTextConfig

    return CLIPTextConfig(
        vocab_size=vocab_size, hidden_size=hidden, intermediate_size=37, num_hidden_layers=2, num_attention_heads=4,
        projection_dim=projection, max_position_embeddings=77, bos_token_id=0, eos_token_id=1, pad_token_id=1,
        hidden_act="gelu",
    )


def tiny_t5(vocab_size: int, d_model: int, seed: int) -> Any:
    from transformers import T5Config, T5EncoderModel

    with seeded(seed):
        return T5EncoderModel(T5Config(vocab_size=vocab_size, d_model=d_model, d_kv=8, d_ff=37, num_layers=2,
                                       num_heads=4, pad_token_id=1, eos_token_id=1)).eval()


def tiny_sd3_pipeline(seed: int = 0) -> Any:
    """A miniature SD3 pipeline: 1 MMDiT block, 8x8x4 latents, 16x16 images, tiny CLIP-L/G and T5."""
    from diffusers import FlowMatchEulerDiscreteScheduler, SD3Transformer2DModel, StableDiffusion3Pipeline
    from transformers import CLIPTextModelWithProjection

    tok = tiny_clip_tokenizer()
    V = len(tok)
    with seeded(seed):
        te1 = CLIPTextModelWithProjection(tiny_clip_config(V)).eval()
        te2 = CLIPTextModelWithProjection(tiny_clip_config(V)).eval()
    te3 = tiny_t5(V, 64, seed + 1)
    with seeded(seed + 2):
        transformer = SD3Transformer2DModel(
            sample_size=8, patch_size=1, in_channels=4, num_layers=1, attention_head_dim=8, num_attention_heads=4,
            joint_attention_dim=64, caption_projection_dim=32, pooled_projection_dim=64, out_channels=4,
            pos_embed_max_size=16,
        )
    pipe = StableDiffusion3Pipeline(
        transformer=transformer, scheduler=FlowMatchEulerDiscreteScheduler(shift=3.0), vae=tiny_vae(4, seed + 3),
        text_encoder=te1, tokenizer=tok, text_encoder_2=te2, tokenizer_2=tok, text_encoder_3=te3, tokenizer_3=tok,
    )
    for enc in (te1, te2, te3, pipe.vae):
        enc.requires_grad_(False)
    return pipe


def tiny_sd3_adapter(seed: int = 0) -> SD3Adapter:
    """:class:`SD3Adapter` over :func:`tiny_sd3_pipeline` (16x16 images)."""
    return SD3Adapter(tiny_sd3_pipeline(seed), resolution=16, max_sequence_length=16)
