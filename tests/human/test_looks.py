"""Interim looks at a human study's answers (``human analyze`` without ``--final``): logged, never a verdict,
counted once per set of answers, and closed by the final analysis (:func:`pcpo_eval.human.report._with_looks`)."""

from __future__ import annotations

import json

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout
from pcpo_eval.human.report import _with_looks


def _res(answers: int, raters: int) -> dict:
    return {"counts": {"main_responses_used": answers, "raters": raters},
            "comparisons": [{"comparison": "A vs B", "significant": True, "verdict": "Raters preferred A over B: ..."}]}


def test_looks_are_counted_once_per_set_of_answers_and_closed_by_the_final(tmp_path):
    lay = HumanLayout(tmp_path)
    first = _with_looks(_res(100, 5), lay, final=False)
    (c,) = first["comparisons"]
    assert first["interim"] and not c["significant"] and c["significant_interim"]
    assert c["verdict"] == "Interim look 1 (answers so far; not the study's verdict): Raters preferred A over B: ..."
    assert _with_looks(_res(100, 5), lay, final=False)["looks"]["look"] == 1  # the same answers read again
    assert _with_looks(_res(150, 8), lay, final=False)["looks"]["look"] == 2
    final = _with_looks(_res(200, 10), lay, final=True)
    assert final["comparisons"][0]["significant"] and "interim" not in final
    assert final["looks"]["interim_before"] == 2 and final["looks"]["note"].startswith(
        "2 interim analyses were run on earlier answers before this final one: deciding when to stop")
    with pytest.raises(UserError, match=r"was closed by a --final analysis .*analyse it with --final again"):
        _with_looks(_res(210, 11), lay, final=False)
    again = _with_looks(_res(200, 10), lay, final=True)
    assert again["looks"]["finals_before"] == 1 and "; 1 earlier final analysis(es) of the study:" in again["looks"]["note"]
    logged = [json.loads(x) for x in lay.looks.read_text().splitlines()]
    assert [x["final"] for x in logged] == [False, False, False, True, True]  # the refused look is not logged
    (tmp_path / "looks.jsonl").write_text(lay.looks.read_text() + "7\nnot json\n")  # junk lines are skipped
    assert _with_looks(_res(200, 10), lay, final=True)["looks"]["finals_before"] == 2
