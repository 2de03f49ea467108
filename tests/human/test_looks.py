"""Interim looks at a human study's answers (``human analyze`` without ``--final``): logged, never a verdict,
counted once per set of answers, and closed by the final analysis (:func:`pcpo_eval.human.report._mark_look`).

Also what a review found: an append after a cut line lost the final look, a deleted ``looks.jsonl`` reopened
a closed study, a failed ``--final`` (analysis.json could not be written) still closed it, and a damaged study
``results.json`` was a traceback after human.json had been rewritten."""

from __future__ import annotations

import hashlib
import json
from pathlib import Path

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout
from pcpo_eval.human.report import _mark_look, analyze_folder
from pcpo_eval.human.simulate import simulate_responses
from pcpo_eval.io import append_jsonl
from tests.support.human import make_human_dir


def _res(answers: int, raters: int) -> dict:
    return {"counts": {"main_responses_used": answers, "raters": raters},
            "comparisons": [{"comparison": "A vs B", "significant": True, "verdict": "Raters preferred A over B: ..."}]}


def _look(res: dict, lay: HumanLayout, final: bool) -> dict:
    """As ``analyze_folder`` does: mark, (write), then log."""
    marked, entry = _mark_look(res, lay, final)
    append_jsonl(lay.looks, entry)
    return marked


def test_looks_are_counted_once_per_set_of_answers_and_closed_by_the_final(tmp_path):
    lay = HumanLayout(tmp_path)
    first = _look(_res(100, 5), lay, final=False)
    (c,) = first["comparisons"]
    assert first["interim"] and not c["significant"] and c["significant_interim"]
    assert c["verdict"] == "Interim look 1 (answers so far; not the study's verdict): Raters preferred A over B: ..."
    assert _look(_res(100, 5), lay, final=False)["looks"]["look"] == 1  # the same answers read again
    assert _look(_res(150, 8), lay, final=False)["looks"]["look"] == 2
    final = _look(_res(200, 10), lay, final=True)
    assert final["comparisons"][0]["significant"] and "interim" not in final
    assert final["looks"]["interim_before"] == 2 and final["looks"]["note"].startswith(
        "2 interim analyses were run on earlier answers before this final one: deciding when to stop")
    with pytest.raises(UserError, match=r"was closed by a --final analysis .*analyse it with --final again"):
        _look(_res(210, 11), lay, final=False)
    again = _look(_res(200, 10), lay, final=True)
    assert again["looks"]["finals_before"] == 1 and "; 1 earlier final analysis(es) of the study:" in again["looks"]["note"]
    logged = [json.loads(x) for x in lay.looks.read_text().splitlines()]
    assert [x["final"] for x in logged] == [False, False, False, True, True]  # the refused look is not logged
    (tmp_path / "looks.jsonl").write_text(lay.looks.read_text() + "7\nnot json\n")  # damage is no crash: refused
    with pytest.raises(UserError, match="damaged at line 6"):
        _look(_res(200, 10), lay, final=True)


def _study_with_answers(tmp_path: Path) -> tuple[HumanLayout, Path]:
    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    import pandas as pd

    answers = simulate_responses(pd.read_parquet(lay.pairs), 6, 10, 0.5, rng_seed=3).drop(columns="simulated")
    path = tmp_path / "answers.parquet"
    answers.to_parquet(path, index=False)
    return lay, path


def test_a_closed_study_stays_closed_without_its_log(tmp_path):
    lay, answers = _study_with_answers(tmp_path)
    analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None, final=True)
    lay.looks.unlink()  # deleted (or cut) after the final: analysis.json still records it
    with pytest.raises(UserError, match=r"closed by a --final analysis \(recorded in analysis.json\)"):
        analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None)


def test_a_failed_final_closes_nothing(tmp_path):
    lay, answers = _study_with_answers(tmp_path)
    analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None)  # an interim look
    lay.analysis.unlink()
    lay.analysis.mkdir()  # analysis.json cannot be written
    with pytest.raises(UserError, match=r"analysis.json is a folder where a file is written"):
        analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None, final=True)
    assert [json.loads(x)["final"] for x in lay.looks.read_text().splitlines()] == [False]  # not closed
    lay.analysis.rmdir()
    analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None)  # still open: another interim look


@pytest.mark.parametrize("damage", ["[1,2", "{}"])
def test_a_damaged_study_results_file_stops_before_anything_is_written(tmp_path, damage):
    lay, answers = _study_with_answers(tmp_path)
    study = tmp_path / "HUMAN" / "synthetic"  # design.json's study, relative to the design folder
    study.mkdir()
    (study / "results.json").write_text(damage)
    with pytest.raises(UserError, match="results.json"):
        analyze_folder(lay.root, answers, bootstrap=0, log=lambda s: None, final=True)
    assert not lay.analysis.exists() and not lay.looks.exists() and not (study / "human.json").exists()
    assert hashlib.sha256((study / "results.json").read_bytes()).hexdigest() == hashlib.sha256(damage.encode()).hexdigest()


def test_simulate_rehearses_the_designs_block(tmp_path, cli):
    """``human simulate`` without --per-rater gave each rater 20 main answers whatever the design (a review: a
    design of 40 pairs per rater, 38 of them main, rehearsed with 20); now the main pairs of one block as the
    app cuts it (``human.db.block_counts``), said on the console; more answers than the design has main pairs
    are capped and said so (were capped silently)."""
    import pandas as pd

    lay = make_human_dir(tmp_path / "HUMAN", n_prompts=6, n_seeds=3, n_checks=4, per_rater=10)
    pairs = pd.read_parquet(lay.pairs)
    n_main = int((pairs["kind"] == "main").sum())
    res = cli("human", "simulate", lay.root, "-o", tmp_path / "sim.parquet", "--raters", "3")
    assert res.returncode == 0, res.stderr
    from pcpo_eval.human.db import block_counts

    kinds = pairs["kind"].value_counts()
    expect = block_counts(n_main, int(kinds["identical"]), int(kinds["degraded"]), 10)[0]  # as the app cuts a block
    assert f"{expect} main-pair answers per simulated rater (the main pairs of a block of the design's per_rater 10" \
        in res.stdout
    sim = pd.read_parquet(tmp_path / "sim.parquet").merge(pairs[["pair_id", "kind"]], on="pair_id")
    assert (sim[sim["kind"] == "main"].groupby("rater_id").size() == expect).all()
    more = cli("human", "simulate", lay.root, "-o", tmp_path / "x.parquet", "--per-rater", str(n_main + 1))
    assert more.returncode == 0 and f"the design has {n_main} main pairs, so each simulated rater answers all" in more.stdout
    whole = make_human_dir(tmp_path / "WHOLE", n_prompts=6, n_seeds=3, n_checks=4, per_rater=30)  # > the design
    res = cli("human", "simulate", whole.root, "-o", tmp_path / "w.parquet", "--raters", "2")
    assert res.returncode == 0, res.stderr  # its own default was refused (25 of 18 main pairs; a review)
