"""Shared test fixtures."""

from __future__ import annotations

import sys
from dataclasses import dataclass

import pytest
import torch

torch.set_num_threads(2)


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
