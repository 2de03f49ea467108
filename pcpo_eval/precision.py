"""The one home of numeric precision: ``fp32 | tf32 | bf16 | fp16`` for generation and evaluation.

A *precision* names both the dtype the model's weights and activations are held in and whether
CUDA may use TF32 tensor cores for fp32 matrix products and convolutions:

=========  ==============  ====================================================================
name       weights         fp32 matmul / conv on CUDA
=========  ==============  ====================================================================
``fp32``   float32         true fp32 (TF32 off): the CPU-comparable reference
``tf32``   float32         TF32 tensor cores (10-bit mantissa inputs, fp32 accumulate)
``bf16``   bfloat16        (no fp32 products left in the network)
``fp16``   float16         (idem)
=========  ==============  ====================================================================

The default (:func:`resolve_precision` of ``auto``) is ``bf16`` on CUDA, the precision DDPO,
DanceGRPO and Flow-GRPO sample in, and ``fp32`` on CPU, where bf16 is slower and the toy world's
bit-identity tests are defined. Sampler state (latents, the DDIM / Euler update, log-probabilities)
always stays float32 whatever the model's precision (:mod:`pcpo_eval.samplers`): only the network
runs in the reduced precision, as accelerate's mixed precision does for training.

Evaluation (``metrics``, ``features``) takes only ``fp32`` and ``tf32`` (:data:`EVAL_PRECISIONS`): the
feature networks keep float32 weights, and :func:`numerics_key` (device type + precision) keys their
caches. Training takes ``allow_tf32`` (``pcpo_eval.train.config``), read through
:func:`matmul_precision` like the rest.

Also here, as the other kernel choice that changes a network's numbers: the *attention backend* of
``torch.nn.functional.scaled_dot_product_attention`` (diffusers' default attention processor), see
:data:`ATTENTION_BACKENDS`, :func:`attention_backend` and :func:`check_attention_backend`.
"""

from __future__ import annotations

import contextlib
import warnings
from collections.abc import Callable, Iterator

import torch

from pcpo_eval.errors import UserError

#: Accepted ``--precision`` values (``auto`` resolves by device).
PRECISIONS = ("fp32", "tf32", "bf16", "fp16")

_DTYPES = {"fp32": torch.float32, "tf32": torch.float32, "bf16": torch.bfloat16, "fp16": torch.float16}


def resolve_precision(name: str | None, device: str | torch.device) -> str:
    """``auto`` / None -> ``bf16`` on CUDA, ``fp32`` elsewhere; any other name is checked.

    Raises:
        UserError: an unknown name (one line naming the choices).
    """
    key = "auto" if name is None else str(name).strip().lower()
    if key == "auto":
        return "bf16" if torch.device(device).type == "cuda" else "fp32"
    if key not in PRECISIONS:
        raise UserError(f"unknown --precision {name!r}; choose auto, {', '.join(PRECISIONS)}")
    return key


#: Accepted ``metrics`` / ``features`` ``--precision`` values: the feature networks (Inception, DINOv2,
#: LPIPS, reward models) keep float32 weights, the reference convention of clean-fid and
#: torch-fidelity; only whether CUDA may use TF32 tensor cores for their products is a choice. (A reward
#: model's own ``dtype`` option, default float32, and ``vlm_bertscore``'s ``captioner_dtype``, default the
#: checkpoint's dtype on CUDA as LLaVA-server runs its fp16 captioner, are the reward's settings.)
EVAL_PRECISIONS = ("fp32", "tf32")


def resolve_eval_precision(name: str | None) -> str:
    """The evaluation precision ``name`` (None / ``auto`` -> ``fp32``: TF32 off, CPU-comparable features).

    Raises:
        UserError: an unknown name, or a reduced dtype (bf16/fp16), which no FID reference uses.
    """
    key = "auto" if name is None else str(name).strip().lower()
    if key == "auto":
        return "fp32"
    if key not in EVAL_PRECISIONS:
        raise UserError(f"unknown --precision {name!r} for evaluation; choose fp32 (TF32 off, the default) or "
                        "tf32 (feature networks keep float32 weights, as clean-fid's and torch-fidelity's do)")
    return key


def numerics_key(device: str | torch.device, precision: str) -> str:
    """What decides an evaluation network's floating-point numbers besides its weights and inputs: the
    device type and the precision (``cpu-fp32``, ``cuda-fp32``, ``cuda-tf32``). Part of the feature and
    reward caches' keys, so features computed by other kernels never mix into one statistic (a set
    resumed on another machine, or measured once on a CPU and once on a GPU, computes afresh)."""
    return f"{torch.device(device).type}-{precision}"


def dtype_precision(dtype: torch.dtype) -> str | None:
    """The precision whose weights have ``dtype`` (float32 -> ``fp32``), None for another dtype."""
    return {torch.float32: "fp32", torch.bfloat16: "bf16", torch.float16: "fp16"}.get(dtype)


def dtype_name_precision(name: str) -> str | None:
    """The precision of a dtype written as torch spells it (``"bfloat16"`` -> ``bf16``; a checkpoint's
    ``torch_dtype``, a reward's ``dtype`` option), None for any other text."""
    dtype = getattr(torch, str(name), None)  # canonical names only: torch.half is float16, but not "half"
    return dtype_precision(dtype) if isinstance(dtype, torch.dtype) and str(dtype) == f"torch.{name}" else None


def precision_dtype(name: str) -> torch.dtype:
    """The weights' dtype of a precision (``tf32`` -> float32)."""
    return _DTYPES[name]


@contextlib.contextmanager
def matmul_precision(name: str) -> Iterator[None]:
    """Allow TF32 for fp32 CUDA matmuls and convolutions exactly when ``name == "tf32"`` (restored after).

    ``fp32`` turns TF32 *off* explicitly: PyTorch's default allows it for cuDNN convolutions, so an
    unguarded "fp32" run on an Ampere-or-later GPU is silently a TF32 run for the UNet's convolutions.
    Matmuls through ``torch.set_float32_matmul_precision`` (``highest`` / ``high``), the setting users and
    inductor (``--compile``) read back with ``torch.get_float32_matmul_precision``: setting the older
    ``cuda.matmul.allow_tf32`` flag after a user's ``set_float32_matmul_precision`` call leaves a state in
    which that read raises. cuDNN through ``cudnn.allow_tf32``, which sets its convolutions and RNNs
    together (set apart, reading the flag raises).
    """
    allow, matmul = name == "tf32", torch.backends.cuda.matmul
    old_new_api = getattr(matmul, "fp32_precision", None)
    try:
        old_matmul: str | None = torch.get_float32_matmul_precision()
    except RuntimeError:  # a state PyTorch cannot read back: the caller mixed its two APIs before us
        old_matmul = None
    old_cudnn = torch.backends.cudnn.allow_tf32
    torch.set_float32_matmul_precision("high" if allow else "highest")
    torch.backends.cudnn.allow_tf32 = allow
    try:
        yield
    finally:
        if old_matmul is not None:
            torch.set_float32_matmul_precision(old_matmul)
        elif old_new_api is not None:
            matmul.fp32_precision = old_new_api
        torch.backends.cudnn.allow_tf32 = old_cudnn


#: Accepted ``--attention`` values: ``auto`` lets PyTorch pick per call (flash attention on recent GPUs
#: for bf16/fp16, memory-efficient or math otherwise); the others force one SDPA backend.
ATTENTION_BACKENDS = ("auto", "math", "flash", "efficient", "cudnn")

#: backends PyTorch has on a CPU (flash has a CPU kernel; efficient and cudnn are CUDA only)
_CPU_ATTENTION = ("auto", "math", "flash")

_SDPA_NAMES = {"math": "MATH", "flash": "FLASH_ATTENTION", "efficient": "EFFICIENT_ATTENTION",
               "cudnn": "CUDNN_ATTENTION"}


def resolve_attention(name: str | None, device: str | torch.device) -> str:
    """The attention backend ``name`` (None -> ``auto``), checked against the device.

    Raises:
        UserError: an unknown name, or a CUDA-only backend on another device (one line naming the choices).
    """
    key = "auto" if name is None else str(name).strip().lower()
    if key not in ATTENTION_BACKENDS:
        raise UserError(f"unknown --attention {name!r}; choose {', '.join(ATTENTION_BACKENDS)}")
    if torch.device(device).type != "cuda" and key not in _CPU_ATTENTION:
        raise UserError(f"--attention {key} runs on CUDA only; on {torch.device(device).type} choose "
                        f"{', '.join(_CPU_ATTENTION)}")
    return key


#: Intra-op threads of each process rendering on a CPU. Torch's CPU kernels (the UNet's convolutions) reduce in
#: an order that depends on the thread count: the toy UNet's outputs were 5.4e-7 apart at 1 and 2 threads, which
#: flipped pixels by one level, and ``torchrun`` sets ``OMP_NUM_THREADS=1``, so a plain 2-thread render and a
#: 2-process ``torchrun`` render of one set differed (1 of 7 images). One thread per process makes a set the
#: same for any number of processes; parallelise a CPU render with ``torchrun --nproc_per_node N``.
CPU_RENDER_THREADS = 1


def render_threads(device: str | torch.device) -> int | None:
    """The intra-op thread count a render on ``device`` runs with (None off the CPU: the GPU's kernels decide)."""
    return CPU_RENDER_THREADS if torch.device(device).type == "cpu" else None


@contextlib.contextmanager
def cpu_render_threads(device: str | torch.device) -> Iterator[None]:
    """Run a CPU render with :data:`CPU_RENDER_THREADS` intra-op threads (restored after; nothing off the CPU)."""
    threads = render_threads(device)
    if threads is None or threads == torch.get_num_threads():
        yield
        return
    old = torch.get_num_threads()
    torch.set_num_threads(threads)
    try:
        yield
    finally:
        torch.set_num_threads(old)


@contextlib.contextmanager
def attention_backend(name: str) -> Iterator[None]:
    """Run ``scaled_dot_product_attention`` with only backend ``name`` (``auto``: PyTorch's choice, unchanged).

    A forced backend that cannot take a call's shapes or dtype fails at that call with PyTorch's
    ``No available kernel`` (on CUDA flash attention takes fp16/bf16 and head dims up to 256; cuDNN takes
    head dims that are multiples of 8, up to 256 on sm90/sm10x GPUs with a recent cuDNN and 128 on others:
    PyTorch's ``sdp_utils.cpp``). Generation therefore forces it only around the
    denoiser's calls (:class:`pcpo_eval.generate.fixed_batch.FixedBatchAdapter`), checked once before
    any work by :func:`check_attention_backend`; the text encoder and the VAE decoder keep PyTorch's choice.
    """
    if name == "auto":
        yield
        return
    from torch.nn.attention import SDPBackend, sdpa_kernel

    with sdpa_kernel([getattr(SDPBackend, _SDPA_NAMES[name])]):
        yield


class AttentionBackendError(UserError, RuntimeError):
    """A forced ``--attention`` backend has no kernel for the denoiser's attention on this device.

    A :class:`UserError` (one ``error:`` line, exit 2: the flag is the cause and another value the fix)
    and a ``RuntimeError``, the class of the error PyTorch raises for it, so code that caught PyTorch's
    error (a benchmark timing each backend) catches this one too.
    """


#: what PyTorch's SDPA dispatcher raises when no enabled backend can take a call
_NO_KERNEL = "No available kernel"

#: the warning that heads PyTorch's reasons for not using each backend (``select_sdp_backend``, sdp_utils.cpp)
_WHY_HEADERS = {"flash": "Flash attention kernel not used because:",
                "efficient": "Memory efficient kernel not used because:",
                "cudnn": "cuDNN attention kernel not used because:"}


def _no_kernel_reasons(name: str, messages: list[str]) -> str:
    """PyTorch's reasons for backend ``name`` out of its warnings: those after ``name``'s header (the other,
    disabled backends' reasons are noise), else every warning but the headers and "runtime disabled" ones."""
    said = [" ".join(m.split()) for m in messages]
    mine, current = [], None
    for m in said:
        if m.endswith("not used because:"):
            current = m
        elif current == _WHY_HEADERS.get(name):
            mine.append(m)
    if not mine:
        mine = [m for m in said if m and not m.endswith("because:") and "disabled" not in m]
    return " ".join(dict.fromkeys(mine))[:400]


def check_attention_backend(name: str, call: Callable[[], object]) -> None:
    """Run ``call`` (one small forward of the denoiser) under backend ``name``; refuse a backend without a kernel.

    PyTorch decides per call whether a backend can take it, by rules that depend on the head dim, the dtype,
    the GPU and the cuDNN version (``sdp_utils.cpp``): running the denoiser once under the forced backend
    asks PyTorch itself instead of copying those rules. ``auto`` and ``math`` (which takes any shape) are
    not probed. An error other than PyTorch's ``No available kernel`` propagates unchanged.

    Raises:
        AttentionBackendError: PyTorch found no kernel; the one-line message carries the reasons PyTorch
            gave in its warnings (e.g. ``head_dim should be no more than 256``).
    """
    if name in ("auto", "math"):
        return
    with warnings.catch_warnings(record=True) as caught:
        warnings.simplefilter("always")
        try:
            with attention_backend(name):
                call()
        except RuntimeError as exc:
            if _NO_KERNEL not in str(exc):
                raise
            why = _no_kernel_reasons(name, [str(w.message) for w in caught]) or str(exc).splitlines()[0]
            raise AttentionBackendError(
                f"--attention {name}: PyTorch has no {name} kernel for this model's denoiser attention on this "
                f"device ({why}); use --attention auto (PyTorch's choice per call) or math (takes any shape)"
            ) from None
    for w in caught:  # a backend that works: the probe's other warnings, shown as they would have been
        warnings.warn_explicit(w.message, w.category, w.filename, w.lineno)


def deterministic_cuda() -> None:
    """Ask CUDA for run-to-run reproducible kernels (the trainer's bitwise resume on a GPU).

    cuDNN picks deterministic convolution algorithms (no autotuning), PyTorch's deterministic
    implementations replace atomics-based ones (a warning names any op without one), and cuBLAS gets
    the fixed workspace it needs for reproducible reductions (``CUBLAS_WORKSPACE_CONFIG``; effective
    when set before the process's first cuBLAS call, as the trainer does). Without this, two runs of
    the same seed drift apart by ~1e-4 in reward after one update (measured on an H200, docs/gpu.md).
    """
    import os

    os.environ.setdefault("CUBLAS_WORKSPACE_CONFIG", ":4096:8")
    torch.backends.cudnn.benchmark = False
    torch.backends.cudnn.deterministic = True
    torch.use_deterministic_algorithms(True, warn_only=True)
