"""`train_steps_per_forward`: several of each sample's selected steps in one update forward is a speed
setting only. The run's log and its LoRA weights equal the one-step-per-forward run's within float
rounding (ppo_clip and PCPO, with the KL and the diagnostics; the real SD-1.x architecture and the toy
flow model with Flow-GRPO's options), while the denoiser is called fewer times."""

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
FLOW = "train/configs/toy_flow_pcpo.yaml"
#: the log columns that carry the update's values (losses, ratios, clipping, gradients, KL, Eq. Delta terms)
UPDATE_COLUMNS = ("reward_mean", "loss", "clipfrac", "approx_kl", "rho_mean", "rho_min", "rho_max",
                  "log_rho_abs_mean", "grad_norm", "grad_first_abs_mean", "kl_ref")


def _sd1(model, *extra):
    # 4 steps trained per sample, so 3 per forward leaves a last group of 1
    return [f"model=sd1:{model}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=2",
            "sample_steps=4", "sample_batch_size=4", "sample_batches_per_epoch=1", "train_batch_size=2",
            "paper_total_batch=0", "log_to=none", "log_images_every=0", "mixed_precision=no", "device=cpu",
            "beta_kl=0.01", "learning_rate=0.01", "diagnostics=true", *extra]


def _same_log(a, b, rtol: float = 1e-3) -> None:
    """Equal within float32 rounding: a batch of another size takes other kernel blockings (outputs ~1e-7
    apart), and a log-ratio is the small difference of two log-probs, so its relative error is ~1e-4.
    The per-step ratios of Eq. Delta's terms at the first off-policy update divide two rounding-sized
    numbers for a few samples each (seen 0.2 % apart): 1e-2 there. The Taylor errors |log rho - (rho - 1)|
    / |log rho| ~ |log rho| / 2 are rounding-sized at the on-policy update (log rho ~ 1e-6 there, seen
    1e-6 apart): 1e-5 apart at most."""
    for col in UPDATE_COLUMNS + tuple(c for c in a.columns if c.startswith(("delta_", "kl_ref_", "taylor_"))):
        va, vb = (np.asarray(x[col].tolist(), dtype=float) for x in (a, b))  # per-update columns hold lists
        tol = 1e-2 if col.endswith("_per_step") else rtol
        # a per-update column's on-policy update holds rounding-sized values (d = 0 up to rounding there):
        # within 1e-4 of the column's largest value
        atol = 1e-5 if col.startswith("taylor_") else max(1e-7, 1e-4 * float(np.nanmax(np.abs(va), initial=0.0)))
        assert np.allclose(va, vb, rtol=tol, atol=atol, equal_nan=True), (col, va.tolist(), vb.tolist())


def _weights_apart(out_a, out_b) -> float:
    """Largest difference between the two runs' last LoRA weights."""
    wa, wb = (load_file(str(ck.list_checkpoints(out)[-1] / ck.LORA_FILE)) for out in (out_a, out_b))
    assert wa.keys() == wb.keys()
    return max(float((wa[k] - wb[k]).abs().max()) for k in wa)


def _count_update_calls(trainer: Trainer) -> list[int]:
    """Rows of every denoiser call made while the update runs (sampling's calls are not counted)."""
    rows: list[int] = []
    inner = trainer.train_epoch

    def counting(epoch, samples):
        hook = trainer.adapter.denoiser.register_forward_pre_hook(
            lambda _m, args, kwargs: rows.append(int((args or [kwargs.get("sample")])[0].shape[0])),
            with_kwargs=True)
        try:
            return inner(epoch, samples)
        finally:
            hook.remove()

    trainer.train_epoch = counting
    return rows


@pytest.mark.parametrize("objective", ["ppo_clip", "pcpo"])
def test_steps_per_forward_trains_the_same_run_in_fewer_calls(tmp_path, objective):
    model = save_tiny_sd1(tmp_path / "sd1")
    runs, calls = {}, {}
    for k in (1, 3):
        cfg = load_config(SETUP, _sd1(model, f"objective={objective}", f"train_steps_per_forward={k}"))
        trainer = Trainer(cfg, tmp_path / f"k{k}")
        calls[k] = _count_update_calls(trainer)
        runs[k] = trainer.run()
    # another change that only re-blocks the same sums: one sample per micro-batch instead of two
    one = train(load_config(SETUP, _sd1(model, f"objective={objective}", "train_batch_size=1")), tmp_path / "tb1")
    for run in (runs[3], one):
        _same_log(runs[1], run)
    # AdamW moves a weight by ~lr at each step whatever its gradient's size, so a near-zero gradient's
    # rounding shows in the weights at up to that scale. Fusing the steps stays closer to the one-step run
    # than re-blocking does (measured: 1.1e-5 / 6.9e-5 against 2.7e-4 / 5.8e-4, ppo_clip / pcpo, lr 0.01)
    assert _weights_apart(tmp_path / "k1", tmp_path / "k3") <= _weights_apart(tmp_path / "k1", tmp_path / "tb1")
    assert "delta_ratio_per_update" in runs[3].columns  # the diagnostics were compared too
    # per epoch: 2 micro-batches of 2 samples x 4 steps; CFG doubles the rows of each call; the KL's
    # reference forward (LoRA disabled) is one more call of the same rows per policy call
    assert sorted(set(calls[1])) == [4] and len(calls[1]) == 2 * (2 * 4) * 2
    assert sorted(calls[3]) == sorted([12, 4] * 2 * 2 * 2), calls[3]


def test_steps_per_forward_on_the_flow_model_with_flowgrpo_options(tmp_path):
    """Velocity model, DanceGRPO groups, Flow-GRPO's dropped zero advantages (micro-batches of varying size)
    and detached unconditional branch; all 4 trained steps of a sample in one forward."""
    over = ["epochs=2", "log_to=none", "log_images_every=0", "drop_zero_advantage=true", "cfg_detach_uncond=true",
            "beta_kl=0.01", "adv_std=batch"]
    a = train(load_config(FLOW, over), tmp_path / "one")
    b = train(load_config(FLOW, [*over, "train_steps_per_forward=4"]), tmp_path / "four")
    _same_log(a, b)
    # AdamW moves a weight by ~lr per step, so a rounding-sized gradient can move it by up to ~lr: the two
    # runs stay within 1 % of lr x optimizer steps (seen 0.1-0.2 %; the loss and grad-norm columns above
    # are the tight check of the gradient's scale)
    assert _weights_apart(tmp_path / "one", tmp_path / "four") <= 1e-2 * 3e-4 * (2 * 2)
    assert (a["train_samples"] == b["train_samples"]).all()


def test_steps_per_forward_must_be_positive_and_may_change_on_resume(tmp_path):
    with pytest.raises(UserError, match="train_steps_per_forward must be >= 1"):
        load_config(FLOW, ["train_steps_per_forward=0"])
    over = ["epochs=1", "log_to=none", "log_images_every=0"]
    train(load_config(FLOW, over), tmp_path / "run")
    log = train(load_config(FLOW, ["epochs=2", "log_to=none", "log_images_every=0", "train_steps_per_forward=2"]),
                tmp_path / "run", resume=True)
    assert log["epoch"].tolist() == [1, 2] and np.isfinite(log["loss"]).all()
    assert torch.isfinite(torch.tensor(log["grad_norm"].to_numpy())).all()


def test_sample_batch_size_is_a_speed_setting_too(tmp_path):
    """Every sample's noise is keyed by its index in the epoch, so only sample_batch_size x
    sample_batches_per_epoch matters: one sampling call of 36 trains the run three calls of 12 train
    (what a one-GPU user raises to fill the GPU; the paper's per-GPU sizes fit its 8 GPUs' memory).
    ``train_batch_size`` likewise: tests/train/test_trainer.py."""
    base = ["epochs=2", "log_to=none", "log_images_every=0", "beta_kl=0.01"]  # 3 x 12 samples, micro-batches of 6
    a = train(load_config(FLOW, base), tmp_path / "paper")
    b = train(load_config(FLOW, [*base, "sample_batch_size=36", "sample_batches_per_epoch=1"]), tmp_path / "big")
    _same_log(a, b)
    for col in ("reward_mean", "control_reward_mean", "reward_std"):
        assert np.allclose(a[col], b[col], rtol=1e-5, equal_nan=True), col
    assert _weights_apart(tmp_path / "paper", tmp_path / "big") <= 1e-2 * 3e-4 * (2 * 2)  # as above
