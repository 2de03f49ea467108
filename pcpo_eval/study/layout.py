"""Where a study keeps its files (paths only): one home for the ``OUT/`` layout.

::

    OUT/runs/<run>/                  trained runs (log.parquet, checkpoints/); existing runs stay where they are
    OUT/selection.json               reward-matched checkpoint per run
    OUT/sets/base, sets/<run>/epoch_NNNN           eval image sets    (pref_sets/... on preference prompts)
    OUT/metrics/base, metrics/<run>/epoch_NNNN     their metrics      (pref_metrics/...)
    OUT/results.json, report.html, study_state.json, figures/credit.png
"""

from __future__ import annotations

import json
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.study.spec import REPORT_FILE, RESULTS_FILE, STATE_FILE, RunSpec


def set_label(run_name: str, epoch: int) -> str:
    """Label of a selected checkpoint's image set and metrics: ``<run>/epoch_NNNN``."""
    return f"{run_name}/epoch_{int(epoch):04d}"


@dataclass(frozen=True)
class StudyLayout:
    """The paths of one study directory ``out``; reads nothing but ``selection.json``."""

    out: Path

    def run_dir(self, run: RunSpec) -> Path:
        """An existing run's own directory, else ``OUT/runs/<run>``."""
        return Path(run.run_dir) if run.run_dir else self.out / "runs" / run.name

    def set_dir(self, label: str, pref: bool = False) -> Path:
        return self.out / ("pref_sets" if pref else "sets") / label

    def metrics_dir(self, label: str, pref: bool = False) -> Path:
        return self.out / ("pref_metrics" if pref else "metrics") / label

    @property
    def selection_file(self) -> Path:
        return self.out / "selection.json"

    @property
    def state_file(self) -> Path:
        return self.out / STATE_FILE

    @property
    def results_file(self) -> Path:
        return self.out / RESULTS_FILE

    @property
    def report_file(self) -> Path:
        return self.out / REPORT_FILE

    @property
    def credit_figure(self) -> Path:
        return self.out / "figures" / "credit.png"

    def selection(self) -> list[dict[str, Any]]:
        """The select stage's rows (one per run: name, levels, role, cell, epoch, path, reward, ...)."""
        if not self.selection_file.is_file():
            raise UserError(f"{self.selection_file} missing; run the select stage first")
        return json.loads(self.selection_file.read_text())["runs"]

    def eval_sets(self, base_model: str) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(label, model spec, selection row) for the base model and each selected checkpoint."""
        out: list[tuple[str, str, dict[str, Any] | None]] = [("base", base_model, None)]
        out += [(set_label(c["name"], c["epoch"]), c["path"], c) for c in self.selection()]
        return out
