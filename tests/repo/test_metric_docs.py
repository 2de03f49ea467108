"""The manual names every metric of the catalogue (``pcpo_eval/metrics/base.py`` ``METRICS``, the one home of
the list): a review found ``hps_v20`` and ``bertscore`` accepted by ``metrics`` but missing from metrics.md."""

from __future__ import annotations

from pathlib import Path

from pcpo_eval.metrics.base import METRICS


def test_metrics_md_names_every_metric():
    text = (Path(__file__).resolve().parents[2] / "docs" / "metrics.md").read_text()
    para = text[text.index("Metric names:"):].split("\n\n", 1)[0]
    assert {m for m in METRICS if f"`{m}`" not in para} == set()
