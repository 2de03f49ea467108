"""GPU benchmark: FID + FD-DINOv2 + IS + LPIPS on 512-px sets vs torchmetrics' FID ``update``.

Two image sets (set and reference, ``--images`` each, 512 px smooth random images written in the
generator's layout) are measured by :func:`pcpo_eval.metrics.workers.compute_metrics` with random-weight
Inception (clean-fid's TF trunk, loaded from a saved state dict through the real loader), DINOv2
ViT-L/14 (``save_pretrained`` of a random ``Dinov2Model``) and a random LPIPS trunk, cold caches;
then torchmetrics' ``FrechetInceptionDistance(feature=...)`` ``update`` over the same PNGs decoded by
PIL in the loop, with the same Inception and resize. Reported: images/s of each, our time
extrapolated to 50,000 images per set, the same for a third set against the reference whose
features the cache now holds (``minutes_for_50k_set``: what each checkpoint after the first costs), our
seconds per phase (hash checks, waiting for decoded
batches, each extractor, cache writes, LPIPS embedding, each metric's statistics), and peak GPU memory.

``--tiny``: 16 images of 64 px and a tiny DINOv2 on CPU (CI). Usage::

    python benchmarks/gpu/bench_metrics.py --images 1000 --json $OUT/metrics.json
    python benchmarks/gpu/bench_metrics.py --tiny
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import device_info, peak_gib, reset_peak, sync  # noqa: E402

from pcpo_eval.io import scratch_dir  # noqa: E402
from pcpo_eval.metrics.extract import ExtractionReport, MetricsOptions  # noqa: E402
from pcpo_eval.metrics.workers import compute_metrics  # noqa: E402
from pcpo_eval.precision import matmul_precision  # noqa: E402


def _png(args: tuple[int, int, int]) -> bytes:
    """A smooth random image (low-frequency noise upsampled), PNG-encoded: compresses like a render."""
    pid, seed, size = args
    rng = np.random.default_rng(pid * 1_000_003 + seed)
    small = rng.integers(0, 256, size=(size // 16, size // 16, 3), dtype=np.uint8)
    img = Image.fromarray(small).resize((size, size), Image.BICUBIC)
    buf = io.BytesIO()
    img.save(buf, format="PNG")
    return buf.getvalue()


def write_set(root: Path, n: int, size: int, seed0: int) -> Path:
    """``n`` images over n // 10 prompts in the generator's layout (manifest.parquet, set.json)."""
    n_prompts = max(2, n // 10)
    items = [(p, seed0 + s, size) for p in range(n_prompts) for s in range(n // n_prompts)]
    with ProcessPoolExecutor() as pool:
        blobs = list(pool.map(_png, items, chunksize=16))
    rows = []
    for (pid, seed, _), data in zip(items, blobs, strict=True):
        rel = f"images/p{pid:05d}/s{seed:07d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(data)
        rows.append({"prompt_id": pid, "prompt": f"prompt {pid}", "seed": seed, "path": rel,
                     "image_sha256": hashlib.sha256(data).hexdigest(), "model": "bench", "model_hash": "0" * 64})
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    (root / "set.json").write_text(json.dumps({"model": "bench", "size": size}))
    return root


def random_weights(tmp: Path, tiny: bool) -> dict:
    """Random Inception state dict and DINOv2 directory, loaded by the real extractors."""
    from transformers import Dinov2Config, Dinov2Model

    from pcpo_eval.features.inception import TFInceptionTrunk

    torch.manual_seed(0)
    inc = tmp / "inception.pt"
    torch.save(TFInceptionTrunk().state_dict(), inc)
    cfg = (Dinov2Config(hidden_size=64, num_hidden_layers=2, num_attention_heads=4, intermediate_size=128,
                        patch_size=14, image_size=224) if tiny else
           Dinov2Config(hidden_size=1024, num_hidden_layers=24, num_attention_heads=16, patch_size=14,
                        image_size=518, layerscale_value=1e-5))
    dino = tmp / "dinov2"
    Dinov2Model(cfg).save_pretrained(str(dino))
    return {"inception": {"weights_path": str(inc)}, "dinov2": {"weights_path": str(dino)}}


def run_ours(s: Path, ref: Path, metrics: str, device: str, weights: dict, batch: int,
             precision: str = "fp32", cache_dir: Path | None = None) -> tuple[float, dict, dict]:
    """Seconds, metric values and the seconds per phase (:class:`ExtractionReport`) of one call; a fresh
    (cold) feature cache unless ``cache_dir`` is given."""
    cache_dir = cache_dir or scratch_dir("bench_cache_")
    opts = MetricsOptions(device=device, batch_size=batch, extractor_options=weights, lpips_trunk="random",
                          cache_dir=cache_dir, precision=precision)
    report = ExtractionReport()
    sync(device)
    t0 = time.perf_counter()
    result = compute_metrics(s, metrics, ref, opts, report=report)
    sync(device)
    return time.perf_counter() - t0, result.metrics, report.seconds


def run_torchmetrics(s: Path, ref: Path, device: str, weights: dict, batch: int) -> tuple[float, float]:
    """torchmetrics FID ``update`` per batch, PIL decode in the loop, our Inception + clean resize as feature."""
    from torchmetrics.image.fid import FrechetInceptionDistance

    from pcpo_eval.features.inception import InceptionExtractor

    ext = InceptionExtractor(weights["inception"]["weights_path"], device=device)

    class Feature(torch.nn.Module):
        def forward(self, x: torch.Tensor) -> torch.Tensor:
            return ext.extract(x.cpu())["features"].to(device).double()

    fid = FrechetInceptionDistance(feature=Feature(), normalize=False).to(device)
    sync(device)
    t0 = time.perf_counter()
    for root, real in ((ref, True), (s, False)):
        paths = sorted(root.glob("images/*/*.png"))
        for i in range(0, len(paths), batch):
            arr = np.stack([np.asarray(Image.open(p).convert("RGB")) for p in paths[i:i + batch]])
            fid.update(torch.from_numpy(arr).permute(0, 3, 1, 2).to(device), real=real)
    value = float(fid.compute())
    sync(device)
    return time.perf_counter() - t0, value


def decode_only(root: Path, batch: int) -> dict:
    """Images/s of the read path alone (read, SHA-256 check, PNG decode on the thread pool), and of the
    clean-fid resize to 299 on the same pool: the host's share of a metrics pass."""
    from pcpo_eval.features.base import clean_resize
    from pcpo_eval.imageset import ImageSet

    s = ImageSet.load(root)
    t0 = time.perf_counter()
    resize_s = 0.0
    for i in range(0, len(s), batch):
        x = s.read_batch(list(range(i, min(i + batch, len(s)))))
        t1 = time.perf_counter()
        clean_resize(x, 299)
        resize_s += time.perf_counter() - t1
    dt = time.perf_counter() - t0
    return {"images": len(s), "read_decode_img_s": len(s) / (dt - resize_s), "resize_299_img_s": len(s) / resize_s}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--images", type=int, default=1000, help="images per set (two sets)")
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=100)
    ap.add_argument("--metrics", default="fid;fid,fd_dinov2,is,lpips", help="';'-separated metric lists to time")
    ap.add_argument("--precision", default="fp32", choices=["fp32", "tf32"],
                    help="ours (metrics --precision) and torchmetrics' run alike (precision.matmul_precision)")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    if a.tiny:
        a.images, a.size, a.batch, a.metrics = 10, 64, 10, "fid,fd_dinov2,is,lpips"
    tmp = scratch_dir("bench_metrics_")
    t0 = time.perf_counter()
    s = write_set(tmp / "set", a.images, a.size, 0)
    ref = write_set(tmp / "ref", a.images, a.size, 10_000)
    weights = random_weights(tmp, a.tiny)
    res: dict = {"device": device_info(), "images_per_set": a.images, "size": a.size, "precision": a.precision,
                 "setup_s": time.perf_counter() - t0}
    n = 2 * a.images
    res["decode_only"] = decode_only(s, a.batch)
    print("decode", json.dumps(res["decode_only"]), flush=True)
    reset_peak(device)
    with matmul_precision(a.precision):  # the same kernels as ours (PyTorch's default would allow TF32 convs)
        t_tm, fid_tm = run_torchmetrics(s, ref, device, weights, a.batch)
    res["torchmetrics_fid"] = {"seconds": t_tm, "img_s": n / t_tm, "fid": fid_tm, "peak_gib": peak_gib(device)}
    print("torchmetrics", json.dumps(res["torchmetrics_fid"]), flush=True)
    for metrics in a.metrics.split(";"):
        reset_peak(device)
        cache = scratch_dir("bench_cache_")  # cold: nothing of either set cached
        t, overall, phases = run_ours(s, ref, metrics, device, weights, a.batch, a.precision, cache)
        res[f"ours_{metrics}"] = {"seconds": t, "img_s": n / t, "ratio_vs_torchmetrics_fid": (n / t) / (n / t_tm),
                                  "minutes_for_50k_per_set": t / n * 100_000 / 60, "peak_gib": peak_gib(device),
                                  "values": overall,
                                  "phase_seconds": {k: round(v, 3) for k, v in sorted(phases.items())}}
        print(metrics, json.dumps(res[f"ours_{metrics}"], default=str), flush=True)
    # the usual case after the first checkpoint: a new set against a reference whose features the cache holds
    s2 = write_set(tmp / "set2", a.images, a.size, 20_000)
    reset_peak(device)
    t, _, phases = run_ours(s2, ref, metrics, device, weights, a.batch, a.precision, cache)
    res[f"ours_{metrics}_cached_reference"] = {
        "seconds": t, "img_s": a.images / t, "minutes_for_50k_set": t / a.images * 50_000 / 60,
        "peak_gib": peak_gib(device), "phase_seconds": {k: round(v, 3) for k, v in sorted(phases.items())}}
    print(f"{metrics} (new set, cached reference)", json.dumps(res[f"ours_{metrics}_cached_reference"]), flush=True)
    if a.json:
        a.json.parent.mkdir(parents=True, exist_ok=True)
        a.json.write_text(json.dumps(res, indent=1, default=str))


if __name__ == "__main__":
    main()
