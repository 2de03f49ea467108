"""The disk a study writes and the GPU-hours it needs, from its spec alone (``pcpo-eval study SPEC --plan``).

Every constant used is here, with its source. Sizes come from parameter counts (not measured on disk);
times only from GPU measurements made in this project (``benchmarks/gpu/``); a setup without a
measured figure prints "not measured" rather than an invented number.
"""

from __future__ import annotations

import contextlib
from typing import Any

from pcpo_eval.models.registry import FAMILY_SIZES

#: PNG bytes per pixel of a generated RGB image (an assumption for photographic content: ~390 KB at 512 px)
PNG_BYTES_PER_PIXEL = 1.5
#: bytes per parameter: checkpoint weights (fp32 safetensors), AdamW state (two fp32 moments);
#: a LoRA run's training_state.pt also repeats its LoRA weights (peft_state)
WEIGHT_BYTES, ADAM_BYTES = 4, 8

#: GPU seconds per *training image* (sampling + training), measured on one H200 by
#: benchmarks/gpu/bench_train.py with the default (fast) kernels, scaled linearly in images: one SD-1.5 LoRA
#: setup-2 epoch of 8 images took 20.25 s for ppo_clip and 21.07 s for pcpo, one epoch each on the same
#: machine (third GPU session, 2026-11-27; docs/gpu.md). The pair comes from one machine so that the plan's
#: PCPO / DDPO ratio is the measured one (the same ppo_clip epoch took 16.96 s on another H200 the day
#: before: the spread between machines). Only the (model kind, LoRA, objective) listed here was measured,
#: with the benchmark's weight-free reward (:data:`MEASURED_REWARDS`)
TRAIN_S_PER_IMAGE = {("sd1", True, "ppo_clip"): 20.25 / 8, ("sd1", True, "pcpo"): 21.07 / 8}
#: rewards whose scoring the training figures include: the benchmark's weight-free JPEG rewards. Another
#: reward's scoring (a preference model, setups 3-4's captioner) comes on top and is named as not included
MEASURED_REWARDS = ("jpeg_compressibility", "jpeg_incompressibility")
#: ``deterministic: true`` kernels: 24.19 s vs 16.96 s per setup-2 epoch, one warm H200 (docs/gpu.md)
DETERMINISTIC_SLOWDOWN = 24.19 / 16.96
#: generated images per second, SD-1.5 512 px, 50 steps, CFG, bf16 (benchmarks/gpu/bench_generate.py,
#: H200, steady state): 3.32 (pcpo-eval) to 3.34 (the diffusers pipeline); the range gives the GPU-hours range
GENERATE_IMG_S = {"sd1": (3.32, 3.34)}
GPU_SOURCE = "H200 measurements, benchmarks/gpu/ (scaled linearly in images)"


def _kind(model: str) -> str:
    return str(model).split(":", 1)[0]


def _toy_params(model: str, lora_rank: int) -> tuple[int, int, int]:
    """(denoiser parameters, trainable parameters, image side) of the toy model, counted on the model itself."""
    from pcpo_eval.models.registry import load_model

    adapter = load_model(model)
    total = sum(p.numel() for p in adapter.denoiser.parameters())
    import torch

    with torch.no_grad():
        side = int(adapter.decode(torch.zeros(1, *adapter.latent_shape)).shape[-1])
    if lora_rank <= 0:
        return total, total, side
    adapter.add_lora(lora_rank, float(lora_rank))
    return total, sum(p.numel() for p in adapter.trainable_parameters()), side


def model_size(model: str, lora_rank: int) -> dict[str, Any]:
    """Parameter counts of a run's model: ``params``, ``trainable`` (None: not known), ``side`` (pixels)."""
    kind = _kind(model)
    if kind in FAMILY_SIZES:
        fam = FAMILY_SIZES[kind]
        per = fam.lora_params_per_rank
        trainable = fam.params if lora_rank <= 0 else (per * lora_rank if per else None)
        return {"kind": kind, "params": fam.params, "trainable": trainable, "side": fam.resolution}
    try:
        total, trainable, side = _toy_params(model, lora_rank)
    except Exception:  # noqa: BLE001 - an unknown or unloadable kind is reported as not known
        return {"kind": kind, "params": None, "trainable": None, "side": None}
    return {"kind": kind, "params": total, "trainable": trainable, "side": side}


def checkpoint_bytes(size: dict[str, Any], lora: bool) -> tuple[int | None, int | None]:
    """(weights bytes of one checkpoint, training-state bytes of the newest one), None where unknown."""
    if size["trainable"] is None:
        return None, None
    weights = WEIGHT_BYTES * size["trainable"]
    state = ADAM_BYTES * size["trainable"] + (WEIGHT_BYTES * size["trainable"] if lora else 0)
    return weights, state


def gb(n: float) -> str:
    """Bytes as text: GB from 1 GB, MB from 1 MB, else KB."""
    return f"{n / 1e9:,.1f} GB" if n >= 1e9 else f"{n / 1e6:,.1f} MB" if n >= 1e6 else f"{n / 1e3:,.1f} KB"


def _n_images(prompts: str, max_prompts: int | None, seeds: str) -> int | None:
    """Images of one set (prompts x seeds), None when the prompt set is not available here."""
    from pcpo_eval.generate.plan import parse_seeds
    from pcpo_eval.prompts import load_prompts

    n_seeds = len(parse_seeds(seeds))
    with contextlib.suppress(Exception):
        return len(load_prompts(prompts, limit=max_prompts)) * n_seeds
    return int(max_prompts) * n_seeds if max_prompts else None


def _checkpoint_lines(sp: Any) -> tuple[list[str], float | None]:
    """Lines and total bytes of the trained runs' checkpoints (kept ones; training state in the newest only)."""
    from pcpo_eval.study.retention import kept_epochs, saved_epochs

    trained = [r for r in sp.runs if r.train is not None]
    if not trained:
        return ["    checkpoints: none trained by this study (existing run directories)"], 0.0
    total, lines, sizes = 0.0, [], {}
    for r in trained:
        key = (r.train.model, int(r.train.lora_rank))
        sizes.setdefault(key, model_size(*key))
        w, s = checkpoint_bytes(sizes[key], r.train.lora_rank > 0)
        if w is None or s is None:
            lines.append(f"    checkpoints: {r.train.model} with lora_rank {r.train.lora_rank}: parameter count not "
                         "known here, not estimated")
            return lines, None
        total += len(kept_epochs(r.train)) * w + s
    r0 = trained[0].train
    size = sizes[(r0.model, int(r0.lora_rank))]
    w, s = checkpoint_bytes(size, r0.lora_rank > 0)
    what = (f"LoRA rank {r0.lora_rank}, {size['trainable']:,} params" if r0.lora_rank > 0
            else f"full weights, {size['params']:,} params")
    kept, saved = len(kept_epochs(r0)), len(saved_epochs(r0))
    lines.append(f"    checkpoints: {len(trained)} runs x {kept} kept of {saved} saved (keep_checkpoints="
                 f"{r0.keep_checkpoints}) x {gb(w or 0)} weights ({_kind(r0.model)}, {what}, fp32) + {gb(s or 0)} "
                 f"optimizer state in each run's newest checkpoint only = {gb(total)}")
    return lines, total


def _set_counts(sp: Any) -> list[tuple[str, int, int | None]]:
    """(what, number of sets, images per set) of the eval and preference image sets."""
    per_run = 1 + (sp.select_epoch is not None)  # reward-matched + matched-epoch checkpoint (at most)
    out = [("eval", 1 + len(sp.runs) * per_run, _n_images(sp.eval.prompts, sp.eval.max_prompts, sp.eval.seeds))]
    for p in sp.preferences:
        n = 1 + len(sp.runs) * (1 if p.epochs else per_run)
        out.append((f"preference {p.name or p.prompts}", n, _n_images(p.prompts, p.max_prompts, p.seeds)))
    return out


def _image_lines(sp: Any) -> tuple[list[str], float | None, list[tuple[int, str]]]:
    """Lines, total bytes and (images, model kind) of the image sets (upper bound: every run selected)."""
    size = model_size(sp.base_model, 0)
    side = size["side"]
    per_img = PNG_BYTES_PER_PIXEL * side * side if side else None
    lines, total, images = [], 0.0, []
    for what, n_sets, n_img in _set_counts(sp):
        if n_img is None or per_img is None:
            lines.append(f"    {what} sets: {n_sets} sets, images per set unknown here (prompt set not available)")
            total = None
            continue
        b = n_sets * n_img * per_img
        total = None if total is None else total + b
        images.append((n_sets * n_img, _kind(sp.base_model)))
        lines.append(f"    {what} sets: {n_sets} sets x {n_img:,} images x ~{gb(per_img)} ({side} px PNG, "
                     f"~{PNG_BYTES_PER_PIXEL:g} B/pixel) = {gb(b)}")
    return lines, total, images


def _gpu_lines(sp: Any, images: list[tuple[int, str]]) -> list[str]:
    """GPU-hours of training and generation from the measured figures; "not measured" elsewhere."""
    train_s, missing = 0.0, set()
    for r in sp.runs:
        if r.train is None:
            continue
        c = r.train
        key = (_kind(c.model), c.lora_rank > 0, c.objective)
        if key not in TRAIN_S_PER_IMAGE:
            missing.add(f"{key[0]} {'LoRA' if key[1] else 'full fine-tune'} {key[2]}")
            continue
        per_epoch = int(c.paper_total_batch) or c.samples_per_epoch
        slow = DETERMINISTIC_SLOWDOWN if c.deterministic else 1.0
        train_s += TRAIN_S_PER_IMAGE[key] * per_epoch * c.epochs * slow
    lines = [f"  GPU-hours ({GPU_SOURCE}):"]
    rewards = sorted({str(r.train.reward) for r in sp.runs if r.train is not None} - set(MEASURED_REWARDS))
    left_out = (f"not included: paired-control sampling, and scoring by {', '.join(rewards)} (the figures used a "
                "weight-free reward)") if rewards else "paired-control sampling not included"
    if train_s and not missing:
        lines.append(f"    training: {train_s / 3600:,.1f} GPU-hours ({left_out})")
    elif missing:
        lines.append(f"    training: not measured for {', '.join(sorted(missing))} (measured: SD-1.5 LoRA setup-2, "
                     "ppo_clip and pcpo)" + (f"; the measured runs: {train_s / 3600:,.1f} GPU-hours" if train_s else ""))
    n = sum(i for i, _ in images)
    kinds = {k for _, k in images}
    if images and kinds <= set(GENERATE_IMG_S):
        lo, hi = (min(GENERATE_IMG_S[k][0] for k in kinds), max(GENERATE_IMG_S[k][1] for k in kinds))
        lines.append(f"    generation: {n:,} images at {lo:g}-{hi:g} img/s = {n / hi / 3600:,.1f}-{n / lo / 3600:,.1f} "
                     "GPU-hours (SD-1.5, 512 px, 50 steps, CFG, bf16)")
    else:
        lines.append(f"    generation: not measured for {', '.join(sorted(kinds)) or 'these sets'} "
                     "(measured: SD-1.5 512 px, 50 steps, CFG, bf16)")
    return lines


def footprint_lines(sp: Any) -> list[str]:
    """The disk and GPU-hours lines of ``pcpo-eval study SPEC --plan``, for the spec's runs as written."""
    ck_lines, ck_total = _checkpoint_lines(sp)
    img_lines, img_total, images = _image_lines(sp)
    total = "unknown (see above)" if ck_total is None or img_total is None else f"about {gb(ck_total + img_total)}"
    return [f"  disk written by the spec's {len(sp.runs)} runs (from parameter counts, before metrics and logs): {total}",
            *ck_lines, *img_lines, *_gpu_lines(sp, images)]
