"""Shared test fixtures."""

from __future__ import annotations

import os
import sys
import tempfile
from dataclasses import dataclass

# Every ordinary test runs on CPU, as CI does, whatever GPUs this machine has: `--device auto` would
# otherwise move the trainer and generator tests to a GPU, where their bitwise expectations are not
# defined. Tests marked `cuda` (tests/gpu/test_cuda.py) run their scenarios in subprocesses that see the
# GPUs this variable remembers. Set before torch is imported, so CUDA never initialises here.
os.environ.setdefault("PCPO_EVAL_TEST_CUDA_VISIBLE_DEVICES", os.environ.get("CUDA_VISIBLE_DEVICES", "<all>"))
os.environ["CUDA_VISIBLE_DEVICES"] = ""
# Figures as 300-dpi PNG only (no SVG / PDF: ~15 s per study report); the tests of the vector files
# take this back with the `all_figure_formats` fixture below.
os.environ["PCPO_EVAL_FIGURE_FORMATS"] = "png"

import pytest  # noqa: E402
import torch  # noqa: E402

# Torch threads: one per pytest-xdist worker (`make test` runs two workers on CI's two cores: 687 s for
# the suite, against 1,177 s in one process with two threads, 2026-11-26); two in a single process (a
# one-thread single process took 1,299 s). Modules whose results need one thread opt in with `one_thread`.
torch.set_num_threads(1 if os.environ.get("PYTEST_XDIST_WORKER") else 2)


@pytest.fixture(scope="session", autouse=True)
def _session_tmpdir(tmp_path_factory):
    """Temporary files of the whole session -- ours, torchrun's ``torchelastic_*`` logs, those of the
    subprocesses the tests start -- go under pytest's base folder, which pytest prunes (it keeps the last
    three sessions), instead of piling up in ``/tmp`` at every run."""
    folder = tmp_path_factory.mktemp("tmpdir")
    old_env, old_dir = os.environ.get("TMPDIR"), tempfile.tempdir
    # the system's own, for the few tests whose files another user must reach (pytest's folder is private)
    os.environ.setdefault("PCPO_EVAL_TEST_SYSTEM_TMPDIR", tempfile.gettempdir())
    os.environ["TMPDIR"], tempfile.tempdir = str(folder), str(folder)
    yield folder
    tempfile.tempdir = old_dir
    if old_env is None:
        os.environ.pop("TMPDIR", None)
    else:
        os.environ["TMPDIR"] = old_env


@pytest.fixture(scope="module")
def one_thread():
    """One intra-op torch thread for a module's tests (shared 2-core machine; results do not depend on
    it). A module opts in with ``pytestmark = pytest.mark.usefixtures("one_thread")``."""
    n = torch.get_num_threads()
    torch.set_num_threads(1)
    yield
    torch.set_num_threads(n)


@pytest.fixture
def aot_eager(monkeypatch):
    """``torch.compile`` with dynamo's ``aot_eager`` backend: the graph capture and our wrapping of the
    compiled module run for real, without inductor's minute of C++ compilation per test on CPU."""
    real = torch.compile
    monkeypatch.setattr(torch, "compile", lambda model, **kw: real(model, **{**kw, "backend": "aot_eager"}))
    yield
    torch._dynamo.reset()


@dataclass
class CliResult:
    returncode: int
    stdout: str
    stderr: str


@pytest.fixture
def cli(capsys, monkeypatch):
    """Run ``pcpo-eval ARGS...`` in-process (fast: no interpreter start); returns a CliResult."""
    from pcpo_eval.cli import main

    def run(*args: str) -> CliResult:
        capsys.readouterr()
        monkeypatch.setattr(sys, "argv", ["pcpo-eval", *map(str, args)])
        code = 0
        try:
            main()
        except SystemExit as exc:
            code = exc.code if isinstance(exc.code, int) else (0 if exc.code is None else 1)
        out = capsys.readouterr()
        return CliResult(code, out.out, out.err)

    return run


def pytest_configure(config):
    config.addinivalue_line("markers", "exhaustive: skipped unless pytest --exhaustive (make test-full): the paper-spec "
                            "end-to-end runs beyond CI's representative subset")


def pytest_addoption(parser):
    parser.addoption("--exhaustive", action="store_true", default=False,
                     help="also run the tests marked 'exhaustive' (every paper spec end to end; docs/README.md#tests)")


def pytest_collection_modifyitems(config, items):
    """Tests marked ``exhaustive`` are skipped (with the reason) unless ``--exhaustive`` is given."""
    if config.getoption("--exhaustive"):
        return
    skip = pytest.mark.skip(reason="exhaustive: not in CI's representative subset; run with --exhaustive (make test-full)")
    for item in items:
        if item.get_closest_marker("exhaustive") is not None:
            item.add_marker(skip)


@pytest.fixture
def all_figure_formats(monkeypatch):
    """Write every figure format (SVG, PDF, PNG), as outside the tests (``PCPO_EVAL_FIGURE_FORMATS`` unset)."""
    monkeypatch.delenv("PCPO_EVAL_FIGURE_FORMATS", raising=False)
