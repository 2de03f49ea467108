"""Flow SDE sampler: log-probs vs direct Gaussian densities, reference step formulas, grids, KL."""

from __future__ import annotations

import math

import numpy as np
import pytest
import torch

from pcpo_eval.credit.flow import flow_credit, flow_native_weight, shifted_sigmas
from pcpo_eval.errors import UserError
from pcpo_eval.samplers.base import gaussian_kl_same_std
from pcpo_eval.samplers.flow import (
    flow_kl_to_reference,
    flow_log_prob,
    flow_sde_mean,
    pcpo_flow_scale,
    sample_flow,
    scheduler_time_grid,
    step_sigmas,
)
from pcpo_eval.train.objectives import eps_matching_log_rho
from tests.support.flow import LinearVelocityAdapter

PROMPTS = ["a red circle", "blue square", "green star"]


def _gens(seeds):
    return [torch.Generator().manual_seed(s) for s in seeds]


def _direct_logp(x_next, mean, std):
    """Gaussian log-density averaged over dims, float64 (independent of gaussian_log_prob)."""
    x_next, mean = x_next.double(), mean.double()
    return (-((x_next - mean) ** 2) / (2 * std**2) - math.log(std) - 0.5 * math.log(2 * math.pi)).mean((1, 2, 3))


def _dancegrpo_step(x, u, sigma, sigma_next, eta):
    """DanceGRPO ``flux_step`` mean (sde_solver=True), written in its own variables (dsigma < 0)."""
    dsigma = sigma_next - sigma
    mean = x + dsigma * u
    x0 = x - sigma * u
    score = -(x - x0 * (1 - sigma)) / sigma**2
    mean = mean + (-0.5 * eta**2 * score) * dsigma
    return mean, eta * math.sqrt(sigma - sigma_next)


def _flowgrpo_step(x, u, sigma, sigma_next, sigma_max, eta):
    """Flow-GRPO ``sde_step_with_logprob`` mean and std (dt < 0, t=1 -> sigma_max)."""
    dt = sigma_next - sigma
    denom = sigma_max if sigma == 1 else sigma
    std_t = math.sqrt(sigma / (1 - denom)) * eta
    mean = x * (1 + std_t**2 / (2 * sigma) * dt) + u * (1 + std_t**2 * (1 - sigma) / (2 * sigma)) * dt
    return mean, std_t * math.sqrt(-dt)


@pytest.mark.parametrize("sde,eta", [("dance", 0.3), ("flowgrpo", 0.7)])
def test_recorded_logprob_matches_reference_step_and_gaussian_density(sde, eta):
    ad = LinearVelocityAdapter()
    cond = ad.encode_prompts(PROMPTS)
    unc = ad.encode_prompts([""] * 3)
    s = sample_flow(ad, cond, unc, cfg=2.0, steps=6, eta=eta, generators=_gens([1, 2, 3]), sde=sde,
                    grid="shifted", shift=3.0, record=True)
    grid = shifted_sigmas(6, 3.0)
    np.testing.assert_allclose(s.times.numpy(), grid)
    for i in range(6):
        x, u, xn = s.trajectory[:, i].double(), s.model_outputs[:, i].double(), s.trajectory[:, i + 1].double()
        if sde == "dance":
            mean, std = _dancegrpo_step(x, u, grid[i], grid[i + 1], eta)
        else:
            mean, std = _flowgrpo_step(x, u, grid[i], grid[i + 1], grid[1], eta)
        np.testing.assert_allclose(float(s.std[i]), std, rtol=1e-12)
        # x_{i+1} = reference mean + std * recorded unit noise
        np.testing.assert_allclose(xn.numpy(), (mean + std * s.noise[:, i].double()).numpy(), atol=1e-5)
        np.testing.assert_allclose(s.log_probs[:, i].double().numpy(), _direct_logp(xn, mean, std).numpy(),
                                   rtol=1e-4, atol=1e-4)
        # re-evaluating the step density from the trajectory gives the stored log-prob
        lp = flow_log_prob(x.float(), u.float(), xn.float(), float(s.t[i]), float(s.dt[i]), float(s.sigmas[i]))
        np.testing.assert_allclose(lp.numpy(), s.log_probs[:, i].numpy(), atol=1e-4)


@pytest.mark.parametrize("sde,eta,decoded", [("dance", 0.3, "x0"), ("flowgrpo", 0.7, "sample"), ("dance", 0.0, "sample")])
def test_the_image_is_the_references_final_latent(sde, eta, decoded):
    """DanceGRPO (``run_sample_step``: ``latents = pred_original``) decodes the last step's prediction of x_0,
    x_{N-1} - t_{N-1} u_{N-1}; Flow-GRPO and the ODE decode the last sample (on the ODE they coincide). Before,
    DanceGRPO's images were the last SDE sample, with that step's noise in them."""
    from pcpo_eval.samplers.flow import FINAL_LATENT

    ad = LinearVelocityAdapter()
    s = sample_flow(ad, ad.encode_prompts(PROMPTS), ad.encode_prompts([""] * 3), cfg=2.0, steps=6, eta=eta,
                    generators=_gens([1, 2, 3]), sde=sde, grid="shifted", shift=3.0, record=True)
    x0_hat = s.trajectory[:, -2].double() - float(s.t[-1]) * s.model_outputs[:, -1].double()
    want = x0_hat if decoded == "x0" else s.trajectory[:, -1].double()
    np.testing.assert_allclose(s.latents.double().numpy(), want.numpy(), atol=1e-6)
    assert FINAL_LATENT[s.sde] == ("x0_prediction" if decoded == "x0" else "sample")
    if decoded == "x0":  # the two differ (the last step's noise), and the chain the update trains on stays the SDE's
        assert not torch.allclose(s.trajectory[:, -1].double(), x0_hat, atol=1e-3)


def test_flowgrpo_sigma_at_t1_uses_next_time():
    grid = shifted_sigmas(10, 3.0)
    sig = step_sigmas(grid, "flowgrpo", 0.7)
    assert math.isfinite(sig[0])
    np.testing.assert_allclose(sig[0], 0.7 * math.sqrt(1.0 / (1.0 - grid[1])))
    np.testing.assert_allclose(sig[1:], 0.7 * np.sqrt(grid[1:-1] / (1 - grid[1:-1])))


def test_per_sample_generators_make_images_batch_independent():
    ad = LinearVelocityAdapter()
    full = sample_flow(ad, ad.encode_prompts(PROMPTS), None, cfg=1.0, steps=5, eta=0.5,
                       generators=_gens([7, 8, 9]), sde="dance")
    one = sample_flow(ad, ad.encode_prompts(PROMPTS[1:2]), None, cfg=1.0, steps=5, eta=0.5,
                      generators=_gens([8]), sde="dance")
    torch.testing.assert_close(full.latents[1:2], one.latents)
    # initial noise is the generator's first draw (same contract as sample_ddim)
    rec = sample_flow(ad, ad.encode_prompts(PROMPTS[:1]), None, cfg=1.0, steps=2, eta=0.5,
                      generators=_gens([7]), record=True)
    torch.testing.assert_close(rec.trajectory[0, 0], torch.randn(ad.latent_shape, generator=_gens([7])[0]))


def test_ode_is_deterministic_euler_on_the_scheduler_grid():
    ad = LinearVelocityAdapter()
    cond = ad.encode_prompts(PROMPTS)
    s = sample_flow(ad, cond, None, cfg=1.0, steps=4, eta=0.0, generators=_gens([1, 2, 3]), record=True)
    assert s.sde == "ode" and torch.all(s.log_probs == 0)
    from diffusers import FlowMatchEulerDiscreteScheduler

    sched = FlowMatchEulerDiscreteScheduler(shift=3.0)
    sched.set_timesteps(4)
    np.testing.assert_allclose(s.times.numpy(), sched.sigmas.double().numpy(), rtol=1e-7)
    x = s.trajectory[:, 0]
    for i, ts in enumerate(sched.timesteps):
        u = ad.predict(x, torch.full((3,), float(s.t[i])), cond)
        x = sched.step(u, ts, x).prev_sample
    torch.testing.assert_close(x, s.latents, atol=1e-5, rtol=1e-5)
    # the ODE ignores the step noise: same images whatever the generator state after x_1
    s2 = sample_flow(ad, cond, None, cfg=1.0, steps=4, eta=0.0, generators=_gens([1, 2, 3]), sde="ode")
    torch.testing.assert_close(s2.latents, s.latents)


@pytest.mark.parametrize("sde,eta", [("dance", 0.3), ("flowgrpo", 0.7)])
def test_decomposition_equals_logprob_difference(sde, eta):
    """Eq. logrho-flow: log rho from the weights equals the difference of Gaussian log-densities."""
    g = torch.Generator().manual_seed(0)
    grid = shifted_sigmas(8, 3.0)
    sig = step_sigmas(grid, sde, eta)
    for i in range(8):
        t, dt = grid[i], grid[i] - grid[i + 1]
        x = torch.randn(4, 3, 8, 8, generator=g, dtype=torch.float64)
        u_old = torch.randn(x.shape, generator=g, dtype=torch.float64)
        u_new = u_old + 0.05 * torch.randn(x.shape, generator=g, dtype=torch.float64)
        eps = torch.randn(x.shape, generator=g, dtype=torch.float64)
        x_next = flow_sde_mean(x, u_old, t, dt, sig[i]) + sig[i] * math.sqrt(dt) * eps
        diff = flow_log_prob(x, u_new, x_next, t, dt, sig[i]) - flow_log_prob(x, u_old, x_next, t, dt, sig[i])
        w = flow_native_weight(np.array(t), np.array(dt), np.array(sig[i]))
        dec = eps_matching_log_rho(u_new, u_old, eps, float(w))
        np.testing.assert_allclose(dec.numpy(), diff.numpy(), rtol=1e-9, atol=1e-10)


@pytest.mark.parametrize("sde,eta,steps", [("dance", 0.3, 16), ("flowgrpo", 0.7, 10)])
def test_proportional_weights_sum_to_zeta_and_scale_gives_zeta_dt(sde, eta, steps):
    times = shifted_sigmas(steps, 3.0)
    t, dt = times[:-1], times[:-1] - times[1:]
    sig = step_sigmas(times, sde, eta)
    w, scale, zeta = pcpo_flow_scale(t, dt, sig, sde, eta, times)
    np.testing.assert_allclose(w * scale, zeta * dt, rtol=1e-12)
    np.testing.assert_allclose(np.sum(zeta * dt), zeta, rtol=1e-12)  # sum dt = 1
    ref = {"dance": 13.343, "flowgrpo": 4.315}[sde]  # paper Sec. 2 numbers
    assert abs(zeta - ref) < 5e-4
    np.testing.assert_allclose(zeta, flow_credit(sde, steps, eta, 3.0).zeta)


def test_kl_term_matches_paper_appendix_and_gaussian_means():
    g = torch.Generator().manual_seed(1)
    grid = shifted_sigmas(10, 3.0)
    sig = step_sigmas(grid, "flowgrpo", 0.7)
    for i in range(10):
        t, dt, s = grid[i], grid[i] - grid[i + 1], sig[i]
        x = torch.randn(2, 3, 4, 4, generator=g, dtype=torch.float64)
        u = torch.randn(x.shape, generator=g, dtype=torch.float64)
        u_ref = u + 0.1 * torch.randn(x.shape, generator=g, dtype=torch.float64)
        kl = flow_kl_to_reference(u, u_ref, t, dt, s)
        paper = dt / 2 * (s * (1 - t) / (2 * t) + 1 / s) ** 2 * ((u - u_ref) ** 2).mean((1, 2, 3))
        np.testing.assert_allclose(kl.numpy(), paper.numpy(), rtol=1e-10)
        means = gaussian_kl_same_std(flow_sde_mean(x, u, t, dt, s), flow_sde_mean(x, u_ref, t, dt, s), s * math.sqrt(dt))
        np.testing.assert_allclose(kl.numpy(), means.numpy(), rtol=1e-9)


def test_scheduler_grids_sd3_static_and_flux_dynamic():
    from diffusers import FlowMatchEulerDiscreteScheduler

    sd3 = scheduler_time_grid({"shift": 3.0}, 10)
    ref = FlowMatchEulerDiscreteScheduler(shift=3.0)
    ref.set_timesteps(10)
    np.testing.assert_allclose(sd3, ref.sigmas.double().numpy())
    assert sd3[0] == 1.0 and sd3[-1] == 0.0 and len(sd3) == 11
    # PCPO's zeta on the grid setups 8-9 sample (docs/reproduce.md): 5.727, not the shift-3 linspace grid's 4.315
    from pcpo_eval.credit.flow import flow_credit

    assert flow_credit("flowgrpo", 10, 0.7, times=sd3, t1="neighbor").zeta == pytest.approx(5.7268, abs=1e-4)
    assert flow_credit("flowgrpo", 10, 0.7, shift=3.0, t1="neighbor").zeta == pytest.approx(4.3152, abs=1e-4)
    flux_cfg = {"shift": 3.0, "use_dynamic_shifting": True, "base_shift": 0.5, "max_shift": 1.15,
                "base_image_seq_len": 256, "max_image_seq_len": 4096}
    fl = scheduler_time_grid(flux_cfg, 12, image_seq_len=4096)
    mu = 1.15
    u = np.linspace(1.0, 1.0 / 12, 12)
    np.testing.assert_allclose(fl[:-1], math.exp(mu) / (math.exp(mu) + (1 / u - 1)), rtol=1e-6)


def test_bad_inputs_name_the_choices():
    ad = LinearVelocityAdapter()
    c = ad.encode_prompts(PROMPTS[:1])
    with pytest.raises(UserError, match="dance, flowgrpo, ode"):
        sample_flow(ad, c, None, cfg=1.0, steps=2, eta=0.3, generators=_gens([0]), sde="sdeX")
    with pytest.raises(UserError, match="shifted, scheduler"):
        sample_flow(ad, c, None, cfg=1.0, steps=2, eta=0.3, generators=_gens([0]), grid="nope")
