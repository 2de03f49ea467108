"""Reward-matched checkpoints and the untrained control (``select --on gain``, spec ``select_on: gain``).

A raw target that a run's paired untrained control reaches is reached by the sampler alone: a frozen
policy (reward == its control every epoch) was "reward-matched" at the toy study's 0.80 and then looked
best on FD (it is the base model). The selection now says so, and matching on the gain over the control
never matches a policy that learned nothing.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.stats.select import control_reaches, run_checkpoints, select_checkpoints
from pcpo_eval.study.spec import load_spec

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"


def _run(rd: Path, reward: np.ndarray, control: np.ndarray | None, every: int = 2) -> Path:
    e = np.arange(1, len(reward) + 1)
    df = pd.DataFrame({"epoch": e, "reward_mean": reward})
    if control is not None:
        df["control_reward_mean"] = control
    rd.mkdir(parents=True)
    df.to_parquet(rd / "log.parquet", index=False)
    for ep in e[e % every == 0]:
        (rd / "checkpoints" / f"epoch_{ep:04d}").mkdir(parents=True)
        (rd / "checkpoints" / f"epoch_{ep:04d}" / "checkpoint.json").write_text(json.dumps({"epoch": int(ep)}))
    return rd


def test_a_frozen_policy_is_matched_on_raw_reward_but_flagged_and_never_matched_on_gain(tmp_path):
    rng = np.random.default_rng(0)
    control = 0.78 + 0.03 * rng.standard_normal(16)
    control[6:12] += 0.05  # the sampler's reward wanders above 0.80 for a while, no learning involved
    frozen = _run(tmp_path / "frozen", control.copy(), control)
    learner = _run(tmp_path / "learner", control + np.linspace(0.0, 0.12, 16), control)
    raw = select_checkpoints([frozen, learner], target=0.80, window=5)
    assert all(c.reached for c in raw.choices)  # the frozen policy is "reward-matched"
    assert "frozen" in raw.control_reaches[0] and raw.to_dict()["control_reaches"] == list(raw.control_reaches)
    assert "not matched on learning" in raw.to_markdown()
    gain = select_checkpoints([frozen, learner], target=0.04, window=5, on="gain")
    assert [c.reached for c in gain.choices] == [False, True] and gain.control_reaches == ()
    cks, source = run_checkpoints(learner, window=5, on="gain")
    assert "gain over the paired untrained control" in source
    ep = {c.epoch: c for c in cks}
    want = float(np.mean(np.linspace(0.0, 0.12, 16)[5:10]))  # epochs 6..10: the trailing window at epoch 10
    assert ep[10].reward == pytest.approx(want) and ep[10].full_window and not ep[4].full_window


def test_control_reaches_counts_only_up_to_the_matched_epoch(tmp_path):
    control = np.r_[np.full(10, 0.70), np.full(10, 0.85)]  # the control reaches 0.80 only late
    rd = _run(tmp_path / "r", control + np.linspace(0.0, 0.2, 20), control)
    cks, _ = run_checkpoints(rd, window=5)
    first = next(c for c in cks if c.full_window and c.reward >= 0.80)
    assert not control_reaches(cks, 0.80, first.epoch) and control_reaches(cks, 0.80, None)
    assert select_checkpoints([rd], target=0.80, window=5).control_reaches == ()


def test_a_control_that_reaches_the_target_between_checkpoints_is_seen(tmp_path):
    """Checkpoints every 4 epochs: the control's full-window mean reaches 0.80 only at epoch 15 (between
    checkpoints 12 and 16), and the run is matched at 16; before, only checkpoint epochs were looked at."""
    control = np.full(20, 0.70)
    control[10:16] = [0.9, 0.5, 0.9, 0.9, 0.9, 0.2]  # epochs 11..16: window means 0.70 at 12, 0.82 at 15, 0.68 at 16
    rd = _run(tmp_path / "r", control + np.r_[np.zeros(11), np.full(9, 0.2)], control, every=4)
    cks, _ = run_checkpoints(rd, window=5)
    assert [c.epoch for c in cks] == [4, 8, 12, 16, 20]
    assert all(c.control is None or c.control < 0.80 for c in cks if c.epoch <= 12)
    assert control_reaches(cks, 0.80, 16)
    sel = select_checkpoints([rd], target=0.80, window=5)
    assert sel.choices[0].epoch == 16 and sel.control_reaches


def test_gain_matching_without_the_control_is_one_clear_error(tmp_path):
    rd = _run(tmp_path / "r", np.linspace(0.5, 0.9, 10), None)
    with pytest.raises(UserError, match="logged no paired untrained control.*paired_control: true"):
        run_checkpoints(rd, on="gain")
    assert select_checkpoints([rd], target=0.6, window=5).control_reaches == ()  # raw matching: nothing to flag


def test_spec_select_on_gain_needs_the_paired_control(tmp_path):
    data = yaml.safe_load((ANALYSIS / "toy_study.yaml").read_text())
    data["train"]["config"] = str(ANALYSIS.parent / "train" / "configs" / "toy_ddpo.yaml")
    data.update(select_on="gain", select_target=0.04, paired_control=False)
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as ei:
        load_spec(tmp_path / "s.yaml", check_weights=False)
    assert "select_on: gain matches on the gain over the paired untrained control" in str(ei.value.args) + str(
        getattr(ei.value, "problems", ""))
    data.update(select_on="reward")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError) as ei:
        load_spec(tmp_path / "s.yaml", check_weights=False)
    assert "select_on must be train" in str(ei.value.args) + str(getattr(ei.value, "problems", ""))
