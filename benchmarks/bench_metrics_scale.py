"""The metrics pass at the scale researchers run it, on CPU: 2 sets of 50,000 images, per-image tables.

What grows with the number of images besides the networks: the manifest, the hash check, the decode
pool, the feature cache, per-prompt statistics over thousands of prompts, LPIPS pairs and the
per-image table. This runs the real ``pcpo-eval metrics`` library call
(:func:`pcpo_eval.metrics.workers.compute_metrics` + :func:`~pcpo_eval.metrics.workers.write_outputs`)
on the toy world's networks (32-px images, ``fd_toy,is_toy,lpips_toy``), so the networks are cheap
and what is timed is everything else. Two calls: cold (empty feature cache) and warm (the second call
of a study re-reads nothing but the hashes' stat keys). Reported per call: wall seconds, seconds per
phase (:class:`~pcpo_eval.metrics.extract.ExtractionReport`), images/s, peak resident memory and the
table sizes; and the per-image cost at ``--images`` vs at a tenth of it (linear scaling = equal).

The reference for the up-front hash check (:meth:`ImageSet.verify`) is the per-file thread-pool map it
replaced (one pool task per file, a real-path lookup for the verified-file key): both check the same
files in the same run, cold (nothing verified yet) and warm (every file verified before).

Usage::

    .venv/bin/python benchmarks/bench_metrics_scale.py [--images 50000] [--per-prompt 10] [--json out.json]
"""

from __future__ import annotations

import argparse
import hashlib
import io
import json
import os
import resource
import sys
import time
from concurrent.futures import ProcessPoolExecutor
from pathlib import Path

import numpy as np
import pandas as pd
from PIL import Image

import pcpo_eval.imageset as imageset
from pcpo_eval.imageset import ImageSet
from pcpo_eval.io import scratch_dir, sha256_file
from pcpo_eval.metrics.extract import ExtractionReport, MetricsOptions
from pcpo_eval.metrics.workers import compute_metrics, write_outputs

METRICS = "fd_toy,is_toy,lpips_toy"


def reference_verify(s: ImageSet, seen: set) -> None:
    """The previous hash check: one pool task per file, keyed by its real path (what ``verify`` replaced)."""
    from concurrent.futures import ThreadPoolExecutor

    def check(r: int) -> None:
        full = s.root / s.paths[r]
        st = full.stat()
        key = (os.path.realpath(full), st.st_size, st.st_mtime_ns, s.shas[r])
        if key in seen:
            return
        assert sha256_file(full) == s.shas[r]
        seen.add(key)

    with ThreadPoolExecutor(max_workers=min(16, os.cpu_count() or 1)) as pool:
        list(pool.map(check, range(len(s))))


def verify_ratio(roots: list[Path]) -> dict:
    """Seconds of the reference and of ``ImageSet.verify`` over both sets, cold then warm."""
    sets = [ImageSet.load(r) for r in roots]
    seen: set = set()
    out = {}
    for phase in ("cold", "warm"):
        if phase == "cold":
            imageset._VERIFIED.clear()
        t0 = time.perf_counter()
        for one in sets:
            reference_verify(one, seen)
        t_ref = time.perf_counter() - t0
        t0 = time.perf_counter()
        for one in sets:
            one.verify()
        t_ours = time.perf_counter() - t0
        out[phase] = {"reference_s": round(t_ref, 2), "ours_s": round(t_ours, 2), "ratio": round(t_ref / t_ours, 1)}
    return out


def _pngs(args: tuple[int, int, int]) -> list[bytes]:
    """``count`` smooth random 32-px PNGs from seed ``start`` (one task writes a chunk: less IPC)."""
    start, count, size = args
    out = []
    for k in range(start, start + count):
        rng = np.random.default_rng(k)
        small = rng.integers(0, 256, size=(4, 4, 3), dtype=np.uint8)
        buf = io.BytesIO()
        Image.fromarray(small).resize((size, size), Image.BICUBIC).save(buf, format="PNG")
        out.append(buf.getvalue())
    return out


def write_set(root: Path, n: int, per_prompt: int, seed0: int, size: int = 32) -> Path:
    """``n`` images, ``per_prompt`` seeds per prompt, in the generator's layout (manifest.parquet)."""
    chunk = 2000
    with ProcessPoolExecutor() as pool:
        blobs = [b for part in pool.map(_pngs, [(seed0 + i, min(chunk, n - i), size) for i in range(0, n, chunk)])
                 for b in part]
    rows = []
    for i, data in enumerate(blobs):
        pid, seed = i // per_prompt, seed0 + i
        rel = f"images/p{pid:05d}/s{seed:07d}.png"
        path = root / rel
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_bytes(data)
        rows.append({"prompt_id": pid, "prompt": f"prompt {pid}", "seed": seed, "path": rel,
                     "image_sha256": hashlib.sha256(data).hexdigest(), "model": "bench", "model_hash": "0" * 64})
    pd.DataFrame(rows).to_parquet(root / "manifest.parquet", index=False)
    (root / "set.json").write_text(json.dumps({"model": "bench", "size": size}))
    return root


def one_call(s: Path, ref: Path, cache: Path, batch: int) -> dict:
    """One ``compute_metrics`` call plus the written tables: seconds, phases, table sizes."""
    opts = MetricsOptions(device="cpu", batch_size=batch, cache_dir=cache)
    report = ExtractionReport()
    t0 = time.perf_counter()
    result = compute_metrics(s, METRICS, ref, opts, report=report)
    t_compute = time.perf_counter() - t0
    out = scratch_dir("bench_scale_out_")
    write_outputs(result, out)
    wall = time.perf_counter() - t0
    return {"seconds": round(wall, 2), "compute_s": round(t_compute, 2), "write_s": round(wall - t_compute, 2),
            "phase_seconds": {k: round(v, 2) for k, v in sorted(report.seconds.items())},
            "per_prompt_rows": len(result.per_prompt), "per_image_rows": len(result.per_image),
            "values": {k: round(v, 4) for k, v in result.metrics.items() if isinstance(v, float)}}


def measure(n: int, per_prompt: int, batch: int) -> dict:
    tmp = scratch_dir("bench_scale_")
    t0 = time.perf_counter()
    s = write_set(tmp / "set", n, per_prompt, 0)
    ref = write_set(tmp / "ref", n, per_prompt, 10_000_000)
    res: dict = {"images_per_set": n, "prompts": n // per_prompt, "setup_s": round(time.perf_counter() - t0, 1)}
    res["verify"] = verify_ratio([s, ref])
    print(n, "verify", json.dumps(res["verify"]), file=sys.stderr, flush=True)
    imageset._VERIFIED.clear()  # the metrics calls start cold
    cache = tmp / "cache"
    for name in ("cold", "warm"):
        res[name] = one_call(s, ref, cache, batch)
        res[name]["img_s"] = round(2 * n / res[name]["seconds"], 1)
        print(n, name, json.dumps(res[name]), file=sys.stderr, flush=True)
    res["peak_rss_gib"] = round(resource.getrusage(resource.RUSAGE_SELF).ru_maxrss / 2**20, 2)
    return res


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--images", type=int, default=50_000, help="images per set (two sets)")
    ap.add_argument("--per-prompt", type=int, default=10)
    ap.add_argument("--batch", type=int, default=256)
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    small = measure(a.images // 10, a.per_prompt, a.batch)
    large = measure(a.images, a.per_prompt, a.batch)
    res = {"small": small, "large": large,
           "cold_cost_ratio_per_image": round(large["cold"]["seconds"] / small["cold"]["seconds"] / 10, 3),
           "warm_cost_ratio_per_image": round(large["warm"]["seconds"] / small["warm"]["seconds"] / 10, 3)}
    print_section(res, a.per_prompt)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


def print_section(res: dict, per_prompt: int) -> None:
    """The markdown section ``make bench`` collects."""
    n = res["large"]["images_per_set"]
    print(f"## Metrics pass at scale on CPU (2 x {n:,} toy images of 32 px, {per_prompt} per prompt, "
          f"{METRICS})\n")
    hashes, calls = [], []
    for size in ("small", "large"):
        m = res[size]["images_per_set"]
        for phase in ("cold", "warm"):
            v, c = res[size]["verify"][phase], res[size][phase]
            hashes.append(f"| {2 * m:,} files, {phase} | {v['reference_s']} | {v['ours_s']} | {v['ratio']}x |")
            phases = ", ".join(f"{k} {t}" for k, t in c["phase_seconds"].items())
            calls.append(f"| 2 x {m:,}, {phase} | {c['img_s']:,.0f} | {c['seconds']} | {phases} |")
    print("| hash check of both sets | per-file pool tasks, real-path key (s) | ours (s) | speed-up |\n|---|---|---|---|")
    print("\n".join(hashes))
    print("\n| call | images/s | seconds | seconds per phase |\n|---|---|---|---|")
    print("\n".join(calls))
    print(f"\nPer-image cost at {n:,} over {n // 10:,} per set: cold {res['cold_cost_ratio_per_image']}, "
          f"warm {res['warm_cost_ratio_per_image']} (1.0 = linear). Per-image table {res['large']['cold']['per_image_rows']:,} "
          f"rows, per-prompt table {res['large']['cold']['per_prompt_rows']:,}; peak resident memory "
          f"{res['large']['peak_rss_gib']} GiB.")


if __name__ == "__main__":
    main()
