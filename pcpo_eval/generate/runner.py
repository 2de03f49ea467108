"""``generate_set``: render every (prompt, seed) image of a set, resumable and sharded.

Owns the run of one set: :class:`GenerationRequest` (the arguments, checked in one place),
:func:`generate_set` as four steps in the manner of a diffusers pipeline's ``__call__``
(``_check_request`` -> ``_open_set_dir`` -> ``_render_share`` -> ``_finish_set``),
:func:`render_latents` (one batch through the sampler with per-image generators), the background
PNG writer, and :class:`GenerateSummary`. Files in the set directory are :mod:`.setdir`'s; PNG
bytes are :mod:`.png`'s; the design is in :mod:`pcpo_eval.generate`.
"""

import hashlib
import time
import uuid
from collections.abc import Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from concurrent.futures import wait as futures_wait
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch

from pcpo_eval import dist
from pcpo_eval.credit.ddim import check_ddim_eta, ddim_schedule
from pcpo_eval.errors import UserError
from pcpo_eval.generate.fixed_batch import (
    MAX_MEMORY_MICRO_BATCH,
    FixedBatchAdapter,
    auto_micro_batch,
    check_denoiser_attention,
    effective_batch_size,
    memory_decode_batch,
    memory_micro_batch,
)
from pcpo_eval.generate.loading import adapter_hash, load_generation_model
from pcpo_eval.generate.plan import WorkItem, check_sampling_options, parse_seeds, plan_items, shard_items
from pcpo_eval.generate.png import encode_png, pixel_sha256, write_image_file
from pcpo_eval.generate.setdir import (
    GenerationSettings,
    Records,
    begin_set,
    check_existing_prompts,
    check_out_dir,
    discard_empty_set,
    flush_records,
    image_record,
    is_done,
    load_records,
    lock_set,
    png_text,
    write_manifest,
)
from pcpo_eval.imageset import LOCK_FILE, MANIFEST_FILE, PROGRESS_DIR, SET_FILE
from pcpo_eval.io import parallel_map
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.precision import (
    cpu_render_threads,
    dtype_precision,
    matmul_precision,
    precision_dtype,
    render_threads,
    resolve_attention,
    resolve_precision,
)
from pcpo_eval.progress import progress_bar
from pcpo_eval.prompts import PromptSet, load_prompts
from pcpo_eval.samplers import SAMPLERS, SCHEDULES, resolve_sampler
from pcpo_eval.samplers.flow import FINAL_LATENT
from pcpo_eval.seeding import sample_generator

# ---------------------------------------------------------------------------------------------
# The request and the summary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationRequest:
    """What to render: the arguments of :func:`generate_set`, rejected at construction if bad.

    Construction checks every value that needs no model and no file (so a bad number fails
    before a model is loaded or anything is written); what needs the prompts, the model or the
    set directory is checked by :func:`generate_set`'s first step.

    Attributes:
        model_spec: ``base`` / ``toy`` / ``sd1:PATH`` / ``RUN/checkpoints/epoch_NNNN`` /
            ``irg:...`` (:func:`load_generation_model`), or an already built adapter.
        prompts: a built-in set name, a prompt file, or a PromptSet (:func:`load_prompts`).
        seeds: ``N``, ``"A-B"``, ``"A,B-C"`` or a list (:func:`parse_seeds`).
        out_dir: the set directory (created; resumed if it holds a compatible set).
        batch_size: images sampled together, rounded up to fill whole micro-batches
            (:func:`effective_batch_size`); speed only, images do not depend on it.
        steps, cfg, eta: sampler steps (>= 1), CFG weight w (eps_u + w (eps_c - eps_u); finite),
            DDIM eta / flow SDE noise scale (finite, >= 0).
        sampler: ``auto`` (by the model's prediction type), ``ddim`` or ``flow``.
        schedule: the sampler's noise schedule (:data:`SCHEDULES`; default its first entry):
            DDIM ``ddim`` (eta schedule) or ``pcpo`` (PCPO's re-solved sigmas); flow ``ode``
            (deterministic Euler, Flow-GRPO's evaluation), ``dance`` or ``flowgrpo`` SDEs.
        micro_batch: fixed row count of every model call (part of the settings); ``None`` ->
            :func:`auto_micro_batch` of the model's latent shape on CPU, :func:`memory_micro_batch`
            (from free GPU memory; identity within tolerance) on CUDA; ``0`` turns fixed shapes off.
        device: torch device of the model, read as ``--device`` (:func:`pcpo_eval.dist.resolve_device`:
            ``auto`` or a bare ``cuda`` under torchrun is this process's GPU).
        precision: ``auto`` / ``fp32`` / ``tf32`` / ``bf16`` / ``fp16`` (:mod:`pcpo_eval.precision`);
            ``auto`` is bf16 on CUDA, fp32 on CPU, or an adapter's own dtype when one is passed.
        attention: the attention backend of the denoiser's calls (:data:`pcpo_eval.precision.ATTENTION_BACKENDS`;
            ``auto``: PyTorch's choice), part of the settings like the precision. The text encoder and the
            VAE decoder keep PyTorch's choice; a backend without a kernel for the denoiser on this device is
            refused before anything is written (:func:`~.fixed_batch.check_denoiser_attention`).
        compile, channels_last: ``torch.compile`` the denoiser / hold it in channels-last memory
            format (speed only; both change kernels, so the set's ``batch_invariance`` is ``tolerance``).
        model_name: the ``model`` column when ``model_spec`` is an adapter (default its name).
        max_prompt_tokens, max_prompts: CLIP-length filter and truncation of the prompt set.
        progress: tqdm bar on rank 0.
        flush_every_s: how often this process's records are checkpointed for resume.
        rank, world_size: override the torchrun/accelerate environment (tests).
    """

    model_spec: str | ModelAdapter
    prompts: str | Path | PromptSet
    seeds: str | int | Sequence[int]
    out_dir: str | Path
    batch_size: int = 8
    steps: int = 50
    cfg: float = 5.0
    eta: float = 1.0
    sampler: str = "auto"
    schedule: str | None = None
    micro_batch: int | None = None
    device: str = "cpu"
    precision: str | None = None
    attention: str | None = None
    compile: bool = False
    channels_last: bool = False
    model_name: str | None = None
    max_prompt_tokens: int | None = None
    max_prompts: int | None = None
    progress: bool = True
    flush_every_s: float = 20.0
    rank: int | None = None
    world_size: int | None = None

    def __post_init__(self) -> None:
        resolve_precision(self.precision, self.device)  # an unknown name fails before any model loads
        resolve_attention(self.attention, self.device)
        check_sampling_options(batch_size=self.batch_size, steps=self.steps, cfg=self.cfg, eta=self.eta,
                               micro_batch=self.micro_batch, max_prompts=self.max_prompts,
                               max_prompt_tokens=self.max_prompt_tokens)


@dataclass
class GenerateSummary:
    """What :func:`generate_set` did (returned on every rank; counts are for this rank's share)."""

    out_dir: Path
    n_images: int
    n_rendered: int
    n_skipped: int
    seconds: float
    rank: int
    world_size: int
    settings: GenerationSettings
    n_prompts: int
    n_seeds: int
    n_prompts_dropped: int = 0
    manifest_path: Path | None = None
    #: rendered images per wall second of the whole call on this rank (loading, resume checks, writing included)
    images_per_second: float = field(default=0.0)
    #: where this rank's seconds went: ``load_model`` (0 for an adapter passed in), ``memory_probes`` (the
    #: attention check and the CUDA micro-batch / decode probes), ``model_hash``, ``open_set_dir``,
    #: ``first_batch`` and ``other_batches`` (sampling, decode, host copy), ``png_tail`` (waiting for the last
    #: PNG writes), ``finish`` (barrier, manifest); what a set pays once is all but the batches
    phase_seconds: dict[str, float] = field(default_factory=dict)


# ---------------------------------------------------------------------------------------------
# generate_set
# ---------------------------------------------------------------------------------------------


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
    precision: str | None = None,
    attention: str | None = None,
    compile: bool = False,
    channels_last: bool = False,
    model_name: str | None = None,
    max_prompt_tokens: int | None = None,
    max_prompts: int | None = None,
    progress: bool = True,
    flush_every_s: float = 20.0,
    rank: int | None = None,
    world_size: int | None = None,
) -> GenerateSummary:
    """Render every ``(prompt, seed)`` image of a set into ``out_dir`` (resumable, sharded).

    The arguments are :class:`GenerationRequest`'s fields. Nothing is written before step 2, so
    every bad input (a :class:`UserError`) leaves ``out_dir`` untouched.

    Returns:
        A :class:`GenerateSummary` (this process's share; the manifest covers all shares).
    """
    t_start = time.perf_counter()
    device = dist.resolve_device(str(device))  # "auto", and a bare "cuda" under torchrun: this rank's GPU
    request = GenerationRequest(
        model_spec, prompts, seeds, out_dir, batch_size=batch_size, steps=steps, cfg=cfg, eta=eta,
        sampler=sampler, schedule=schedule, micro_batch=micro_batch, device=device, precision=precision,
        attention=attention, compile=compile, channels_last=channels_last, model_name=model_name, max_prompt_tokens=max_prompt_tokens, max_prompts=max_prompts, progress=progress,
        flush_every_s=flush_every_s, rank=rank, world_size=world_size,
    )  # fmt: skip
    job = _check_request(request)  # 1. prompts, seeds, model, precision, settings, out dir: still nothing written
    fresh = (job.out.exists(), (job.out / SET_FILE).exists(), (job.out / LOCK_FILE).exists())
    lock = lock_set(job.out) if job.rank == 0 else None  # one render per folder (a second: one error line)
    try:
        try:
            check_out_dir(job.out, job.settings)  # again, under the lock: a render that finished meanwhile
            # one CPU thread per process (the set is the same for any process count), TF32 as the precision says;
            # the attention backend: job.fixed's denoiser calls
            with cpu_render_threads(job.settings.device), matmul_precision(job.settings.precision):
                t_open = time.perf_counter()
                opened = _open_set_dir(job)  # 2. plan, known records, set.json ("rendering")
                job.seconds["open_set_dir"] = time.perf_counter() - t_open
                share = _render_share(job, opened)  # 3. this process's images: loop, PNG writer, record flushes
        except BaseException:
            if job.rank == 0 and job.world_size == 1 and not fresh[1]:
                discard_empty_set(job.out, remove_dir=not fresh[0])  # no set.json without an image beside it
            elif job.rank == 0 and not fresh[2]:  # refused or failed: no lock file of ours left in the folder
                (job.out / LOCK_FILE).unlink(missing_ok=True)
            raise
        return _finish_set(job, opened, share, t_start)  # 4. barrier, manifest + set.json ("complete"), summary
    finally:
        if lock is not None:
            lock.close()


# ---- 1. check the request ---------------------------------------------------------------------


@dataclass(frozen=True)
class _Job:
    """The request resolved against its prompts, seeds and model (step 1; nothing written)."""

    request: GenerationRequest
    prompt_set: PromptSet
    seed_list: list[int]
    fixed: FixedBatchAdapter
    settings: GenerationSettings
    out: Path
    rank: int
    world_size: int
    seconds: dict[str, float] = field(default_factory=dict)  #: phase seconds so far (GenerateSummary.phase_seconds)


def _check_request(request: GenerationRequest) -> _Job:
    """Parse seeds, load prompts and model, fix the settings, refuse an incompatible ``out_dir``."""
    seed_list = parse_seeds(request.seeds)
    prompt_set = load_prompts(request.prompts, max_tokens=request.max_prompt_tokens, limit=request.max_prompts)
    clock = _Clock()
    if isinstance(request.model_spec, ModelAdapter):
        adapter, spec_str = request.model_spec, request.model_name or request.model_spec.name
        precision = _adapter_precision(adapter, request.precision)
    else:
        precision = resolve_precision(request.precision, request.device)
        adapter = load_generation_model(str(request.model_spec), request.device, precision_dtype(precision))
        spec_str = str(request.model_spec)
    clock.lap("load_model")
    adapter.check_prompts(list(dict.fromkeys(prompt_set.prompts)))  # an unknown word: refused before any write
    attention = resolve_attention(request.attention, request.device)
    with matmul_precision(precision):  # the probes run the real kernels
        check_denoiser_attention(adapter, attention)  # a forced backend without a kernel: one error line
        micro_batch, invariance = _micro_batch(request, adapter, attention)
        decode_batch = (memory_decode_batch(adapter, cap=effective_batch_size(request.batch_size, micro_batch, request.cfg))
                        if invariance == "tolerance" and adapter.device.type == "cuda" else None)
    clock.lap("memory_probes")
    if (request.compile or request.channels_last) and invariance == "bitwise":
        invariance = "tolerance"
    settings = _settings(request, adapter, spec_str, micro_batch, precision, invariance, attention)
    clock.lap("model_hash")
    _speed_up(adapter, request)  # after _settings: the model hash is of the plain module
    fixed = FixedBatchAdapter(adapter, micro_batch, decode_batch, attention=attention)
    out = Path(request.out_dir)
    check_out_dir(out, settings)
    if request.rank is None or request.world_size is None:
        rank, world_size = dist.init(request.device)
    else:
        rank, world_size = request.rank, request.world_size
    return _Job(request, prompt_set, seed_list, fixed, settings, out, rank, world_size, clock.seconds)


class _Clock:
    """Seconds between successive :meth:`lap` calls, by name (the caller's probes synchronise CUDA)."""

    def __init__(self) -> None:
        self.seconds: dict[str, float] = {}
        self._t = time.perf_counter()

    def lap(self, name: str) -> None:
        now = time.perf_counter()
        self.seconds[name] = self.seconds.get(name, 0.0) + now - self._t
        self._t = now


def _adapter_precision(adapter: ModelAdapter, asked: str | None) -> str:
    """The precision of an adapter passed in by the caller: its own dtype's, or ``asked`` if they agree."""
    own = dtype_precision(adapter.dtype)
    if own is None:
        raise UserError(f"model {adapter.name!r} holds {adapter.dtype} weights; use float32, bfloat16 or float16")
    if asked is None or str(asked).lower() == "auto":
        return own
    precision = resolve_precision(asked, adapter.device)
    if precision_dtype(precision) != adapter.dtype:
        raise UserError(f"--precision {precision} but the model passed in holds {adapter.dtype} weights; "
                        f"cast it (adapter.denoiser.to(...)) or pass --precision {own}")
    return precision


def _micro_batch(request: GenerationRequest, adapter: ModelAdapter, attention: str = "auto") -> tuple[int, str]:
    """(rows per model call, batch_invariance): the request's number, or chosen by device.

    A fixed number (given, or :func:`auto_micro_batch` on CPU) is ``bitwise``; on CUDA the default
    comes from free memory (:func:`memory_micro_batch`), at most the rows of one ``batch_size``
    batch (2 per image with CFG), and is ``tolerance``. ``--micro-batch 0`` (off: model calls see the
    batch as it comes) is ``none``: an image's last bits depend on the batch it was rendered in (toy, CPU,
    batch sizes 40 and 3: 31 of 40 images equal, the others within 1/255), so a resumed, re-batched or
    re-sharded set is not bitwise a one-go render. It was recorded ``bitwise``.
    """
    if request.micro_batch == 0:
        return 0, "none"
    if request.micro_batch is not None:
        _check_micro_batch_fits(int(request.micro_batch), adapter)
        return int(request.micro_batch), "bitwise"
    if adapter.device.type == "cuda":  # no larger than one batch's rows: a padded row costs a full one
        rows = request.batch_size * (2 if request.cfg != 1.0 else 1)
        cap = min(MAX_MEMORY_MICRO_BATCH, max(2, rows))
        return memory_micro_batch(adapter, cap=cap, attention=attention), "tolerance"
    return auto_micro_batch(adapter.latent_shape), "bitwise"


def _check_micro_batch_fits(micro_batch: int, adapter: ModelAdapter) -> None:
    """UserError when one model call of ``micro_batch`` rows cannot fit the device's memory: its input and
    output latents alone (float32), a lower bound of what the call needs. Before, ``--micro-batch 1000000000``
    on two images grew to 16.5 GB within 40 s and left the set marked ``rendering``."""
    import math
    import os

    per_row = 2 * 4 * math.prod(adapter.latent_shape)
    try:
        have = (torch.cuda.get_device_properties(adapter.device).total_memory if adapter.device.type == "cuda"
                else os.sysconf("SC_PAGE_SIZE") * os.sysconf("SC_PHYS_PAGES"))
    except (ValueError, OSError, AttributeError, RuntimeError):  # not POSIX, or no such GPU: no check
        return
    if micro_batch * per_row > have:
        raise UserError(f"--micro-batch {micro_batch} cannot fit: one model call's latents alone need "
                        f"{micro_batch * per_row / 2**30:,.0f} GiB, this device has {have / 2**30:,.0f} GiB; use at "
                        f"most {max(1, have // per_row // 8):,} (or leave it out: chosen for the device)")


def _speed_up(adapter: ModelAdapter, request: GenerationRequest) -> None:
    """``--channels-last`` and ``--compile``: applied in place to each denoiser that runs (the UNet / transformer;
    an IRG model's reference and components).

    The compiled module wraps the original (``_orig_mod``); fixed micro-batches give it one static
    shape, so it compiles once per set.
    """
    for leaf in _denoising_adapters(adapter):
        if request.channels_last:
            leaf.denoiser.to(memory_format=torch.channels_last)
        if request.compile and not hasattr(leaf.denoiser, "_orig_mod"):  # not twice for a reused adapter
            leaf.denoiser = torch.compile(leaf.denoiser, fullgraph=False, dynamic=False)


def _denoising_adapters(adapter: ModelAdapter) -> list[ModelAdapter]:
    """The adapters whose own ``denoiser`` runs: an IRG adapter's reference and components (its
    ``denoiser`` is only a ModuleList of theirs, never called), a wrapper's inner adapter, else itself."""
    if hasattr(adapter, "components") and "reference" in vars(adapter):
        return [leaf for a in (adapter.reference, *adapter.components) for leaf in _denoising_adapters(a)]
    if "inner" in vars(adapter):
        return _denoising_adapters(adapter.inner)
    return [adapter]


def _settings(request: GenerationRequest, adapter: ModelAdapter, spec_str: str, micro_batch: int,
              precision: str, invariance: str, attention: str = "auto") -> GenerationSettings:
    """Resolve sampler and schedule for the model's prediction type; hash the model."""
    sampler_name = resolve_sampler(request.sampler, adapter.prediction)
    if sampler_name == "ddim":
        check_ddim_eta(float(request.eta), "eta")  # before the set folder or a progress bar exists
        ddim_schedule(adapter.scheduler_config, int(request.steps), float(request.eta), stochastic=False)  # --steps
    schedule = SCHEDULES[sampler_name][0] if request.schedule is None else request.schedule
    if schedule not in SCHEDULES[sampler_name]:
        raise UserError(
            f"unknown {sampler_name} schedule {schedule!r}; choose one of: {', '.join(SCHEDULES[sampler_name])}"
        )
    return GenerationSettings(
        model=spec_str,
        model_hash=adapter_hash(adapter),
        model_name=adapter.name,
        prediction=adapter.prediction,
        sampler=sampler_name,
        steps=int(request.steps),
        cfg=float(request.cfg),
        eta=float(request.eta),
        schedule=schedule,
        micro_batch=int(micro_batch),
        device=torch.device(request.device).type,
        precision=precision,
        batch_invariance=invariance,
        attention=attention,
        final_latent=FINAL_LATENT["ode" if float(request.eta) == 0 else schedule] if sampler_name == "flow" else "sample",
        cpu_threads=render_threads(adapter.device),
    )


# ---- 2. open the set directory ----------------------------------------------------------------


@dataclass(frozen=True)
class _OpenSet:
    """The plan, the records already on disk, and set.json's run information (step 2)."""

    items: list[WorkItem]
    records: Records
    run_info: dict[str, Any]


def _open_set_dir(job: _Job) -> _OpenSet:
    """Plan all items, check existing images against it, then (rank 0) create the set directory."""
    out = job.out
    items = plan_items(job.prompt_set, job.seed_list)
    records = load_records(out) if out.exists() else {}
    if out.exists():
        check_existing_prompts(out, items, records)
    dist.barrier()
    run_info = _run_info(job, items)
    if job.rank == 0:
        begin_set(out, job.settings, run_info)
    dist.barrier()
    return _OpenSet(items, records, run_info)


def _run_info(job: _Job, items: Sequence[WorkItem]) -> dict[str, Any]:
    """set.json's ``run`` block: what was asked for beyond the settings (does not affect pixels)."""
    req, ps = job.request, job.prompt_set
    return {
        "prompts": ps.name,
        "n_prompts": len(ps),
        "n_prompts_dropped_long": ps.n_dropped,
        "n_prompts_beyond_limit": ps.n_limited,
        "token_counter": ps.token_counter,
        "max_prompt_tokens": req.max_prompt_tokens,
        "seeds": req.seeds if isinstance(req.seeds, str | int) else f"{len(job.seed_list)} listed",
        "n_seeds": len(job.seed_list),
        "n_images": len(items),
        "batch_size": req.batch_size,
        "effective_batch_size": effective_batch_size(req.batch_size, job.settings.micro_batch, req.cfg),
        "decode_batch": job.fixed.decode_batch,  # None: decoded in padded micro-batches (bitwise sets)
        "world_size": job.world_size,
        "torch_version": torch.__version__,
    }


# ---- 3. render this process's share -----------------------------------------------------------


@dataclass(frozen=True)
class _Share:
    """This process's share (step 3): images rendered now, and images found done on disk."""

    n_rendered: int
    n_skipped: int
    seconds: dict[str, float] = field(default_factory=dict)  #: first_batch, other_batches, png_tail


def _render_share(job: _Job, opened: _OpenSet) -> _Share:
    """Render this rank's items not yet done, in batches; PNGs written and records flushed as they go.

    Each rank checks its share of the plan (:func:`shard_items`) for images already done; the ranks then split
    what is left among themselves. Before, the plan was split first: a set extended by one prompt gave every
    new image to one rank ("rendered 0, skipped 8 on rank 0 of 2") while the others waited at the barrier,
    and a wait past the group's timeout failed the render. Which rank renders an image does not change it."""
    req, out, settings = job.request, job.out, job.settings
    mine = shard_items(opened.items, job.rank, job.world_size)
    # a resumed 50,000-image set re-hashes what it has: on the thread pool (SHA-256 and reads release the GIL)
    done = parallel_map(lambda it: is_done(out, it, opened.records), mine)
    n_skipped = sum(done)
    left = {(it.prompt_id, it.seed) for it, d in zip(mine, done, strict=True) if not d}
    if job.world_size > 1:
        left = set().union(*dist.gather_objects(left))
    todo = shard_items([it for it in opened.items if (it.prompt_id, it.seed) in left], job.rank, job.world_size)
    progress_file = out / PROGRESS_DIR / f"{uuid.uuid4().hex}-r{job.rank:03d}.parquet"
    writer = _Writer(out, settings)
    bar = progress_bar(len(todo) + n_skipped, "generate", req.progress and job.rank == 0, unit="img", initial=n_skipped)
    uncond_row = job.fixed.encode_prompts([""]) if req.cfg != 1.0 else None
    last_flush = time.monotonic()
    clock = _Clock()
    clock.seconds.update(first_batch=0.0, other_batches=0.0)
    try:
        with torch.inference_mode():
            step = opened.run_info["effective_batch_size"]
            for s in range(0, len(todo), step):
                batch = todo[s : s + step]
                latents = render_latents(
                    job.fixed, batch, uncond_row, settings.sampler, req.cfg, req.steps, req.eta, settings.schedule
                )
                images = job.fixed.decode(latents).to("cpu", torch.uint8).numpy()
                clock.lap("first_batch" if s == 0 else "other_batches")  # the host copy above waited for the GPU
                for it, img in zip(batch, images, strict=True):
                    writer.submit(it, img)
                bar.update(writer.collect())
                if time.monotonic() - last_flush > req.flush_every_s:
                    flush_records(progress_file, writer.records)
                    last_flush = time.monotonic()
        clock.lap("other_batches")  # the last batch's record flush and PNG hand-off
        bar.update(writer.collect(wait=True))
        clock.lap("png_tail")
    finally:
        writer.pool.shutdown(wait=True)
        bar.close()
    flush_records(progress_file, writer.records)
    return _Share(n_rendered=len(writer.records), n_skipped=n_skipped, seconds=clock.seconds)


def render_latents(
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


#: decoded images queued for the PNG writer at most (:meth:`_Writer.submit`): 256 RGB images of 1024 px are 0.8 GB
MAX_PENDING_PNGS = 256


class _Writer:
    """Encodes and atomically writes PNGs on one background thread (I/O overlaps compute)."""

    def __init__(self, out: Path, settings: GenerationSettings) -> None:
        self.out, self.settings = out, settings
        self.pool = ThreadPoolExecutor(max_workers=1, thread_name_prefix="png-writer")
        self.pending: list[Future] = []
        self.records: list[dict[str, Any]] = []

    def _write(self, item: WorkItem, img: np.ndarray) -> dict[str, Any]:
        data = encode_png(img, png_text(item, self.settings))
        write_image_file(self.out / item.rel_path, data)
        return image_record(item, hashlib.sha256(data).hexdigest(), pixel_sha256(img), img.shape[1], img.shape[2])

    def submit(self, item: WorkItem, img: np.ndarray) -> None:
        """Queue one image; with :data:`MAX_PENDING_PNGS` queued, wait for the oldest first (a model that renders
        faster than one thread encodes would otherwise hold every decoded image of the set in memory)."""
        if len(self.pending) >= MAX_PENDING_PNGS:
            futures_wait(self.pending[: len(self.pending) - MAX_PENDING_PNGS + 1])
        self.pending.append(self.pool.submit(self._write, item, img))

    def collect(self, wait: bool = False) -> int:
        """Move finished writes into ``records`` (raising any write error), in submission order; returns how many."""
        flags = [wait or f.done() for f in self.pending]
        for f, d in zip(self.pending, flags, strict=True):
            if d:
                self.records.append(f.result())
        self.pending = [f for f, d in zip(self.pending, flags, strict=True) if not d]
        return sum(flags)


# ---- 4. finish the set ------------------------------------------------------------------------


def _finish_set(job: _Job, opened: _OpenSet, share: _Share, t_start: float) -> GenerateSummary:
    """Wait for every share; rank 0 writes manifest.parquet and the complete set.json; summarize."""
    t_finish = time.perf_counter()
    dist.barrier()
    if job.rank == 0:
        write_manifest(job.out, opened.items, job.settings, {**opened.run_info, "seconds": time.perf_counter() - t_start})
    dist.barrier()
    seconds = time.perf_counter() - t_start
    return GenerateSummary(
        out_dir=job.out,
        n_images=len(opened.items),
        n_rendered=share.n_rendered,
        n_skipped=share.n_skipped,
        seconds=seconds,
        rank=job.rank,
        world_size=job.world_size,
        settings=job.settings,
        n_prompts=len(job.prompt_set),
        n_seeds=len(job.seed_list),
        n_prompts_dropped=job.prompt_set.n_dropped,
        manifest_path=job.out / MANIFEST_FILE,
        images_per_second=share.n_rendered / seconds if seconds > 0 else 0.0,
        phase_seconds={**job.seconds, **share.seconds, "finish": time.perf_counter() - t_finish},
    )
