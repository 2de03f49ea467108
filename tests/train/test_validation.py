"""Held-out validation reward every N epochs (Fig. 5 / Flow-GRPO's eval): columns, determinism, controls."""

from __future__ import annotations

import math

import numpy as np
import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.toy.data import TOY_PROMPTS
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY as TINY_TRAIN

TINY = {**TINY_TRAIN, "epochs": 3}


@pytest.fixture
def prompt_files(tmp_path):
    train, val = tmp_path / "train.txt", tmp_path / "val.txt"
    train.write_text("\n".join(TOY_PROMPTS[:30]) + "\n")
    val.write_text("\n".join(TOY_PROMPTS[30:]) + "\n")
    return str(train), str(val)


def cfg(prompt_files, **kw):
    train, val = prompt_files
    return config_from_dict({**TINY, "prompts": train, "validation_every": 2, "validation_prompts": val,
                             "validation_images": 5, **kw})


def test_validation_columns_at_every_nth_and_last_epoch(tmp_path, prompt_files):
    log = Trainer(cfg(prompt_files, paired_control=True), tmp_path / "a").run()
    has = log["val_reward_mean"].notna().tolist()
    assert has == [False, True, True]  # epoch 2 (every 2nd) and epoch 3 (the last)
    v = log[log["val_reward_mean"].notna()]
    assert (v["val_images"] == 5).all() and (v["val_reward_sem"] > 0).all()
    # the untrained control is the same model, images and noise at every validation
    assert v["val_control_reward_mean"].nunique() == 1
    # fixed seeds independent of the training RNG: another training seed validates the same control
    other = Trainer(cfg(prompt_files, paired_control=True, seed=7, epochs=2), tmp_path / "b").run()
    assert other["val_control_reward_mean"].dropna().iloc[0] == v["val_control_reward_mean"].iloc[0]


def test_validation_of_an_untrained_policy_equals_its_control(tmp_path, prompt_files):
    """lr ~ 0: the policy after training is the base model, so the deterministic sampler gives the same
    images and the same reward on both paths (policy and LoRA-disabled control)."""
    log = Trainer(cfg(prompt_files, paired_control=True, learning_rate=1e-20, epochs=2), tmp_path / "r").run()
    row = log.iloc[1]
    assert row["val_reward_mean"] == pytest.approx(row["val_control_reward_mean"], abs=1e-9)
    assert row["val_reward_sem"] == pytest.approx(row["val_control_reward_sem"], abs=1e-9)


def test_validation_rewards_are_deterministic_and_in_image_order(tmp_path, prompt_files):
    tr = Trainer(cfg(prompt_files, validation_images=0), tmp_path / "d")
    a, b = tr._validation_rewards(), tr._validation_rewards()
    assert len(a) == len(TOY_PROMPTS) - 30  # 0 = one image per validation prompt
    np.testing.assert_array_equal(a, b)


def test_validation_config_errors_and_overlap_warning(tmp_path, prompt_files, capsys):
    with pytest.raises(UserError, match="validation_prompts"):
        config_from_dict({**TINY, "prompts": "toy", "validation_every": 2})
    with pytest.raises(UserError, match="validation_every must be >= 0"):
        config_from_dict({**TINY, "prompts": "toy", "validation_every": -1})
    with pytest.raises(UserError, match="validation_images must be >= 0"):
        config_from_dict({**TINY, "prompts": "toy", "validation_images": -3})
    Trainer(cfg(prompt_files, prompts="toy"), tmp_path / "w")
    assert "15 of the 15 validation prompts are training prompts" in capsys.readouterr().out
    row = Trainer(cfg(prompt_files), tmp_path / "x").validation_row()
    assert set(row) == {"val_reward_mean", "val_reward_sem", "val_images", "val_time_s"}
    assert math.isfinite(row["val_reward_mean"])


def test_validation_steps_are_their_own(tmp_path, prompt_files, monkeypatch):
    """Flow-GRPO evaluates with 40 steps where it samples with 10 (``eval_num_steps``): ``validation_steps`` sets
    the validation's steps (0: the run's ``sample_steps``)."""
    with pytest.raises(UserError, match="validation_steps must be >= 0"):
        config_from_dict({**TINY, "prompts": "toy", "validation_steps": -1})
    seen = []
    for steps in (0, 7):
        tr = Trainer(cfg(prompt_files, validation_steps=steps), tmp_path / f"s{steps}")
        sampler, _ = tr._validation_sampler()
        real = type(sampler).sample

        def counted(self, *a, real=real, **k):
            seen.append(k["steps"])
            return real(self, *a, **k)

        monkeypatch.setattr(type(sampler), "sample", counted)
        tr._validation_rewards()
        monkeypatch.undo()
    assert seen[0] == TINY["sample_steps"] and seen[-1] == 7
