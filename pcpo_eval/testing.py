"""Tiny, randomly initialized models for everyone's tests (built from configs, no download).

* :func:`tiny_toy_adapter` -- the toy architecture with random weights (fast, 48x8x8 latents).
* :func:`tiny_toy_classifier` -- the toy classifier architecture with random weights.
* :func:`tiny_sd1_pipeline` / :func:`tiny_sd1_adapter` -- an SD-1.x pipeline at toy scale (UNet
  32/64 channels on 8x8x4 latents, a 2-block VAE -> 16x16 images, a 2-layer CLIP text encoder
  and a CLIP BPE tokenizer whose character-level vocab is written locally).
* :func:`save_tiny_sd1` -- ``save_pretrained`` of that pipeline, to exercise ``sd1:DIR`` loading.
* :func:`qwen25_vl` -- a Qwen2.5-VL captioner (``Qwen2_5_VLForConditionalGeneration`` + its processor
  with a word-level tokenizer and Qwen's special tokens at their real ids) of any size: tiny for tests
  (:func:`save_tiny_qwen25_vl`), the published 3B configuration for the GPU benchmarks.
"""

from __future__ import annotations

import json
import string
import tempfile
from pathlib import Path
from typing import Any

import torch


def _seeded(seed: int, build):
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(seed)
        return build()


def tiny_toy_adapter(seed: int = 0):
    """A ToyAdapter with the toy architecture and random weights (not the shipped ones)."""
    from pcpo_eval.models.toy import ToyAdapter
    from pcpo_eval.toy import model as toy_model

    unet = toy_model.build_unet(seed=seed).eval()
    enc = toy_model.build_text_encoder(seed=seed + 1).eval()
    return ToyAdapter(unet, enc, toy_model.scheduler_config(), source=f"random(seed={seed})")


def tiny_toy_classifier(seed: int = 0):
    """The toy classifier architecture with random weights, eval mode."""
    from pcpo_eval.toy.classifier import ToyClassifier

    return _seeded(seed, ToyClassifier).eval().requires_grad_(False)


def tiny_clip_tokenizer() -> Any:
    """A ``CLIPTokenizer`` with a character-level BPE vocab (``vocab.json``, ``merges.txt`` written to a
    temporary folder, read by the constructor, then removed: nothing is left behind)."""
    from transformers import CLIPTokenizer

    chars = list(string.ascii_lowercase + string.digits + ".,!?'-")
    tokens = ["<|startoftext|>", "<|endoftext|>", "!"] + chars + [c + "</w>" for c in chars]
    vocab = {t: i for i, t in enumerate(dict.fromkeys(tokens))}
    with tempfile.TemporaryDirectory(prefix="tiny_clip_tok_") as tmp:
        directory = Path(tmp)
        (directory / "vocab.json").write_text(json.dumps(vocab))
        (directory / "merges.txt").write_text("#version: 0.2\n")
        return CLIPTokenizer(str(directory / "vocab.json"), str(directory / "merges.txt"), model_max_length=77)


def tiny_sd1_components(seed: int = 0) -> dict[str, Any]:
    """UNet, VAE, text encoder, tokenizer and DDIM scheduler of a tiny SD-1.x pipeline."""
    from diffusers import AutoencoderKL, DDIMScheduler, UNet2DConditionModel
    from transformers import CLIPTextConfig, CLIPTextModel

    unet = _seeded(seed, lambda: UNet2DConditionModel(
        sample_size=8, in_channels=4, out_channels=4, block_out_channels=(32, 64), layers_per_block=1,
        down_block_types=("DownBlock2D", "CrossAttnDownBlock2D"), up_block_types=("CrossAttnUpBlock2D", "UpBlock2D"),
        cross_attention_dim=32, attention_head_dim=8, norm_num_groups=32))
    vae = _seeded(seed + 1, lambda: AutoencoderKL(
        block_out_channels=[32, 64], in_channels=3, out_channels=3, latent_channels=4, sample_size=16,
        down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
        up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], norm_num_groups=32))
    tokenizer = tiny_clip_tokenizer()
    text_encoder = _seeded(seed + 2, lambda: CLIPTextModel(CLIPTextConfig(
        bos_token_id=0, eos_token_id=1, pad_token_id=1, hidden_size=32, intermediate_size=37,
        layer_norm_eps=1e-5, num_attention_heads=4, num_hidden_layers=2, vocab_size=len(tokenizer),
        max_position_embeddings=77)))
    scheduler = DDIMScheduler(beta_start=0.00085, beta_end=0.012, beta_schedule="scaled_linear",
                              clip_sample=False, set_alpha_to_one=False, steps_offset=1)
    return {"unet": unet.eval(), "vae": vae.eval(), "text_encoder": text_encoder.eval(), "tokenizer": tokenizer,
            "scheduler": scheduler}


def tiny_sd1_pipeline(seed: int = 0):
    """A tiny randomly initialized ``StableDiffusionPipeline`` (no safety checker)."""
    from diffusers import StableDiffusionPipeline

    pipe = StableDiffusionPipeline(**tiny_sd1_components(seed), safety_checker=None, feature_extractor=None,
                                   requires_safety_checker=False)
    pipe.set_progress_bar_config(disable=True)
    return pipe


def tiny_sd1_adapter(seed: int = 0):
    """An :class:`pcpo_eval.models.sd1.SD1Adapter` around :func:`tiny_sd1_pipeline`."""
    from pcpo_eval.models.sd1 import SD1Adapter

    return SD1Adapter(tiny_sd1_pipeline(seed), source=f"tiny-random(seed={seed})")


def save_tiny_sd1(directory: str | Path, seed: int = 0) -> Path:
    """``save_pretrained`` the tiny pipeline into ``directory`` (for ``load_model('sd1:DIR')``)."""
    directory = Path(directory)
    tiny_sd1_pipeline(seed).save_pretrained(str(directory), safe_serialization=True)
    return directory


def isolate_weight_caches(tmp_path, monkeypatch) -> None:
    """Point every weight-cache root at empty temp dirs and clear all backend env vars (tests).

    Nothing real is then ever found, and ``HF_HUB_OFFLINE=1`` makes any stray hub call fail
    instead of downloading.
    """
    import pcpo_eval.weights.locate as W

    for b in W.BACKENDS.values():
        monkeypatch.delenv(b.env_var, raising=False)
    for var in ("HF_HUB_CACHE", "XDG_CACHE_HOME"):
        monkeypatch.delenv(var, raising=False)
    monkeypatch.setenv("HF_HOME", str(tmp_path / "hf"))
    monkeypatch.setenv("TORCH_HOME", str(tmp_path / "torch"))
    monkeypatch.setenv("PCPO_WEIGHTS_DIR", str(tmp_path / "pcpo"))
    monkeypatch.setattr(W.tempfile, "gettempdir", lambda: str(tmp_path / "sys_tmp"))
    monkeypatch.setenv("HOME", str(tmp_path / "home"))
    monkeypatch.setenv("HF_HUB_OFFLINE", "1")


#: Qwen2.5-VL's special tokens and their ids in Qwen/Qwen2.5-VL-3B-Instruct's vocabulary (config.json)
QWEN25_VL_SPECIAL = {"<|endoftext|>": 151643, "<|im_start|>": 151644, "<|im_end|>": 151645,
                     "<|vision_start|>": 151652, "<|vision_end|>": 151653, "<|image_pad|>": 151655,
                     "<|video_pad|>": 151656}
#: the chat template's shape (role, image between vision markers, text) without Qwen's system prompt
QWEN25_VL_TEMPLATE = (
    "{% for m in messages %}<|im_start|>{{ m['role'] }} {% for c in m['content'] %}{% if c['type'] == 'image' %}"
    "<|vision_start|><|image_pad|><|vision_end|>{% else %}{{ c['text'] }}{% endif %}{% endfor %}<|im_end|> "
    "{% endfor %}{% if add_generation_prompt %}<|im_start|>assistant {% endif %}")


def qwen25_vl(text: dict[str, Any], vision: dict[str, Any], pixels: tuple[int, int], seed: int = 0,
              device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32) -> tuple[Any, Any]:
    """A random-weight ``Qwen2_5_VLForConditionalGeneration`` and a processor that drives it.

    ``text`` / ``vision``: the text and vision configs (with Qwen's ``vocab_size`` the special tokens keep
    their real ids; a small vocabulary puts them first); ``pixels``: the image processor's (min, max) pixels. The tokenizer is
    word-level, token i the word ``w<i>`` apart from the special tokens, so any generated id decodes and
    a caption of n tokens is n words: the shapes (image tokens, caption length) are the real model's.
    Built on ``device`` in ``dtype`` (``torch.device`` context: no CPU copy of a 3B model first).
    """
    from tokenizers import Tokenizer, models, pre_tokenizers
    from transformers import (
        PreTrainedTokenizerFast,
        Qwen2_5_VLConfig,
        Qwen2_5_VLForConditionalGeneration,
        Qwen2_5_VLProcessor,
        Qwen2VLImageProcessor,
        Qwen2VLVideoProcessor,
    )

    real = int(text["vocab_size"]) > max(QWEN25_VL_SPECIAL.values())
    special = QWEN25_VL_SPECIAL if real else {w: i for i, w in enumerate(QWEN25_VL_SPECIAL)}
    names = {i: w for w, i in special.items()}
    vocab = {names.get(i, f"w{i}"): i for i in range(int(text["vocab_size"]))}
    tk = Tokenizer(models.WordLevel(vocab=vocab, unk_token="<|endoftext|>"))
    tk.pre_tokenizer = pre_tokenizers.WhitespaceSplit()
    tok = PreTrainedTokenizerFast(tokenizer_object=tk, eos_token="<|im_end|>", pad_token="<|endoftext|>",
                                  unk_token="<|endoftext|>", model_max_length=32768)
    tok.add_special_tokens({"additional_special_tokens": [w for w in special if w != "<|endoftext|>"]})
    geometry = dict(min_pixels=pixels[0], max_pixels=pixels[1], patch_size=vision["patch_size"],
                    merge_size=vision["spatial_merge_size"], temporal_patch_size=vision["temporal_patch_size"])
    proc = Qwen2_5_VLProcessor(image_processor=Qwen2VLImageProcessor(**geometry), tokenizer=tok,
                               video_processor=Qwen2VLVideoProcessor(**geometry), chat_template=QWEN25_VL_TEMPLATE)
    cfg = Qwen2_5_VLConfig(
        text_config={**text, "bos_token_id": special["<|endoftext|>"], "eos_token_id": special["<|im_end|>"],
                     "pad_token_id": special["<|endoftext|>"]},
        vision_config=vision, image_token_id=special["<|image_pad|>"], video_token_id=special["<|video_pad|>"],
        vision_start_token_id=special["<|vision_start|>"], vision_end_token_id=special["<|vision_end|>"],
        tie_word_embeddings=text.get("tie_word_embeddings", True))
    with torch.random.fork_rng(devices=[]), torch.device(device):
        torch.manual_seed(seed)
        model = Qwen2_5_VLForConditionalGeneration._from_config(cfg, dtype=dtype).eval()  # no float32 copy first
    return model, proc


#: a Qwen2.5-VL small enough for a test (1 text layer of width 32, 1 vision block of width 16)
TINY_QWEN25_VL_TEXT = dict(vocab_size=64, hidden_size=32, intermediate_size=64, num_hidden_layers=1,
                           num_attention_heads=2, num_key_value_heads=1, max_position_embeddings=4096,
                           rope_parameters={"rope_type": "default", "rope_theta": 10000.0, "mrope_section": [2, 3, 3]})
TINY_QWEN25_VL_VISION = dict(depth=1, hidden_size=16, intermediate_size=32, num_heads=2, out_hidden_size=32,
                             patch_size=14, spatial_merge_size=2, temporal_patch_size=2, window_size=56,
                             fullatt_block_indexes=[0])


def save_tiny_qwen25_vl(directory: str | Path, seed: int = 0) -> Path:
    """``save_pretrained`` a tiny :func:`qwen25_vl` (images resized to 56x56: 4 image tokens) and its
    processor into ``directory``, in bfloat16 as Qwen/Qwen2.5-VL-3B-Instruct's weights (and config.json) are."""
    directory = Path(directory)
    model, proc = qwen25_vl(TINY_QWEN25_VL_TEXT, TINY_QWEN25_VL_VISION, (56 * 56, 56 * 56), seed,
                            dtype=torch.bfloat16)
    model.save_pretrained(str(directory))
    proc.save_pretrained(str(directory))
    return directory
