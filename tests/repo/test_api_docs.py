"""The top-level API (issue 29): docs/api.md's Python blocks run as written, in order, in an empty
folder on the toy world; each step is at most 5 lines; ``import pcpo_eval`` stays light.

The one block marked ``api-doc: not run`` (the demo study, minutes) is stood in by the synthetic
study of tests/support/report.py (``studies/toy/results.json`` and the files it names), so the
report, figures and results blocks after it run against a realistic ``results.json``."""

from __future__ import annotations

import json
import re
import subprocess
import sys
from pathlib import Path

import pytest

import pcpo_eval
from pcpo_eval.io import to_jsonable
from pcpo_eval.study import api
from tests.support.report import synthetic_results

#: these tests read the SVG / PDF files too (the suite writes PNG only: tests/conftest.py)
pytestmark = pytest.mark.usefixtures("all_figure_formats")

DOC = Path(__file__).resolve().parents[2] / "docs" / "api.md"
SKIP = "api-doc: not run"
BLOCK = re.compile(r"(?P<before>[^\n]*)\n```python\n(?P<code>.*?)```", re.DOTALL)


def doc_blocks() -> list[tuple[str, bool]]:
    """(code, run?) of every ```python block of docs/api.md, in order."""
    return [(m["code"], SKIP not in m["before"]) for m in BLOCK.finditer(DOC.read_text())]


def test_api_names_are_lazy_and_documented():
    assert pcpo_eval._API == api.API and set(api.API) <= set(dir(pcpo_eval))
    text = DOC.read_text()
    assert all(f"`{name}(" in text for name in api.API)
    for name in api.API:  # no API name shadows a subpackage
        assert not (Path(pcpo_eval.__file__).parent / name).is_dir()
    code = "import sys, pcpo_eval; print(sorted(m for m in ('torch', 'matplotlib', 'pcpo_eval.study.api') if m in sys.modules))"
    out = subprocess.run([sys.executable, "-c", code], capture_output=True, text=True, check=True).stdout
    assert out.strip() == "[]"
    with pytest.raises(AttributeError, match="no attribute 'nope'"):
        pcpo_eval.nope  # noqa: B018


def test_every_step_is_at_most_five_lines():
    blocks = doc_blocks()
    assert len(blocks) >= 7 and sum(not run for _, run in blocks) == 1
    for code, _ in blocks:
        assert len([ln for ln in code.splitlines() if ln.strip()]) <= 5, code


def test_docs_api_examples_run(tmp_path, monkeypatch, capsys):
    monkeypatch.chdir(tmp_path)
    study = tmp_path / "studies" / "toy"
    study.mkdir(parents=True)
    (study / "results.json").write_text(json.dumps(to_jsonable(synthetic_results(study))))
    namespace: dict = {}
    for code, run in doc_blocks():
        if run:
            exec(compile(code, str(DOC), "exec"), namespace)  # noqa: S102 - the documented examples
    out = capsys.readouterr().out
    assert (tmp_path / "runs" / "pcpo" / "log.parquet").is_file() and (tmp_path / "sets" / "base").is_dir()
    assert "Linear mixed model" in out and "Speed-up" in out
    assert (study / "report.html").is_file() and (study / "figures" / "reward_curves.pdf").is_file()
    assert {"README.md", "pcpo_eval_export.json", "unet"} <= {p.name for p in (tmp_path / "share" / "pcpo").iterdir()}
