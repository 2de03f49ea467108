"""Reward-matched checkpoints on the held-out validation reward (``select --on eval``, spec
``select_on: eval``): the smoothed ``val_reward_mean`` over validation points decides, only
checkpoints at validation epochs are candidates, and missing validation data is one clear error.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.stats.select import run_checkpoints, select_checkpoints
from pcpo_eval.study.spec import load_spec

ANALYSIS = Path(__file__).resolve().parents[2] / "analysis"


def _run(rd: Path, train: np.ndarray, val: dict[int, float], ckpts: list[int]) -> Path:
    e = np.arange(1, len(train) + 1)
    v = np.full(len(train), np.nan)
    for ep, x in val.items():
        v[ep - 1] = x
    rd.mkdir(parents=True)
    pd.DataFrame({"epoch": e, "reward_mean": train, "val_reward_mean": v}).to_parquet(rd / "log.parquet", index=False)
    for ep in ckpts:
        (rd / "checkpoints" / f"epoch_{ep:04d}").mkdir(parents=True)
        (rd / "checkpoints" / f"epoch_{ep:04d}" / "checkpoint.json").write_text(json.dumps({"epoch": ep}))
    return rd


def test_eval_matching_uses_the_smoothed_validation_reward_at_validation_epochs(tmp_path):
    # training reward reaches 0.6 early (epoch 4); the held-out reward only at epoch 20
    train = np.linspace(0.5, 0.9, 20)
    val = {5: 0.40, 10: 0.50, 15: 0.62, 20: 0.70}
    rd = _run(tmp_path / "r", train, val, ckpts=[4, 5, 8, 10, 15, 20])
    cks, source = run_checkpoints(rd, window=2, on="eval")
    assert [c.epoch for c in cks] == [5, 10, 15, 20]  # epochs 4 and 8 have no validation reward
    assert [round(c.reward, 3) for c in cks] == [0.40, 0.45, 0.56, 0.66]  # trailing mean of 2 validation points
    assert "val_reward_mean" in source
    on_eval = select_checkpoints([rd], target=0.6, window=2, on="eval").choices[0]
    on_train = select_checkpoints([rd], target=0.6, window=2, on="train").choices[0]
    assert (on_eval.epoch, on_eval.reached) == (20, True) and on_train.epoch < 10
    never = select_checkpoints([rd], target=0.8, window=2, on="eval").choices[0]
    assert not never.reached and never.epoch == 20


def test_eval_matching_without_validation_data_is_one_clear_error(tmp_path):
    rd = _run(tmp_path / "r", np.linspace(0.5, 0.9, 10), {}, ckpts=[5, 10])
    with pytest.raises(UserError, match="logged no held-out validation reward.*validation_every"):
        run_checkpoints(rd, on="eval")
    rd2 = _run(tmp_path / "r2", np.linspace(0.5, 0.9, 10), {3: 0.4, 6: 0.5}, ckpts=[5, 10])
    with pytest.raises(UserError, match="no checkpoint was saved at a validation epoch"):
        run_checkpoints(rd2, on="eval")
    with pytest.raises(UserError, match="unknown match on 'test'"):
        run_checkpoints(rd2, on="test")


def test_cli_select_on_eval(cli, tmp_path):
    rd = _run(tmp_path / "r", np.linspace(0.5, 0.9, 20), {10: 0.5, 20: 0.7}, ckpts=[10, 20])
    res = cli("select", rd, "--target", "0.55", "--window", "1", "--on", "eval", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["runs"][0]["epoch"] == 20


def test_spec_select_on_eval_needs_validation(tmp_path):
    spec = yaml.safe_load((ANALYSIS / "flowgrpo_sd35_pickscore.yaml").read_text())
    assert load_spec(ANALYSIS / "flowgrpo_sd35_pickscore.yaml", check_weights=False).select_on == "eval"
    spec["train"]["config"] = str(ANALYSIS.parent / "train" / "configs" / "setup9_flowgrpo_sd35_pickscore.yaml")
    spec["train"]["overrides"].pop("validation_every")
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match="select_on: eval needs the held-out validation reward"):
        load_spec(tmp_path / "s.yaml", check_weights=False)
    spec["select_on"] = "heldout"
    (tmp_path / "s.yaml").write_text(yaml.safe_dump(spec))
    with pytest.raises(UserError, match="select_on must be train"):
        load_spec(tmp_path / "s.yaml", check_weights=False)
