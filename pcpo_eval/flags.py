"""Help text of the command-line flags several areas share (torch-free: read when ``--help`` is built).

What a flag *means* lives with the code that reads it: ``--device`` is read by
:func:`pcpo_eval.dist.resolve_device`.
"""

from __future__ import annotations

DEVICE_HELP = "auto = this process's GPU (LOCAL_RANK) when CUDA is available, else cpu | cpu | cuda:N"

EVAL_PRECISION_HELP = (
    "auto = fp32 (TF32 off: float32 products, as on a CPU) | tf32 (TF32 tensor cores for "
    "the feature networks' float32 products); recorded in metrics.json and the cache keys"
)
