"""Per-image metrics (preference / reward scores) get their LMM on one row per image.

The study fits ``value ~ algorithm + (1|prompt) + (1|image) + (1|run)`` for them, where ``image``
is the initial noise shared by every run's image of one (prompt, seed) (generation seeds are keyed
by both), and keeps the per-prompt model for per-prompt metrics (LPIPS diversity). Checked on the
fast stand-ins of tests/support/study.py: the per-image fit has the right rows and groups, an A/A
design shows no significant effect, a planted effect is detected and tested against the runs.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

import pcpo_eval.study.spec
from pcpo_eval.study.runner import run_study
from pcpo_eval.testing import isolate_weight_caches
from tests.support.study import install_fakes, write_spec

AA = {"design": {"algorithm": {"A": {"objective": "ppo_clip"}, "B": {"objective": "ppo_clip"}}},
      "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"},
      "lmm": {"formula": "value ~ algorithm + (1|prompt)"},
      "metrics": ["fd_toy", "lpips_toy", "pickscore"], "overall_only": ["fd_toy"],
      "seeds": {"A": [0, 1, 2], "B": [3, 4, 5]}, "targets": [0.3], "select_target": 0.3}


@pytest.fixture
def fakes(tmp_path, monkeypatch):
    isolate_weight_caches(tmp_path, monkeypatch)
    # pickscore's weights are not on this machine; the fake metric worker never loads them
    monkeypatch.setattr(pcpo_eval.study.spec, "_check_weights", lambda *a, **k: None)
    return install_fakes(monkeypatch)


def _study(tmp_path: Path, **spec) -> dict:
    out = tmp_path / "study"
    run_study(write_spec(tmp_path / "s.yaml", **spec), out, log=lambda s: None)
    return json.loads((out / "results.json").read_text())


def _term(fit: dict, term: str) -> dict:
    return next(f for f in fit["fixed"] if f["term"] == term)


def test_per_image_metric_is_fitted_on_image_rows_with_noise_and_run_effects(tmp_path, fakes):
    fakes.run_sd_metric = 0.03  # runs differ (training seeds), arms do not
    res = _study(tmp_path, **AA)
    lmm = res["lmm"]
    pick, lp = lmm["fits"]["pickscore"], lmm["fits"]["lpips_toy"]
    assert lmm["per_image_metrics"] == ["pickscore"]
    assert pick["formula"] == "value ~ algorithm + (1|prompt) + (1|image) + (1|run)"
    assert lp["formula"] == "value ~ algorithm + (1|prompt) + (1|run)"  # LPIPS diversity stays per prompt
    assert lmm["image_formula"] == pick["formula"] and lmm["formula"] == lp["formula"]
    # 6 runs x 3 prompts x 4 seeds images vs 6 runs x 3 prompts
    assert pick["n_rows"] == 72 and lp["n_rows"] == 18
    assert pick["n_obs"] == 72 and pick["n_groups"] == {"prompt": 3, "image": 12, "run": 6}
    # A/A: no significant algorithm effect on the per-image score, and its df reflects the 6 runs
    fe = _term(pick, "algorithm[T.B]")
    assert pick["estimable"], pick["reason"]
    assert fe["p"] > 0.05 and fe["df"] < 10, fe
    row = res["raw_scores"]["significance"]["all"]["pickscore"]
    assert not row["significant"]
    # "no evidence" says what it could have detected: the t test's 80%-power effect at its SE and df
    from pcpo_eval.stats.power import expected_power, mde_from_se, power_at

    # at the level the bold rule tests it: alpha / m over the study's one family of arm comparisons
    m = row["family_size"]
    assert m >= 2 and row["mde_level"] == pytest.approx(0.05 / m)
    # 80% power averaged over the uncertainty of the SE it measured (stats.power.expected_power)
    assert row["mde"] == pytest.approx(mde_from_se(row["se"], row["df"], alpha=0.05 / m, measured=True))
    assert row["mde"] > mde_from_se(row["se"], row["df"], alpha=0.05 / m) > mde_from_se(row["se"], row["df"]) > 2.8 * row["se"]
    assert expected_power(row["mde"] / row["se"], row["df"], 0.05 / m) == pytest.approx(0.8, abs=1e-6)
    assert power_at(row["mde"] / row["se"], row["df"], 0.05 / m) > 0.8
    assert len(row["run_means"]["baseline"]) == 3 and row["p_run_means"] is not None  # Welch's check, recorded
    # the LMM table's fixed effects carry theirs in results.json (the report reads it, not a formula)
    fam = res["lmm"]["adjusted"]["pickscore"]["algorithm[T.B]"]["family_size"]
    assert fam == m and fe["mde"] == pytest.approx(mde_from_se(fe["se"], fe["df"], alpha=0.05 / fam, measured=True))


def test_planted_per_image_difference_is_detected(tmp_path, fakes):
    fakes.metric_effect = {"B": 0.1}
    fakes.run_sd_metric = 0.03
    res = _study(tmp_path, **AA)
    pick = res["lmm"]["fits"]["pickscore"]
    fe = _term(pick, "algorithm[T.B]")
    assert pick["estimable"], pick["reason"]
    assert fe["estimate"] == pytest.approx(0.1, abs=0.03)
    assert fe["p"] < 0.01 and fe["df"] < 10  # tested against the runs, not the 72 image rows
    assert res["lmm"]["adjusted"]["pickscore"]["algorithm[T.B]"]["p_holm"] < 0.05
    simple = res["raw_scores"]["significance"]["all"]["pickscore"]
    assert simple["significant"] and simple["estimate"] > 0 and "(1|image)" in simple["method"]


def test_a_bold_cell_never_contradicts_its_per_prompt_test():
    """The raw-score cell shows the overall values; its bold came from the per-prompt test. A policy that
    collapses each prompt has a higher set IS but a lower per-prompt IS (the audit's study: overall 4.74 vs
    1.92 bold, per-prompt estimate -0.465, p 0.0003): such a cell is not bold and says why, in the report too."""
    from types import SimpleNamespace

    from pcpo_eval.report.html import render_report
    from pcpo_eval.study.image_metrics import raw_score_rows

    runs = [SimpleNamespace(name=n, role=r) for n, r in (("a0", "baseline"), ("a1", "baseline"), ("b0", "pcpo"),
                                                          ("b1", "pcpo"))]
    sp = SimpleNamespace(baseline="DDPO", pcpo="PCPO", metrics=["is_toy", "lpips_toy"], runs=runs,
                         cells=lambda: ["all"], cell_key=lambda r: "all", role=lambda r: r.role)
    rows = [{"name": r.name, "cell": "all", "role": r.role, "epoch": 10, "reward": 0.5} for r in runs]
    values = {"a0": {"is_toy": 1.9, "lpips_toy": 0.30}, "a1": {"is_toy": 1.94, "lpips_toy": 0.31},
              "b0": {"is_toy": 4.7, "lpips_toy": 0.40}, "b1": {"is_toy": 4.78, "lpips_toy": 0.41}}
    sig = {"all": {"is_toy": {"estimate": -0.465, "p_adj": 0.00028, "significant": True},
                   "lpips_toy": {"estimate": 0.1, "p_adj": 0.001, "significant": True}}}
    base, pcpo = raw_score_rows(sp, rows, values, sig, "")
    assert pcpo["significant"] == {"is_toy": False, "lpips_toy": True}  # the agreeing one stays bold
    (text,) = pcpo["conflicts"].values()
    assert text.startswith("IS* (toy) in all: the per-prompt test finds PCPO lower (estimate -0.465, adjusted p "
                           "0.00028) while the overall values go the other way (PCPO 4.74, DDPO 1.92)")
    assert "diversity within a prompt" in text and "conflicts" not in base
    import html

    page = html.unescape(render_report({"study": {"name": "s"}, "raw_scores": {"columns": sp.metrics,
                                                                                "rows": [base, pcpo]}}))
    assert f"Not bold: {text}." in page


def test_a_distance_to_the_base_model_has_no_better_side():
    """FD against the base model's images read "lower is better", so a frozen arm's bold FD of 0 read as the
    better arm (a review: 5 seeds, Holm p 0.025); such a metric now says what lower means."""
    from pcpo_eval.metrics.base import METRICS
    from pcpo_eval.study.image_metrics import _direction

    against_base = [m for m in METRICS if METRICS[m].needs_reference]
    assert "fd_toy" in against_base
    for m in against_base:
        assert _direction(m).startswith("lower is closer to the base model (not better")
    assert _direction("is_toy") in ("higher is better", "lower is better")
