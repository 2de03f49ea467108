"""One command-module style: every ``pcpo_eval/<stage>/commands.py`` defines its commands at module level
(``<name>_cmd`` functions, or a ``<group>_app`` Typer whose commands are decorated at module level), and its
``register(app)`` only attaches them (``app.command("name")(name_cmd)`` / ``app.add_typer(group_app, ...)``).
So a command is importable and testable by name, and ``register`` reads as the stage's command list
(docs/architecture.md#command-modules)."""

from __future__ import annotations

import ast
from pathlib import Path

import pytest

PKG = Path(__file__).resolve().parents[2] / "pcpo_eval"
MODULES = sorted(PKG.glob("*/commands.py"))


def _register(tree: ast.Module) -> ast.FunctionDef:
    found = [n for n in tree.body if isinstance(n, ast.FunctionDef) and n.name == "register"]
    assert len(found) == 1, "needs one module-level register(app)"
    return found[0]


def _attaches(stmt: ast.stmt) -> bool:
    """``app.command("x")(fn)`` or ``app.add_typer(group_app, name=...)`` (a docstring is allowed too)."""
    if not isinstance(stmt, ast.Expr):
        return False
    call = stmt.value
    if isinstance(call, ast.Constant) and isinstance(call.value, str):
        return True
    if not isinstance(call, ast.Call):
        return False
    if isinstance(call.func, ast.Attribute) and call.func.attr == "add_typer":
        return len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id.endswith("_app")
    inner = call.func
    return (isinstance(inner, ast.Call) and isinstance(inner.func, ast.Attribute) and inner.func.attr == "command"
            and len(call.args) == 1 and isinstance(call.args[0], ast.Name) and call.args[0].id.endswith("_cmd"))


def test_every_stage_with_commands_is_found():
    assert {m.parent.name for m in MODULES} >= {"generate", "train", "metrics", "stats", "study", "human", "credit"}


@pytest.mark.parametrize("module", MODULES, ids=lambda p: p.parent.name)
def test_register_only_attaches_module_level_commands(module):
    tree = ast.parse(module.read_text())
    bad = [ast.unparse(s).splitlines()[0] for s in _register(tree).body if not _attaches(s)]
    assert not bad, f"{module.relative_to(PKG.parent)}: register() should only attach module-level commands; found {bad}"
    groups = [t.id for n in tree.body if isinstance(n, ast.Assign) for t in n.targets
              if isinstance(t, ast.Name) and isinstance(n.value, ast.Call) and ast.unparse(n.value.func) == "typer.Typer"]
    assert all(g.endswith("_app") for g in groups), f"command groups are named <group>_app: {groups}"
