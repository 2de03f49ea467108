"""Importing reference runs (``pcpo-eval import``): fixtures written in each codebase's format.

* Flow-GRPO: a tiny SD3 transformer wrapped by peft (``get_peft_model``), its LoRA saved with
  ``save_pretrained`` at ``checkpoints/checkpoint-{step}/lora``, and a W&B history (both the CSV
  export and the offline ``run-*.wandb`` transaction log): the imported checkpoint, loaded by
  ``generate``'s loader on the base model, predicts exactly what the peft model predicts; epochs,
  rewards, PPO health and the held-out reward land on our epoch numbering.
* DanceGRPO: a tiny SD-1 UNet's full state dict in ``checkpoint_epoch_{E}/`` and ``reward.txt``; a
  ``reward.txt`` that two runs appended to (DanceGRPO opens it with ``'a'``) is refused, whether a
  marker line or only its length (past the last checkpoint) gives it away.
* Bad input: one line each.
"""

from __future__ import annotations

import json
from pathlib import Path

import numpy as np
import pandas as pd
import pytest
import torch
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.stats.select import select_checkpoints
from pcpo_eval.train.checkpoints import load_model_from_spec
from pcpo_eval.train.importers import (
    dancegrpo_append_problem,
    dancegrpo_reward_lines,
    import_run,
    read_history,
)

pytestmark = pytest.mark.filterwarnings("ignore::UserWarning", "ignore::DeprecationWarning")


def _history() -> pd.DataFrame:
    """Flow-GRPO's logging of 3 epochs with 2 updates each, eval every 2 epochs, save every 2 epochs."""
    rows, step = [], 0
    for epoch in range(3):
        if epoch % 2 == 0:
            rows.append({"_step": step, "eval_reward_avg": 0.30 + 0.1 * epoch})
        rows.append({"_step": step, "epoch": epoch, "reward_avg": 0.2 + 0.05 * epoch, "reward_ocr": 0.1})
        for _ in range(2):
            rows.append({"_step": step, "epoch": epoch, "inner_epoch": 0, "approx_kl": 1e-3 * (epoch + 1),
                         "clipfrac": 0.1 * (epoch + 1), "kl": 0.01, "policy_loss": -0.5})
            step += 1
    return pd.DataFrame(rows)


@pytest.fixture(scope="module")
def sd3_base(tmp_path_factory):
    from pcpo_eval.models.sd3 import tiny_sd3_pipeline

    folder = tmp_path_factory.mktemp("sd3")
    tiny_sd3_pipeline(seed=0).save_pretrained(folder)
    return folder


def _flowgrpo_run(root: Path, base: Path) -> tuple[Path, torch.nn.Module]:
    from diffusers import SD3Transformer2DModel
    from peft import LoraConfig, get_peft_model

    tr = SD3Transformer2DModel.from_pretrained(base / "transformer")
    peft_model = get_peft_model(tr, LoraConfig(r=4, lora_alpha=8, init_lora_weights="gaussian",
                                               target_modules=["to_k", "to_q", "to_v", "to_out.0"]))
    with torch.no_grad():
        for n, p in peft_model.named_parameters():
            if "lora_B" in n:
                p.normal_(0, 0.05, generator=torch.Generator().manual_seed(len(n)))
    peft_model.save_pretrained(root / "logs" / "checkpoints" / "checkpoint-4" / "lora")  # start of epoch 2
    _history().to_csv(root / "history.csv", index=False)
    return root / "logs", peft_model.eval()


def test_flowgrpo_lora_and_history_import_exactly(tmp_path, sd3_base):
    src, peft_model = _flowgrpo_run(tmp_path, sd3_base)
    out = tmp_path / "run"
    summary = import_run("flowgrpo", src, out, f"sd3:{sd3_base}", log=tmp_path / "history.csv")
    assert summary["checkpoints"] == [2] and summary["epochs"] == 3
    log = pd.read_parquet(out / "log.parquet")
    assert log["epoch"].tolist() == [1, 2, 3]
    assert log["reward_mean"].tolist() == pytest.approx([0.2, 0.25, 0.3])
    assert log["clipfrac"].tolist() == pytest.approx([0.1, 0.2, 0.3]) and log["approx_kl"].iloc[2] == pytest.approx(3e-3)
    # eval at the start of Flow-GRPO epoch 2 (step 4) = the policy after our epoch 2; epoch 0's eval is the base model
    assert np.isnan(log["val_reward_mean"].iloc[0]) and log["val_reward_mean"].iloc[1] == pytest.approx(0.5)
    adapter = load_model_from_spec(str(out / "checkpoints" / "epoch_0002"))
    cfg = adapter.denoiser.config
    g = torch.Generator().manual_seed(0)
    kw = dict(hidden_states=torch.randn(1, cfg.in_channels, 8, 8, generator=g), timestep=torch.tensor([500.0]),
              encoder_hidden_states=torch.randn(1, 7, cfg.joint_attention_dim, generator=g),
              pooled_projections=torch.randn(1, cfg.pooled_projection_dim, generator=g), return_dict=False)
    with torch.no_grad():
        ours, ref = adapter.denoiser(**kw)[0], peft_model(**kw)[0]
        base = peft_model.get_base_model()
        with peft_model.disable_adapter():
            plain = base(**kw)[0]
    assert torch.allclose(ours, ref, atol=1e-5) and not torch.allclose(ours, plain, atol=1e-4)
    # selection on the imported held-out reward works like on a run trained here
    sel = select_checkpoints([out], target=0.45, window=1, on="eval").choices[0]
    assert sel.epoch == 2 and sel.reached


def test_flowgrpo_history_from_the_wandb_transaction_log(tmp_path, monkeypatch):
    wandb = pytest.importorskip("wandb")
    monkeypatch.setenv("WANDB_SILENT", "true")
    run = wandb.init(project="flow", dir=str(tmp_path), mode="offline")
    for _, row in _history().iterrows():
        data = {k: float(v) for k, v in row.items() if k != "_step" and pd.notna(v)}
        run.log(data, step=int(row["_step"]))
    run.finish()
    # the transaction log is written by wandb's service process: once it is shut down, every record
    # is on disk (a full-suite run once read the file before its history records were written)
    wandb.teardown()
    (log,) = list(tmp_path.glob("wandb/offline-run-*/run-*.wandb"))
    hist = read_history(log)
    assert {"_step", "epoch", "reward_avg", "eval_reward_avg", "clipfrac"} <= set(hist.columns)
    csv = _history()
    assert sorted(hist["reward_avg"].dropna()) == pytest.approx(sorted(csv["reward_avg"].dropna()))


def test_dancegrpo_full_weights_and_reward_txt(tmp_path):
    from safetensors.torch import save_file

    from pcpo_eval.testing import save_tiny_sd1

    base = save_tiny_sd1(tmp_path / "sd1", seed=0)
    from diffusers import UNet2DConditionModel

    unet = UNet2DConditionModel.from_pretrained(base / "unet")
    with torch.no_grad():
        for p in unet.parameters():
            p.add_(0.01)
    ck = tmp_path / "dance" / "my_checkpoints" / "checkpoint_epoch_2"  # saved after its epoch 2 = our epoch 3
    ck.mkdir(parents=True)
    save_file({k: v.contiguous() for k, v in unet.state_dict().items()}, ck / "diffusion_pytorch_model.safetensors")
    (ck / "config.json").write_text(json.dumps(dict(unet.config), default=str))
    (tmp_path / "dance" / "reward.txt").write_text("0.31\n0.33\n0.36\n0.35\n")
    out = tmp_path / "run"
    summary = import_run("dancegrpo", tmp_path / "dance", out, f"sd1:{base}", reward=" hps ")
    assert summary["checkpoints"] == [3] and summary["epochs"] == 4
    assert yaml.safe_load((out / "config.yaml").read_text())["reward"] == "hps"  # a study compares it
    assert pd.read_parquet(out / "log.parquet")["reward_mean"].tolist() == pytest.approx([0.31, 0.33, 0.36, 0.35])
    adapter = load_model_from_spec(str(out / "checkpoints" / "epoch_0003"))
    for (n, a), (_, b) in zip(adapter.denoiser.state_dict().items(), unet.state_dict().items(), strict=True):
        assert torch.equal(a, b), n
    meta = json.loads((out / "checkpoints" / "epoch_0003" / "checkpoint.json").read_text())
    assert meta["reward_mean"] == pytest.approx(0.36) and meta["imported_from"]["kind"] == "dancegrpo"
    assert json.loads((out / "inputs.json").read_text()) == {"model": {"value": f"sd1:{base}",
                                                                       "resolved": f"sd1:{base.resolve()}"}}


def test_bad_imports_are_one_line(tmp_path, cli):
    (tmp_path / "empty").mkdir()
    cases = [
        (["import", "nope", tmp_path, "--out", tmp_path / "r", "--model", "toy"], "unknown run kind 'nope'"),
        (["import", "flowgrpo", tmp_path / "empty", "--out", tmp_path / "r", "--model", "toy"], "no W&B log under"),
        (["import", "dancegrpo", tmp_path / "empty", "--out", tmp_path / "r", "--model", "toy"], "reward.txt"),
    ]
    (tmp_path / "bad.txt").write_text("0.3\nabc\n")
    cases.append((["import", "dancegrpo", tmp_path / "empty", "--out", tmp_path / "r", "--model", "toy",
                   "--log", tmp_path / "bad.txt"], "line 2: 'abc' is not a number"))
    cases.append((["import", "dancegrpo", tmp_path / "empty", "--out", tmp_path / "r", "--model", "toy",
                   "--reward", "{hps: x}"], "reward weight 'hps': 'x' is not a finite number"))
    for argv, needle in cases:
        res = cli(*argv)
        lines = res.stderr.strip().splitlines()
        assert res.returncode == 2 and len(lines) == 1 and needle in lines[0], (argv, res.stderr)
    assert not (tmp_path / "r" / "log.parquet").exists()


def test_flowgrpo_history_missing_epochs_is_refused():
    """W&B's run.history() returns a sample of the rows (500 by default): an export of a long run lacks the
    reward of some epochs, and the import numbered what was left as if nothing were missing between."""
    from pcpo_eval.errors import UserError
    from pcpo_eval.train.importers import flowgrpo_epochs

    hist = _history()
    assert flowgrpo_epochs(hist)["epoch"].tolist() == [1, 2, 3]
    sampled = hist[~((hist["epoch"] == 1) & hist["reward_avg"].notna())]
    with pytest.raises(UserError, match=r"no reward_avg for 1 Flow-GRPO epoch\(s\) \(1\) of 0..2: .*run.scan_history"):
        flowgrpo_epochs(sampled)


# ---- reward.txt that more than one run appended to ----


def _reward_txt(tmp_path: Path, text: str) -> Path:
    path = tmp_path / "reward.txt"
    path.write_text(text)
    return path


def test_reward_txt_of_one_run_reads_every_line(tmp_path):
    table, lines = dancegrpo_reward_lines(_reward_txt(tmp_path, "\n0.31\n0.33\n-1.5e-2\n\n\n"))
    assert table["epoch"].tolist() == [1, 2, 3] and table["reward_mean"].tolist() == pytest.approx([0.31, 0.33, -0.015])
    assert lines == (2, 4)  # leading / trailing blank lines are not boundaries


@pytest.mark.parametrize(("text", "needle"), [
    ("0.31\n0.33\nreward\n0.30\n", r"line 3 is not a number \('reward'\) and splits the file into 2 blocks of "
                                      r"rewards \(2, 1 lines\).*--log with this run's lines only.*--last-run to import "
                                      r"the 1 rewards after line 3"),
    ("0.31\n0.33\n\n0.30\n0.32\n", r"line 3 is blank and splits the file into 2 blocks of rewards \(2, 2 lines\)"),
    # a mixture of header lines: one before each appended run, blank lines around them
    ("0.31\n\n# run 2\n0.30\n0.32\n\nreward\n0.29\n", r"line 7 is not a number \('reward'\).* 3 blocks "
                                                         r"of rewards \(1, 2, 1 lines\)"),
])
def test_reward_txt_with_a_boundary_between_runs_is_refused(tmp_path, text, needle):
    """DanceGRPO writes one number per line and nothing else: a text or blank line between rewards is where
    another run's lines were appended (or the file was damaged), not something to skip silently."""
    with pytest.raises(UserError, match=needle):
        dancegrpo_reward_lines(_reward_txt(tmp_path, text))


def test_reward_txt_last_run_reads_the_block_after_the_last_boundary(tmp_path):
    table, lines = dancegrpo_reward_lines(_reward_txt(tmp_path, "0.31\n\n# run 2\n0.30\n0.32\n\nreward\n0.29\n0.4\n"),
                                          last_run=True)
    assert table["epoch"].tolist() == [1, 2] and table["reward_mean"].tolist() == pytest.approx([0.29, 0.4])
    assert lines == (8, 9)
    with pytest.raises(UserError, match="--last-run: .* has no text or blank line between its rewards.*--log"):
        dancegrpo_reward_lines(_reward_txt(tmp_path, "0.31\n0.33\n0.30\n"), last_run=True)


@pytest.mark.parametrize("text", ["reward\n0.31\n", "0.31\n0.32\nabc\n"])
def test_reward_txt_text_outside_the_rewards_is_not_a_number(tmp_path, text):
    with pytest.raises(UserError, match=r"line \d: '(reward|abc)' is not a number"):
        dancegrpo_reward_lines(_reward_txt(tmp_path, text))


def test_append_problem_bounds_lines_past_the_last_checkpoint():
    """One run ends at most one save interval after its last checkpoint (SD: saved after rounds f, 2f, ...
    = our epochs f + 1, ...; FLUX: before steps f, 2f, ... = our epochs f - 1, ...)."""
    sd = {e + 1: Path(f"checkpoint_epoch_{e}") for e in (10, 20, 30)}
    assert dancegrpo_append_problem(31, sd) is None and dancegrpo_append_problem(41, sd) is None
    problem = dancegrpo_append_problem(42, sd)
    assert problem == ("it has 42 rewards, 11 past the last checkpoint (checkpoint_epoch_30, our epoch 31), but with "
                       "checkpoints every 10 epochs one run writes at most 10 past its last")
    flux = {s - 1: Path(f"checkpoint-{s}-0") for s in (5, 10)}
    assert dancegrpo_append_problem(14, flux) is None
    assert "every 5 steps" in dancegrpo_append_problem(15, flux)
    # checkpoints left out: the interval is a multiple of the save interval, and the bound looser
    sparse = {21: Path("checkpoint_epoch_20"), 41: Path("checkpoint_epoch_40")}  # every other one copied
    assert dancegrpo_append_problem(61, sparse) is None and "every 20 epochs" in dancegrpo_append_problem(62, sparse)


def _dance_src(tmp_path: Path, reward: str, epochs=(2, 4), state=None) -> Path:
    from safetensors.torch import save_file

    src = tmp_path / "dance"
    for e in epochs:
        ck = src / "my_checkpoints" / f"checkpoint_epoch_{e}"
        ck.mkdir(parents=True)
        save_file(state or {"w": torch.zeros(2)}, ck / "diffusion_pytorch_model.safetensors")
    (src / "reward.txt").write_text(reward)
    return src


def test_import_refuses_an_appended_reward_txt(tmp_path, cli):
    """Checkpoints every 2 epochs up to our epoch 5: one run writes at most 7 lines; 10 lines are two runs'
    (or this run's later checkpoints are missing). One ``error:`` line, exit 2, nothing written."""
    src = _dance_src(tmp_path, "".join(f"0.3{i}\n" for i in range(10)))
    out = tmp_path / "run"
    res = cli("import", "dancegrpo", src, "--out", out, "--model", "toy")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 2 and len(lines) == 1 and lines[0].startswith("error: "), res.stderr
    for needle in ["reward.txt: it has 10 rewards, 5 past the last checkpoint (checkpoint_epoch_4, our epoch 5)",
                   "checkpoints every 2 epochs", "append mode", "--log with this run's lines only", "--single-run"]:
        assert needle in lines[0], lines[0]
    (src / "reward.txt").write_text("0.30\n0.31\n0.32\n0.33\n0.34\nreward\n0.35\n")
    res = cli("import", "dancegrpo", src, "--out", out, "--model", "toy")
    assert res.returncode == 2 and "line 6 is not a number ('reward')" in res.stderr and "--last-run" in res.stderr
    res = cli("import", "flowgrpo", src, "--out", out, "--model", "toy", "--last-run")
    assert res.returncode == 2 and "--last-run is for DanceGRPO's reward.txt" in res.stderr
    assert not out.exists()


def test_import_last_run_and_single_run(tmp_path, cli):
    from diffusers import UNet2DConditionModel

    from pcpo_eval.testing import save_tiny_sd1

    base = save_tiny_sd1(tmp_path / "sd1", seed=0)
    state = {k: v.contiguous() for k, v in UNet2DConditionModel.from_pretrained(base / "unet").state_dict().items()}
    src = _dance_src(tmp_path, "0.1\n0.2\n# resumed\n0.30\n0.31\n0.32\n0.33\n0.34\n0.35\n", state=state)
    res = cli("import", "dancegrpo", src, "--out", tmp_path / "last", "--model", f"sd1:{base}", "--last-run", "--json")
    assert res.returncode == 0, res.stderr
    summary = json.loads(res.stdout)
    assert summary["log_lines"] == [4, 9] and summary["last_run"] and summary["checkpoints"] == [3, 5]
    assert pd.read_parquet(tmp_path / "last" / "log.parquet")["reward_mean"].tolist() == pytest.approx(
        [0.30, 0.31, 0.32, 0.33, 0.34, 0.35])
    (src / "reward.txt").write_text("".join(f"0.3{i}\n" for i in range(10)))  # a run whose checkpoints stop at 5
    res = cli("import", "dancegrpo", src, "--out", tmp_path / "one", "--model", f"sd1:{base}", "--single-run", "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["log_lines"] == [1, 10] and json.loads(res.stdout)["epochs"] == 10


def test_import_refuses_a_folder_of_other_files_and_an_unknown_reward(tmp_path, cli):
    """``import --out SRC`` wrote the run into the reference run's own folder (and over a user's
    ``import.json`` / ``inputs.json`` elsewhere); ``--reward nosuch`` was recorded for a study to compare."""
    src = _dance_src(tmp_path, "0.30\n0.31\n0.32\n0.33\n0.34\n")
    before = sorted(p.relative_to(src) for p in src.rglob("*"))
    res = cli("import", "dancegrpo", src, "--out", src, "--model", "toy")
    assert res.returncode == 2 and "holds files that are not an imported run's" in res.stderr, res.stderr
    assert sorted(p.relative_to(src) for p in src.rglob("*")) == before
    mine = tmp_path / "mine"
    mine.mkdir()
    (mine / "import.json").write_text("my notes")
    (mine / "notes.txt").write_text("x")
    res = cli("import", "dancegrpo", src, "--out", mine, "--model", "toy")
    assert res.returncode == 2 and (mine / "import.json").read_text() == "my notes"
    res = cli("import", "dancegrpo", src, "--out", tmp_path / "run", "--model", "toy", "--reward", "nosuch")
    assert res.returncode == 2 and res.stderr.startswith("error: unknown reward 'nosuch'") and not (tmp_path / "run").exists()
