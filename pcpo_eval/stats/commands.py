"""``pcpo-eval lmm | speedup | select``: thin CLI shells over :mod:`pcpo_eval.stats`.

All numbers come from the library functions; these commands only read inputs, call them and print
text or JSON (``--json``). Bad input raises :class:`~pcpo_eval.errors.UserError` (exit code 2).
"""

from __future__ import annotations

import json
import math
from collections.abc import Sequence
from dataclasses import replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

import typer

from pcpo_eval.errors import UserError
from pcpo_eval.io import check_out_path, to_jsonable

if TYPE_CHECKING:
    import pandas as pd


def dumps(obj: Any) -> str:
    """Indented strict JSON of a result's ``to_dict()``."""
    return json.dumps(to_jsonable(obj), indent=2, allow_nan=False)


def _check_outputs(inputs: Sequence[str | Path], **files: str | None) -> None:
    """Refuse unwritable output files (``--output``, ``--qq``), and any that would overwrite an input (a
    run's log, the data table), before anything is fitted or written."""
    for flag, path in files.items():
        if path:
            check_out_path(path, f"--{flag}", folder=False, inputs=inputs)


def _check_targets(targets: list[float]) -> None:
    """``--target`` must be a finite reward level (nan / inf would give a table of nothing reached)."""
    bad = [t for t in targets if not math.isfinite(t)]
    if bad:
        raise UserError(f"--target {bad[0]} is not a finite number; give a reward level, e.g. --target 0.8")


def _check_pairs(baseline: list[str], pcpo: list[str]) -> None:
    """``--paired`` pairs the i-th baseline with the i-th PCPO run: refuse a pair whose run folders'
    ``config.yaml`` record other training seeds (the pair would be two seeds' noise, not one seed's). Logs
    without a recorded seed are paired as given."""

    from pcpo_eval.rundir import config_path
    from pcpo_eval.train.checkpoints import load_run_config

    def seed(log: str) -> object:
        if not config_path(log).is_file():  # a log file, or a run folder without config.yaml
            return None
        try:
            return load_run_config(log).get("seed")
        except UserError:  # unreadable: paired as given (the log itself is read and checked elsewhere)
            return None

    for i, (b, t) in enumerate(zip(baseline, pcpo, strict=True), start=1):
        sb, st = seed(b), seed(t)
        if sb is not None and st is not None and sb != st:
            raise UserError(f"--paired pair {i}: --baseline {b} has seed {sb}, --pcpo {t} seed {st}; give both "
                            "arms' runs in the same seed order")



def _check_distinct_runs(baseline: list[str], pcpo: list[str], logs: dict[str, pd.DataFrame]) -> None:
    """Every log given once: one run folder (or log) given twice, or two whose curves are one run's
    (:func:`pcpo_eval.rundir.same_curves`: copied, imported twice, or cut at another epoch), would count one
    seed as several. Before, ``--pcpo R`` five times gave an A/A pair of arms a "+58% speed-up, Holm p 0.031".
    ``logs``: each given log, read once (:func:`_read_logs`)."""
    from pcpo_eval.rundir import twin_runs

    paths: dict[str, str] = {}
    given: dict[str, str] = {}
    for flag, log in [*(("--baseline", b) for b in baseline), *(("--pcpo", t) for t in pcpo)]:
        name, path = f"{flag} {log}", str(Path(log).resolve())
        if path in paths:
            raise UserError(f"{name} is the run of {paths[path]} again: one run would count as two seeds; give "
                            "each seed's own run once")
        paths[path], given[path] = name, log
    twins = twin_runs([(name, logs[given[path]]) for path, name in paths.items()])
    if twins:
        raise UserError(f"{twins[0][1]} has the same curves as {twins[0][0]} (every shared epoch's reward and control): "
                        "one run copied or imported twice would count as two seeds; give each seed's own run once")


def _recorded_settings(log: str, read: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """A run folder's ``config.yaml`` with the images per epoch its log records (None: a bare log file, or a
    folder without a readable config). ``read``: the log already read."""
    from pcpo_eval.rundir import config_path, logged_images_per_epoch
    from pcpo_eval.stats.comparability import IMAGES_LOGGED, edited_settings
    from pcpo_eval.train.checkpoints import load_run_config, trained_config

    if not Path(log).is_dir() or not config_path(log).is_file():
        return None
    try:
        cfg = dict(load_run_config(log))
    except UserError:
        return None
    if edited := edited_settings(log, cfg, trained_config(log)):
        raise UserError(edited[0])
    if (logged := logged_images_per_epoch(log, read)) is not None:
        cfg[IMAGES_LOGGED] = logged
    return cfg


def _comparability_notes(baseline: list[str], pcpo: list[str], *, epochs: bool = True,
                         unequal_epochs_ok: bool = False, label: str = "--baseline and --pcpo",
                         logs: dict[str, pd.DataFrame] | None = None) -> list[str]:
    """What a study checks before it compares runs (:mod:`pcpo_eval.stats.comparability`), for the runs a
    command is given: one reward (refused otherwise), one epoch size (refused unless ``unequal_epochs_ok``,
    then a note), and a note naming what could not be checked. Before, ``speedup`` compared a doubled reward
    (+63%, p 0.026) and twice the images per epoch (+63%, p 0.004) between two sets of DDPO runs."""
    from pcpo_eval.stats.comparability import (
        epoch_unit_problems,
        reward_problems,
        unchecked_settings,
        unchecked_text,
    )

    given = [("baseline", b) for b in baseline] + [("PCPO", t) for t in pcpo]
    settings = [(arm, log, _recorded_settings(log, (logs or {}).get(log))) for arm, log in given]
    runs = [(arm, log, cfg) for arm, log, cfg in settings if cfg is not None]
    if problems := reward_problems(None, runs, label, fix="compare runs trained on one reward"):
        raise UserError(problems[0])
    notes = []
    if epochs:
        found = epoch_unit_problems(None, runs, "baseline", "PCPO", "the algorithm", fix=(
            "compare runs with one epoch size, or pass --unequal-epochs-ok to compare per epoch anyway (the output "
            "then says so)"))
        if found and not unequal_epochs_ok:
            raise UserError(found[0])
        notes += [f.split("): ", 1)[0] + "): every row compares per epoch (--unequal-epochs-ok), so a difference "
                  "may be the extra samples or compute, not the algorithm" for f in found]
    unchecked = unchecked_settings(runs) if epochs else {}
    bare = [log for _, log, cfg in settings if cfg is None]
    if unchecked or bare:
        notes.append(unchecked_text(unchecked, bare))
    return notes


def _read_logs(logs: list[str]) -> dict[str, pd.DataFrame]:
    """Each given log (file or run folder) read once, for every check and the table."""
    from pcpo_eval.rundir import load_log

    return {log: load_log(log) for log in dict.fromkeys(logs)}


def _check_finite_logs(logs: dict[str, pd.DataFrame], curve: str) -> None:
    """Refuse logs with infinite rewards (NaN is refused by the log reader) before anything is fitted."""
    import numpy as np

    cols = ["reward_mean", *(["control_reward_mean"] if curve == "gain" else [])]
    for log, df in logs.items():
        for c in cols:
            if c in df.columns:
                n_bad = int((~np.isfinite(df[c].to_numpy(np.float64))).sum())
                if c == "control_reward_mean" and n_bad == len(df):  # a run trained without its control
                    raise UserError(f"log {log} has no control_reward_mean (the run was trained without "
                                    "paired_control); the gain curve needs runs trained with paired_control: true "
                                    "(or use --curve reward)")
                if n_bad:
                    raise UserError(f"log {log} column {c!r} has {n_bad} non-finite (inf/NaN) values; fix or "
                                    "drop those epochs, or leave that run out")


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
    from pcpo_eval.stats.design import read_table, replication_warnings
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
    if response:
        if "~" not in formula:
            raise UserError(f"formula {formula!r} has no '~'")
        rhs = formula.split("~", 1)[1]
        fits, adjusted = fit_lmm_many(df, response, rhs, list(group), coding, not ml, re_formula)
        payload = {"metrics": {k: v.to_dict() for k, v in fits.items()}, "adjusted": adjusted}
        if qq:
            raise UserError("--qq needs a single response (drop --response or fit one metric)")
        text = many_summary(fits, adjusted)
    else:
        res = fit_lmm(df, formula, list(group), coding, not ml, re_formula)
        payload = res.to_dict()
        text = res.summary()
        if qq:
            qq_plot(res, qq)
    warnings = replication_warnings(df, f"{response[0]} ~ {formula.split('~', 1)[1]}" if response else formula,
                                    list(group))
    payload["warnings"] = warnings
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
        False, "--paired", help="The i-th --baseline and i-th --pcpo log share a training seed (paired t test)."
    ),
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
    from pcpo_eval.stats.speedup import speedup_table

    _check_outputs([*baseline, *pcpo], output=output)
    if curve not in ("reward", "gain"):
        raise UserError(f"--curve must be reward or gain, got {curve!r}")
    _check_targets(target)
    logs = _read_logs([*baseline, *pcpo])
    _check_finite_logs(logs, curve)
    _check_distinct_runs(baseline, pcpo, logs)
    notes = _comparability_notes(baseline, pcpo, unequal_epochs_ok=unequal_epochs_ok, logs=logs)
    if paired and len(baseline) == len(pcpo):
        _check_pairs(baseline, pcpo)
    tab = speedup_table([(b, logs[b]) for b in baseline], [(t, logs[t]) for t in pcpo], target, window,
                        not lower_is_better, paired=paired, curve=curve)
    tab = replace(tab, notes=(*tab.notes, *notes))
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
    from pcpo_eval.stats.select import select_checkpoints

    _check_outputs([*run_dirs, *([matched_to] if matched_to else [])], output=output)
    _check_targets([target])
    if matched_to:  # matched on one reward scale: the PCPO run's reward level is the other runs' target
        _comparability_notes(run_dirs, [matched_to], epochs=False, label="the runs and --matched-to")
    sel = select_checkpoints(run_dirs, target, window, matched_to, on)
    js = dumps(sel.to_dict())
    _write(output, js)
    typer.echo(js if as_json else sel.to_markdown())


def register(app: typer.Typer) -> None:
    """Add ``lmm``, ``speedup`` and ``select`` to the CLI."""
    app.command("lmm")(lmm_cmd)
    app.command("speedup")(speedup_cmd)
    app.command("select")(select_cmd)
