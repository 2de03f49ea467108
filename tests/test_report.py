"""The HTML report formats synthetic result objects: self-contained, escaped, all sections present."""

from __future__ import annotations

import json
import re
from html.parser import HTMLParser

import pytest
from report_helpers import EVIL_PROMPT, EVIL_RUN, synthetic_results

from pcpo_eval.errors import UserError
from pcpo_eval.report.html import fmt_num, fmt_p, pretty_term, render_report, write_report
from pcpo_eval.study.results import to_jsonable


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
    # every image is an embedded PNG: plots (traces, rho, |g|), credit, Q-Q x2, grid 2 prompts x 3 models x 2 seeds
    imgs = [a["src"] for t, a in parser.tags if t == "img"]
    assert all(s.startswith("data:image/png;base64,") for s in imgs)
    assert len(imgs) == 3 + 1 + 2 + 12
    # the significant PCPO FD value is bold, the non-significant LPIPS is not
    assert "<b>9.877</b>" in html and "<b>0.52</b>" not in html
    # df method and the fit failure are stated, not hidden
    assert "Satterthwaite" in html and "fit failed: grouping column" in html


def test_lmm_numbers_match_result_objects(report):
    results, html, _ = report
    fe = next(f for f in results["lmm"]["fits"]["fd_toy"]["fixed"] if f["term"] == "algorithm[T.PCPO]")
    assert fmt_num(fe["estimate"]) in html
    assert fmt_p(results["lmm"]["adjusted"]["fd_toy"]["algorithm[T.PCPO]"]["p_holm"]) in html
    # speed-up rows from SpeedupTable.to_dict (paper formula)
    row = results["speedup"][0]["table"]["targets"][0]
    assert f"{row['speedup_pct']:.1f}%" in html


def test_formatters():
    assert fmt_num(None) == "–" and fmt_num(float("nan")) == "–"
    assert fmt_num(12.3456) == "12.35" and fmt_num(0.6208) == "0.6208" and fmt_num(3) == "3"
    assert fmt_p(0.0471) == "0.047" and fmt_p(1.2e-6) == "1.2e-06"
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
