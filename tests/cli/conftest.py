"""Fixtures of the CLI tests: ``box`` (the folder a rejected command must leave unchanged) and
``toy_run`` (a run folder with a real toy LoRA checkpoint and its training state)."""

from __future__ import annotations

from pathlib import Path

import pytest
import torch
import yaml

from tests.support.cli import RESUME_OVERRIDES, TOY_CFG


@pytest.fixture
def box(tmp_path) -> Path:
    """A folder with spaces and non-ASCII characters in its name, holding small input files."""
    b = tmp_path / "in put ü ñ 数据"
    b.mkdir()
    (b / "plain file").write_text("not a folder")
    (b / "bad.yaml").write_text("a: [1,\n")
    (b / "list.yaml").write_text("- 1\n- 2\n")
    (b / "unknown.yaml").write_text("model: toy\nbogus_key: 1\n")
    (b / "type.yaml").write_text("epochs: many\n")
    (b / "range.yaml").write_text("epochs: 0\n")
    (b / "nan.yaml").write_text("cfg: .nan\n")
    (b / "latin1.yaml").write_bytes("model: caf\xe9\n".encode("latin-1"))
    (b / "empty prompts.txt").write_text("")
    (b / "noprompt.csv").write_text("a,b\n1,2\n")
    rows = "".join(f"{i % 3 + 1.5 * (i % 2)},{'ab'[i % 2]},{i // 2}\n" for i in range(8))
    (b / "ok ü.csv").write_text("y,x,g\n" + rows)
    (b / "nan.csv").write_text("y,x,g\n1,a,1\n2,b,1\nnan,a,2\n4,b,2\n")
    (b / "inf.csv").write_text("y,x,g\n1,a,1\n2,b,1\ninf,a,2\n4,b,2\n")
    (b / "header only.csv").write_text("y,x,g\n")
    (b / "ragged.csv").write_text("y,x,g\n1,2\n1,2,3,4,5\n")
    (b / "garbage.parquet").write_bytes(b"garbage")
    (b / "sched.json").write_text('{"beta_start": ')
    return b



@pytest.fixture(scope="module")
def toy_run(tmp_path_factory) -> Path:
    """A run directory: config.yaml and one LoRA checkpoint of the toy UNet with its training state."""
    from pcpo_eval.models.registry import load_model
    from pcpo_eval.train.checkpoints import save_checkpoint
    from pcpo_eval.train.config import load_config

    adapter = load_model("toy")
    adapter.add_lora(rank=2, alpha=2.0)
    opt = torch.optim.AdamW(adapter.trainable_parameters(), lr=1e-3)
    run = tmp_path_factory.mktemp("run") / "run"
    run.mkdir()
    cfg = load_config(TOY_CFG, RESUME_OVERRIDES)
    (run / "config.yaml").write_text(yaml.safe_dump(cfg.to_dict()))
    state = {"epoch": 1, "optimizer": opt.state_dict(), "tracker": {}}
    save_checkpoint(run / "checkpoints" / "epoch_0001", adapter.denoiser, {"epoch": 1, "model": "toy"}, state)
    return run
