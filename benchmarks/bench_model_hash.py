"""A set's ``model_hash`` (SHA-256 of the denoiser's state dict, once per ``generate`` call) on the real
SD-1.5 UNet architecture (random weights, bf16, 1.72 GB): ``module_sha256`` against the same digest
built with a ``tobytes`` copy of every tensor (what it did before), in one run; the digests must agree.

    .venv/bin/python benchmarks/bench_model_hash.py
"""

from __future__ import annotations

import hashlib
import statistics
import sys
import time
from pathlib import Path

import torch

sys.path.insert(0, str(Path(__file__).resolve().parent / "gpu"))
from models import SD15_UNET  # noqa: E402

from pcpo_eval.generate.loading import module_sha256  # noqa: E402


def with_copies(module: torch.nn.Module) -> str:
    """The documented digest, each tensor's bytes first copied out with ``tobytes``."""
    h = hashlib.sha256()
    for name, tensor in sorted(module.state_dict().items()):
        t = tensor.detach().cpu().contiguous()
        h.update(f"{name}|{t.dtype}|{tuple(t.shape)}|".encode())
        h.update(t.reshape(-1).view(torch.uint8).numpy().tobytes())
    return h.hexdigest()


def main() -> None:
    from diffusers import UNet2DConditionModel

    torch.manual_seed(0)
    unet = UNet2DConditionModel(**SD15_UNET).to(torch.bfloat16)
    size = sum(t.numel() * t.element_size() for t in unet.state_dict().values())
    times: dict[str, list[float]] = {"tobytes copy": [], "module_sha256": []}
    digests = set()
    for _ in range(3):  # alternating, median of 3
        for name, fn in (("tobytes copy", with_copies), ("module_sha256", module_sha256)):
            t0 = time.perf_counter()
            digests.add(fn(unet))
            times[name].append(time.perf_counter() - t0)
    if len(digests) != 1:
        raise SystemExit("the two digests differ")
    old, new = (statistics.median(times[k]) for k in times)
    print("## Model hash of a set (SD-1.5 UNet, bf16)\n")
    print(f"State dict {size / 1e9:.2f} GB, median of 3 alternating runs, the same digest.\n")
    print("| hashing | seconds | GB/s |\n| --- | --- | --- |")
    for k, v in (("with a `tobytes` copy (before)", old), ("`module_sha256` (buffer protocol)", new)):
        print(f"| {k} | {v:.2f} | {size / 1e9 / v:.2f} |")
    print(f"\nSpeed-up {old / new:.2f}x.")


if __name__ == "__main__":
    main()
