"""Reference conventions (docs/credit.md): each option against the formula written from its definition,
and every shipped train config stating the conventions it depends on."""

from __future__ import annotations

import math
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.credit.flow import KL_FORMS
from pcpo_eval.errors import UserError
from pcpo_eval.samplers.flow import flow_kl_to_reference, model_time_of
from pcpo_eval.train.advantages import ADV_STDS, batch_std_advantages, group_advantages
from pcpo_eval.train.config import config_from_dict, convention_keys, load_config, read_config_file

CONFIGS = sorted((Path(__file__).parents[2] / "train" / "configs").glob("*.yaml"))


@pytest.mark.parametrize("path", CONFIGS, ids=[p.name for p in CONFIGS])
def test_every_shipped_config_states_its_conventions(path):
    cfg, raw = load_config(path), read_config_file(path)
    missing = [k for k in convention_keys(cfg) if k not in raw]
    assert not missing, f"{path.name} must state {', '.join(missing)}"


def test_convention_keys_follow_the_model_and_the_advantage():
    assert convention_keys(config_from_dict({"model": "toy"})) == ("credit_convention", "credit_fallback")
    flow = convention_keys(config_from_dict({"model": "toyflow", "sde": "flowgrpo", "advantage": "group"}))
    assert set(flow) == {"sde", "kl_form", "cfg_detach_uncond", "drop_zero_advantage", "model_time_quantize",
                         "flow_t1", "ema_decay", "adv_std"}


def test_flowgrpo_setups_use_flowgrpo_code_conventions():
    for name in ("setup8_flowgrpo_sd35_ocr.yaml", "setup9_flowgrpo_sd35_pickscore.yaml"):
        cfg = load_config(Path(__file__).parents[2] / "train" / "configs" / name)
        assert (cfg.kl_form, cfg.adv_std, cfg.cfg_detach_uncond, cfg.drop_zero_advantage) == (
            "flowgrpo_code", "batch", True, True)
        assert (cfg.ema_decay, cfg.ema_every) == (0.9, 8)  # Flow-GRPO train.ema: EMAModuleWrapper(0.9, 8)
    for name in ("setup6_dancegrpo_flux.yaml", "setup10_dancegrpo_flux_naive_acc.yaml"):
        assert load_config(Path(__file__).parents[2] / "train" / "configs" / name).model_time_quantize


# ---- KL forms ---------------------------------------------------------------------------------


def _flowgrpo_mean(x, v, t, dt_neg, sigma):
    """Flow-GRPO's SDE mean written from its definition (dt < 0):
    x (1 + sigma^2 dt / (2 t)) + v (1 + sigma^2 (1 - t) / (2 t)) dt."""
    return x * (1 + sigma**2 * dt_neg / (2 * t)) + v * (1 + sigma**2 * (1 - t) / (2 * t)) * dt_neg


@pytest.mark.parametrize("t,dt,sigma", [(0.9, 0.1, 0.7 * math.sqrt(0.9 / 0.1)), (0.4, 0.05, 0.3), (0.2, 0.2, 0.35)])
def test_kl_forms_match_their_definitions(t, dt, sigma):
    g = torch.Generator().manual_seed(0)
    x, u = torch.randn(3, 4, 5, 5, generator=g, dtype=torch.float64), torch.randn(3, 4, 5, 5, generator=g, dtype=torch.float64)
    u_ref = u + 0.1 * torch.randn(u.shape, generator=g, dtype=torch.float64)
    mu, mu_ref = _flowgrpo_mean(x, u, t, -dt, sigma), _flowgrpo_mean(x, u_ref, t, -dt, sigma)
    sq = ((mu - mu_ref) ** 2).mean((1, 2, 3))
    paper = sq / (2 * (sigma * math.sqrt(dt)) ** 2)  # Gaussian KL of N(mu, std^2) vs N(mu_ref, std^2)
    code = sq / (2 * sigma**2)  # scripts/train_sd3.py: / (2 * std_dev_t ** 2), std_dev_t = sigma_t
    np.testing.assert_allclose(flow_kl_to_reference(u, u_ref, t, dt, sigma).numpy(), paper.numpy(), rtol=1e-10)
    np.testing.assert_allclose(flow_kl_to_reference(u, u_ref, t, dt, sigma, form="flowgrpo_code").numpy(),
                               code.numpy(), rtol=1e-10)
    with pytest.raises(UserError, match="paper, flowgrpo_code"):
        flow_kl_to_reference(u, u_ref, t, dt, sigma, form="exact")


def test_kl_form_is_a_validated_train_option():
    assert set(KL_FORMS) == {"paper", "flowgrpo_code"}
    assert config_from_dict({"kl_form": "flowgrpo_code"}).kl_form == "flowgrpo_code"
    with pytest.raises(UserError, match="kl_form"):
        config_from_dict({"kl_form": "code"})


# ---- advantages -------------------------------------------------------------------------------


def test_batch_std_advantages_match_flowgrpo_global_std_definition():
    prompts = ["a", "a", "b", "b", "a", "a", "c", "c"]  # 'a' drawn in two groups: pooled by prompt string
    r = np.array([1.0, 2.0, 0.5, 0.5, 4.0, 3.0, -1.0, 2.0])
    std_all = math.sqrt(sum((x - r.mean()) ** 2 for x in r) / len(r)) + 1e-4  # population std + 1e-4
    mean = {"a": (1 + 2 + 4 + 3) / 4, "b": 0.5, "c": 0.5}
    ref = np.array([(x - mean[p]) / std_all for p, x in zip(prompts, r, strict=True)])
    np.testing.assert_allclose(batch_std_advantages(prompts, r), ref, rtol=1e-12)
    assert np.all(batch_std_advantages(prompts, r)[2:4] == 0)  # equal rewards -> exactly 0 (dropped by Flow-GRPO)
    # DanceGRPO's group form: per group (by index), unbiased std + 1e-8
    groups = np.repeat(np.arange(4), 2)
    g_ref = np.array([(x - r[groups == k].mean()) / (r[groups == k].std(ddof=1) + 1e-8)
                      for k, x in zip(groups, r, strict=True)])
    np.testing.assert_allclose(group_advantages(groups, r), g_ref, rtol=1e-12)
    assert set(ADV_STDS) == {"group", "batch"}


def test_adv_std_batch_needs_group_advantages():
    with pytest.raises(UserError, match="adv_std=batch needs advantage=group"):
        config_from_dict({"adv_std": "batch"})
    with pytest.raises(UserError, match="adv_std"):
        config_from_dict({"advantage": "group", "adv_std": "global"})


# ---- DanceGRPO's model time -------------------------------------------------------------------


def test_model_time_quantize_is_int_1000t_over_1000():
    t = torch.tensor([1.0, 0.9999, 0.75, 0.5, 0.333333, 0.0421, 0.0005, 0.0], dtype=torch.float64)
    ref = [math.floor(float(np.float32(v) * np.float32(1000))) / 1000 for v in t.tolist()]
    np.testing.assert_allclose(model_time_of(t, True).double().numpy(), ref, rtol=0, atol=1e-7)
    assert model_time_of(t, True).dtype == torch.float32
    assert torch.equal(model_time_of(t, False), t.float())
