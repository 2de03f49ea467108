"""Credit math: the paper's numbers (Sec. 2, Fig. 2) and the exactness of the decompositions."""

from __future__ import annotations

import json
import subprocess
import sys
from pathlib import Path

import numpy as np
import pytest
import torch
from hypothesis import given, settings
from hypothesis import strategies as st

from pcpo_eval.credit.ddim import (
    CONVENTIONS,
    DEFAULT_FALLBACK,
    FALLBACKS,
    SD1_DDIM_CONFIG,
    DDIMSchedulerConfig,
    ddim_C,
    ddim_schedule,
    ddim_sigma,
    ddim_weight,
    least_weight_sigma,
    pcpo_ddim_credit,
    pcpo_sigma_roots,
    read_scheduler_config,
)
from pcpo_eval.credit.flow import flow_credit, flow_native_weight, shifted_sigmas
from pcpo_eval.errors import UserError
from pcpo_eval.samplers.ddim import ddim_mean
from pcpo_eval.samplers.flow import flow_sde_mean

#: these tests read the SVG / PDF files too (the suite writes PNG only: tests/conftest.py)
pytestmark = pytest.mark.usefixtures("all_figure_formats")


def test_dancegrpo_zeta_matches_paper():
    c = flow_credit("dance", steps=16, eta=0.3, shift=3.0)
    assert c.zeta == pytest.approx(13.343, abs=1e-3)
    assert len(c.t) == 16 and c.t[0] == 1.0
    np.testing.assert_allclose(np.sum(c.pcpo_weight), c.zeta, rtol=1e-12)  # dt sums to 1
    np.testing.assert_allclose(c.pcpo_weight / c.dt, c.zeta)


def test_flowgrpo_zeta_within_half_percent_of_paper():
    c = flow_credit("flowgrpo", steps=10, eta=0.7, shift=3.0)
    assert abs(c.zeta - 4.315) / 4.315 < 5e-3
    assert c.zeta == pytest.approx(4.315, abs=1e-3)  # 'neighbor' t=1 convention reproduces it exactly
    alt = flow_credit("flowgrpo", steps=10, eta=0.7, shift=3.0, t1="sigma_max")
    assert abs(alt.zeta - 4.315) / 4.315 < 5e-3
    assert np.isfinite(c.sigma).all() and np.isfinite(alt.native_weight).all()
    assert c.to_dict()["t1_convention"] == "neighbor"


def test_ddim_sd1_mean_native_weight_and_constant_pcpo_weights():
    sched = ddim_schedule(SD1_DDIM_CONFIG, 50, 1.0)
    assert sched.timesteps[0] == 981 and sched.timesteps[-1] == 1  # leading spacing, offset 1
    c = pcpo_ddim_credit(sched)  # residual convention, w* = mean native weight
    assert c.mean_native_weight == pytest.approx(4.456, abs=0.01)
    assert c.native_weight.min() == pytest.approx(1.1, abs=0.05)
    assert c.native_weight.max() == pytest.approx(83, abs=1.0)
    ok = np.setdiff1d(np.arange(50), c.fallback_steps)
    assert len(c.fallback_steps) > 0 and max(c.fallback_steps) == 49  # last steps have no root
    np.testing.assert_allclose(c.pcpo_weight[ok], c.w_target, rtol=1e-9)
    unit = pcpo_ddim_credit(sched, "unit")
    assert unit.mean_native_weight == pytest.approx(0.52, abs=0.01)
    assert unit.native_weight.min() == pytest.approx(0.37, abs=0.01)
    assert unit.native_weight.max() == pytest.approx(3.3, abs=0.05)
    ok = np.setdiff1d(np.arange(50), unit.fallback_steps)
    np.testing.assert_allclose(unit.pcpo_weight[ok], unit.w_target, rtol=1e-9)


def test_fallback_native_keeps_ddim_sigma():
    sched = ddim_schedule(SD1_DDIM_CONFIG, 50, 1.0)
    c = pcpo_ddim_credit(sched, fallback="native")
    np.testing.assert_array_equal(c.pcpo_sigma[c.fallback_steps], c.sigma[c.fallback_steps])


TOY_DDIM_CONFIG = json.loads((Path(__file__).parents[2] / "pcpo_eval/toy/weights/scheduler_config.json").read_text())
SCHEDULES = {"sd1": SD1_DDIM_CONFIG, "toy": TOY_DDIM_CONFIG}


def _weight(ab: float, abp: float, sigma: np.ndarray, convention: str) -> np.ndarray:
    """w(sigma) from its definition: C(sigma) = sqrt(1-ab)/sqrt(ab/abp) - sqrt(1-abp-sigma^2); C/sigma or C/sigma^2."""
    C = np.sqrt(1 - ab) / np.sqrt(ab / abp) - np.sqrt(np.maximum(1 - abp - sigma**2, 0))
    return C / sigma if convention == "unit" else C / sigma**2


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_least_weight_sigma_is_the_minimum_and_unit_gives_ddpm_sigma(name, convention):
    sched = ddim_schedule(SCHEDULES[name], 20, 1.0)
    star = least_weight_sigma(sched.alpha_bar, sched.alpha_bar_prev, convention)
    for i in range(20):
        ab, abp = sched.alpha_bar[i], sched.alpha_bar_prev[i]
        grid = np.sqrt(1 - abp) * np.linspace(1e-4, 1.0, 200001)
        w = _weight(ab, abp, grid, convention)
        assert _weight(ab, abp, np.array(star[i]), convention) <= w.min() * (1 + 1e-9)
        assert abs(star[i] - grid[np.argmin(w)]) <= 2e-4 * np.sqrt(1 - abp)
    if convention == "unit":  # w = C/sigma is least at DDIM's eta = 1 sigma, with w_min^2 = SNR_{t-1}/SNR_t - 1
        np.testing.assert_allclose(star, ddim_sigma(sched.alpha_bar, sched.alpha_bar_prev, 1.0), rtol=1e-9)
        snr = lambda a: a / (1 - a)  # noqa: E731
        w_min = _weight(sched.alpha_bar, sched.alpha_bar_prev, star, "unit")
        np.testing.assert_allclose(w_min**2, snr(sched.alpha_bar_prev) / snr(sched.alpha_bar) - 1, rtol=1e-9)


#: largest allowed change of sigma~/sigma between consecutive steps (measured max: 0.545 at 20 steps,
#: 0.345 at 50, both where a fallback step begins); the nearest-root rule jumped 1.11 at toy 20 unit
RATIO_JUMP_TOL = {20: 0.6, 50: 0.4}


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("steps", [20, 50])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_sigma_tilde_follows_one_root_branch_continuously(name, steps, convention):
    c = pcpo_ddim_credit(ddim_schedule(SCHEDULES[name], steps, 1.0), convention)
    assert np.all(c.pcpo_sigma <= c.least_sigma * (1 + 1e-9))  # one branch: w decreasing in sigma
    assert np.abs(np.diff(c.sigma_ratio)).max() <= RATIO_JUMP_TOL[steps]
    ok = np.setdiff1d(np.arange(steps), c.fallback_steps)
    np.testing.assert_allclose(c.pcpo_weight[ok], c.w_target, rtol=1e-9)
    for i in c.fallback_steps:  # no root at all: w* is below the least weight of the step
        assert pcpo_sigma_roots(c.schedule.alpha_bar[i], c.schedule.alpha_bar_prev[i], c.w_target, convention).size == 0


def test_nearest_root_rule_jumped_between_branches():
    """The measured problem: at 20 toy steps (unit) the root nearest to sigma switched branches."""
    c = pcpo_ddim_credit(ddim_schedule(TOY_DDIM_CONFIG, 20, 1.0), "unit")
    nearest = []
    for i in range(20):
        roots = pcpo_sigma_roots(c.schedule.alpha_bar[i], c.schedule.alpha_bar_prev[i], c.w_target, "unit")
        nearest.append(roots[np.argmin(np.abs(roots - c.sigma[i]))] / c.sigma[i] if roots.size else 1.0)
    assert np.abs(np.diff(nearest)).max() > 1.0 > RATIO_JUMP_TOL[20]
    assert np.any(np.asarray(nearest) > 1.2) and np.all(c.sigma_ratio[np.setdiff1d(range(20), c.fallback_steps)] < 1)


@pytest.mark.parametrize("name", SCHEDULES)
@pytest.mark.parametrize("steps", [8, 20, 50])
@pytest.mark.parametrize("convention", CONVENTIONS)
def test_default_fallback_keeps_every_weight_within_2x_w_star(name, steps, convention):
    sched = ddim_schedule(SCHEDULES[name], steps, 1.0)
    c = pcpo_ddim_credit(sched, convention)
    assert DEFAULT_FALLBACK == "cap" and c.fallback == "cap" and c.fallback_steps
    assert c.effective_weight.max() <= 2 * c.w_target
    np.testing.assert_allclose(c.effective_weight, c.w_target, rtol=1e-9)  # cap: every step carries w*
    fb = c.fallback_steps
    np.testing.assert_allclose(c.credit_scale[fb], c.w_target / _weight(
        sched.alpha_bar[fb], sched.alpha_bar_prev[fb], c.pcpo_sigma[fb], convention), rtol=1e-9)
    ex = pcpo_ddim_credit(sched, convention, fallback="exclude")
    assert np.all(ex.credit_scale[fb] == 0) and ex.effective_weight.max() <= 2 * ex.w_target
    near = pcpo_ddim_credit(sched, convention, fallback="nearest")
    assert near.effective_weight.max() > 4 * near.w_target  # why the default is not 'nearest' (docs/credit.md)


def test_toy_8_step_residual_fallback_step_carried_half_the_weight():
    """The measured case: native weight 2437.6 = 7.26 w* at toy step 6 carried 51% of the weight under 'nearest'."""
    sched = ddim_schedule(TOY_DDIM_CONFIG, 8, 1.0)
    near = pcpo_ddim_credit(sched, "residual", fallback="nearest").to_dict()
    assert near["fallback_steps"] == [6]
    assert near["steps"][6]["native_weight"] == pytest.approx(2437.6, abs=0.1)
    assert near["max_effective_weight_over_w_target"] == pytest.approx(7.26, abs=0.01)
    assert near["fallback_weight_share"] == pytest.approx(0.509, abs=1e-3)
    cap = pcpo_ddim_credit(sched, "residual").to_dict()
    assert cap["fallback_weight_share"] == pytest.approx(1 / 8)
    assert cap["max_effective_weight_over_w_target"] == pytest.approx(1.0)


def test_credit_names_conventions_and_fallbacks_by_equation():
    assert set(CONVENTIONS) == {"residual", "unit"} and set(FALLBACKS) == {"cap", "exclude", "nearest", "native"}
    assert "C/sigma^2" in CONVENTIONS["residual"] and "C/sigma," in CONVENTIONS["unit"]
    d = pcpo_ddim_credit(ddim_schedule(None, 20, 1.0), "unit", fallback="exclude").to_dict()
    assert d["convention_equation"] == CONVENTIONS["unit"] and d["fallback_rule"] == FALLBACKS["exclude"]
    with pytest.raises(UserError, match="cap, exclude, nearest, native"):
        pcpo_ddim_credit(ddim_schedule(None, 20, 1.0), fallback="resolve")


@settings(max_examples=60, deadline=None)
@given(
    ab=st.floats(0.01, 0.99),
    ratio=st.floats(0.5, 0.999),
    w=st.floats(0.05, 200.0),
    convention=st.sampled_from(["residual", "unit"]),
)
def test_roots_solve_the_weight_equation(ab, ratio, w, convention):
    ab_prev = min(ab / ratio, 0.9999)
    for s in pcpo_sigma_roots(ab, ab_prev, w, convention):
        wt = ddim_weight(ddim_C(np.array(ab), np.array(ab_prev), np.array(s)), np.array(s), convention)
        assert float(wt) == pytest.approx(w, rel=1e-6)


def _gauss_logpdf_sum(x, mean, std):
    return (-((x - mean) ** 2) / (2 * std**2) - np.log(std) - 0.5 * np.log(2 * np.pi)).sum(-1)


@pytest.mark.parametrize("sigma_kind", ["ddim", "pcpo"])
def test_ddim_decomposition_equals_gaussian_log_ratio(sigma_kind):
    """Prop. 1: log rho from two Gaussian densities == -[w d.eps + 1/2 ||w d||^2], w = C/sigma."""
    rng = np.random.default_rng(0)
    sched = ddim_schedule(SD1_DDIM_CONFIG, 50, 1.0)
    credit = pcpo_ddim_credit(sched, "unit")
    sig = credit.sigma if sigma_kind == "ddim" else credit.pcpo_sigma
    D = 64
    for i in range(0, 50, 7):
        ab, abp, s = sched.alpha_bar[i], sched.alpha_bar_prev[i], sig[i]
        x_t = torch.as_tensor(rng.standard_normal((4, D)))
        eps_old = torch.as_tensor(rng.standard_normal((4, D)))
        eps_th = eps_old + 0.05 * torch.as_tensor(rng.standard_normal((4, D)))
        mu_old = ddim_mean(x_t, eps_old, ab, abp, s).numpy()
        mu_th = ddim_mean(x_t, eps_th, ab, abp, s).numpy()
        z = rng.standard_normal((4, D))
        x_prev = mu_old + s * z
        direct = _gauss_logpdf_sum(x_prev, mu_th, s) - _gauss_logpdf_sum(x_prev, mu_old, s)
        C = ddim_C(ab, abp, s)
        d = (eps_th - eps_old).numpy()
        w_unit = C / s
        dec_unit = -(w_unit * (d * z).sum(-1) + 0.5 * (w_unit**2) * (d**2).sum(-1))
        np.testing.assert_allclose(dec_unit, direct, rtol=1e-6, atol=1e-9)
        # residual convention: the same ratio with r = x_prev - mu_old as the noise and w = C/sigma^2
        r = x_prev - mu_old
        w_res = C / s**2
        dec_res = -(w_res * (d * r).sum(-1) + 0.5 * s**2 * (w_res**2) * (d**2).sum(-1))
        np.testing.assert_allclose(dec_res, direct, rtol=1e-6, atol=1e-9)


@pytest.mark.parametrize("sde,steps,eta", [("dance", 16, 0.3), ("flowgrpo", 10, 0.7)])
def test_flow_decomposition_equals_gaussian_log_ratio(sde, steps, eta):
    """Eq. (logrho-flow): log rho == -[w (u_th - u_old).eps + 1/2 ||w (u_th - u_old)||^2]."""
    rng = np.random.default_rng(1)
    c = flow_credit(sde, steps, eta, 3.0, t1="sigma_max")  # the sampler's sigma at t=1
    D = 48
    for i in range(steps):
        t, dt, s = c.t[i], c.dt[i], c.sigma[i]
        x = torch.as_tensor(rng.standard_normal((3, D)))
        u_old = torch.as_tensor(rng.standard_normal((3, D)))
        u_th = u_old + 0.05 * torch.as_tensor(rng.standard_normal((3, D)))
        std = s * np.sqrt(dt)
        mu_old = flow_sde_mean(x, u_old, t, dt, s).numpy()
        mu_th = flow_sde_mean(x, u_th, t, dt, s).numpy()
        z = rng.standard_normal((3, D))
        x_next = mu_old + std * z
        direct = _gauss_logpdf_sum(x_next, mu_th, std) - _gauss_logpdf_sum(x_next, mu_old, std)
        w = flow_native_weight(np.array(t), np.array(dt), np.array(s))
        d = (u_th - u_old).numpy()
        dec = -(w * (d * z).sum(-1) + 0.5 * w**2 * (d**2).sum(-1))
        np.testing.assert_allclose(dec, direct, rtol=1e-6, atol=1e-9)
        assert np.isclose(w, c.native_weight[i], rtol=1e-12)


def test_shifted_sigmas_endpoints():
    g = shifted_sigmas(16, 3.0)
    assert g[0] == 1.0 and g[-1] == 0.0 and np.all(np.diff(g) < 0)


@pytest.mark.parametrize(
    "kwargs,match",
    [
        (dict(sde="dance", steps=0), "--steps"),
        (dict(sde="dance", eta=0.0), "--eta"),
        (dict(sde="dance", shift=-1.0), "--shift"),
        (dict(sde="nope"), "dance, flowgrpo"),
        (dict(sde="flowgrpo", t1="x"), "neighbor"),
    ],
)
def test_flow_bad_input(kwargs, match):
    with pytest.raises(UserError, match=match):
        flow_credit(**kwargs)


def test_ddim_bad_input():
    with pytest.raises(UserError, match="--steps"):
        ddim_schedule(None, 0, 1.0)
    with pytest.raises(UserError, match="--eta"):
        ddim_schedule(None, 50, 0.0)
    with pytest.raises(UserError, match="scaled_linear"):
        ddim_schedule({**SD1_DDIM_CONFIG, "beta_schedule": "cosine"}, 50, 1.0)
    with pytest.raises(UserError, match="residual, unit"):
        pcpo_ddim_credit(ddim_schedule(None, 10, 1.0), "paper")


def test_ddim_scheduler_config_defaults_and_flags(tmp_path):
    assert DDIMSchedulerConfig().to_dict() == SD1_DDIM_CONFIG
    trailing = ddim_schedule(DDIMSchedulerConfig(spacing="trailing", offset=0).to_dict(), 10, 1.0)
    assert trailing.timesteps[0] == 999 and trailing.timesteps[-1] == 99
    linear = DDIMSchedulerConfig(beta_schedule="linear", beta_start=1e-4, beta_end=0.02, train_steps=500).to_dict()
    assert ddim_schedule(linear, 10, 1.0).config["num_train_timesteps"] == 500
    (tmp_path / "ok.json").write_text(json.dumps({"_class_name": "DDIMScheduler", **linear}))
    assert read_scheduler_config(tmp_path / "ok.json")["beta_schedule"] == "linear"
    (tmp_path / "bad.json").write_text("nope{")
    with pytest.raises(UserError, match="cannot read --scheduler-config"):
        read_scheduler_config(tmp_path / "bad.json")
    (tmp_path / "list.json").write_text("[1, 2]")
    with pytest.raises(UserError, match="JSON object"):
        read_scheduler_config(tmp_path / "list.json")


def test_cli_subprocess_entry_point():
    out = subprocess.run([sys.executable, "-m", "pcpo_eval", "credit", "flow", "--eta", "0"], capture_output=True,
                         text=True)
    assert out.returncode == 2 and out.stderr.strip() == "error: --eta must be a number in (0, 100] (got 0.0); pass e.g. --eta 0.3"


def test_cli_credit_json_and_plot(tmp_path, cli):
    _cli = cli
    out = _cli("credit", "flow", "--sde", "dance", "--steps", "16", "--eta", "0.3", "--shift", "3", "--json",
               "--plot", str(tmp_path / "f.png"))
    assert out.returncode == 0, out.stderr
    d = json.loads(out.stdout)
    assert d["zeta"] == pytest.approx(13.343, abs=1e-3) and len(d["steps"]) == 16
    assert {"t", "dt", "sigma", "native_weight", "pcpo_weight"} <= set(d["steps"][0])
    assert (tmp_path / "f.png").read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    assert (tmp_path / "f.svg").is_file() and (tmp_path / "f.pdf").read_bytes().startswith(b"%PDF")
    out = _cli("credit", "ddim", "--steps", "50", "--eta", "1", "--json")
    d = json.loads(out.stdout)
    assert d["mean_native_weight"] == pytest.approx(4.456, abs=0.01)
    assert d["fallback_steps"] == [46, 47, 48, 49] and d["fallback"] == "cap"
    keys = {"timestep", "sigma", "pcpo_sigma", "sigma_ratio", "native_weight", "pcpo_weight", "effective_weight",
            "native_share", "pcpo_share", "credit_scale", "fallback"}
    assert keys <= set(d["steps"][0])
    st0 = d["steps"][0]
    assert st0["sigma_ratio"] == pytest.approx(st0["pcpo_sigma"] / st0["sigma"])
    assert sum(x["pcpo_share"] for x in d["steps"]) == pytest.approx(1.0)
    assert sum(x["native_share"] for x in d["steps"]) == pytest.approx(1.0)
    assert d["fallback_weight_share"] == pytest.approx(sum(d["steps"][i]["pcpo_share"] for i in d["fallback_steps"]))
    assert d["sigma_ratio_median"] == pytest.approx(0.417, abs=1e-3)


@pytest.mark.parametrize(
    "args,match",
    [
        (["credit", "flow", "--steps", "0"], "--steps"),
        (["credit", "flow", "--eta", "0"], "--eta"),
        (["credit", "flow", "--shift", "0"], "--shift"),
        (["credit", "flow", "--sde", "ode"], "dance, flowgrpo"),
        (["credit", "ddim", "--convention", "x"], "residual, unit"),
        (["credit", "ddim", "--beta-schedule", "cosine"], "scaled_linear"),
        (["credit", "ddim", "--steps", "-3"], "--steps"),
    ],
)
def test_cli_bad_input_one_line_exit_2(args, match, cli):
    out = cli(*args)
    assert out.returncode == 2
    assert match in out.stderr and "Traceback" not in out.stderr
    assert len(out.stderr.strip().splitlines()) == 1


def test_credit_figure_is_a_paper_figure(tmp_path):
    """Issue 29: Figure 2 at the report's paper size and fonts, as SVG + PDF + 300-dpi PNG."""
    import matplotlib.pyplot as plt
    from PIL import Image

    from pcpo_eval.credit.plot import credit_figure, save_credit_figure
    from pcpo_eval.figfiles import DOUBLE_COLUMN_IN

    fig = credit_figure()
    try:
        assert fig.get_figwidth() == DOUBLE_COLUMN_IN and len(fig.axes) == 4
        texts = [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
                 if t.get_text().strip()]
        assert min(t.get_fontsize() for t in texts) >= 7
    finally:
        plt.close(fig)
    path = save_credit_figure(tmp_path / "figures" / "credit.png")
    assert (tmp_path / "figures" / "credit.svg").read_text().count("<text") > 0
    pdf = (tmp_path / "figures" / "credit.pdf").read_bytes()
    assert pdf.startswith(b"%PDF") and b"/Type3" not in pdf
    with Image.open(path) as im:
        assert im.info["dpi"] == pytest.approx((300, 300), abs=0.1)
        assert im.size[0] / 300 <= DOUBLE_COLUMN_IN + 0.2
