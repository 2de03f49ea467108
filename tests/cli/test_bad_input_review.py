"""Bad input found by the review of branch review-cli: each case used to be a traceback (exit 1), a
misleading line, or nonsense accepted; now one ``error:`` line, exit code 2, nothing written.

Cases run through the real CLI entry point in-process (``cli``) inside the ``box`` folder
(tests/cli/conftest.py) and check that it is unchanged (``rejected``, tests/support/cli.py).
"""

from __future__ import annotations

import copy
import shutil
from pathlib import Path

import pytest
import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.io import read_yaml_mapping
from pcpo_eval.train.config import load_config
from tests.support.cli import ROOT, TOY_CFG, rejected

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


# ---- credit: non-finite numbers -------------------------------------------------------------

@pytest.mark.parametrize(
    "args, needles",
    [
        (["flow", "--eta", "inf"], ["--eta must be a number in (0, 100] (got inf)"]),  # printed a table of NaN, exit 0
        (["flow", "--shift", "inf"], ["--shift must be a finite number > 0 (got inf)"]),  # the same
        (["ddim", "--w-target", "inf"], ["--w-target must be a finite number > 0 (got inf)"]),  # inf / NaN weights
        (["ddim", "--eta", "inf"], ["--eta must be a finite number > 0"]),  # blamed --w-target, which was not given
    ],
    ids=["flow-eta-inf", "flow-shift-inf", "ddim-w-target-inf", "ddim-eta-inf"],
)
def test_credit_non_finite(cli, box, args, needles):
    line = rejected(cli, box, "credit", *args, needles=needles)
    assert "; pass" in line or "; leave" in line or "or leave" in line  # the fix


@pytest.mark.parametrize("extra", [[], ["--w-target", "1"]], ids=["mean-weight", "w-target-given"])
def test_credit_degenerate_schedule(cli, box, extra):
    """betas up to 0.5 drive alpha_bar to 0: the weights were inf, printed (exit 0) with a given --w-target, or
    blamed on --w-target (not given) after numpy's RuntimeWarnings (several stderr lines)."""
    rejected(cli, box, "credit", "ddim", "--beta-start", "0.0001", "--beta-end", "0.5", "--beta-schedule", "linear",
             "--steps", "5", *extra, needles=["native credit weights of this schedule are not finite", "--beta-end"])


@pytest.mark.skipif(not Path("/proc/self").is_dir(), reason="needs Linux's /proc (a folder that takes no new files)")
def test_output_in_a_folder_that_takes_no_files_names_the_path(cli, box):
    """``--plot /proc/x.png``: /proc passes the permission check (as root) but creates nothing; the error
    named the internal temporary file ``/proc/.x.png.XXXXXXXX.tmp``."""
    line = rejected(cli, box, "credit", "ddim", "--steps", "5", "--plot", "/proc/x.png",
                    needles=["cannot write /proc/x.png", "/proc takes no new files", "choose a folder"])
    assert ".tmp" not in line


# ---- speedup / select: the smoothing window -------------------------------------------------

@pytest.mark.parametrize("window", ["-2", "-1"])
def test_speedup_negative_window(cli, box, window):
    """A negative --window indexed the epochs from the end: IndexError traceback, exit 1."""
    for name, last in (("a.csv", 0.6), ("b.csv", 0.7)):
        (box / name).write_text(f"epoch,reward_mean\n1,0.5\n2,{last}\n")
    rejected(cli, box, "speedup", "--baseline", box / "a.csv", "--pcpo", box / "b.csv", "--target", "0.8",
             "--window", window, needles=[f"window must be a whole number of epochs >= 1, got {window}", "--window 5"])


def test_speedup_counts_each_run_once(cli, box):
    """One run given five times as --pcpo (or a copy of its log) counted as five seeds: an A/A pair of arms got
    a "+58% speed-up, Holm p 0.031"."""
    for name, last in (("a.csv", 0.6), ("b.csv", 0.7), ("c.csv", 0.8)):
        (box / name).write_text(f"epoch,reward_mean\n1,0.5\n2,{last}\n3,0.9\n")
    (box / "b copy.csv").write_text("epoch,reward_mean\n1,0.50\n2,0.70\n3,0.90\n")  # other bytes, one run
    a, b, c = (str(box / n) for n in ("a.csv", "b.csv", "c.csv"))
    rejected(cli, box, "speedup", "--baseline", a, "--baseline", c, "--pcpo", b, "--pcpo", b, "--target", "0.8",
             needles=[f"--pcpo {b} is the run of --pcpo {b} again", "give each seed's own run once"])
    rejected(cli, box, "speedup", "--baseline", b, "--pcpo", str(box / "b copy.csv"), "--target", "0.8",
             needles=[f"has the same curves as --baseline {b}", "copied or imported twice"])


def test_speedup_gain_of_runs_without_their_control_names_the_fix(cli, box):
    """Runs trained without paired_control log an empty control column: `--curve gain` said "fix or drop those
    epochs" instead of the training setting that makes the column."""
    for name in ("a.csv", "b.csv"):
        (box / name).write_text("epoch,reward_mean,control_reward_mean\n1,0.5,\n2,0.6,\n")
    rejected(cli, box, "speedup", "--baseline", box / "a.csv", "--pcpo", box / "b.csv", "--target", "0.1",
             "--curve", "gain", needles=["trained without paired_control", "paired_control: true"])


# ---- train config: YAML 1.1 booleans, ranges, device, override syntax, duplicate keys ----------

TRAIN_CASES = [
    # YAML 1.1 reads yes / no / on / off as booleans, which became numbers: 1 epoch, a full fine-tune ...
    ("epochs=yes", ["config key epochs", "is not an int", "whole number"]),
    ("lora_rank=no", ["config key lora_rank", "is not an int"]),
    ("cfg=on", ["config key cfg", "is not a float"]),
    ("seed=off", ["config key seed"]),
    # ... and a number or list was read as a boolean, a list or mapping as a string
    ("paired_control=2", ["config key paired_control", "true or false"]),
    ("prompts=[a, b]", ["config key prompts", "one text value"]),
    # ranges torch refuses with a traceback (or that train nonsense without one)
    ("adam_beta1=2", ["adam_beta1 must be in [0, 1)"]),
    ("adam_epsilon=-1", ["adam_epsilon must be >= 0"]),
    ("stat_buffer_size=-3", ["stat_buffer_size must be >= 1"]),
    ("max_grad_norm=-1", ["max_grad_norm must be > 0"]),
    ("adv_clip_max=0", ["adv_clip_max must be > 0"]),
    ("seed=-1", ["seed must be >= 0"]),
    ("device=gpu", ["device='gpu'", "choose auto, cpu, cuda or cuda:N"]),
    # an override value that is not YAML was a ParserError traceback; it is read as text
    ("reward={a: 1", ["reward '{a: 1' is not a YAML mapping"]),
    # a reward named twice kept its last weight without a word
    ("reward={toy_aesthetic: 0.7, toy_aesthetic: 0.3}", ["is not a YAML mapping (each reward named once)"]),
    ("model=@x", ["unknown model spec '@x'"]),
]


@pytest.mark.parametrize("override, needles", TRAIN_CASES, ids=[c[0] for c in TRAIN_CASES])
def test_train_bad_override(cli, box, override, needles):
    fast = [] if override.startswith("epochs=") else ["epochs=1"]  # a key given twice is an error of its own
    rejected(cli, box, "train", TOY_CFG, "--out", box / "run", *fast, override, needles=needles)


def test_train_config_duplicate_key(cli, box):
    """PyYAML kept the last of two equal keys: the file seemed to say 2 epochs and trained 30."""
    (box / "dup.yaml").write_text("model: toy\nepochs: 2\nseed: 0\nepochs: 30\n")
    rejected(cli, box, "train", box / "dup.yaml", "--out", box / "run",
             needles=["not valid YAML at line 4", "key 'epochs' appears twice, first at line 2"])


def test_train_config_cuda_not_here(cli, box, monkeypatch):
    """device: cuda in the config on a machine without CUDA was a RuntimeError traceback."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    rejected(cli, box, "train", TOY_CFG, "--out", box / "run", "epochs=1", "device=cuda",
             needles=["config device='cuda' but CUDA is not available here"])


@pytest.mark.parametrize("text", ["a: {x: 1, x: 2}\n", "x: 1\nx: 1\n"])
def test_yaml_duplicate_keys_refused(tmp_path, text):
    (tmp_path / "f.yaml").write_text(text)
    with pytest.raises(UserError, match="appears twice"):
        read_yaml_mapping(tmp_path / "f.yaml", "config file", "")


def test_yaml_merge_keys_may_be_overridden(tmp_path):
    (tmp_path / "f.yaml").write_text("base: &b {x: 1, y: 2}\nc:\n  <<: *b\n  x: 3\n")
    assert read_yaml_mapping(tmp_path / "f.yaml", "config file", "")["c"] == {"x": 3, "y": 2}


def test_train_config_accepts_the_shipped_values():
    """The stricter reading keeps what the configs write: true/false, 0/1 booleans, whole floats."""
    cfg = load_config(TOY_CFG, ["paired_control=1", "same_noise_per_group=true", "epochs=2.0", "device=cpu"])
    assert cfg.paired_control is True and cfg.epochs == 2


# ---- study spec: eval and lmm are checked on load, not after training ----------------------------

SPEC_CASES = [
    ("eval", "steps", 0, "eval.steps 0"),
    ("eval", "batch_size", 0, "eval.batch_size 0"),
    ("eval", "max_prompts", 0, "eval.max_prompts 0"),
    ("eval", "cfg", float("nan"), "eval.cfg nan"),
    ("eval", "eta", -1, "eval.eta -1"),
    ("lmm", "alpha", 2, "lmm.alpha 2 must be a number in (0, 1)"),
    ("lmm", "alpha", 0, "lmm.alpha 0 must be a number in (0, 1)"),
]


@pytest.mark.parametrize("section, key, value, needle", SPEC_CASES,
                         ids=[f"{s}.{k}={v}" for s, k, v, _ in SPEC_CASES])
def test_study_spec_checked_on_load(cli, box, section, key, value, needle):
    spec = yaml.safe_load((ROOT / "analysis" / "toy_study.yaml").read_text())
    spec = copy.deepcopy(spec)
    spec[section][key] = value
    (box / "spec.yaml").write_text(yaml.safe_dump(spec))
    rejected(cli, box, "study", box / "spec.yaml", "--out", box / "study", needles=[needle])


# ---- generate / features: the flag the user typed ------------------------------------------------

@pytest.mark.parametrize("args, needle", [
    (["--max-prompts", "0"], "--max-prompts 0; use a whole number of prompts >= 1"),  # said "limit=0"
    (["--max-prompt-tokens", "2"], "--max-prompt-tokens 2; use a whole number of CLIP tokens >= 3"),
])
def test_generate_names_the_flag(cli, box, args, needle):
    rejected(cli, box, "generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--steps", "2",
             "--out", box / "set", "--no-progress", *args, needles=[needle])


@pytest.fixture(scope="module")
def tiny_set(tmp_path_factory) -> Path:
    """A complete toy image set: 1 prompt x 2 seeds, 2 steps."""
    from pcpo_eval.generate.runner import generate_set

    out = tmp_path_factory.mktemp("tiny") / "set"
    generate_set("toy", "toy", "2", out, steps=2, max_prompts=1, progress=False, device="cpu")
    return out


def test_features_output_suffix_names_output(cli, box, tiny_set):
    """The message named --out, a flag features does not have (it writes --output FILE)."""
    rejected(cli, box, "features", tiny_set, "--extractor", "toy", "--output", box / "features",
             needles=["--output", "must end in .npy"])


# ---- an --out set whose set.json is valid JSON of another shape; a corrupt manifest ---------------

@pytest.mark.parametrize("content", ["[]", '{"status": "complete", "settings": 5}'], ids=["list", "settings-int"])
def test_generate_out_set_json_not_a_record(cli, box, tiny_set, content):
    """A set.json that parses but is no set record was a TypeError traceback (exit 1)."""
    s = box / "set"
    shutil.copytree(tiny_set, s)
    (s / "set.json").write_text(content)
    rejected(cli, box, "generate", "--model", "toy", "--prompts", "toy", "--max-prompts", "1", "--seeds", "2",
             "--steps", "2", "--out", s, "--no-progress", needles=["set.json is unreadable", "choose a new --out"])


def test_metrics_corrupt_manifest_names_the_fix(cli, box, tiny_set):
    s = box / "set"
    shutil.copytree(tiny_set, s)
    (s / "manifest.parquet").write_bytes((tiny_set / "manifest.parquet").read_bytes()[:100])
    rejected(cli, box, "metrics", s, "--metrics", "lpips_toy", "--out", box / "m", "--no-progress",
             needles=["cannot read", "manifest.parquet", "re-run `pcpo-eval generate`"])


# ---- study --out: another study's folder, or a folder of the user's --------------------------------

@pytest.mark.parametrize("files, needle", [
    ({"spec.resolved.json": '{"name": "other_study"}', "study.yaml": "name: other_study\n"},
     "holds the study 'other_study'"),  # its spec.resolved.json was overwritten, then the stage failed
    ({"notes.txt": "mine"}, "exists and is not a study folder (it holds 'notes.txt')"),  # .lock, logs/ added
])
def test_study_out_of_another_kind(cli, box, files, needle):
    out = box / "out"
    out.mkdir()
    for name, text in files.items():
        (out / name).write_text(text)
    rejected(cli, box, "study", ROOT / "analysis" / "toy_study.yaml", "--out", out, "--stages", "report",
             "--no-progress", needles=[needle, "choose"])


# ---- irg-sweep: the sampling options of a sweep file are generate's, checked on load ---------------

@pytest.mark.parametrize("key, value, needle", [
    ("eta", -1, "eta -1; use a finite eta from 0"),
    ("cfg", "high", "cfg high; use a finite guidance weight"),
    ("max_prompts", 0, "max_prompts 0; use a whole number of prompts >= 1"),
    ("seeds", "abc", "--seeds 'abc' is malformed"),
    ("lambdas", [[1e308]], "lambdas: weight 1e+308: use a finite weight within +-1000"),
])
def test_irg_sweep_sampling_options(cli, box, key, value, needle):
    sweep = yaml.safe_load((ROOT / "analysis" / "irg" / "toy_irg.yaml").read_text())
    sweep[key] = value
    (box / "sweep.yaml").write_text(yaml.safe_dump(sweep))
    rejected(cli, box, "irg-sweep", box / "sweep.yaml", "--out", box / "sweep", needles=["IRG sweep file", needle])


# ---- report: an --output that is a folder, a --figures-dir that is a file (before any figure) ------

@pytest.mark.usefixtures("all_figure_formats")
@pytest.mark.parametrize("flag, kind, needle", [
    ("--output", "folder", "--output {path} is a folder; give a file name inside it"),
    ("--figures-dir", "file", "--figures-dir {path} is a file, not a folder"),
    ("--figures-dir", "image set", "--figures-dir {path}/figs lies inside the image set {path}"),
])
def test_report_output_of_the_wrong_kind(cli, box, flag, kind, needle):
    import json

    from pcpo_eval.io import to_jsonable
    from tests.support.report import synthetic_results

    study = box / "study"
    study.mkdir()
    (study / "results.json").write_text(json.dumps(to_jsonable(synthetic_results(study))))
    path = box / "target"
    path.mkdir() if kind != "file" else path.write_text("mine")
    if kind == "image set":  # figures were written among a set's images and records (a review)
        (path / "set.json").write_text("{}")
    target = path / "figs" if kind == "image set" else path
    rejected(cli, box, "report", study, flag, target, needles=[needle.format(path=path.resolve())])


# ---- study --stages that start after a stage never run: refused before the folder is made ----------

@pytest.mark.parametrize("stages, needle", [
    ("report", "results.json not found (the stats stage writes it)"),
    ("stats,report", "selection.json not found (the select stage writes it)"),
    ("generate", "selection.json not found (the select stage writes it)"),
])
def test_study_stages_before_their_inputs(cli, box, stages, needle):
    rejected(cli, box, "study", ROOT / "analysis" / "toy_study.yaml", "--out", box / "new", "--stages", stages,
             "--no-progress", needles=[needle, "run the earlier stages first"])


def test_report_on_a_run_folder_says_what_a_report_needs(cli, box):
    run = box / "run"
    (run / "checkpoints").mkdir(parents=True)
    (run / "config.yaml").write_text("model: toy\n")
    rejected(cli, box, "report", run, needles=["is a training run, not a study", "list them in a study spec"])


def test_lmm_formula_in_lme4_syntax_names_the_group_option(cli, box):
    """A study spec's "value ~ algorithm + (1|prompt)" in `lmm --formula` gave patsy's TypeError and advice
    about missing values."""
    (box / "d.csv").write_text("value,algorithm,prompt\n1,A,p\n2,B,p\n")
    rejected(cli, box, "lmm", box / "d.csv", "--formula", "value ~ algorithm + (1|prompt)", "--group", "prompt",
             needles=["holds a random-effect term", "--group prompt"])


def test_bertscore_server_port_is_checked_before_the_models_load(cli, box):
    rejected(cli, box, "bertscore-server", "--port", "99999", needles=["--port 99999", "between 1 and 65535"])


def test_a_corrupt_log_and_a_response_without_rater_name_their_fix(tmp_path):
    import pandas as pd

    from pcpo_eval.errors import UserError
    from pcpo_eval.human.tables import validate_responses
    from pcpo_eval.rundir import load_log

    (tmp_path / "log.parquet").write_bytes(b"PAR1 not really")
    with pytest.raises(UserError, match=r"cannot read log .*\(.*\); restore it from a copy"):
        load_log(tmp_path / "log.parquet")
    pairs = pd.DataFrame({"pair_id": ["p1"]})
    resp = pd.DataFrame({"pair_id": ["p1", "p1"], "rater_id": [None, None], "choice": ["left", "right"]})
    with pytest.raises(UserError, match="2 response\\(s\\) have no rater_id"):  # it read "rater None ... twice"
        validate_responses(resp, pairs)


def test_a_failing_sqlite_file_gets_file_advice_not_server_advice():
    from sqlalchemy.exc import DatabaseError

    from pcpo_eval.human.db import _db_problem

    exc = DatabaseError("SELECT 1", {}, Exception("database disk image is malformed"))
    msg = _db_problem("sqlite:////tmp/h/human.db", exc)
    assert "damaged or cut short: restore it from a copy" in msg and "running and reachable" not in msg
    assert "running and reachable" in _db_problem("postgresql+psycopg://u@host/db", exc)


def test_a_file_as_model_and_a_missing_scheduler_config_name_the_fix(cli, box):
    (box / "notes.txt").write_text("x")
    rejected(cli, box, "generate", "--model", box / "notes.txt", "--prompts", "toy", "--seeds", "1", "--out",
             box / "g", needles=["a file; a model is a run or checkpoint folder"])  # it said "no such file"
    rejected(cli, box, "credit", "ddim", "--scheduler-config", box / "missing.json",
             needles=["(No such file or directory); give a diffusers scheduler_config.json"])
