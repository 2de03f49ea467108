"""``pcpo-eval lmm | speedup | select``: thin CLI shells over :mod:`pcpo_eval.stats`.

All numbers come from the library functions; these commands only read inputs, call them and print
text or JSON (``--json``). Bad input raises :class:`~pcpo_eval.errors.UserError` (exit code 2).
"""

from __future__ import annotations

import json
from collections.abc import Sequence
from pathlib import Path
from typing import Any

import typer

from pcpo_eval.errors import UserError
from pcpo_eval.io import check_out_path, to_jsonable


def dumps(obj: Any) -> str:
    """Indented strict JSON of a result's ``to_dict()``."""
    return json.dumps(to_jsonable(obj), indent=2, allow_nan=False)


def _check_outputs(inputs: Sequence[str | Path], **files: str | None) -> None:
    """Refuse unwritable output files (``--output``, ``--qq``), and any that would overwrite an input (a
    run's log, the data table), before anything is fitted or written."""
    for flag, path in files.items():
        if path:
            check_out_path(path, f"--{flag}", folder=False, inputs=inputs)


def _write(out: str | None, text: str) -> None:
    if out:
        from pcpo_eval.io import atomic_write_text

        atomic_write_text(out, text if text.endswith("\n") else text + "\n")


def lmm_cmd(
    data: str = typer.Argument(..., help="Scores table: DATA.csv or DATA.parquet."),
    formula: str = typer.Option(..., "--formula", help='Fixed effects, e.g. "fid ~ algorithm * batch".'),
    group: list[str] = typer.Option(
        ..., "--group", help="Grouping column; repeat for crossed random intercepts."
    ),
    coding: str = typer.Option(
        "treatment", "--coding", help="treatment | sum (for bare categorical columns)."
    ),
    re_formula: str = typer.Option(
        None, "--re-formula", help='Random slopes for one group, e.g. "~days".'
    ),
    response: list[str] = typer.Option(
        None,
        "--response",
        help="Fit several metrics: replaces the formula's response; adds Holm/BH p-values.",
    ),
    ml: bool = typer.Option(False, "--ml", help="Fit by maximum likelihood instead of REML."),
    qq: str = typer.Option(
        None, "--qq", help="Write a Q-Q plot of the residuals to this PNG (one response)."
    ),
    output: str = typer.Option(None, "--output", "-o", help="Also write the JSON result to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of text."),
) -> None:
    """Linear mixed model with Satterthwaite t-tests (lme4/lmerTest conventions)."""
    from pcpo_eval.stats.boundary import run_means_warning
    from pcpo_eval.stats.design import (
        check_factor_levels,
        per_prompt_metric_warnings,
        read_table,
        replication_warnings,
    )
    from pcpo_eval.stats.lmm import fit_lmm, fit_lmm_many, many_summary, qq_plot

    _check_outputs([data], output=output, qq=qq)
    if output and qq and Path(output).resolve() == Path(qq).resolve():
        raise UserError(f"--output and --qq are one file ({output}); give the JSON and the Q-Q plot different names")
    if qq and Path(qq).suffix.lower() != ".png":
        raise UserError(f"--qq {qq}: the Q-Q plot is written as PNG; give a file name ending in .png")
    if "|" in formula:  # lme4's (1|g) is a study spec's syntax; here the groups are options
        raise UserError(f"--formula {formula!r} holds a random-effect term: give only the fixed effects "
                        "(e.g. \"value ~ algorithm\") and each grouping with --group (e.g. --group prompt "
                        "--group run); random slopes with --re-formula")
    df = read_table(data)
    check_factor_levels(df, f"{response[0]} ~ {formula.split('~', 1)[1]}" if response and "~" in formula else formula)
    if response:
        if "~" not in formula:
            raise UserError(f"formula {formula!r} has no '~'")
        rhs = formula.split("~", 1)[1]
        fits, adjusted = fit_lmm_many(df, response, rhs, list(group), coding, not ml, re_formula)
        payload = {"metrics": {k: v.to_dict() for k, v in fits.items()}, "adjusted": adjusted}
        formulas = {k: f"{k} ~ {rhs}" for k in fits}
        if qq:
            raise UserError("--qq needs a single response (drop --response or fit one metric)")
        text = many_summary(fits, adjusted)
    else:
        res = fit_lmm(df, formula, list(group), coding, not ml, re_formula)
        payload = res.to_dict()
        fits, formulas = {"": res}, {"": formula}
        text = res.summary()
        if qq:
            qq_plot(res, qq)
    warnings = replication_warnings(df, f"{response[0]} ~ {formula.split('~', 1)[1]}" if response else formula,
                                    list(group), slopes=re_formula is not None)
    warnings += per_prompt_metric_warnings(df, list(response) if response else [formula.split("~", 1)[0].strip()])
    run_means = {}
    if re_formula is None:  # random intercepts only: where a study would test on the run means, say so
        for k, fit in fits.items():
            warning, tests = run_means_warning(fit, df, formulas[k], list(group), coding)
            if warning:
                warnings.append(warning)
                run_means[k] = tests
    payload["warnings"] = warnings
    if run_means:
        payload["run_means"] = run_means.get("", run_means)
    js = dumps(payload)
    _write(output, js)
    typer.echo(js if as_json else "".join(f"warning: {w}\n" for w in warnings) + text)

def speedup_cmd(
    baseline: list[str] = typer.Option(
        ..., "--baseline", help="Baseline log(s) or RUN dir(s); repeat per seed."
    ),
    pcpo: list[str] = typer.Option(..., "--pcpo", help="PCPO log(s) or RUN dir(s); repeat per seed."),
    target: list[float] = typer.Option(..., "--target", help="Target reward level; repeat for several."),
    window: int = typer.Option(5, "--window", help="Trailing moving-average window (epochs)."),
    lower_is_better: bool = typer.Option(
        False, "--lower-is-better", help="Targets are reached from above."
    ),
    paired: bool = typer.Option(
        None, "--paired/--unpaired", help="Pair the i-th --baseline with the i-th --pcpo run (paired t test), or "
        "never pair. Default: as a study pairs, on the training seeds the run folders record."),
    curve: str = typer.Option(
        "reward", "--curve", help="reward (raw reward_mean) or gain (reward - paired untrained control: learning)."
    ),
    output: str = typer.Option(None, "--output", "-o", help="Also write the JSON result to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a markdown table."),
    unequal_epochs_ok: bool = typer.Option(
        False, "--unequal-epochs-ok", help="Compare runs whose epochs differ in images sampled or optimizer steps "
        "(per epoch; the output says so)."),
) -> None:
    """Epochs to reach each target and PCPO's speed-up (E_base / E_pcpo - 1) with a 95% CI, p and power."""
    from pcpo_eval.stats.given_runs import compare_given_runs

    _check_outputs([*baseline, *pcpo], output=output)
    tab = compare_given_runs(baseline, pcpo, target, window, not lower_is_better, paired=paired, curve=curve,
                             unequal_epochs_ok=unequal_epochs_ok)
    js = dumps(tab.to_dict())
    _write(output, js)
    typer.echo(js if as_json else tab.to_markdown())

def select_cmd(
    run_dirs: list[str] = typer.Argument(
        ..., help="Run directories (RUN/log.parquet, RUN/checkpoints/)."
    ),
    target: float = typer.Option(..., "--target", help="Target (smoothed) reward."),
    window: int = typer.Option(5, "--window", help="Trailing moving-average window (epochs)."),
    matched_to: str = typer.Option(
        None,
        "--matched-to",
        help="PCPO run: also bracket each run's checkpoints around the PCPO run's matched reward.",
    ),
    on: str = typer.Option(
        "train", "--on", help="Match on the training reward (train), the held-out validation reward (eval) or the gain over the paired untrained control (gain)."
    ),
    output: str = typer.Option(None, "--output", "-o", help="Also write the JSON result to this file."),
    as_json: bool = typer.Option(False, "--json", help="Print JSON instead of a markdown table."),
) -> None:
    """Reward-matched checkpoint per run (first to reach the target, else nearest), with the gap."""
    from pcpo_eval.stats.given_runs import check_targets, comparability_notes
    from pcpo_eval.stats.select import select_checkpoints

    _check_outputs([*run_dirs, *([matched_to] if matched_to else [])], output=output)
    check_targets([target])
    seen: dict[Path, str] = {}
    for run in run_dirs:  # one run twice printed two rows for it (a review); speedup refuses it as well
        if (key := Path(run).resolve()) in seen:
            raise UserError(f"run {run} is given twice (as {seen[key]} before); give each run once")
        seen[key] = run
    if matched_to:  # matched on one reward scale: the PCPO run's reward level is the other runs' target
        comparability_notes(run_dirs, [matched_to], epochs=False, label="the runs and --matched-to")
    sel = select_checkpoints(run_dirs, target, window, matched_to, on)
    js = dumps(sel.to_dict())
    _write(output, js)
    typer.echo(js if as_json else sel.to_markdown())


def register(app: typer.Typer) -> None:
    """Add ``lmm``, ``speedup`` and ``select`` to the CLI."""
    app.command("lmm")(lmm_cmd)
    app.command("speedup")(speedup_cmd)
    app.command("select")(select_cmd)
