"""Fixed-size model calls: images never depend on the batch size or the number of processes.

Owns :class:`FixedBatchAdapter` (every model call on exactly ``micro_batch`` rows, the last chunk
padded), :func:`auto_micro_batch` (the default ``micro_batch`` from the latent size) and
:func:`effective_batch_size` (items per sampler call, rounded up to whole micro-batches).
"""

import math
from collections.abc import Iterator, Sequence
from typing import Any

import numpy as np
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.precision import attention_backend, check_attention_backend

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


#: Largest micro-batch :func:`memory_micro_batch` picks (SD-1.x at 64 rows already fills an H100).
MAX_MEMORY_MICRO_BATCH = 64


def _denoiser_inputs(adapter: ModelAdapter, rows: int) -> tuple[torch.Tensor, torch.Tensor, PromptEmbeds]:
    """Zero latents, a mid-schedule timestep and empty-prompt conditioning for ``rows`` rows (the probes)."""
    x = torch.zeros(rows, *adapter.latent_shape, device=adapter.device, dtype=adapter.dtype)
    t = torch.full((rows,), 500, device=adapter.device,
                   dtype=torch.long if adapter.prediction == "eps" else torch.float32)
    if adapter.prediction != "eps":
        t = t / 1000.0
    return x, t, adapter.encode_prompts([""] * rows)


def check_denoiser_attention(adapter: ModelAdapter, attention: str) -> None:
    """Refuse a forced ``--attention`` backend that has no kernel for the denoiser's attention on its device:
    one forward of 1 row under it (:func:`pcpo_eval.precision.check_attention_backend`), before any work.

    Only the denoiser is asked: it is the only model generation runs under the backend (the text encoder and
    the VAE decoder keep PyTorch's choice, so e.g. SD's VAE with its one 512-wide head never meets a
    backend limited to 256). ``auto`` and ``math`` run nothing.

    Raises:
        pcpo_eval.precision.AttentionBackendError: PyTorch's reasons, on one line.
    """
    if attention in ("auto", "math"):
        return
    x, t, cond = _denoiser_inputs(adapter, 1)

    def forward() -> None:
        with torch.inference_mode():
            adapter.denoise(x, t, cond)

    check_attention_backend(attention, forward)


def memory_micro_batch(adapter: ModelAdapter, fraction: float = 0.5, cap: int = MAX_MEMORY_MICRO_BATCH,
                       attention: str = "auto") -> int:
    """Rows per model call chosen from free GPU memory: the largest power of two whose activations fit.

    Measures one ``denoise`` call on 2 rows (peak allocated minus what was allocated before, so the
    weights are not counted) under the set's attention backend (the math backend holds each attention
    matrix whole), assumes activations grow linearly with rows, and returns the largest
    power of two in ``[2, cap]`` whose estimate fits ``fraction`` of the memory CUDA reports free.
    Only for CUDA: such a micro-batch depends on the card, so sets that use it are identical across
    micro-batches within a tolerance, not bitwise (``batch_invariance: tolerance``).
    """
    device = adapter.device
    if device.type != "cuda":
        raise ValueError("memory_micro_batch needs a CUDA model")
    x, t, cond = _denoiser_inputs(adapter, 2)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode(), attention_backend(attention):
        adapter.denoise(x, t, cond)
    torch.cuda.synchronize(device)
    per_row = max((torch.cuda.max_memory_allocated(device) - base) / 2, 1.0)
    free, _ = torch.cuda.mem_get_info(device)
    rows = 2
    while rows * 2 <= cap and rows * 2 * per_row <= fraction * free:
        rows *= 2
    return rows


def memory_decode_batch(adapter: ModelAdapter, cap: int, fraction: float = 0.5) -> int:
    """Images per VAE decode chosen from free GPU memory: the largest power of two in ``[1, cap]`` whose
    activations fit ``fraction`` of the free memory, measured on one decode of 1 image (as
    :func:`memory_micro_batch` measures the denoiser).

    The decoder's activations per image exceed a denoiser row's many times over at full resolution
    (SD-1.5 at 512 px: the H200 runs peaked at 18 GiB decoding 32 images vs 10 GiB for the diffusers
    pipeline's 16), so the denoiser's micro-batch is no measure of what a decode can hold; at 1024 px
    (SD3, FLUX) each image is 4x that. Only for CUDA ``tolerance`` sets (decode chunks unpadded). Runs with
    PyTorch's attention choice, as the decode itself does (:class:`FixedBatchAdapter`)."""
    device = adapter.device
    if device.type != "cuda":
        raise ValueError("memory_decode_batch needs a CUDA model")
    z = torch.zeros(1, *adapter.latent_shape, device=device, dtype=adapter.dtype)
    torch.cuda.synchronize(device)
    base = torch.cuda.memory_allocated(device)
    torch.cuda.reset_peak_memory_stats(device)
    with torch.inference_mode():
        adapter.decode(z)
    torch.cuda.synchronize(device)
    per_image = max(torch.cuda.max_memory_allocated(device) - base, 1.0)
    free, _ = torch.cuda.mem_get_info(device)
    n = 1
    while n * 2 <= cap and n * 2 * per_image <= fraction * free:
        n *= 2
    return n


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
    differ in the last bits between batch sizes). ``decode_batch`` (``tolerance`` sets on CUDA,
    :func:`memory_decode_batch`): ``decode`` runs unpadded chunks of that many latents instead, so a
    batch's decode costs its own images, not a padded micro-batch of them.

    ``attention`` (``--attention``, :data:`pcpo_eval.precision.ATTENTION_BACKENDS`): the SDPA backend of the
    ``denoise`` calls only, the 50-step loop it is meant to speed up; ``encode_prompts`` and ``decode`` keep
    PyTorch's choice, so attention a forced backend cannot run (SD's VAE: one head of 512 channels; cuDNN and
    flash attention stop at 256) never meets it.
    """

    def __init__(self, inner: ModelAdapter, micro_batch: int = DEFAULT_MICRO_BATCH,
                 decode_batch: int | None = None, attention: str = "auto") -> None:
        if micro_batch < 0:
            raise UserError(f"micro_batch={micro_batch}; use a positive number of rows (0 = off)")
        self.inner = inner
        self.attention = attention
        self.micro_batch = int(micro_batch)
        self.decode_batch = None if decode_batch is None else max(1, int(decode_batch))
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

    def check_prompts(self, prompts: list[str]) -> None:
        self.inner.check_prompts(prompts)

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
        with attention_backend(self.attention):
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
        if self.decode_batch is not None:
            return torch.cat([self.inner.decode(latents[sl]) for sl in _chunks(len(latents), self.decode_batch)])
        m = self.micro_batch
        if m == 0:
            return self.inner.decode(latents)
        return torch.cat(
            [self.inner.decode(_pad_rows(latents[sl], m))[: sl.stop - sl.start] for sl in _chunks(len(latents), m)]
        )
