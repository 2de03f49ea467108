"""GPU benchmark: ``generate_set`` vs a plain diffusers ``StableDiffusionPipeline`` call, SD-1.5 sizes.

Both render the same prompts x seeds with the same random-weight SD-1.5 (``models.py``), DDIM
scheduler, steps, CFG, eta, batch and dtype, in one process, alternating (ref, ours, ref, ours);
the median images/s of each is reported with peak GPU memory and achieved TFLOP/s (FLOPs per image
counted by ``FlopCounterMode``: steps x 2 CFG rows x UNet row + VAE decode). Ours also writes the
PNGs (background thread), hashes and manifest; the pipeline returns arrays only.

``--invariance`` measures what bit-identity means on this device: the UNet output of one row at
micro-batches 1..64 against micro-batch 16, repeat runs of one shape, and whole images rendered at
micro-batch 16 vs 64 (max / mean pixel difference). ``--variants`` times channels-last,
``torch.compile``, forced attention backends (``attn_math``, ``attn_flash``, ``attn_efficient``,
``attn_cudnn``: ``--attention``) and cuDNN's convolution autotuner (``cudnn_benchmark``:
``torch.backends.cudnn.benchmark``, off by default in PyTorch; it picks each convolution shape's
fastest algorithm by timing, which may differ from run to run) and larger calls (``batch32``: 32 images,
up to 64 UNet rows per call, where the default's batch 16 caps the memory-chosen micro-batch at 32)
against the default; whole-set seconds, per-set costs included (``phase_seconds`` apportions them).

The JSON (``--json``) is rewritten after each measurement (the default's block, each variant, each
invariance block) with ``"complete": false`` until the end, so a run stopped by a time limit keeps what
it measured; each variant prints one line, ``variant NAME ok {...}`` or ``variant NAME error {...}``.

``--tiny`` runs everything on the tests' tiny SD-1.x on CPU in seconds (CI runs it so the script
never rots). Usage::

    python benchmarks/gpu/bench_generate.py --images 96 --batch 16 --json $OUT/generate.json
    python benchmarks/gpu/bench_generate.py --tiny
"""

from __future__ import annotations

import argparse
import json
import os
import shutil
import statistics
import sys
import time
from pathlib import Path

import numpy as np
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import (  # noqa: E402
    device_info,
    peak_gib,
    reset_peak,
    sd15_pipeline,
    sync,
    unet_flops_per_row,
    write_profile,
)

from pcpo_eval.generate.runner import generate_set  # noqa: E402
from pcpo_eval.io import scratch_dir  # noqa: E402
from pcpo_eval.models.sd1 import SD1Adapter  # noqa: E402
from pcpo_eval.precision import matmul_precision, precision_dtype  # noqa: E402
from pcpo_eval.prompts import load_prompts  # noqa: E402


def flops_per_image(pipe, steps: int, cfg: float) -> float:
    """UNet rows (2 per step with CFG) plus one VAE decode, in FLOPs."""
    from torch.utils.flop_counter import FlopCounterMode

    rows = steps * (2 if cfg != 1.0 else 1)
    unet = unet_flops_per_row(pipe.unet, pipe.unet.config.cross_attention_dim)
    p = next(pipe.vae.parameters())
    s = pipe.unet.config.sample_size
    with torch.inference_mode(), FlopCounterMode(display=False) as c:
        pipe.vae.decode(torch.zeros(1, 4, s, s, device=p.device, dtype=p.dtype))
    return rows * unet + float(c.get_total_flops())


def run_reference(pipe, prompts: list[str], seeds: list[int], batch: int, steps: int, cfg: float, eta: float,
                  device: str) -> float:
    """Seconds for a plain pipeline call per batch (arrays out, nothing written)."""
    pairs = [(p, s) for p in prompts for s in seeds]
    sync(device)
    t0 = time.perf_counter()
    for i in range(0, len(pairs), batch):
        chunk = pairs[i:i + batch]
        gens = [torch.Generator(device).manual_seed(s) for _, s in chunk]
        pipe([p for p, _ in chunk], num_inference_steps=steps, guidance_scale=cfg, eta=eta, generator=gens,
             output_type="np")
    sync(device)
    return time.perf_counter() - t0


def run_ours(adapter, prompts: list[str], seeds: list[int], batch: int, steps: int, cfg: float, eta: float,
             device: str, precision: str, **kw) -> tuple[float, dict]:
    """Seconds for ``generate_set`` into a fresh temp dir (PNGs, hashes, manifest); its settings."""
    from pcpo_eval.prompts import PromptSet

    out = scratch_dir("bench_gen_") / "set"
    sync(device)
    t0 = time.perf_counter()
    summary = generate_set(adapter, PromptSet("bench", tuple(range(len(prompts))), tuple(prompts)), seeds, out, batch_size=batch, steps=steps, cfg=cfg,
                           eta=eta, device=device, precision=precision, progress=False, **kw)
    sync(device)
    dt = time.perf_counter() - t0
    settings = {"micro_batch": summary.settings.micro_batch, "batch_invariance": summary.settings.batch_invariance,
                "precision": summary.settings.precision,
                "phase_seconds": {k: round(v, 4) for k, v in summary.phase_seconds.items()}}  # the per-set costs
    shutil.rmtree(out.parent, ignore_errors=True)
    return dt, settings


def profile_ours(adapter, prompts, seeds, a, device: str, path: Path) -> dict:
    """One batch of ``generate_set`` under ``torch.profiler``: device-busy fraction and top-op tables."""
    from torch.profiler import ProfilerActivity, profile

    acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if device == "cuda" else [])
    with profile(activities=acts) as prof:
        wall, _ = run_ours(adapter, prompts, seeds, a.batch, a.steps, a.cfg, 1.0, device, a.precision)
    return write_profile(prof, wall, path, f"generate_set, {len(prompts) * len(seeds)} images (profiled)")


def unet_invariance(pipe, device: str, rows_list=(1, 2, 8, 16, 64)) -> dict:
    """Max |eps(row 0 at micro-batch m) - eps(row 0 at 16)| for each m, and repeat-run bitwise equality."""
    unet = pipe.unet
    p = next(unet.parameters())
    c, s = unet.config.in_channels, unet.config.sample_size
    g = torch.Generator("cpu").manual_seed(0)
    x = torch.randn(max(rows_list), c, s, s, generator=g).to(device, p.dtype)
    h = torch.randn(max(rows_list), 77, unet.config.cross_attention_dim, generator=g).to(device, p.dtype)
    t = torch.full((max(rows_list),), 500, device=device)
    out = {}
    with torch.inference_mode():
        ref = unet(x[:16], t[:16], encoder_hidden_states=h[:16]).sample[0].float()
        again = unet(x[:16], t[:16], encoder_hidden_states=h[:16]).sample[0].float()
        out["repeat_same_shape_bitwise"] = bool(torch.equal(ref, again))
        for m in rows_list:
            e = unet(x[:m], t[:m], encoder_hidden_states=h[:m]).sample[0].float()
            out[f"max_abs_vs_16_at_{m}"] = float((e - ref).abs().max())
        out["eps_rms"] = float(ref.pow(2).mean().sqrt())
    return out


def image_invariance(adapter, prompts, device: str, precision: str, steps: int, cfg: float) -> dict:
    """The same 8 images at fixed micro-batch 16 and 64: pixel differences (uint8 units)."""
    from pcpo_eval.generate.png import read_png_pixels
    from pcpo_eval.prompts import PromptSet

    root = scratch_dir("bench_inv_")
    sets = {}
    for m in (16, 64, 16):
        out = root / f"m{m}_{len(sets)}"
        generate_set(adapter, PromptSet("inv", (0, 1), tuple(prompts[:2])), 4, out, batch_size=8, steps=steps, cfg=cfg, eta=1.0,
                     device=device, precision=precision, micro_batch=m, progress=False)
        sets[out.name] = np.stack([read_png_pixels(f) for f in sorted(out.glob("images/*/*.png"))]).astype(np.int16)
    a, b, a2 = sets.values()
    d = np.abs(a - b)
    shutil.rmtree(root, ignore_errors=True)
    return {"steps": steps, "images": int(a.shape[0]), "max_pixel_diff_16_vs_64": int(d.max()),
            "mean_pixel_diff_16_vs_64": float(d.mean()), "pixels_differing_pct": float(100 * (d > 0).mean()),
            "repeat_m16_bitwise": bool(np.array_equal(a, a2))}


def save(res: dict, path: Path | None) -> None:
    """Write ``res`` to ``path`` (if given) whole or not at all: a temp file renamed over the old one, so a
    run killed at its time limit leaves the last complete JSON."""
    if path is None:
        return
    path.parent.mkdir(parents=True, exist_ok=True)
    tmp = path.with_name(path.name + ".part")
    tmp.write_text(json.dumps(res, indent=1))
    os.replace(tmp, path)


def run_variant(v: str, adapter, prompts, seeds, a, device: str, n: int, our_ips: float) -> dict:
    """Time variant ``v`` after one untimed warm-up run (compile / convert / probe outside the timing); any
    failure is the variant's result (``{"error": ...}``), so the other variants still run."""
    kw = {"channels_last": v in ("channels_last", "compile+channels_last"), "compile": "compile" in v,
          "attention": v.removeprefix("attn_") if v.startswith("attn_") else "auto"}
    batch = int(v.removeprefix("batch")) if v.startswith("batch") else a.batch  # batchN: N images per call
    torch.backends.cudnn.benchmark = v == "cudnn_benchmark"
    try:
        run_ours(adapter, prompts[:1], seeds[:min(len(seeds), batch)], batch, a.steps, a.cfg, 1.0, device,
                 a.precision, **kw)
        t, settings = run_ours(adapter, prompts, seeds, batch, a.steps, a.cfg, 1.0, device, a.precision, **kw)
        return {"img_s": n / t, "ratio_vs_eager": (n / t) / our_ips, "seconds": t, "batch": batch,
                "micro_batch": settings["micro_batch"], "phase_seconds": settings["phase_seconds"]}
    except Exception as exc:  # a backend this GPU / shape lacks (one error line), or anything else: say so
        first = (str(exc).splitlines() or [""])[0]
        return {"error": f"{type(exc).__name__}: {first}"[:400]}
    finally:
        torch.backends.cudnn.benchmark = False
        adapter.denoiser = getattr(adapter.denoiser, "_orig_mod", adapter.denoiser)
        adapter.denoiser.to(memory_format=torch.contiguous_format)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="tiny random SD-1.x on CPU (CI)")
    ap.add_argument("--images", type=int, default=64)
    ap.add_argument("--batch", type=int, default=16)
    ap.add_argument("--steps", type=int, default=50)
    ap.add_argument("--cfg", type=float, default=5.0)
    ap.add_argument("--precision", default="bf16", choices=["fp32", "tf32", "bf16", "fp16"])
    ap.add_argument("--repeats", type=int, default=2)
    ap.add_argument("--variants", default="", help="comma list of channels_last, compile, compile+channels_last, attn_<backend>, cudnn_benchmark, "
                    "batch<N> (N images per call: up to 2N rows per denoiser call with CFG) "
                    "(timed after the default)")
    ap.add_argument("--invariance", action="store_true")
    ap.add_argument("--profile", type=Path, default=None, help="torch.profiler tables of one batch of ours here")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    if a.tiny:
        a.images, a.batch, a.steps, a.repeats = min(a.images, 8), min(a.batch, 4), min(a.steps, 4), 1
        a.precision = "fp32"
    dtype = precision_dtype(a.precision)
    res: dict = {"device": device_info(), "args": {k: str(v) for k, v in vars(a).items()}, "complete": False}
    with matmul_precision(a.precision):
        pipe = sd15_pipeline(a.tiny, device, dtype)
        adapter = SD1Adapter(pipe, source="random-weights SD-1.5" if not a.tiny else "tiny")
        flops = flops_per_image(pipe, a.steps, a.cfg)
        names = list(load_prompts("simple_animals").prompts)
        n_prompts = max(1, a.images // 4)
        prompts, seeds = names[:n_prompts], list(range(a.images // n_prompts))
        n = len(prompts) * len(seeds)
        # warm-up (cuDNN autotune, allocator), then alternate
        run_reference(pipe, prompts[:1], seeds[:min(len(seeds), a.batch)], a.batch, a.steps, a.cfg, 1.0, device)
        run_ours(adapter, prompts[:1], seeds[:min(len(seeds), a.batch)], a.batch, a.steps, a.cfg, 1.0, device,
                 a.precision)
        ref_t, our_t, ref_small, our_small = [], [], [], []
        small_seeds = seeds[:max(1, a.batch // len(prompts))] if len(prompts) < a.batch else seeds[:1]
        small_prompts = prompts if len(prompts) < a.batch else prompts[:a.batch]
        n_small = len(small_prompts) * len(small_seeds)
        reset_peak(device)
        def say(what: str, images: int, seconds: float) -> None:  # each number as soon as it exists
            print(f"{what}: {images} images in {seconds:.2f} s = {images / seconds:.3f} img/s", flush=True)

        for _ in range(a.repeats):
            ref_t.append(run_reference(pipe, prompts, seeds, a.batch, a.steps, a.cfg, 1.0, device))
            ref_peak = peak_gib(device)
            say("diffusers", n, ref_t[-1])
            ref_small.append(run_reference(pipe, small_prompts, small_seeds, a.batch, a.steps, a.cfg, 1.0, device))
            say("diffusers", n_small, ref_small[-1])
            reset_peak(device)
            t, settings = run_ours(adapter, prompts, seeds, a.batch, a.steps, a.cfg, 1.0, device, a.precision)
            our_t.append(t)
            our_peak = peak_gib(device)
            say("ours", n, t)
            our_small.append(run_ours(adapter, small_prompts, small_seeds, a.batch, a.steps, a.cfg, 1.0, device,
                                      a.precision)[0])
            say("ours", n_small, our_small[-1])
            reset_peak(device)
        med = statistics.median
        ref_ips, our_ips = n / med(ref_t), n / med(our_t)
        # steady state: the images beyond the first batch over the seconds beyond it (a 50,000-image set's
        # rate); what remains is the per-set cost (model hash, micro-batch probe, set files, last PNGs)
        ref_m, our_m = (n - n_small) / (med(ref_t) - med(ref_small)), (n - n_small) / (med(our_t) - med(our_small))
        res["generate"] = {
            "images": n, "flops_per_image_T": flops / 1e12, "limit_img_s_at_800TF": 800e12 / flops,
            "diffusers_img_s": ref_ips, "ours_img_s": our_ips, "ratio_ours_over_diffusers": our_ips / ref_ips,
            "diffusers_steady_img_s": ref_m, "ours_steady_img_s": our_m, "steady_ratio": our_m / ref_m,
            "ours_steady_fraction_of_limit": our_m * flops / 800e12,
            "per_set_overhead_s_ours": med(our_t) - n / our_m, "per_set_overhead_s_diffusers": med(ref_t) - n / ref_m,
            "ours_TFLOPs": our_m * flops / 1e12, "diffusers_TFLOPs": ref_m * flops / 1e12,
            "peak_gib_diffusers": ref_peak, "peak_gib_ours": our_peak, "ours_settings": settings,
            "seconds_ref": ref_t, "seconds_ours": our_t, "small_images": n_small, "seconds_ref_small": ref_small,
            "seconds_ours_small": our_small,
        }
        if a.profile:
            res["profile"] = profile_ours(adapter, small_prompts, small_seeds, a, device, a.profile)
        print(json.dumps(res["generate"], indent=1), flush=True)
        save(res, a.json)
        for v in [v for v in a.variants.split(",") if v]:
            res[f"variant_{v}"] = r = run_variant(v, adapter, prompts, seeds, a, device, n, our_ips)
            print(f"variant {v} {'error' if 'error' in r else 'ok'} {json.dumps(r)}", flush=True)
            save(res, a.json)
        if a.invariance:
            res["unet_invariance"] = unet_invariance(pipe, device)
            print("unet", json.dumps(res["unet_invariance"]), flush=True)
            save(res, a.json)
            res["image_invariance"] = image_invariance(adapter, prompts, device, a.precision,
                                                       min(a.steps, 20), a.cfg)
            print("images", json.dumps(res["image_invariance"]), flush=True)
    res["complete"] = True
    save(res, a.json)


if __name__ == "__main__":
    main()
