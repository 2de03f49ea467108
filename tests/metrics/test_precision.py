"""Evaluation precision: the feature networks run with TF32 exactly when asked, the choice is recorded,
and features of other numerics (device type, precision) never share a cache or a current metrics folder."""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.features.toy import ToyExtractor
from pcpo_eval.metrics.extract import MetricsOptions
from pcpo_eval.metrics.workers import compute_metrics, outputs_current, run_metrics
from pcpo_eval.precision import numerics_key, resolve_eval_precision
from tests.support.metrics import TOY_PROMPTS, StandInToyClassifier, make_image_set

SEEDS = [0, 1, 2, 3]


@pytest.fixture
def sets(tmp_path):
    return (make_image_set(tmp_path / "a", TOY_PROMPTS, SEEDS),
            make_image_set(tmp_path / "b", TOY_PROMPTS, [100 + s for s in SEEDS]))


def _opts(tmp_path: Path, precision: str) -> MetricsOptions:
    return MetricsOptions(batch_size=5, cache_dir=tmp_path / "cache", lpips_batch=4, lpips_trunk="random",
                          extractor_options={"toy": {"classifier": StandInToyClassifier(0)}}, precision=precision)


def test_resolve_eval_precision_and_numerics_key() -> None:
    assert resolve_eval_precision(None) == resolve_eval_precision("auto") == resolve_eval_precision("FP32") == "fp32"
    assert resolve_eval_precision("tf32") == "tf32"
    for bad in ("bf16", "fp16", "half"):
        with pytest.raises(UserError, match="choose fp32"):
            resolve_eval_precision(bad)
    assert numerics_key("cpu", "fp32") == "cpu-fp32"
    assert numerics_key("cuda:1", "tf32") == numerics_key(torch.device("cuda", 0), "tf32") == "cuda-tf32"


@pytest.mark.parametrize("precision, matmul, cudnn", [("fp32", "highest", False), ("tf32", "high", True)])
def test_networks_run_under_the_precision_and_state_is_restored(sets, tmp_path, monkeypatch, precision, matmul,
                                                                  cudnn) -> None:
    seen: list[tuple[str, bool]] = []
    real = ToyExtractor.extract

    def spy(self, images):
        seen.append((torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return real(self, images)

    monkeypatch.setattr(ToyExtractor, "extract", spy)
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    a, b = sets
    compute_metrics(a, "fd_toy,is_toy", b, _opts(tmp_path, precision))
    assert seen and set(seen) == {(matmul, cudnn)}
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before


def test_precision_is_recorded_keys_its_own_caches_and_folder(sets, tmp_path) -> None:
    a, b = sets
    out = tmp_path / "out"
    fp32 = run_metrics(a, "fd_toy,lpips_toy", out, b, _opts(tmp_path, "fp32"))
    assert fp32["settings"]["options"]["precision"] == "fp32"
    assert outputs_current(out, a, ["fd_toy", "lpips_toy"], b, _opts(tmp_path, "fp32"))
    assert not outputs_current(out, a, ["fd_toy", "lpips_toy"], b, _opts(tmp_path, "tf32"))
    features = sorted(p.name for p in (tmp_path / "cache" / "features").iterdir())
    lpips = sorted(p.name for p in (tmp_path / "cache" / "lpips").iterdir())
    tf32 = run_metrics(a, "fd_toy,lpips_toy", out, b, _opts(tmp_path, "tf32"))
    assert len(list((tmp_path / "cache" / "features").iterdir())) == 2 * len(features)  # nothing shared
    assert len(list((tmp_path / "cache" / "lpips").iterdir())) == 2 * len(lpips)
    numerics = {json.loads((d / "settings.json").read_text())["numerics"]
                for d in (tmp_path / "cache" / "features").iterdir()}
    assert numerics == {"cpu-fp32", "cpu-tf32"}
    for k, v in fp32["metrics"].items():  # a CPU has no TF32: the same numbers, computed afresh
        np.testing.assert_allclose(tf32["metrics"][k], v, rtol=1e-6)


@pytest.mark.parametrize("command", ["metrics", "features"])
def test_reduced_precision_is_refused_before_any_output(sets, tmp_path, cli, command) -> None:
    a, b = sets
    out = tmp_path / "o.npy" if command == "features" else tmp_path / "o"
    args = (["--reference", b, "--metrics", "fd_toy", "--out", out] if command == "metrics"
            else ["--extractor", "toy", "--output", out])
    r = cli(command, a, *args, "--precision", "bf16", "--device", "cpu")
    assert r.returncode == 2 and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1, r.stderr
    assert "--precision 'bf16'" in r.stderr and "choose fp32" in r.stderr
    assert not out.exists() and not (Path(a) / ".pcpo_cache").exists()
