"""Benchmark: preference-model preprocessing fidelity and batched scoring speed.

Run: ``.venv/bin/python benchmarks/bench_preference.py`` (CPU, 1 thread, no weights needed: the
networks are randomly initialised open_clip ViT-B-32 / tiny stand-ins of the real architectures).

1. Preprocessing: our tensor path (antialiased bicubic on uint8, center crop, normalise) against
   transformers' torchvision-backend ``CLIPImageProcessor`` and open_clip's PIL validation
   transform, on 512x512 images resized to 224 (the SD-1.x case); differences in uint8 levels.
2. Speed: HPS-style scoring of 32 images (512x512) with an open_clip ViT-B-32 loaded from a local
   ``{"state_dict": ...}`` file: our batched reward (batch 16, each distinct prompt encoded once)
   vs the reference per-image loop of HPSv2's ``img_score.py`` (PIL preprocess + ``model(img, txt)``
   per image).
"""

from __future__ import annotations

import sys
import tempfile
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parents[1]))  # the checkout: tests.support

from pcpo_eval.rewards import make_reward
from pcpo_eval.rewards.preference import (
    ImageCfg,
    image_cfg_from_hf,
    open_clip_offline_kwargs,
    preprocess_images,
)
from tests.support.preference import random_images, tiny_hf_clip_dir


def _levels(a: torch.Tensor, b: torch.Tensor, std: tuple[float, ...]) -> tuple[float, float]:
    s = torch.tensor(std).view(1, -1, 1, 1)
    d = ((a - b) * s * 255).abs()
    return float(d.max()), float(d.mean())


def bench_preprocessing(tmp: Path) -> list[tuple[str, float, float]]:
    import transformers
    from open_clip.transform import image_transform
    from PIL import Image

    imgs = random_images(16, 512, seed=0)
    rows = []
    clip_dir = tiny_hf_clip_dir(tmp / "clip", with_tokenizer=False)
    major = int(transformers.__version__.split(".")[0])
    cls = transformers.CLIPImageProcessor if major >= 5 else transformers.CLIPImageProcessorFast
    proc = cls.from_pretrained(clip_dir)
    ref = proc(images=list(imgs), return_tensors="pt")["pixel_values"]
    ours = preprocess_images(imgs, image_cfg_from_hf(proc.to_dict()))
    rows.append(("transformers CLIPImageProcessor (torchvision backend)", *_levels(ours, ref, ImageCfg().std)))
    tf = image_transform(224, is_train=False)
    ref = torch.stack([tf(Image.fromarray(x.permute(1, 2, 0).numpy())) for x in imgs])
    ours = preprocess_images(imgs, ImageCfg())
    rows.append(("open_clip validation transform (PIL bicubic)", *_levels(ours, ref, ImageCfg().std)))
    return rows


def bench_speed(tmp: Path, n: int = 32) -> tuple[float, float, float]:
    import open_clip
    from PIL import Image

    torch.manual_seed(0)  # benchmark only: random architecture weights
    model = open_clip.create_model("ViT-B-32", **open_clip_offline_kwargs())
    ckpt = tmp / "vitb32.pt"
    torch.save({"state_dict": model.state_dict()}, ckpt)
    imgs = random_images(n, 512, seed=1)
    prompts = [f"prompt {i % 4}" for i in range(n)]

    fn = make_reward("hps", weights=str(ckpt), model_name="ViT-B-32", batch_size=16)
    fn(imgs[:2], prompts[:2])  # warm-up
    t0 = time.perf_counter()
    ours = fn(imgs, prompts)
    t_ours = time.perf_counter() - t0

    import torchvision.transforms as T

    ref_model, _, _ = open_clip.create_model_and_transforms(
        "ViT-B-32", pretrained=str(ckpt), output_dict=True, **open_clip_offline_kwargs()
    )
    # HPSv2's preprocess_val (hpsv2/src/open_clip/transform.py, is_train=False): the float image resized, as the
    # reward does; mainline open_clip's transform (resize on the uint8 PIL image) is not HPSv2's
    cfg = fn.module.image_cfg
    preprocess_val = T.Compose([T.ToTensor(), T.Resize(224, interpolation=T.InterpolationMode.BICUBIC),
                                T.CenterCrop(224), T.Normalize(cfg.mean, cfg.std)])
    ref_model.eval()
    tokenizer = open_clip.get_tokenizer("ViT-B-32")
    pils = [Image.fromarray(x.permute(1, 2, 0).numpy()) for x in imgs]
    t0 = time.perf_counter()
    ref = []
    with torch.no_grad():
        for pil, prompt in zip(pils, prompts, strict=True):
            out = ref_model(preprocess_val(pil).unsqueeze(0), tokenizer([prompt]))
            ref.append(float(torch.diagonal(out["image_features"] @ out["text_features"].T)[0]))
    t_ref = time.perf_counter() - t0
    max_diff = float((ours - torch.tensor(ref)).abs().max())
    return t_ref, t_ours, max_diff


def main() -> None:
    torch.set_num_threads(1)
    with tempfile.TemporaryDirectory() as d:
        tmp = Path(d)
        pre = bench_preprocessing(tmp)
        t_ref, t_ours, diff = bench_speed(tmp)
    print("## Preference models: preprocessing fidelity and batched scoring")
    print()
    print("Preprocessing, 16 images 512x512 -> 224 (difference in uint8 levels, after un-normalising):")
    print()
    print("| reference | max | mean |")
    print("|---|---|---|")
    for name, mx, mean in pre:
        print(f"| {name} | {mx:.3f} | {mean:.4f} |")
    print()
    print("HPS-style scoring, open_clip ViT-B-32 (random weights from a local file), 32 images 512x512, 1 CPU thread:")
    print()
    print("| path | seconds | speed-up |")
    print("|---|---|---|")
    print(f"| HPSv2 img_score.py-style per-image loop (its preprocess_val) | {t_ref:.2f} | 1.0x |")
    print(f"| pcpo-eval batched reward (batch 16) | {t_ours:.2f} | {t_ref / t_ours:.1f}x |")
    print()
    print(f"Max |score difference| between the two paths: {diff:.2e} (cosine units).")


if __name__ == "__main__":
    main()
