"""Outputs two processes could write at once, and advice that loses data (a red-team review of train, export,
metrics and the command line).

Found: two ``train`` runs into one ``--out`` both exited 0 with their checkpoints interleaved; a run folder with
checkpoints but no log was overwritten by a new run; two ``export``s into one folder both "wrote" it (a user's
file written there meanwhile was deleted); two ``metrics`` runs of different sets into one ``--out`` kept one set's
results under the other's check; the damaged-resume advice ("delete that checkpoint folder to resume from the one
before it") pointed at a checkpoint without training state; ``export`` and ``generate`` took weights that no longer
matched their recorded hash; a single-valued flag given twice silently took the last value."""

from __future__ import annotations

import shutil

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_dir
from pcpo_eval.rundir import RUN_LOCK
from pcpo_eval.train.checkpoints import lock_run
from tests.support.cli import RESUME_OVERRIDES, TOY_CFG


def _one_error(res, *needles: str) -> None:
    assert res.returncode == 2 and res.stderr.startswith("error: ") and res.stderr.count("\n") == 1, res
    for n in needles:
        assert n in res.stderr, (n, res.stderr)


def test_a_run_being_trained_is_not_trained_again(cli, box, toy_run):
    run = shutil.copytree(toy_run, box / "run")
    held = lock_run(run)  # what a `train` in flight holds (flock: per open file, so this process counts as another)
    try:
        before = sorted(p.name for p in run.rglob("*"))
        for args in (("--resume",), ()):
            _one_error(cli("train", TOY_CFG, "--out", run, *args, *RESUME_OVERRIDES),
                       f"run folder {run} is being trained by another pcpo-eval process (pid")
        assert sorted(p.name for p in run.rglob("*")) == before
    finally:
        held.close()
    fresh = box / "fresh"
    held = lock_run(fresh)
    held.close()
    assert (fresh / RUN_LOCK).exists()  # a lock file left by a finished (or killed) run is no foreign entry


def test_a_failed_new_run_leaves_no_folder(cli, box):
    out = box / "new"
    _one_error(cli("train", TOY_CFG, "--out", out, "epochs=2", "lora_rank=2", "lora_alpha=2", "model=nosuch"))
    assert not out.exists()


def test_checkpoints_without_a_log_are_a_run(cli, box, toy_run):
    run = shutil.copytree(toy_run, box / "run")
    assert not (run / "log.parquet").exists()  # the fixture's run: one checkpoint, no log
    _one_error(cli("train", TOY_CFG, "--out", run, *RESUME_OVERRIDES), "already holds a run; pass --resume")


def test_damaged_resume_advice_names_a_checkpoint_that_can_resume(box, toy_run):
    from pcpo_eval.train.checkpoints import STATE_FILE, damaged_fix

    run = shutil.copytree(toy_run, box / "run")
    one = run / "checkpoints" / "epoch_0001"
    assert damaged_fix(one) == f"restore {one} from a copy, or start the run again"
    two = shutil.copytree(one, run / "checkpoints" / "epoch_0002")
    assert damaged_fix(two) == f"delete that checkpoint folder ({two}) to resume from epoch_0001"
    (one / STATE_FILE).unlink()  # retention keeps the state in the newest checkpoint only
    assert damaged_fix(two) == (f"restore {two} from a copy, or start a new run from epoch_0001's weights with "
                                f"init_from={one} (older checkpoints keep no optimizer state, so none of them resumes)")


def test_export_and_generate_refuse_weights_that_changed_after_saving(cli, box, toy_run):
    run = shutil.copytree(toy_run, box / "run")
    lora = run / "checkpoints" / "epoch_0001" / "pytorch_lora_weights.safetensors"
    data = bytearray(lora.read_bytes())
    data[-1] ^= 0x01  # still a complete safetensors file: one weight's last byte
    lora.write_bytes(bytes(data))
    _one_error(cli("export", f"{run}@1", "--out", box / "ex"), "export: weights file", "does not match the "
               "weights_sha256")
    assert not (box / "ex").exists()
    _one_error(cli("generate", "--model", run, "--prompts", "toy", "--seeds", "1", "--max-prompts", "1",
                   "--steps", "2", "--out", box / "set", "--no-progress"), "does not match the weights_sha256")
    assert not (box / "set").exists()


def test_an_output_filled_meanwhile_is_kept_and_refused(tmp_path):
    out = tmp_path / "export"
    with pytest.raises(UserError, match=r"was filled while it was being written .* nothing there was changed"):
        with atomic_dir(out, replace=False) as tmp:
            (tmp / "a.txt").write_text("mine")
            out.mkdir()
            (out / "notes.txt").write_text("theirs")  # another process or a user, during the write
    assert sorted(p.name for p in out.iterdir()) == ["notes.txt"] and not list(tmp_path.glob(".export.*"))
    new = tmp_path / "empty"
    new.mkdir()  # an empty folder is taken
    with atomic_dir(new, replace=False) as tmp:
        (tmp / "a.txt").write_text("mine")
    assert (new / "a.txt").read_text() == "mine"


def test_metrics_check_their_folder_again_under_its_lock(tmp_path):
    """``write_outputs`` runs the folder check under the lock: another set's metrics written meanwhile stop this
    write, which would replace them."""
    from pcpo_eval.metrics import workers

    def refuse() -> None:
        raise UserError("--out holds the metrics of another image set")

    with pytest.raises(UserError, match="another image set"):
        workers.write_outputs(None, tmp_path / "m", refuse)  # the check runs before the result is touched
    assert not (tmp_path / "m" / "metrics.json").exists()


@pytest.mark.parametrize(("args", "message"), [
    (("train", "cfg.yaml", "--out", "a", "--out", "b"), "--out given more than once"),
    (("metrics", "set", "--metrics", "is_toy", "--out=a", "--out", "b"), "--out given more than once"),
    (("train", "cfg.yaml", "--progress", "--no-progress"), "--progress and --no-progress both given"),
    (("human", "raters", "H", "--base-url", "http://a", "--base-url", "http://b"), "--base-url given more than once"),
])
def test_a_single_valued_option_given_twice_is_one_error(cli, args, message):
    _one_error(cli(*args), message)


def test_options_that_take_a_list_may_repeat(cli, tmp_path):
    from pcpo_eval.cli import repeated_option

    assert repeated_option(["speedup", "--target", "1", "--target", "2"]) is None
    assert repeated_option(["human", "raters", "H", "--add", "a", "--add", "b"]) is None
    assert repeated_option(["train", "cfg", "--", "--out", "--out"]) is None  # after --: arguments
    assert repeated_option(["nosuch", "--out", "a", "--out", "b"]) is None  # click's own error says so


def test_a_checkpoint_a_kill_left_moved_aside_is_put_back(cli, box, toy_run, monkeypatch):
    """A kill between ``atomic_dir``'s two renames (old folder aside, new one in place) left the newest checkpoint
    only as ``.epoch_NNNN.old``: ``--resume`` saw none (or an older one without training state). The next write
    of that folder, and ``--resume``, put it back (``io.recover_replaced``)."""
    import os

    from pcpo_eval.io import recover_replaced

    run = shutil.copytree(toy_run, box / "run")
    cks = run / "checkpoints"
    os.replace(cks / "epoch_0001", cks / ".epoch_0001.old")  # as the kill left it
    assert recover_replaced(cks) == [cks / "epoch_0001"] and sorted(p.name for p in cks.iterdir()) == ["epoch_0001"]
    os.replace(cks / "epoch_0001", cks / ".epoch_0001.old")
    res = cli("train", TOY_CFG, "--out", run, "--resume", *RESUME_OVERRIDES)
    # found and read (the fixture's stand-in training state fits no real run); before: "no complete checkpoint"
    _one_error(res, "epoch_0001/training_state.pt does not fit this run")
    assert (cks / "epoch_0001").is_dir() and not (cks / ".epoch_0001.old").exists()
    target = box / "ck"
    with atomic_dir(target) as tmp:
        (tmp / "f.txt").write_text("old")
    os.replace(target, box / ".ck.old")
    with pytest.raises(RuntimeError), atomic_dir(target) as tmp:  # the next write fails: the old one stands
        raise RuntimeError("crash")
    assert (target / "f.txt").read_text() == "old"
