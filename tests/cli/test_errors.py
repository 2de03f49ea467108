"""Usage errors of the command line: one line ``error: <problem>; <fix>``, exit code 2, no traceback.

One test per class of usage error (docs/cli.md#errors), in-process through ``pcpo_eval.cli.main``
(the ``cli`` fixture), plus two real subprocesses for the console entry point.
"""

from __future__ import annotations

import os
import subprocess
import sys
import tomllib
from importlib.metadata import version
from pathlib import Path

import pytest

import pcpo_eval
from pcpo_eval.cli import one_line

ROOT = Path(__file__).resolve().parents[2]


def assert_usage_error(res, *needles: str) -> str:
    """Exit 2, nothing on stdout, exactly one stderr line ``error: problem; fix`` containing ``needles``."""
    assert res.returncode == 2, (res.returncode, res.stderr)
    lines = res.stderr.strip().splitlines()
    assert len(lines) == 1, res.stderr
    line = lines[0]
    assert line.startswith("error: ") and "; " in line, line
    assert "Traceback" not in res.stderr and "╭" not in res.stderr
    for needle in needles:
        assert needle in line, (needle, line)
    return line


@pytest.mark.parametrize(
    "args, needles",
    [
        (["generate", "--bogus"], ["no such option: --bogus", "pcpo-eval generate --help"]),
        (["credit", "ddim", "--nope", "1"], ["--nope", "pcpo-eval credit ddim --help"]),
        (["lmm", "x.csv", "--formula", "y ~ x", "--group", "g", "--frobnicate"], ["--frobnicate"]),
    ],
)
def test_unknown_option(cli, args, needles):
    assert_usage_error(cli(*args), *needles)


def test_unknown_command_lists_the_commands(cli):
    line = assert_usage_error(cli("nosuch"), "no such command 'nosuch'", "choose one of:")
    for name in ("train", "generate", "metrics", "lmm", "study", "report"):
        assert name in line


def test_unknown_subcommand_lists_the_group(cli):
    assert_usage_error(cli("credit", "nope"), "no such command 'nope'", "choose one of: ddim, flow")


@pytest.mark.parametrize(
    "args, needle",
    [
        (["lmm"], "missing argument 'data'"),
        (["train", "--out", "x"], "missing argument 'config'"),
        (["generate", "--prompts", "toy", "--seeds", "2", "--out", "x"], "missing option '--model'"),
        (["select", "run", "--window", "3"], "missing option '--target'"),
    ],
)
def test_missing_argument_or_option(cli, args, needle):
    assert_usage_error(cli(*args), needle)


@pytest.mark.parametrize(
    "args, needle",
    [
        (["credit", "ddim", "--steps", "abc"], "invalid value for '--steps'"),
        (["credit", "flow", "--eta", "high"], "invalid value for '--eta'"),
        (["generate", "--model", "toy", "--prompts", "toy", "--seeds", "2", "--out", "x", "--batch-size", "1.5"],
         "invalid value for '--batch-size'"),
        (["speedup", "--baseline", "a", "--pcpo", "b", "--target", "x"], "invalid value for '--target'"),
    ],
)
def test_malformed_value(cli, args, needle):
    assert_usage_error(cli(*args), needle)


@pytest.mark.parametrize("args", [["credit", "ddim", "--steps"], ["generate", "--seeds"], ["human", "design", "--out"]])
def test_option_without_its_value(cli, args):
    """The help to read is the command's (it pointed at the root's: click gives no context here)."""
    res = cli(*args)
    assert_usage_error(res, f"option '{args[-1]}' requires an argument")
    assert f"see `pcpo-eval {' '.join(args[:-1])} --help`" in res.stderr


def test_version(cli):
    res = cli("--version")
    assert res.returncode == 0 and res.stderr == ""
    assert res.stdout.strip() == f"pcpo-eval {pcpo_eval.__version__}"
    meta = tomllib.loads((ROOT / "pyproject.toml").read_text())
    assert pcpo_eval.__version__ == meta["project"]["version"]


@pytest.mark.parametrize("args", [[], ["credit"], ["toy"]])
def test_bare_group_prints_its_help(cli, args):
    res = cli(*args)
    assert res.returncode == 0 and "Usage:" in res.stdout and res.stderr == ""


def test_user_error_is_folded_to_one_line(cli, tmp_path):
    bad = tmp_path / "spec.yaml"
    bad.write_text("a: [1,\n")  # invalid YAML: the parser's message spans lines
    res = cli("study", str(bad), "--out", str(tmp_path / "s"))
    line = assert_usage_error(res, "not valid YAML")
    assert str(bad) in line


def test_os_path_error_is_one_line(cli, monkeypatch):
    """A path the OS refuses, which no library check caught, is still one line and exit 2."""
    import pcpo_eval.weights.commands as wc

    def refuse(name):
        raise PermissionError(13, "Permission denied", "/some/where")

    monkeypatch.setattr(wc, "status", refuse)
    assert_usage_error(cli("weights", "toy"), "permission denied: /some/where")


def test_other_exceptions_keep_their_traceback(cli, monkeypatch):
    """Bugs are not disguised as user errors."""
    import pcpo_eval.weights.commands as wc

    def bug(name):
        raise ZeroDivisionError("bug")

    monkeypatch.setattr(wc, "status", bug)
    with pytest.raises(ZeroDivisionError):
        cli("weights", "toy")


def test_one_line_folds_blanks():
    assert one_line("a\n  b\tc\n") == "a b c"


def test_typer_pin_admits_installed_typer():
    """pyproject pins typer to the range whose exceptions pcpo_eval/cli.py catches."""
    from packaging.requirements import Requirement

    deps = tomllib.loads((ROOT / "pyproject.toml").read_text())["project"]["dependencies"]
    (req,) = [Requirement(d) for d in deps if d.startswith("typer")]
    assert req.specifier.contains(version("typer")), (str(req), version("typer"))
    assert not any(d.startswith("click") for d in deps)  # vendored by typer >= 0.26


def _run(*args: str) -> subprocess.CompletedProcess:
    env = {**os.environ, "OMP_NUM_THREADS": "1"}
    return subprocess.run([sys.executable, "-m", "pcpo_eval", *args], capture_output=True, text=True,
                          env=env, cwd=ROOT, timeout=120)


def test_real_process_usage_error_and_version():
    bad = _run("train", "--bogus")
    assert bad.returncode == 2 and bad.stdout == ""
    assert bad.stderr.count("\n") == 1 and bad.stderr.startswith("error: no such option: --bogus")
    ver = _run("--version")
    assert ver.returncode == 0 and ver.stdout == f"pcpo-eval {pcpo_eval.__version__}\n" and ver.stderr == ""


# ---- one meaning per flag: --device, --json ----------------------------------------------------

@pytest.fixture
def two_gpus(monkeypatch):
    """Pretend CUDA with two devices; this process is torchrun's LOCAL_RANK 1."""
    import torch

    monkeypatch.setattr(torch.cuda, "is_available", lambda: True)
    monkeypatch.setattr(torch.cuda, "device_count", lambda: 2)
    monkeypatch.setenv("LOCAL_RANK", "1")


def test_resolve_device(monkeypatch, two_gpus):
    from pcpo_eval.dist import resolve_device

    assert resolve_device("auto") == "cuda:1" and resolve_device("AUTO") == "cuda:1"
    assert resolve_device("cpu") == "cpu" and resolve_device("cuda:0") == "cuda:0"
    monkeypatch.setenv("LOCAL_RANK", "3")
    assert resolve_device("auto") == "cuda:1"  # LOCAL_RANK modulo the visible devices


def test_resolve_device_without_cuda(monkeypatch):
    import torch

    from pcpo_eval.dist import resolve_device
    from pcpo_eval.errors import UserError

    monkeypatch.setattr(torch.cuda, "is_available", lambda: False)
    assert resolve_device("auto") == "cpu"
    with pytest.raises(UserError, match="CUDA is not available"):
        resolve_device("cuda:0")
    with pytest.raises(UserError, match="unknown --device 'gpu'"):
        resolve_device("gpu")


def test_generate_and_metrics_put_each_rank_on_its_gpu(cli, monkeypatch, tmp_path, two_gpus):
    """The multi-GPU bug: generate/metrics used one --device for every torchrun process."""
    from types import SimpleNamespace

    import pcpo_eval.generate.runner as runner
    import pcpo_eval.metrics.workers as workers

    seen = {}
    monkeypatch.setattr(runner, "generate_set", lambda *a, **k: seen.setdefault("generate", k["device"])
                        and SimpleNamespace(rank=1))
    monkeypatch.setattr(workers, "run_metrics", lambda s, m, o, r, opts: seen.setdefault("metrics", opts.device)
                        and {"metrics": {}})
    res = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", tmp_path / "s")
    assert res.returncode == 0, res.stderr
    res = cli("metrics", tmp_path / "s", "--out", tmp_path / "m", "--json")
    assert res.returncode == 0, res.stderr
    assert seen == {"generate": "cuda:1", "metrics": "cuda:1"}


def test_train_device_flag_overrides_config(cli, monkeypatch, tmp_path):
    import pcpo_eval.train.trainer as trainer

    seen = []
    monkeypatch.setattr(trainer, "train", lambda cfg, out, resume=False, progress=None: seen.append(cfg.device) or [])
    cfg = ROOT / "train" / "configs" / "toy_pcpo.yaml"  # device: cpu
    assert cli("train", cfg, "--out", tmp_path / "r").returncode == 0
    assert cli("train", cfg, "--out", tmp_path / "r", "--device", "auto").returncode == 0
    assert seen == ["cpu", "auto"]  # auto is resolved per rank by the trainer (pick_device)


@pytest.mark.parametrize("args", [
    ["weights", "inception", "--json"],
    ["credit", "ddim", "--steps", "5", "--json"],
    ["credit", "flow", "--steps", "4", "--json"],
])
def test_json_flag_prints_only_json(cli, args):
    import json

    res = cli(*args)
    assert res.returncode == 0, res.stderr
    assert isinstance(json.loads(res.stdout), dict)
