"""Every paper spec under analysis/ runs end to end (train -> select -> generate -> metrics ->
stats -> report) on tiny random stand-ins of its real models (tests/spec_standins.py)."""

from __future__ import annotations

import json
import math

import pytest
from spec_standins import ANALYSIS, install_standins, standin_spec, tiny_bases

from pcpo_eval.study.runner import run_study
from pcpo_eval.study.spec import load_spec

PAPER = sorted(p.name for p in ANALYSIS.glob("*.yaml") if not p.name.startswith("toy_"))


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return tiny_bases(tmp_path_factory.mktemp("bases"))


@pytest.mark.parametrize("name", PAPER)
def test_paper_spec_runs_end_to_end_on_standins(name, bases, tmp_path, monkeypatch):
    install_standins(monkeypatch)
    path = standin_spec(name, tmp_path, bases)
    spec = load_spec(path)
    report = run_study(path, tmp_path / "study", log=lambda s: None)
    res = json.loads((tmp_path / "study" / "results.json").read_text())
    assert report.is_file() and report.stat().st_size > 10_000
    assert {r["run"] for r in res["runs"]} == {r.name for r in spec.runs}
    for r in res["runs"]:  # every run trained with its paired control
        assert len(r["reward_mean"]) == 2 and all(math.isfinite(x) for x in r["control_reward_mean"])
    assert res["verdict"] and all(v["quantity"] for v in res["verdict"])
    raw = {m for row in res["raw_scores"]["rows"] for m, v in row["values"].items() if v is not None}
    assert set(spec.metrics) <= raw, f"metrics without a value: {set(spec.metrics) - raw}"
