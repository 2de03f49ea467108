"""Tiny, randomly initialised stand-ins for the real preference models (no download, CPU-fast).

Each builder writes files in the same layout and with the same key names as the real weights,
so the factories in :mod:`pcpo_eval.rewards.preference` load them through their real code paths:

- :func:`tiny_open_clip_checkpoint`: an open_clip CLIP (registered config ``pcpo-tiny-clip``, 224 px,
  the real BPE tokenizer) saved as ``{"state_dict": ...}`` like ``HPS_v2.1_compressed.pt``;
- :func:`tiny_hf_clip_dir`: a transformers CLIPModel folder with ``preprocessor_config.json`` and
  CLIP tokenizer files (vocab.json / merges.txt rebuilt from open_clip's bundled BPE file), the
  layout of PickScore_v1 / laion processor / openai/clip-vit-large-patch14;
- :func:`tiny_aesthetic_state_dict`: the LAION MLP state dict with the real key names.
"""

from __future__ import annotations

import gzip
import json
from pathlib import Path

import torch

TINY_OPEN_CLIP = "pcpo-tiny-clip"

_TINY_OPEN_CLIP_CFG = {
    "embed_dim": 16,
    "vision_cfg": {"image_size": 224, "layers": 1, "width": 32, "head_width": 16, "patch_size": 32},
    "text_cfg": {"context_length": 77, "vocab_size": 49408, "width": 32, "heads": 2, "layers": 1},
}


def register_tiny_open_clip(tmp_dir: Path) -> str:
    """Register the tiny open_clip config (global open_clip registry) and return its name."""
    import open_clip

    cfg_dir = tmp_dir / "open_clip_cfg"
    cfg_dir.mkdir(parents=True, exist_ok=True)
    (cfg_dir / f"{TINY_OPEN_CLIP}.json").write_text(json.dumps(_TINY_OPEN_CLIP_CFG))
    open_clip.add_model_config(cfg_dir)
    return TINY_OPEN_CLIP


def tiny_open_clip_checkpoint(tmp_dir: Path, seed: int = 0, module_prefix: bool = False) -> Path:
    """Random tiny open_clip weights saved like HPS_v2.1_compressed.pt: ``{"state_dict": sd}``."""
    import open_clip

    name = register_tiny_open_clip(tmp_dir)
    torch.manual_seed(seed)  # open_clip initialises from the global RNG; tests only
    from pcpo_eval.rewards.preference import open_clip_offline_kwargs

    model = open_clip.create_model(name, **open_clip_offline_kwargs())
    with torch.no_grad():  # open_clip's init leaves a tiny logit_scale/pos-embeddings; spread features
        for p in model.parameters():
            p.add_(0.02 * torch.randn_like(p))
    sd = model.state_dict()
    if module_prefix:
        sd = {f"module.{k}": v for k, v in sd.items()}
    path = tmp_dir / f"tiny_hps_{seed}_{int(module_prefix)}.pt"
    torch.save({"state_dict": sd}, path)
    return path


def clip_bpe_files(out_dir: Path) -> None:
    """Write CLIP's vocab.json / merges.txt, rebuilt from open_clip's bundled BPE merges file."""
    from open_clip.tokenizer import bytes_to_unicode, default_bpe

    lines = gzip.open(default_bpe()).read().decode("utf-8").split("\n")
    merges = [tuple(m.split()) for m in lines[1 : 49152 - 256 - 2 + 1]]
    vocab = list(bytes_to_unicode().values())
    vocab = vocab + [v + "</w>" for v in vocab] + ["".join(m) for m in merges]
    vocab += ["<|startoftext|>", "<|endoftext|>"]
    out_dir.mkdir(parents=True, exist_ok=True)
    (out_dir / "vocab.json").write_text(json.dumps({t: i for i, t in enumerate(vocab)}))
    (out_dir / "merges.txt").write_text("#version: 0.2\n" + "\n".join(" ".join(m) for m in merges) + "\n")


def tiny_hf_clip_dir(
    out_dir: Path,
    seed: int = 0,
    projection_dim: int = 768,
    with_tokenizer: bool = True,
    image_size: int = 224,
    logit_scale: float = 2.6592,
) -> Path:
    """A tiny transformers CLIPModel folder (+ preprocessor_config.json, + tokenizer files)."""
    from transformers import CLIPConfig, CLIPImageProcessor, CLIPModel, CLIPTokenizer

    cfg = CLIPConfig(
        text_config={
            "vocab_size": 49408, "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1,
            "num_attention_heads": 2, "max_position_embeddings": 77, "bos_token_id": 49406,
            "eos_token_id": 49407, "pad_token_id": 49407,
        },
        vision_config={
            "hidden_size": 32, "intermediate_size": 37, "num_hidden_layers": 1, "num_attention_heads": 2,
            "image_size": image_size, "patch_size": 32,
        },
        projection_dim=projection_dim,
        logit_scale_init_value=logit_scale,
    )
    torch.manual_seed(seed)  # transformers initialises from the global RNG; tests only
    model = CLIPModel(cfg).eval()
    out_dir.mkdir(parents=True, exist_ok=True)
    model.save_pretrained(out_dir)
    CLIPImageProcessor(size={"shortest_edge": image_size}, crop_size={"height": image_size, "width": image_size}).save_pretrained(out_dir)
    if with_tokenizer:
        tok_src = out_dir / "_bpe"
        clip_bpe_files(tok_src)
        tok = CLIPTokenizer(vocab_file=str(tok_src / "vocab.json"), merges_file=str(tok_src / "merges.txt"))
        tok.save_pretrained(out_dir)
    return out_dir


def tiny_aesthetic_state_dict(seed: int = 0, input_size: int = 768) -> dict[str, torch.Tensor]:
    """Random LAION aesthetic MLP weights with the real key names (``layers.0/2/4/6/7``)."""
    g = torch.Generator().manual_seed(seed)
    shapes = {0: (1024, input_size), 2: (128, 1024), 4: (64, 128), 6: (16, 64), 7: (1, 16)}
    sd: dict[str, torch.Tensor] = {}
    for idx, (o, i) in shapes.items():
        sd[f"layers.{idx}.weight"] = torch.randn(o, i, generator=g) / i**0.5
        sd[f"layers.{idx}.bias"] = torch.randn(o, generator=g) * 0.1
    return sd


def random_images(n: int, size: int | tuple[int, int] = 224, seed: int = 0) -> torch.Tensor:
    """uint8 (n, 3, H, W) smooth-ish random images (low-frequency noise upsampled)."""
    h, w = (size, size) if isinstance(size, int) else size
    g = torch.Generator().manual_seed(seed)
    base = torch.rand(n, 3, 8, 8, generator=g)
    img = torch.nn.functional.interpolate(base, size=(h, w), mode="bilinear", align_corners=False)
    img = img + 0.15 * torch.rand(n, 3, h, w, generator=g)
    return (img.clamp(0, 1) * 255).round().to(torch.uint8)
