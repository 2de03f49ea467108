"""``generate_set``: render every (prompt, seed) image of a set, resumable and sharded.
"""

import contextlib
import hashlib
import os
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.generate.fixed_batch import FixedBatchAdapter, auto_micro_batch, effective_batch_size
from pcpo_eval.generate.loading import adapter_hash, load_generation_model
from pcpo_eval.generate.plan import WorkItem, parse_seeds, plan_items, shard_items
from pcpo_eval.generate.png import _png_pixels, encode_png, pixel_sha256, png_is_readable, write_image_file
from pcpo_eval.generate.setdir import (
    GenerateSummary,
    GenerationSettings,
    _check_existing_prompts,
    _check_out_dir,
    _load_records,
    _png_text,
    _record,
    _remove_stale_tmp,
)
from pcpo_eval.imageset import MANIFEST_COLUMNS
from pcpo_eval.io import atomic_write_json, atomic_write_parquet, sha256_file
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.prompts import PromptSet, load_prompts
from pcpo_eval.samplers import SAMPLERS, SCHEDULES, resolve_sampler
from pcpo_eval.seeding import sample_generator

# ---------------------------------------------------------------------------------------------
# The generator
# ---------------------------------------------------------------------------------------------


class _Writer:
    """Encodes and atomically writes PNGs on one background thread (I/O overlaps compute)."""

    def __init__(self, out: Path, settings: GenerationSettings) -> None:
        self.out, self.settings = out, settings
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="png-writer")
        self.pending: list[Future] = []
        self.records: list[dict[str, Any]] = []

    def _write(self, item: WorkItem, img: np.ndarray) -> dict[str, Any]:
        data = encode_png(img, _png_text(item, self.settings))
        write_image_file(self.out / item.rel_path, data)
        return _record(item, hashlib.sha256(data).hexdigest(), pixel_sha256(img), img.shape[1], img.shape[2])

    def submit(self, item: WorkItem, img: np.ndarray) -> None:
        self.pending.append(self.pool.submit(self._write, item, img))

    def collect(self, wait: bool = False) -> int:
        """Move finished writes into ``records`` (raising any write error); returns how many."""
        done = [f for f in self.pending if wait or f.done()]
        for f in done:
            self.records.append(f.result())
        self.pending = [f for f in self.pending if f not in done]
        return len(done)


def generate_set(
    model_spec: str | ModelAdapter,
    prompts: str | Path | PromptSet,
    seeds: str | int | Sequence[int],
    out_dir: str | Path,
    *,
    batch_size: int = 8,
    steps: int = 50,
    cfg: float = 5.0,
    eta: float = 1.0,
    sampler: str = "auto",
    schedule: str | None = None,
    micro_batch: int | None = None,
    device: str = "cpu",
    model_name: str | None = None,
    max_prompt_tokens: int | None = None,
    max_prompts: int | None = None,
    progress: bool = True,
    flush_every_s: float = 20.0,
    rank: int | None = None,
    world_size: int | None = None,
) -> GenerateSummary:
    """Render every ``(prompt, seed)`` image of a set into ``out_dir`` (resumable, sharded).

    Args:
        model_spec: ``base`` / ``toy`` / ``sd1:PATH`` / ``RUN/checkpoints/epoch_NNNN`` /
            ``irg:...`` (:func:`load_generation_model`), or an already built adapter.
        prompts: a built-in set name, a prompt file, or a PromptSet (:func:`load_prompts`).
        seeds: ``N``, ``"A-B"`` or a list (:func:`parse_seeds`).
        out_dir: the set directory (created; resumed if it holds a compatible set).
        batch_size: images sampled together, rounded up to fill whole micro-batches
            (:func:`effective_batch_size`); speed only, images do not depend on it.
        steps, cfg, eta: sampler steps, CFG weight w (eps_u + w (eps_c - eps_u)), DDIM eta.
        sampler: ``auto`` (by the model's prediction type), ``ddim`` or ``flow``.
        schedule: the sampler's noise schedule (:data:`SCHEDULES`; default its first entry):
            DDIM ``ddim`` (eta schedule) or ``pcpo`` (PCPO's re-solved sigmas); flow ``ode``
            (deterministic Euler, Flow-GRPO's evaluation), ``dance`` or ``flowgrpo`` SDEs.
        micro_batch: fixed row count of every model call (part of the settings); ``None`` ->
            :func:`auto_micro_batch` of the model's latent shape; ``0`` turns fixed shapes off.
        model_name: the ``model`` column when ``model_spec`` is an adapter (default its name).
        max_prompt_tokens, max_prompts: CLIP-length filter and truncation of the prompt set.
        progress: tqdm bar on rank 0.
        flush_every_s: how often this process's records are checkpointed for resume.
        rank, world_size: override the torchrun/accelerate environment (tests).

    Returns:
        A :class:`GenerateSummary` (this process's share; the manifest covers all shares).
    """
    t_start = time.perf_counter()
    # ---- validate everything before writing anything --------------------------------------
    if batch_size < 1:
        raise UserError(f"--batch-size {batch_size}; use a positive number")
    if steps < 1:
        raise UserError(f"--steps {steps}; use a positive number of sampler steps")
    if eta < 0:
        raise UserError(f"--eta {eta}; eta must be >= 0")
    seed_list = parse_seeds(seeds)
    prompt_set = load_prompts(prompts, max_tokens=max_prompt_tokens, limit=max_prompts)
    if isinstance(model_spec, ModelAdapter):
        adapter, spec_str = model_spec, model_name or model_spec.name
    else:
        adapter, spec_str = load_generation_model(str(model_spec), device), str(model_spec)
    if micro_batch is None:
        micro_batch = auto_micro_batch(adapter.latent_shape)
    sampler_name = resolve_sampler(sampler, adapter.prediction)
    schedule = SCHEDULES[sampler_name][0] if schedule is None else schedule
    if schedule not in SCHEDULES[sampler_name]:
        raise UserError(
            f"unknown {sampler_name} schedule {schedule!r}; choose one of: {', '.join(SCHEDULES[sampler_name])}"
        )
    settings = GenerationSettings(
        model=spec_str,
        model_hash=adapter_hash(adapter),
        model_name=adapter.name,
        prediction=adapter.prediction,
        sampler=sampler_name,
        steps=int(steps),
        cfg=float(cfg),
        eta=float(eta),
        schedule=schedule,
        micro_batch=int(micro_batch),
        device=torch.device(device).type,
    )
    fixed = FixedBatchAdapter(adapter, micro_batch)
    out = Path(out_dir)
    _check_out_dir(out, settings)
    if rank is None or world_size is None:
        rank, world_size = dist.init(device)
    items = plan_items(prompt_set, seed_list)
    records = _load_records(out) if out.exists() else {}
    if out.exists():
        _check_existing_prompts(out, items, records)
    dist.barrier()

    # ---- set directory ----------------------------------------------------------------------
    run_info = {
        "prompts": prompt_set.name,
        "n_prompts": len(prompt_set),
        "n_prompts_dropped_long": prompt_set.n_dropped,
        "n_prompts_beyond_limit": prompt_set.n_limited,
        "token_counter": prompt_set.token_counter,
        "max_prompt_tokens": max_prompt_tokens,
        "seeds": seeds if isinstance(seeds, str | int) else f"{len(seed_list)} listed",
        "n_seeds": len(seed_list),
        "n_images": len(items),
        "batch_size": batch_size,
        "effective_batch_size": effective_batch_size(batch_size, int(micro_batch), cfg),
        "world_size": world_size,
        "torch_version": torch.__version__,
    }
    if rank == 0:
        out.mkdir(parents=True, exist_ok=True)
        _remove_stale_tmp(out)
        if not (out / "set.json").exists():
            atomic_write_json(out / "set.json", {"status": "rendering", "settings": asdict(settings), "run": run_info})
    dist.barrier()

    # ---- render this rank's share -----------------------------------------------------------
    mine = shard_items(items, rank, world_size)
    todo = [it for it in mine if not _is_done(out, it, records)]
    progress_file = out / ".progress" / f"{uuid.uuid4().hex}-r{rank:03d}.parquet"
    writer = _Writer(out, settings)
    bar = _progress_bar(len(mine), len(mine) - len(todo), progress and rank == 0)
    uncond_row = fixed.encode_prompts([""]) if cfg != 1.0 else None
    last_flush = time.monotonic()
    try:
        with torch.inference_mode():
            step = run_info["effective_batch_size"]
            for s in range(0, len(todo), step):
                batch = todo[s : s + step]
                latents = _render_latents(fixed, batch, uncond_row, sampler_name, cfg, steps, eta, schedule)
                images = fixed.decode(latents).to("cpu", torch.uint8).numpy()
                for it, img in zip(batch, images, strict=True):
                    writer.submit(it, img)
                bar.update(writer.collect())
                if time.monotonic() - last_flush > flush_every_s:
                    _flush_records(progress_file, writer.records)
                    last_flush = time.monotonic()
        bar.update(writer.collect(wait=True))
    finally:
        writer.pool.shutdown(wait=True)
        bar.close()
    _flush_records(progress_file, writer.records)
    n_rendered = len(writer.records)

    # ---- manifest -----------------------------------------------------------------------------
    dist.barrier()
    manifest_path = out / "manifest.parquet"
    if rank == 0:
        _write_manifest(out, items, settings, {**run_info, "seconds": time.perf_counter() - t_start})
    dist.barrier()
    seconds = time.perf_counter() - t_start
    return GenerateSummary(
        out_dir=out,
        n_images=len(items),
        n_rendered=n_rendered,
        n_skipped=len(mine) - len(todo),
        seconds=seconds,
        rank=rank,
        world_size=world_size,
        settings=settings,
        n_prompts=len(prompt_set),
        n_seeds=len(seed_list),
        n_prompts_dropped=prompt_set.n_dropped,
        manifest_path=manifest_path,
        images_per_second=n_rendered / seconds if seconds > 0 else 0.0,
    )


def _progress_bar(total: int, initial: int, enabled: bool):
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, disable=not enabled, unit="img", desc="generate", dynamic_ncols=True)


def _render_latents(
    fixed: FixedBatchAdapter,
    batch: Sequence[WorkItem],
    uncond_row: PromptEmbeds | None,
    sampler_name: str,
    cfg: float,
    steps: int,
    eta: float,
    schedule: str,
) -> torch.Tensor:
    """Latents of one batch: per-item generators, deduplicated prompt encoding, the sampler."""
    uniq = list(dict.fromkeys(it.prompt for it in batch))
    emb = fixed.encode_prompts(uniq)
    cond = emb.index(torch.tensor([uniq.index(it.prompt) for it in batch]))
    uncond = None if uncond_row is None else uncond_row.repeat(len(batch))
    generators = [sample_generator(it.prompt_id, it.seed) for it in batch]
    return SAMPLERS[sampler_name](
        fixed, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators, schedule=schedule
    )


def _is_done(out: Path, item: WorkItem, records: dict[tuple[int, int], dict[str, Any]]) -> bool:
    """An image counts as done if it exists and has a record, or exists and decodes.

    A file that exists but does not decode (only possible after a power loss, since files are
    renamed into place complete) is removed so it is rendered again.
    """
    path = out / item.rel_path
    if not path.exists():
        return False
    rec = records.get((item.prompt_id, item.seed))
    if rec is not None and rec.get("path") == item.rel_path:
        return True
    if png_is_readable(path):
        return True
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return False


def _flush_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Make the images written so far durable (``os.sync``), then atomically rewrite their records."""
    if not records:
        return
    import pandas as pd

    os.sync()
    atomic_write_parquet(path, pd.DataFrame(records))


def _write_manifest(out: Path, items: Sequence[WorkItem], settings: GenerationSettings, run_info: dict) -> None:
    """Rank 0, after all shares are rendered: manifest.parquet and set.json, atomically."""
    import pandas as pd

    records = _load_records(out)
    rows = []
    for it in sorted(items, key=lambda i: (i.prompt_id, i.seed)):
        path = out / it.rel_path
        rec = records.get((it.prompt_id, it.seed))
        if rec is None or rec.get("path") != it.rel_path:
            if not path.exists():
                raise RuntimeError(f"{path} missing after rendering (a worker failed?); re-run to complete the set")
            pix = _png_pixels(path)
            rec = _record(it, sha256_file(path), pixel_sha256(pix), pix.shape[1], pix.shape[2])
        elif not path.exists():
            raise RuntimeError(f"{path} missing after rendering (a worker failed?); re-run to complete the set")
        rows.append(rec)
    df = pd.DataFrame(rows)
    s = asdict(settings)
    for col in ("model", "model_hash", "sampler", "steps", "cfg", "eta", "schedule", "micro_batch"):
        df[col] = s[col]
    df = df[MANIFEST_COLUMNS].astype({"prompt_id": "int64", "seed": "int64", "height": "int64", "width": "int64"})
    atomic_write_parquet(out / "manifest.parquet", df)
    atomic_write_json(
        out / "set.json",
        {"status": "complete", "settings": s, "run": run_info, "manifest": "manifest.parquet"},
    )
    for f in (out / ".progress").glob("*.parquet"):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    with contextlib.suppress(OSError):
        (out / ".progress").rmdir()
