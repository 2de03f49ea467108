"""Every benchmark names package modules and names that exist.

Most benchmarks are run by hand (``make bench`` or one script), not by the test suite, so a module
moved in the package silently breaks them: ``bench_flow.py`` and ``bench_trainer.py`` imported
``pcpo_eval.train_config`` for weeks after it had moved to ``pcpo_eval.train.config``. This test reads
each script's imports (top level, inside functions, and in the code strings a script runs in a child
process, such as ``objective_timing.CHILD``) without running it and resolves every ``pcpo_eval``
module and imported name.
"""

from __future__ import annotations

import ast
import importlib
from pathlib import Path

import pytest

BENCHMARKS = Path(__file__).resolve().parents[2] / "benchmarks"
SCRIPTS = sorted(BENCHMARKS.rglob("*.py"))


def code_strings(tree: ast.AST) -> list[ast.AST]:
    """The string constants of ``tree`` that parse as Python and import ``pcpo_eval`` (child-process code)."""
    out = []
    for node in ast.walk(tree):
        if isinstance(node, ast.Constant) and isinstance(node.value, str) and "import" in node.value \
                and "pcpo_eval" in node.value:
            try:
                out.append(ast.parse(node.value))
            except SyntaxError:
                continue
    return out


def package_imports(path: Path) -> list[tuple[int, str, str | None]]:
    """(line, module, imported name or None) of each ``pcpo_eval`` import anywhere in ``path``, code
    strings included (their lines counted within the string)."""
    out: list[tuple[int, str, str | None]] = []
    tree = ast.parse(path.read_text(), filename=str(path))
    for node in (n for t in (tree, *code_strings(tree)) for n in ast.walk(t)):
        if isinstance(node, ast.Import):
            out += [(node.lineno, a.name, None) for a in node.names if a.name.split(".")[0] == "pcpo_eval"]
        elif isinstance(node, ast.ImportFrom) and node.level == 0 and (node.module or "").split(".")[0] == "pcpo_eval":
            out += [(node.lineno, node.module, a.name) for a in node.names]
    return out


def unresolved(module: str, name: str | None) -> str | None:
    """Why ``from module import name`` (or ``import module``) would fail, or None."""
    try:
        mod = importlib.import_module(module)
    except ImportError as e:
        return f"module {module}: {e}"
    if name is None or name == "*" or hasattr(mod, name):
        return None
    try:
        importlib.import_module(f"{module}.{name}")
    except ImportError:
        return f"{module} has no {name}"
    return None


def test_the_benchmarks_are_found() -> None:
    assert len(SCRIPTS) > 20 and any(p.parent.name == "gpu" for p in SCRIPTS)


@pytest.mark.parametrize("path", SCRIPTS, ids=lambda p: str(p.relative_to(BENCHMARKS)))
def test_benchmark_imports_resolve(path: Path) -> None:
    problems = [f"{path.name}:{line}: {why}" for line, module, name in package_imports(path)
                if (why := unresolved(module, name))]
    assert not problems, "\n".join(problems)


def test_a_moved_module_is_caught(tmp_path: Path) -> None:
    script = tmp_path / "bench_old.py"
    child = "import json\nfrom pcpo_eval.trainer import train\n"
    script.write_text("def main():\n    from pcpo_eval.train_config import load_config\n"
                      "    from pcpo_eval.train.config import no_such_name\n"
                      f"CHILD = {child!r}\n")
    found = sorted(str(unresolved(m, n)) for _, m, n in package_imports(script))
    assert len(found) == 3
    assert found[0].startswith("module pcpo_eval.train_config") and found[1].startswith("module pcpo_eval.trainer")
    assert found[2] == "pcpo_eval.train.config has no no_such_name"
