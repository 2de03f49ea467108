"""The study's stage bar: on stderr when asked (log lines printed above it), absent otherwise."""

from __future__ import annotations

from pathlib import Path

from pcpo_eval.study.runner import Study
from pcpo_eval.study.spec import load_spec

ROOT = Path(__file__).resolve().parents[2]


def test_study_stage_bar(tmp_path, capsys, monkeypatch):
    spec = load_spec(ROOT / "analysis" / "toy_study.yaml")
    for stage in ("train", "select"):
        monkeypatch.setattr(Study, f"stage_{stage}", lambda self: self.log("[study] working"))
    for flag, shown in ((True, True), (False, False)):
        capsys.readouterr()
        Study(spec, tmp_path / f"s{flag}", progress=flag).run(("train", "select"))
        out = capsys.readouterr()
        assert (f"study {spec.name}" in out.err) is shown, out.err[-300:]
        assert out.out.count("[study] working") == 2  # the log still reaches stdout, bar or not
        assert f"study {spec.name}" not in out.out
