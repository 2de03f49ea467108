"""Each folder-format file name is spelled in exactly one module of the package (its home).

A stage that needs ``RUN/log.parquet`` or ``STUDY/results.json`` asks the home
(:mod:`pcpo_eval.rundir`, :mod:`pcpo_eval.studydir`, :mod:`pcpo_eval.imageset`,
:mod:`pcpo_eval.metricsdir`; the folders one stage keeps to itself: ``HUMAN/`` in
:mod:`pcpo_eval.human`, an IRG sweep's in :mod:`pcpo_eval.study.irg_sweep`) for the path
instead of spelling the name; docs/architecture.md#folder-contracts. Counted: string constants
(f-string parts included, docstrings not) with the name as a whole path component, so prose in
an error message ("run X has no log.parquet; ...") is not a spelling.
"""

from __future__ import annotations

import ast
import functools
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pcpo_eval"

#: file name -> the one module (relative to the package) allowed to spell it
HOMES = {
    "log.parquet": "rundir.py",
    "checkpoint.json": "rundir.py",
    "config.yaml": "rundir.py",
    "training_state.pt": "rundir.py",
    "inputs.json": "rundir.py",
    "init_from.json": "rundir.py",
    "results.json": "studydir.py",
    "selection.json": "studydir.py",
    "spec.resolved.json": "studydir.py",
    "study_state.json": "studydir.py",
    "human.json": "studydir.py",
    "set.json": "imageset.py",
    "manifest.parquet": "imageset.py",
    "metrics.json": "metricsdir.py",
    "per_prompt.parquet": "metricsdir.py",
    "per_image.parquet": "metricsdir.py",
    "design.json": "human/__init__.py",
    "pairs.parquet": "human/__init__.py",
    "human.db": "human/__init__.py",
    "responses.parquet": "human/__init__.py",
    "analysis.json": "human/__init__.py",
    "server.json": "human/__init__.py",
    "bundle.json": "human/__init__.py",
    ".design_secret": "human/__init__.py",
    "sweep.json": "study/irg_sweep.py",
    "sweep.parquet": "study/irg_sweep.py",
    "tradeoff.png": "study/irg_sweep.py",
}


def _docstrings(tree: ast.AST) -> set[int]:
    out = set()
    for node in ast.walk(tree):
        if isinstance(node, ast.Module | ast.ClassDef | ast.FunctionDef | ast.AsyncFunctionDef) and node.body:
            first = node.body[0]
            if isinstance(first, ast.Expr) and isinstance(first.value, ast.Constant):
                out.add(id(first.value))
    return out


@functools.cache
def _spellings() -> dict[str, set[str]]:
    found: dict[str, set[str]] = {name: set() for name in HOMES}
    for path in PKG.rglob("*.py"):
        tree = ast.parse(path.read_text())
        skip = _docstrings(tree)
        for node in ast.walk(tree):
            if isinstance(node, ast.Constant) and isinstance(node.value, str) and id(node) not in skip:
                for part in node.value.split("/"):
                    if part in found:
                        found[part].add(str(path.relative_to(PKG)))
    return found


@pytest.mark.parametrize("name", sorted(HOMES))
def test_file_name_has_one_home(name):
    where = _spellings()[name]
    assert where == {HOMES[name]}, (f"{name!r} is spelled in {sorted(where)}; use the constants / functions of "
                                    f"pcpo_eval/{HOMES[name]} instead")
