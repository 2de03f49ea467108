"""Reliability issue: data loss, silently wrong input, concurrency, Ctrl-C and stray tracebacks.

Each case runs the real CLI (the ``cli`` fixture) and, for bad input, checks the one ``error:`` line,
exit code 2 and an unchanged folder (sha256 of every file before/after; helpers of test_bad_input).
"""

from __future__ import annotations

import pytest
from test_bad_input import box, rejected  # noqa: F401  (the fixture is used by name)

# ---- 1. report on a results.json that is not a study's results ---------------------------------

@pytest.mark.parametrize("content", ["{}", "[]", "3", "null", '"x"', '{"runs": []}', '{"study": 1}'],
                         ids=["empty-object", "list", "number", "null", "string", "no-study", "study-not-object"])
def test_report_refuses_non_results_keeps_html(cli, box, content):  # noqa: F811
    study = box / "study"
    study.mkdir()
    (study / "report.html").write_text("<html>the previous report</html>")
    (study / "results.json").write_text(content)
    line = rejected(cli, box, "report", study, needles=["results.json"])
    assert "re-run" in line
    assert (study / "report.html").read_text() == "<html>the previous report</html>"
