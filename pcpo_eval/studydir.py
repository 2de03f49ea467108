"""Where a study keeps its files (paths only): one home for the ``OUT/`` layout.

::

    OUT/runs/<cell>__seed-<s>/       trained runs (log.parquet, checkpoints/); existing runs stay where they are
    OUT/logs/train/<run>.log         console output of a run trained in a worker process (``parallel: N``)
    OUT/selection.json               per run: reward-matched checkpoint (or "not reached") and matched-epoch checkpoint
    OUT/sets/base, sets/<run>/epoch_NNNN           eval image sets    (pref_sets/... on preference prompts)
    OUT/metrics/base, metrics/<run>/epoch_NNNN     their metrics      (pref_metrics/...)
    OUT/pref_sets/<name>/..., pref_metrics/<name>/...   one folder per named preference set (a list)
    OUT/grid_sets/<grid>/base, grid_sets/<grid>/<run>/epoch_NNNN   grids with named prompts / seeds / epochs
    OUT/results.json, report.html, study_state.json, figures/credit.png
    OUT/human.json                   the human study's analysis (written by `pcpo-eval human analyze`)

A checkpoint that is both a run's reward-matched and its matched-epoch checkpoint has one set.
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

    def train_log(self, run: RunSpec) -> Path:
        """Console output of a run trained in a worker process."""
        return self.out / "logs" / "train" / f"{run.name}.log"

    def set_dir(self, label: str, pref: bool = False, name: str = "") -> Path:
        """An image set; ``name``: a named preference set (``pref_sets/<name>/<label>``)."""
        root = self.out / ("pref_sets" if pref else "sets")
        return (root / name if pref and name else root) / label

    def metrics_dir(self, label: str, pref: bool = False, name: str = "") -> Path:
        root = self.out / ("pref_metrics" if pref else "metrics")
        return (root / name if pref and name else root) / label

    def grid_set_dir(self, grid: str, label: str) -> Path:
        """The small image set of one model for a grid rendered on its own prompts / seeds / epochs."""
        return self.out / "grid_sets" / grid / label

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
    def human_file(self) -> Path:
        """The human preference study's analysis, copied here by ``pcpo-eval human analyze``."""
        return self.out / "human.json"

    @property
    def credit_figure(self) -> Path:
        return self.out / "figures" / "credit.png"

    def _selection_json(self) -> dict[str, Any]:
        if not self.selection_file.is_file():
            raise UserError(f"{self.selection_file} missing; run the select stage first")
        return json.loads(self.selection_file.read_text())

    def selection(self) -> list[dict[str, Any]]:
        """Reward-matched rows, one per run (name, levels, role, arm, seed, cell, epoch, path, reward,
        reached); a run that never reached the target has ``epoch`` and ``path`` None."""
        return self._selection_json()["runs"]

    def epoch_selection(self) -> list[dict[str, Any]]:
        """Matched-epoch rows, one per run (the same keys; every run at the same epoch); [] when off."""
        return self._selection_json().get("at_epoch") or []

    def matched(self, match: str) -> list[dict[str, Any]]:
        """The rows of one comparison, ``reward`` or ``epoch``, that have a checkpoint."""
        rows = self.selection() if match == "reward" else self.epoch_selection()
        return [c for c in rows if c.get("path")]

    def eval_sets(self, base_model: str) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(label, model spec, selection row) for the base model and each selected checkpoint, each
        checkpoint once (a run's reward-matched and matched-epoch checkpoints may coincide)."""
        out: list[tuple[str, str, dict[str, Any] | None]] = [("base", base_model, None)]
        seen = {"base"}
        for c in [*self.matched("reward"), *self.matched("epoch")]:
            label = set_label(c["name"], c["epoch"])
            if label not in seen:
                seen.add(label)
                out.append((label, c["path"], c))
        return out
