"""`frozen_weights: autocast`: a LoRA run keeps its frozen denoiser weights in the autocast dtype (ddpo-pytorch's
``inference_dtype``), trains like the float32-weight run within bf16 rounding, and checkpoints the same
float32 LoRA weights. bf16 autocast runs on the CPU, so CI executes the path the GPU setups use."""

from __future__ import annotations

import numpy as np
import pytest
import torch
from safetensors.torch import load_file

from pcpo_eval.errors import UserError
from pcpo_eval.testing import save_tiny_sd1
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import load_config
from pcpo_eval.train.trainer import Trainer, train

SETUP = "train/configs/setup2_ddpo_aes.yaml"


def _over(model, *extra):
    return [f"model=sd1:{model}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=2",
            "sample_steps=3", "sample_batch_size=2", "sample_batches_per_epoch=1", "train_batch_size=1",
            "paper_total_batch=0", "log_to=none", "log_images_every=0", "mixed_precision=bf16", "device=cpu",
            "paired_control=true", "beta_kl=0.01", "learning_rate=0.01", *extra]


def test_frozen_weights_in_autocast_dtype_train_like_fp32_weights(tmp_path):
    model = save_tiny_sd1(tmp_path / "sd1")
    fp32 = train(load_config(SETUP, _over(model)), tmp_path / "fp32")
    half = train(load_config(SETUP, _over(model, "frozen_weights=autocast")), tmp_path / "half")
    trainer = Trainer(load_config(SETUP, _over(model, "frozen_weights=autocast", "epochs=3")), tmp_path / "half",
                      resume=True)
    den = trainer.adapter.denoiser
    frozen = {p.dtype for p in den.parameters() if not p.requires_grad}
    assert frozen == {torch.bfloat16}, frozen
    assert {p.dtype for p in trainer.params} == {torch.float32}  # the LoRA weights AdamW updates
    assert trainer.start_epoch == 3
    # the same run within bf16 rounding of the few ops autocast leaves in float32 (norm weights, biases)
    for col in ("reward_mean", "control_reward_mean"):
        assert np.allclose(fp32[col], half[col], rtol=2e-2, atol=2e-3), (col, fp32[col].tolist(), half[col].tolist())
    assert np.all(np.isfinite(half["loss"])) and np.all(np.isfinite(half["kl_ref_paper"]))
    a, b = (load_file(str(ck.list_checkpoints(tmp_path / run)[-1] / ck.LORA_FILE)) for run in ("fp32", "half"))
    assert a.keys() == b.keys() and all(b[k].dtype == torch.float32 for k in b)


def test_frozen_weights_autocast_is_refused_without_lora_or_mixed_precision():
    with pytest.raises(UserError, match="frozen_weights=autocast needs a LoRA run"):
        load_config(SETUP, ["frozen_weights=autocast", "mixed_precision=no"])
    with pytest.raises(UserError, match="frozen_weights=autocast needs a LoRA run"):
        load_config(SETUP, ["frozen_weights=autocast", "lora_rank=0"])
    with pytest.raises(UserError, match="frozen_weights='half'"):
        load_config(SETUP, ["frozen_weights=half"])


def test_frozen_weights_autocast_is_a_no_op_where_autocast_is(tmp_path):
    """fp16 autocast is off on a CPU, so the weights stay float32 there (they could not run un-autocast)."""
    model = save_tiny_sd1(tmp_path / "sd1")
    cfg = load_config(SETUP, _over(model, "frozen_weights=autocast", "mixed_precision=fp16"))
    den = Trainer(cfg, tmp_path / "run").adapter.denoiser
    assert {p.dtype for p in den.parameters()} == {torch.float32}


@pytest.mark.parametrize("config", ["train/configs/toy_ddpo.yaml", "train/configs/toy_pcpo.yaml"])
def test_the_first_update_is_on_policy_with_frozen_weights_in_bf16(tmp_path, config):
    """Sampling and the update run one forward, so at theta = theta_old rho is 1 and nothing is clipped. The
    update fed a float32 x beside the bf16 frozen weights, where the samplers feed x in the weights' dtype: on
    the toy UNet (its class embedding is cast to the input's dtype) |log rho| reached 2e-3 and 92% of the
    first micro-batch was clipped before any update (fails before the fix)."""
    cfg = load_config(config, ["mixed_precision=bf16", "lora_rank=4", "frozen_weights=autocast", "epochs=1",
                               "log_to=none", "sample_batches_per_epoch=1", "device=cpu"])
    trainer = Trainer(cfg, tmp_path / "run")
    assert trainer.adapter.dtype == torch.bfloat16
    samples = trainer.sample_epoch(1)
    trainer.adapter.denoiser.train()
    rows = torch.arange(cfg.train_batch_size)
    adv = torch.as_tensor(samples.advantages, dtype=torch.float32)[rows]
    with torch.no_grad():
        for j in trainer._trainable_steps(samples):
            _, out, _ = trainer.step_loss(samples, rows, torch.full((len(rows),), j), adv)
            assert float(out.log_rho.abs().max()) < 1e-6, j
            assert not bool(out.clipped[adv != 0].any()), j
