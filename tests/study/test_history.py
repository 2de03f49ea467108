"""The study's analysis history and the append-only logs behind it (``pcpo_eval/study/history.py``,
``pcpo_eval.io.read_jsonl`` / ``append_jsonl``), against what a review found:

* runs trained further after a verdict was seen were not another look (no caveat);
* one setting re-run twice counted as two earlier analyses;
* an append after a line a crash cut short was glued onto it and lost;
* bytes that are not UTF-8, or a JSON line of the wrong shape, were tracebacks;
* a read-only log failed the stats stage after results.json had been replaced, and the other spec's next
  run then said "statistics unchanged" over the unlogged verdict.
"""

from __future__ import annotations

import json
from pathlib import Path

import pytest

from pcpo_eval.errors import UserError
from pcpo_eval.io import append_jsonl, read_jsonl
from pcpo_eval.study.history import history_caveat, settings_of
from pcpo_eval.study.runner import run_study
from pcpo_eval.study.spec import load_spec
from pcpo_eval.studydir import StudyLayout
from pcpo_eval.testing import isolate_weight_caches
from tests.support.study import install_fakes, rising, write_spec

ROWS = [{"cell": "all", "quantity": "paired_gain", "family": "primary"}]
AA = {"design": {"algorithm": {"A": {}, "B": {}}}, "compare": {"factor": "algorithm", "baseline": "A", "pcpo": "B"},
      "lmm": {"formula": "value ~ algorithm + (1|prompt)"}, "seeds": {"A": [0, 1], "B": [2, 3]}}


@pytest.fixture(autouse=True)
def _no_real_weights(tmp_path, monkeypatch):
    isolate_weight_caches(tmp_path, monkeypatch)


def _entry(sp, epochs: dict[str, int], **settings) -> dict:
    return {"at": "t", "runs": sorted(r.name for r in sp.runs), "run_epochs": epochs,
            "settings": {**settings_of(sp, ["all: paired_gain"]), **settings}}


def _logged(tmp_path: Path, *entries: dict) -> StudyLayout:
    lay = StudyLayout(tmp_path / "study")
    lay.out.mkdir(parents=True, exist_ok=True)
    lay.analyses_file.write_text("".join(json.dumps(e) + "\n" for e in entries))
    return lay


def test_runs_trained_further_after_a_look_are_another_look(tmp_path):
    sp = load_spec(write_spec(tmp_path / "s.yaml", **AA))
    ten, twelve = ({r.name: n for r in sp.runs} for n in (10, 12))
    lay = _logged(tmp_path, _entry(sp, ten))
    said = history_caveat(sp, lay, ROWS, twelve)
    assert said["other_lengths"] == 1 and said["earlier"] == 0
    assert "1 earlier analysis(es) saw these runs at other lengths (trained further, or cut, after a verdict was seen)" \
        in said["note"]
    assert history_caveat(sp, lay, ROWS, ten) is None  # the same runs at the same lengths: nothing to say


def test_one_setting_re_run_counts_once(tmp_path):
    sp = load_spec(write_spec(tmp_path / "s.yaml", **AA))
    ep = {r.name: 12 for r in sp.runs}
    old = _entry(sp, ep, targets=[0.9])
    said = history_caveat(sp, _logged(tmp_path, old, old, old), ROWS, ep)
    assert said["earlier"] == 1 and said["changed"] == ["targets"]
    said = history_caveat(sp, _logged(tmp_path, old, _entry(sp, ep, targets=[0.8])), ROWS, ep)
    assert said["earlier"] == 2


def test_damaged_or_foreign_lines_are_one_error(tmp_path):
    sp = load_spec(write_spec(tmp_path / "s.yaml", **AA))
    lay = _logged(tmp_path, _entry(sp, {}))
    with open(lay.analyses_file, "ab") as fh:
        fh.write(b"\xff\xfe\n")
    with pytest.raises(UserError, match=r"is damaged at line 2 \(not a JSON object\)"):
        history_caveat(sp, lay, ROWS)
    for bad, needle in (({"runs": 5, "settings": {}}, "record 2 is not an analysis"),
                        ({"runs": ["a"], "settings": "x"}, "record 2 is not an analysis")):
        lay = _logged(tmp_path, _entry(sp, {}), bad)
        with pytest.raises(UserError, match=needle):
            history_caveat(sp, lay, ROWS)


def test_a_line_cut_by_a_crash_loses_only_itself(tmp_path):
    log = tmp_path / "log.jsonl"
    append_jsonl(log, {"n": 1})
    append_jsonl(log, {"n": 2})
    log.write_bytes(log.read_bytes()[:-5])  # a crash cut the last line short
    assert read_jsonl(log) == [{"n": 1}]
    append_jsonl(log, {"n": 3})  # before: glued onto the cut line, and lost with it
    assert read_jsonl(log) == [{"n": 1}, {"n": 3}]
    assert log.read_bytes().endswith(b'{"n": 3}\n')
    log.write_bytes(log.read_bytes() + b'{"n": 4}')  # a whole record without its newline: read, and kept
    assert read_jsonl(log)[-1] == {"n": 4}
    append_jsonl(log, {"n": 5})
    assert read_jsonl(log) == [{"n": 1}, {"n": 3}, {"n": 4}, {"n": 5}]
    log.write_bytes(log.read_bytes() + b"garbage\n" + b'{"n": 6}\n')  # damage within the file: not a crash's
    with pytest.raises(UserError, match="damaged at line 5"):
        read_jsonl(log)


def test_a_log_that_cannot_be_written_leaves_the_old_results(tmp_path, monkeypatch):
    fakes = install_fakes(monkeypatch)
    fakes.curves = {"A": rising(0.07, run_sd=0.01), "B": rising(0.07, run_sd=0.01)}
    out = tmp_path / "study"
    run_study(write_spec(tmp_path / "s.yaml", **AA, targets=[0.3]), out, log=lambda s: None)
    before = (out / "results.json").read_bytes()
    (out / "analyses.jsonl").unlink()
    (out / "analyses.jsonl").mkdir()  # a log that cannot be appended to (a folder; a read-only file for a user)
    with pytest.raises(UserError, match="analyses.jsonl"):
        run_study(write_spec(tmp_path / "s.yaml", **AA, targets=[0.4]), out, ("stats",), log=lambda s: None)
    assert (out / "results.json").read_bytes() == before
