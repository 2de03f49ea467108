"""Trainer on the toy model: log-probs, objectives, resume, NaN rewards, configs, 2 processes."""

from __future__ import annotations

import math
import os
import subprocess
import sys
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.rundir import logged_images_per_epoch
from pcpo_eval.samplers.ddim import DDIMSample, DDIMSampler, ddim_mean
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import TrainConfig, config_from_dict, load_config
from pcpo_eval.train.objectives import eps_matching_log_rho, log_hinge_loss, ppo_clip_loss
from pcpo_eval.train.trainer import Trainer, train
from tests.support.train import TINY


def tiny(**kw) -> TrainConfig:
    return config_from_dict({**TINY, **kw})


@pytest.mark.parametrize("objective", ["ppo_clip", "pcpo"])
def test_logprob_matches_gaussian_and_log_rho_zero_at_theta_old(tmp_path, objective):
    tr = Trainer(tiny(objective=objective), tmp_path / "run")
    s = tr.sample_epoch(1)
    tj = s.traj
    assert isinstance(tr.sampler, DDIMSampler) and isinstance(tj, DDIMSample)
    N, S = tj.log_probs.shape
    assert S == 4 and N == 4
    # stored log-prob == direct Gaussian density of the recorded transition (float64 reference)
    for j in range(S):
        x_t, x_prev = tj.trajectory[:, j].double(), tj.trajectory[:, j + 1].double()
        mu = ddim_mean(x_t, tj.model_outputs[:, j].double(), float(tj.alpha_bar[j]), float(tj.alpha_bar_prev[j]),
                       float(tj.sigmas[j]))
        sd = float(tj.sigmas[j])
        direct = (-((x_prev - mu) ** 2) / (2 * sd**2) - math.log(sd) - 0.5 * math.log(2 * math.pi)).mean((1, 2, 3))
        np.testing.assert_allclose(tj.log_probs[:, j].double().numpy(), direct.numpy(), rtol=1e-4, atol=1e-4)
    # first inner update: theta == theta_old -> log rho == 0 (float error only)
    tr.adapter.denoiser.train()
    rows = torch.arange(N)
    adv = torch.as_tensor(s.advantages, dtype=torch.float32)
    with torch.no_grad():
        for j in range(S):
            _, out, _ = tr.step_loss(s, rows, torch.full((N,), j), adv)
            assert out.log_rho.abs().max().item() < 1e-4


def test_pcpo_samples_with_constant_weight_schedule(tmp_path):
    from pcpo_eval.credit.ddim import ddim_C

    tr = Trainer(tiny(objective="pcpo", sample_steps=10), tmp_path / "run")
    tj = tr.sample_epoch(1).traj
    w = ddim_C(tj.alpha_bar.numpy(), tj.alpha_bar_prev.numpy(), tj.sigmas.numpy()) / tj.sigmas.numpy() ** 2
    from pcpo_eval.credit.ddim import ddim_schedule, pcpo_ddim_credit

    credit = pcpo_ddim_credit(ddim_schedule(tr.adapter.scheduler_config, 10, 1.0))
    ok = np.setdiff1d(np.arange(10), credit.fallback_steps)
    np.testing.assert_allclose(w[ok], credit.w_target, rtol=1e-6)


def test_objectives_small_cases():
    lr = torch.tensor([0.0, 0.1, -0.1])
    adv = torch.tensor([1.0, 1.0, -1.0])
    ppo = ppo_clip_loss(lr, adv, 0.05)
    assert ppo.clipped.tolist() == [False, True, True]
    np.testing.assert_allclose(ppo.loss.numpy(), [-1.0, -1.05, 0.95], rtol=1e-6)  # A=-1: max(0.905, 0.95)
    h = log_hinge_loss(lr, adv, 0.05)
    np.testing.assert_allclose(h.loss.numpy(), [0.05, 0.0, 0.0], atol=1e-7)
    assert h.clipped.tolist() == [False, True, True]
    # a sample with A = 0 (a GRPO group of equal rewards) has no gradient and is clipped under no objective,
    # so the arms' clipfracs compare (the hinge counted it as clipped even on-policy)
    zero = torch.zeros(3)
    assert not ppo_clip_loss(torch.zeros(3), zero, 0.05).clipped.any()
    assert not log_hinge_loss(torch.zeros(3), zero, 0.05).clipped.any()
    assert not log_hinge_loss(lr, zero, 0.05).clipped.any()
    # decomposition: zero difference -> zero log rho
    e = torch.randn(2, 3, 4, 4)
    assert eps_matching_log_rho(e, e, torch.randn_like(e), 2.0).abs().max() == 0


@pytest.fixture(scope="module")
def runs(tmp_path_factory):
    """One uninterrupted 3-epoch run, and a 2-epoch run resumed to 3 (shared by several tests)."""
    root = tmp_path_factory.mktemp("runs")
    full = Trainer(tiny(epochs=3), root / "full").run()
    part = Trainer(tiny(epochs=2), root / "part").run()
    resumed = Trainer(tiny(epochs=3), root / "part", resume=True).run()
    return root, full, part, resumed


def test_resume_equals_uninterrupted(runs):
    root, full, part, resumed = runs
    assert len(part) == 2 and len(resumed) == 3
    cols = ["epoch", "reward_mean", "reward_std", "clipfrac", "approx_kl", "loss", "grad_norm"]
    pd.testing.assert_frame_equal(full[cols], resumed[cols])
    from safetensors.torch import load_file

    a = load_file(str(ck.checkpoint_dir(root / "full", 3) / ck.LORA_FILE))
    b = load_file(str(ck.checkpoint_dir(root / "part", 3) / ck.LORA_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


def test_run_dir_contents_and_lora_reload(runs):
    root, log, _, _ = runs
    run = root / "full"
    for col in ["epoch", "reward_mean", "reward_std", "clipfrac", "approx_kl", "wall_time_s", "rho_mean", "rho_min",
                "rho_max", "rho_std", "grad_norm", "grad_first_abs_mean", "grad_first_abs_var"]:
        assert col in log.columns and log[col].notna().all(), col
    assert (run / "config.yaml").is_file() and any((run / "tb").iterdir())
    assert pd.read_parquet(run / "log.parquet").shape[0] == 3
    cks = ck.list_checkpoints(run)
    assert [p.name for p in cks] == ["epoch_0001", "epoch_0002", "epoch_0003"]
    from safetensors.torch import load_file

    saved = load_file(str(cks[-1] / ck.LORA_FILE))
    assert all(k.startswith("unet.") for k in saved)
    # the checkpoint reloads onto a fresh base model through diffusers' LoRA loader with every
    # trained LoRA tensor intact, and predicts exactly like the trained model's state
    model = ck.load_model_from_spec(str(cks[-1]))
    from peft.utils import get_peft_model_state_dict

    reloaded = get_peft_model_state_dict(model.denoiser)
    state = torch.load(cks[-1] / ck.STATE_FILE, weights_only=False)["peft_state"]
    assert reloaded.keys() == state.keys()
    assert all(torch.equal(reloaded[k], state[k]) for k in state)
    assert any(v.abs().sum() > 0 for k, v in state.items() if "lora_B" in k)  # training moved LoRA B off zero


def test_nan_reward_rejects_epoch_without_checkpoint(tmp_path):
    tr = Trainer(tiny(epochs=1), tmp_path / "run")
    tr.reward_fn = lambda images, prompts: torch.full((len(prompts),), float("nan"))
    with pytest.raises(UserError, match="NaN/inf .* prompt"):
        tr.run()
    assert ck.list_checkpoints(tmp_path / "run") == []


def test_config_validation_messages(tmp_path):
    with pytest.raises(UserError, match="unknown config key.*valid keys"):
        config_from_dict({"epoch": 3})
    with pytest.raises(UserError, match="objective='sgd'.*ppo_clip, log_hinge, eps_matching, pcpo"):
        config_from_dict({"objective": "sgd"})
    with pytest.raises(UserError, match="train_batch_size=3 must divide"):
        config_from_dict({"sample_batch_size": 4, "sample_batches_per_epoch": 1, "train_batch_size": 3})
    with pytest.raises(UserError, match="gradient_updates=3"):
        config_from_dict({"sample_batch_size": 4, "sample_batches_per_epoch": 1, "train_batch_size": 1,
                          "gradient_updates": 3})
    with pytest.raises(UserError, match="epochs: cannot read"):
        load_config(None, ["epochs=two"])
    with pytest.raises(UserError, match="not KEY=VALUE"):
        load_config(None, ["epochs"])
    with pytest.raises(UserError, match="not found"):
        load_config(tmp_path / "nope.yaml")


@pytest.mark.parametrize("path", sorted(Path(__file__).parents[2].glob("train/configs/*.yaml")), ids=lambda p: p.name)
def test_shipped_configs_validate(path):
    load_config(path)


def test_unknown_reward_lists_choices(tmp_path):
    with pytest.raises(UserError, match="unknown reward 'nope'.*jpeg_compressibility"):
        Trainer(tiny(reward="nope"), tmp_path / "run")


def test_cli_train_and_bad_override(tmp_path, cli):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("\n".join(f"{k}: {v}" for k, v in TINY.items()) + "\n")
    r = cli("train", cfg, "--out", tmp_path / "run", "epochs=1", "objective=pcpo")
    assert r.returncode == 0, r.stderr
    assert "done:" in r.stdout and (tmp_path / "run" / "log.parquet").is_file()
    r = cli("train", cfg, "--out", tmp_path / "run2", "objective=sgd")
    assert r.returncode == 2 and "objective='sgd'" in r.stderr and len(r.stderr.strip().splitlines()) == 1
    r = cli("train", cfg, "--out", tmp_path / "run")
    assert r.returncode == 2 and "--resume" in r.stderr


@pytest.mark.slow
def test_two_processes_gloo(tmp_path):
    cfg = tmp_path / "c.yaml"
    cfg.write_text("\n".join(f"{k}: {v}" for k, v in {**TINY, "device": "cpu"}.items()) + "\n")
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    res = subprocess.run(
        [sys.executable, "-m", "torch.distributed.run", "--nproc_per_node", "2", "--master_port", "29517",
         "-m", "pcpo_eval", "train", str(cfg), "--out", str(tmp_path / "run"), "epochs=1"],
        capture_output=True, text=True, env=env, timeout=600,
    )
    assert res.returncode == 0, res.stderr[-2000:]
    log = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert len(log) == 1 and np.isfinite(log["reward_mean"]).all()
    assert ck.list_checkpoints(tmp_path / "run")
    # the images of an epoch over both processes: config.yaml's batch sizes are per process
    per_process = TINY["sample_batch_size"] * TINY["sample_batches_per_epoch"]
    assert (log["processes"].tolist(), log["images"].tolist()) == ([2], [2 * per_process])
    assert logged_images_per_epoch(tmp_path / "run") == 2 * per_process


def test_sd1_lora_checkpoint_loads_with_diffusers_load_lora_weights(tmp_path):
    """A LoRA checkpoint of an SD-1.x UNet is read by StableDiffusionPipeline.load_lora_weights."""
    from peft.utils import get_peft_model_state_dict

    from pcpo_eval.testing import tiny_sd1_adapter, tiny_sd1_pipeline

    ad = tiny_sd1_adapter()
    with torch.random.fork_rng(devices=[]):
        torch.manual_seed(0)
        ad.add_lora(2, 2.0)
        for name, p in ad.denoiser.named_parameters():
            if "lora_B" in name:
                p.data.normal_()
    ckpt = ck.save_checkpoint(tmp_path / "epoch_0001", ad.denoiser, {"epoch": 1, "model": "sd1:tiny"})
    pipe = tiny_sd1_pipeline()
    pipe.load_lora_weights(str(ckpt), weight_name=ck.LORA_FILE)
    want = get_peft_model_state_dict(ad.denoiser)
    got = get_peft_model_state_dict(pipe.unet, adapter_name=next(iter(pipe.unet.peft_config)))
    assert want.keys() == got.keys()
    assert all(torch.equal(want[k], got[k]) for k in want)


def test_resume_errors_name_the_problem(tmp_path, runs):
    with pytest.raises(UserError, match="no complete checkpoint"):
        Trainer(tiny(), tmp_path / "empty", resume=True)
    root = runs[0]
    with pytest.raises(UserError, match="config differs .* learning_rate"):
        Trainer(tiny(epochs=4, learning_rate=1e-3), root / "full", resume=True)
    import shutil

    empty = shutil.copytree(root / "full", tmp_path / "empty_config")
    (empty / "config.yaml").write_text("")  # it listed ten "differing" keys
    with pytest.raises(UserError, match="config.yaml is empty, so the run's settings are unknown"):
        Trainer(tiny(epochs=4), empty, resume=True)
    # no moving average then or now: its cadence keys change no weight, so they do not block a resume (a run
    # written with ema_every 4 was refused under the default 8); with one, they do
    inert = shutil.copytree(root / "full", tmp_path / "inert_ema")
    text = (inert / "config.yaml").read_text()
    (inert / "config.yaml").write_text(text.replace("ema_every: 8", "ema_every: 4").replace("ema_repeats: 0", "ema_repeats: 2"))
    assert "ema_every: 4" in (inert / "config.yaml").read_text()
    Trainer(tiny(epochs=4), inert, resume=True)
    with pytest.raises(UserError, match="config differs .* ema_decay"):
        Trainer(tiny(epochs=4, ema_decay=0.9), inert, resume=True)


def test_resume_of_a_finished_run_writes_nothing(runs, capsys):
    """A resume with no epoch left (epochs= the run's last, or fewer) trains nothing and leaves config.yaml,
    inputs and the TensorBoard folder as they were (it rewrote config.yaml with the smaller epochs and
    opened a new event file)."""
    run = runs[0] / "full"
    before = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    for epochs in (3, 2):
        log = Trainer(tiny(epochs=epochs), run, resume=True).run()
        assert list(log["epoch"]) == [1, 2, 3]
        assert "trained to epoch 3" in capsys.readouterr().out
    after = {p.relative_to(run): p.read_bytes() for p in run.rglob("*") if p.is_file()}
    assert after == before


@pytest.mark.parametrize("lora_rank", [2, 0])
def test_paired_control_samples_the_untrained_model_on_the_same_noises(tmp_path, lora_rank):
    """Epoch 1: policy == base, so control == reward exactly; later the trained policy and its control differ,
    while the control itself equals a fresh untrained model's reward on the same (seed, epoch) draws."""
    cfg = tiny(paired_control=True, lora_rank=lora_rank, learning_rate=3e-3, epochs=2)
    log = Trainer(cfg, tmp_path / "run").run()
    assert log["control_reward_mean"].iloc[0] == log["reward_mean"].iloc[0]
    assert log["control_reward_mean"].iloc[1] != log["reward_mean"].iloc[1]
    base = Trainer(tiny(lora_rank=lora_rank, epochs=2), tmp_path / "base")
    s2 = base.sample_epoch(2)  # untrained model, epoch-2 prompts and noises
    assert float(np.mean(s2.all_rewards)) == pytest.approx(log["control_reward_mean"].iloc[1], abs=1e-12)


def test_ppo_health_is_logged_per_update_and_step(tmp_path):
    log = Trainer(tiny(gradient_updates=2, epochs=1), tmp_path / "run").run()
    row = log.iloc[0]
    assert len(row["approx_kl_per_update"]) == 2 and len(row["clipfrac_per_update"]) == 2
    assert len(row["log_rho_abs_per_step"]) == 4  # sample_steps
    assert row["log_rho_min"] <= 0.0 <= row["log_rho_max"] or row["log_rho_min"] == row["log_rho_max"] == 0.0
    assert np.isnan(row["control_reward_mean"])  # paired_control off


def test_ppo_health_warning_names_the_fix():
    from pcpo_eval.train.trainer import ppo_health_warning

    assert ppo_health_warning(pd.DataFrame({"approx_kl": [1e-4, 2e-4], "clipfrac": [0.01, 0.02]})) is None
    msg = ppo_health_warning(pd.DataFrame({"approx_kl": [23.0, 65.0], "clipfrac": [0.45, 0.45]}))
    assert msg is not None and "lower the learning rate" in msg and "\n" not in msg
    assert "median approx_kl 44 > 0.05 and mean clipfrac 0.45 > 0.25" in msg
    # Only the condition that fired is named.
    kl_only = ppo_health_warning(pd.DataFrame({"approx_kl": [0.2, 0.4], "clipfrac": [0.01, 0.02]}))
    assert kl_only == "updates too large (median approx_kl 0.3 > 0.05): lower the learning rate or the clip range"
    cf_only = ppo_health_warning(pd.DataFrame({"approx_kl": [1e-4, 2e-4], "clipfrac": [0.3, 0.5]}))
    assert cf_only == "updates too large (mean clipfrac 0.4 > 0.25): lower the learning rate or the clip range"


def test_non_finite_config_values_are_rejected():
    with pytest.raises(UserError, match=r"non-finite values cfg=nan"):
        tiny(cfg=float("nan")).validate()


# ---- PCPO's DDIM fallback in training, fp16 loss scaling (docs/credit.md) ---------------------------


def test_pcpo_fallback_cap_scales_and_exclude_skips_the_unreachable_steps(tmp_path):
    from pcpo_eval.credit.ddim import ddim_schedule, pcpo_ddim_credit

    tr = Trainer(tiny(objective="pcpo", sample_steps=8), tmp_path / "cap")  # residual: toy step 6 has no root
    credit = pcpo_ddim_credit(ddim_schedule(tr.adapter.scheduler_config, 8, 1.0), "residual")
    assert credit.fallback_steps == [6]
    s = tr.sample_epoch(1)
    with torch.no_grad():  # perturb LoRA so log rho != 0
        for n, p in tr.adapter.denoiser.named_parameters():
            if "lora_B" in n:
                p.add_(0.05 * torch.randn(p.shape, generator=torch.Generator().manual_seed(1)))
    rows, adv = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32)
    scale = tr.sampler.credit_scale(s.traj, torch.arange(8), "pcpo")
    np.testing.assert_allclose(scale.numpy(), credit.credit_scale, rtol=1e-6)
    assert scale[6] < 1 and torch.all(scale[[0, 1, 2, 3, 4, 5, 7]] == 1)
    with torch.no_grad():
        _, out, _ = tr.step_loss(s, rows, torch.full((4,), 6), adv)
    ref = torch.clamp(tr.cfg.clip_range * adv.abs() - adv * float(scale[6]) * out.log_rho, min=0)
    np.testing.assert_allclose(out.loss.numpy(), ref.numpy(), rtol=1e-5, atol=1e-9)
    assert tr._trainable_steps(s) == list(range(8))
    ex = Trainer(tiny(objective="pcpo", sample_steps=8, credit_fallback="exclude"), tmp_path / "exclude")
    assert ex._trainable_steps(ex.sample_epoch(1)) == [0, 1, 2, 3, 4, 5, 7]
    assert np.isfinite(ex.run()["loss"]).all()


def test_fp16_loss_scaling_equals_the_unscaled_step_and_skips_inf(tmp_path):
    a, b = Trainer(tiny(epochs=1), tmp_path / "a"), Trainer(tiny(epochs=1), tmp_path / "b")
    assert a.scaler is None  # CPU: no autocast, no scaling
    b.scaler = torch.amp.GradScaler("cpu", init_scale=2.0**12)  # the CUDA fp16 path, exercised on CPU
    ra, rb = a.train_epoch(1, a.sample_epoch(1)), b.train_epoch(1, b.sample_epoch(1))
    assert rb["loss_scale"] == 2.0**12 and "loss_scale" not in ra
    for pa, pb in zip(a.params, b.params, strict=True):  # power-of-2 scaling is exact in float32
        assert torch.equal(pa, pb)
    before = [p.detach().clone() for p in b.params]
    for p in b.params:
        p.grad = torch.zeros_like(p)
    b.params[0].grad.view(-1)[0] = float("inf")
    b._optimizer_step()  # overflow: the scaler skips the step and halves the scale
    assert all(torch.equal(p, q) for p, q in zip(b.params, before, strict=True))
    assert b.scaler.get_scale() == 2.0**11


def test_grad_scaler_only_for_fp16_on_cuda(tmp_path):
    tr = Trainer(tiny(epochs=1, mixed_precision="fp16"), tmp_path / "run")
    assert tr._grad_scaler() is None  # CPU
    tr.device = torch.device("cuda")
    tr.cfg.mixed_precision = "bf16"
    assert tr._grad_scaler() is None
    tr.cfg.mixed_precision = "fp16"
    import warnings

    with warnings.catch_warnings():
        warnings.simplefilter("ignore")  # no CUDA here: the scaler warns and disables itself
        assert isinstance(tr._grad_scaler(), torch.amp.GradScaler)


def test_train_min_sigma_skips_small_noise_steps(tmp_path):
    tr = Trainer(tiny(train_min_sigma=0.05, sample_steps=8), tmp_path / "run")
    s = tr.sample_epoch(1)
    kept = tr._trainable_steps(s)
    sig = s.traj.sigmas
    assert kept and all(float(sig[j]) >= 0.05 for j in kept)
    assert any(float(sig[j]) < 0.05 for j in range(8) if j not in kept)
    with pytest.raises(UserError, match="leaves no step to train"):
        Trainer(tiny(train_min_sigma=10.0), tmp_path / "r2")._trainable_steps(s)


@pytest.mark.parametrize("objective", ["ppo_clip", "pcpo"])
def test_train_batch_size_changes_only_the_forward_size(tmp_path, objective):
    """Micro-batches of 2 or 8 samples give an epoch's updates to float rounding: each optimizer step
    averages the same samples' losses at the same timesteps (perm, per-sample timesteps and the update's
    share of the epoch do not depend on it), so ``train_batch_size`` is a speed / memory setting
    (docs/training.md). One epoch: later epochs sample from policies a rounding apart, and a hinge at its
    clip boundary can turn either way (measured: 2.4e-4 relative in epoch 2's gradient norm)."""
    logs = {}
    for tb in (2, 8):
        cfg = load_config(Path(__file__).resolve().parents[2] / "train" / "configs" / "toy_pcpo.yaml", [
            "epochs=1", f"train_batch_size={tb}", "log_to=none", "log_images_every=0", "checkpoint_every=100",
            f"objective={objective}"])
        logs[tb] = train(cfg, tmp_path / f"tb{tb}")
    assert np.array_equal(logs[2]["reward_mean"], logs[8]["reward_mean"])  # the same samples
    for col in ("loss", "grad_norm", "approx_kl", "rho_max"):
        assert np.allclose(logs[2][col], logs[8][col], rtol=1e-3, atol=1e-9), col  # measured <= 5.3e-5 relative
    assert np.array_equal(logs[2]["clipfrac"], logs[8]["clipfrac"])
