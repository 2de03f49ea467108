"""The sampler contract (samplers/base.py): both samplers satisfy it, the catalogue resolves them,
and the per-step quantities the trainer asks for agree with what sampling recorded."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.credit.ddim import SD1_DDIM_CONFIG, ddim_C, ddim_sigma, ddim_weight
from pcpo_eval.errors import UserError
from pcpo_eval.samplers import PREDICTION_SAMPLER, SAMPLERS, SCHEDULES, resolve_sampler
from pcpo_eval.samplers.base import Sampler, Trajectory, gaussian_kl_same_std
from pcpo_eval.samplers.ddim import DDIMSample, DDIMSampler, ddim_mean, sample_ddim
from pcpo_eval.samplers.flow import FlowSample, FlowSampler, flow_sde_mean, sample_flow
from pcpo_eval.train.objectives import eps_matching_log_rho
from tests.support.flow import LinearVelocityAdapter

PROMPTS = ["a red circle", "blue square", "green star"]
STEPS = 5


class LinearEpsAdapter(LinearVelocityAdapter):
    """The same tiny network as an eps-prediction model on SD-1.x's DDIM schedule (t scaled to [0, 1])."""

    name = "linear_eps"
    prediction = "eps"

    def __init__(self) -> None:
        super().__init__()
        self.scheduler_config = dict(SD1_DDIM_CONFIG)

    def denoise(self, x_t, t, cond):
        return self.denoiser(x_t, t.float() / 1000, cond.pooled)


def _gens(n: int, seed: int = 0) -> list[torch.Generator]:
    return [torch.Generator().manual_seed(seed + i) for i in range(n)]


def _record(sampler: Sampler, adapter, schedule: str, eta: float) -> Trajectory:
    cond, uncond = adapter.encode_prompts(PROMPTS), adapter.encode_prompts([""] * len(PROMPTS))
    return sampler.sample(adapter, cond, uncond, cfg=2.0, steps=STEPS, eta=eta, generators=_gens(len(PROMPTS)),
                          schedule=schedule, record=True)


CASES = [  # (sampler, adapter factory, schedule, eta, trajectory type)
    (DDIMSampler(), LinearEpsAdapter, "ddim", 1.0, DDIMSample),
    (DDIMSampler(convention="unit"), LinearEpsAdapter, "pcpo", 1.0, DDIMSample),
    (FlowSampler(grid="shifted"), LinearVelocityAdapter, "dance", 0.3, FlowSample),
    (FlowSampler(), LinearVelocityAdapter, "flowgrpo", 0.7, FlowSample),
]
IDS = ["ddim", "ddim-pcpo", "flow-dance", "flow-flowgrpo"]


# ---- the protocol and the catalogue -------------------------------------------------------------


def test_catalogue_holds_protocol_samplers_with_their_schedules():
    assert set(SAMPLERS) == {"ddim", "flow"}
    for name, s in SAMPLERS.items():
        assert isinstance(s, Sampler) and s.name == name
    assert isinstance(SAMPLERS["ddim"], DDIMSampler) and isinstance(SAMPLERS["flow"], FlowSampler)
    assert SCHEDULES == {"ddim": ("ddim", "pcpo"), "flow": ("ode", "dance", "flowgrpo")}  # first = default
    assert PREDICTION_SAMPLER == {"eps": "ddim", "velocity": "flow"}
    assert not isinstance(object(), Sampler)


def test_resolve_sampler_auto_and_mismatch():
    assert resolve_sampler("auto", "eps") == "ddim" and resolve_sampler("auto", "velocity") == "flow"
    assert resolve_sampler("ddim", "eps") == "ddim" and resolve_sampler("flow", "velocity") == "flow"
    cases = [(("flow", "eps"), "sampler 'flow' does not fit a eps-prediction model; use --sampler auto"),
             (("ddim", "velocity"), "sampler 'ddim' does not fit a velocity-prediction model; use --sampler auto"),
             (("euler", "eps"), "unknown sampler 'euler'; choose one of: auto, ddim, flow"),
             (("auto", "x0"), "no sampler fits a 'x0'-prediction model; samplers fit: eps, velocity")]
    for args, message in cases:
        with pytest.raises(UserError) as info:
            resolve_sampler(*args)
        assert str(info.value) == message and "\n" not in str(info.value)


def test_flow_sampler_rejects_unknown_t1():
    with pytest.raises(UserError, match="t1 convention 'edge'.*neighbor, sigma_max"):
        FlowSampler(t1="edge")


def test_calling_a_catalogue_sampler_returns_the_algorithms_latents():
    """The generator's call ``SAMPLERS[name](...)`` is the sampling function's latents (default options)."""
    for name, adapter, direct in [
        ("ddim", LinearEpsAdapter(), lambda a, c, u: sample_ddim(a, c, u, cfg=2.0, steps=3, eta=1.0,
                                                                 generators=_gens(3), sigma_schedule="pcpo")),
        ("flow", LinearVelocityAdapter(), lambda a, c, u: sample_flow(a, c, u, cfg=2.0, steps=3, eta=0.3,
                                                                      generators=_gens(3), sde="dance")),
    ]:
        cond, uncond = adapter.encode_prompts(PROMPTS), adapter.encode_prompts([""] * 3)
        schedule = SCHEDULES[name][1]
        got = SAMPLERS[name](adapter, cond, uncond, cfg=2.0, steps=3, eta=0.3 if name == "flow" else 1.0,
                             generators=_gens(3), schedule=schedule)
        assert torch.equal(got, direct(adapter, cond, uncond).latents), name


def test_sample_rejects_a_model_of_the_other_prediction():
    with pytest.raises(UserError, match="use the flow sampler"):
        _record(DDIMSampler(), LinearVelocityAdapter(), "ddim", 1.0)
    with pytest.raises(UserError, match="use the DDIM sampler"):
        _record(FlowSampler(), LinearEpsAdapter(), "dance", 0.3)


# ---- per-step quantities ------------------------------------------------------------------------


@pytest.mark.parametrize("sampler,make,schedule,eta,kind", CASES, ids=IDS)
def test_step_log_prob_of_a_stored_step_equals_the_stored_log_prob(sampler, make, schedule, eta, kind):
    adapter = make()
    tr = _record(sampler, adapter, schedule, eta)
    assert isinstance(tr, kind) and tr.log_probs.shape == (3, STEPS) and tr.trajectory.shape[1] == STEPS + 1
    cond, uncond = adapter.encode_prompts(PROMPTS), adapter.encode_prompts([""] * 3)
    for step in range(STEPS):
        j = torch.full((3,), step)
        x, x_next = tr.trajectory[:, step], tr.trajectory[:, step + 1]
        with torch.no_grad():
            out = adapter.predict(x, sampler.model_time(tr, j), cond, uncond, 2.0)
        torch.testing.assert_close(out, tr.model_outputs[:, step], rtol=0, atol=0)  # the time the sampler used
        logp = sampler.step_log_prob(tr, j, x, x_next, out)
        np.testing.assert_allclose(logp.numpy(), tr.log_probs[:, step].numpy(), rtol=1e-6, atol=1e-6)
        assert torch.equal(sampler.kl_to_reference(tr, j, x, out, out), torch.zeros(3))


@pytest.mark.parametrize("sampler,make,schedule,eta,kind", CASES, ids=IDS)
def test_native_weight_decomposition_equals_log_prob_difference(sampler, make, schedule, eta, kind):
    """log rho = -[w d . eps + 1/2 ||w d||^2] with the sampler's native weight (Prop. 1; Eq. logrho-flow)."""
    tr = _record(sampler, make(), schedule, eta)
    g = torch.Generator().manual_seed(7)
    for step in range(STEPS):
        j = torch.full((3,), step)
        x, x_next = tr.trajectory[:, step].double(), tr.trajectory[:, step + 1].double()
        old = tr.model_outputs[:, step].double()
        new = old + 0.05 * torch.randn(old.shape, generator=g, dtype=torch.float64)
        exact = sampler.step_log_prob(tr, j, x, x_next, new) - sampler.step_log_prob(tr, j, x, x_next, old)
        dec = eps_matching_log_rho(new, old, tr.noise[:, step].double(), sampler.native_weight(tr, j).double())
        np.testing.assert_allclose(dec.numpy(), exact.numpy(), rtol=1e-3, atol=1e-6)


@pytest.mark.parametrize("sampler,make,schedule,eta,kind", CASES, ids=IDS)
def test_kl_is_the_gaussian_kl_of_the_step_means(sampler, make, schedule, eta, kind):
    tr = _record(sampler, make(), schedule, eta)
    g = torch.Generator().manual_seed(3)
    step = 2
    j, x = torch.full((3,), step), tr.trajectory[:, step].double()
    u = tr.model_outputs[:, step].double()
    u_ref = u + 0.1 * torch.randn(u.shape, generator=g, dtype=torch.float64)
    kl = sampler.kl_to_reference(tr, j, x, u, u_ref)
    if kind is DDIMSample:
        ab, abp, s = (float(v[step]) for v in (tr.alpha_bar, tr.alpha_bar_prev, tr.sigmas))
        ref = gaussian_kl_same_std(ddim_mean(x, u, ab, abp, s), ddim_mean(x, u_ref, ab, abp, s), s)
    else:
        t, dt, s = (float(v[step]) for v in (tr.t, tr.dt, tr.sigmas))
        ref = gaussian_kl_same_std(flow_sde_mean(x, u, t, dt, s), flow_sde_mean(x, u_ref, t, dt, s), s * dt**0.5)
    assert kl.min().item() > 0
    np.testing.assert_allclose(kl.numpy(), ref.numpy(), rtol=1e-5)


@pytest.mark.parametrize("sampler,make,schedule,eta,kind", CASES, ids=IDS)
def test_credit_scale_is_identity_except_flow_pcpo(sampler, make, schedule, eta, kind):
    tr = _record(sampler, make(), schedule, eta)
    j = torch.arange(STEPS)
    for objective in ("ppo_clip", "log_hinge", "eps_matching"):
        assert torch.equal(sampler.credit_scale(tr, j, objective), torch.ones(STEPS))
    scale = sampler.credit_scale(tr, j, "pcpo")
    if kind is DDIMSample and schedule == "ddim":
        assert torch.equal(scale, torch.ones(STEPS))
    elif kind is DDIMSample:  # PCPO acts through sigma~ (scale 1); 'cap' scales the steps sigma~ cannot reach
        C = ddim_C(tr.alpha_bar.numpy(), tr.alpha_bar_prev.numpy(), tr.sigmas.numpy())
        w = C / tr.sigmas.numpy()  # the sampler's 'unit' convention
        w_star = np.mean(ddim_weight(ddim_C(tr.alpha_bar.numpy(), tr.alpha_bar_prev.numpy(), ddim_sigma(
            tr.alpha_bar.numpy(), tr.alpha_bar_prev.numpy(), 1.0)), ddim_sigma(tr.alpha_bar.numpy(),
            tr.alpha_bar_prev.numpy(), 1.0), "unit"))
        np.testing.assert_allclose(scale.double().numpy() * w, w_star, rtol=1e-5)
        assert (scale < 1).any() and (scale[scale < 1] > 0).all()  # 5 SD-1.x steps: a step w* cannot reach
    else:  # w~ = scale * w = zeta dt_i, summing to zeta = sum_i w(t_i) (Prop. 2)
        w_tilde = (scale * sampler.native_weight(tr, j)).double().numpy()
        np.testing.assert_allclose(w_tilde / tr.dt.numpy(), w_tilde.sum(), rtol=1e-5)
        assert not torch.equal(scale, torch.ones(STEPS))


def test_trajectory_cat_joins_samples_and_keeps_the_schedule():
    sampler, adapter = DDIMSampler(), LinearEpsAdapter()
    a, b = _record(sampler, adapter, "ddim", 1.0), _record(sampler, adapter, "ddim", 1.0)
    both = Trajectory.cat([a, b], dtype=torch.float64)
    assert isinstance(both, DDIMSample) and both.trajectory.shape[0] == 6 and both.log_probs.dtype == torch.float64
    assert torch.equal(both.noise[3:].float(), b.noise) and torch.equal(both.alpha_bar, a.alpha_bar)
    plain = Trajectory.cat([sampler.sample(adapter, adapter.encode_prompts(PROMPTS), None, cfg=1.0, steps=2,
                                           eta=1.0, generators=_gens(3))] * 2)
    assert plain.latents.shape[0] == 6 and plain.trajectory is None and plain.log_probs is None
