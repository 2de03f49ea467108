"""``benchmarks/run_all.py`` (``make bench``) replaces only the sections of the scripts it ran.

Before, it rewrote RESULTS.md from the scripts' output alone: the sections written by hand (the GPU
results, the demo's verdict, the calibration write-ups) were lost on every ``make bench``, and
``run_all.py --help`` (read as a script name that matched nothing) wrote a RESULTS.md with no sections.
"""

from __future__ import annotations

import importlib.util
import sys
from pathlib import Path

import pytest

RUN_ALL = Path(__file__).resolve().parents[2] / "benchmarks" / "run_all.py"

OLD = """# Benchmark results

Header kept as it is.

<!-- run_all: bench_a -->
## A old

*bench_a.py, 2026-01-01 00:00 UTC; old machine.*
old a table

## A's second section

more of a's output
<!-- /run_all: bench_a -->

## Hand-written GPU section

measured by hand

<!-- run_all: bench_b -->
## B old

old b table
<!-- /run_all: bench_b -->
"""


@pytest.fixture()
def run_all(tmp_path: Path, monkeypatch: pytest.MonkeyPatch):
    spec = importlib.util.spec_from_file_location("run_all_under_test", RUN_ALL)
    mod = importlib.util.module_from_spec(spec)
    spec.loader.exec_module(mod)
    (tmp_path / "bench_a.py").write_text("print('## A new\\n\\nnew a table')\n")
    (tmp_path / "bench_b.py").write_text("import sys\nsys.exit('b broke')\n")
    (tmp_path / "bench_c.py").write_text("print('## C\\n\\nc table')\n")
    (tmp_path / "RESULTS.md").write_text(OLD)
    monkeypatch.setattr(mod, "HERE", tmp_path)
    monkeypatch.setattr(mod, "RESULTS", tmp_path / "RESULTS.md")
    monkeypatch.setattr(mod, "machine", lambda: "test machine")
    return mod


def test_only_the_sections_of_scripts_that_ran_are_replaced(run_all, tmp_path: Path, capsys) -> None:
    assert run_all.main([]) == 1  # bench_b failed
    text = (tmp_path / "RESULTS.md").read_text()
    assert text.startswith("# Benchmark results\n\nHeader kept as it is.\n")
    assert "A old" not in text and "old a table" not in text and "A's second section" not in text
    assert text.index("## A new") < text.index("## Hand-written GPU section") < text.index("## B old")
    assert "measured by hand" in text and "old b table" in text  # kept: hand-written, and a failed script's
    assert text.rstrip().endswith("c table\n<!-- /run_all: bench_c -->") and text.count("<!-- run_all: bench_c -->") == 1
    assert "*bench_a.py, " in text and "; test machine.*" in text
    assert "FAILED bench_b.py" in capsys.readouterr().err


def test_a_rerun_is_stable(run_all, tmp_path: Path) -> None:
    run_all.main(["bench_a", "bench_c"])
    once = (tmp_path / "RESULTS.md").read_text()
    run_all.main(["bench_a", "bench_c"])
    twice = (tmp_path / "RESULTS.md").read_text()
    strip = [ln for ln in twice.splitlines() if not ln.startswith("*bench_")]
    assert strip == [ln for ln in once.splitlines() if not ln.startswith("*bench_")]
    assert twice.count("## A new") == 1 and twice.count("## C") == 1
    assert twice.count("<!-- /run_all: bench_c -->") == 1


@pytest.mark.parametrize("argv", [["bench_nope"], ["--nope"]])
def test_bad_arguments_write_nothing(run_all, tmp_path: Path, argv: list[str], capsys) -> None:
    assert run_all.main(argv) == 2
    assert (tmp_path / "RESULTS.md").read_text() == OLD
    err = capsys.readouterr().err
    assert err.count("error:") == 1 and err.strip().splitlines()[-1].startswith(("error:", "benchmarks/run_all.py: error:"))


def test_help_writes_nothing(run_all, tmp_path: Path, capsys) -> None:
    assert run_all.main(["--help"]) == 0
    assert (tmp_path / "RESULTS.md").read_text() == OLD
    assert "bench_a bench_b bench_c" in capsys.readouterr().out


def test_the_shipped_results_file_parses_into_its_sections() -> None:
    spec = importlib.util.spec_from_file_location("run_all_shipped", RUN_ALL)
    mod = importlib.util.module_from_spec(spec)
    sys.modules.pop("run_all_shipped", None)
    spec.loader.exec_module(mod)
    text = mod.RESULTS.read_text()
    sections = mod.split_sections(text)
    scripts = [s for s, _ in sections if s]
    assert len(scripts) == len(set(scripts)) >= 10
    assert all((mod.HERE / f"{s}.py").exists() for s in scripts)
    assert mod.merge(text, {}) == text  # nothing run: nothing changes
    # each script's block opens with its own title, and no by-hand analysis is run by `make bench`
    for script, chunk in sections:
        if script:
            assert chunk.splitlines()[1].startswith("## "), script
    assert not set(mod.BY_HAND) & set(scripts)
    # another script's results or hand-written commentary inside a block were lost on a rerun of that block
    gen = next(c for s, c in sections if s == "bench_generate")
    assert "flagged imbalanced" not in gen
    cal = next(c for s, c in sections if s == "bench_verdict_calibration")
    assert "primary endpoint alone" not in cal and "Read from the table above" not in cal
