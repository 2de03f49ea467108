"""Every paper spec under analysis/ runs end to end (train -> select -> generate -> metrics ->
stats -> report) on tiny random stand-ins of its real models (tests/support/specs.py).

These runs dominate the suite's wall time (minutes each on 2 loaded cores), so CI runs a
representative subset, one spec per model family and algorithm family (:data:`REPRESENTATIVE`); the
others are marked ``exhaustive`` and run with ``pytest --exhaustive`` (``make test-full``). Every
paper spec's stand-in rewrite is still validated in the fast tests below (same design, arms and
trainer keys as the spec, only the sizes changed), and analysis/ specs themselves in
tests/study/test_analysis_specs.py.
"""

from __future__ import annotations

import json
import math

import pytest

from pcpo_eval.study.runner import run_study
from pcpo_eval.study.spec import load_spec
from tests.support.specs import ANALYSIS, TINY_TRAIN, install_standins, standin_spec, tiny_bases

PAPER = sorted(p.name for p in ANALYSIS.glob("*.yaml") if not p.name.startswith("toy_"))
#: run end to end by CI: DDPO on SD-1.x (with the per-update diagnostics), Flow-GRPO on SD3 (flow SDE,
#: held-out validation reward), DanceGRPO on FLUX
REPRESENTATIVE = ("ddpo_delta_terms.yaml", "flowgrpo_sd35_ocr.yaml", "dancegrpo_flux_hps.yaml")
#: trainer keys the stand-in rewrite may change (sizes, device, the base model, prompt files, validation sizes)
RESIZED = {*TINY_TRAIN, "model", "prompts", "validation_every", "validation_prompts", "validation_images"}


@pytest.fixture(scope="module")
def bases(tmp_path_factory):
    return tiny_bases(tmp_path_factory.mktemp("bases"))


def test_representative_subset_is_paper_specs():
    assert set(REPRESENTATIVE) <= set(PAPER) and len(PAPER) >= 11


@pytest.mark.parametrize("name", PAPER)
def test_standin_rewrite_keeps_the_paper_specs_design(name, tmp_path):
    """Offline, for every paper spec (those CI does not run end to end included): the stand-in spec
    validates and differs from the paper's only in sizes: same arms and design levels, same metrics and
    LMM, and per run the same trainer settings but for :data:`RESIZED`."""
    paper = load_spec(ANALYSIS / name, check_weights=False)
    bases = {k: f"{k}:{tmp_path / k}" for k in ("sd1", "sd3", "flux")}
    small = load_spec(standin_spec(name, tmp_path, bases), check_weights=False)
    assert small.seeds.keys() == paper.seeds.keys() and all(list(s) == [0, 1] for s in small.seeds.values())
    assert (small.baseline, small.pcpo, small.metrics) == (paper.baseline, paper.pcpo, paper.metrics)
    assert small.to_dict()["lmm"] == paper.to_dict()["lmm"]
    by_levels = {tuple(sorted(r.levels.items())): r for r in paper.runs}
    assert {tuple(sorted(r.levels.items())) for r in small.runs} == set(by_levels)
    for r in small.runs:
        want, got = by_levels[tuple(sorted(r.levels.items()))].train.to_dict(), r.train.to_dict()
        changed = {k for k in want.keys() | got.keys() if k != "seed" and want.get(k) != got.get(k)}
        assert changed <= RESIZED, f"{r.name}: {sorted(changed - RESIZED)}"
        assert got["epochs"] == TINY_TRAIN["epochs"] and got["diagnostics"] == want["diagnostics"]


@pytest.mark.parametrize("name", [n if n in REPRESENTATIVE else pytest.param(n, marks=pytest.mark.exhaustive)
                                  for n in PAPER])
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
