"""``pcpo-eval generate`` on the real toy model: model specs, checkpoints, IRG specs, bad models."""

from __future__ import annotations

import json

import pandas as pd
import pytest
import torch

from pcpo_eval.models.registry import load_model
from pcpo_eval.train.checkpoints import save_checkpoint  # noqa: E402

ARGS = ["--prompts", "toy", "--max-prompts", "3", "--seeds", "2", "--steps", "3", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def finetuned_ckpt(tmp_path_factory):
    """A full-weights checkpoint of the toy UNet with slightly shifted weights."""
    adapter = load_model("toy")
    with torch.no_grad():
        for p in adapter.denoiser.parameters():
            p.add_(0.02 * torch.sign(p))
    ckpt = tmp_path_factory.mktemp("run") / "checkpoints" / "epoch_0001"
    return save_checkpoint(ckpt, adapter.denoiser, {"epoch": 1, "model": "toy", "reward_mean": 0.0})


def _manifest(out) -> pd.DataFrame:
    return pd.read_parquet(out / "manifest.parquet")


def test_toy_checkpoint_and_irg_specs(cli, tmp_path, finetuned_ckpt):
    res = cli("generate", "--model", "toy", "--out", tmp_path / "base", *ARGS)
    assert res.returncode == 0, res.stderr
    assert "6 images (3 prompts x 2 seeds)" in res.stdout
    base = _manifest(tmp_path / "base")
    assert base.height.iloc[0] == 32 and set(base.prompt) == {"red circle", "red square", "red triangle"}

    res = cli("generate", "--model", finetuned_ckpt, "--out", tmp_path / "ft", *ARGS)
    assert res.returncode == 0, res.stderr
    ft = _manifest(tmp_path / "ft")
    assert ft.model_hash.iloc[0] != base.model_hash.iloc[0]
    assert list(ft.pixel_sha256) != list(base.pixel_sha256)

    # lambda = 0: exactly the reference (its base model, read from checkpoint.json)
    res = cli("generate", "--model", f"irg:{finetuned_ckpt}=0", "--out", tmp_path / "irg0", *ARGS)
    assert res.returncode == 0, res.stderr
    irg0 = _manifest(tmp_path / "irg0")
    assert list(irg0.pixel_sha256) == list(base.pixel_sha256)
    settings = json.loads((tmp_path / "irg0" / "set.json").read_text())["settings"]
    assert settings["model"] == f"irg:{finetuned_ckpt}=0" and settings["model_name"] == "irg(toy)"


def test_unknown_model_and_unfitting_lora_write_nothing(cli, tmp_path):
    res = cli("generate", "--model", tmp_path / "no_such_run", "--out", tmp_path / "o", *ARGS)
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert not (tmp_path / "o").exists()

    from safetensors.torch import save_file

    bad = tmp_path / "bad" / "checkpoints" / "epoch_0001"
    bad.mkdir(parents=True)
    save_file({"unet.no_such_block.lora_A.weight": torch.zeros(2, 4), "unet.no_such_block.lora_B.weight":
               torch.zeros(4, 2)}, bad / "pytorch_lora_weights.safetensors")  # fmt: skip
    (bad / "checkpoint.json").write_text(
        json.dumps({"epoch": 1, "model": "toy", "weights_file": "pytorch_lora_weights.safetensors"})
    )
    for spec in (str(bad), f"irg:{bad}=0.5@toy"):
        res = cli("generate", "--model", spec, "--out", tmp_path / "o", *ARGS)
        assert res.returncode == 2 and "error: " in res.stderr and res.stderr.count("\n") == 1, res.stderr
        assert not (tmp_path / "o").exists()
