"""``RUN/inputs.json``: the trainer records what each file-valued setting named when the run started
(resolved path, content sha256), and refuses a resume whose prompt file changed since."""

from __future__ import annotations

import json

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.io import sha256_file
from pcpo_eval.rundir import inputs_path
from pcpo_eval.train.config import config_from_dict
from pcpo_eval.train.inputs import FileSetting, file_settings, input_record, read_inputs
from pcpo_eval.train.trainer import Trainer
from tests.support.train import TINY


def test_trainer_records_its_prompt_file_and_refuses_a_resume_after_an_edit(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "p").mkdir()
    (tmp_path / "p" / "x.txt").write_text("red circle\nblue square\n")
    cfg = {**TINY, "epochs": 1, "prompts": "p/x.txt", "log_to": "none"}
    Trainer(config_from_dict(cfg), tmp_path / "run").run()
    rec = json.loads(inputs_path(tmp_path / "run").read_text())
    assert rec == {"prompts": {"value": "p/x.txt", "resolved": str(tmp_path / "p" / "x.txt"),
                               "sha256": sha256_file(tmp_path / "p" / "x.txt")}}  # model toy: a name, no entry
    (tmp_path / "p" / "x.txt").write_text("red circle\nred circle\n")
    with pytest.raises(UserError, match=r"--resume: prompts p/x.txt \(sha256 \w{12} when the run started, now "
                                        r"\w{12}\): the resumed epochs would train on other inputs"):
        Trainer(config_from_dict({**cfg, "epochs": 2}), tmp_path / "run", resume=True)


def test_file_settings_prefer_the_record_then_the_path_then_the_text(tmp_path, monkeypatch):
    monkeypatch.chdir(tmp_path)
    (tmp_path / "x.txt").write_text("a\n")
    now = input_record({"prompts": "x.txt", "model": f"toy:{tmp_path}", "validation_prompts": "toy"})
    assert now["model"] == {"value": f"toy:{tmp_path}", "resolved": f"toy:{tmp_path}"}  # a folder: its path only
    assert set(now) == {"prompts", "model"}  # toy: a built-in set's name
    trained = file_settings({"prompts": "x.txt", "seed": 0}, read_now=True)
    assert trained == {"prompts": FileSetting("x.txt", str(tmp_path / "x.txt"), sha256_file(tmp_path / "x.txt")),
                       "seed": 0}
    old = file_settings({"prompts": "./x.txt"})  # a run from before inputs.json: the path, content unknown
    assert old["prompts"].sha256 is None and old["prompts"].same_input(trained["prompts"])
    gone = file_settings({"prompts": "other/x.txt"})  # not found here: the text, as before
    assert gone["prompts"] == "other/x.txt"
    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "inputs.json").write_text(json.dumps({"prompts": {**now["prompts"], "sha256": "f" * 64}}))
    rec = file_settings({"prompts": "x.txt"}, read_inputs(tmp_path / "run"))["prompts"]
    assert rec.sha256 == "f" * 64 and not rec.same_input(trained["prompts"])
