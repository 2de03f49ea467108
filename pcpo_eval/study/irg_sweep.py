"""A sweep of Implicit Reward Guidance weights (paper Figs. ``IRG`` and ``multi-IRG``).

IRG mixes fine-tuned checkpoints with their reference at sampling time (Eq. irg-multi-mix,
:mod:`pcpo_eval.generate.irg`): ``eps = eps_ref + sum_i lambda_i (eps_i - eps_ref)``. A sweep
renders the same prompts and seeds at each point of a list of weight vectors and measures every
set, e.g. the aesthetic-BERTScore trade-off along ``lambda_1 + lambda_2 = 1.5`` of Fig. multi-IRG,
or one checkpoint at lambda 0 ... 1.5 (Fig. IRG: < 1 interpolates towards the base model, > 1
extrapolates the learned reward). A sweep spec (YAML, e.g. ``analysis/irg/toy_irg.yaml``)::

    name: toy_irg
    reference: toy                            # eps_ref: the base model (default: the checkpoints' base)
    checkpoints: {aesthetic: RUN/checkpoints/epoch_0024}   # label -> checkpoint (paths: relative to the file)
    lambdas: [[0.0], [0.5], [1.0], [1.5]]      # one weight per checkpoint at each point
    prompts: toy
    seeds: 4
    max_prompts: 16
    steps: 8
    cfg: 5.0
    eta: 1.0
    metrics: [toy_aesthetic_score, fd_toy]    # FD-like metrics use the reference model's set

:func:`run_sweep` renders ``OUT/sets/reference`` (only when a metric needs a reference) and
``OUT/sets/point_NN`` for each point (resumable: :func:`~pcpo_eval.generate.runner.generate_set`),
measures each into ``OUT/metrics/point_NN`` (kept while it is the same request: same metrics, same
manifests; :func:`~pcpo_eval.metrics.workers.outputs_current`), and writes ``OUT/sweep.parquet``
(one row per point: the weights and every metric), ``OUT/sweep.json`` (the spec and the rows) and ``OUT/tradeoff.png``.
"""

from __future__ import annotations

import dataclasses
import json
from collections.abc import Callable
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.io import (
    atomic_save_figure,
    atomic_write_json,
    atomic_write_parquet,
    check_finite,
    read_yaml_mapping,
)
from pcpo_eval.metricsdir import metrics_path

# The sweep folder (one home for its file names: only the ``irg-sweep`` command writes and reads it).
#: one row per point: the weights and every metric
TABLE_FILE = "sweep.parquet"
#: the sweep's settings and the same rows
SWEEP_FILE = "sweep.json"
#: the trade-off plot
FIGURE_FILE = "tradeoff.png"


#: What a sweep folder holds: its files, and its image sets and metrics (one folder per point)
SWEEP_ENTRIES = (TABLE_FILE, SWEEP_FILE, FIGURE_FILE, "sets", "metrics")


def _check_sweep_folder(out: Path) -> None:
    """UserError when ``out`` holds anything but a sweep's own entries (not among a run's or a study's files)."""
    from pcpo_eval.io import check_own_folder

    check_own_folder(out, SWEEP_ENTRIES, "an IRG sweep's")


def table_path(out: str | Path) -> Path:
    """``OUT/sweep.parquet``."""
    return Path(out) / TABLE_FILE


def sweep_json_path(out: str | Path) -> Path:
    """``OUT/sweep.json``."""
    return Path(out) / SWEEP_FILE


def figure_path(out: str | Path) -> Path:
    """``OUT/tradeoff.png``."""
    return Path(out) / FIGURE_FILE


@dataclass(frozen=True)
class IRGSweepSpec:
    """A validated IRG sweep (see the module docstring)."""

    name: str
    checkpoints: dict[str, str]
    lambdas: tuple[tuple[float, ...], ...]
    metrics: tuple[str, ...]
    reference: str | None = None
    prompts: str = "toy"
    seeds: int | str = 4
    max_prompts: int | None = None
    steps: int = 50
    cfg: float = 5.0
    eta: float = 1.0
    batch_size: int = 16
    device: str = "cpu"

    def model_spec(self, weights: tuple[float, ...]) -> str:
        """The ``irg:`` model spec of one point."""
        parts = ",".join(f"{path}={w:g}" for path, w in zip(self.checkpoints.values(), weights, strict=True))
        return f"irg:{parts}" + (f"@{self.reference}" if self.reference else "")

    def point_label(self, weights: tuple[float, ...]) -> str:
        return ", ".join(f"{k}={w:g}" for k, w in zip(self.checkpoints, weights, strict=True))


_KEYS = {f.name for f in dataclasses.fields(IRGSweepSpec)} - {"device"}


def _resolve(base: Path, spec: str) -> str:
    """A checkpoint given as a path relative to the sweep file -> that path; other specs unchanged."""
    p = base / spec
    return str(p.resolve()) if not Path(spec).is_absolute() and p.exists() else spec


def _problems(d: dict[str, Any]) -> list[str]:
    from pcpo_eval.generate.irg import lambda_problem
    from pcpo_eval.generate.plan import check_sampling_options, parse_seeds
    from pcpo_eval.metrics.base import METRICS

    problems = [f"unknown key {k!r} (keys: {', '.join(sorted(_KEYS))})" for k in d if k not in _KEYS]
    for key in ("name", "checkpoints", "lambdas", "metrics"):
        if key not in d:
            problems.append(f"missing key {key!r}")
    cks = d.get("checkpoints")
    if cks is not None and (not isinstance(cks, dict) or not cks or not all(isinstance(v, str) for v in cks.values())):
        problems.append("checkpoints: give a mapping label -> checkpoint (RUN/checkpoints/epoch_NNNN or a model spec)")
    lams = d.get("lambdas")
    n = len(cks) if isinstance(cks, dict) else None
    if lams is not None and (not isinstance(lams, list) or not lams or not all(
            isinstance(row, list) and len(row) == n and all(isinstance(x, int | float) and not isinstance(x, bool)
                                                           for x in row) for row in lams)):
        problems.append(f"lambdas: give a list of weight lists, each with one number per checkpoint ({n})")
    elif lams is not None and (bad := [x for row in lams for x in row if lambda_problem(x)]):
        problems.append(f"lambdas: weight {bad[0]!r}: {lambda_problem(bad[0])}")
    mets = d.get("metrics")
    if mets is not None and (not isinstance(mets, list) or not mets or any(m not in METRICS for m in mets)):
        problems.append(f"metrics: give a list of known metrics ({', '.join(METRICS)})")
    for key in ("steps", "batch_size"):
        if key in d and not (isinstance(d[key], int) and not isinstance(d[key], bool) and d[key] >= 1):
            problems.append(f"{key} {d[key]!r}: use a whole number >= 1")
    try:  # generate's own checks (a bad value failed at the first point's render, or rendered nonsense)
        check_sampling_options(cfg=d.get("cfg"), eta=d.get("eta"), max_prompts=d.get("max_prompts"), section="")
        seeds = d.get("seeds", 4)
        parse_seeds(str(seeds) if isinstance(seeds, bool) else seeds)
    except UserError as exc:
        problems.append(str(exc))
    return problems


def load_sweep(path: str | Path) -> IRGSweepSpec:
    """Read and validate a sweep file (every problem in one error line)."""
    path = Path(path)
    d = read_yaml_mapping(path, "IRG sweep file", "give a YAML file such as analysis/irg/toy_irg.yaml")
    check_finite(d, f"IRG sweep file {path}")
    problems = _problems(d)
    if problems:
        raise UserError(f"IRG sweep file {path} has {len(problems)} problem(s): " + "; ".join(problems))
    d = dict(d)
    d["checkpoints"] = {str(k): _resolve(path.parent, v) for k, v in d["checkpoints"].items()}
    if isinstance(d.get("prompts"), str):  # a prompt file next to the sweep file (e.g. irg_prompts.txt)
        d["prompts"] = _resolve(path.parent, d["prompts"])
    d["lambdas"] = tuple(tuple(float(x) for x in row) for row in d["lambdas"])
    d["metrics"] = tuple(d["metrics"])
    return IRGSweepSpec(**d)


def _check_checkpoints(spec: IRGSweepSpec) -> None:
    """Every ``checkpoints:`` entry that names a path exists (a model spec such as ``toy`` or ``sd1:DIR`` is
    checked when loaded): a typo was found only after the reference set had rendered."""
    from pcpo_eval.models.registry import REGISTRY

    for label, ck in spec.checkpoints.items():
        if ck.partition(":")[0] not in REGISTRY and not Path(ck).exists():
            raise UserError(f"checkpoints.{label}: {ck} does not exist; give a run's checkpoint folder "
                            "(RUN/checkpoints/epoch_NNNN) or a model spec, relative to the sweep file")


def _render(spec: IRGSweepSpec, model: str, out: Path) -> None:
    from pcpo_eval.generate.runner import generate_set

    generate_set(model, spec.prompts, spec.seeds, out, batch_size=spec.batch_size, steps=spec.steps, cfg=spec.cfg,
                 eta=spec.eta, device=spec.device, max_prompts=spec.max_prompts, progress=False)


def _measure(spec: IRGSweepSpec, images: Path, out: Path, reference: Path | None) -> dict[str, float]:
    from pcpo_eval.metrics.extract import MetricsOptions
    from pcpo_eval.metrics.workers import outputs_current, run_metrics

    options = MetricsOptions(batch_size=spec.batch_size, device=spec.device)
    if not outputs_current(out, images, list(spec.metrics), reference, options):  # e.g. seeds changed since
        run_metrics(images, list(spec.metrics), out, reference=reference, options=options)
    return {m: float(v) for m, v in json.loads(metrics_path(out).read_text())["metrics"].items()}


def run_sweep(spec: IRGSweepSpec, out: str | Path, log: Callable[[str], None] = print) -> pd.DataFrame:
    """1. the reference set (if a metric needs one), 2. each point's set and metrics, 3. table, JSON, plot."""
    from pcpo_eval.io import check_out_path, remove_stale_temps
    from pcpo_eval.metrics.base import METRICS

    out = check_out_path(out)
    _check_sweep_folder(out)
    _check_checkpoints(spec)  # before the reference set renders (hours with real models)
    remove_stale_temps(out)  # temp files of a killed run (not ones a live process holds)
    ref_dir = None
    if any(METRICS[m].needs_reference for m in spec.metrics):  # 1.
        from pcpo_eval.generate.irg import default_irg_reference

        ref_dir = out / "sets" / "reference"
        log(f"[irg] reference set -> {ref_dir}")
        _render(spec, spec.reference or default_irg_reference(next(iter(spec.checkpoints.values()))), ref_dir)
    rows = []
    for i, weights in enumerate(spec.lambdas):  # 2.
        name = f"point_{i:02d}"
        log(f"[irg] {name}: {spec.point_label(weights)}")
        _render(spec, spec.model_spec(weights), out / "sets" / name)
        values = _measure(spec, out / "sets" / name, out / "metrics" / name, ref_dir)
        rows.append({"point": i, **{f"lambda_{k}": w for k, w in zip(spec.checkpoints, weights, strict=True)},
                     "lambda_sum": sum(weights), **values})
    table = pd.DataFrame(rows)  # 3.
    atomic_write_parquet(table_path(out), table)
    atomic_write_json(sweep_json_path(out), {"spec": dataclasses.asdict(spec), "rows": rows})
    atomic_save_figure(figure_path(out), tradeoff_figure(spec, table), dpi=110)
    return table


def tradeoff_figure(spec: IRGSweepSpec, table: pd.DataFrame) -> Any:
    """Two metrics: one against the other along the sweep (Fig. multi-IRG a); else each metric
    against the total weight (Fig. IRG)."""
    import matplotlib

    matplotlib.use("Agg")
    import matplotlib.pyplot as plt

    from pcpo_eval.metrics.base import METRIC_LABELS

    fig, ax = plt.subplots(figsize=(5.2, 4.0))
    if len(spec.metrics) == 2:
        x, y = spec.metrics
        ax.plot(table[x], table[y], "o-")
        for _, r in table.iterrows():
            ax.annotate(spec.point_label(spec.lambdas[int(r["point"])]), (r[x], r[y]), fontsize=7)
        ax.set_xlabel(METRIC_LABELS.get(x, x))
        ax.set_ylabel(METRIC_LABELS.get(y, y))
    else:
        for m in spec.metrics:
            ax.plot(table["lambda_sum"], table[m], "o-", label=METRIC_LABELS.get(m, m))
        ax.set_xlabel("sum of IRG weights (1 = the fine-tuned model, 0 = the reference)")
        ax.legend()
    ax.set_title(f"IRG sweep: {spec.name}")
    fig.tight_layout()
    return fig
