"""The HTML report formats synthetic result objects: self-contained, escaped, all sections present.

The report opens with the run-level verdict; a fit or comparison that is not estimable shows its
reason and no p-value; a missing number is never printed as "None" or "nan".
"""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.io import to_jsonable
from pcpo_eval.report import figures
from pcpo_eval.report.html import (
    NO_VERDICT,
    ONE_RUN_BANNER,
    fmt_ci,
    fmt_num,
    fmt_p,
    fmt_pct,
    pretty_term,
    quantity_label,
    render_report,
    verdict_row,
    write_report,
)
from tests.support.report import (
    EVIL_PROMPT,
    EVIL_RUN,
    NOT_ESTIMABLE_REASON,
    SAMPLER_SENTENCE,
    SENTENCES,
    legacy_results,
    synthetic_fits,
    synthetic_results,
    synthetic_runs,
    synthetic_scores,
    synthetic_verdict,
)

#: Words a missing number must never turn into.
MISSING_WORDS = re.compile(r"\b(None|nan|NaN|inf)\b")


class _Collect(HTMLParser):
    """Tags with attributes, text nodes and table ids of an HTML document."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tags: list[tuple[str, dict[str, str | None]]] = []
        self.text: list[str] = []

    def handle_starttag(self, tag, attrs):
        self.tags.append((tag, dict(attrs)))

    def handle_data(self, data):
        self.text.append(data)


class _Tables(HTMLParser):
    """Cell texts of every table row, by table id (``None`` for tables without one) and class."""

    def __init__(self) -> None:
        super().__init__(convert_charrefs=True)
        self.tables: list[tuple[dict[str, str | None], list[list[str]]]] = []
        self.h2: list[str | None] = []
        self._cell: list[str] | None = None

    def handle_starttag(self, tag, attrs):
        a = dict(attrs)
        if tag == "table":
            self.tables.append((a, []))
        elif tag == "tr" and self.tables:
            self.tables[-1][1].append([])
        elif tag in ("td", "th") and self.tables:
            self._cell = []
        elif tag == "h2":
            self.h2.append(a.get("id"))

    def handle_endtag(self, tag):
        if tag in ("td", "th") and self._cell is not None:
            self.tables[-1][1][-1].append("".join(self._cell).strip())
            self._cell = None

    def handle_data(self, data):
        if self._cell is not None:
            self._cell.append(data)

    def rows(self, table_id: str) -> list[list[str]]:
        """Body rows (header excluded) of the table with that id."""
        return next(r for a, r in self.tables if a.get("id") == table_id)[1:]

    def rows_by_class(self, cls: str) -> list[list[str]]:
        return [row for a, r in self.tables if a.get("class") == cls for row in r[1:]]


def _tables(html: str) -> _Tables:
    t = _Tables()
    t.feed(html)
    return t


def _text(html: str) -> str:
    c = _Collect()
    c.feed(html)
    return " ".join(c.text)


@pytest.fixture(scope="module")
def report(tmp_path_factory):
    root = tmp_path_factory.mktemp("study")
    results = to_jsonable(synthetic_results(root))
    (root / "results.json").write_text(json.dumps(results))
    path = write_report(root)
    html = path.read_text()
    parser = _Collect()
    parser.feed(html)
    return results, html, parser


def test_self_contained_no_scripts_no_network(report):
    _, html, parser = report
    tags = [t for t, _ in parser.tags]
    assert "script" not in tags and "link" not in tags and "iframe" not in tags
    for tag, attrs in parser.tags:
        for k in ("src", "href"):
            v = attrs.get(k)
            if v is not None:
                assert v.startswith(("data:", "#")), (tag, k, v[:60])
    assert "http://" not in html and "https://" not in html


def test_user_text_is_escaped(report):
    _, html, parser = report
    assert "<script>" not in html and "<img src=x" not in html
    assert "&lt;script&gt;" in html
    text = "".join(parser.text)
    assert EVIL_PROMPT in text  # shown verbatim as text
    assert EVIL_RUN in text


def test_sections_and_tables(report):
    results, html, parser = report
    ids = {a.get("id") for _, a in parser.tags}
    for tid in ("speedup-table", "selection-table", "raw-table", "simple-effects-table", "lmm-diagnostics",
                "preference-table", "runs-table", "spec-yaml"):
        assert tid in ids, tid
    assert sum(1 for t, a in parser.tags if t == "table" and a.get("class") == "lmm-table") == 3  # 3 effects
    # every image is an embedded PNG: plots (traces, first-20-epochs close-up, rho, |g|), credit, Q-Q x3, grid
    # 2 prompts x 3 models x 2 seeds, run curves (epoch, wall-clock, KL-reward), rliable panels (IQM,
    # P(improvement), performance profiles), progression 2 samples x 3 epochs
    imgs = [a["src"] for t, a in parser.tags if t == "img"]
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    assert len(imgs) == 4 + 1 + 3 + 12 + 3 + 3 + 6
    # the significant PCPO FD value is bold, the non-significant LPIPS is not
    assert "<b>9.877</b>" in html and "<b>0.52</b>" not in html
    # raw scores: runs per condition, and the SD over runs where there are several
    raw = _tables(html).rows("raw-table")
    assert [r[2] for r in raw] == ["1", "1", "1", "3", "3"] and raw[-1][4] == "9.877 ± 0.41"
    # df method and the fit failure are stated, not hidden
    assert "Satterthwaite" in html and "fit failed: grouping column" in html


def test_lmm_numbers_match_result_objects(report):
    results, html, _ = report
    fe = next(f for f in results["lmm"]["fits"]["fd_toy"]["fixed"] if f["term"] == "algorithm[T.PCPO]")
    assert fmt_num(fe["estimate"]) in html
    assert fmt_p(results["lmm"]["adjusted"]["fd_toy"]["algorithm[T.PCPO]"]["p_holm"]) in html
    # speed-up rows (restricted mean epochs, paper formula) in %, uninformative targets labelled
    row = results["speedup"][0]["rows"][0]
    assert fmt_pct(row["speedup"]) in html and row["baseline_epochs"] in html
    table = _tables(html).rows("speedup-table")
    assert len(table) == 2 * 4 and table[0][:3] == ["batch=16", "reward", "0.5"]
    assert table[3][:4] == ["batch=16", "gain", "0.05", results["speedup"][0]["rows"][3]["status"]]


def test_formatters():
    assert fmt_num(None) == "–" and fmt_num(float("nan")) == "–"
    assert fmt_num(12.3456) == "12.35" and fmt_num(0.6208) == "0.6208" and fmt_num(3) == "3"
    assert fmt_p(0.0471) == "0.0471" and fmt_p(0.0504) == "0.0504" and fmt_p(0.5) == "0.500" and fmt_p(1.2e-6) == "1.2e-06"
    assert pretty_term("algorithm[T.PCPO]:batch[T.32]") == "algorithm = PCPO × batch = 32"


def test_minimal_results_render():
    html = render_report({"study": {"name": "empty"}, "metrics": []})
    assert "No speed-up table" in html and "No image grids" in html
    assert re.search(r"<title>pcpo-eval report: empty</title>", html)


def test_missing_results_is_a_user_error(tmp_path, cli):
    with pytest.raises(UserError, match="results.json not found"):
        write_report(tmp_path)
    res = cli("report", str(tmp_path))
    assert res.returncode == 2 and "results.json not found" in res.stderr


def test_report_cli_writes_file(report, tmp_path, cli):
    results, _, _ = report
    (tmp_path / "results.json").write_text(json.dumps({**results, "grids": [], "figures": {}}))
    res = cli("report", str(tmp_path), "-o", str(tmp_path / "r.html"))
    assert res.returncode == 0, res.stderr
    assert (tmp_path / "r.html").read_text().startswith("<!DOCTYPE html>")


# ------------------------------------------------------------------------------------------------
# the verdict, not-estimable fits, missing numbers
# ------------------------------------------------------------------------------------------------


def test_verdict_section_is_first_and_shows_the_sentences(report):
    results, html, _ = report
    t = _tables(html)
    assert t.h2[0] == "verdict"
    assert html.index('id="verdict"') < html.index('id="spec"') < html.index('id="speedup"')
    rows = t.rows("verdict-table")
    assert len(rows) == len(results["verdict"])
    text = _text(html)
    for sentence in SENTENCES.values():
        assert sentence in text
    for row, v in zip(rows, results["verdict"], strict=True):
        cell, quantity, family, sentence, estimate, ci, runs, p, p_adj, significant, mde = row
        assert (cell, sentence, family) == (v["cell"], v["sentence"], v["family"])
        assert runs == "3 vs 3 (paired by seed)"
        if v["quantity"].startswith("speedup"):
            assert estimate == fmt_pct(v["estimate"]) and mde == fmt_pct(v["mde"])
        else:
            assert estimate == fmt_num(v["estimate"]) and ci == fmt_ci(v["ci_low"], v["ci_high"])
        if v["estimable"]:
            assert p == fmt_p(v["p"]) and p_adj == fmt_p(v["p_adjusted"])
            assert significant == ("yes" if v["significant"] else "no")
        else:  # the reason instead of p, and never "significant"
            assert p == f"not estimable: {v['reason']}" and significant == "no" and p_adj == "–"
    assert rows[1][1] == "speed-up to reward 0.8" and rows[1][4] == "+58%" and rows[1][5] == "+21% to +104%"
    assert rows[2][2] == "primary"
    # the sampler offset explains itself; several runs per arm: no 1-run banner
    assert t.rows("sampler-offset-table")[0][-1] == SAMPLER_SENTENCE
    assert ONE_RUN_BANNER not in html and NO_VERDICT not in html


def test_not_estimable_lmm_fit_shows_its_reason_and_no_p(report):
    results, html, _ = report
    t = _tables(html)
    numeric_p = [fmt_p(fe["p"]) for fe in results["lmm"]["fits"]["clip_toy"]["fixed"]]  # asdict keeps them
    clip = [r for r in t.rows_by_class("lmm-table") if r[0] == "CLIP (toy)"]
    assert len(clip) == 3
    for row in clip:  # the reason instead of p, and no detectable effect
        assert row[-2] == f"not estimable: {NOT_ESTIMABLE_REASON}" and row[-1] == "–"
        assert not set(row) & set(numeric_p) and "p = " not in " ".join(row)
    diag = next(r for r in t.rows("lmm-diagnostics") if r[0] == "CLIP (toy)")
    assert diag[1] == f"not estimable: {NOT_ESTIMABLE_REASON}"
    simple = next(r for r in t.rows("simple-effects-table") if r[1] == "CLIP (toy)")
    assert simple[-2] == f"not estimable: {NOT_ESTIMABLE_REASON}" and simple[3] == "0.001" and simple[-1] == "–"
    # never bold: no <b> between the CLIP row's start and its end in any LMM table
    for m in re.finditer(r"<tr><td class=\"l\">CLIP \(toy\)</td>.*?</tr>", html, re.S):
        assert "<b>" not in m.group(0)
    # the estimable FD fit keeps its p-values and CI
    fd = next(r for r in t.rows_by_class("lmm-table") if r[0] == "FD (toy)")
    fe = next(f for f in results["lmm"]["fits"]["fd_toy"]["fixed"] if f["term"] == "algorithm[T.PCPO]")
    assert fd[2] == fmt_ci(fe["ci_low"], fe["ci_high"]) and fd[6] == fmt_p(fe["p"])
    # what each estimable row could have detected: the t test's 80%-power effect at its SE and df
    from pcpo_eval.report.html import fmt_num
    from pcpo_eval.stats.power import mde_from_se

    # at its family's level: Holm over the term's estimable metrics (alpha / m)
    m = results["lmm"]["adjusted"]["fd_toy"]["algorithm[T.PCPO]"]["family_size"]
    assert m == 2 and fe["mde_level"] == 0.05 / m
    assert fd[-1] == fmt_num(fe["mde"]) == fmt_num(mde_from_se(fe["se"], fe["df"], alpha=0.05 / m, measured=True)) != "–"


def test_lmm_fits_in_to_dict_shape():
    """``LMMResult.to_dict`` keys fixed effects by term and writes ``p: null`` when not estimable."""
    from pcpo_eval.stats import adjust_across_metrics

    fits = synthetic_fits(synthetic_scores())
    lmm = {"formula": "value ~ algorithm * batch + (1|prompt)", "coding": "treatment", "df_method": "Satterthwaite",
           "adjust": "holm", "alpha": 0.05, "fits": {m: f.to_dict() for m, f in fits.items()},
           "adjusted": adjust_across_metrics(fits)}
    results = to_jsonable({"study": {"name": "to_dict"}, "lmm": lmm})
    assert results["lmm"]["fits"]["clip_toy"]["fixed"]["algorithm[T.PCPO]"]["p"] is None
    html = render_report(results)
    t = _tables(html)
    rows = t.rows_by_class("lmm-table")
    assert len(rows) == 3 * 3
    assert all(r[-2] == f"not estimable: {NOT_ESTIMABLE_REASON}" for r in rows if r[0] == "clip_toy")
    fd = next(r for r in rows if r[0] == "fd_toy")
    assert fd[6] == fmt_p(fits["fd_toy"].term("algorithm[T.PCPO]").p) and fd[2].startswith("[")
    assert not MISSING_WORDS.search(_text(html))


def test_one_run_per_arm_banner():
    """Every arm with 1 run: the banner, the study's sentence, no p-value and nothing significant."""
    html = render_report({"study": {"name": "one run"}, "verdict": to_jsonable(synthetic_verdict(n_runs=1))})
    t = _tables(html)
    assert t.h2[0] == "verdict" and ONE_RUN_BANNER in html
    assert html.index(ONE_RUN_BANNER) < html.index('id="verdict-table"')
    rows = t.rows("verdict-table")
    assert len(rows) == 4
    assert all(r[7] == "not estimable: 1 run per arm" and r[9] == "no" and r[6] == "1 vs 1 (unpaired)" for r in rows)
    assert all(r[5] == "–" for r in rows)  # no CI: a dash, not "None"
    assert not MISSING_WORDS.search(_text(html))


def test_one_run_banner_from_runs_without_verdict():
    runs = [r for r in synthetic_runs(epochs=6) if r["seed"] == 0]
    html = render_report({"study": {"name": "runs only"}, "runs": to_jsonable(runs)})
    assert ONE_RUN_BANNER in html and NO_VERDICT in html


def test_old_results_without_verdict_still_render(report):
    results, _, _ = report
    old = legacy_results({**results, "grids": [], "figures": {}})
    html = render_report(old)
    t = _tables(html)
    assert t.h2[0] == "verdict" and NO_VERDICT in _text(html)
    ids = {a.get("id") for a, _ in t.tables}
    assert "verdict-table" not in ids and "health-table" not in ids and "sampler-offset-table" not in ids
    assert {"speedup-table", "raw-table", "lmm-diagnostics"} <= ids
    assert 'id="progression"' not in html and "No per-run curves" in html  # progression omitted silently
    assert ONE_RUN_BANNER not in html


def test_missing_numbers_never_print_as_none_or_nan(report):
    _, html, _ = report
    assert not MISSING_WORDS.search(_text(html))
    nulls = {"cell": None, "quantity": "auc", "baseline": None, "treatment": "PCPO", "estimate": None,
             "ci_low": None, "ci_high": 1.0, "n_baseline_runs": None, "n_treatment_runs": 2, "p": None,
             "estimable": True, "reason": None, "significant": None, "sentence": None}
    run = {"run": None, "cell": "c", "arm": "PCPO", "seed": None, "epochs": [1, 2, 3],
           "reward_mean": [0.1, None, float("nan")], "control_reward_mean": None, "compute_s": [None, 2.0, 3.0],
           "approx_kl": [None, None, 0.1], "clipfrac": [None] * 3,
           "ppo_health": {"median_approx_kl": None, "mean_clipfrac": float("nan"), "warning": None}}
    results = to_jsonable({
        "study": {"name": None, "description": None, "compare": {"baseline": None}},
        "verdict": [nulls], "runs": [run],
        "sampler_offset": [{"cell": "c", "baseline_control_mean": None, "difference": float("nan"), "explains": None}],
        "selection": {"target": None, "runs": [{"name": "r", "epoch": None, "reward": None, "gap": None, "reached": None}]},
        "raw_scores": {"columns": ["m"], "rows": [{"cell": None, "method": "PCPO", "role": "pcpo", "n_runs": None,
                                                   "epochs": [], "values": {"m": None}, "sd": {"m": None},
                                                   "significant": {}}],
                       "significance": {"c": {"m": {"estimate": None, "se": None, "df": None, "p": None,
                                                    "p_adj": None, "significant": False}}}},
        "lmm": {"formula": "f", "coding": "treatment", "df_method": "Satterthwaite", "alpha": 0.05,
                "fits": {"m": {"fixed": [{"term": "a[T.b]", "estimate": None, "se": None, "df": None, "t": None,
                                          "p": None, "ci_low": None, "ci_high": None}],
                               "estimable": False, "reason": None, "converged": None, "diagnostics": None}},
                "adjusted": {}},
        "progression": [{"run": "r", "epochs": [1, 2], "images": [[None, "missing.png"]]}],
    })  # fmt: skip
    html = render_report(results)
    assert not MISSING_WORDS.search(_text(html))
    t = _tables(html)
    v = t.rows("verdict-table")[0]
    assert v[4] == "–" and v[5] == "–" and v[6] == "2 vs – (unpaired)" and v[7] == "–" and v[9] == "no"
    assert t.rows_by_class("lmm-table")[0][-2] == "not estimable (no reason recorded)"
    assert html.count("missing</span>") >= 2  # progression cells without an image


def test_verdict_row_guards_significance():
    """Significance and p are shown only for an estimable comparison, whatever the flags say."""
    v = {"quantity": "epochs_to_target:0.9", "estimable": False, "reason": "r", "significant": True, "p": 0.01}
    row = verdict_row(v)
    assert row["p"] == "not estimable: r" and row["significant"] is False
    assert verdict_row({**v, "estimable": True})["significant"] is True
    assert verdict_row({**v, "estimable": None})["p"].startswith("not estimable")
    assert [quantity_label(q) for q in ("epochs_to_target:0.9", "reward_at_epoch:20", "paired_gain", "xyz:1")] == [
        "epochs to reward 0.9", "reward at epoch 20", "paired gain", "xyz:1"]
    assert fmt_ci(None, 1.0) == "–" and fmt_ci(-0.01, 0.016) == "[-0.01, 0.016]"


def test_health_table_and_progression(report):
    results, html, _ = report
    t = _tables(html)
    health = t.rows("health-table")
    assert len(health) == len(results["runs"])
    warned = [r for r in health if r[-1]]
    assert len(warned) == 1 and warned[0][0] == "PCPO_16_s2" and warned[0][-1].startswith("median approx. KL")
    assert EVIL_RUN in [r[0] for r in health]
    prog = next(r for a, r in t.tables if a.get("class") == "grid progression")
    assert prog[0] == ["Sample", "epoch 0", "epoch 20", "epoch 40"] and len(prog) == 1 + 2
    assert "min-max over seeds" in html and "compute seconds" in html  # the band and the axis are stated


def test_seed_band_and_mathtext_safe_labels():
    """The curve is the pointwise mean over seeds with a min-max band; x can be mean wall-clock time."""
    runs = [{"cell": "c", "arm": "a", "epochs": [1, 2], "reward_mean": [0.1, 0.4], "compute_s": [10.0, 20.0]},
            {"cell": "c", "arm": "a", "epochs": [1, 2, 3], "reward_mean": [0.3, None, 0.5],
             "compute_s": [12.0, 22.0, 30.0]}]
    b = figures.seed_band(runs, "reward_mean")
    assert b == {"x": [1.0, 2.0, 3.0], "mean": [pytest.approx(0.2), 0.4, 0.5], "lo": [0.1, 0.4, 0.5],
                 "hi": [0.3, 0.4, 0.5]}
    assert figures.seed_band(runs, "reward_mean", "compute_s")["x"] == [11.0, 21.0, 30.0]
    bad = [{**r, "arm": r"$\notacommand{$", "cell": "$x^$"} for r in runs]  # malformed mathtext in user text
    assert figures.fig_uri(figures.reward_curves_figure(bad, {}, wall_clock=True)).startswith("data:image/png;base64,")


def test_empty_verdict_and_runs_without_wall_clock():
    runs = [{k: v for k, v in r.items() if k != "compute_s"} for r in synthetic_runs(epochs=5)]
    html = render_report({"study": {"name": "empty verdict"}, "verdict": [], "runs": to_jsonable(runs)})
    ids = {a.get("id") for a, _ in _tables(html).tables}
    assert "The verdict in this results.json is empty" in html and "verdict-table" not in ids
    assert "The runs log no wall-clock time." in html and "health-table" in ids
    assert ONE_RUN_BANNER not in html  # 3 seeds per arm


def test_an_older_results_file_names_its_compute_time_wall_time_s(tmp_path):
    """``runs[].wall_time_s`` held the cumulative compute time, while ``traces[].wall_time_s`` is the log's
    per-epoch column: the runs' key is ``compute_s`` now, and an older file is read with its old name."""
    from pcpo_eval.report.html import read_results

    runs = to_jsonable(synthetic_runs(epochs=5))
    old = [{**{k: v for k, v in r.items() if k != "compute_s"}, "wall_time_s": r["compute_s"]} for r in runs]
    (tmp_path / "results.json").write_text(json.dumps({"study": {"name": "old"}, "verdict": [], "runs": old}))
    read = read_results(tmp_path)["runs"]
    assert [r["compute_s"] for r in read] == [r["compute_s"] for r in runs]
    assert not any("wall_time_s" in r for r in read)
    assert "The runs log no wall-clock time." not in render_report({"study": {"name": "old"}, "runs": read})


def test_console_speedup_lines_say_what_each_speedup_is_worth():
    """`pcpo-eval demo`'s console summary printed each speed-up as a bare point estimate ("-> +67%"), so an
    A/A study's chance speed-up read as a finding; each now carries its verdict row's Holm p and status."""
    from pcpo_eval.report.summary import speedup_lines

    def row(q, target, sp, p_adj, sig):
        return {"quantity": q, "curve": q.split(":")[0].removeprefix("speedup_"), "target": target,
                "uninformative": False, "baseline_epochs": "13.3", "pcpo_epochs": "8.0", "speedup": sp,
                "p_adjusted": p_adj, "significant": sig}

    res = {"speedup": [{"cell": "all", "baseline": "DDPO", "pcpo": "PCPO", "rows": [
        row("speedup_gain:0.03", 0.03, 0.67, 0.41, False), row("speedup_gain:0.06", 0.06, 0.5, 0.004, True),
        row("speedup_reward:0.9", 0.9, 0.3, 0.01, False),
        {"quantity": "speedup_reward:0.84", "curve": "reward", "target": 0.84, "uninformative": True,
         "status": "uninformative: the untrained control reaches 0.84 in 4 of 6 runs", "speedup": None}]}],
        "verdict": [{"cell": "all", "quantity": "speedup_reward:0.9", "details": {"gated": True}}]}
    assert speedup_lines(res) == [
        "  speed-up [all] gain 0.03: DDPO 13.3 vs PCPO 8.0 epochs -> +67% (Holm p 0.41: no evidence of a difference)",
        "  speed-up [all] gain 0.06: DDPO 13.3 vs PCPO 8.0 epochs -> +50% (Holm p 0.004: significant)",
        "  speed-up [all] reward 0.9: DDPO 13.3 vs PCPO 8.0 epochs -> +30% (Holm p 0.01: not tested)",
        "  speed-up [all] reward 0.84: uninformative: the untrained control reaches 0.84 in 4 of 6 runs"]


def test_large_images_are_embedded_as_thumbnails(tmp_path):
    """A grid of 1024-px images (the base model's column repeated in every cell) is embedded at twice its shown
    size as JPEG (before: each file whole, 231 MB for two cells of 1024-px PNGs); a small (toy) image is embedded
    as its own file, lossless and drawn pixelated."""
    import base64
    import io

    import numpy as np
    from PIL import Image

    from pcpo_eval.report.html import GRID_THUMB_PX

    results = synthetic_results(tmp_path)
    rng = np.random.default_rng(0)
    big = tmp_path / "sets" / "big" / "p.png"
    big.parent.mkdir(parents=True)
    Image.fromarray(rng.integers(0, 256, (1024, 768, 3), dtype=np.uint8)).save(big)
    grid = results["grids"][0]
    small = grid["rows"][0]["images"][0][0]
    grid["rows"][0]["images"][0] = [str(big.relative_to(tmp_path))] * 8 + [small]
    results["grids"] = [{**grid, "cell": f"cell {i}"} for i in range(3)]
    (tmp_path / "results.json").write_text(json.dumps(to_jsonable(results)))
    html = write_report(tmp_path, figures=False).read_text()
    jpegs = set(re.findall(r'src="data:image/jpeg;base64,([^"]+)"', html))
    assert len(jpegs) == 1  # one thumbnail, drawn smoothly
    thumb = Image.open(io.BytesIO(base64.b64decode(jpegs.pop())))
    assert max(thumb.size) == GRID_THUMB_PX and thumb.size == (108, 144)
    assert html.count('class="px smooth"') == 3 * 8
    own = "data:image/png;base64," + base64.b64encode((tmp_path / small).read_bytes()).decode()
    assert f'class="px" src="{own}"' in html
    assert len(html) < 2_000_000  # 24 copies of a 2.3 MB PNG before


def test_raw_score_rows_say_why_their_ci_does_not_decide_and_what_the_metrics_measure():
    """An A/A report printed IS "-0.1229 [-0.2072, -0.0387]" beside p 0.333 (the exact permutation test
    bounds p at 2 runs per arm) without a word; the columns said "PCPO − baseline" for arms B and A; and FD
    never said it is a distance to the base model's images (where a frozen policy sits at 0)."""
    reason = ("p is the larger of the t test's and that of the exact relabelling permutation test over all 6: 2 runs in an "
              "arm: a t test needs at least 3 to be trusted alone")
    sig = {"all": {"is_toy": {"estimate": -0.1229, "se": None, "df": 1.61, "ci_low": -0.2072, "ci_high": -0.0387,
                              "mde": None, "p": 1 / 3, "p_adj": 1.0, "estimable": True, "reason": reason,
                              "significant": False, "run_values": {"baseline": [3.9, 3.91], "treatment": [3.8, 3.77]}},
                   "fd_toy": {"estimate": 1.0, "se": None, "df": 3.0, "ci_low": -2.0, "ci_high": 4.0, "mde": 9.0,
                              "p": 0.5, "p_adj": 1.0, "estimable": True, "reason": None, "significant": False},
                   "lpips_toy": {"estimate": 0.2, "se": 0.05, "df": 4.0, "ci_low": 0.06, "ci_high": 0.34, "mde": 0.2,
                                 "p": 0.004, "p_adj": 0.012, "estimable": True, "reason": None, "significant": True,
                                 "caveat": "significant by the LMM, whose (1|run) gives both arms one ..."}}}
    results = {"study": {"name": "aa", "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"}},
               "metric_labels": {"fd_toy": "FD (toy)", "is_toy": "IS* (toy)"},
               "raw_scores": {"columns": ["fd_toy", "is_toy"], "rows": [], "significance": sig, "rule": "bold: ...",
                              "direction": {"fd_toy": "lower is better", "is_toy": "lower is better"},
                              "against_base": ["fd_toy"], "small_sets": {"fd_toy": {"images": 64, "dim": 128}}}}
    text = _text(render_report(results))
    assert "B − A" in text and "PCPO − baseline" not in text
    assert re.search(r"IS\* \(toy\)\s+2 vs 2\s+-0.1229", text)  # the runs each row used
    assert f"* IS* (toy) (all): {reason}; its 95% CI is the t test's and does not decide this row (p 0.333)" in text
    assert 'no effect is detectable with these runs ("none")' in text and "FD (toy) (all):" not in text
    assert "Direction: FD (toy) lower is better; IS* (toy) lower is better." in text
    assert "FD (toy): distance to the untrained base model's images of the same prompts and seeds" in text
    assert "FD (toy) from 64 images per set in 128 dimensions: the set's covariance is rank-deficient" in text
    assert "† lpips_toy (all): significant by the LMM, whose (1|run) gives both arms one ..." in text


def test_a_selection_its_untrained_controls_reach_says_it_is_not_matched_on_learning():
    note = "the untrained control of 2 of 2 reward-matched runs (Frozen) reaches select_target 0.8 by ..."
    sel = {"target": 0.8, "window": 5, "on": "train", "control_reaches": ["f0", "f1"], "control_reaches_note": note,
           "runs": [{"name": n, "cell": "all", "epoch": 12, "reward": 0.81, "gap": 0.01, "reached": True,
                     "control_reaches": True, "role": "pcpo"} for n in ("f0", "f1")]}
    text = _text(render_report({"study": {"name": "s"}, "selection": sel}))
    assert text.count(f"Not matched on learning: {note}") == 2  # the checkpoint and raw-score sections
    assert text.count("yes, and so does its untrained control") == 2 and "(smoothed training reward, window 5)" in text
    gain = _text(render_report({"study": {"name": "s"}, "selection": {**sel, "on": "gain", "control_reaches_note": None}}))
    assert "Not matched on learning" not in gain and "smoothed gain over the paired untrained control" in gain


def test_checkpoints_holding_a_moving_average_matched_on_the_raw_reward_are_flagged(tmp_path):
    """Runs with ema_decay keep the average in their checkpoints; matched on the raw policy's training reward,
    the matched weights lag: selection.json, the runner's log and the report say so; select_on: eval does not."""
    from types import SimpleNamespace

    from pcpo_eval.study.selection import averaged_weights_note

    runs = [SimpleNamespace(name=f"r{i}", train=SimpleNamespace(ema_decay=d), run_dir=None)
            for i, d in enumerate((0.9, 0.9, 0.0))]
    runs.append(SimpleNamespace(name="imported", train=None, run_dir=None))
    note = averaged_weights_note(SimpleNamespace(select_on="train", runs=runs))
    assert note.startswith("2 of 4 runs keep a moving average of their weights (ema_decay), which their checkpoints "
                           "hold, while select_on: train matches on the raw policy's training reward")
    assert averaged_weights_note(SimpleNamespace(select_on="eval", runs=runs)) is None
    assert averaged_weights_note(SimpleNamespace(select_on="gain", runs=runs[2:])) is None
    # an existing run folder (not trained by the study) is read from its config.yaml
    existing = tmp_path / "run"
    existing.mkdir()
    (existing / "config.yaml").write_text("ema_decay: 0.9\n")
    old = [*runs[2:], SimpleNamespace(name="existing", train=None, run_dir=str(existing))]
    assert averaged_weights_note(SimpleNamespace(select_on="train", runs=old)).startswith("1 of 3 runs keep")
    sel = {"target": 0.8, "window": 5, "on": "train", "averaged_weights_note": note,
           "runs": [{"name": "r0", "cell": "all", "epoch": 12, "reward": 0.81, "gap": 0.01, "reached": True}]}
    assert f"Averaged weights: {note}." in _text(render_report({"study": {"name": "s"}, "selection": sel}))
