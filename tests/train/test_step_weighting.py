"""High-noise uniform reweighting (paper Fig. naive-acceleration c-d, setup 10): weights, scale, trainer."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.credit.flow import flow_credit, flow_native_weight, uniform_flow_scale, uniform_weights
from pcpo_eval.errors import UserError
from pcpo_eval.models.toy_flow import load_toy_flow
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.objectives import hinge_from_log_rho
from pcpo_eval.train.trainer import Trainer


def test_uniform_weights_hand_values():
    np.testing.assert_allclose(uniform_weights(np.array([1.0, 2.0, 6.0])), [3.0, 3.0, 3.0])


def test_uniform_is_the_mean_native_weight_and_emphasises_high_noise():
    c = flow_credit("dance", steps=16, eta=0.3, shift=3.0)
    w_u = uniform_weights(c.native_weight)
    np.testing.assert_allclose(w_u, c.zeta / 16, rtol=1e-12)  # same total as native and PCPO (zeta)
    np.testing.assert_allclose(w_u.sum(), c.pcpo_weight.sum(), rtol=1e-12)
    # relative to the native weights (sqrt(dt) on the shifted grid) it moves weight to the short
    # high-noise steps (t ~ 1, i = 0); PCPO's zeta*dt moves it the other way
    ratio_u, ratio_p = w_u / c.native_weight, c.pcpo_weight / c.native_weight
    assert np.all(np.diff(ratio_u) < 0) and np.all(np.diff(ratio_p) > 0)
    assert c.t[0] == 1.0 and ratio_u[0] > 1 > ratio_p[0]
    assert c.to_dict()["steps"][3]["uniform_weight"] == pytest.approx(c.zeta / 16)


@pytest.mark.parametrize("sde", ["dance", "flowgrpo"])
def test_uniform_flow_scale_gives_constant_effective_weight(sde):
    times = flow_credit(sde, 10, 0.7, 3.0).t.tolist() + [0.0]
    times = np.array(times)
    t, dt = times[:-1], times[:-1] - times[1:]
    from pcpo_eval.samplers.flow import step_sigmas

    sig = step_sigmas(times, sde, 0.7)
    scale = uniform_flow_scale(t, dt, sig, sde, 0.7, times)
    eff = scale * flow_native_weight(t, dt, sig)
    zeta = flow_credit(sde, 10, 0.7, 1.0, times=times).zeta
    np.testing.assert_allclose(eff, zeta / 10, rtol=1e-12)


def redness(images: torch.Tensor, prompts: list[str]) -> torch.Tensor:
    x = images.float() / 255.0
    return (x[:, 0] - 0.5 * (x[:, 1] + x[:, 2])).mean((1, 2)).float()


@pytest.fixture
def flow_env(monkeypatch):
    import pcpo_eval.models.registry as registry
    import pcpo_eval.rewards as rewards

    monkeypatch.setitem(registry.REGISTRY, "toyflow", lambda arg, device, dtype: load_toy_flow(device, random_init=True))
    real = rewards.make_reward
    monkeypatch.setattr(rewards, "make_reward", lambda name, **o: redness if name == "redness" else real(name, **o))


FLOW = dict(model="toyflow", prompts="toy", reward="redness", epochs=1, sample_steps=6, sample_eta=0.3, sde="dance",
            flow_shift=3.0, cfg=2.0, sample_batch_size=4, sample_batches_per_epoch=1, advantage="group",
            images_per_prompt=2, train_batch_size=2, gradient_updates=2, learning_rate=3e-3, clip_range=1e-3,
            lora_rank=2, lora_alpha=4.0, train_last_step=False, device="cpu", objective="pcpo")


def test_trainer_applies_the_uniform_scale_in_the_hinge(tmp_path, flow_env):
    tr = Trainer(config_from_dict({**FLOW, "step_weighting": "uniform_high_noise", "diagnostics": True}), tmp_path / "u")
    s = tr.sample_epoch(1)
    j = torch.arange(5)
    eff = tr._credit_scale(s.traj, j) * tr.sampler.native_weight(s.traj, j)
    np.testing.assert_allclose(eff.numpy(), eff[0].item(), rtol=1e-5)  # one weight for every step
    pcpo = Trainer(config_from_dict(FLOW), tmp_path / "p")
    assert not torch.allclose(pcpo._credit_scale(s.traj, j), tr._credit_scale(s.traj, j))
    # the loss is the hinge on scale * log rho
    rows, jj, adv = torch.arange(4), torch.full((4,), 2), torch.tensor([1.0, -1.0, 0.5, -0.5])
    with torch.no_grad():
        for p in tr.params:
            p.add_(0.01)
        loss, out, _ = tr.step_loss(s, rows, jj, adv)
    ref = hinge_from_log_rho(out.log_rho, adv, 1e-3, weight_scale=tr._credit_scale(s.traj, jj))
    torch.testing.assert_close(loss, ref.loss)
    row = tr.train_epoch(1, s)
    assert np.isfinite(row["loss"]) and np.isfinite(row["delta_ratio_first_offpolicy"])


def test_step_weighting_config_errors(flow_env):
    with pytest.raises(UserError, match="choose native, uniform_high_noise"):
        config_from_dict({**FLOW, "step_weighting": "uniform"})
    with pytest.raises(UserError, match="use objective=pcpo or eps_matching"):
        config_from_dict({**FLOW, "objective": "ppo_clip", "step_weighting": "uniform_high_noise"})
    with pytest.raises(UserError, match="velocity models"):
        config_from_dict({"model": "toy", "objective": "pcpo", "step_weighting": "uniform_high_noise"})
