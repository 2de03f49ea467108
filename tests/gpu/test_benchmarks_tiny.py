"""benchmarks/gpu/*.py --tiny: the GPU benchmark scripts run end to end on tiny random models on CPU (so they never rot)."""

from __future__ import annotations

import json
import os
import subprocess
import sys
from pathlib import Path

import pytest

ROOT = Path(__file__).resolve().parents[2]

EXPECT = {
    "bench_generate.py": ("generate", ("diffusers_img_s", "ours_img_s", "ratio_ours_over_diffusers", "flops_per_image_T")),
    "bench_train.py": ("setups", ()),
    "bench_metrics.py": ("ours_fid,fd_dinov2,is,lpips", ("img_s", "ratio_vs_torchmetrics_fid", "values")),
}


@pytest.mark.parametrize("script", sorted(EXPECT))
def test_gpu_benchmark_tiny_mode(script, tmp_path):
    out = tmp_path / "r.json"
    extra = ["--invariance"] if script == "bench_generate.py" else []
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / script), "--tiny", "--json", str(out), *extra],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["device"]["device"] == "cpu"
    block, keys = EXPECT[script]
    assert block in res and all(k in res[block] for k in keys), sorted(res)
    if script == "bench_train.py":
        rows = [r for rows in res["setups"].values() for r in rows]
        assert {r["objective"] for r in res["setups"]["2"]} == {"ppo_clip", "pcpo"} and all(r["epoch_s"] > 0 for r in rows)
    if script == "bench_generate.py":
        assert res["unet_invariance"]["repeat_same_shape_bitwise"] is True
