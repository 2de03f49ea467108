"""Reliability issue: data loss, silently wrong input, concurrency, Ctrl-C and stray tracebacks.

Each case runs the real CLI (the ``cli`` fixture) and, for bad input, checks the one ``error:`` line,
exit code 2 and an unchanged folder (sha256 of every file before/after: ``rejected`` of
tests/support/cli.py; ``box`` and ``toy_run`` are fixtures of tests/cli/conftest.py).
"""

from __future__ import annotations

import pytest

from tests.support.cli import rejected

# ---- 1. report on a results.json that is not a study's results ---------------------------------

@pytest.mark.parametrize("content", ["{}", "[]", "3", "null", '"x"', '{"runs": []}', '{"study": 1}',
                                     '{"study": {}, "verdict": "x"}', '{"study": {}, "runs": "x"}',
                                     '{"study": {}, "lmm": []}', '{"study": {}, "figures": []}'],
                         ids=["empty-object", "list", "number", "null", "string", "no-study", "study-not-object",
                              "verdict-string", "runs-string", "lmm-list", "figures-list"])
def test_report_refuses_non_results_keeps_html(cli, box, content):
    study = box / "study"
    study.mkdir()
    (study / "report.html").write_text("<html>the previous report</html>")
    (study / "results.json").write_text(content)
    line = rejected(cli, box, "report", study, needles=["results.json"])
    assert "re-run" in line
    assert (study / "report.html").read_text() == "<html>the previous report</html>"


# ---- 2a. identical runs in both arms -----------------------------------------------------------

AA = {"design": {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "ppo_clip"}}},
      "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"},
      "lmm": {"formula": "value ~ algorithm + (1|prompt)"}}


def test_study_refuses_aa_with_equal_seeds(cli, box):
    from tests.support.study import write_spec

    spec = write_spec(box / "aa.yaml", **AA, seeds=[0, 1, 2])
    line = rejected(cli, box, "study", spec, "--out", box / "out", needles=[
        "would be identical", "algorithm-A__seed-0", "algorithm-B__seed-0", "(and 2 more pair(s))",
        "seeds: {A: [0, 1, 2], B: [3, 4, 5]}"])
    assert not (box / "out").exists() and "problem(s)" in line
    # the fix the message names is accepted
    from pcpo_eval.study.spec import load_spec

    ok = load_spec(write_spec(box / "aa.yaml", **AA, seeds={"A": [0, 1, 2], "B": [3, 4, 5]}), check_weights=False)
    assert len(ok.runs) == 6


def test_study_refuses_one_run_dir_in_both_arms(cli, box):
    from tests.support.study import write_run

    rd = box / "run one"
    write_run(rd, 8, 0.05, 2)
    other = box / "run two"
    write_run(other, 8, 0.05, 2, rng_key="two")  # its own run: another log
    design = {"algorithm": {"DDPO": {"objective": "ppo_clip"}, "PCPO": {"objective": "pcpo"}}}
    runs = [{"levels": {"algorithm": "DDPO"}, "seed": 0, "run_dir": str(rd)},
            {"levels": {"algorithm": "PCPO"}, "seed": 0, "run_dir": str(box / "." / "run one")}]
    from tests.support.study import write_spec

    spec = write_spec(box / "runs.yaml", design=design, runs=runs, seeds=[0], targets=[0.2], select_target=0.2,
                      lmm={"formula": "value ~ algorithm + (1|prompt)"})
    rejected(cli, box, "study", spec, "--out", box / "out",
             needles=["use the same run directory", "run one", "different run directory"])
    runs[1]["run_dir"] = str(other)
    write_spec(box / "runs.yaml", design=design, runs=runs, seeds=[0], targets=[0.2], select_target=0.2,
               lmm={"formula": "value ~ algorithm + (1|prompt)"})
    from pcpo_eval.study.spec import load_spec

    assert {r.run_dir for r in load_spec(box / "runs.yaml", check_weights=False).runs} == {str(rd), str(other)}


# ---- 2b. non-finite speed-up targets and rewards -----------------------------------------------

def _log(path, rewards):
    import numpy as np
    import pandas as pd

    pd.DataFrame({"epoch": np.arange(1, len(rewards) + 1), "reward_mean": rewards}).to_parquet(path, index=False)
    return path


@pytest.mark.parametrize("target", ["nan", "inf", "-inf"])
def test_speedup_and_select_refuse_non_finite_target(cli, box, target):
    import numpy as np

    ok = _log(box / "ok ü.parquet", np.linspace(0, 1, 10))
    rejected(cli, box, "speedup", "--baseline", ok, "--pcpo", ok, "--target", "0.5", "--target", target,
             "-o", box / "out.json", needles=[f"--target {target} is not a finite number", "--target 0.8"])
    rejected(cli, box, "select", box, "--target", target, needles=["is not a finite number"])


def test_speedup_refuses_log_with_inf_reward(cli, box):
    import numpy as np

    ok = _log(box / "ok ü.parquet", np.linspace(0, 1, 10))
    r = np.linspace(0, 1, 10)
    r[4] = np.inf
    bad = _log(box / "inf ü.parquet", r)
    (box / "old.json").write_text('{"kept": true}\n')
    rejected(cli, box, "speedup", "--baseline", ok, "--pcpo", bad, "--target", "0.5", "-o", box / "old.json",
             needles=["inf ü.parquet", "'reward_mean' has 1 non-finite", "leave that run out"])
    ok2 = _log(box / "ok 2.parquet", np.linspace(0, 0.9, 10))
    assert cli("speedup", "--baseline", ok, "--pcpo", ok2, "--target", "0.5").returncode == 0


# ---- 2c. prompt file encodings -----------------------------------------------------------------

GEN = ["--max-prompts", "1", "--seeds", "1", "--steps", "2", "--no-progress"]


@pytest.mark.parametrize("name, data", [
    ("bom.txt", "\ufeffred circle\nblue square\n".encode()),
    ("utf16.txt", "red circle\nblue square\n".encode("utf-16")),
    ("utf16.csv", "prompt\nred circle\nblue square\n".encode("utf-16")),
    ("bom.csv", "\ufeffprompt\nred circle\nblue square\n".encode()),
], ids=["utf8-bom-txt", "utf16-txt", "utf16-csv", "utf8-bom-csv"])
def test_generate_reads_bom_prompt_files(cli, box, name, data):
    import pandas as pd

    (box / name).write_bytes(data)
    res = cli("generate", "--model", "toy", "--prompts", box / name, "--out", box / "set", *GEN)
    assert res.returncode == 0, res.stderr[-2000:]
    man = pd.read_parquet(box / "set" / "manifest.parquet")
    assert list(man["prompt"].unique()) == ["red circle"]  # no BOM glued to the first prompt


@pytest.mark.parametrize("data, needles", [
    ("caf\xe9 au lait\n".encode("latin-1"), ["is not valid utf-8 text", "save it as UTF-8"]),
    ("a red cube\n".encode("utf-16-le"), ["NUL characters", "UTF-16 without a byte-order mark"]),
], ids=["latin1", "utf16-no-bom"])
def test_generate_refuses_undecodable_prompt_file(cli, box, data, needles):
    (box / "p ü.txt").write_bytes(data)
    rejected(cli, box, "generate", "--model", "toy", "--prompts", box / "p ü.txt", "--out", box / "set", *GEN,
             needles=["p ü.txt", *needles])


# ---- 2d. --resume verifies the latest checkpoint's weights file --------------------------------

@pytest.mark.parametrize("damage", ["truncate", "flip-last-byte", "delete"])
def test_resume_refuses_damaged_lora(cli, box, toy_run, damage):
    import shutil

    from tests.support.cli import RESUME_OVERRIDES, TOY_CFG

    run = shutil.copytree(toy_run, box / "run")
    lora = run / "checkpoints" / "epoch_0001" / "pytorch_lora_weights.safetensors"
    data = lora.read_bytes()
    if damage == "truncate":
        lora.write_bytes(data[: len(data) // 2])
        needle = "is truncated or corrupt"
    elif damage == "flip-last-byte":
        lora.write_bytes(data[:-1] + bytes([data[-1] ^ 0xFF]))
        needle = "does not match the weights_sha256"
    else:
        lora.unlink()
        needle = "lacks its weights file"
    rejected(cli, box, "train", TOY_CFG, "--out", run, "--resume", *RESUME_OVERRIDES,
             needles=[needle, "pytorch_lora_weights.safetensors", "restore", "epoch_0001", "start the run again"])


# ---- 4. Ctrl-C ---------------------------------------------------------------------------------

def test_ctrl_c_in_process_is_one_line_130(cli, monkeypatch, tmp_path):
    import numpy as np

    import pcpo_eval.stats.speedup as sp
    import pcpo_eval.train.trainer as tr

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(sp, "speedup_table", interrupt)
    monkeypatch.setattr(tr, "train", interrupt)
    log = _log(tmp_path / "a.parquet", np.linspace(0, 1, 10))
    other = _log(tmp_path / "b.parquet", np.linspace(0, 0.9, 10))
    res = cli("speedup", "--baseline", log, "--pcpo", other, "--target", "1")
    lines = res.stderr.strip().splitlines()
    assert res.returncode == 130 and len(lines) == 1 and "Traceback" not in res.stderr, res.stderr
    assert lines[0].startswith("error: interrupted") and "resumable" in lines[0] and "re-run the same command" in lines[0]


def test_ctrl_c_train_names_resume(cli, monkeypatch, tmp_path):
    import pcpo_eval.train.trainer as tr
    from tests.support.cli import TOY_CFG

    def interrupt(*a, **k):
        raise KeyboardInterrupt

    monkeypatch.setattr(tr, "train", interrupt)
    res = cli("train", TOY_CFG, "--out", tmp_path / "run", "epochs=1")
    assert res.returncode == 130, res.stderr[-2000:]
    assert res.stderr.strip().splitlines() == [
        "error: interrupted (Ctrl-C); what was written is complete and the state is resumable: "
        "re-run the same command with --resume to continue from the latest checkpoint (a run stopped before its "
        "first checkpoint: without --resume, to start it again)"]


def test_real_sigint_exits_130(tmp_path):
    """A real SIGINT to a running command (the process waits in a stand-in for a long computation)."""
    import signal
    import subprocess
    import sys

    code = ("import sys, time\n"
            "import pcpo_eval.stats.speedup as sp\n"
            "def slow(*a, **k):\n"
            "    print('ready', flush=True)\n"
            "    time.sleep(60)\n"
            "sp.speedup_table = slow\n"
            "sys.argv = ['pcpo-eval', 'speedup', '--baseline', 'a.parquet', '--pcpo', 'b.parquet', '--target', '1']\n"
            "from pcpo_eval.cli import main\n"
            "main()\n")
    import numpy as np

    _log(tmp_path / "a.parquet", np.linspace(0, 1, 10))
    _log(tmp_path / "b.parquet", np.linspace(0, 0.9, 10))
    def as_from_a_shell() -> None:
        # the command starts as a terminal starts it: SIGINT delivered and handled by default. A child inherits
        # an ignored or blocked SIGINT from its parent (Python then installs no KeyboardInterrupt handler),
        # and a test process may carry one from an earlier test's native library
        signal.pthread_sigmask(signal.SIG_UNBLOCK, {signal.SIGINT})
        signal.signal(signal.SIGINT, signal.SIG_DFL)

    p = subprocess.Popen([sys.executable, "-c", code], stdout=subprocess.PIPE, stderr=subprocess.PIPE, text=True,
                         cwd=tmp_path, preexec_fn=as_from_a_shell)
    assert p.stdout.readline().strip() == "ready"
    p.send_signal(signal.SIGINT)
    # a bound, not a timing (the exit takes ~0.1 s); an ignored SIGINT ends the stand-in's 60 s sleep with an
    # error, not 130
    _, err = p.communicate(timeout=120)
    assert p.returncode == 130, err
    lines = err.strip().splitlines()
    assert len(lines) == 1 and lines[0].startswith("error: interrupted (Ctrl-C)"), err


# ---- 3. study workers die with the study; one study process per folder -------------------------

def _study_spec(box):
    from tests.support.study import write_spec

    return write_spec(box / "tiny.yaml", train={"overrides": {"epochs": 200, "sample_steps": 2, "checkpoint_every": 100}},
                      parallel=2)


def _cmdline(proc) -> str:
    """A child's command line, "" for one that exited while listed (a zombie not yet reaped, or gone)."""
    import psutil

    try:
        return " ".join(proc.cmdline())
    except psutil.Error:
        return ""


def test_sigkill_of_a_parallel_study_kills_its_workers_and_frees_the_lock(cli, box, tmp_path):
    import os
    import signal
    import subprocess
    import sys
    import time

    import psutil

    spec = _study_spec(box)
    out = tmp_path / "study out"
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    study = subprocess.Popen([sys.executable, "-m", "pcpo_eval", "study", str(spec), "--out", str(out)],
                             stdout=subprocess.DEVNULL, stderr=subprocess.PIPE, env=env)
    try:
        deadline = time.monotonic() + 120
        workers: list[psutil.Process] = []
        while time.monotonic() < deadline and len(workers) < 2:
            assert study.poll() is None, study.stderr.read().decode()[-2000:]
            workers = [c for c in psutil.Process(study.pid).children() if "pcpo_eval.study.training" in _cmdline(c)]
            time.sleep(0.2)
        assert len(workers) == 2, "the study did not start its two workers"
        # a second study process on the same folder is refused while the first holds it
        before = {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()}
        second = cli("study", spec, "--out", out)
        assert second.returncode == 2, second.stderr[-2000:]
        lines = second.stderr.strip().splitlines()
        assert len(lines) == 1 and lines[0].startswith("error: study folder") and "in use by another" in lines[0]
        assert f"pid {study.pid}" in lines[0] and "choose another --out" in lines[0]
        assert {p.name: p.read_bytes() for p in out.iterdir() if p.is_file()} == before
        study.send_signal(signal.SIGKILL)
        study.wait(timeout=30)
        gone, alive = psutil.wait_procs(workers, timeout=30)
        assert not alive, f"worker(s) {[p.pid for p in alive]} outlived the killed study"
    finally:
        if study.poll() is None:
            study.kill()
            study.wait()
        for w in workers:
            if w.is_running():
                w.kill()
    # the dead study's lock is released by the kernel: the folder can be taken again
    import fcntl

    with open(out / ".lock", "a+") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)


def test_worker_dies_with_its_parent(tmp_path):
    """The worker-side half, without a study: a child of a killed parent calls die_with_parent."""
    import subprocess
    import sys

    import psutil

    code = ("import os, subprocess, sys\n"
            "env = {**os.environ, 'PCPO_STUDY_PARENT_PID': str(os.getpid())}\n"
            "c = subprocess.Popen([sys.executable, '-c', 'from pcpo_eval.study.training import die_with_parent; "
            "import time; die_with_parent(); print(1, flush=True); time.sleep(300)'], env=env, stdout=subprocess.PIPE)\n"
            "c.stdout.readline()\n"
            "print(c.pid, flush=True)\n"
            "os.kill(os.getpid(), 9)\n")
    p = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, timeout=120)
    child = psutil.Process(int(p.stdout.strip()))
    gone, alive = psutil.wait_procs([child], timeout=30) if child.is_running() else ([child], [])
    alive = [c for c in alive if c.status() != psutil.STATUS_ZOMBIE]
    for c in alive:
        c.kill()
    assert not alive, "the worker outlived its killed parent"


# ---- 5. corrupt study_state.json ---------------------------------------------------------------

@pytest.mark.parametrize("content", [b'{"train": {"finger', b"[1, 2]", b"\xff\xfe\x00"], ids=["truncated", "list", "binary"])
def test_corrupt_study_state_is_one_line(cli, box, content):
    spec = _study_spec(box)
    out = box / "study"
    out.mkdir()
    (out / "study_state.json").write_bytes(content)
    rejected(cli, box, "study", spec, "--out", out, needles=["study_state.json", "delete", "re-run the same command"])


# ---- 5. names over 255 bytes, huge --seeds -----------------------------------------------------

LONG = "n" * 300  # over NAME_MAX (255 bytes) on Linux file systems


@pytest.mark.parametrize("args, needles", [
    (["generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", "{box}/" + LONG], ["--out", "300 bytes"]),
    (["generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", "{box}/" + LONG + "/sub"],
     ["--out", "300 bytes"]),
    (["generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", "{box}/" + "ü" * 150],
     ["--out", "300 bytes"]),
    (["study", "{spec}", "--out", "{box}/" + LONG], ["--out", "300 bytes"]),
    (["report", "{box}/" + LONG], ["file name too long"]),
    (["speedup", "--baseline", "{log}", "--pcpo", "{log}", "--target", "0.5", "-o", "{box}/" + "j" * 250 + ".json"],
     ["--output", "255 bytes", "at most 241"]),
], ids=["generate-out", "generate-out-parent", "generate-out-multibyte", "study-out", "report-dir", "speedup-output"])
def test_long_names_are_one_line(cli, box, args, needles):
    import numpy as np

    spec = _study_spec(box)
    log = _log(box / "ok.parquet", np.linspace(0, 1, 10))
    args = [a.format(box=box, spec=spec, log=log) for a in args]
    line = rejected(cli, box, *args, needles=needles)
    assert "shorter" in line


@pytest.mark.parametrize("seeds, needle", [
    ("99999999999", "seed 99999999998 too large"),
    ("5-99999999999", "seed 99999999999 too large"),
    ("10000001", "seed 10000000 too large"),
    ("²", "is malformed"),
], ids=["count", "range", "just-over", "unicode-digit"])
def test_generate_huge_seeds_is_one_line(cli, box, seeds, needle):
    rejected(cli, box, "generate", "--model", "toy", "--prompts", "toy", "--seeds", seeds, "--out", box / "set",
             needles=[needle] if "malformed" in needle else [needle, "<= 9999999", "--seeds 0-9999999"])
