"""Report figures of the training diagnostics: validation reward per epoch, Taylor error and Eq. Delta ratio."""

from __future__ import annotations

import math

from pcpo_eval.io import to_jsonable
from pcpo_eval.report.figures import (
    diagnostics_figure,
    fig_uri,
    per_update_series,
    seed_band,
    validation_figure,
)
from pcpo_eval.report.html import render_report

NAN = math.nan


def _trace(run: str, arm: str, role: str, seed: int, offset: float) -> dict:
    return {"run": run, "arm": arm, "role": role, "cell": "all", "seed": seed, "epoch": [1, 2, 3, 4],
            "reward_mean": [0.1, 0.2, 0.3, 0.4], "reward_smoothed": [0.1, 0.2, 0.3, 0.4],
            "val_reward_mean": [NAN, 0.5 + offset, NAN, 0.7 + offset],
            "val_control_reward_mean": [NAN, 0.45, NAN, 0.45],
            "taylor_rel_err_per_update": [[1e-6, 3e-3]] * 4,
            "delta_ratio_per_update": [[NAN, 20.0]] * 4}


TRACES = [_trace("d0", "ddpo", "baseline", 0, 0.0), _trace("d1", "ddpo", "baseline", 1, 0.02),
          _trace("p0", "pcpo", "pcpo", 0, 0.1)]


def test_validation_band_is_mean_over_seeds_at_validated_epochs():
    runs = [{**t, "epochs": t["epoch"]} for t in TRACES[:2]]
    b = seed_band(runs, "val_reward_mean")
    assert b["x"] == [2.0, 4.0]
    assert all(abs(a - e) < 1e-12 for a, e in zip(b["mean"], [0.51, 0.71], strict=True))
    assert b["lo"] == [0.5, 0.7] and b["hi"] == [0.52, 0.72]
    assert fig_uri(validation_figure(TRACES, {"ddpo": "baseline", "pcpo": "pcpo"})).startswith("data:image/png;base64,")
    assert validation_figure([{k: v for k, v in t.items() if not k.startswith("val_")} for t in TRACES], {}) is None


def test_per_update_series_and_plot():
    x, y = per_update_series(TRACES[0], "taylor_rel_err_per_update")
    assert x[:2] == [0.25, 0.75] and x[-1] == 3.75 and y[:2] == [1e-6, 3e-3]
    assert fig_uri(diagnostics_figure(TRACES)).startswith("data:image/png;base64,")
    assert diagnostics_figure([{"run": "r", "epoch": [1]}]) is None


def test_report_shows_the_sections_only_when_logged():
    results = to_jsonable({"study": {"name": "s", "compare": {"baseline": "ddpo", "pcpo": "pcpo"}}, "metrics": [],
                           "traces": TRACES})
    html = render_report(results)
    assert "Held-out validation reward" in html and "Ratio diagnostics per update" in html
    bare = to_jsonable({"study": {"name": "s"}, "metrics": [],
                        "traces": [{"run": "r", "role": "baseline", "cell": "all", "epoch": [1], "reward_mean": [0.1],
                                    "reward_smoothed": [0.1]}]})
    html = render_report(bare)
    assert "Held-out validation reward" not in html and "Ratio diagnostics per update" not in html


def test_plot_with_every_per_update_value_missing():
    """Runs whose per-update lists hold only missing values (null in results.json) or zeros: the figure is
    drawn (an empty panel says so), without a legend warning."""
    import warnings

    traces = [{**t, "delta_ratio_per_update": [[None]] * 4, "taylor_rel_err_per_update": [[0.0]] * 4} for t in TRACES]
    x, y = per_update_series(traces[0], "delta_ratio_per_update")
    assert x == [0.5, 1.5, 2.5, 3.5] and all(math.isnan(v) for v in y)
    with warnings.catch_warnings():
        warnings.simplefilter("error")
        assert fig_uri(diagnostics_figure(traces)).startswith("data:image/png;base64,")
        assert fig_uri(diagnostics_figure([{**TRACES[0], "delta_ratio_per_update": [[None]] * 4}])).startswith("data:image/png")
