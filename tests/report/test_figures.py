"""Paper-ready report figures (issue 29): SVG + PDF + 300-dpi PNG files, two-column sizes, >= 7 pt
text, meaningful panel titles, the KL-reward plot drawn left to right, rliable's interval
estimates and probability of improvement, and ``pcpo-eval report --figures-only``."""

from __future__ import annotations

import json

import numpy as np
import pytest
from PIL import Image

from pcpo_eval.io import to_jsonable
from pcpo_eval.report import figures
from pcpo_eval.report.html import report_figures, write_figures
from pcpo_eval.stats.rliable import BOOTSTRAP_SEED as RLIABLE_SEED
from pcpo_eval.stats.rliable import PANEL_QUANTITIES
from pcpo_eval.stats.runlevel import (
    iqm,
    iqm_interval,
    performance_profile,
    poi_interval,
    probability_of_improvement,
)
from tests.support.report import runs_frame, synthetic_rliable, synthetic_runs

#: these tests read the SVG / PDF files too (the suite writes PNG only: tests/conftest.py)
pytestmark = pytest.mark.usefixtures("all_figure_formats")

ROLES = {"DDPO": "baseline", "PCPO": "pcpo"}


@pytest.fixture(autouse=True)
def _close_figures():
    yield
    import matplotlib.pyplot as plt

    plt.close("all")


def _results(cells: tuple[str, ...] = ("batch=16", "batch=32"), epochs: int = 8) -> dict:
    runs = [r for r in synthetic_runs(epochs=epochs) if r["cell"] in cells]
    if cells == ("all",):
        runs = [{**r, "cell": "all"} for r in synthetic_runs(epochs=epochs) if r["cell"] == "batch=16"]
    return to_jsonable({"study": {"name": "figs", "window": 3, "compare": {"baseline": "DDPO", "pcpo": "PCPO"}},
                        "runs": runs, "rliable": synthetic_rliable(runs, k=3)})


def _texts(fig) -> list:
    return [t for t in fig.findobj(lambda a: hasattr(a, "get_fontsize") and hasattr(a, "get_text"))
            if t.get_text().strip()]


def test_iqm_and_poi_intervals():
    rng = np.random.default_rng(0)
    x = np.array([1.0, 2.0, 3.0, 4.0, 100.0])
    est, lo, hi = iqm_interval(x, rng=rng)
    assert est == pytest.approx(iqm(x)) == pytest.approx(3.0) and lo <= est <= hi
    assert iqm_interval([2.0], rng=rng) == (2.0, 2.0, 2.0)  # one run: a zero-width interval
    b, t = np.array([0.1, 0.2, 0.3]), np.array([0.25, 0.35, 0.45])
    p, plo, phi = poi_interval(b, t, rng=np.random.default_rng(1))
    assert p == pytest.approx(float(probability_of_improvement(b, t))) == pytest.approx(8 / 9)
    assert 0 <= plo <= p <= phi <= 1
    with pytest.raises(Exception, match="finite"):
        poi_interval([np.nan], [1.0], rng=rng)


def test_files_sizes_fonts_and_titles(tmp_path):
    res = _results()
    (tmp_path / "results.json").write_text(json.dumps(res))
    paths = write_figures(tmp_path)
    names = {"reward_curves", "reward_compute_time", "kl_reward", "interval_estimates", "probability_of_improvement",
             "performance_profiles"}
    assert {p.name for p in paths} == {f"{n}.{ext}" for n in names for ext in ("svg", "pdf", "png")}
    for n in names:
        svg = (tmp_path / "figures" / f"{n}.svg").read_text()
        assert "<text" in svg and "<script" not in svg  # text stays text (editable), nothing executable
        pdf = (tmp_path / "figures" / f"{n}.pdf").read_bytes()
        assert pdf.startswith(b"%PDF") and b"/FontFile2" in pdf and b"/Type3" not in pdf  # TrueType, no Type 3
        with Image.open(tmp_path / "figures" / f"{n}.png") as im:
            assert im.info["dpi"] == pytest.approx((300, 300), abs=0.1)
            width_in = im.size[0] / 300
            assert 3.0 <= width_in <= figures.DOUBLE_COLUMN_IN + 0.2, (n, width_in)
    for name, fig in report_figures(res).items():
        assert fig.get_figwidth() in (figures.SINGLE_COLUMN_IN, figures.DOUBLE_COLUMN_IN), name
        assert min(t.get_fontsize() for t in _texts(fig)) >= 7, name


def test_single_cell_titles_and_single_column():
    figs = report_figures(_results(("all",)))
    assert figs["reward_curves"].get_figwidth() == figures.SINGLE_COLUMN_IN
    for name, fig in figs.items():
        titles = [ax.get_title() for ax in fig.axes if ax.get_visible()]
        assert all(t and t != "all" and not t.startswith("all:") for t in titles), (name, titles)
    assert figs["reward_curves"].axes[0].get_title() == "reward per epoch"
    two = report_figures(_results())
    assert two["reward_curves"].axes[0].get_title() == "batch=16: reward per epoch"


def test_kl_reward_lines_run_left_to_right():
    fig = figures.kl_reward_figure(_results()["runs"], ROLES)
    lines = [ln for ax in fig.axes for ln in ax.get_lines()]
    assert len(lines) == 4  # one per arm and cell, not one per run
    for ln in lines:
        x = np.asarray(ln.get_xdata(), dtype=float)
        assert np.all(np.diff(x) >= 0) and ln.get_marker() == "o"
    assert fig.axes[0].get_xscale() == "log"
    assert figures.kl_bins([(3.0, 1.0), (1.0, 0.0), (2.0, 5.0), (float("nan"), 9.0)], n_bins=2) == ([1.0, 2.5], [0.0, 3.0])


def test_rliable_panels():
    res = _results()
    block = res["rliable"]
    vals = {(r["cell"], r["arm"], r["seed"]): r for r in block["runs"]}
    assert {(c, a) for c, a, _ in vals} == {(c, a) for c in ("batch=16", "batch=32") for a in ("DDPO", "PCPO")}
    # seed 1 has a missing epoch: its AUC is left out, its final reward (last 3 epochs) is kept
    assert vals[("batch=16", "DDPO", "1")]["auc"] is None and vals[("batch=16", "DDPO", "1")]["final_reward"] is not None
    assert vals[("batch=32", "PCPO", "2")]["paired_gain"] is None  # the run without its control
    iv = {(i["cell"], i["arm"], i["quantity"]): i for i in block["intervals"]}
    assert iv[("batch=16", "DDPO", "auc")]["n_runs"] == 2 and iv[("batch=16", "DDPO", "final_reward")]["n_runs"] == 3
    fig = figures.interval_estimates_figure(block, ROLES)
    labels = [t.get_text() for t in fig.axes[0].get_yticklabels()]
    assert labels[0].startswith("DDPO (3 runs), batch=16") and len(labels) == 4
    assert [ax.get_title() for ax in fig.axes] == [PANEL_QUANTITIES[q] for q in ("paired_gain", "final_reward", "auc")]
    poi = figures.improvement_figure(block, ROLES)
    assert [t.get_text() for t in poi.axes[0].get_yticklabels()] == ["P(PCPO > DDPO), batch=16", "P(PCPO > DDPO), batch=32"]
    assert poi.axes[0].get_xlim() == (-0.02, 1.02)
    assert figures.improvement_figure(synthetic_rliable(res["runs"], baseline="nobody", k=3), ROLES) is None
    assert figures.interval_estimates_figure(None, ROLES) is None  # an older results.json: no panels


def test_rliable_numbers_are_the_verdicts():
    """The panels reduce each run with the verdict's own function on the verdict's table: a run's final
    reward / paired gain there equals the verdict row's per-run values (before, the report recomputed
    them with its own cut and window)."""
    from pcpo_eval.stats.verdict import run_curves, run_scalar

    table = runs_frame(_results(epochs=8)["runs"])
    block = synthetic_rliable(_results(epochs=8)["runs"], k=3)
    for run in run_curves(table):
        got = next(r for r in block["runs"] if (r["cell"], r["arm"], r["seed"]) == (run.cell, run.arm, run.seed))
        want = run_scalar(run, "final_reward", 3)
        assert got["final_reward"] == pytest.approx(want, abs=0, rel=0)
    iv = next(i for i in block["intervals"] if (i["cell"], i["arm"], i["quantity"]) == ("batch=16", "PCPO", "final_reward"))
    values = [r["final_reward"] for r in block["runs"] if (r["cell"], r["arm"]) == ("batch=16", "PCPO")]
    assert iv["iqm"] == iqm_interval(values, rng=np.random.default_rng(RLIABLE_SEED))[0]
    assert iv["ci_low"] is None and iv["ci_high"] is None  # 3 runs: below MIN_INTERVAL_RUNS, no interval


def test_rliable_intervals_are_drawn_from_enough_runs_only(monkeypatch):
    """Below ``MIN_INTERVAL_RUNS`` runs the panels hold point estimates (the figures draw a dot and say why);
    from it, the bootstrap intervals, equal to ``iqm_interval`` / ``poi_interval`` at the panels' seed."""
    import pcpo_eval.stats.rliable as rl
    from pcpo_eval.stats.runlevel import poi_interval

    few = synthetic_rliable(_results(epochs=8)["runs"], k=3)
    assert all(r["ci_low"] is None and r["ci_high"] is None for r in [*few["intervals"], *few["improvement"]])
    poi = figures.improvement_figure(few, ROLES)
    assert poi.axes[0].get_xlabel() == "P(improvement) (no CI: < 10 runs)"
    assert figures.interval_estimates_figure(few, ROLES).axes[0].get_xlabel() == \
        "IQM over runs (no CI: < 10 runs)"
    monkeypatch.setattr(rl, "MIN_INTERVAL_RUNS", 2)
    block = synthetic_rliable(_results(epochs=8)["runs"], k=3)
    runs = block["runs"]
    iv = next(i for i in block["intervals"] if (i["cell"], i["arm"], i["quantity"]) == ("batch=16", "PCPO", "final_reward"))
    values = [r["final_reward"] for r in runs if (r["cell"], r["arm"]) == ("batch=16", "PCPO")]
    assert (iv["iqm"], iv["ci_low"], iv["ci_high"]) == iqm_interval(values, rng=np.random.default_rng(RLIABLE_SEED))
    imp = next(i for i in block["improvement"] if (i["cell"], i["quantity"]) == ("batch=16", "final_reward"))
    base = [r["final_reward"] for r in runs if (r["cell"], r["arm"]) == ("batch=16", "DDPO")]
    assert (imp["p_improvement"], imp["ci_low"], imp["ci_high"]) == poi_interval(
        base, values, rng=np.random.default_rng(RLIABLE_SEED))
    assert figures.improvement_figure(block, ROLES).axes[0].get_xlabel() == "P(improvement), 95% CI"


def test_cli_figures_only(cli, tmp_path):
    (tmp_path / "results.json").write_text(json.dumps(_results(("batch=16",), epochs=5)))
    res = cli("report", tmp_path, "--figures-only")
    assert res.returncode == 0, res.stderr
    assert not (tmp_path / "report.html").exists()
    assert (tmp_path / "figures" / "reward_curves.pdf").is_file() and "figure files" in res.stdout
    other = tmp_path / "paper"
    assert cli("report", tmp_path, "--figures-only", "--figures-dir", other).returncode == 0
    assert (other / "kl_reward.svg").is_file()
    bad = cli("report", tmp_path, "--figures-only", "--output", tmp_path / "r.html")
    assert bad.returncode == 2 and bad.stderr.startswith("error: --figures-only writes no HTML")
    missing = cli("report", tmp_path / "nowhere", "--figures-only")
    assert missing.returncode == 2 and "results.json not found" in missing.stderr


def test_kl_ref_figure_is_a_paper_figure():
    """The reward-vs-KL-to-reference figure (report/kl_ref.py) is written with the others, at paper sizes."""
    tr = {"run": "r", "role": "pcpo", "cell": "all", "epoch": [1, 2], "kl_ref": [0.1, 0.3], "reward_smoothed": [0.5, 0.6],
          "reward_mean": [0.5, 0.6]}
    fig = report_figures({"study": {"name": "kl"}, "traces": [tr]})["kl_ref_reward"]
    assert fig.get_figwidth() == figures.SINGLE_COLUMN_IN and fig.axes[0].get_title() == "reward vs KL to the reference"
    assert min(t.get_fontsize() for t in _texts(fig)) >= 7


def test_performance_profile_function():
    x = [1.0, 2.0, 3.0, 4.0]
    frac, lo, hi = performance_profile(x, [0.0, 1.0, 2.5, 4.0, 5.0], rng=np.random.default_rng(0))
    assert frac.tolist() == [1.0, 0.75, 0.5, 0.0, 0.0]  # strictly above tau, as rliable
    assert np.all(lo <= frac) and np.all(frac <= hi) and lo[0] == hi[0] == 1.0 and hi[-1] == 0.0
    one = performance_profile([2.0], [1.0, 3.0], rng=np.random.default_rng(0))
    assert [a.tolist() for a in one] == [[1.0, 0.0]] * 3  # one run: a step with a zero-width band
    with pytest.raises(Exception, match="finite"):
        performance_profile([np.nan], [0.0], rng=np.random.default_rng(0))


def test_performance_profile_figure():
    block = _results()["rliable"]
    fig = figures.performance_profile_figure(block, ROLES)
    assert [ax.get_title() for ax in fig.axes] == [PANEL_QUANTITIES[q] for q in ("paired_gain", "final_reward", "auc")]
    labels = fig.axes[0].get_legend_handles_labels()[1]
    assert labels[0] == "DDPO (3 runs), batch=16" and len(labels) == 4
    for ln in fig.axes[1].get_lines():
        y = np.asarray(ln.get_ydata(), dtype=float)
        assert y[0] == 1.0 and y[-1] == 0.0 and np.all(np.diff(y) <= 0)  # a survival curve over tau
    assert figures.performance_profile_figure({}, ROLES) is None


def test_closeup_of_first_epochs_is_unsmoothed():
    epochs = list(range(30))
    trace = {"run": "PCPO-s0", "role": "pcpo", "cell": "all", "epoch": epochs,
             "reward_mean": [float(e % 3) for e in epochs], "reward_smoothed": [1.0] * 30,
             "clipfrac": [0.01 * e for e in epochs]}
    fig = figures.closeup_figure([trace])
    top, bottom = fig.axes[0], fig.axes[1]
    (line,) = top.get_lines()
    assert list(line.get_xdata()) == list(range(20)) and list(line.get_ydata()) == [float(e % 3) for e in range(20)]
    assert list(bottom.get_lines()[0].get_ydata()) == pytest.approx([0.01 * e for e in range(20)])
    assert top.get_title() == "reward, first 20 epochs (unsmoothed)"
    assert figures.closeup_figure([]) is None


def test_report_writes_closeup_and_profiles(tmp_path):
    res = _results(("batch=16",))
    res["traces"] = [{"run": "r", "role": "pcpo", "cell": "batch=16", "epoch": [0, 1, 2], "reward_mean": [1.0, 2.0, 3.0],
                      "reward_smoothed": [1.0, 1.5, 2.0], "clipfrac": [0.0, 0.1, 0.0], "clipfrac_smoothed": [0.0, 0.05, 0.03]}]
    (tmp_path / "results.json").write_text(json.dumps(res))
    names = {p.name for p in write_figures(tmp_path)}
    assert {"traces_first_epochs.pdf", "performance_profiles.svg", "performance_profiles.png"} <= names


def test_figure_formats_env(monkeypatch):
    from pcpo_eval.errors import UserError
    from pcpo_eval.figfiles import FORMATS_ENV, figure_formats

    assert figure_formats() == ("svg", "pdf", "png")
    monkeypatch.setenv(FORMATS_ENV, "PNG")
    assert figure_formats() == ("png",)
    monkeypatch.setenv(FORMATS_ENV, "pdf, svg")
    assert figure_formats() == ("svg", "pdf")
    monkeypatch.setenv(FORMATS_ENV, "jpg")
    with pytest.raises(UserError, match="subset of svg, pdf, png"):
        figure_formats()


def test_the_console_names_the_formats_it_wrote(cli, tmp_path, monkeypatch):
    """With $PCPO_EVAL_FIGURE_FORMATS=png the command printed "(SVG, PDF, PNG)" and left the old SVG/PDF files
    behind unmentioned (a review)."""
    from pcpo_eval.figfiles import FORMATS_ENV

    (tmp_path / "results.json").write_text(json.dumps(_results(("batch=16",), epochs=5)))
    monkeypatch.setenv(FORMATS_ENV, "png")
    res = cli("report", tmp_path)
    assert res.returncode == 0, res.stderr
    assert f"wrote the figures (PNG only, as ${FORMATS_ENV} asks; other formats' files not updated)" in res.stdout
    monkeypatch.delenv(FORMATS_ENV)
    assert "(SVG, PDF, PNG) to" in cli("report", tmp_path, "--figures-only").stdout
