"""The package tree is the data flow: no import cycles, no import from a lower stage to a higher one.

Every ``import`` in the package counts, including the ones inside functions (a lazy import is
still a dependency). Stages are ranked in data-flow order; a module may import its own stage and
any stage ranked below it. Only ``study`` (the orchestrator) sees every stage; ``cli`` assembles
the areas' ``commands`` modules. No library module imports ``typer`` (only ``commands`` modules
and ``cli``).
"""

from __future__ import annotations

import ast
from pathlib import Path

import networkx as nx
import pytest

PKG = Path(__file__).resolve().parents[2] / "pcpo_eval"

#: Stage (top-level module or subpackage of pcpo_eval) -> rank in the data flow.
#: A blocked import means: move the fact down (to a ground-floor module every stage may read), not
#: copy it. The folder formats that cross stages live on the ground floor: ``imageset`` (an image
#: set), ``rundir`` (a training run), ``metricsdir`` (a metrics folder), ``studydir`` (a study);
#: docs/architecture.md.
#: ``train`` < ``generate`` < ``metrics`` is the data-flow order, not a helper dependency: generate
#: loads checkpoints through ``train.checkpoints``; metrics reads image sets through ``imageset`` and
#: imports neither train nor generate (the shared ``--device`` reading is ``dist.resolve_device``).
RANKS: dict[str, int] = {
    # flat base modules
    "errors": 0, "flags": 0, "io": 1, "seeding": 1, "dist": 1, "registry": 1, "precision": 1, "rundir": 1, "progress": 1,
    "metricsdir": 1,  # the metrics output folder (metrics.json, per_prompt / per_image tables)
    "studydir": 2,  # the study folder (paths, selection.json, results.json's one writer)
    "toy": 2,  # the toy world: data, text, model, classifier (no pipeline code)
    "figfiles": 2,  # paper figure sizes, fonts and files (report and credit figures)
    "imageset": 3, "weights": 3,
    "prompts": 4,  # reads the HF hub cache location from weights.locate
    # the pipeline
    "models": 4, "credit": 4,
    "samplers": 5,
    "features": 6, "rewards": 6,
    "train": 7,
    "generate": 8,
    "metrics": 9,
    "stats": 10,
    "report": 11,
    "toylab": 12,  # applications over the toy world: pretraining and checks
    "study": 13,  # the orchestrator: the only stage that knows all others
    "human": 14,  # the human preference study over a finished study
    "testing": 15, "cli": 16, "__main__": 17, "__init__": 17,
}  # fmt: skip


def _module_name(path: Path) -> str:
    rel = path.relative_to(PKG.parent).with_suffix("")
    parts = list(rel.parts)
    if parts[-1] == "__init__":
        parts = parts[:-1]
    return ".".join(parts)


def _imports(path: Path) -> set[str]:
    """Every pcpo_eval module this file imports (``from a import b`` counts ``a.b`` if it is a module)."""
    out: set[str] = set()
    tree = ast.parse(path.read_text())
    for node in ast.walk(tree):
        if isinstance(node, ast.Import):
            out |= {a.name for a in node.names if a.name.startswith("pcpo_eval")}
        elif isinstance(node, ast.ImportFrom) and node.module and node.module.startswith("pcpo_eval"):
            out.add(node.module)
            for a in node.names:
                sub = f"{node.module}.{a.name}"
                if (PKG.parent / sub.replace(".", "/")).with_suffix(".py").exists() or (
                    PKG.parent / sub.replace(".", "/") / "__init__.py"
                ).exists():
                    out.add(sub)
    return out


def _graph() -> nx.DiGraph:
    g = nx.DiGraph()
    for path in PKG.rglob("*.py"):
        name = _module_name(path)
        g.add_node(name)
        for dep in _imports(path):
            if dep != name and dep != "pcpo_eval":
                g.add_edge(name, dep)
    return g


def _stage(module: str) -> str:
    parts = module.split(".")
    return parts[1] if len(parts) > 1 else "__init__"


def test_every_stage_is_ranked():
    stages = {_stage(m) for m in _graph().nodes}
    assert stages <= set(RANKS), f"unranked stages: {sorted(stages - set(RANKS))}; add them to RANKS"


def test_no_module_import_cycles():
    cycles = list(nx.simple_cycles(_graph()))
    assert not cycles, f"import cycles: {cycles[:5]}"


def test_no_upward_imports_between_stages():
    bad = []
    for a, b in _graph().edges:
        sa, sb = _stage(a), _stage(b)
        if sa != sb and RANKS[sb] >= RANKS[sa]:
            bad.append(f"{a} -> {b}")
    assert not bad, "imports from a lower stage to a higher (or equal-rank) one:\n" + "\n".join(sorted(bad))


def test_only_command_modules_import_typer():
    offenders = []
    for path in PKG.rglob("*.py"):
        if path.name in ("commands.py", "flow_commands.py", "cli.py"):
            continue
        tree = ast.parse(path.read_text())
        for node in ast.walk(tree):
            names = [a.name for a in node.names] if isinstance(node, ast.Import) else (
                [node.module or ""] if isinstance(node, ast.ImportFrom) else [])
            if any(n == "typer" or n.startswith("typer.") for n in names):
                offenders.append(_module_name(path))
    assert not offenders, f"library modules importing typer: {sorted(set(offenders))}"


def test_no_bare_import_error_fallbacks():
    """``except ImportError`` can hide a real error inside an installed package; use
    :func:`pcpo_eval.registry.optional_module` instead."""
    offenders = []
    for path in PKG.rglob("*.py"):
        for node in ast.walk(ast.parse(path.read_text())):
            if isinstance(node, ast.ExceptHandler) and isinstance(node.type, ast.Name) and node.type.id == "ImportError":
                offenders.append(f"{_module_name(path)}:{node.lineno}")
    assert not offenders, offenders


@pytest.mark.parametrize("stage", ["study"])
def test_only_the_orchestrator_sees_every_pipeline_stage(stage):
    pipeline = {"train", "generate", "metrics", "stats", "report"}
    seen: dict[str, set[str]] = {}
    for a, b in _graph().edges:
        seen.setdefault(_stage(a), set()).add(_stage(b))
    full = [s for s, deps in seen.items() if pipeline - {s} <= deps and s not in ("cli", "testing")]
    assert full == [stage], f"stages that import every pipeline stage: {full}"


def _stage_deps() -> dict[str, set[str]]:
    seen: dict[str, set[str]] = {}
    for a, b in _graph().edges:
        if _stage(a) != _stage(b):
            seen.setdefault(_stage(a), set()).add(_stage(b))
    return seen


def test_metrics_does_not_depend_on_train_or_generate():
    """metrics reads image sets (``imageset``), never a trainer or generator module (see RANKS)."""
    assert not _stage_deps().get("metrics", set()) & {"train", "generate"}


def test_human_reads_the_study_folder_through_studydir():
    """The human study reads a finished study through ``pcpo_eval.studydir``, not the study stage."""
    assert "study" not in _stage_deps().get("human", set())


def test_no_function_over_80_lines_without_a_reason():
    """A function longer than ~80 lines needs a reason written next to it (a ``# long: ...`` comment)."""
    offenders = []
    for path in PKG.rglob("*.py"):
        src = path.read_text()
        lines = src.splitlines()
        for node in ast.walk(ast.parse(src)):
            if isinstance(node, ast.FunctionDef | ast.AsyncFunctionDef) and node.end_lineno - node.lineno + 1 > 80:
                head = "\n".join(lines[max(node.lineno - 3, 0) : node.lineno + 2])
                if "# long:" not in head:
                    offenders.append(f"{_module_name(path)}.{node.name} ({node.end_lineno - node.lineno + 1} lines)")
    assert not offenders, offenders
