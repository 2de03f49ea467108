"""The one torch.distributed set-up: join the process group torchrun / accelerate describe.

``torchrun`` and ``accelerate launch`` set ``RANK``, ``WORLD_SIZE``, ``LOCAL_RANK``, ``MASTER_ADDR``
and ``MASTER_PORT``; :func:`init` joins the group they describe (gloo on CPU; on CUDA NCCL for
device tensors and gloo for host tensors, each process on its own GPU), and the helpers below work
with or without a group (a single process is rank 0 of 1), so library code never branches on how it
was launched. Also this process's device (:func:`pick_device`,
:func:`resolve_device`) and the host-to-device copy that does not stall the host (:func:`to_device_async`).
"""

from __future__ import annotations

import datetime
import os
from typing import Any

import torch
import torch.distributed as dist

from pcpo_eval.errors import UserError


def env_world_size() -> int:
    """``WORLD_SIZE`` as set by the launcher (1 when launched as a plain process)."""
    raw = os.environ.get("WORLD_SIZE", "1")
    try:
        return int(raw)
    except ValueError:
        raise UserError(f"WORLD_SIZE={raw!r} is not a number of processes; launch with torchrun or accelerate "
                        "launch, or unset it") from None


#: how long a collective waits for the slowest rank, in seconds (environment ``PCPO_EVAL_DIST_TIMEOUT_S``):
#: torch's default (30 min for gloo) failed a render whose ranks finished their shares that far apart
DEFAULT_TIMEOUT_S = 6 * 3600
TIMEOUT_ENV = "PCPO_EVAL_DIST_TIMEOUT_S"


def group_timeout() -> datetime.timedelta:
    """The process group's collective timeout: :data:`TIMEOUT_ENV` seconds, else :data:`DEFAULT_TIMEOUT_S`."""
    raw = os.environ.get(TIMEOUT_ENV, "").strip()
    if not raw:
        return datetime.timedelta(seconds=DEFAULT_TIMEOUT_S)
    try:
        seconds = float(raw)
    except ValueError:
        seconds = float("nan")
    if not seconds > 0 or seconds == float("inf"):
        raise UserError(f"{TIMEOUT_ENV}={raw!r}; give the seconds a collective may wait for the slowest rank "
                        f"(a positive number, e.g. {DEFAULT_TIMEOUT_S}), or unset it")
    return datetime.timedelta(seconds=seconds)


def init(device: str | torch.device = "cpu") -> tuple[int, int]:
    """Join the launcher's process group when ``WORLD_SIZE > 1``; return ``(rank, world_size)``.

    The group and this process's device come from :func:`group_backend`; its timeout from
    :func:`group_timeout`. ``WORLD_SIZE`` without the rendezvous address a launcher sets is one UserError
    (it was a traceback: "MASTER_ADDR expected, but not set"). Idempotent.
    """
    if is_initialized():
        return dist.get_rank(), dist.get_world_size()
    if env_world_size() <= 1:
        return 0, 1
    missing = [k for k in ("RANK", "MASTER_ADDR", "MASTER_PORT") if not os.environ.get(k)]
    if missing:
        raise UserError(f"WORLD_SIZE={env_world_size()} but {', '.join(missing)} not set: launch with torchrun or "
                        "accelerate launch (they set them all), or unset WORLD_SIZE to run one process")
    backend, cuda_device = group_backend(device)
    timeout = group_timeout()
    if cuda_device is None:
        dist.init_process_group(backend, timeout=timeout)
    else:
        torch.cuda.set_device(cuda_device)
        dist.init_process_group(backend, device_id=cuda_device, timeout=timeout)
    return dist.get_rank(), dist.get_world_size()


def gpu_index(device: torch.device) -> int | None:
    """The index of the GPU that ``device`` means in this thread (``cuda`` alone: the current one), or None
    off CUDA: what a worker thread passes to ``torch.cuda.set_device`` (a new thread's current GPU is
    cuda:0, and ``set_device`` refuses a ``cuda`` device without an index)."""
    if device.type != "cuda":
        return None
    return device.index if device.index is not None else torch.cuda.current_device()


def group_backend(device: str | torch.device) -> tuple[str, torch.device | None]:
    """The process group's backend for a process on ``device`` (``auto`` as :func:`pick_device` reads it),
    and the CUDA device it binds (or None).

    On CPU: gloo. On CUDA: NCCL for CUDA tensors **and** gloo for CPU tensors (``"cpu:gloo,cuda:nccl"``),
    because the metrics reduce CPU states (the FD sums, float64 on the host) and NCCL alone has no
    CPU backend. The process's own GPU (``cuda:N``, else ``LOCAL_RANK``) becomes its current device
    before the group starts: ``all_gather_object`` and NCCL's communicator use the current device, and
    left at cuda:0 every rank would claim the same GPU.
    """
    dev = pick_device(device) if str(device) == "auto" else torch.device(device)
    if dev.type != "cuda" or not torch.cuda.is_available():
        return "gloo", None
    if dev.index is None:
        dev = torch.device("cuda", int(os.environ.get("LOCAL_RANK", "0")) % torch.cuda.device_count())
    return "cpu:gloo,cuda:nccl", dev


def is_initialized() -> bool:
    return dist.is_available() and dist.is_initialized()


def rank() -> int:
    return dist.get_rank() if is_initialized() else 0


def world_size() -> int:
    return dist.get_world_size() if is_initialized() else 1


def is_main() -> bool:
    """True on rank 0 (the process that writes shared outputs)."""
    return rank() == 0


def barrier() -> None:
    if world_size() > 1:
        dist.barrier()


def gather_objects(obj: Any) -> list[Any]:
    """All ranks' ``obj`` in rank order (a one-element list without a process group)."""
    if world_size() == 1:
        return [obj]
    out: list[Any] = [None] * world_size()
    dist.all_gather_object(out, obj)
    return out


def all_reduce_sum(tensor: torch.Tensor) -> torch.Tensor:
    """Sum ``tensor`` over ranks in place (a no-op for one process); returns it."""
    if world_size() > 1:
        dist.all_reduce(tensor, op=dist.ReduceOp.SUM)
    return tensor


def finalize() -> None:
    """Leave the process group cleanly (a process exiting with live gloo threads aborts)."""
    if is_initialized():
        dist.barrier()
        dist.destroy_process_group()


def pick_device(device: str, local_rank: int | None = None) -> torch.device:
    """``auto`` -> this process's CUDA device (``LOCAL_RANK``) when CUDA is available, else CPU.

    A bare ``cuda`` under a launcher (``WORLD_SIZE > 1``) is this process's GPU too, as
    :func:`group_backend` binds it: ``torch.device("cuda")`` means the *current* device, which is cuda:0
    until :func:`init` runs, and ``generate`` loads its model before that, so every rank rendered on GPU 0.
    """
    if device == "auto":
        if torch.cuda.is_available():
            lr = int(os.environ.get("LOCAL_RANK", rank() if local_rank is None else local_rank))
            return torch.device("cuda", lr % torch.cuda.device_count())
        return torch.device("cpu")
    dev = torch.device(device)
    if dev.type == "cuda" and dev.index is None and env_world_size() > 1 and torch.cuda.is_available():
        return group_backend(dev)[1] or dev  # the GPU the group binds (LOCAL_RANK), before and after init
    return dev


def resolve_device(flag: str) -> str:
    """The torch device named by ``--device`` (``auto`` via :func:`pick_device`): the one reading of the
    flag that ``train``, ``generate``, ``metrics``, ``features``, ``human design`` and ``irg-sweep``
    share (docs/cli.md#flags).

    ``auto`` gives each torchrun process the GPU of its ``LOCAL_RANK`` (before, generate and metrics
    put every process on one GPU). A string torch cannot parse, or CUDA asked for on a machine
    without it, is a one-line UserError.
    """
    try:
        device = pick_device(flag.strip().lower())
    except (RuntimeError, ValueError):
        raise UserError(f"unknown --device {flag!r}; use auto, cpu, cuda or cuda:N") from None
    if device.type not in ("cpu", "cuda"):  # mps, xpu, meta...: paths this suite has never run
        raise UserError(f"--device {flag}: device type {device.type!r} is not supported; use auto, cpu, cuda or cuda:N")
    if device.type == "cuda" and not torch.cuda.is_available():
        raise UserError(f"--device {flag} but CUDA is not available here; use --device auto or cpu")
    if device.type == "cuda" and device.index is not None and device.index >= torch.cuda.device_count():
        raise UserError(f"--device {flag}: this machine has {torch.cuda.device_count()} GPU(s); use cuda:0 .. "
                        f"cuda:{torch.cuda.device_count() - 1} or auto")
    return str(device)


def to_device_async(x: torch.Tensor, device: torch.device) -> torch.Tensor:
    """Copy a CPU tensor to ``device`` without stalling the host on CUDA (pinned, ``non_blocking``).

    A plain ``.to("cuda")`` from pageable memory waits for every kernel queued before it, so the
    host could not queue the next denoiser call while the GPU runs this one (the per-step noise of
    a DDIM / SDE sampler made each step pay the UNet's kernel-launch time on top of its GPU time, and
    so did the trainer's per-micro-step indices and schedule values). The one way every per-step
    host-to-device copy is made (samplers and the update).
    Pinned tensors stay alive until their copy is done (PyTorch's caching host allocator). Same values.
    Pass a tensor nobody writes to afterwards: an already pinned ``x`` is copied from directly
    (``pin_memory`` returns it as it is), so writing to it before the GPU has read it would race.
    """
    if device.type != "cuda":
        return x.to(device)
    return x.pin_memory().to(device, non_blocking=True)
