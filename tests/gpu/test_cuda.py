"""GPU paths: each scenario of tests/support/cuda_checks.py in a subprocess that sees the GPUs (skipped without one).

The test session hides GPUs from every other test (tests/conftest.py), so the suite passes with
CUDA visible and without it; CI has none and skips these with the reason.
"""

from __future__ import annotations

import functools
import os
import subprocess
import sys
from pathlib import Path

import pytest

CHECKS = Path(__file__).resolve().parents[1] / "support" / "cuda_checks.py"


def _gpu_env() -> dict[str, str]:
    env = dict(os.environ)
    visible = env.pop("PCPO_EVAL_TEST_CUDA_VISIBLE_DEVICES", "<all>")
    env.pop("CUDA_VISIBLE_DEVICES", None)
    if visible != "<all>":
        env["CUDA_VISIBLE_DEVICES"] = visible
    return env


@functools.cache
def _has_cuda() -> bool:
    probe = [sys.executable, "-c", "import torch; print(torch.cuda.is_available())"]
    out = subprocess.run(probe, env=_gpu_env(), capture_output=True, text=True, timeout=120)
    return out.stdout.strip() == "True"


@pytest.mark.cuda
@pytest.mark.parametrize("scenario", [
    "generate_precisions", "generate_memory_micro_batch", "generate_sd1_tiny", "train_resume",
    "train_mixed_precision", "step_syncs", "dist_group", "flow_models_bf16", "flow_train_bf16", "metrics_on_cuda",
    "feature_numerics", "train_tf32", "train_reward_on_device",
])
def test_cuda_scenario(scenario, tmp_path):
    if not _has_cuda():
        pytest.skip("no CUDA GPU visible (CI is CPU-only; these run on a GPU machine: pytest -m cuda)")
    run = subprocess.run([sys.executable, str(CHECKS), scenario, str(tmp_path)], env=_gpu_env(),
                         capture_output=True, text=True, timeout=900)
    print(run.stdout)
    assert run.returncode == 0, run.stderr[-4000:]
