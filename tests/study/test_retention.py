"""A study spec whose keep_checkpoints would delete a checkpoint it selects is refused (one line, exit 2)."""

from __future__ import annotations

from pathlib import Path

import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.study.retention import kept_epochs, saved_epochs
from pcpo_eval.study.spec import load_spec
from pcpo_eval.train.config import TrainConfig

ROOT = Path(__file__).resolve().parents[2]
SPEC = ROOT / "analysis" / "toy_study.yaml"


def _spec(tmp_path: Path, **overrides) -> Path:
    data = yaml.safe_load(SPEC.read_text())
    data["train"]["overrides"].update(overrides)
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    return path


def test_saved_and_kept_epochs():
    cfg = TrainConfig(epochs=25, checkpoint_every=10, keep_checkpoints=2)
    assert saved_epochs(cfg) == [10, 20, 25] and kept_epochs(cfg) == [20, 25]
    assert kept_epochs(TrainConfig(epochs=3, keep_checkpoints=0)) == [1, 2, 3]


def test_keep_checkpoints_that_deletes_a_selected_epoch_is_refused(tmp_path, cli):
    path = _spec(tmp_path, keep_checkpoints=3)  # 24 epochs, every 2: 12 checkpoints, 3 kept
    with pytest.raises(UserError, match="keep_checkpoints would delete checkpoints this study selects") as exc:
        load_spec(path, check_weights=False)
    msg = str(exc.value)
    assert "keeps only E20, E22, E24 of its 12 checkpoints" in msg and "reward-matched selection" in msg
    assert "keep_checkpoints: 0" in msg and ">= 12" in msg
    res = cli("study", path, "--out", tmp_path / "out")
    assert res.returncode == 2, res.stderr
    assert res.stderr.startswith("error: ") and res.stderr.count("\n") == 1
    assert "keep_checkpoints would delete" in res.stderr and not (tmp_path / "out").exists()


def test_explicit_epochs_are_named(tmp_path):
    data = yaml.safe_load(SPEC.read_text())
    data["train"]["overrides"]["keep_checkpoints"] = 2
    data["select_epoch"] = 10
    data["grid"] = {"prompts": 2, "seeds": 2, "epochs": 12}
    path = tmp_path / "spec.yaml"
    path.write_text(yaml.safe_dump(data, sort_keys=False))
    with pytest.raises(UserError, match="select_epoch E10, grid.epochs E12, reward-matched"):
        load_spec(path, check_weights=False)


@pytest.mark.parametrize("keep", [0, 12, 20])
def test_keep_checkpoints_that_keeps_every_saved_epoch_is_accepted(tmp_path, keep):
    sp = load_spec(_spec(tmp_path, keep_checkpoints=keep), check_weights=False)
    assert all(r.train.keep_checkpoints == keep for r in sp.runs if r.train is not None)
