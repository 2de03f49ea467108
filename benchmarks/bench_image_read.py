"""Benchmark of the metrics' image read path: ``ImageSet.read_batch`` vs the PIL path it replaced.

Every metric pass reads, hash-checks and decodes each PNG once (``pcpo_eval.imageset``). Both paths
decode with PIL on the same thread pool; ours writes each image channels-first into its slot of the
batch inside the pool's task, the reference (the previous path, and the usual loop of clean-fid /
torchmetrics users) returns per-image arrays that the calling thread then ``np.stack``s and copies
channels-first: a serial pass over every byte of the batch. Both hash every file (the per-process
verified cache is cleared before each timing) and give the same pixels (checked here). The serial
share grows with the pool (Amdahl): this machine's ratio understates a 16-core machine's.

Best of 3 passes over the set, on the shared decode pool (``pcpo_eval.io.parallel_map``: one thread
per core, at most 16).

Usage::

    .venv/bin/python benchmarks/bench_image_read.py [--images 256] [--size 512] [--batch 64]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import time
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image

import pcpo_eval.imageset as imageset
from pcpo_eval.io import parallel_map, scratch_dir


def write_set(root: Path, n: int, size: int) -> imageset.ImageSet:
    """``n`` smooth random ``size``-px PNGs (low-frequency noise upsampled: compresses like a render)."""
    rows = []
    for i in range(n):
        rng = np.random.default_rng(i)
        small = rng.integers(0, 256, size=(size // 16, size // 16, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((size, size), Image.BICUBIC).save(buf, format="PNG")
        rel = f"images/p{i % 10:05d}/s{i:07d}.png"
        (root / rel).parent.mkdir(parents=True, exist_ok=True)
        (root / rel).write_bytes(buf.getvalue())
        rows.append({"prompt_id": i % 10, "prompt": f"prompt {i % 10}", "seed": i, "path": rel,
                     "image_sha256": hashlib.sha256(buf.getvalue()).hexdigest()})
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    return imageset.ImageSet.load(root)


def pil_batch(s: imageset.ImageSet, rows: list[int]) -> torch.Tensor:
    """The reference: per image read + SHA-256 + PIL decode on the pool, then stack + channels-first."""

    def one(r: int) -> np.ndarray:
        data = (s.root / s.paths[r]).read_bytes()
        assert hashlib.sha256(data).hexdigest() == s.shas[r]
        with Image.open(io.BytesIO(data)) as im:
            im.load()
            return np.asarray(im, dtype=np.uint8)

    return torch.from_numpy(np.stack(parallel_map(one, rows))).permute(0, 3, 1, 2).contiguous()


def seconds(fn, s: imageset.ImageSet, batch: int, repeat: int = 3) -> float:
    """Best of ``repeat`` passes over the set in batches."""
    best = float("inf")
    for _ in range(repeat):
        imageset._VERIFIED.clear()  # hash every file, as a first pass does
        t0 = time.perf_counter()
        for i in range(0, len(s), batch):
            fn(s, list(range(i, min(i + batch, len(s)))))
        best = min(best, time.perf_counter() - t0)
    return best


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--images", type=int, default=256)
    ap.add_argument("--size", type=int, default=512)
    ap.add_argument("--batch", type=int, default=64)
    a = ap.parse_args()
    s = write_set(scratch_dir("bench_read_"), a.images, a.size)
    rows = list(range(min(a.batch, len(s))))
    assert torch.equal(s.read_batch(rows), pil_batch(s, rows)), "the two paths' pixels differ"
    ours = lambda s_, r: s_.read_batch(r)  # noqa: E731
    t_ref, t_ours = seconds(pil_batch, s, a.batch), seconds(ours, s, a.batch)
    res = {"ref_img_s": len(s) / t_ref, "ours_img_s": len(s) / t_ours, "ratio": t_ref / t_ours,
           "pool_threads": min(16, os.cpu_count() or 1)}
    print(f"## Image read path ({a.images} PNGs of {a.size} px, batches of {a.batch}, "
          f"{res['pool_threads']} pool threads)\n")
    print("| PIL, stacked after (img/s) | ours, PIL into the batch on the pool (img/s) | speed-up |")
    print("|---|---|---|")
    print(f"| {res['ref_img_s']:.0f} | {res['ours_img_s']:.0f} | {res['ratio']:.2f}x |")
    print("\n" + json.dumps(res))


if __name__ == "__main__":
    main()
