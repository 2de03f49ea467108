"""Trainer on the toy flow model: DanceGRPO / Flow-GRPO SDE log-probs, PCPO reweighting, KL, short runs."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from pcpo_eval.credit.flow import flow_credit
from pcpo_eval.errors import UserError
from pcpo_eval.models.toy_flow import load_toy_flow
from pcpo_eval.samplers.flow import (
    FlowSample,
    FlowSampler,
    flow_kl_to_reference,
    flow_log_prob,
    flow_sde_mean,
)
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import Trainer


def redness(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    """Toy reward: mean red minus mean green/blue, in [-1, 1] (B,) float32."""
    x = images.float() / 255.0
    return (x[:, 0] - 0.5 * (x[:, 1] + x[:, 2])).mean((1, 2)).float()


@pytest.fixture
def env(tmp_path, monkeypatch):
    """Model 'toyflow' -> a random-init toy flow model (fast, independent of the shipped weights);
    reward 'redness' -> the test reward."""
    import pcpo_eval.models.registry as registry
    import pcpo_eval.rewards as rewards

    monkeypatch.setitem(registry.REGISTRY, "toyflow", lambda arg, device, dtype: load_toy_flow(device, random_init=True))
    real = rewards.make_reward
    monkeypatch.setattr(rewards, "make_reward", lambda name, **o: redness if name == "redness" else real(name, **o))
    return tmp_path, "toy"


def _cfg(prompts, **kw):
    base = dict(model="toyflow", prompts=prompts, reward="redness", epochs=2, sample_steps=4, sample_eta=0.3,
                sde="dance", flow_shift=3.0, cfg=2.0, sample_batch_size=4, sample_batches_per_epoch=1,
                advantage="group", images_per_prompt=2, train_batch_size=2, gradient_updates=1,
                learning_rate=3e-3, clip_range=1e-3, lora_rank=2, lora_alpha=4.0, train_last_step=False,
                timestep_fraction=1.0, device="cpu")
    return config_from_dict({**base, **kw})


def _perturb_lora(tr, scale=0.05):
    g = torch.Generator().manual_seed(123)
    with torch.no_grad():
        for n, p in tr.adapter.denoiser.named_parameters():
            if "lora_B" in n:
                p.add_(scale * torch.randn(p.shape, generator=g))


@pytest.mark.parametrize("sde,eta,objective", [("dance", 0.3, "ppo_clip"), ("flowgrpo", 0.7, "pcpo")])
def test_logprob_is_gaussian_density_and_log_rho_zero_at_theta_old(env, sde, eta, objective):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, sde=sde, sample_eta=eta, objective=objective), tmp / "run")
    s = tr.sample_epoch(1)
    tj = s.traj
    assert isinstance(tr.sampler, FlowSampler) and isinstance(tj, FlowSample) and tj.log_probs.shape == (4, 4)
    for j in range(4):
        t, dt, sig = float(tj.t[j]), float(tj.dt[j]), float(tj.sigmas[j])
        x, xn = tj.trajectory[:, j].double(), tj.trajectory[:, j + 1].double()
        mu = flow_sde_mean(x, tj.model_outputs[:, j].double(), t, dt, sig)
        sd = sig * math.sqrt(dt)
        direct = (-((xn - mu) ** 2) / (2 * sd**2) - math.log(sd) - 0.5 * math.log(2 * math.pi)).mean((1, 2, 3))
        np.testing.assert_allclose(tj.log_probs[:, j].double().numpy(), direct.numpy(), rtol=1e-4, atol=1e-4)
    rows, adv = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32)
    with torch.no_grad():
        for j in range(4):
            _, out, _ = tr.step_loss(s, rows, torch.full((4,), j), adv)
            assert out.log_rho.abs().max().item() < 1e-4


def test_pcpo_hinge_uses_zeta_dt_over_native_weight(env):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, objective="pcpo", sde="flowgrpo", sample_eta=0.7), tmp / "run")
    s = tr.sample_epoch(1)
    tj = s.traj
    _perturb_lora(tr)
    credit = flow_credit("flowgrpo", 4, 0.7, 3.0, times=np.append(tj.t.numpy(), 0.0))
    rows, adv = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32)
    with torch.no_grad():
        for j in range(4):
            jj = torch.full((4,), j)
            _, out, _ = tr.step_loss(s, rows, jj, adv)
            t, dt, sig = float(tj.t[j]), float(tj.dt[j]), float(tj.sigmas[j])
            x, xn = tj.trajectory[:, j], tj.trajectory[:, j + 1]
            u = tr.adapter.predict(x, torch.full((4,), t), s.cond, tr.null.repeat(4), 2.0)
            exact = flow_log_prob(x.double(), u.double(), xn.double(), t, dt, sig) - flow_log_prob(
                x.double(), tj.model_outputs[:, j].double(), xn.double(), t, dt, sig)
            np.testing.assert_allclose(out.log_rho.numpy(), exact.numpy(), rtol=2e-3, atol=1e-5)
            w = math.sqrt(dt) / sig * (1 + (1 - t) * sig**2 / (2 * t))
            scale = credit.zeta * dt / w
            ref = torch.clamp(1e-3 * adv.abs() - adv * scale * out.log_rho, min=0)
            np.testing.assert_allclose(out.loss.numpy(), ref.numpy(), rtol=1e-5, atol=1e-7)
    steps = torch.arange(4)
    scale, w = tr.sampler.credit_scale(tj, steps, "pcpo"), tr.sampler.native_weight(tj, steps)
    np.testing.assert_allclose(scale.double().numpy() * w.double().numpy(), credit.pcpo_weight, rtol=1e-6)
    assert torch.equal(tr.sampler.credit_scale(tj, steps, "ppo_clip"), torch.ones(4))


def test_kl_penalty_against_base_weights(env):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, sde="flowgrpo", sample_eta=0.7, beta_kl=0.04, objective="ppo_clip"), tmp / "run")
    s = tr.sample_epoch(1)
    rows, adv, jj = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32), torch.full((4,), 2)
    with torch.no_grad():
        _, _, kl0 = tr.step_loss(s, rows, jj, adv)
    assert set(kl0) == {"paper", "flowgrpo_code"}
    assert max(v.abs().max().item() for v in kl0.values()) < 1e-10  # LoRA B = 0 at init: policy == base
    _perturb_lora(tr)
    t, dt, sig = float(s.traj.t[2]), float(s.traj.dt[2]), float(s.traj.sigmas[2])
    x = s.traj.trajectory[:, 2]
    with torch.no_grad():
        loss, out, kl = tr.step_loss(s, rows, jj, adv)
        u = tr.adapter.predict(x, torch.full((4,), t), s.cond, tr.null.repeat(4), 2.0)
        tr.adapter.denoiser.disable_adapters()
        u_ref = tr.adapter.predict(x, torch.full((4,), t), s.cond, tr.null.repeat(4), 2.0)
        tr.adapter.denoiser.enable_adapters()
    assert kl["paper"].min().item() > 0
    np.testing.assert_allclose(kl["paper"].numpy(), flow_kl_to_reference(u, u_ref, t, dt, sig).numpy(), rtol=1e-4)
    np.testing.assert_allclose(kl["flowgrpo_code"].numpy(), (kl["paper"] * dt).numpy(), rtol=1e-5)
    np.testing.assert_allclose(loss.numpy(), (out.loss + 0.04 * kl["paper"]).numpy(), rtol=1e-6)


@pytest.mark.parametrize("objective", ["ppo_clip", "pcpo"])
def test_short_dancegrpo_and_pcpo_runs_log_rewards_and_clipfrac(env, objective):
    tmp, prompts = env
    cfg = _cfg(prompts, objective=objective, epochs=3, sample_steps=3, timestep_fraction=0.5)
    tr = Trainer(cfg, tmp / objective)
    assert tr._train_steps() == [0, 1]  # DanceGRPO never trains the last step (int(2 * 0.5) = 1 trained)
    log = tr.run()
    disk = pd.read_parquet(tmp / objective / "log.parquet")
    assert list(disk["epoch"]) == [1, 2, 3]
    for col in ("reward_mean", "reward_std", "clipfrac", "approx_kl", "wall_time_s", "rho_mean", "grad_norm"):
        assert np.all(np.isfinite(disk[col].to_numpy())), col
    assert 0.0 <= disk["clipfrac"].min() and disk["clipfrac"].max() <= 1.0
    assert disk["grad_norm"].max() > 0
    assert len(log) == 3 and (tmp / objective / "checkpoints" / "epoch_0003" / "checkpoint.json").is_file()


def test_flow_config_keys_are_validated():
    with pytest.raises(UserError, match="dance, flowgrpo"):
        config_from_dict({"sde": "brownian"})
    with pytest.raises(UserError, match="flow_grid"):
        config_from_dict({"flow_grid": "linear"})
    with pytest.raises(UserError, match="flow_shift"):
        config_from_dict({"flow_shift": 0})
