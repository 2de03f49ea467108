"""Fresh runs from a checkpoint (``init_from``): LoRA / full weights, run dirs, files, refusals."""

from __future__ import annotations

import json

import pytest
import torch
from safetensors.torch import load_file

from pcpo_eval.errors import UserError
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import INIT_FILE, Trainer
from tests.support.train import TINY as TINY_TRAIN

TINY = {**TINY_TRAIN, "epochs": 1}


@pytest.fixture(scope="module")
def source(tmp_path_factory):
    """A 1-epoch LoRA run and a 1-epoch full fine-tune run to start from."""
    root = tmp_path_factory.mktemp("src")
    Trainer(config_from_dict(TINY), root / "lora").run()
    Trainer(config_from_dict({**TINY, "lora_rank": 0, "learning_rate": 1e-4}), root / "full").run()
    return root


def _lora_state(tr):
    from peft.utils import get_peft_model_state_dict

    return get_peft_model_state_dict(tr.adapter.denoiser)


def test_lora_checkpoint_fresh_run(tmp_path, source):
    ckpt = ck.checkpoint_dir(source / "lora", 1)
    tr = Trainer(config_from_dict({**TINY, "epochs": 2, "init_from": str(ckpt)}), tmp_path / "b")
    saved = load_file(str(ckpt / ck.LORA_FILE))
    state = _lora_state(tr)
    assert state and all(torch.equal(state[k], saved[f"unet.{k}"]) for k in state)
    assert tr.start_epoch == 1 and not tr.optimizer.state  # fresh optimizer, epoch 1
    rec = json.loads((tmp_path / "b" / INIT_FILE).read_text())
    assert rec["weights_sha256"] == ck.read_meta(ckpt)["weights_sha256"] and rec["kind"] == "checkpoint"
    assert rec["epoch"] == 1 and "base model" in rec["reference_policy"]
    log = tr.run()
    assert log["epoch"].tolist() == [1, 2]
    assert ck.read_meta(ck.checkpoint_dir(tmp_path / "b", 2))["init_from"] == str(ckpt)
    # resume: the run's own checkpoint, not init_from again
    resumed = Trainer(config_from_dict({**TINY, "epochs": 3, "init_from": str(ckpt)}), tmp_path / "b", resume=True)
    mine = load_file(str(ck.checkpoint_dir(tmp_path / "b", 2) / ck.LORA_FILE))
    assert all(torch.equal(v, mine[f"unet.{k}"]) for k, v in _lora_state(resumed).items())


def test_run_dir_and_safetensors_file(tmp_path, source):
    by_dir = Trainer(config_from_dict({**TINY, "init_from": str(source / "lora")}), tmp_path / "d")
    f = ck.checkpoint_dir(source / "lora", 1) / ck.LORA_FILE
    by_file = Trainer(config_from_dict({**TINY, "init_from": str(f)}), tmp_path / "f")
    a, b = _lora_state(by_dir), _lora_state(by_file)
    assert all(torch.equal(a[k], b[k]) for k in a)
    rec = json.loads((tmp_path / "f" / INIT_FILE).read_text())
    assert rec["kind"] == "file" and rec["lora_rank"] == 2 and rec["lora_alpha"] == 2.0


def test_full_weights_and_reference_is_the_base_model(tmp_path, source):
    ckpt = ck.latest_checkpoint(source / "full")
    cfg = config_from_dict({**TINY, "lora_rank": 0, "init_from": str(ckpt), "paired_control": True})
    tr = Trainer(cfg, tmp_path / "full")
    saved = load_file(str(ckpt / ck.FULL_FILE))
    live = tr.adapter.denoiser.state_dict()
    assert all(torch.equal(live[k], saved[k]) for k in saved)
    base = Trainer(config_from_dict({**TINY, "lora_rank": 0}), tmp_path / "base").adapter.denoiser.state_dict()
    ref = tr.ref_denoiser.state_dict()
    assert all(torch.equal(ref[k], base[k]) for k in base)  # the KL / control reference: the base model
    assert any(not torch.equal(saved[k], base[k]) for k in saved)


def test_refusals(tmp_path, source):
    ckpt = ck.checkpoint_dir(source / "lora", 1)
    with pytest.raises(UserError, match=r"lora_rank 2 \(config: lora_rank 4\)"):
        Trainer(config_from_dict({**TINY, "lora_rank": 4, "init_from": str(ckpt)}), tmp_path / "r4")
    with pytest.raises(UserError, match=r"full weights \(lora_rank 0\) \(config: lora_rank 2\)"):
        Trainer(config_from_dict({**TINY, "init_from": str(source / "full")}), tmp_path / "rf")
    with pytest.raises(UserError, match="lora_alpha 2 \\(config: 8\\)"):
        Trainer(config_from_dict({**TINY, "lora_alpha": 8.0, "init_from": str(ckpt)}), tmp_path / "ra")
    with pytest.raises(UserError, match="model 'toy' \\(config: 'sd1:x'\\)"):
        ck.check_init_compatible(ck.init_source(str(ckpt)), "sd1:x", 2, 2.0)
    with pytest.raises(UserError, match="not a checkpoint directory"):
        Trainer(config_from_dict({**TINY, "init_from": str(tmp_path / "nowhere")}), tmp_path / "n")
    (tmp_path / "w.bin").write_bytes(b"x")
    with pytest.raises(UserError, match="must be .safetensors"):
        ck.init_source(str(tmp_path / "w.bin"))
    # a checkpoint whose weights no longer match their recorded hash
    import shutil

    bad = tmp_path / "bad" / "checkpoints" / "epoch_0001"
    shutil.copytree(ckpt, bad)
    meta = json.loads((bad / ck.META_FILE).read_text())
    (bad / ck.META_FILE).write_text(json.dumps({**meta, "weights_sha256": "0" * 64}))
    with pytest.raises(UserError, match="does not match the weights_sha256"):
        ck.init_source(str(bad))


def test_resume_of_a_run_that_predates_the_new_keys(tmp_path, source):
    """A config.yaml written before diagnostics / validation / init_from / step_weighting existed resumes:
    a missing key counts as its default."""
    import shutil

    import yaml

    run = tmp_path / "old"
    shutil.copytree(source / "lora", run)
    saved = yaml.safe_load((run / "config.yaml").read_text())
    for k in ("diagnostics", "validation_every", "validation_prompts", "validation_images", "init_from",
              "step_weighting"):
        saved.pop(k)
    (run / "config.yaml").write_text(yaml.safe_dump(saved))
    assert Trainer(config_from_dict({**TINY, "epochs": 2}), run, resume=True).start_epoch == 2
    with pytest.raises(UserError, match="config differs .* in diagnostics"):
        Trainer(config_from_dict({**TINY, "epochs": 2, "diagnostics": True}), run, resume=True)
