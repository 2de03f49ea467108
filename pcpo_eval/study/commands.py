"""CLI commands ``study``, ``report``, ``irg-sweep`` and ``demo`` (thin shell over :mod:`pcpo_eval.study`)."""

from __future__ import annotations

import time
from pathlib import Path

import typer

from pcpo_eval.errors import UserError
from pcpo_eval.progress import PROGRESS_HELP
from pcpo_eval.report.summary import summary_lines
from pcpo_eval.studydir import results_path

DEMO_SPEC = Path("analysis") / "toy_study.yaml"
DEMO_OUT = Path("reports") / "demo"


def find_demo_spec() -> Path:
    """``analysis/toy_study.yaml`` in the working directory, else in the source checkout."""
    for root in (Path.cwd(), Path(__file__).resolve().parents[2]):
        if (root / DEMO_SPEC).is_file():
            return root / DEMO_SPEC
    raise UserError(f"{DEMO_SPEC} not found; run `pcpo-eval demo` from the pcpo-eval checkout")


def report(study_dir: Path, output: Path | None, figures_only: bool, figures_dir: Path | None) -> None:
    """``pcpo-eval report``: the HTML report and the figure files, or (``--figures-only``) the files only."""
    from pcpo_eval.imageset import enclosing_set
    from pcpo_eval.io import check_out_path
    from pcpo_eval.report.html import write_figures, write_report
    from pcpo_eval.studydir import study_data_paths

    if figures_only and output is not None:
        raise UserError("--figures-only writes no HTML; drop --output (or drop --figures-only)")
    data = study_data_paths(study_dir)
    if output is not None:  # both outputs checked before the first figure is written
        check_out_path(output, "--output", folder=False, inputs=data)
    if figures_dir is not None:
        check_out_path(figures_dir, "--figures-dir", inputs=data)
        if (inside := enclosing_set(figures_dir)) is not None:
            raise UserError(f"--figures-dir {figures_dir} lies inside the image set {inside}; choose a folder outside "
                            "it (a set's folder holds its images and records only)")
    if figures_only or figures_dir is not None:
        paths = write_figures(study_dir, figures_dir)
        typer.echo(f"wrote {len(paths)} figure files ({_formats_said()}) to "
                   f"{figures_dir if figures_dir is not None else study_dir / 'figures'}")
        if not figures_only:
            typer.echo(f"wrote {write_report(study_dir, output, figures=False)}")
        return
    typer.echo(f"wrote {write_report(study_dir, output)}")
    typer.echo(f"wrote the figures ({_formats_said()}) to {study_dir / 'figures'}")


def _formats_said() -> str:
    """The figure formats written, as the console says them: 'SVG, PDF, PNG', or the subset the environment
    asks for, saying that files of the other formats were left as they were (before: always 'SVG, PDF, PNG')."""
    from pcpo_eval.figfiles import FORMATS, FORMATS_ENV, figure_formats

    chosen = figure_formats()
    said = ", ".join(f.upper() for f in chosen)
    return said if chosen == FORMATS else f"{said} only, as ${FORMATS_ENV} asks; other formats' files not updated"


def study_cmd(
    spec: Path = typer.Argument(..., help="study spec (YAML), e.g. analysis/toy_study.yaml"),
    out: Path | None = typer.Option(None, "--out", help="study directory (default: studies/<name>, the spec's name)"),
    stages: str = typer.Option("all", "--stages", help="comma-separated subset of train,select,generate,metrics,stats,report"),
    plan: bool = typer.Option(False, "--plan", help="print the seeds per arm, compute and disk the study needs; train nothing"),
    pilot: Path | None = typer.Option(None, "--pilot", help="with --plan: a finished pilot study folder (its runs give the spread)"),
    cv: float | None = typer.Option(None, "--cv", help="with --plan and no pilot: run-to-run SD / mean of a per-run quantity"),
    effect: float = typer.Option(0.25, "--effect", help="with --plan: the relative effect to detect (0.25 = 25%)"),
    progress: bool | None = typer.Option(None, "--progress/--no-progress", help=PROGRESS_HELP),
) -> None:
    """Train -> select -> generate -> metrics -> stats -> report; re-running continues after a crash."""
    from pcpo_eval.study.runner import run_study
    from pcpo_eval.study.spec import STAGES, load_spec

    if plan:
        from pcpo_eval.study.plan import plan_text

        typer.echo(plan_text(load_spec(spec, check_weights=False), pilot, cv, effect))
        return
    if pilot is not None or cv is not None:
        raise UserError("--pilot and --cv go with --plan (pcpo-eval study SPEC --plan --pilot DIR)")

    chosen = STAGES if stages == "all" else tuple(s.strip() for s in stages.split(",") if s.strip())
    if not chosen:
        raise UserError(f"--stages {stages!r} names no stage; give some of {','.join(STAGES)} (or all)")
    path = run_study(spec, out, chosen, log=lambda s: typer.echo(s), progress=progress)
    typer.echo(f"study done: {path}")
    results = results_path(path.parent if path.suffix == ".html" else path)
    if "stats" in chosen and results.is_file():
        for line in summary_lines(results.parent):
            typer.echo(line)


def report_cmd(
    study_dir: Path = typer.Argument(..., help="study directory (holds results.json)"),
    output: Path | None = typer.Option(None, "--output", "-o", help="HTML file [STUDY_DIR/report.html]"),
    figures_only: bool = typer.Option(False, "--figures-only",
                                      help="write only the figure files (SVG, PDF, 300-dpi PNG), no HTML"),
    figures_dir: Path | None = typer.Option(None, "--figures-dir", help="folder of the figure files [STUDY_DIR/figures]"),
) -> None:
    """Write the self-contained HTML report of a finished study and its figures as SVG, PDF and PNG."""
    report(study_dir, output, figures_only, figures_dir)


def irg_sweep_cmd(
    spec: Path = typer.Argument(..., help="IRG sweep file (YAML), e.g. analysis/irg/toy_irg.yaml"),
    out: Path = typer.Option(..., "--out", help="sweep folder (sets, metrics, sweep.parquet, tradeoff.png)"),
    device: str = typer.Option("auto", "--device", help="auto, cpu or cuda:N"),
) -> None:
    """Implicit Reward Guidance at each weight vector of a sweep: render, measure, trade-off plot."""
    import dataclasses

    from pcpo_eval.dist import resolve_device
    from pcpo_eval.study.irg_sweep import figure_path, load_sweep, run_sweep, table_path

    sweep = dataclasses.replace(load_sweep(spec), device=resolve_device(device))
    table = run_sweep(sweep, out, log=lambda s: typer.echo(s))
    typer.echo(table.to_string(index=False))
    typer.echo(f"wrote {table_path(out)}, {figure_path(out)}")


def demo_cmd(
    out: Path = typer.Option(DEMO_OUT, "--out", help="study directory"),
) -> None:
    """The main job on the embedded toy world: analysis/toy_study.yaml end to end, then the report."""
    import torch

    from pcpo_eval.study.runner import run_study

    # One thread: the toy tensors are tiny, and on a shared 2-core machine two OpenMP threads
    # were measured 30x slower than one (spin-waiting under load).
    torch.set_num_threads(1)
    t0 = time.perf_counter()
    path = run_study(find_demo_spec(), out, log=lambda s: typer.echo(s))
    typer.echo(f"\nreport: {path.resolve()}")
    for line in summary_lines(out):
        typer.echo(line)
    typer.echo(f"demo finished in {time.perf_counter() - t0:.0f} s")


def register(app: typer.Typer) -> None:
    """Add ``study``, ``report``, ``irg-sweep`` and ``demo`` to the ``pcpo-eval`` app."""
    app.command("study")(study_cmd)
    app.command("report")(report_cmd)
    app.command("irg-sweep")(irg_sweep_cmd)
    app.command("demo")(demo_cmd)
