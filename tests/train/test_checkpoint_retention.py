"""Checkpoint retention (``keep_checkpoints``; training state in the newest checkpoint only) and the
train progress bar (stderr only, when asked)."""

from __future__ import annotations

import json
from pathlib import Path

import pandas as pd
import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY as TINY_TRAIN

TOY_CFG = Path(__file__).resolve().parents[2] / "train" / "configs" / "toy_pcpo.yaml"
TINY = {**TINY_TRAIN, "sample_steps": 3, "sample_batch_size": 2, "log_to": "none", "log_images_every": 0,
        "device": "cpu"}


def tiny(**kw):
    return config_from_dict({**TINY, **kw})


def _names(run) -> list[str]:
    return [p.name for p in ck.list_checkpoints(run)]


def _has_state(run) -> list[str]:
    return [p.name for p in ck.list_checkpoints(run) if (p / ck.STATE_FILE).is_file()]


def test_apply_retention_deletes_the_oldest_and_strips_state(tmp_path):
    run = tmp_path / "run"
    for e in (1, 2, 3, 5):
        d = ck.checkpoint_dir(run, e)
        d.mkdir(parents=True)
        (d / ck.META_FILE).write_text(json.dumps({"epoch": e}))
        (d / ck.STATE_FILE).write_bytes(b"state")
        (d / ck.LORA_FILE).write_bytes(b"w")
    ck.checkpoint_dir(run, 9).mkdir()  # incomplete (no checkpoint.json): neither counted nor touched
    gone = ck.apply_retention(run, 2)
    assert [p.name for p in gone] == ["epoch_0001", "epoch_0002"]
    assert _names(run) == ["epoch_0003", "epoch_0005"] and _has_state(run) == ["epoch_0005"]
    assert (ck.checkpoint_dir(run, 3) / ck.LORA_FILE).is_file() and ck.checkpoint_dir(run, 9).is_dir()
    assert not ck.checkpoint_dir(run, 1).exists()
    assert ck.apply_retention(run, 0) == [] and _names(run) == ["epoch_0003", "epoch_0005"]
    assert ck.retained([5, 1, 3], 2) == [3, 5] and ck.retained([5, 1, 3], 0) == [1, 3, 5]


def test_keep_checkpoints_trains_resumes_and_matches_an_uninterrupted_run(tmp_path):
    """keep_checkpoints=2: after 3 epochs E2, E3 remain (state in E3 only; E2 still loads for generation);
    resuming to 4 epochs gives E3, E4 and the same weights as an uninterrupted 4-epoch run keeping all."""
    full = Trainer(tiny(epochs=4), tmp_path / "full", progress=False).run()
    assert _names(tmp_path / "full") == [f"epoch_000{e}" for e in (1, 2, 3, 4)]
    assert _has_state(tmp_path / "full") == ["epoch_0004"]  # default: every checkpoint, state in the newest
    part = tmp_path / "part"
    Trainer(tiny(epochs=3, keep_checkpoints=2), part, progress=False).run()
    assert _names(part) == ["epoch_0002", "epoch_0003"] and _has_state(part) == ["epoch_0003"]
    model = ck.load_model_from_spec(str(ck.checkpoint_dir(part, 2)))  # weights + metadata suffice
    assert model.spec.endswith("epoch_0002")
    with pytest.raises(UserError, match="only a run's newest checkpoint keeps its optimizer state"):
        ck.load_training_state(ck.checkpoint_dir(part, 2))
    resumed = Trainer(tiny(epochs=4, keep_checkpoints=2), part, resume=True, progress=False).run()
    assert _names(part) == ["epoch_0003", "epoch_0004"] and _has_state(part) == ["epoch_0004"]
    cols = ["epoch", "reward_mean", "loss", "grad_norm"]
    pd.testing.assert_frame_equal(full[cols], resumed[cols])
    from safetensors.torch import load_file

    a = load_file(str(ck.checkpoint_dir(tmp_path / "full", 4) / ck.LORA_FILE))
    b = load_file(str(ck.checkpoint_dir(part, 4) / ck.LORA_FILE))
    assert a.keys() == b.keys() and all(torch.equal(a[k], b[k]) for k in a)


@pytest.mark.parametrize("value", ["-1", "-3"])
def test_negative_keep_checkpoints_is_one_line(cli, tmp_path, value):
    from pcpo_eval.train.config import TrainConfig

    with pytest.raises(UserError, match="keep_checkpoints must be >= 0"):
        TrainConfig(keep_checkpoints=int(value)).validate()
    res = cli("train", "--out", tmp_path / "run", TOY_CFG, f"keep_checkpoints={value}")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1 and "keep_checkpoints must be >= 0" in res.stderr
    assert not (tmp_path / "run").exists()


@pytest.mark.parametrize("flag", [True, False])
def test_train_progress_bar_on_stderr_only_when_enabled(tmp_path, capsys, flag):
    Trainer(tiny(epochs=2), tmp_path / "run", progress=flag).run()
    out = capsys.readouterr()
    assert "epoch    1  reward" in out.out and "epoch    2  reward" in out.out
    assert "train:" not in out.out and "it/s" not in out.out and "epoch/s" not in out.out
    if flag:
        assert "train: 100%" in out.err and "2/2" in out.err
    else:
        assert "train:" not in out.err
