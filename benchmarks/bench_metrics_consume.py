"""Benchmark of the metric pass's per-image host work: the LPIPS consumer and the DINOv2 resize, new vs old.

1. LPIPS consumer (``consume:lpips`` of the decode pass): prompts of 10 images fed in decode batches
   that split prompts. Old: the previous path, verbatim: per prompt, g = concat of the trunk's
   normalized layers (D floats per image, 2.66 M at 512 px) copied to the host (``.cpu()``: a no-op
   here, a 10.6 MB-per-image device-to-host copy on a GPU), centered and squared there. New:
   :func:`pcpo_eval.metrics.lpips_diversity.segment_moments` per trunk batch on the trunk's device,
   layer by layer, nothing but scalars (and the means of prompts still open) leaving it. Same random
   AlexNet trunk with the wheel's v0.1 linear layers; both run the trunk once per image. On CPU the
   ratio measures the host arithmetic saved (the trunk, identical on both sides, dominates); the
   bytes copied to the host are what a GPU saves on top.
2. DINOv2's dgm-eval resize (PIL 8-bit bicubic 512 -> 224): ``pil_uint8_resize`` as kept (PIL reads a
   strided NHWC view per image: numpy's tobytes gather in each worker thread) against a variant tried
   and rejected (one contiguous torch copy first: serial unless torch has threads to spare, and slower
   on 2 cores); pixels equal bit for bit. Plus the decode pass (``extract_sets``) with a random
   ViT-S/14-sized DINOv2, old (resize inside ``extract`` on the main thread) vs new (``prepare`` on the
   prefetch thread, overlapping the forward): features equal bit for bit.

Single-threaded torch / BLAS for both sides of each ratio (PIL resizes and PNG decodes keep the
thread pool of :func:`pcpo_eval.io.parallel_map`). Usage:
    .venv/bin/python benchmarks/bench_metrics_consume.py [--size 256] [--prompts 4] [--dino-images 48]
"""

from __future__ import annotations

import os

for _var in ("OMP_NUM_THREADS", "OPENBLAS_NUM_THREADS", "MKL_NUM_THREADS"):
    os.environ.setdefault(_var, "1")

import argparse  # noqa: E402
import math  # noqa: E402
import warnings  # noqa: E402
from pathlib import Path  # noqa: E402
from types import SimpleNamespace  # noqa: E402

import numpy as np  # noqa: E402
import torch  # noqa: E402
from bench_metrics import _time  # noqa: E402  (this folder is on sys.path when a script runs)
from PIL import Image  # noqa: E402

from pcpo_eval.io import parallel_map, scratch_dir  # noqa: E402
from pcpo_eval.metrics import lpips_diversity as L  # noqa: E402

warnings.filterwarnings("ignore", category=UserWarning)  # torchvision's "pretrained" deprecation in lpips


def _best(fn, repeat: int = 3) -> tuple[float, object]:
    """Best of ``repeat`` wall times and the last result (``bench_metrics._time``)."""
    return _time(fn, repeat)


# ----------------------------------------------------------------------------- the old paths, verbatim


def _old_embed_layers(layers, weights) -> torch.Tensor:
    parts = []
    for feat, w in zip(layers, weights, strict=True):
        f = L.normalize_channels(feat.float())
        scale = 1.0 / math.sqrt(feat.shape[2] * feat.shape[3])
        if w is not None:
            w = w.detach().float().reshape(1, -1, 1, 1).to(f.device)
            if (w < 0).any():
                raise ValueError("negative")
            f = f * (torch.sqrt(w) * scale)
        else:
            f = f * scale
        parts.append(f.flatten(1))
    return torch.cat(parts, dim=1)


class _OldAccumulator:
    def __init__(self) -> None:
        self.n, self.m2, self.mean = 0, 0.0, None

    def update(self, g: torch.Tensor) -> None:
        mb = g.mean(dim=0)
        centered = g - mb
        n_b, m2_b, mean_b = g.shape[0], float((centered * centered).sum()), mb.double()
        if self.mean is None:
            self.n, self.m2, self.mean = n_b, m2_b, mean_b.clone()
            return
        n = self.n + n_b
        delta = mean_b - self.mean
        self.m2 += m2_b + float(delta @ delta) * self.n * n_b / n
        self.mean = self.mean + delta * (n_b / n)
        self.n = n


def _old_consumer(emb: L.LpipsEmbedder, rows: dict[int, list[int]], batch: int):
    prompt_of = {r: pid for pid, rs in rows.items() for r in rs}
    left = {pid: len(rs) for pid, rs in rows.items()}
    acc = {pid: _OldAccumulator() for pid in rows}
    done: dict[int, float] = {}
    moved = [0]

    def embed(images: torch.Tensor) -> torch.Tensor:
        with torch.no_grad():
            weights = [lin.model[-1].weight.view(-1) for lin in emb.model.lins]
            g = _old_embed_layers(emb.layers(images), weights)
            moved[0] += g.numel() * g.element_size()
            return g.cpu()

    def consume(batch_rows: list[int], images: torch.Tensor) -> None:
        by_prompt: dict[int, list[int]] = {}
        for j, r in enumerate(batch_rows):
            by_prompt.setdefault(prompt_of[r], []).append(j)
        for pid, idx in by_prompt.items():
            for i in range(0, len(idx), batch):
                acc[pid].update(embed(images[idx[i:i + batch]]))
            left[pid] -= len(idx)
            if left[pid] == 0:
                a = acc.pop(pid)
                done[pid] = 2.0 * a.m2 / (a.n - 1)

    return consume, done, moved


def _old_pil_uint8_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    arr = images.permute(0, 2, 3, 1).cpu().numpy()  # = pil_uint8_resize (the decode pass's "old" side)
    out = np.empty((arr.shape[0], size, size, 3), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = np.asarray(Image.fromarray(arr[i], mode="RGB").resize((size, size), resample=Image.BICUBIC))

    parallel_map(one, list(range(arr.shape[0])))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


@torch.no_grad()
def _old_dino_extract(ext, images: torch.Tensor) -> dict[str, torch.Tensor]:
    x = _old_pil_uint8_resize(images, 224).to(ext.device).float() / 255.0
    x = (x - ext.mean) / ext.std
    return {"features": ext.model(pixel_values=x).pooler_output.float().cpu()}


# ----------------------------------------------------------------------------- 1. LPIPS consumer


def bench_lpips_consumer(size: int, n_prompts: int, per_prompt: int = 10, decode_batch: int = 25,
                         lpips_batch: int = 16) -> dict[str, float]:
    emb = L.make_lpips_embedder("random", seed=0)
    n = n_prompts * per_prompt
    imgs = torch.randint(0, 256, (n, 3, size, size), dtype=torch.uint8, generator=torch.Generator().manual_seed(0))
    rows = {p: list(range(p * per_prompt, (p + 1) * per_prompt)) for p in range(n_prompts)}
    forwards = [0]
    real = emb.model.net.forward

    def counted(x):
        forwards[0] += x.shape[0]
        return real(x)

    emb.model.net.forward = counted

    def feed(consume) -> None:
        for i in range(0, n, decode_batch):
            r = list(range(i, min(i + decode_batch, n)))
            consume(r, imgs[r])

    def run_old():
        consume, done, moved = _old_consumer(emb, rows, lpips_batch)
        feed(consume)
        return done, moved[0]

    def run_new():
        done: dict[int, float] = {}
        metric = SimpleNamespace(name="lpips", embedder=emb,
                                 _finish=lambda pid, acc, path: done.__setitem__(pid, acc.mean_distance()))
        data = SimpleNamespace(options=SimpleNamespace(lpips_batch=lpips_batch), rows=rows)
        c = L._LpipsConsumer(metric, data, {pid: Path(f"p{pid}") for pid in rows})
        feed(c.consume)
        # bytes a GPU copies to the host: the float64 mean of each prompt a decode batch boundary splits
        open_means = sum(1 for i in range(decode_batch, n, decode_batch) if i % per_prompt) * emb_dim[0] * 8
        return done, open_means

    emb_dim = [0]
    with torch.no_grad():
        emb_dim[0] = L.embed_layers(emb.layers(imgs[:1]), [lin.model[-1].weight.view(-1) for lin in emb.model.lins]).shape[1]
    forwards[0] = 0
    t_old, (v_old, bytes_old) = _best(run_old)
    fw_old = forwards[0] / 3
    forwards[0] = 0
    t_new, (v_new, bytes_new) = _best(run_new)
    fw_new = forwards[0] / 3
    rel = max(abs(v_new[p] - v_old[p]) / abs(v_old[p]) for p in v_old)
    # the work after the trunk alone (what differs): g + host accumulator vs segment_moments, 10 images
    with torch.no_grad():
        layers = emb.layers(imgs[:per_prompt])
        weights = [lin.model[-1].weight.view(-1) for lin in emb.model.lins]

        def post_old() -> None:
            _OldAccumulator().update(_old_embed_layers(layers, weights).cpu())

        def post_new() -> None:
            L.segment_moments(layers, emb.lin_columns, [(0, per_prompt)])[0].mean_distance()

        t_post_old, _ = _best(post_old, repeat=5)
        t_post_new, _ = _best(post_new, repeat=5)
    return {"t_post_old": t_post_old, "t_post_new": t_post_new, "t_old": t_old, "t_new": t_new, "rel": rel, "n": n, "D": emb_dim[0], "bytes_old": bytes_old,
            "bytes_new": bytes_new, "fw_old": fw_old / n, "fw_new": fw_new / n}


# ----------------------------------------------------------------------------- 2. DINOv2 resize and decode pass


def _contiguous_first_resize(images: torch.Tensor, size: int) -> torch.Tensor:
    """The rejected variant: channel-last and contiguous in one torch copy, then PIL from contiguous pixels."""
    arr = images.cpu().permute(0, 2, 3, 1).contiguous().numpy()
    out = np.empty((arr.shape[0], size, size, 3), dtype=np.uint8)

    def one(i: int) -> None:
        out[i] = np.asarray(Image.fromarray(arr[i]).resize((size, size), resample=Image.BICUBIC))

    parallel_map(one, list(range(arr.shape[0])))
    return torch.from_numpy(out).permute(0, 3, 1, 2).contiguous()


def bench_dino_resize(n: int) -> dict[str, float]:
    imgs = torch.randint(0, 256, (n, 3, 512, 512), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    from pcpo_eval.features.base import pil_uint8_resize

    t_old, old = _best(lambda: _contiguous_first_resize(imgs, 224))
    t_new, new = _best(lambda: pil_uint8_resize(imgs, 224))
    arr = imgs.permute(0, 2, 3, 1).numpy()
    arrc = np.ascontiguousarray(arr)
    t_strided, _ = _best(lambda: [Image.fromarray(arr[i]) for i in range(n)])
    t_contig, _ = _best(lambda: [Image.fromarray(arrc[i]) for i in range(n)])
    return {"t_old": t_old, "t_new": t_new, "equal": bool(torch.equal(old, new)), "n": n,
            "fromarray_strided_ms": t_strided / n * 1e3, "fromarray_contig_ms": t_contig / n * 1e3}


def bench_dino_pass(n: int) -> dict[str, float]:
    from transformers import Dinov2Config, Dinov2Model

    from pcpo_eval.features import make_extractor
    from pcpo_eval.imageset import ImageSet
    from pcpo_eval.metrics.extract import MetricsOptions, extract_sets
    from tests.support.metrics import make_image_set

    tmp = scratch_dir("bench_dino_")
    torch.manual_seed(0)
    cfg = Dinov2Config(hidden_size=384, num_hidden_layers=12, num_attention_heads=6, intermediate_size=1536,
                       patch_size=14, image_size=518)  # ViT-S/14 shape, random weights
    Dinov2Model(cfg).save_pretrained(str(tmp / "dino"))
    ext = make_extractor("dinov2", weights_path=str(tmp / "dino"))
    prompts = {p: f"prompt {p}" for p in range(n // 8)}
    rng = np.random.default_rng(0)
    root = make_image_set(tmp / "set", prompts, list(range(8)), size=512,
                          image_fn=lambda p, s, size: rng.integers(0, 256, (size, size, 3), dtype=np.uint8))
    s = ImageSet.load(root)
    k = [0]

    def run(old: bool):
        k[0] += 1
        opts = MetricsOptions(batch_size=16, cache_dir=tmp / f"c{k[0]}")
        if old:  # the previous extract(): resize (strided) on the main thread, then the network
            ext.prepare = lambda images: None
            ext.extract = lambda images: _old_dino_extract(ext, images)
        try:
            return extract_sets(s, {"dinov2": ext}, opts)["dinov2"]["features"]
        finally:
            ext.__dict__.pop("prepare", None)
            ext.__dict__.pop("extract", None)

    t_old, f_old = _best(lambda: run(True), repeat=2)
    t_new, f_new = _best(lambda: run(False), repeat=2)
    return {"t_old": t_old, "t_new": t_new, "equal": bool((f_old == f_new).all()), "n": len(s)}


def main() -> None:
    p = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    p.add_argument("--size", type=int, default=256, help="LPIPS image size (px)")
    p.add_argument("--prompts", type=int, default=4, help="LPIPS prompts of 10 images")
    p.add_argument("--resize-images", type=int, default=64)
    p.add_argument("--dino-images", type=int, default=48)
    args = p.parse_args()
    torch.set_num_threads(1)
    lp = bench_lpips_consumer(args.size, args.prompts)
    rs = bench_dino_resize(args.resize_images)
    dp = bench_dino_pass(args.dino_images)
    print("## Metric pass host work (LPIPS consumer, DINOv2 resize)\n")
    print(f"Measured on this machine, {torch.get_num_threads()} torch thread(s) (torch {torch.__version__}); "
          "best of 3 (decode pass: best of 2), old and new in the same process.\n")
    print("| stage | setting | old (s) | new (s) | old / new | values |")
    print("|---|---|---|---|---|---|")
    print(f"| LPIPS consumer | {lp['n']} images, {args.size}px, {args.prompts} prompts x 10, decode batch 25, "
          f"lpips_batch 16 | {lp['t_old']:.2f} | {lp['t_new']:.2f} | {lp['t_old'] / lp['t_new']:.2f}x | "
          f"max rel. diff {lp['rel']:.1e} |")
    print(f"| LPIPS after the trunk (g + accumulator vs segment_moments) | 10 images, {args.size}px | "
          f"{lp['t_post_old']:.3f} | {lp['t_post_new']:.3f} | {lp['t_post_old'] / lp['t_post_new']:.2f}x | |")
    print(f"| DINOv2 resize 512 -> 224: contiguous copy first (old column, rejected) vs pil_uint8_resize (new) | "
          f"{rs['n']} images | {rs['t_old']:.3f} | {rs['t_new']:.3f} | "
          f"{rs['t_old'] / rs['t_new']:.2f}x | {'bit-equal' if rs['equal'] else 'DIFFERENT'} |")
    print(f"| decode pass, DINOv2 ViT-S/14 (random) | {dp['n']} PNGs 512px, batch 16 | {dp['t_old']:.2f} | "
          f"{dp['t_new']:.2f} | {dp['t_old'] / dp['t_new']:.2f}x | {'bit-equal' if dp['equal'] else 'DIFFERENT'} |")
    print(f"\nLPIPS: trunk forwards per image old {lp['fw_old']:.0f}, new {lp['fw_new']:.0f}; D = {lp['D']:,} floats "
          f"per image; bytes that leave the trunk's device: old {lp['bytes_old'] / 1e6:.0f} MB per run "
          f"({lp['bytes_old'] / lp['n'] / 1e6:.2f} MB per image, the whole g), new {lp['bytes_new'] / 1e6:.1f} MB "
          "(the float64 means of prompts split by a decode batch). "
          f"PIL fromarray per 512-px image: {rs['fromarray_strided_ms']:.2f} ms from the strided view, "
          f"{rs['fromarray_contig_ms']:.2f} ms from contiguous pixels (serial work in each resize thread).")


if __name__ == "__main__":
    main()
