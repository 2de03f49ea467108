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
    "bench_generate.py": ("generate", ("diffusers_img_s", "ours_img_s", "ratio_ours_over_diffusers", "flops_per_image_T",
                                       "ours_steady_img_s", "steady_ratio", "per_set_overhead_s_ours")),
    "bench_train.py": ("setups", ()),
    "bench_metrics.py": ("ours_fid,fd_dinov2,is,lpips", ("img_s", "ratio_vs_torchmetrics_fid", "values")),
}


@pytest.mark.parametrize("script", sorted(EXPECT))
def test_gpu_benchmark_tiny_mode(script, tmp_path):
    out = tmp_path / "r.json"
    extra = ["--invariance", "--variants", "attn_math,cudnn_benchmark,batch8"] if script == "bench_generate.py" else []
    if script != "bench_metrics.py":  # the profiler tables (one batch / one extra epoch on the tiny models)
        extra += ["--profile", str(tmp_path / "profile.txt")]
    if script == "bench_train.py":  # one sampling batch per epoch (default 2): the same epoch code, half the images
        extra += ["--batches", "1", "--epochs", "3"]  # two timed epochs: their median
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
        assert all(abs(r["sample_s"] + r["update_s"] - r["epoch_s"]) < 1e-6 for r in rows)
        assert all(len(r["epoch_s_each"]) == 2 and r["epoch_s"] == pytest.approx(sum(r["epoch_s_each"]) / 2)
                   for r in rows)
        assert res["setups"]["2"][0]["update_device_busy"]["wall_s"] > 0  # the profiled run
        assert res["pcpo_over_ddpo"]["2"]["default"] > 0  # at equal options
    if script == "bench_metrics.py":
        assert res["decode_only"]["read_decode_img_s"] > 0 and res["decode_only"]["resize_299_img_s"] > 0
        phases = res["ours_fid,fd_dinov2,is,lpips"]["phase_seconds"]
        assert {"verify", "read", "extract:inception", "extract:dinov2", "consume:lpips", "metric:fid"} <= set(phases)
        warm = res["ours_fid,fd_dinov2,is,lpips_cached_reference"]  # a new set against the cached reference
        assert warm["minutes_for_50k_set"] > 0 and "extract:inception" in warm["phase_seconds"]
    if script != "bench_metrics.py":
        assert "Self CPU time total" in (tmp_path / "profile.txt").read_text()
    if script == "bench_generate.py":
        assert res["unet_invariance"]["repeat_same_shape_bitwise"] is True
        assert res["variant_attn_math"]["img_s"] > 0 and res["variant_cudnn_benchmark"]["img_s"] > 0
        assert res["generate"]["ours_settings"]["phase_seconds"]["model_hash"] >= 0  # what a set pays once
        assert res["variant_batch8"]["batch"] == 8 and res["variant_batch8"]["img_s"] > 0  # larger calls


def test_count_flops_tiny_mode(tmp_path):
    """benchmarks/gpu/count_flops.py --tiny: the op split of a UNet row and a tiny setup-2 epoch's FLOPs
    against the floor formula, for both objectives (the numbers docs/gpu.md reads)."""
    out = tmp_path / "f.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "count_flops.py"), "--tiny", "--ops", "--json",
                          str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    res = json.loads(out.read_text())
    ops = res["unet_row_by_op_G"]
    assert 0 < ops["aten.convolution"] < ops["total"]
    for e in res["tiny_setup2_epoch"].values():
        assert e["update_G"] > 0 and e["update_floor_G"] > 0 and e["sample_G"] > e["sample_floor_G"] > 0
    assert res["tiny_setup2_epoch"]["ppo_clip"]["update_G"] == res["tiny_setup2_epoch"]["pcpo"]["update_G"]
    w = res["setup3_reward_weights"]  # the published sizes (meta device): Qwen2.5-VL-3B-Instruct's 3.75 B parameters
    assert 3.75 < w["captioner_params_B"] < 3.76 and 0.63 < w["scorer_params_B"] < 0.65
    host = res["setup2_host_ops"]
    for h in host.values():  # part 3: a forward + backward is many dispatches
        assert h["update_ops_per_micro_step"] > h["sample_ops_per_step"] > 50
    frozen = host["ppo_clip frozen_weights=autocast"]  # weights stored in the autocast dtype: fewer casts
    assert frozen["sample_copies_per_step"] < host["ppo_clip"]["sample_copies_per_step"]
    assert frozen["update_copies_per_micro_step"] < host["ppo_clip"]["update_copies_per_micro_step"]
    for obj in ("ppo_clip", "pcpo"):  # all 4 steps of a sample in one forward: far fewer dispatches per trained step
        fused, one = host[f"{obj} train_steps_per_forward=4"], host[obj]
        assert fused["micro_steps"] * 4 == one["micro_steps"]
        assert fused["update_ops_per_trained_step"] < 0.5 * one["update_ops_per_trained_step"], (fused, one)


def test_bench_train_setup3_runs_the_bertscore_reward_of_real_classes(tmp_path):
    """Setup 3's benchmark reward: a Qwen2.5-VL captioner and a DeBERTa scorer (tiny here; the real sizes,
    random weights, on a GPU) through the library's VLMCaptioner / BertScore as a ``module:function``
    reward, its seconds reported apart (``reward_s``, part of ``sample_s``)."""
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "bench_train.py"), "--tiny", "--setup", "3",
                          "--batches", "1", "--epochs", "2", "--runs", "ppo_clip", "--json", str(out)],
                         capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 0, run.stderr[-3000:]
    (row,) = json.loads(out.read_text())["setups"]["3"]
    assert 0 < row["reward_s"] < row["sample_s"] and row["images"] == 4
    assert "of which reward" in run.stdout


def test_random_vlm_bertscore_builds_the_real_sizes():
    """The GPU path of setup 3's benchmark reward, built on PyTorch's meta device (no memory, no time): the
    published captioner and the 40 scorer layers bert-score keeps, swapped in behind bert_score's own loading."""
    import importlib.util

    spec = importlib.util.spec_from_file_location("bench_gpu_models", ROOT / "benchmarks" / "gpu" / "models.py")
    models = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(models)  # under its own name: no top-level ``models`` left in sys.modules
    reward = models.random_vlm_bertscore(device="meta")
    deberta = reward.scorer.scorer._model
    assert len(deberta.encoder.layer) == 40 and deberta.config.hidden_size == 1024
    assert sum(p.numel() for p in reward.captioner.model.parameters()) == 3_754_622_976
    assert reward.settings["num_layers"] == 40 and reward.jpeg_quality == 80


def test_bench_train_keeps_the_other_runs_when_one_fails(tmp_path):
    """A run that fails (here a refused option; on a GPU, out of memory at a large forward) is reported
    with its error, the other runs' rows are kept in the JSON, and the exit status is 1."""
    out = tmp_path / "r.json"
    env = {**os.environ, "PYTHONPATH": str(ROOT), "OMP_NUM_THREADS": "1", "HF_HUB_OFFLINE": "1"}
    run = subprocess.run([sys.executable, str(ROOT / "benchmarks" / "gpu" / "bench_train.py"), "--tiny", "--setup", "2",
                          "--batches", "1", "--epochs", "2", "--runs", "ppo_clip:train_steps_per_forward=0;ppo_clip",
                          "--json", str(out)], capture_output=True, text=True, timeout=600, env=env, cwd=tmp_path)
    assert run.returncode == 1, run.stderr[-3000:]
    res = json.loads(out.read_text())
    assert res["complete"] is True
    assert [r["options"] for r in res["setups"]["2"]] == [""] and res["setups"]["2"][0]["epoch_s"] > 0
    (err,) = res["errors"]["2"]
    assert err["options"] == "train_steps_per_forward=0" and "train_steps_per_forward must be >= 1" in err["error"]
    assert "error UserError" in run.stdout


def test_run_device_refuses_an_unknown_stage(tmp_path):
    """A stage name the script does not know (the `train` stage became `train2`) ran nothing, silently, on
    device time; it is now one error line before anything runs."""
    script = ROOT / "benchmarks" / "gpu" / "run_device.sh"
    res = subprocess.run(["bash", str(script), "generate", "train"], capture_output=True, text=True, cwd=tmp_path,
                         env={"PATH": "/usr/bin:/bin", "OUT": str(tmp_path / "out")})
    assert res.returncode == 2 and res.stderr.startswith("error: unknown stage 'train'") and "train2" in res.stderr
    assert not (tmp_path / "out").exists()
