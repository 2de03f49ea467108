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


def test_kl_reference_runs_in_the_policys_precision(env):
    """Under bf16 autocast the reference forward is autocast too: at init (LoRA B = 0, policy == base) the
    KL is 0 exactly, not the rounding difference between a bf16 policy and an fp32 reference (0.008)."""
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, sde="flowgrpo", sample_eta=0.7, beta_kl=0.04, objective="ppo_clip",
                      mixed_precision="bf16"), tmp / "run")
    s = tr.sample_epoch(1)
    rows, adv, jj = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32), torch.full((4,), 2)
    with torch.no_grad():
        _, _, kl0 = tr.step_loss(s, rows, jj, adv)
    assert max(v.abs().max().item() for v in kl0.values()) == 0.0


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


# ---- reference conventions as train options (docs/credit.md) ------------------------------------


def test_kl_form_flowgrpo_code_in_the_loss_and_both_forms_logged(env):
    tmp, prompts = env
    cfg = _cfg(prompts, sde="flowgrpo", sample_eta=0.7, beta_kl=0.5, kl_form="flowgrpo_code", epochs=1)
    tr = Trainer(cfg, tmp / "run")
    s = tr.sample_epoch(1)
    _perturb_lora(tr)
    rows, adv, jj = torch.arange(4), torch.as_tensor(s.advantages, dtype=torch.float32), torch.full((4,), 1)
    with torch.no_grad():
        loss, out, kl = tr.step_loss(s, rows, jj, adv)
    np.testing.assert_allclose(loss.numpy(), (out.loss + 0.5 * kl["flowgrpo_code"]).numpy(), rtol=1e-6)
    np.testing.assert_allclose(kl["flowgrpo_code"].numpy(), (kl["paper"] * float(s.traj.dt[1])).numpy(), rtol=1e-5)
    row = tr.train_epoch(1, s)
    assert row["kl_ref"] == row["kl_ref_flowgrpo_code"] and row["kl_ref_paper"] > row["kl_ref_flowgrpo_code"] > 0


def test_cfg_detach_uncond_backpropagates_only_the_conditional_branch(env):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, cfg=3.0, cfg_detach_uncond=True), tmp / "run")
    s = tr.sample_epoch(1)
    _perturb_lora(tr)
    x, t = s.traj.trajectory[:, 1], tr.sampler.model_time(s.traj, torch.full((4,), 1))
    v = torch.randn(x.shape, generator=torch.Generator().manual_seed(5))
    params = tr.params

    def grads(fn):
        for p in params:
            p.grad = None
        (fn() * v).sum().backward()
        return torch.cat([p.grad.reshape(-1) for p in params])

    out = tr._predict(x, t, s.cond, 4)
    np.testing.assert_allclose(out.detach().numpy(), tr.adapter.predict(x, t, s.cond, tr.null.repeat(4), 3.0).detach()
                               .numpy(), rtol=1e-6, atol=1e-7)  # the same value as the plain CFG output
    # d/dtheta [sg(u_u) + w (u_c - sg(u_u))] = w du_c/dtheta (float32: the 2B batch vs the B batch differ ~1e-6)
    detached, cond_only = grads(lambda: tr._predict(x, t, s.cond, 4)), 3.0 * grads(lambda: tr.adapter.denoise(x, t, s.cond))
    tol = 1e-5 * float(cond_only.abs().max())
    np.testing.assert_allclose(detached.numpy(), cond_only.numpy(), rtol=1e-4, atol=tol)
    full = grads(lambda: tr.adapter.predict(x, t, s.cond, tr.null.repeat(4), 3.0))
    assert float((full - detached).abs().max()) > 100 * tol  # the plain CFG gradient also has -2 du_u/dtheta


def test_model_time_quantize_feeds_int_1000t_in_sampling_and_training(env):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, model_time_quantize=True, sample_steps=5), tmp / "run")
    seen: list[torch.Tensor] = []
    real = tr.adapter.denoise
    tr.adapter.denoise = lambda x, t, c: (seen.append(t.detach().clone()), real(x, t, c))[1]
    s = tr.sample_epoch(1)
    times = s.traj.t.numpy()
    expect = np.floor(times.astype(np.float32) * np.float32(1000)) / 1000
    assert not np.allclose(expect, times)  # the shifted grid is not on the 1/1000 lattice
    np.testing.assert_allclose(np.unique(torch.cat(seen).numpy()), np.unique(expect), rtol=0, atol=1e-7)
    seen.clear()
    with torch.no_grad():
        tr.step_loss(s, torch.arange(4), torch.full((4,), 2), torch.ones(4))
    np.testing.assert_allclose(torch.cat(seen).numpy(), expect[2], rtol=0, atol=1e-7)


def test_adv_std_batch_in_the_trainer(env):
    from pcpo_eval.train.advantages import batch_std_advantages

    tmp, prompts = env
    tr = Trainer(_cfg(prompts, adv_std="batch"), tmp / "run")
    s = tr.sample_epoch(1)
    np.testing.assert_allclose(s.advantages, np.clip(batch_std_advantages(s.prompts, s.rewards), -5, 5), rtol=1e-12)


def test_drop_zero_advantage_keeps_the_update_structure(env):
    tmp, prompts = env
    tr = Trainer(_cfg(prompts, drop_zero_advantage=True, sample_batch_size=8, train_batch_size=2, gradient_updates=2,
                      images_per_prompt=4), tmp / "run")
    s = tr.sample_epoch(1)
    s.advantages = np.array([0.0, 0.5, -0.5, 0.0, 0.0, 1.0, 0.0, 0.0])  # 3 non-zero, 4 micro-batches of 2
    perm = torch.randperm(8, generator=torch.Generator().manual_seed(0))
    micro = tr._micro_batches(perm, s, epoch=1)
    kept = torch.cat(micro).tolist()
    assert len(micro) == 4 and {len(m) for m in micro} == {1}  # 3 kept + 1 zero put back = 4 = one per batch
    assert {1, 2, 5} <= set(kept) and len(set(kept)) == 4
    assert kept == [i for i in perm.tolist() if i in kept]  # perm order
    assert micro == tr._micro_batches(perm, s, epoch=1)  # keyed: the same rows in every inner epoch
    s.advantages = np.array([0.0, 0.5, -0.5, 0.3, 0.2, 1.0, 0.0, 0.1])  # 6 non-zero -> 8 (multiple of 4)
    assert sorted(torch.cat(tr._micro_batches(perm, s, epoch=1)).tolist()) == list(range(8))
    s.advantages = np.array([0.0, 0.5, -0.5, 0.3, 0.2, 1.0, 0.4, 0.1])  # 7 non-zero -> 8
    assert len(torch.cat(tr._micro_batches(perm, s, epoch=1))) == 8
    s.advantages = np.array([0.0, 0.5, -0.5, 0.3, 0.2, 0.0, 0.0, 0.0])  # 4 non-zero: none put back
    assert sorted(torch.cat(tr._micro_batches(perm, s, epoch=1)).tolist()) == [1, 2, 3, 4]
    s.advantages = np.array([0.0, 0.5, -0.5, 0.0, 0.0, 1.0, 0.0, 0.0])
    row = tr.train_epoch(1, s)
    assert row["train_samples"] == 4 and np.isfinite(row["loss"])
