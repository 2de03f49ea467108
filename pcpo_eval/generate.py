"""Seed-controlled, resumable, sharded rendering of prompt x seed image sets.

Every quality metric compares sets rendered from the same prompts and seeds by the base model
and by each checkpoint (paper App. "Evaluation Details": 45 prompts x 1112 seeds per model), so
an image must depend only on ``(model, settings, prompt_id, seed)``:

1. Noise: image ``(prompt_id, seed)`` draws its initial noise and every stochastic step's noise
   from its own generator :func:`pcpo_eval.seeding.sample_generator` (diffusers' one generator
   per sample), never from a global RNG.
2. Arithmetic: CPU kernels may round differently for different batch shapes (checked: a
   diffusers UNet gives ~1e-6 differences between batch 1 and batch 16). The denoiser, text
   encoder and decoder therefore always run on fixed-size micro-batches of ``micro_batch`` rows
   (:class:`FixedBatchAdapter`, the last one padded), so each row's computation never sees the
   user's batch size or the number of processes. ``micro_batch`` is part of the set's settings.
3. Work split: the plan lists items seed-major (all prompts for seed 0, then seed 1, ...);
   process ``rank`` of ``world`` renders items ``i`` with ``i % world == rank``.

Output layout (the image-set contract)::

    SET/images/p{prompt_id:05d}/s{seed:07d}.png   lossless PNG, text chunks "prompt", "pcpo_eval"
    SET/manifest.parquet                          one row per image (MANIFEST_COLUMNS)
    SET/set.json                                  every setting + run information
    SET/.progress/*.parquet                       per-process records while rendering

Crash safety: each PNG is written to a temp file in its folder and renamed into place
(:func:`write_image_file`), so a PNG that exists is complete after any process death (SIGKILL
included); the re-run skips existing images and re-renders the rest. Unlike
:func:`pcpo_eval.io.atomic_write` the image write does not fsync each file: on this project's
machines that per-file fsync cost 7-11% of throughput. Durability against power loss is handled
in groups instead: every ``flush_every_s`` seconds each process calls ``os.sync()`` and then
atomically rewrites its records (path and hashes) of the images written so far; on resume,
images with a record are trusted, images without one are decoded and re-rendered if unreadable.
Rank 0 writes ``manifest.parquet`` and ``set.json`` through :mod:`pcpo_eval.io` after a barrier.

Implicit Reward Guidance (paper App. "Implicit Reward Guidance", Eq. irg-multi-mix)::

    eps_IRG = eps_ref + sum_i lambda_i (eps_theta_i - eps_ref)      (velocity alike for flows)

is the adapter :class:`IRGAdapter`, selected with the model spec
``irg:CKPT_1=LAMBDA_1,CKPT_2=LAMBDA_2[@REFERENCE]`` (see :func:`parse_irg_spec`).
"""

from __future__ import annotations

import contextlib
import hashlib
import io
import json
import math
import os
import re
import tempfile
import time
import uuid
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ThreadPoolExecutor
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

import numpy as np
import torch
from torch import nn

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_json, atomic_write_parquet, sha256_file
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.prompts import PromptSet, load_prompts
from pcpo_eval.seeding import sample_generator

#: Columns of ``SET/manifest.parquet`` (the image-set contract plus the sampler settings).
MANIFEST_COLUMNS = [
    "prompt_id", "prompt", "seed", "path", "image_sha256", "pixel_sha256", "height", "width",
    "model", "model_hash", "sampler", "steps", "cfg", "eta", "schedule", "micro_batch",
]  # fmt: skip

#: Seed derivation recorded with every set (see :mod:`pcpo_eval.seeding`).
SEED_DERIVATION = "sha256('pcpo-eval/sample/v1/{prompt_id}/{seed}')[:8] little-endian & (2**63-1)"

#: Largest seed / prompt id that fits the fixed-width file names.
MAX_SEED = 9_999_999

#: Rows x latent elements per model call that ``micro_batch=None`` aims for: 16 rows of SD-1.x
#: latents (4 x 64 x 64), i.e. batch 8 with CFG, the common GPU setting.
AUTO_MICRO_BATCH_ELEMENTS = 16 * 4 * 64 * 64
DEFAULT_MICRO_BATCH = 16


def auto_micro_batch(latent_shape: Sequence[int]) -> int:
    """Default rows per model call from the latent size: a power of two in [2, 64].

    ``2**floor(log2(AUTO_MICRO_BATCH_ELEMENTS / numel))``: SD-1.x 512 px -> 16, SD3 512 px -> 4,
    SD3 / FLUX 1024 px -> 2, the toy model (48 x 8 x 8) -> 64. Depends only on the model, so it is
    as reproducible as a fixed number (and recorded in the settings).
    """
    numel = int(np.prod(latent_shape))
    rows = 2 ** int(np.floor(np.log2(max(AUTO_MICRO_BATCH_ELEMENTS / numel, 1.0))))
    return int(min(64, max(2, rows)))


def effective_batch_size(batch_size: int, micro_batch: int, cfg: float) -> int:
    """Items per sampler call: ``batch_size`` rounded up so its rows fill whole micro-batches.

    With CFG every item is 2 rows (eps_u and eps_c in one call). A partly filled micro-batch is
    padded and costs as much as a full one, so rounding up is free in time, and memory per model
    call stays bounded by ``micro_batch`` rows. Images never depend on this number.
    """
    if micro_batch == 0:
        return batch_size
    rows = 2 if cfg != 1.0 else 1
    unit = micro_batch // math.gcd(micro_batch, rows)
    return -(-batch_size // unit) * unit


# ---------------------------------------------------------------------------------------------
# Seeds and work items
# ---------------------------------------------------------------------------------------------

_SEED_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_seeds(spec: str | int | Sequence[int]) -> list[int]:
    """``"N"`` -> seeds 0..N-1; ``"A-B"`` -> A..B inclusive; a list of ints is taken as is.

    Raises :class:`UserError` for anything else (negative, empty, reversed, > 9,999,999, repeats).
    """
    if isinstance(spec, int | np.integer):
        spec = str(int(spec))
    if isinstance(spec, str):
        s = spec.strip()
        if s.isdigit():
            n = int(s)
            if n < 1:
                raise UserError(f"--seeds {spec!r}: need at least one seed; use N >= 1 or A-B")
            seeds = list(range(n))
        elif m := _SEED_RANGE.match(s):
            a, b = int(m.group(1)), int(m.group(2))
            if a > b:
                raise UserError(f"--seeds {spec!r}: range start exceeds its end; write A-B with A <= B")
            seeds = list(range(a, b + 1))
        else:
            raise UserError(f"--seeds {spec!r} is malformed; use N (seeds 0..N-1) or A-B (inclusive)")
    else:
        seeds = [int(v) for v in spec]
        if not seeds:
            raise UserError("no seeds given; use N (seeds 0..N-1) or A-B (inclusive)")
        if min(seeds) < 0 or len(set(seeds)) != len(seeds):
            raise UserError("seeds must be distinct non-negative integers")
    if seeds[-1] > MAX_SEED or max(seeds) > MAX_SEED:
        raise UserError(f"seed {max(seeds)} too large; seeds must be <= {MAX_SEED} (file names use 7 digits)")
    return seeds


@dataclass(frozen=True)
class WorkItem:
    """One image to render: its prompt, prompt id and seed."""

    prompt_id: int
    prompt: str
    seed: int

    @property
    def rel_path(self) -> str:
        """Path relative to the set directory (the image-set contract)."""
        return image_rel_path(self.prompt_id, self.seed)


def image_rel_path(prompt_id: int, seed: int) -> str:
    """``images/p{prompt_id:05d}/s{seed:07d}.png``."""
    return f"images/p{prompt_id:05d}/s{seed:07d}.png"


def plan_items(prompts: PromptSet, seeds: Sequence[int]) -> list[WorkItem]:
    """All items, seed-major: a partial set covers every prompt evenly."""
    return [WorkItem(pid, p, s) for s in seeds for pid, p in prompts]


def shard_items(items: Sequence[WorkItem], rank: int, world: int) -> list[WorkItem]:
    """The deterministic share of process ``rank``: items ``i`` with ``i % world == rank``."""
    return list(items[rank::world])


# ---------------------------------------------------------------------------------------------
# Fixed-shape execution
# ---------------------------------------------------------------------------------------------


def _pad_rows(x: torch.Tensor, m: int) -> torch.Tensor:
    """Pad the batch dim to ``m`` rows with copies of row 0 (rows never interact in a forward)."""
    k = x.shape[0]
    if k == m:
        return x
    return torch.cat([x, x[:1].expand(m - k, *x.shape[1:])])


def _chunks(n: int, m: int) -> Iterator[slice]:
    for s in range(0, n, m):
        yield slice(s, min(s + m, n))


class FixedBatchAdapter(ModelAdapter):
    """Runs the wrapped adapter only on batches of exactly ``micro_batch`` rows.

    ``denoise`` (and so ``predict`` with its 2B CFG batch), ``encode_prompts`` and ``decode``
    split their input into chunks of ``micro_batch`` rows, pad the last chunk with copies of its
    first row, and drop the padding from the output. The result for each row is then identical
    for any outer batch size (rows of one forward pass do not interact; the kernels only see one
    shape). ``micro_batch=0`` turns this off (model calls see the user's batch; images may then
    differ in the last bits between batch sizes).
    """

    def __init__(self, inner: ModelAdapter, micro_batch: int = DEFAULT_MICRO_BATCH) -> None:
        if micro_batch < 0:
            raise UserError(f"micro_batch={micro_batch}; use a positive number of rows (0 = off)")
        self.inner = inner
        self.micro_batch = int(micro_batch)
        self.name = inner.name
        self.prediction = inner.prediction
        self.denoiser = inner.denoiser
        self.scheduler_config = inner.scheduler_config
        self.latent_shape = tuple(inner.latent_shape)
        self.lora_target_modules = list(getattr(inner, "lora_target_modules", []))

    def __getattr__(self, name: str) -> Any:
        """Other adapter attributes (``image_seq_len``, ``spec``, ...) come from the wrapped one."""
        if name == "inner":
            raise AttributeError(name)
        return getattr(self.inner, name)

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        if self.micro_batch == 0:
            return self.inner.encode_prompts(prompts)
        m, out = self.micro_batch, []
        for sl in _chunks(len(prompts), m):
            chunk = list(prompts[sl])
            k = len(chunk)
            emb = self.inner.encode_prompts(chunk + [""] * (m - k))
            out.append(emb.index(slice(0, k)))
        return PromptEmbeds.cat(out)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        if self.micro_batch == 0:
            return self.inner.denoise(x_t, t, cond)
        m, out = self.micro_batch, []
        for sl in _chunks(x_t.shape[0], m):
            k = sl.stop - sl.start
            c = cond.index(sl)
            c = PromptEmbeds(_pad_rows(c.hidden, m), None if c.pooled is None else _pad_rows(c.pooled, m))
            out.append(self.inner.denoise(_pad_rows(x_t[sl], m), _pad_rows(t[sl], m), c)[:k])
        return torch.cat(out)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        m = self.micro_batch
        if m == 0:
            return self.inner.decode(latents)
        return torch.cat(
            [self.inner.decode(_pad_rows(latents[sl], m))[: sl.stop - sl.start] for sl in _chunks(len(latents), m)]
        )


# ---------------------------------------------------------------------------------------------
# Implicit Reward Guidance
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class IRGSpec:
    """Parsed ``irg:`` model spec: fine-tuned components with weights, and the reference."""

    components: tuple[tuple[str, float], ...]
    reference: str | None = None


def parse_irg_spec(spec: str) -> IRGSpec:
    """Parse ``irg:CKPT_1=L_1,CKPT_2=L_2[@REF]`` (``=L`` defaults to 1.0; ``@REF`` to the base).

    Each ``CKPT`` and ``REF`` is any model spec :func:`load_generation_model` accepts
    (``base``, ``toy``, ``sd1:PATH``, ``RUN/checkpoints/epoch_0010``). Commas separate components;
    the weight is the text after the last ``=``; the reference is the text after the last ``@``.
    Example: ``irg:runs/a/checkpoints/epoch_0010=0.5,runs/b/checkpoints/epoch_0020=0.5@base``.
    """
    body = spec[4:] if spec.startswith("irg:") else spec
    reference: str | None = None
    if "@" in body:
        body, reference = body.rsplit("@", 1)
        reference = reference.strip()
        if not reference:
            raise UserError(f"IRG spec {spec!r}: empty reference after '@'; write irg:CKPT=LAMBDA@REF")
    components = []
    for part in body.split(","):
        part = part.strip()
        if not part:
            raise UserError(f"IRG spec {spec!r}: empty component; write irg:CKPT=LAMBDA[,CKPT=LAMBDA][@REF]")
        path, lam = part, 1.0
        if "=" in part:
            path, lam_s = part.rsplit("=", 1)
            try:
                lam = float(lam_s)
            except ValueError:
                raise UserError(f"IRG spec {spec!r}: weight {lam_s!r} is not a number") from None
            if not np.isfinite(lam):
                raise UserError(f"IRG spec {spec!r}: weight {lam_s!r} must be finite")
        if not path.strip():
            raise UserError(f"IRG spec {spec!r}: component {part!r} has no checkpoint")
        components.append((path.strip(), lam))
    return IRGSpec(tuple(components), reference)


def irg_combine(ref_out: torch.Tensor, outs: Sequence[torch.Tensor], lambdas: Sequence[float]) -> torch.Tensor:
    """eps_ref + sum_i lambda_i (eps_i - eps_ref)   (paper Eq. irg-multi-mix; pure function)."""
    total = ref_out.clone()
    for out, lam in zip(outs, lambdas, strict=True):
        total += lam * (out - ref_out)
    return total


class IRGAdapter(ModelAdapter):
    """Implicit Reward Guidance over a reference and one or more fine-tuned denoisers.

    Prompt encoding and decoding come from the reference (RL fine-tuning changes only the
    denoiser). CFG is applied on top by :meth:`ModelAdapter.predict`; both are linear, so the
    order does not matter.
    """

    def __init__(self, reference: ModelAdapter, components: Sequence[tuple[ModelAdapter, float]]) -> None:
        if not components:
            raise UserError("IRG needs at least one fine-tuned checkpoint")
        for comp, _ in components:
            if comp.prediction != reference.prediction or tuple(comp.latent_shape) != tuple(reference.latent_shape):
                raise UserError(
                    f"IRG component {comp.name!r} ({comp.prediction}, latent {tuple(comp.latent_shape)}) does not "
                    f"match the reference ({reference.prediction}, latent {tuple(reference.latent_shape)}); "
                    "use checkpoints of the same base model"
                )
        self.reference = reference
        self.components = [c for c, _ in components]
        self.lambdas = [float(lam) for _, lam in components]
        self.name = f"irg({reference.name})"
        self.prediction = reference.prediction
        self.denoiser = nn.ModuleList([reference.denoiser, *(c.denoiser for c in self.components)])
        self.scheduler_config = reference.scheduler_config
        self.latent_shape = tuple(reference.latent_shape)
        self.lora_target_modules = list(getattr(reference, "lora_target_modules", []))

    def __getattr__(self, name: str) -> Any:
        """Other adapter attributes (``image_seq_len``, ...) come from the reference."""
        if name == "reference":
            raise AttributeError(name)
        return getattr(self.reference, name)

    def encode_prompts(self, prompts: list[str]) -> PromptEmbeds:
        return self.reference.encode_prompts(prompts)

    def denoise(self, x_t: torch.Tensor, t: torch.Tensor, cond: PromptEmbeds) -> torch.Tensor:
        ref = self.reference.denoise(x_t, t, cond)
        return irg_combine(ref, [c.denoise(x_t, t, cond) for c in self.components], self.lambdas)

    def decode(self, latents: torch.Tensor) -> torch.Tensor:
        return self.reference.decode(latents)


# ---------------------------------------------------------------------------------------------
# Model loading and hashing
# ---------------------------------------------------------------------------------------------


def module_sha256(module: nn.Module) -> str:
    """SHA-256 over a module's state dict (sorted names, dtype, shape and raw bytes)."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def adapter_hash(adapter: ModelAdapter) -> str:
    """The ``model_hash`` of a set: the denoiser's weights (what fine-tuning changes).

    For IRG: a hash of the reference's and each component's hash with its lambda.
    """
    if isinstance(adapter, FixedBatchAdapter):
        return adapter_hash(adapter.inner)
    if isinstance(adapter, IRGAdapter):
        doc = {
            "irg": [[adapter_hash(c), lam] for c, lam in zip(adapter.components, adapter.lambdas, strict=True)],
            "reference": adapter_hash(adapter.reference),
        }
        return hashlib.sha256(json.dumps(doc, sort_keys=True).encode()).hexdigest()
    return module_sha256(adapter.denoiser)


def _load_single(spec: str, device: str) -> ModelAdapter:
    """One model spec -> adapter, via the checkpoint resolver (or the model registry before it exists)."""
    try:
        from pcpo_eval.checkpoints import load_model_from_spec
    except ImportError:
        try:
            from pcpo_eval.models.registry import load_model
        except ImportError as exc:
            raise UserError(f"cannot load model {spec!r}: no model registry in this install ({exc})") from exc
        return load_model(spec, device=device)
    return load_model_from_spec(spec, device=device)


def default_irg_reference(checkpoint_spec: str) -> str:
    """The base model a checkpoint was fine-tuned from (the IRG reference when ``@REF`` is omitted).

    Read from the checkpoint's ``checkpoint.json`` (``model``) or its run's ``config.yaml``
    (``model``); ``base`` when the spec is not a checkpoint.
    """
    from pcpo_eval import checkpoints

    ckpt = checkpoints.resolve_checkpoint(checkpoint_spec)
    if ckpt is None:
        return "base"
    meta = checkpoints.read_meta(ckpt)
    return str(meta.get("model") or checkpoints.load_run_config(checkpoints.run_dir_of(ckpt)).get("model", "base"))


def load_generation_model(spec: str, device: str = "cpu") -> ModelAdapter:
    """Resolve ``--model``: a plain model / checkpoint spec, or ``irg:...`` (:func:`parse_irg_spec`)."""
    if not isinstance(spec, str) or not spec.strip():
        raise UserError("empty --model; use base, toy, sd1:PATH, RUN/checkpoints/epoch_NNNN or irg:...")
    if spec.startswith("irg:"):
        irg = parse_irg_spec(spec)
        ref_spec = irg.reference or default_irg_reference(irg.components[0][0])
        reference = _load_single(ref_spec, device)
        comps = [(_load_single(p, device), lam) for p, lam in irg.components]
        return IRGAdapter(reference, comps)
    return _load_single(spec, device)


# ---------------------------------------------------------------------------------------------
# Samplers
# ---------------------------------------------------------------------------------------------


def _sample_ddim(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> torch.Tensor:
    """DDIM (:func:`pcpo_eval.samplers.ddim.sample_ddim`); ``schedule`` = sigma schedule ddim|pcpo."""
    from pcpo_eval.samplers.ddim import sample_ddim

    return sample_ddim(
        adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators, sigma_schedule=schedule
    ).latents


def _sample_flow(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> torch.Tensor:
    """Flow matching (:func:`pcpo_eval.samplers.flow.sample_flow`); ``schedule`` = SDE dance|flowgrpo|ode."""
    from pcpo_eval.samplers.flow import sample_flow

    return sample_flow(adapter, cond, uncond, cfg=cfg, steps=steps, eta=eta, generators=generators, sde=schedule).latents


#: Per sampler: its noise-schedule choices (first = default) for ``generate_set(schedule=...)``.
SCHEDULES: dict[str, tuple[str, ...]] = {"ddim": ("ddim", "pcpo"), "flow": ("ode", "dance", "flowgrpo")}

#: Sampler name -> fn(adapter, cond, uncond, *, cfg, steps, eta, generators, schedule) -> latents.
SAMPLERS: dict[str, Callable[..., torch.Tensor]] = {"ddim": _sample_ddim, "flow": _sample_flow}
_PREDICTION_SAMPLER = {"eps": "ddim", "velocity": "flow"}


def resolve_sampler(name: str, prediction: str) -> str:
    """``auto`` -> ``ddim`` for eps models, ``flow`` for velocity models; check compatibility."""
    if name == "auto":
        return _PREDICTION_SAMPLER[prediction]
    if name not in SAMPLERS:
        raise UserError(f"unknown sampler {name!r}; choose one of: auto, {', '.join(SAMPLERS)}")
    if _PREDICTION_SAMPLER[prediction] != name:
        raise UserError(f"sampler {name!r} does not fit a {prediction}-prediction model; use --sampler auto")
    return name


# ---------------------------------------------------------------------------------------------
# PNG output
# ---------------------------------------------------------------------------------------------


def encode_png(image_chw: torch.Tensor | np.ndarray, text: dict[str, str]) -> bytes:
    """Lossless PNG bytes of one uint8 (3, H, W) image with tEXt/iTXt chunks ``text``."""
    from PIL import Image
    from PIL.PngImagePlugin import PngInfo

    arr = image_chw.numpy() if isinstance(image_chw, torch.Tensor) else np.asarray(image_chw)
    if arr.dtype != np.uint8 or arr.ndim != 3 or arr.shape[0] != 3:
        raise ValueError(f"expected uint8 (3, H, W), got {arr.dtype} {arr.shape}")
    info = PngInfo()
    for k, v in text.items():
        info.add_itxt(k, v)
    buf = io.BytesIO()
    Image.fromarray(np.ascontiguousarray(arr.transpose(1, 2, 0)), "RGB").save(
        buf, format="PNG", pnginfo=info, compress_level=6
    )
    return buf.getvalue()


def write_image_file(path: Path, data: bytes) -> None:
    """Temp file in the same folder, then ``os.replace``: never a partial file at ``path``.

    No fsync per file (see the module docstring); the records flush syncs in groups.
    """
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    try:
        with os.fdopen(fd, "wb") as fh:
            fh.write(data)
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def png_is_readable(path: Path) -> bool:
    """The PNG decodes completely (guards against files cut short by a power loss)."""
    from PIL import Image

    try:
        with Image.open(path) as im:
            im.load()
        return True
    except (OSError, SyntaxError, ValueError):
        return False


def read_png_text(path: str | Path) -> dict[str, str]:
    """The text chunks of a PNG written by :func:`encode_png`."""
    from PIL import Image

    with Image.open(path) as im:
        return dict(getattr(im, "text", {}))


def pixel_sha256(image_chw: np.ndarray) -> str:
    """SHA-256 of the raw uint8 pixels in (H, W, 3) order (independent of PNG metadata)."""
    return hashlib.sha256(np.ascontiguousarray(np.asarray(image_chw).transpose(1, 2, 0)).tobytes()).hexdigest()


def _png_pixels(path: Path) -> np.ndarray:
    from PIL import Image

    with Image.open(path) as im:
        return np.asarray(im.convert("RGB")).transpose(2, 0, 1)


# ---------------------------------------------------------------------------------------------
# Settings, records, summary
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationSettings:
    """Everything that determines an image's pixels besides (prompt, prompt_id, seed).

    A set directory holds images of exactly one settings value; resuming with different settings
    is refused. ``model`` is the spec as given (informational); compatibility uses the rest.
    """

    model: str
    model_hash: str
    model_name: str
    prediction: str
    sampler: str
    steps: int
    cfg: float
    eta: float
    schedule: str
    micro_batch: int
    device: str
    seed_derivation: str = SEED_DERIVATION

    def compat_key(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("model")
        return d


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
    images_per_second: float = field(default=0.0)


def _record(item: WorkItem, image_sha: str, pix_sha: str, h: int, w: int) -> dict[str, Any]:
    return {
        "prompt_id": item.prompt_id, "prompt": item.prompt, "seed": item.seed, "path": item.rel_path,
        "image_sha256": image_sha, "pixel_sha256": pix_sha, "height": h, "width": w,
    }  # fmt: skip


def _png_text(item: WorkItem, settings: GenerationSettings) -> dict[str, str]:
    meta = {"prompt_id": item.prompt_id, "seed": item.seed, "prompt": item.prompt, **asdict(settings)}
    return {"prompt": item.prompt, "pcpo_eval": json.dumps(meta, sort_keys=True)}


# ---------------------------------------------------------------------------------------------
# Distributed helpers (torchrun / accelerate set RANK and WORLD_SIZE)
# ---------------------------------------------------------------------------------------------


def dist_rank_world() -> tuple[int, int]:
    """``(rank, world_size)``; initializes a gloo process group under torchrun/accelerate."""
    import torch.distributed as dist

    if dist.is_available() and dist.is_initialized():
        return dist.get_rank(), dist.get_world_size()
    world = int(os.environ.get("WORLD_SIZE", "1"))
    if world > 1:
        dist.init_process_group("gloo")
        return dist.get_rank(), dist.get_world_size()
    return 0, 1


def _barrier(world: int) -> None:
    if world > 1:
        import torch.distributed as dist

        dist.barrier()


# ---------------------------------------------------------------------------------------------
# Set directory state
# ---------------------------------------------------------------------------------------------


def _check_out_dir(out: Path, settings: GenerationSettings) -> None:
    """Refuse a directory that is not ours or holds images of other settings (nothing written)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; choose a directory")
    set_json = out / "set.json"
    if not set_json.exists():
        if any(p for p in out.iterdir() if p.name not in (".progress", "images")) or any(
            (out / "images").glob("*/*.png")
        ):
            raise UserError(f"--out {str(out)!r} exists and is not an image set; choose a new or empty directory")
        return
    try:
        old = json.loads(set_json.read_text())["settings"]
    except (ValueError, KeyError) as exc:
        raise UserError(f"{set_json} is unreadable ({exc}); choose a new --out directory") from exc
    new = settings.compat_key()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        k = diff[0]
        raise UserError(
            f"{str(out)!r} holds images rendered with {k}={old.get(k)!r}, not {new[k]!r}; "
            "use a new --out directory (or the original settings to resume)"
        )


def _remove_stale_tmp(out: Path) -> int:
    """Delete temp files left by a killed atomic write (never counted as images)."""
    n = 0
    for p in list((out / "images").glob("*/.*.tmp")) + list(out.glob(".*.tmp")) + list(out.glob(".progress/.*.tmp")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


def _load_records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Known image records from a previous manifest and any per-process progress files."""
    import pandas as pd

    recs: dict[tuple[int, int], dict[str, Any]] = {}
    files = ([out / "manifest.parquet"] if (out / "manifest.parquet").exists() else []) + sorted(
        (out / ".progress").glob("*.parquet")
    )
    for f in files:
        try:
            df = pd.read_parquet(f)
        except Exception:  # noqa: BLE001 - a damaged progress file only costs re-hashing
            continue
        for r in df.to_dict("records"):
            recs[(int(r["prompt_id"]), int(r["seed"]))] = {k: r[k] for k in r if k in MANIFEST_COLUMNS}
    return recs


def _check_existing_prompts(
    out: Path, items: Sequence[WorkItem], records: dict[tuple[int, int], dict[str, Any]]
) -> None:
    """An existing image must have been rendered for the same prompt text as requested now."""
    for it in items:
        rec = records.get((it.prompt_id, it.seed))
        path = out / it.rel_path
        if rec is not None:
            old = rec["prompt"]
        elif path.exists():
            try:
                old = read_png_text(path).get("prompt")
            except (OSError, SyntaxError, ValueError):
                continue  # unreadable: its owner re-renders it
        else:
            continue
        if old is not None and old != it.prompt:
            raise UserError(
                f"{it.rel_path} in {str(out)!r} was rendered for prompt {old!r}, but prompt_id {it.prompt_id} is "
                f"now {it.prompt!r}; use a new --out directory"
            )


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
        rank, world_size = dist_rank_world()
    items = plan_items(prompt_set, seed_list)
    records = _load_records(out) if out.exists() else {}
    if out.exists():
        _check_existing_prompts(out, items, records)
    _barrier(world_size)

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
    _barrier(world_size)

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
    _barrier(world_size)
    manifest_path = out / "manifest.parquet"
    if rank == 0:
        _write_manifest(out, items, settings, {**run_info, "seconds": time.perf_counter() - t_start})
    _barrier(world_size)
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
