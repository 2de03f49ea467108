"""Folder weights with a missing sub-folder or file: the one-line error names the missing piece (issue 27)."""

from __future__ import annotations

import json
import shutil

import pytest

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.weights.folders import pipeline_missing, transformers_missing


@pytest.fixture(scope="module")
def tiny_sd1(tmp_path_factory):
    from pcpo_eval.testing import save_tiny_sd1

    return save_tiny_sd1(tmp_path_factory.mktemp("w") / "sd")


def _copy_without(src, tmp_path, *parts):
    dst = tmp_path / "sd"
    shutil.copytree(src, dst)
    for part in parts:
        target = dst / part
        shutil.rmtree(target) if target.is_dir() else target.unlink()
    return dst


def test_complete_tiny_pipeline_has_nothing_missing(tiny_sd1):
    assert pipeline_missing(tiny_sd1) == []


@pytest.mark.parametrize("gone, needle", [
    ("unet", "missing unet/ (UNet2DConditionModel)"),
    ("vae", "missing vae/ (AutoencoderKL)"),
    ("tokenizer", "missing tokenizer/ (CLIPTokenizer)"),  # diffusers would load it as None
    ("scheduler/scheduler_config.json", "missing scheduler/scheduler_config.json"),
    ("unet/diffusion_pytorch_model.safetensors", "missing unet/weights"),
    ("vae/config.json", "missing vae/config.json"),
    ("model_index.json", "missing model_index.json"),
])
def test_sd1_folder_missing_part_is_named_in_one_line(tiny_sd1, tmp_path, gone, needle):
    from pcpo_eval.models.registry import load_model

    folder = _copy_without(tiny_sd1, tmp_path, gone)
    with pytest.raises(MissingWeightsError) as info:
        load_model(f"sd1:{folder}")
    msg = str(info.value)
    assert needle in msg and str(folder) in msg and "\n" not in msg


def test_null_components_are_not_required(tiny_sd1, tmp_path):
    folder = _copy_without(tiny_sd1, tmp_path)
    index = json.loads((folder / "model_index.json").read_text())
    assert index["safety_checker"] == [None, None]
    assert pipeline_missing(folder) == []


def test_sd3_loader_names_missing_subfolder(tmp_path):
    from pcpo_eval.models.sd3 import load_local_pipeline

    folder = tmp_path / "sd35"
    folder.mkdir()
    (folder / "model_index.json").write_text(json.dumps({
        "_class_name": "StableDiffusion3Pipeline", "transformer": ["diffusers", "SD3Transformer2DModel"],
        "scheduler": ["diffusers", "FlowMatchEulerDiscreteScheduler"]}))
    (folder / "scheduler").mkdir()
    (folder / "scheduler" / "scheduler_config.json").write_text("{}")
    with pytest.raises(MissingWeightsError, match=r"SD3 weights: .* missing transformer/ \(SD3Transformer2DModel\)"):
        load_local_pipeline(object, str(folder), None, "SD3")


def test_dinov2_folder_without_config_or_weights(tmp_path):
    from pcpo_eval.features.dinov2 import DinoV2Extractor

    folder = tmp_path / "dinov2"
    folder.mkdir()
    (folder / "model.safetensors").write_bytes(b"x")
    with pytest.raises(MissingWeightsError, match=r"without config.json \(missing config.json\)"):
        DinoV2Extractor(folder)
    (folder / "model.safetensors").unlink()
    (folder / "config.json").write_text("{}")
    with pytest.raises(MissingWeightsError, match=r"DINOv2 weights: .* is incomplete: missing weights \(model"):
        DinoV2Extractor(folder)
    assert transformers_missing(tmp_path / "nowhere") == [f"{tmp_path / 'nowhere'}/"]
