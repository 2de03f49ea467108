"""Training diagnostics: Taylor error of log rho ~ rho - 1, Eq. Delta terms, per-update columns, wall clock."""

from __future__ import annotations

import math

import numpy as np
import pandas as pd
import pytest
import torch

from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.diagnostics import (
    delta_terms,
    diagnostic_stats,
    magnitude_ratio,
    taylor_abs_error,
    taylor_rel_error,
)
from pcpo_eval.train.objectives import eps_matching_log_rho
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY as TINY_TRAIN

TINY = {**TINY_TRAIN, "gradient_updates": 2}


def test_taylor_error_hand_values():
    # rho = 1.01: e = 0.01 - log(1.01) = 4.96691e-5, relative 4.96691e-3
    lr = np.log([1.01, 0.5, 1.0, 2.0])
    np.testing.assert_allclose(taylor_abs_error(lr), [0.01 - math.log(1.01), -0.5 + math.log(2), 0.0, 1 - math.log(2)],
                               rtol=1e-12, atol=1e-18)
    np.testing.assert_allclose(taylor_rel_error(lr), [(0.01 - math.log(1.01)) / 0.01, (math.log(2) - 0.5) / 0.5, 0.0,
                                                      1 - math.log(2)], rtol=1e-10)
    assert 4.966e-3 < taylor_rel_error(np.log([1.01]))[0] < 4.967e-3


@pytest.mark.parametrize("x", [1e-9, -1e-9, 1e-6, 9.99e-4, -9.99e-4, 1.001e-3, -1.001e-3])
def test_taylor_error_series_agrees_with_closed_form(x):
    """Around the series threshold both branches agree (the series is exact to ~x^5)."""
    import mpmath

    mpmath.mp.dps = 50
    e = mpmath.expm1(mpmath.mpf(x)) - mpmath.mpf(x)
    assert taylor_abs_error(np.array([x]))[0] == pytest.approx(float(e), rel=1e-9)
    assert taylor_rel_error(np.array([x]))[0] == pytest.approx(float(abs(e / mpmath.expm1(mpmath.mpf(x)))), rel=1e-9)


def test_delta_terms_hand_computed_and_sum_to_minus_log_rho():
    out = torch.tensor([[1.0, 2.0]])
    old = torch.zeros(1, 2)
    noise = torch.tensor([[1.0, -1.0]])
    dot, sq = delta_terms(out, old, noise, 2.0)  # d = [2, 4]: dot = (2 - 4)/2 = -1, sq = (4 + 16)/4 = 5
    assert dot.tolist() == [-1.0] and sq.tolist() == [5.0]
    assert magnitude_ratio(dot.numpy(), sq.numpy()) == pytest.approx(0.2)
    g = torch.Generator().manual_seed(0)
    a, b, e = (torch.randn(3, 4, 2, 2, generator=g) for _ in range(3))
    w = torch.tensor([0.5, 2.0, 7.0])
    dot, sq = delta_terms(a, b, e, w)
    torch.testing.assert_close(-(dot + sq), eps_matching_log_rho(a, b, e, w))


def test_diagnostic_stats_per_update_and_first_off_policy():
    lr = np.array([0.0, 0.0, 0.02, -0.01])
    st = diagnostic_stats(lr, clipped=np.array([0, 0, 1, 0]), update=np.array([0, 0, 1, 1]), step=np.array([0, 1, 0, 1]),
                          dot=np.array([0.0, 0.0, -0.03, 0.01]), sq=np.array([0.0, 0.0, 0.01, 0.0]))
    rel = taylor_rel_error(lr)
    assert st["taylor_rel_err_max"] == pytest.approx(rel[2])
    assert st["taylor_rel_err_active_max"] == pytest.approx(rel[3])  # the clipped sample is excluded
    assert st["taylor_rel_err_per_update"] == pytest.approx([0.0, rel[2]])
    assert st["delta_ratio_first_offpolicy"] == pytest.approx(0.02 / 0.005)  # mean|dot| 0.02 / mean sq 0.005
    assert math.isnan(st["delta_ratio_per_update"][0])  # on-policy: 0 / 0
    assert st["delta_ratio_first_offpolicy_per_step"][0] == pytest.approx(3.0)
    assert math.isinf(st["delta_ratio_first_offpolicy_per_step"][1]) or math.isnan(
        st["delta_ratio_first_offpolicy_per_step"][1])
    one_update = diagnostic_stats(lr, np.zeros(4), np.zeros(4), np.arange(4), np.ones(4), np.ones(4))
    assert math.isnan(one_update["delta_ratio_first_offpolicy"])  # no off-policy update in the epoch
    # on-policy terms of rounding noise (recomputing the recorded output with other batch shapes or
    # threads): the ratio is NaN as for exact zeros, not a ratio of noise that depends on the machine
    noisy = diagnostic_stats(lr, np.zeros(4), np.array([0, 0, 1, 1]), np.arange(4),
                             np.array([3e-8, -1e-8, -0.03, 0.01]), np.array([2e-16, 1e-16, 0.01, 0.0]))
    assert math.isnan(noisy["delta_ratio_per_update"][0]) and noisy["delta_sq_per_update"][0] == pytest.approx(1.5e-16)
    assert noisy["delta_ratio_per_update"][1] == pytest.approx(0.02 / 0.005)


@pytest.mark.parametrize("objective", ["eps_matching", "ppo_clip"])
def test_trainer_logs_diagnostics_and_delta_matches_log_rho(tmp_path, objective):
    tr = Trainer(config_from_dict({**TINY, "objective": objective, "diagnostics": True}), tmp_path / "run")
    s = tr.sample_epoch(1)
    row = tr.train_epoch(1, s)  # two updates: 0 on-policy, 1 the first off-policy one
    assert len(row["delta_ratio_per_update"]) == 2 and len(row["taylor_rel_err_per_update"]) == 2
    # on-policy the two eps predictions differ only by float32 rounding of other batch shapes (2.5e-10
    # measured on one CPU, 0 on another): at least 1e6 times below the first off-policy update's
    assert row["delta_sq_per_update"][1] > 0 and row["delta_sq_per_update"][0] < 1e-6 * row["delta_sq_per_update"][1]
    assert math.isnan(row["delta_ratio_per_update"][0]) and row["delta_ratio_per_update"][1] > 0  # same on any CPU
    assert np.isfinite(row["delta_ratio_first_offpolicy"]) and row["delta_ratio_first_offpolicy"] > 0
    assert 0 <= row["taylor_rel_err_active_max"] <= row["taylor_rel_err_max"]
    # the logged maximum is the Taylor error of the logged log-ratio range
    ext = max(abs(row["log_rho_min"]), abs(row["log_rho_max"]))
    assert row["taylor_rel_err_max"] == pytest.approx(ext / 2, rel=0.05)
    rows, j = torch.arange(4), torch.full((4,), 1)
    _, out, _ = tr.step_loss(s, rows, j, torch.ones(4))
    if objective == "eps_matching":  # Eq. Delta: -log rho = dot + sq exactly
        torch.testing.assert_close(-(out.delta[0] + out.delta[1]), out.log_rho.detach())
    else:  # log-prob difference: equal up to float32 error of the two log densities
        torch.testing.assert_close(-(out.delta[0] + out.delta[1]), out.log_rho.detach(), atol=1e-4, rtol=1e-3)


def test_diagnostics_off_adds_no_columns_and_wall_clock_is_cumulative(tmp_path):
    log = Trainer(config_from_dict({**TINY, "epochs": 2, "paired_control": True}), tmp_path / "run").run()
    assert not any(c.startswith(("taylor_", "delta_", "val_")) for c in log.columns)
    assert (log["processes"] == 1).all() and (log["images"] == TINY["sample_batch_size"] * TINY["sample_batches_per_epoch"]).all()
    expect = (log["wall_time_s"] - log["control_time_s"]).cumsum()
    np.testing.assert_allclose(log["wall_clock_s"], expect, rtol=1e-12)
    resumed = Trainer(config_from_dict({**TINY, "epochs": 3, "paired_control": True}), tmp_path / "run", resume=True).run()
    assert resumed["wall_clock_s"].iloc[2] == pytest.approx(
        log["wall_clock_s"].iloc[1] + resumed["wall_time_s"].iloc[2] - resumed["control_time_s"].iloc[2])
    on_disk = pd.read_parquet(tmp_path / "run" / "log.parquet")
    assert on_disk["wall_clock_s"].is_monotonic_increasing
    # compute_s: the run's own CPU seconds for sampling + training (no control), carried over a resume
    assert (log["compute_s"] > 0).all() and log["compute_s"].is_monotonic_increasing
    assert log["compute_s"].iloc[1] == on_disk["compute_s"].iloc[1] < on_disk["compute_s"].iloc[2]


def test_one_update_per_epoch_logs_nan_ratios_as_floats(tmp_path):
    """One optimizer update per epoch (the stand-in paper specs): every update is on-policy, so
    ``delta_ratio_per_update`` is NaN throughout; log.parquet still types it list<double> (plain pandas
    wrote list<null>, read back as None, which crashed the study's stats stage)."""
    import pyarrow.parquet as pq

    Trainer(config_from_dict({**TINY, "epochs": 1, "sample_steps": 2, "gradient_updates": 1, "diagnostics": True}),
            tmp_path / "run").run()
    path = tmp_path / "run" / "log.parquet"
    schema = pq.read_schema(path)
    for col in ("delta_ratio_per_update", "taylor_rel_err_per_update", "delta_sq_per_update"):
        assert str(schema.field(col).type) == "list<element: double>", col
    log = pd.read_parquet(path)
    assert [v.tolist() for v in log["taylor_rel_err_per_update"]] == [[x] for x in log["taylor_rel_err_max"]]
    assert all(v.dtype == np.float64 and len(v) == 1 and np.isnan(v).all() for v in log["delta_ratio_per_update"])


def test_reward_time_is_the_scoring_of_the_run_own_samples(tmp_path):
    import time

    tr = Trainer(config_from_dict({**TINY, "epochs": 2, "paired_control": True}), tmp_path / "run")
    score = tr.reward_fn

    def slow(images, prompts):  # the paired control scores through the same function
        time.sleep(0.25)
        return score(images, prompts)

    tr.reward_fn = slow
    log = tr.run()
    # the run's own scoring only: one call per epoch, inside the sampling phase; the control's call is
    # in control_time_s
    assert (log["reward_time_s"] >= 0.25).all() and (log["reward_time_s"] < 0.5).all()
    assert (log["reward_time_s"] < log["sample_time_s"]).all() and (log["control_time_s"] >= 0.25).all()
