"""Speed-up analysis: moving average, epochs to target, the paper's formula, CLI."""

from __future__ import annotations

import json

import numpy as np
import pandas as pd
import pytest

from pcpo_eval.stats.speedup import epochs_to_target, moving_average, speedup_pct, speedup_table


def _log(rewards, start=1):
    return pd.DataFrame({"epoch": np.arange(start, start + len(rewards)), "reward_mean": rewards})


def _crossing_log(cross_epoch: int, n_epochs: int = 300, target: float = 6.9):
    """A noisy-free linear ramp whose window-5 trailing mean first reaches ``target`` at cross_epoch."""
    e = np.arange(1, n_epochs + 1, dtype=float)
    slope = 0.01
    # the trailing mean of a line lags by 2 epochs: mean(r[e-4..e]) = r(e-2)
    r = target + slope * (e + 2 - cross_epoch) + slope * 1e-3
    return _log(r)


def test_moving_average_matches_pandas_rolling():
    x = np.random.default_rng(0).normal(size=40)
    ref = pd.Series(x).rolling(5, min_periods=1).mean().to_numpy()
    np.testing.assert_allclose(moving_average(x, 5), ref, rtol=1e-12)
    np.testing.assert_allclose(moving_average(x, 1), x)


def test_paper_formula():
    assert speedup_pct(260, 131) == pytest.approx(98.47, abs=0.01)  # paper: 98.5%
    assert speedup_pct(147, 118) == pytest.approx(24.58, abs=0.01)  # paper: 24.6%
    assert speedup_pct(145, 155) == pytest.approx(-6.45, abs=0.01)


def test_epochs_to_target_and_not_reached():
    log = _log([1, 2, 3, 4, 5, 6, 7, 8])
    # trailing means: 1, 1.5, 2, 2.5, 3, 4, 5, 6
    assert epochs_to_target(log, 4.0, window=5) == 6
    assert epochs_to_target(log, 4.0, window=1) == 4
    assert epochs_to_target(log, 100.0) is None
    shuffled = log.sample(frac=1.0, random_state=0)
    assert epochs_to_target(shuffled, 4.0) == 6  # epoch order, not row order
    assert epochs_to_target(_log([9, 8, 7, 6]), 7.5, window=1, higher_is_better=False) == 3


def test_speedup_table_paper_example():
    tab = speedup_table([_crossing_log(260)], [_crossing_log(131)], [6.9])
    row = tab.rows[0]
    assert row.baseline_epochs == (260,) and row.pcpo_epochs == (131,)
    assert row.speedup_pct == pytest.approx(98.47, abs=0.01)
    assert "98.5%" in tab.to_markdown()


def test_several_seeds_mean_and_spread():
    base = [_crossing_log(e) for e in (200, 220)]
    pcpo = [_crossing_log(e) for e in (100, 110)]
    row = speedup_table(base, pcpo, [6.9]).rows[0]
    assert row.baseline_mean == 210 and row.pcpo_mean == 105
    assert row.baseline_sd == pytest.approx(np.std([200, 220], ddof=1))
    assert row.speedup_pct == pytest.approx(100.0)
    assert row.speedup_min_pct == pytest.approx(speedup_pct(200, 110))
    assert row.speedup_max_pct == pytest.approx(speedup_pct(220, 100))


def test_not_reached_status_and_lower_bound():
    base = [_crossing_log(400, n_epochs=300)]  # never reaches within 300 epochs
    pcpo = [_crossing_log(150)]
    row = speedup_table(base, pcpo, [6.9]).rows[0]
    assert row.baseline_epochs == (None,)
    assert row.speedup_pct is None
    assert "baseline not reached" in row.status
    assert row.speedup_lower_bound_pct == pytest.approx(speedup_pct(300, 150))


def test_cli_speedup_json_and_run_dir(tmp_path, cli):
    run = tmp_path / "run_base"
    run.mkdir()
    _crossing_log(260).to_parquet(run / "log.parquet")
    pc = tmp_path / "pcpo.csv"
    _crossing_log(131).to_csv(pc, index=False)
    r = cli("speedup", "--baseline", run, "--pcpo", pc, "--target", "6.9", "--target", "6.6", "--json")
    assert r.returncode == 0, r.stderr
    d = json.loads(r.stdout)
    assert d["window"] == 5
    assert d["targets"][0]["speedup_pct"] == pytest.approx(98.47, abs=0.01)
    assert d["targets"][0]["baseline_epochs"] == [260]
    r = cli("speedup", "--baseline", run, "--pcpo", pc, "--target", "6.9")
    assert r.returncode == 0 and "| 6.9 | 260 | 131 | 98.5% |" in r.stdout


@pytest.mark.parametrize(
    ("frame", "message"),
    [
        (pd.DataFrame({"epoch": [1, 2], "reward": [1.0, 2.0]}), "lacks column 'reward_mean'"),
        (pd.DataFrame({"step": [1, 2], "reward_mean": [1.0, 2.0]}), "lacks column 'epoch'"),
        (pd.DataFrame({"epoch": [1, 2], "reward_mean": [1.0, np.nan]}), "'reward_mean' has 1 missing"),
        (pd.DataFrame({"epoch": [1, 1], "reward_mean": [1.0, 2.0]}), "epoch 1 more than once"),
    ],
)
def test_cli_bad_logs(tmp_path, cli, frame, message):
    bad = tmp_path / "bad.csv"
    frame.to_csv(bad, index=False)
    good = tmp_path / "good.csv"
    _log([1.0, 2.0]).to_csv(good, index=False)
    r = cli("speedup", "--baseline", bad, "--pcpo", good, "--target", "1")
    assert r.returncode == 2
    assert message in r.stderr and r.stderr.startswith("error: ") and r.stderr.count("\n") == 1


def test_cli_missing_log_and_empty_run(tmp_path, cli):
    r = cli("speedup", "--baseline", tmp_path / "nope.parquet", "--pcpo", tmp_path / "x.csv", "--target", "1")
    assert r.returncode == 2 and "does not exist" in r.stderr
    (tmp_path / "run").mkdir()
    r = cli("speedup", "--baseline", tmp_path / "run", "--pcpo", tmp_path / "run", "--target", "1")
    assert r.returncode == 2 and "no log.parquet" in r.stderr
