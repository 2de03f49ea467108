"""A missing per-update diagnostic value reaches results.json and the report as a gap, not a crash.

The ``ddpo_delta_terms`` end-to-end test once failed in the stats stage: with one optimizer update
per epoch every update is on-policy, its ``delta_ratio_per_update`` is NaN (``diagnostics.py``),
pandas hands a NaN inside a list to pyarrow as null, and a list column that is null throughout was
written as ``list<null>``, read back as None (``float(None)`` in ``traces``). Whether the on-policy
ratio came out 0 / 0 or a finite ratio of rounding noise depended on the thread count.

Here the study stand-ins of tests/support/study.py train; then every run's ``log.parquet`` gets the
per-update columns with a missing value written three ways (a null inside one update's list, an epoch
without the list, a column NaN throughout written by plain pandas, i.e. ``list<null>``), and the stats
and report stages run on them.
"""

from __future__ import annotations

import json
import math

import numpy as np
import pandas as pd
import pyarrow.parquet as pq
import pytest

from pcpo_eval.report.figures import diagnostics_figure, fig_uri, per_update_series
from pcpo_eval.study.results import PER_UPDATE_COLUMNS
from pcpo_eval.study.runner import run_study
from pcpo_eval.train.trainer import log_frame
from tests.support.study import install_fakes, write_spec

EPOCHS = 6


@pytest.fixture(scope="module")
def trained(tmp_path_factory):
    """A 1-factor study (2 arms x 2 seeds) through the metrics stage, on the stand-ins."""
    mp = pytest.MonkeyPatch()
    install_fakes(mp)
    root = tmp_path_factory.mktemp("missing_diag")
    spec = write_spec(root / "s.yaml", seeds=[0, 1], design={"algorithm": {"DDPO": {"objective": "ppo_clip"},
                                                                           "PCPO": {"objective": "pcpo"}}},
                      lmm={"formula": "value ~ algorithm + (1|prompt)"},
                      train={"overrides": {"epochs": EPOCHS, "checkpoint_every": 2}}, targets=[0.1], select_target=0.1, window=2)
    out = root / "study"
    run_study(spec, out, stages=("train", "select", "generate", "metrics"), log=lambda s: None)
    yield spec, out, mp
    mp.undo()


def _values(e: int, u: int) -> float:
    return 10.0 ** -(e + u)


KINDS = ("null_in_list", "epoch_without_list", "all_nan_plain_pandas")


def _with_missing(rows: list[dict], column: str, kind: str) -> None:
    if kind == "null_in_list":  # update 1 of epoch 1 missing
        rows[0][column] = [_values(1, 0), None]
    elif kind == "epoch_without_list":  # epoch 2 has no list at all
        del rows[1][column]
    else:  # NaN throughout: written by plain pandas, the list<null> column of the failed test
        for row in rows:
            row[column] = [math.nan, math.nan]


def test_missing_per_update_values_run_through_stats_and_report(trained):
    spec, out, _ = trained
    runs = sorted(p for p in (out / "runs").iterdir() if (p / "log.parquet").is_file())
    assert len(runs) == 4
    kinds: dict[tuple[str, str], str] = {}
    for i, rd in enumerate(runs):  # every kind in every column; a different pair per run
        log = pd.read_parquet(rd / "log.parquet")
        rows = log.drop(columns=[c for c in PER_UPDATE_COLUMNS if c in log.columns]).to_dict("records")
        for e, row in enumerate(rows, start=1):  # two updates per epoch
            row.update({c: [_values(e, 0), _values(e, 1)] for c in PER_UPDATE_COLUMNS})
        for j, column in enumerate(PER_UPDATE_COLUMNS):
            kinds[rd.name, column] = KINDS[(i + j) % 3] if i < 3 else KINDS[0]
            _with_missing(rows, column, kinds[rd.name, column])
        if "all_nan_plain_pandas" in {kinds[rd.name, c] for c in PER_UPDATE_COLUMNS}:
            pd.DataFrame(rows).to_parquet(rd / "log.parquet", index=False)
        else:  # the trainer's writer
            log_frame(rows).to_parquet(rd / "log.parquet", index=False)
    for (name, column), kind in kinds.items():  # what the failed test's stats stage read back
        if kind == "all_nan_plain_pandas":
            assert str(pq.read_schema(out / "runs" / name / "log.parquet").field(column).type) == "list<element: null>"
            assert pd.read_parquet(out / "runs" / name / "log.parquet")[column][0].tolist() == [None, None]
    assert set(kinds.values()) == set(KINDS)

    report = run_study(spec, out, stages=("stats", "report"), log=lambda s: None)

    traces = {t["run"]: t for t in json.loads((out / "results.json").read_text())["traces"]}
    assert len(traces) == 4
    for (name, column), kind in kinds.items():
        t = traces[name]
        assert len(t[column]) == EPOCHS
        full = [[_values(e, 0), _values(e, 1)] for e in range(1, EPOCHS + 1)]
        if kind == "null_in_list":
            assert t[column] == [[_values(1, 0), None], *full[1:]]  # NaN -> null in strict JSON
            x, y = per_update_series(t, column)  # the gap keeps its place on the x axis
            assert x[:3] == [0.25, 0.75, 1.25] and y[0] == _values(1, 0) and math.isnan(y[1]) and y[2] == _values(2, 0)
        elif kind == "epoch_without_list":
            assert t[column] == [full[0], [], *full[2:]]
        else:
            assert t[column] == [[None, None]] * EPOCHS
    html = report.read_text()
    assert 'id="diagnostics"' in html and "Taylor error and Eq. Delta ratio per update" in html
    assert fig_uri(diagnostics_figure(list(traces.values()))).startswith("data:image/png;base64,")


def test_log_frame_keeps_all_nan_list_columns_as_floats(tmp_path):
    """The trainer's log writer: a per-update column NaN throughout round-trips as NaN floats."""
    rows = [{"epoch": e, "delta_ratio_per_update": [math.nan], "mixed": [1.0, None], "names": ["a"]}
            for e in (1, 2)] + [{"epoch": 3}]
    log_frame(rows).to_parquet(tmp_path / "log.parquet", index=False)
    schema = pq.read_schema(tmp_path / "log.parquet")
    assert str(schema.field("delta_ratio_per_update").type) == "list<element: double>"
    assert str(schema.field("names").type) == "list<element: string>"  # not numeric: left to pyarrow
    back = pd.read_parquet(tmp_path / "log.parquet")
    assert back["delta_ratio_per_update"][0].dtype == np.float64 and np.isnan(back["delta_ratio_per_update"][1]).all()
    np.testing.assert_array_equal(back["mixed"][0], [1.0, np.nan])
    assert back["delta_ratio_per_update"][2] is None  # an epoch without the column
