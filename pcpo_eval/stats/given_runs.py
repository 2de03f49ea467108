"""Runs given by hand (logs, run folders or DataFrames), checked and paired as a study checks its own.

``pcpo-eval speedup`` and :func:`pcpo_eval.speedup` compare runs a user names; a study compares runs it
trained. Both must give one answer to one question, so the hand-given runs pass the study's checks here,
in one place for the command line and the Python API (:func:`compare_given_runs`):

1. every log is read once (:func:`read_logs`) and holds finite rewards (:func:`check_finite_logs`);
2. no run is given twice, under one path or as a copy of another's curves (:func:`check_distinct_runs`);
3. run folders that record their settings share one reward and one epoch size
   (:func:`comparability_notes`, :mod:`pcpo_eval.stats.comparability`);
4. pairing follows the study's rule (:func:`choose_pairing`): by default (``paired=None``) runs whose
   ``config.yaml`` records a training seed are paired on the seeds both arms trained, exactly as
   :func:`pcpo_eval.stats.verdict.pair_runs` pairs a study's runs; ``paired=True`` pairs the i-th runs
   as given (refused where their recorded seeds differ), ``paired=False`` never pairs. Before, the
   command was unpaired unless told otherwise: on the demo's runs it printed "-29% (95% CI -46% to
   -0.2%), p 0.049" where the study, pairing the same runs by seed, said "-29% (-55% to +23%), p 0.109".
"""

from __future__ import annotations

import math
from collections.abc import Sequence
from dataclasses import dataclass, replace
from pathlib import Path
from typing import TYPE_CHECKING, Any

from pcpo_eval.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

    from pcpo_eval.stats.speedup import SpeedupTable

def _where(name: str, where: dict[str, str | None] | None) -> str | None:
    """The file or folder a given run's name stands for: ``where[name]`` when given, else the name itself."""
    return where.get(name) if where is not None and name in where else name


def check_targets(targets: Sequence[float]) -> None:
    """A target must be a finite reward level (nan / inf would give a table of nothing reached)."""
    bad = [t for t in targets if not math.isfinite(t)]
    if bad:
        raise UserError(f"--target {bad[0]} is not a finite number; give a reward level, e.g. --target 0.8")


def read_logs(logs: Sequence[str]) -> dict[str, pd.DataFrame]:
    """Each given log (file or run folder) read once, for every check and the table."""
    from pcpo_eval.rundir import load_log

    return {log: load_log(log) for log in dict.fromkeys(logs)}


def check_finite_logs(logs: dict[str, pd.DataFrame], curve: str) -> None:
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


def recorded_seed(log: str) -> Any:
    """The training seed a run folder's ``config.yaml`` records; None for a log file, a folder without
    one, or an unreadable one (the log itself is read and checked elsewhere)."""
    from pcpo_eval.rundir import config_path
    from pcpo_eval.train.checkpoints import load_run_config

    if not isinstance(log, (str, Path)) or not config_path(log).is_file():
        return None
    try:
        return load_run_config(log).get("seed")
    except UserError:
        return None


def check_pairs(baseline: Sequence[str], pcpo: Sequence[str]) -> None:
    """``paired=True`` pairs the i-th baseline with the i-th PCPO run: refuse a pair whose run folders
    record other training seeds (the pair would be two seeds' noise, not one seed's). Logs without a
    recorded seed are paired as given."""
    for i, (b, t) in enumerate(zip(baseline, pcpo, strict=True), start=1):
        sb, st = recorded_seed(b), recorded_seed(t)
        if sb is not None and st is not None and sb != st:
            raise UserError(f"--paired pair {i}: --baseline {b} has seed {sb}, --pcpo {t} seed {st}; give both "
                            "arms' runs in the same seed order")


def check_distinct_runs(baseline: Sequence[str], pcpo: Sequence[str], logs: dict[str, pd.DataFrame],
                        where: dict[str, str | None] | None = None) -> None:
    """Every log given once: one run folder (or log) given twice, or two whose curves are one run's
    (:func:`pcpo_eval.rundir.same_curves`: copied, imported twice, or cut at another epoch), would count one
    seed as several. Before, ``--pcpo R`` five times gave an A/A pair of arms a "+58% speed-up, Holm p 0.031".
    ``logs``: each given log by its name, read once (:func:`read_logs`); ``where``: a name's file or folder when
    the name is not its path (an API caller's ``(name, path)``); runs without one (DataFrames) are compared by
    their curves only."""
    from pcpo_eval.rundir import twin_runs

    paths: dict[str, str] = {}
    given: dict[str, str] = {}
    for flag, log in [*(("--baseline", b) for b in baseline), *(("--pcpo", t) for t in pcpo)]:
        name, at = f"{flag} {log}", _where(log, where)
        path = str(Path(at).resolve()) if at is not None and Path(at).exists() else f"{flag}\0{log}"
        if path in paths:
            raise UserError(f"{name} is the run of {paths[path]} again: one run would count as two seeds; give "
                            "each seed's own run once")
        paths[path], given[path] = name, log
    twins = twin_runs([(name, logs[given[path]]) for path, name in paths.items()])
    if twins:
        raise UserError(f"{twins[0][1]} has the same curves as {twins[0][0]} (every shared epoch's reward and control): "
                        "one run copied or imported twice would count as two seeds; give each seed's own run once")


def _recorded_settings(log: str | None, read: pd.DataFrame | None = None) -> dict[str, Any] | None:
    """A run folder's ``config.yaml`` with the images per epoch its log records (None: a bare log file, or a
    folder without a readable config). ``read``: the log already read."""
    from pcpo_eval.rundir import config_path, logged_images_per_epoch
    from pcpo_eval.stats.comparability import IMAGES_LOGGED, edited_settings
    from pcpo_eval.train.checkpoints import load_run_config, trained_config

    if log is None or not Path(log).is_dir() or not config_path(log).is_file():
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


def comparability_notes(baseline: Sequence[str], pcpo: Sequence[str], *, epochs: bool = True,
                        unequal_epochs_ok: bool = False, label: str = "--baseline and --pcpo",
                        logs: dict[str, pd.DataFrame] | None = None,
                        where: dict[str, str | None] | None = None) -> list[str]:
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
    settings = [(arm, log, _recorded_settings(_where(log, where), (logs or {}).get(log))) for arm, log in given]
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


def _unique_labels(given: Sequence[tuple[str, str, Any]]) -> list[str]:
    """Each run's name; where one name stands for different runs (``("seed0", df)`` in both arms) it is
    prefixed by the arm, and numbered where that is not enough. One path given twice keeps its name (the
    duplicate check then names it)."""
    from collections import Counter

    same = {n: len({v if isinstance(v, str) else id(v) for _, m, v in given if m == n}) == 1 for _, n, _ in given}
    labels = [n if same[n] else f"{arm} {n}" for arm, n, _ in given]
    clash = {lab for lab, k in Counter(labels).items() if k > 1 and not same.get(lab, False)}
    seen: Counter[str] = Counter()
    out = []
    for lab in labels:
        seen[lab] += 1
        out.append(f"{lab} #{seen[lab]}" if lab in clash else lab)
    return out


@dataclass(frozen=True)
class _Seeded:
    """A hand-given run with the seed its folder records (what :func:`pcpo_eval.stats.verdict.pair_runs` reads)."""

    seed: Any
    log: str


def choose_pairing(baseline: Sequence[str], pcpo: Sequence[str], paired: bool | None,
                   where: dict[str, str | None] | None = None) -> tuple[list[str], list[str], bool, str]:
    """(baseline, pcpo, paired, note): the runs to compare, in pair order when paired, and how.

    ``paired=None``: the study's rule (:func:`pcpo_eval.stats.verdict.pair_runs`) on the seeds the run
    folders record: paired on the seeds both arms trained when those are at least 2 and at least half of
    each arm (the others left out, named in the note); unpaired when a run records no seed, an arm holds
    one seed twice, or too few seeds are shared. ``True``: the i-th runs as given (:func:`check_pairs`).
    ``False``: unpaired."""
    from pcpo_eval.stats.verdict import pair_runs

    if paired is True:
        if len(baseline) != len(pcpo):
            raise UserError(f"--paired needs as many baseline as PCPO logs (got {len(baseline)} and {len(pcpo)}), "
                            "given in seed order")
        check_pairs([_where(x, where) or x for x in baseline], [_where(x, where) or x for x in pcpo])
        return list(baseline), list(pcpo), True, "as given (--paired: the i-th runs share a training seed)"
    if paired is False:
        return list(baseline), list(pcpo), False, "as asked (--unpaired)"
    seeds = {log: recorded_seed(_where(log, where)) for log in [*baseline, *pcpo]}
    if unknown := [log for log, s in seeds.items() if s is None]:
        return (list(baseline), list(pcpo), False,
                f"{unknown[0]} records no training seed (a log file, or a folder without config.yaml); "
                "pass --paired if the i-th runs share one")
    for arm, logs in (("baseline", baseline), ("PCPO", pcpo)):
        if len({seeds[x] for x in logs}) < len(logs):
            return list(baseline), list(pcpo), False, f"two {arm} runs record one training seed"
    b, t, ok = pair_runs([_Seeded(seeds[x], x) for x in baseline], [_Seeded(seeds[x], x) for x in pcpo])
    if not ok:
        return (list(baseline), list(pcpo), False, "the arms share fewer than 2 training seeds, or fewer "
                "than half of an arm's (the study's pairing rule)")
    kept = {r.log for r in [*b, *t]}
    left = [x for x in [*baseline, *pcpo] if x not in kept]
    return ([r.log for r in b], [r.log for r in t], True,
            f"by the training seeds the run folders record ({', '.join(str(r.seed) for r in b)}), as a study pairs its runs"
            + (f"; left out, their seed not trained by the other arm: {', '.join(left)}" if left else ""))


def compare_given_runs(baseline: Sequence[Any], pcpo: Sequence[Any], targets: Sequence[float], window: int,
                       higher_is_better: bool = True, *, paired: bool | None = None, curve: str = "reward",
                       unequal_epochs_ok: bool = False) -> SpeedupTable:
    """:func:`pcpo_eval.stats.speedup.speedup_table` on hand-given runs after the study's checks (the
    module docstring's steps 1-4); the table's ``pairing`` says how the runs were paired, its notes what
    could not be checked. ``baseline`` / ``pcpo``: log files or run folders, logs already read (DataFrames) or
    ``(name, log)`` pairs; DataFrames record no seed (unpaired unless ``paired=True``)."""
    import pandas as pd

    from pcpo_eval.rundir import validate_log
    from pcpo_eval.stats.speedup import speedup_table

    if curve not in ("reward", "gain"):
        raise UserError(f"--curve must be reward or gain, got {curve!r}")
    check_targets(targets)

    given: list[tuple[str, str, Any]] = []  # (arm, name, path or DataFrame)
    for arm, xs in (("baseline", baseline), ("PCPO", pcpo)):
        for i, x in enumerate(xs, start=1):
            name, v = x if isinstance(x, tuple) else (f"{arm} log {i}", x) if isinstance(x, pd.DataFrame) else (str(x), x)
            given.append((arm, str(name), v if isinstance(v, pd.DataFrame) else str(v)))
    labels = _unique_labels(given)  # "seed0" in both arms: two runs
    where = {lab: v if isinstance(v, str) else None for lab, (_, _, v) in zip(labels, given, strict=True)}
    files = read_logs([v for v in where.values() if v is not None])
    logs = {lab: files[v] if isinstance(v, str) else validate_log(v, lab)
            for lab, (_, _, v) in zip(labels, given, strict=True)}
    b_names, t_names = labels[:len(baseline)], labels[len(baseline):]
    check_finite_logs(logs, curve)
    check_distinct_runs(b_names, t_names, logs, where)
    notes = comparability_notes(b_names, t_names, unequal_epochs_ok=unequal_epochs_ok, logs=logs, where=where)
    b_names, t_names, is_paired, how = choose_pairing(b_names, t_names, paired, where)
    tab = speedup_table([(n, logs[n]) for n in b_names], [(n, logs[n]) for n in t_names], targets, window,
                        higher_is_better, paired=is_paired, curve=curve)
    return replace(tab, notes=(*tab.notes, *notes), pairing=how)
