"""The study-directory contract: one home for the ``OUT/`` layout of a study.

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

Written by :mod:`pcpo_eval.study` (and ``OUT/human.json`` + the ``human`` section of
``results.json`` by :mod:`pcpo_eval.human`, through :func:`write_results`); read by ``report``,
``human`` (:class:`StudyView`), ``train export`` (a study near a run) and ``study plan`` (a pilot).
It sits on the ground floor so every stage reads the study folder through it; no stage spells
these names itself (``tests/repo/test_file_names.py``).
"""

from __future__ import annotations

import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any, Protocol

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_json
from pcpo_eval.rundir import epoch_name

STATE_FILE = "study_state.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"
#: the resolved spec (every default filled in, the eval sampler settings): what readers of a study use
SPEC_FILE = "spec.resolved.json"
#: the spec as given
SPEC_COPY_FILE = "study.yaml"
SELECTION_FILE = "selection.json"
HUMAN_FILE = "human.json"
#: one line per computed verdict: its runs, analysis settings and headline (``pcpo_eval.study.history``)
ANALYSES_FILE = "analyses.jsonl"
RUNS_DIR = "runs"


class _Run(Protocol):
    """What the layout needs of a run (:class:`pcpo_eval.study.spec.RunSpec`)."""

    name: str
    run_dir: str | None


def set_label(run_name: str, epoch: int) -> str:
    """Label of a selected checkpoint's image set and metrics: ``<run>/epoch_NNNN``."""
    return f"{run_name}/{epoch_name(epoch)}"


def results_path(study_dir: str | Path) -> Path:
    """``STUDY/results.json``."""
    return Path(study_dir) / RESULTS_FILE


def study_data_paths(study_dir: str | Path) -> list[Path]:
    """What a study folder holds that its outputs (the report, figures) must never overwrite: the spec,
    its state, selection, results and human sections, and the folders of runs, sets, metrics and logs
    (:func:`pcpo_eval.io.check_not_an_input`)."""
    d = Path(study_dir)
    return [d / name for name in (RESULTS_FILE, SPEC_FILE, SPEC_COPY_FILE, SELECTION_FILE, HUMAN_FILE, STATE_FILE,
                                  RUNS_DIR, "sets", "metrics", "pref_sets", "pref_metrics", "grid_sets", "logs")]


def write_results(study_dir: str | Path, results: dict[str, Any]) -> Path:
    """The one writer of ``STUDY/results.json`` (the study's stats stage; ``human analyze`` adds its
    section); atomic."""
    path = results_path(study_dir)
    atomic_write_json(path, results)
    return path


@dataclass(frozen=True)
class StudyLayout:
    """The paths of one study directory ``out``; reads nothing but ``selection.json``."""

    out: Path

    def run_dir(self, run: _Run) -> Path:
        """An existing run's own directory, else ``OUT/runs/<run>``."""
        return self.named_run_dir(run.name, run.run_dir)

    def named_run_dir(self, name: str, run_dir: str | None = None) -> Path:
        """``run_dir`` (an existing run's own directory) if given, else ``OUT/runs/<name>``."""
        return Path(run_dir) if run_dir else self.runs_root / name

    @property
    def runs_root(self) -> Path:
        """``OUT/runs``: the runs the study trained."""
        return self.out / RUNS_DIR

    def train_log(self, run: _Run) -> Path:
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
        return self.out / SELECTION_FILE

    @property
    def spec_file(self) -> Path:
        """``OUT/spec.resolved.json``."""
        return self.out / SPEC_FILE

    @property
    def spec_copy_file(self) -> Path:
        """``OUT/study.yaml``: the spec as given."""
        return self.out / SPEC_COPY_FILE

    @property
    def state_file(self) -> Path:
        return self.out / STATE_FILE

    @property
    def results_file(self) -> Path:
        return results_path(self.out)

    @property
    def report_file(self) -> Path:
        return self.out / REPORT_FILE

    @property
    def analyses_file(self) -> Path:
        """Every verdict computed for this study (:data:`ANALYSES_FILE`)."""
        return self.out / ANALYSES_FILE

    @property
    def human_file(self) -> Path:
        """The human preference study's analysis, copied here by ``pcpo-eval human analyze``."""
        return self.out / HUMAN_FILE

    @property
    def credit_figure(self) -> Path:
        return self.out / "figures" / "credit.png"

    def _selection_json(self) -> dict[str, Any]:
        if not self.selection_file.is_file():
            raise UserError(f"{self.selection_file} missing; run the select stage first")
        return with_checkpoint_paths(json.loads(self.selection_file.read_text()), self.out)

    def write_selection(self, selection: dict[str, Any]) -> None:
        """Write ``selection.json`` with each checkpoint path relative to the study folder (a path inside it):
        the paths were relative to the folder the study ran from, so the study worked from there only (run
        from another folder, its sets read as "rendered from other inputs" and `human design` found no model)."""
        root = self.out.resolve()

        def rel(p: str | None) -> str | None:
            if not p:
                return p
            try:
                return Path(p).resolve().relative_to(root).as_posix()
            except ValueError:  # a run trained elsewhere (a spec's run_dir): as given
                return p

        atomic_write_json(self.selection_file, _map_paths(selection, rel))

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


def with_checkpoint_paths(selection: dict[str, Any], root: Path) -> dict[str, Any]:
    """``selection.json``'s rows with each relative checkpoint path joined to the study folder ``root``
    (:meth:`StudyLayout.write_selection`). An older file's path is relative to the folder the study ran from
    (``reports/demo/runs/...``): the longest tail of it found under ``root`` is taken, else it stays as it is."""
    def full(p: str | None) -> str | None:
        if not p or Path(p).is_absolute():
            return p
        parts = Path(p).parts
        for i in range(len(parts)):  # an older file's "reports/demo/runs/...": its tail under root
            under = Path(root).joinpath(*parts[i:])
            if under.exists():
                return str(under)
        return p

    return _map_paths(selection, full)


def _map_paths(selection: dict[str, Any], f: Callable[[str | None], str | None]) -> dict[str, Any]:
    """``selection`` with ``f`` applied to the checkpoint path of every row (``runs`` and ``at_epoch``)."""
    out = {**selection}
    for key in ("runs", "at_epoch"):
        if out.get(key):
            out[key] = [{**r, "path": f(r.get("path"))} for r in out[key]]
    return out


@dataclass(frozen=True)
class StudyView:
    """What a reader outside the study stage (the human study) needs from a finished study folder:
    ``spec.resolved.json`` + ``selection.json``, as JSON."""

    root: Path
    spec: dict[str, Any]
    selection: dict[str, Any]

    @classmethod
    def load(cls, root: str | Path) -> StudyView:
        root = Path(root)
        lay = StudyLayout(root)
        files = [lay.spec_file, lay.selection_file]
        for f in files:
            if not f.is_file():
                raise UserError(f"{root} is not a finished study ({f.name} missing); run `pcpo-eval study SPEC "
                                f"--out {root}` first (at least its train and select stages)")
        try:
            spec, sel = (json.loads(f.read_text()) for f in files)
        except json.JSONDecodeError as exc:
            raise UserError(f"{root}: a study file is not valid JSON ({exc.msg}); re-run the study's stages") from None
        return cls(root, spec, with_checkpoint_paths(sel, root))

    def run_dir(self, name: str) -> Path:
        run = next((r for r in self.spec["runs"] if r["name"] == name), None)
        if run is None:
            names = ", ".join(r["name"] for r in self.spec["runs"])
            raise UserError(f"run {name!r} is not in the study {self.root}; choose one of: {names}")
        return StudyLayout(self.root).named_run_dir(name, run.get("run_dir"))

    def arm(self, name: str) -> str:
        run = next(r for r in self.spec["runs"] if r["name"] == name)
        return run["levels"][self.spec["compare_factor"]]


#: ``results.json`` ``runs[].compute_s``: each run's cumulative own compute per epoch
#: (``pcpo_eval.study.verdicts``: the log's ``compute_s``, sampling + training without the paired control).
#: Files written before it was named so hold it as ``wall_time_s``, the name of the log's per-epoch column.
RUN_COMPUTE_KEY = "compute_s"


def upgrade_runs(results: dict[str, Any]) -> dict[str, Any]:
    """``results`` with every ``runs`` entry naming its cumulative compute :data:`RUN_COMPUTE_KEY` (an older
    file's ``wall_time_s``), so readers see one key with one meaning."""
    runs = results.get("runs")
    if isinstance(runs, list):
        results["runs"] = [{**{k: v for k, v in r.items() if k != "wall_time_s"},
                            RUN_COMPUTE_KEY: r.get(RUN_COMPUTE_KEY, r.get("wall_time_s"))}
                           if isinstance(r, dict) and "wall_time_s" in r else r for r in runs]
    return results
