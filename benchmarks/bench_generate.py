"""Benchmark: ``generate_set`` images/s vs a plain diffusers-style sampling loop.

Both render the same prompts x seeds with the same model, batch size, steps, CFG and eta:

- reference: diffusers' ``DDIMScheduler`` (``set_timesteps`` + ``step(..., eta, generator=[...])``)
  around the adapter's guided ``predict`` (one 2B call per step), ``decode``, then
  ``PIL.Image.save`` of each PNG (no metadata, no hashing, no atomic rename);
- ours: :func:`pcpo_eval.generate.runner.generate_set` (fixed micro-batches, per-(prompt, seed)
  generators, PNG text metadata, atomic writes, hashes, manifest, set.json).

The runs alternate (ref, ours, ref, ours, ...) and the median images/s of each is reported, so
load from other processes on the shared machine hits both alike. Run:
``.venv/bin/python benchmarks/bench_generate.py [--model toy] [--repeats 3]``.
"""

from __future__ import annotations

import argparse
import shutil
import statistics
import sys
import tempfile
import time
from pathlib import Path

import torch

ROOT = Path(__file__).resolve().parents[1]


def load_bench_model(spec: str):
    """The toy model from the registry; the tests' stand-in UNet if the registry is not built."""
    if spec == "standin":
        sys.path.insert(0, str(ROOT))
        from tests.support.generate import StandInAdapter

        return StandInAdapter(), "stand-in tiny UNet (tests/support/generate.py)"
    from pcpo_eval.generate.loading import load_generation_model

    return load_generation_model(spec), spec


def reference_loop(adapter, items, out: Path, batch_size: int, steps: int, cfg: float, eta: float) -> float:
    """Plain diffusers-style loop; returns seconds."""
    from diffusers import DDIMScheduler
    from diffusers.utils.torch_utils import randn_tensor
    from PIL import Image

    from pcpo_eval.seeding import sample_generator

    cfg_dict = {k: v for k, v in adapter.scheduler_config.items() if not k.startswith("_")}
    sched = DDIMScheduler.from_config(cfg_dict)
    sched.set_timesteps(steps)
    t0 = time.perf_counter()
    with torch.inference_mode():
        for s in range(0, len(items), batch_size):
            batch = items[s : s + batch_size]
            gens = [sample_generator(it.prompt_id, it.seed) for it in batch]
            x = randn_tensor((len(batch), *adapter.latent_shape), generator=gens, dtype=torch.float32)
            cond = adapter.encode_prompts([it.prompt for it in batch])
            uncond = adapter.encode_prompts([""] * len(batch))
            for t in sched.timesteps:
                eps = adapter.predict(x, torch.full((len(batch),), int(t)), cond, uncond, cfg)
                x = sched.step(eps, t, x, eta=eta, generator=gens).prev_sample
            images = adapter.decode(x).cpu().numpy()
            for it, img in zip(batch, images, strict=True):
                p = out / it.rel_path
                p.parent.mkdir(parents=True, exist_ok=True)
                Image.fromarray(img.transpose(1, 2, 0)).save(p)
    return time.perf_counter() - t0


def max_pixel_diff(ref: Path, ours: Path, items) -> int:
    """Largest |pixel difference| between the two renderings (same noise, same DDIM maths)."""
    import numpy as np
    from PIL import Image

    worst = 0
    for it in items:
        a = np.asarray(Image.open(ref / it.rel_path), dtype=np.int16)
        b = np.asarray(Image.open(ours / it.rel_path).convert("RGB"), dtype=np.int16)
        worst = max(worst, int(np.abs(a - b).max()))
    return worst


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.splitlines()[0])
    ap.add_argument("--model", default="toy", help="model spec, or 'standin' (falls back to it if toy is missing)")
    ap.add_argument("--prompts", type=int, default=45)
    ap.add_argument("--seeds", type=int, default=12)
    ap.add_argument("--batch-size", type=int, nargs="+", default=[8, 37])
    ap.add_argument("--steps", type=int, default=20)
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--threads", type=int, default=1)
    args = ap.parse_args()
    torch.set_num_threads(args.threads)

    from pcpo_eval.errors import UserError
    from pcpo_eval.generate.fixed_batch import auto_micro_batch, effective_batch_size
    from pcpo_eval.generate.plan import plan_items
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.prompts import PromptSet, toy_prompts

    try:
        adapter, model_desc = load_bench_model(args.model)
    except (UserError, ImportError) as exc:
        print(f"(model {args.model!r} unavailable: {exc}; using the stand-in)", file=sys.stderr)
        adapter, model_desc = load_bench_model("standin")
    toy = toy_prompts()
    ps = PromptSet("bench", toy.prompt_ids[: args.prompts], toy.prompts[: args.prompts])
    items = plan_items(ps, list(range(args.seeds)))
    n = len(items)
    cfg, eta = 5.0, 1.0
    micro = auto_micro_batch(adapter.latent_shape)

    rows = []
    for bs in args.batch_size:
        ref_ips, our_ips = [], []
        for _ in range(args.repeats):
            with tempfile.TemporaryDirectory(prefix="bench_gen_") as tmp:
                ref_ips.append(n / reference_loop(adapter, items, Path(tmp) / "ref", bs, args.steps, cfg, eta))
                out = Path(tmp) / "ours"
                t0 = time.perf_counter()
                generate_set(
                    adapter, ps, args.seeds, out, batch_size=bs, steps=args.steps, cfg=cfg, eta=eta,
                    progress=False, model_name=model_desc,
                )  # fmt: skip
                our_ips.append(n / (time.perf_counter() - t0))
                diff = max_pixel_diff(Path(tmp) / "ref", out, items)
                shutil.rmtree(out, ignore_errors=True)
        r, o = statistics.median(ref_ips), statistics.median(our_ips)
        rows.append((bs, effective_batch_size(bs, micro, cfg), r, o, o / r, diff))

    print("## Generator throughput (generate_set vs plain diffusers-style loop)\n")
    print(
        f"Model: {model_desc}, latent {tuple(adapter.latent_shape)}; {n} images ({args.prompts} prompts x "
        f"{args.seeds} seeds), DDIM {args.steps} steps, CFG {cfg}, eta {eta}, micro-batch {micro} rows (auto), "
        f"{args.threads} torch thread(s), median of {args.repeats} alternating runs. Ours includes PNG "
        "metadata, atomic writes, hashing, manifest and set.json; the reference only saves PNGs.\n"
    )
    print(
        "| batch size | generate_set items per call | reference img/s | generate_set img/s | ratio "
        "| max pixel diff vs reference |"
    )
    print("|---:|---:|---:|---:|---:|---:|")
    for bs, eff, r, o, q, d in rows:
        print(f"| {bs} | {eff} | {r:.2f} | {o:.2f} | {q:.3f} | {d} |")


if __name__ == "__main__":
    main()
