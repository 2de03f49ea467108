"""Renders that must not clobber a set (a red-team review of ``generate`` across processes).

Found: two renders into one folder with other settings both finished "complete" (set.json said steps 10, its
PNGs were rendered at steps 60); an unknown toy word failed mid-render and left a complete set marked
``rendering``; ``--micro-batch 0`` was recorded ``bitwise``; a set extended by one prompt gave every new image
to one rank; ``WORLD_SIZE`` without a launcher was a traceback."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pandas as pd
import pytest

from pcpo_eval import dist
from pcpo_eval.errors import UserError
from pcpo_eval.generate.runner import generate_set
from pcpo_eval.generate.setdir import lock_set
from pcpo_eval.imageset import LOCK_FILE
from tests.generate.test_set import MICRO, N_SEEDS, STEPS, WORKER, _env, _hashes, _prompts
from tests.support.generate import StandInAdapter

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


def _render(out, n_prompts: int = 3, **kw):
    return generate_set(StandInAdapter(), _prompts(n_prompts), 2, out, **{"batch_size": 4, "steps": STEPS,
                        "micro_batch": MICRO, "progress": False, **kw})


def test_a_second_render_of_a_folder_in_use_is_one_error_and_changes_nothing(tmp_path):
    out = tmp_path / "set"
    held = lock_set(out)  # as a render in flight holds it (another process: flock is per open file)
    try:
        with pytest.raises(UserError, match=rf"image set {re.escape(str(out))} is being rendered by another "
                                            r"pcpo-eval generate \(pid \d+\); wait for it"):
            _render(out)
        assert sorted(p.name for p in out.iterdir()) == [LOCK_FILE]  # nothing of the refused render
    finally:
        held.close()
    _render(out)  # released: the folder renders, its lock file is no foreign entry
    assert json.loads((out / "set.json").read_text())["status"] == "complete"
    _render(out)  # and resumes


def test_a_prompt_the_model_cannot_encode_is_refused_before_anything_is_written(tmp_path, cli):
    out = tmp_path / "set"
    res = cli("generate", "--model", "toy", "--prompts", "toy", "--max-prompts", "2", "--seeds", "2", "--steps", "3",
              "--out", out, "--no-progress")
    assert res.returncode == 0, res.stderr
    before = {p: p.read_bytes() for p in out.rglob("*") if p.is_file()}
    prompts = tmp_path / "p.txt"
    prompts.write_text("\n".join([*pd.read_parquet(out / "manifest.parquet").prompt.unique(), "red xylophone"]) + "\n")
    for target in (out, tmp_path / "fresh"):
        res = cli("generate", "--model", "toy", "--prompts", prompts, "--seeds", "2", "--steps", "3", "--out", target,
                  "--no-progress")
        assert res.returncode == 2 and res.stderr.startswith("error: toy text encoder: unknown word 'xylophone'"), res
    assert {p: p.read_bytes() for p in out.rglob("*") if p.is_file()} == before  # still complete, byte for byte
    assert not (tmp_path / "fresh").exists()


def test_micro_batch_off_is_recorded_as_no_batch_invariance(tmp_path):
    _render(tmp_path / "off", micro_batch=0)
    st = json.loads((tmp_path / "off" / "set.json").read_text())["settings"]
    assert st["batch_invariance"] == "none" and st["micro_batch"] == 0
    _render(tmp_path / "on")
    assert json.loads((tmp_path / "on" / "set.json").read_text())["settings"]["batch_invariance"] == "bitwise"


def test_without_a_launcher_world_size_is_one_error(monkeypatch):
    for k in ("RANK", "MASTER_ADDR", "MASTER_PORT"):
        monkeypatch.delenv(k, raising=False)
    monkeypatch.setenv("WORLD_SIZE", "2")
    with pytest.raises(UserError, match=r"WORLD_SIZE=2 but RANK, MASTER_ADDR, MASTER_PORT not set: launch with "
                                        r"torchrun"):
        dist.init("cpu")
    monkeypatch.setenv("WORLD_SIZE", "two")
    with pytest.raises(UserError, match=r"WORLD_SIZE='two' is not a number of processes"):
        dist.init("cpu")


@pytest.mark.parametrize("raw", ["0", "-5", "soon", "inf"])
def test_a_bad_group_timeout_is_one_error(monkeypatch, raw):
    monkeypatch.setenv(dist.TIMEOUT_ENV, raw)
    with pytest.raises(UserError, match=rf"{dist.TIMEOUT_ENV}='{raw}'; give the seconds"):
        dist.group_timeout()
    monkeypatch.setenv(dist.TIMEOUT_ENV, "90")
    assert dist.group_timeout().total_seconds() == 90
    monkeypatch.delenv(dist.TIMEOUT_ENV)
    assert dist.group_timeout().total_seconds() == dist.DEFAULT_TIMEOUT_S


def test_ranks_share_what_is_left_of_an_extended_set(tmp_path):
    """A set of 9 prompts extended to 10 under torchrun: the 4 new images (one prompt, seed-major plan: all on
    one rank's share of the plan) are split 2 and 2, and the set equals a one-process render."""
    launcher = Path(sys.executable).with_name("torchrun")
    if not launcher.exists():
        pytest.skip("torchrun not installed")
    out = tmp_path / "set"
    base = [str(WORKER), str(out), "9", str(N_SEEDS), "8", str(STEPS), str(MICRO)]
    first = subprocess.run([sys.executable, *base], env=_env(), capture_output=True, text=True, timeout=300)
    assert first.returncode == 0, first.stderr[-2000:]
    base[2] = "10"
    res = subprocess.run([str(launcher), "--standalone", "--nproc_per_node=2", *base], env=_env(),
                         capture_output=True, text=True, timeout=400)
    assert res.returncode == 0, res.stderr[-3000:]
    rendered = sorted(re.findall(r"rank (\d): rendered (\d+), skipped (\d+)", res.stdout))
    assert [(r, int(n)) for r, n, _ in rendered] == [("0", 2), ("1", 2)], res.stdout
    assert sum(int(k) for _, _, k in rendered) == 9 * N_SEEDS
    one = tmp_path / "one"
    generate_set(StandInAdapter(), _prompts(10), N_SEEDS, one, batch_size=8, steps=STEPS, micro_batch=MICRO,
                 progress=False)
    assert _hashes(pd.read_parquet(out / "manifest.parquet")) == _hashes(pd.read_parquet(one / "manifest.parquet"))



def test_the_png_writer_holds_a_bounded_queue(tmp_path, monkeypatch):
    """With writes slower than submits, at most ``MAX_PENDING_PNGS`` images wait (they were unbounded), and
    every record comes back in submission order."""
    import threading
    import time

    import numpy as np

    from pcpo_eval.generate import runner
    from pcpo_eval.generate.plan import WorkItem
    from pcpo_eval.generate.setdir import GenerationSettings

    monkeypatch.setattr(runner, "MAX_PENDING_PNGS", 3)
    writer = runner._Writer(tmp_path, GenerationSettings("m", "h", "m", "eps", "ddim", 1, 1.0, 1.0, "s", 1, "cpu"))
    gate, seen = threading.Event(), []
    slow = writer._write

    def write(item, img):
        gate.wait(5)
        return slow(item, img)

    monkeypatch.setattr(writer, "_write", write)
    img = np.zeros((3, 4, 4), np.uint8)
    for i in range(3):
        writer.submit(WorkItem(0, "p", i), img)
        seen.append(len(writer.pending))
    threading.Timer(0.3, gate.set).start()
    t0 = time.monotonic()
    writer.submit(WorkItem(0, "p", 3), img)  # the 4th waits for the oldest
    assert time.monotonic() - t0 >= 0.2 and seen == [1, 2, 3]
    assert writer.collect(wait=True) == 4 and [r["seed"] for r in writer.records] == [0, 1, 2, 3]
    writer.pool.shutdown(wait=True)
