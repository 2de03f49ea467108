"""``pcpo-eval export RUN[@EPOCH] --out DIR`` (issue 29): a diffusers-loadable folder with a model card,
from tiny toy runs trained here (LoRA and full fine-tune), and one-line refusals."""

from __future__ import annotations

import json
import shutil

import pytest
import torch

from pcpo_eval.rundir import checkpoint_dir
from pcpo_eval.train.checkpoints import LORA_FILE, load_model_from_spec
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY as TINY_TRAIN

TINY = {**TINY_TRAIN, "reward": {"toy_aesthetic": 0.8, "jpeg_compressibility": 0.2}, "sample_steps": 3,
        "learning_rate": 1e-3, "objective": "pcpo", "credit_convention": "unit", "credit_fallback": "cap", "seed": 7,
        "device": "cpu"}


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """A LoRA run inside a study folder (with a results.json) and a full fine-tune run outside any study."""
    root = tmp_path_factory.mktemp("export")
    lora = root / "study" / "runs" / "PCPO_s7"
    Trainer(config_from_dict(TINY), lora).run()
    full = root / "full_run"
    Trainer(config_from_dict({**TINY, "lora_rank": 0, "epochs": 1, "reward": "toy_aesthetic"}), full).run()
    results = {"study": {"name": "toy_study"}, "headline": "PCPO learned faster than DDPO (3 vs 3 runs)",
               "runs": [{"run": "PCPO_s7", "cell": "all", "arm": "PCPO", "seed": 7}],
               "verdict": [{"cell": "all", "quantity": "paired_gain", "baseline": "DDPO", "treatment": "PCPO",
                            "estimate": 0.031, "ci_low": 0.01, "ci_high": 0.05, "p_adjusted": 0.02, "estimable": True,
                            "sentence": "PCPO gains 0.031 more than DDPO"}],
               "raw_scores": {"rows": [{"cell": "all", "method": "PCPO", "n_runs": 3, "values": {"fd_toy": 9.5}}]},
               "metric_labels": {"fd_toy": "FD (toy)"}}
    (root / "study" / "results.json").write_text(json.dumps(results))
    return root, lora, full


def _unet_out(unet, seed: int = 0) -> torch.Tensor:
    """The raw toy UNet's output on fixed noise, times and toy prompt embeddings."""
    cond = load_model_from_spec("toy").encode_prompts(["red circle", "blue square"])
    cfg = unet.config
    x = torch.randn(2, cfg.in_channels, cfg.sample_size, cfg.sample_size, generator=torch.Generator().manual_seed(seed))
    with torch.no_grad():
        return unet(x, torch.tensor([10, 500]), encoder_hidden_states=cond.hidden, class_labels=cond.pooled).sample


def test_lora_run_exports_a_diffusers_folder_with_a_card(runs, tmp_path, cli):
    from diffusers import UNet2DConditionModel

    _, lora, _ = runs
    out = tmp_path / "share"
    res = cli("export", f"{lora}@1", "--out", out)
    assert res.returncode == 0, res.stderr
    assert "hf upload USER/NAME" in res.stdout
    names = {p.relative_to(out).as_posix() for p in out.rglob("*") if p.is_file()}
    assert names == {LORA_FILE, "unet/config.json", "unet/diffusion_pytorch_model.safetensors",
                     "scheduler/scheduler_config.json", "README.md", "pcpo_eval_export.json"}
    trained = load_model_from_spec(str(checkpoint_dir(lora, 1))).denoiser
    # full weights (LoRA merged): diffusers alone loads them and they compute what the trained model computes
    unet = UNet2DConditionModel.from_pretrained(out, subfolder="unet").eval()
    torch.testing.assert_close(_unet_out(unet), _unet_out(trained), rtol=1e-4, atol=1e-5)
    # the LoRA file: diffusers' LoRA loader on a fresh base model gives the same model
    base = load_model_from_spec("toy").denoiser
    base.load_lora_adapter(str(out), weight_name=LORA_FILE, prefix="unet", adapter_name="default")
    torch.testing.assert_close(_unet_out(base.eval()), _unet_out(trained), rtol=1e-4, atol=1e-5)
    card = (out / "README.md").read_text()
    assert card.startswith("---\nlibrary_name: diffusers\n")
    for text in ("base model | `toy`", "`0.8*toy_aesthetic + 0.2*jpeg_compressibility`", "| algorithm | PCPO",
                 "`credit_convention: unit`", "`credit_fallback: cap`", "training seed | 7", "exported epoch | 1 of 2",
                 "## Study", "arm **PCPO**", "PCPO learned faster than DDPO", "PCPO gains 0.031 more than DDPO",
                 "FD (toy) 9.5", "load_lora_weights"):
        assert text in card, text
    prov = json.loads((out / "pcpo_eval_export.json").read_text())
    assert prov["epoch"] == 1 and prov["config"]["seed"] == 7 and prov["study_results"].endswith("results.json")


def test_full_run_latest_epoch_without_study(runs, tmp_path):
    from diffusers import UNet2DConditionModel

    from pcpo_eval.train.export import export_run

    root, _, full = runs
    out = export_run(str(full), tmp_path / "full")  # no @EPOCH: the latest checkpoint
    assert not (out / LORA_FILE).exists() and (out / "unet" / "config.json").is_file()
    unet = UNet2DConditionModel.from_pretrained(out, subfolder="unet").eval()
    torch.testing.assert_close(_unet_out(unet), _unet_out(load_model_from_spec(str(full)).denoiser))
    card = (out / "README.md").read_text()
    assert "full weights" in card and "## Study" not in card and "exported epoch | 1 of 1" in card


def test_refusals_are_one_line_and_never_overwrite(runs, tmp_path, cli):
    _, lora, _ = runs
    busy = tmp_path / "busy"
    busy.mkdir()
    (busy / "keep.txt").write_text("mine")
    cases = [
        ((f"{lora}@1", "--out", busy), "exists and is not empty"),
        ((f"{lora}@9", "--out", tmp_path / "a"), "no checkpoint at epoch 9; saved epochs: 1, 2"),
        ((f"{lora}@x", "--out", tmp_path / "b"), "must be a whole number"),
        ((str(tmp_path / "nope"), "--out", tmp_path / "c"), "not found"),
        ((str(tmp_path), "--out", tmp_path / "d"), "not a pcpo-eval run"),
    ]
    for args, msg in cases:
        res = cli("export", *args)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: ") and msg in lines[0], lines
    assert [p.name for p in busy.iterdir()] == ["keep.txt"] and (busy / "keep.txt").read_text() == "mine"
    assert not any((tmp_path / n).exists() for n in "abcd")


def test_an_empty_out_folder_is_used(runs, tmp_path):
    from pcpo_eval.train.export import export_run

    _, lora, _ = runs
    empty = tmp_path / "empty"
    empty.mkdir()
    shutil.copytree(lora, tmp_path / "copy")  # outside the study: no results.json near it
    out = export_run(f"{tmp_path / 'copy'}@2", empty)
    assert out == empty and "## Study" not in (out / "README.md").read_text() and (out / LORA_FILE).is_file()
