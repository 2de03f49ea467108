"""Bad input across commands: one line ``error: ...``, exit code 2, nothing already written changed.

Every case runs through the real CLI entry point (``pcpo_eval.cli.main``, the ``cli`` fixture) inside
a folder whose name has spaces and non-ASCII characters (the ``box`` fixture, tests/cli/conftest.py),
and compares a snapshot of that folder (every entry, its mode and its bytes) before and after: a
rejected command must not add, change or remove anything (``rejected``, tests/support/cli.py).
"""

from __future__ import annotations

import hashlib
import json
import os
import shutil
import subprocess
import sys
from pathlib import Path

import pytest
import torch

from pcpo_eval.errors import UserError
from pcpo_eval.io import check_finite
from tests.support.cli import RESUME_OVERRIDES, ROOT, TOY_CFG, rejected

GEN = ["--prompts", "toy", "--max-prompts", "1", "--seeds", "1", "--steps", "2", "--no-progress"]


pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- train ------------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "config, extra, needles",
    [
        ("missing.yaml", [], ["not found"]),
        ("bad.yaml", [], ["not valid YAML at line 2"]),
        ("list.yaml", [], ["must be a mapping"]),
        ("unknown.yaml", [], ["unknown config key", "bogus_key"]),
        ("type.yaml", [], ["epochs", "many"]),
        ("range.yaml", [], ["epochs must be >= 1"]),
        ("nan.yaml", [], ["non-finite", "cfg=nan"]),
        ("latin1.yaml", [], ["not UTF-8"]),
        (".", [], ["is a folder"]),
        (TOY_CFG, ["cfg=nan"], ["non-finite", "cfg=nan"]),
        (TOY_CFG, ["sample_eta=-inf"], ["non-finite"]),
        (TOY_CFG, ["sample_eta=1.5"], ["sample_eta 1.5", "at most 1"]),
        (TOY_CFG, ["epochs"], ["not KEY=VALUE"]),
        (TOY_CFG, ["learning_rate=abc"], ["learning_rate"]),
        (TOY_CFG, ["--device", "gpu"], ["unknown --device 'gpu'"]),
    ],
    ids=["missing", "yaml", "non-mapping", "unknown-key", "wrong-type", "out-of-range", "nan-in-file",
         "not-utf8", "folder", "override-nan", "override-inf", "ddim-eta-above-1", "override-syntax", "override-type",
         "device"],
)
def test_train_bad_config(cli, box, config, extra, needles):
    cfg = config if isinstance(config, Path) else box / config
    rejected(cli, box, "train", cfg, "--out", box / "run", *extra, needles=needles)


def test_train_out_under_plain_file(cli, box):
    rejected(cli, box, "train", TOY_CFG, "--out", box / "plain file" / "run",
             needles=["is a file, not a folder"])


def test_unreadable_config(cli, box, monkeypatch):
    """A config the user may not read (emulated: the tests run as root, who reads anything)."""
    target = box / "range.yaml"
    real = Path.read_text

    def read_text(self, *a, **k):
        if self == target:
            raise PermissionError(13, "Permission denied", str(self))
        return real(self, *a, **k)

    monkeypatch.setattr(Path, "read_text", read_text)
    rejected(cli, box, "train", target, "--out", box / "run", needles=["not readable"])


def _truncate(path: Path) -> None:
    data = path.read_bytes()
    path.write_bytes(data[: len(data) // 2])


def test_generate_truncated_lora(cli, box, toy_run):
    run = shutil.copytree(toy_run, box / "run")
    _truncate(run / "checkpoints" / "epoch_0001" / "pytorch_lora_weights.safetensors")
    rejected(cli, box, "generate", "--model", run / "checkpoints" / "epoch_0001", "--out", box / "set", *GEN,
             needles=["truncated or corrupt"])


def test_generate_foreign_lora_is_one_line(cli, box):
    """A LoRA for modules the base model lacks: diffusers' own error log is silenced, one line remains."""
    from safetensors.torch import save_file

    ck = box / "foreign"
    ck.mkdir()
    save_file({"unet.no_such_block.lora_A.weight": torch.zeros(2, 4),
               "unet.no_such_block.lora_B.weight": torch.zeros(4, 2)}, ck / "pytorch_lora_weights.safetensors")
    (ck / "checkpoint.json").write_text(json.dumps({"epoch": 1, "model": "toy",
                                                    "weights_file": "pytorch_lora_weights.safetensors"}))
    rejected(cli, box, "generate", "--model", ck, "--out", box / "set", *GEN, needles=["do not fit base model"])


def test_resume_truncated_training_state(cli, box, toy_run):
    run = shutil.copytree(toy_run, box / "run")
    _truncate(run / "checkpoints" / "epoch_0001" / "training_state.pt")
    rejected(cli, box, "train", TOY_CFG, "--out", run, "--resume", *RESUME_OVERRIDES,
             needles=["truncated or corrupt"])


def test_load_training_state_rejects_truncated(box, toy_run):
    """The library half of the resume case (passes now; the trainer must call it)."""
    from pcpo_eval.train.checkpoints import load_training_state

    ck = shutil.copytree(toy_run / "checkpoints" / "epoch_0001", box / "ck")
    assert load_training_state(ck)["epoch"] == 1
    _truncate(ck / "training_state.pt")
    with pytest.raises(UserError, match="truncated or corrupt"):
        load_training_state(ck)
    (ck / "training_state.pt").unlink()
    with pytest.raises(UserError, match="cannot be resumed"):
        load_training_state(ck)


# ---- generate ---------------------------------------------------------------------------------

@pytest.mark.parametrize(
    "args, needles",
    [
        (["--prompts", "{box}/empty prompts.txt", "--seeds", "2"], ["contains no prompts"]),
        (["--prompts", "{box}/noprompt.csv", "--seeds", "2"], ["no 'prompt' column"]),
        (["--prompts", "{box}/nö such.txt", "--seeds", "2"], ["not found", "nö such.txt"]),
        (["--prompts", "{box}", "--seeds", "2"], ["is a folder", ".txt, .csv or .parquet"]),
        (["--prompts", "toy", "--seeds", "a-b"], ["--seeds 'a-b' is malformed"]),
        (["--prompts", "toy", "--seeds", "2", "--cfg", "nan"], ["--cfg"]),
        (["--prompts", "toy", "--seeds", "2", "--device", "tpu9"], ["unknown --device"]),
    ],
    ids=["empty-prompts", "csv-no-prompt-column", "prompts-missing", "prompts-folder", "seeds", "cfg-nan", "device"],
)
def test_generate_bad_input(cli, box, args, needles):
    args = [a.format(box=box) for a in args]
    rejected(cli, box, "generate", "--model", "toy", "--out", box / "set", *args, needles=needles)


@pytest.mark.parametrize("model, needles", [
    ("run@1", ["RUN@EPOCH is not a --model", "run/checkpoints/epoch_0001", "saved epochs: 1"]),
    ("run@7", ["RUN@EPOCH is not a --model", "saved epochs: 1"]),
    ("nö run", ["no such file or folder", "give a run or checkpoint folder"]),
    ("plain", ["not a pcpo-eval run", "give a run or checkpoint folder"]),
], ids=["run-at-epoch", "run-at-missing-epoch", "missing-path", "other-folder"])
def test_generate_model_that_is_no_model_names_the_fix(cli, box, toy_run, model, needles):
    """What a new user types for --model (export's RUN@EPOCH, a typo, a set folder) gets the fix."""
    shutil.copytree(toy_run, box / "run")
    (box / "plain").mkdir()
    rejected(cli, box, "generate", "--model", box / model, "--out", box / "set", *GEN, needles=needles)


@pytest.mark.parametrize("out, needle", [("plain file/set", "is a file, not a folder"),
                                         ("plain file", "is a file, not a folder")])
def test_generate_out_not_a_folder(cli, box, out, needle):
    rejected(cli, box, "generate", "--model", "toy", "--out", box / out, *GEN, needles=[needle])


# ---- metrics / features -----------------------------------------------------------------------

@pytest.fixture
def image_set(box) -> Path:
    from tests.support.metrics import make_image_set

    return make_image_set(box / "set ü", {0: "a red circle", 1: "a blue square"}, [0, 1, 2])


@pytest.mark.parametrize("manifest_agrees", [False, True], ids=["modified-after", "corrupt-when-listed"])
def test_metrics_corrupt_png(cli, box, image_set, manifest_agrees):
    import pandas as pd

    png = sorted((image_set / "images").rglob("*.png"))[3]
    _truncate(png)
    if manifest_agrees:  # the manifest lists the broken file's own hash: only decoding can tell
        man = pd.read_parquet(image_set / "manifest.parquet")
        rel = str(png.relative_to(image_set))
        man.loc[man["path"] == rel, "image_sha256"] = hashlib.sha256(png.read_bytes()).hexdigest()
        man.to_parquet(image_set / "manifest.parquet", index=False)
    needles = ["truncated image", png.name] if manifest_agrees else ["does not match its image_sha256", png.name]
    needles.append("to re-render it (a study's set: delete the file and run the study again)")  # the fix, cold cache
    rejected(cli, box, "metrics", image_set, "--metrics", "lpips_toy", "--out", box / "m", needles=needles,
             may_add=f"{image_set.name}/.pcpo_cache")


@pytest.mark.parametrize(
    "args, needles",
    [
        (["{box}/no set", "--out", "{box}/m"], ["is not an image set"]),
        (["{set}", "--metrics", "fid,nosuch", "--out", "{box}/m"], ["unknown metric", "nosuch"]),
        (["{set}", "--metrics", " , ", "--out", "{box}/m"], ["no metric named", "comma-separated"]),
        (["{set}", "--metrics", "lpips_toy", "--lpips-trunk", "{box}/alex.pth", "--out", "{box}/m"],
         ["--lpips-trunk is given but no chosen metric uses it", "lpips"]),
        (["{set}", "--metrics", "fd_toy", "--dinov2-path", "{box}/d", "--out", "{box}/m"], ["--dinov2-path is given"]),
        (["{set}", "--metrics", "lpips_toy", "--out", "{box}/plain file/m"], ["is a file, not a folder"]),
        (["{set}", "--metrics", "lpips_toy", "--out", "{box}/m", "--batch-size", "0"], ["--batch-size must be >= 1"]),
        (["{set}", "--metrics", "is_toy", "--out", "{box}/m", "--is-splits", "0"], ["--is-splits must be >= 1"]),
    ],
    ids=["no-set", "unknown-metric", "no-metric", "unused-lpips-trunk", "unused-dinov2", "out-under-file", "batch-size",
         "is-splits"],
)
def test_metrics_bad_input(cli, box, image_set, args, needles):
    args = [a.format(box=box, set=image_set) for a in args]
    rejected(cli, box, "metrics", *args, needles=needles)


def test_features_out_is_a_folder(cli, box, image_set):
    rejected(cli, box, "features", image_set, "--extractor", "toy", "--output", box, needles=["is a folder"])


# ---- lmm / speedup / select -------------------------------------------------------------------

LMM = ["--formula", "y ~ x", "--group", "g"]


@pytest.mark.parametrize(
    "data, args, needles",
    [
        ("missing.csv", LMM, ["does not exist"]),
        ("nan.csv", LMM, ["NaN"]),
        ("inf.csv", LMM, ["infinite"]),
        ("header only.csv", LMM, ["empty"]),
        ("ragged.csv", LMM, ["cannot read", "ragged.csv"]),
        ("garbage.parquet", LMM, ["cannot read"]),
        ("sched.json", LMM, ["must be .csv or .parquet"]),
        ("ok ü.csv", ["--formula", "y ~ zz", "--group", "g"], ["'zz'", "not in the data"]),
        ("ok ü.csv", ["--formula", "y ~ x", "--group", "gg"], ["grouping column 'gg'"]),
        ("ok ü.csv", [*LMM, "--output", "{box}/plain file/r.json"], ["is a file, not a folder"]),
        ("ok ü.csv", [*LMM, "--qq", "{box}"], ["--qq", "is a folder"]),
    ],
    ids=["missing", "nan", "inf", "header-only", "ragged-csv", "garbage-parquet", "wrong-extension",
         "formula-column", "group-column", "out-under-file", "qq-folder"],
)
def test_lmm_bad_input(cli, box, data, args, needles):
    rejected(cli, box, "lmm", box / data, *[a.format(box=box) for a in args], needles=needles)


def test_speedup_and_select_bad_input(cli, box):
    rejected(cli, box, "speedup", "--baseline", box / "no log", "--pcpo", box / "no log", "--target", "1",
             needles=["does not exist"])
    rejected(cli, box, "speedup", "--baseline", box / "garbage.parquet", "--pcpo", box / "garbage.parquet",
             "--target", "1", needles=["garbage.parquet"])
    rejected(cli, box, "select", box / "no run", "--target", "1", needles=["does not exist"])


# ---- credit, toy, study, report ---------------------------------------------------------------

def test_credit_bad_input(cli, box):
    rejected(cli, box, "credit", "ddim", "--scheduler-config", box / "sched.json", needles=["sched.json"])
    rejected(cli, box, "credit", "ddim", "--steps", "0", needles=["--steps"])
    rejected(cli, box, "credit", "flow", "--plot", box / "plain file" / "f.png", needles=["is a file, not a folder"])
    rejected(cli, box, "credit", "flow", "--plot", box / "fig.txt", needles=["must end in .png", "fig.png"])
    rejected(cli, box, "credit", "ddim", "--plot", box / "fig", needles=["must end in .png"])


def test_toy_bad_input(cli, box):
    rejected(cli, box, "toy", "check", "--weights", box / "no weights", needles=["toy pretrain"])
    rejected(cli, box, "toy", "pretrain", "--train-steps", "0", "--out", box / "w", needles=["--train-steps must be >= 1"])
    rejected(cli, box, "toy", "pretrain", "--seed", "-1", "--out", box / "w", needles=["--seed must be >= 0"])
    rejected(cli, box, "toy", "pretrain", "--out", box / "plain file", needles=["is a file, not a folder"])
    # a folder of other files (a run's, a user's): refused before training, nothing written among them
    rejected(cli, box, "toy", "pretrain", "--out", box, needles=["not toy model weights"])
    rejected(cli, box, "toy-flow", "pretrain", "--out", box, needles=["not toy model weights"])
    rejected(cli, box, "toy-flow", "check", "--seeds", "0", needles=["--seeds must be >= 1"])
    rejected(cli, box, "toy-flow", "check", "--eta", "nan", needles=["--eta"])


def test_study_bad_spec(cli, box):
    rejected(cli, box, "study", box / "bad.yaml", "--out", box / "s", needles=["not valid YAML"])
    rejected(cli, box, "study", box / "unknown.yaml", "--out", box / "s", needles=["unknown key"])


@pytest.mark.parametrize("content", [
    b"", b'{"runs": [',
    b"\xff\xfe",
], ids=["empty", "truncated", "binary"])
def test_report_keeps_existing_html(cli, box, content):
    study = box / "study"
    study.mkdir()
    (study / "report.html").write_text("<html>the previous report</html>")
    (study / "results.json").write_bytes(content)
    rejected(cli, box, "report", study, needles=["results.json"])


def test_report_results_not_a_mapping(cli, box):
    study = box / "study"
    study.mkdir()
    (study / "report.html").write_text("<html>the previous report</html>")
    (study / "results.json").write_text("[]")
    rejected(cli, box, "report", study, needles=["results.json"])


# ---- write-protected folders ------------------------------------------------------------------

@pytest.fixture
def protected(box, monkeypatch) -> Path:
    """A folder made read-only (mode 0555); os.access is made to answer as for a non-root owner."""
    ro = box / "read only"
    ro.mkdir()
    ro.chmod(0o555)
    real = os.access

    def access(path, mode, *a, **k):
        p = Path(path)
        if p == ro or ro in p.parents:
            return not (mode & os.W_OK) or bool(p.stat().st_mode & 0o200)
        return real(path, mode, *a, **k)

    monkeypatch.setattr(os, "access", access)
    yield ro
    ro.chmod(0o755)


def test_out_in_write_protected_folder(cli, box, protected):
    rejected(cli, box, "lmm", box / "ok ü.csv", *LMM, "--output", protected / "r.json", needles=["permission denied"])
    rejected(cli, box, "generate", "--model", "toy", "--out", protected / "set", *GEN, needles=["permission denied"])
    rejected(cli, box, "train", TOY_CFG, "--out", protected / "run", needles=["permission denied"])
    rejected(cli, box, "credit", "ddim", "--plot", protected / "f.png", needles=["permission denied"])


@pytest.mark.skipif(not Path("/sys/kernel").is_dir(), reason="needs Linux sysfs")
def test_out_where_even_root_cannot_write(cli, box):
    """sysfs refuses new folders to every user (EPERM): the real OS error, not an emulation."""
    rejected(cli, box, "credit", "flow", "--plot", "/sys/pcpo_eval_no_such/f.png", needles=["/sys/pcpo_eval_no_such"])


# ---- paths with spaces and non-ASCII characters work -------------------------------------------

def test_unusual_paths_work(cli, box):
    fig = box / "figs ü" / "crédit 図.png"
    res = cli("credit", "flow", "--steps", "4", "--plot", fig, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(res.stdout)["steps"] and fig.read_bytes()[:8] == b"\x89PNG\r\n\x1a\n"
    out = box / "résultats ü.json"
    res = cli("lmm", box / "ok ü.csv", *LMM, "--output", out, "--json")
    assert res.returncode == 0, res.stderr
    assert json.loads(out.read_text()) == json.loads(res.stdout)


def test_error_line_with_non_ascii_path_in_c_locale(box):
    """A real process in the C locale prints the non-ASCII path in its one error line."""
    env = {**os.environ, "LC_ALL": "C", "LANG": "C", "OMP_NUM_THREADS": "1"}
    env.pop("PYTHONIOENCODING", None)
    res = subprocess.run([sys.executable, "-m", "pcpo_eval", "lmm", str(box / "nan.csv"), *LMM],
                         capture_output=True, env=env, cwd=ROOT, timeout=120)
    err = res.stderr.decode("utf-8", "replace")
    assert res.returncode == 2 and err.count("\n") == 1 and err.startswith("error: "), err


# ---- check_finite (pure) ----------------------------------------------------------------------

def test_check_finite_names_every_bad_number():
    cfg = {"cfg": float("nan"), "lr": 1e-3, "nested": {"eta": float("inf"), "ok": [1, 2.5, float("-inf")]},
           "flag": True, "name": "nan", "n": None}
    with pytest.raises(UserError) as err:
        check_finite(cfg, "train config x.yaml")
    msg = str(err.value)
    assert msg.startswith("train config x.yaml: non-finite ")
    assert "cfg=nan" in msg and "nested.eta=inf" in msg and "nested.ok[2]=-inf" in msg
    assert "lr" not in msg and "flag" not in msg and "name" not in msg and "\n" not in msg


def test_check_finite_accepts_finite_and_numpy():
    import numpy as np

    check_finite({"a": 1, "b": np.float32(2.0), "c": [np.int64(3)], "d": {"e": -1e300}}, "x")
    with pytest.raises(UserError, match="b=nan"):
        check_finite({"b": np.float64("nan")}, "x")
