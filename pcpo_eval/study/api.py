"""The top-level Python API: one thin function per step, re-exported lazily as ``pcpo_eval.<name>``.

``import pcpo_eval`` loads none of this (no torch, no matplotlib); the first use of a name imports
this module, and each function imports only what its step needs. Every function is a thin shell
over the library function named in its docstring, with the command line's defaults; bad input is
a :class:`pcpo_eval.errors.UserError` with the same one-line message the CLI prints.

Names are verbs, so none shadows a subpackage (``pcpo_eval.generate``, ``pcpo_eval.metrics``,
``pcpo_eval.study`` and ``pcpo_eval.report`` are packages):

=====================  ====================================================  ==================
name                   does                                                  CLI
=====================  ====================================================  ==================
``train_run``          train one run from a config (file and/or keys)        ``train``
``render_set``         a seed-controlled image set                           ``generate``
``compute_metrics``    FD / IS / LPIPS / preference scores of an image set   ``metrics``
``fit_lmm``            a linear mixed model with Satterthwaite t-tests       ``lmm``
``speedup``            epochs to reward targets and PCPO's speed-up          ``speedup``
``run_study``          a study spec end to end                               ``study``
``load_results``       a study's ``results.json`` as a dict                  --
``write_report``       the HTML report (and its figure files)                ``report``
``write_figures``      the figure files only (SVG, PDF, 300-dpi PNG)         ``report --figures-only``
``export_run``         a diffusers-loadable folder with a model card         ``export``
=====================  ====================================================  ==================

It lives in :mod:`pcpo_eval.study` because the orchestrator is the one stage that may import
every other (tests/repo/test_import_graph.py). Examples: docs/api.md (executed by tests/repo/test_api_docs.py).
"""

from __future__ import annotations

from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

#: The names ``pcpo_eval`` re-exports (lazily, :func:`pcpo_eval.__getattr__`).
API = ("train_run", "render_set", "compute_metrics", "fit_lmm", "speedup", "run_study", "load_results",
       "write_report", "write_figures", "export_run")


def train_run(out: str | Path, config: str | Path | None = None, *, resume: bool = False, **keys: Any) -> Any:
    """Train a run into ``out``: the YAML ``config`` (default: the built-in defaults) with ``keys``
    on top (``epochs=2, objective="pcpo"``, as ``KEY=VALUE`` on the command line). Returns the
    per-epoch log (a pandas DataFrame). :func:`pcpo_eval.train.trainer.train`."""
    from pcpo_eval.train.config import config_from_dict, read_config_file
    from pcpo_eval.train.trainer import train

    data = read_config_file(config) if config is not None else {}
    return train(config_from_dict({**data, **keys}), out, resume=resume)


def render_set(model: str, prompts: str | Path, seeds: str | int | Sequence[int], out: str | Path,
               **options: Any) -> Any:
    """Render every (prompt, seed) image of ``model`` (``toy``, ``sd1:PATH``, a run folder, a
    checkpoint, ``irg:...``) into the set folder ``out``; ``options`` as
    :func:`pcpo_eval.generate.runner.generate_set` (``steps``, ``cfg``, ``device``, ``max_prompts``,
    ...). Returns its summary (``n_images``, ``manifest_path``, ``settings``)."""
    from pcpo_eval.generate.runner import generate_set

    return generate_set(model, prompts, seeds, out, **{"progress": False, **options})


def compute_metrics(image_set: str | Path, metrics: str | Sequence[str] = "fid,fd_dinov2,is,lpips", *,
                    reference: str | Path | None = None, out: str | Path | None = None, device: str = "cpu",
                    batch_size: int = 32, **options: Any) -> dict[str, Any]:
    """Metrics of an image set, overall and per prompt (``reference``: the set FD compares with; with
    ``out`` also ``metrics.json``, ``per_prompt.parquet``, ``per_image.parquet``). ``options``: the
    other :class:`pcpo_eval.metrics.workers.MetricsOptions` fields. Returns the ``metrics.json``
    content. :func:`pcpo_eval.metrics.workers.run_metrics`."""
    from pcpo_eval.metrics.workers import MetricsOptions, run_metrics

    names = metrics if isinstance(metrics, str) else ",".join(metrics)
    opts = MetricsOptions(batch_size=batch_size, device=device, **options)
    return run_metrics(image_set, names, out, reference, opts)


def fit_lmm(data: Any, formula: str, group: str | Sequence[str], *, coding: str = "treatment",
            reml: bool = True, re_formula: str | None = None) -> Any:
    """A linear mixed model (lme4 / lmerTest conventions) of ``data`` (a DataFrame, or a .csv /
    .parquet file), random intercepts per ``group`` column(s). Returns the fit (``.summary()``,
    ``.fixed``, ``.to_dict()``). :func:`pcpo_eval.stats.lmm.fit_lmm`."""
    from pcpo_eval.stats.lmm import fit_lmm as _fit

    if isinstance(data, str | Path):
        from pcpo_eval.stats.design import read_table

        data = read_table(str(data))
    groups = [group] if isinstance(group, str) else list(group)
    return _fit(data, formula, groups, coding, reml, re_formula)


def speedup(baseline: Sequence[Any], pcpo: Sequence[Any], targets: Sequence[float], *, window: int | None = None,
            higher_is_better: bool = True, paired: bool | None = None, curve: str = "reward",
            unequal_epochs_ok: bool = False) -> Any:
    """Restricted mean epochs to each target and PCPO's speed-up with its 95% CI, from run folders,
    log files or DataFrames (one per seed and arm); ``window`` defaults to the paper's 5 epochs
    (:data:`pcpo_eval.stats.speedup.SMOOTHING_WINDOW`). The runs pass the checks ``pcpo-eval speedup``
    makes (given once, one reward and epoch size) and pair as a study pairs them (``paired=None``: on
    the seeds the run folders record; True: the i-th runs as given; False: never). Returns the table
    (``.to_markdown()``, ``.to_dict()``). :func:`pcpo_eval.stats.given_runs.compare_given_runs`."""
    from pcpo_eval.stats.given_runs import compare_given_runs
    from pcpo_eval.stats.speedup import SMOOTHING_WINDOW

    return compare_given_runs(list(baseline), list(pcpo), list(targets),
                              SMOOTHING_WINDOW if window is None else window, higher_is_better, paired=paired,
                              curve=curve, unequal_epochs_ok=unequal_epochs_ok)


def run_study(spec: str | Path, out: str | Path | None = None, stages: str | Sequence[str] = "all",
              log: Callable[[str], None] = print) -> Path:
    """Run a study spec (train -> select -> generate -> metrics -> stats -> report) into ``out``
    (default ``studies/<name>``); resumable. Returns the report path (or the study folder).
    :func:`pcpo_eval.study.runner.run_study`."""
    from pcpo_eval.study.runner import run_study as _run
    from pcpo_eval.study.spec import STAGES

    chosen = STAGES if stages == "all" else tuple(s.strip() for s in stages.split(",")) if isinstance(stages, str) \
        else tuple(stages)
    return _run(spec, out, chosen, log=log)


def load_results(study_dir: str | Path) -> dict[str, Any]:
    """A finished study's ``results.json`` (verdict, runs, speed-ups, LMMs, ...) as a dict."""
    from pcpo_eval.report.html import read_results

    return read_results(study_dir)


def write_report(study_dir: str | Path, out_file: str | Path | None = None, figures: bool = True) -> Path:
    """The self-contained HTML report (default ``STUDY/report.html``) and, with ``figures``, every
    figure as ``STUDY/figures/<name>.svg|pdf|png``. :func:`pcpo_eval.report.html.write_report`."""
    from pcpo_eval.report.html import write_report as _write

    return _write(study_dir, out_file, figures)


def write_figures(study_dir: str | Path, out_dir: str | Path | None = None) -> list[Path]:
    """Only the report's figures (SVG, PDF, 300-dpi PNG; default ``STUDY/figures``); returns the files.
    :func:`pcpo_eval.report.html.write_figures`."""
    from pcpo_eval.report.html import write_figures as _write

    return _write(study_dir, out_dir)


def export_run(run: str | Path, out: str | Path) -> Path:
    """``RUN[@EPOCH]`` as a diffusers-loadable folder with a model card (never overwrites a non-empty
    ``out``). :func:`pcpo_eval.train.export.export_run`."""
    from pcpo_eval.train.export import export_run as _export

    return _export(str(run), out)
