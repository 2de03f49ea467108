"""Outputs never overwrite the inputs they name, and more bad input is one error line (a CLI review's cases).

Each case failed before its fix: it exited 0 having replaced the input, or gave a traceback."""

from __future__ import annotations

import pandas as pd
import pytest

from pcpo_eval.errors import UserError
from tests.support.human import make_human_dir
from tests.support.study import write_run


def _unchanged(path):
    before = path.read_bytes()
    return lambda: path.read_bytes() == before


def test_select_output_is_not_the_matched_to_runs_log(cli, tmp_path):
    write_run(tmp_path / "a", 6, 0.1, 2)
    write_run(tmp_path / "b", 6, 0.2, 2)
    log = tmp_path / "b" / "log.parquet"
    same = _unchanged(log)
    res = cli("select", tmp_path / "a", "--target", "0.3", "--matched-to", tmp_path / "b", "--output", log)
    assert res.returncode == 2 and res.stderr.startswith("error: --output") and same()


def test_human_export_is_not_written_over_its_database(cli, tmp_path):
    layout = make_human_dir(tmp_path / "h", n_prompts=3, n_seeds=2, n_checks=2)
    db = tmp_path / "elsewhere.db"
    url = f"sqlite:///{db}"
    assert cli("human", "raters", layout.root, "--add", "ann", "--database-url", url,
               "--base-url", "http://127.0.0.1:8000").returncode == 0
    same = _unchanged(db)
    res = cli("human", "export", layout.root, "--database-url", url, "-o", db)
    assert res.returncode == 2 and "an input of this command" in res.stderr and same()


def test_lmm_output_and_qq_must_differ_and_groups_need_repeats(cli, tmp_path):
    d = tmp_path / "d.csv"
    pd.DataFrame({"fid": [1.0, 2.0, 3.5, 4.0, 1.5, 2.5], "algorithm": list("ababab"), "prompt": [0, 0, 1, 1, 2, 2],
                  "obs": range(6)}).to_csv(d, index=False)
    res = cli("lmm", d, "--formula", "fid ~ algorithm", "--group", "prompt", "--output", tmp_path / "x.png",
              "--qq", tmp_path / "x.png")
    assert res.returncode == 2 and "different names" in res.stderr and not (tmp_path / "x.png").exists()
    res = cli("lmm", d, "--formula", "fid ~ algorithm", "--group", "obs")
    assert res.returncode == 2 and "more than one observation" in res.stderr and res.stderr.count("\n") == 1


@pytest.mark.parametrize("device", ["mps", "xpu", "meta"])
def test_unsupported_device_types_are_one_line(device):
    from pcpo_eval.dist import resolve_device

    with pytest.raises(UserError, match=f"device type '{device}' is not supported"):
        resolve_device(device)


def test_ddim_timesteps_beyond_the_training_range_are_refused():
    from pcpo_eval.credit.ddim import SD1_DDIM_CONFIG, ddim_schedule

    with pytest.raises(UserError, match="beyond num_train_timesteps"):
        ddim_schedule({**SD1_DDIM_CONFIG, "steps_offset": 5000}, 20, 1.0)


def test_a_human_design_out_with_foreign_files_is_refused_untouched(tmp_path):
    from pcpo_eval.human import HumanLayout
    from pcpo_eval.human.design import HumanDesignSpec, _check_design_folder, _check_seed_room

    out = tmp_path / "notes"
    out.mkdir()
    (out / "notes.txt").write_text("mine")
    mode = out.stat().st_mode
    with pytest.raises(UserError, match="not a human design's"):
        _check_design_folder(HumanLayout(out))
    assert out.stat().st_mode == mode
    with pytest.raises(UserError, match="lower seeds"):
        _check_seed_room(2, HumanDesignSpec(seeds=100_000_000))
    _check_seed_room(2, HumanDesignSpec(seeds=10))


def test_a_new_run_never_writes_among_other_files(cli, tmp_path):
    """train --out wrote a run into any folder without log.parquet: an image set, a user's folder (its own
    config.yaml replaced, comments gone). Now refused; a run folder interrupted before its first log restarts."""
    from tests.support.cli import TOY_CFG

    user = tmp_path / "user"
    user.mkdir()
    (user / "notes.txt").write_text("mine")
    res = cli("train", TOY_CFG, "--out", user, "epochs=1")
    assert res.returncode == 2 and "not a run's (e.g. notes.txt)" in res.stderr
    assert sorted(p.name for p in user.iterdir()) == ["notes.txt"]
    mine = tmp_path / "own"
    mine.mkdir()
    (mine / "config.yaml").write_text(TOY_CFG.read_text() + "# my comments\n")
    same = _unchanged(mine / "config.yaml")
    res = cli("train", mine / "config.yaml", "--out", mine, "epochs=1")
    assert res.returncode == 2 and "the run's own config.yaml" in res.stderr and same()


def test_a_run_stopped_before_its_first_checkpoint_starts_again(tmp_path):
    """Stopped after its first logged epoch, before any checkpoint: --resume said "no complete checkpoint;
    start without --resume", and starting without it said "already holds a run; pass --resume". It now starts
    again without --resume (its partial log replaced); a run with a checkpoint still needs --resume."""
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import Trainer
    from tests.support.cli import TOY_CFG

    cfg = load_config(TOY_CFG, ["epochs=1", "checkpoint_every=5", "log_to=none", "sample_batches_per_epoch=1"])
    out = tmp_path / "run"
    Trainer(cfg, out).run()
    ckpts = out / "checkpoints"
    for d in sorted(ckpts.iterdir()) if ckpts.exists() else []:  # as if stopped before the checkpoint
        import shutil

        shutil.rmtree(d)
    assert (out / "log.parquet").exists()
    with pytest.raises(UserError, match="no complete checkpoint"):
        Trainer(cfg, out, resume=True)
    log = Trainer(cfg, out).run()  # starts again
    assert list(log["epoch"]) == [1]
    with pytest.raises(UserError, match="already holds a run"):
        Trainer(cfg, out)


def test_a_micro_batch_that_cannot_fit_is_refused_before_the_set_exists(cli, tmp_path):
    res = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2",
              "--micro-batch", "1000000000", "--out", tmp_path / "set", "--no-progress")
    assert res.returncode == 2 and "--micro-batch 1000000000 cannot fit" in res.stderr
    assert not (tmp_path / "set").exists()


@pytest.mark.parametrize("args, msg", [
    (["generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--cfg", "-1e308", "--out", "{tmp}/s"],
     "--cfg -1e+308; use a finite guidance weight within"),
    (["credit", "flow", "--eta", "1e300"], "--eta must be a number in (0, 100]"),
])
def test_huge_but_finite_numbers_are_refused(cli, tmp_path, args, msg):
    """A guidance weight of -1e308 rendered black images and an eta of 1e300 printed inf / NaN, both exit 0."""
    res = cli(*[a.replace("{tmp}", str(tmp_path)) for a in args])
    assert res.returncode == 2 and msg in res.stderr and res.stderr.count("\n") == 1
    assert not (tmp_path / "s").exists()


def test_small_bad_inputs(cli, tmp_path):
    """`study --stages ,` ran nothing with exit 0; `toy-flow pretrain --seed -1` was taken; a corrupt set.json
    was read as a hand-made set's absence of one."""
    res = cli("study", "analysis/toy_study.yaml", "--out", tmp_path / "st", "--stages", ",")
    assert res.returncode == 2 and "names no stage" in res.stderr and not (tmp_path / "st").exists()
    res = cli("toy-flow", "pretrain", "--seed", "-1", "--out", tmp_path / "w")
    assert res.returncode == 2 and "--seed must be >= 0" in res.stderr
    assert cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2", "--steps", "2",
               "--out", tmp_path / "set", "--no-progress").returncode == 0
    (tmp_path / "set" / "set.json").write_text("{not json")
    res = cli("metrics", tmp_path / "set", "--metrics", "is_toy", "--is-splits", "1", "--out", tmp_path / "m")
    assert res.returncode == 2 and "set.json is not readable JSON" in res.stderr


def test_an_irg_sweep_never_writes_among_other_files(tmp_path):
    from pcpo_eval.study.irg_sweep import _check_sweep_folder

    (tmp_path / "run").mkdir()
    (tmp_path / "run" / "log.parquet").write_bytes(b"a run's log")
    with pytest.raises(UserError, match="not an IRG sweep's"):
        _check_sweep_folder(tmp_path / "run")
    (tmp_path / "sweep" / "sets").mkdir(parents=True)
    _check_sweep_folder(tmp_path / "sweep")  # its own (a resumed sweep)
