"""The study spec: dataclasses, and validation (:func:`load_spec`) that lists every problem at once.

:func:`load_spec` reads the YAML once and hands each section to its parser (``_parse_train``,
``_parse_design``, ``_parse_compare``, ``_parse_seeds``, ``_parse_options``, ``_parse_runs``,
``_expand_runs``, ``_check_run_names``, ``_parse_targets``, ``_parse_eval``, ``_parse_metrics``,
``_check_per_prompt``, ``_parse_lmm``, ``_check_weights``; preference sets, grids and explicit
checkpoint epochs in :mod:`.sections`).
Each parser takes its raw section and the shared ``problems`` list (plus the facts parsed before
it that it depends on), appends one line per problem and returns a usable value, so one pass
reports everything; ``load_spec`` then raises one :class:`~pcpo_eval.errors.UserError`.

Replicates are first class: every design cell (one level per factor) is trained once per
training seed of ``seeds:`` (default: the train config's one seed), and each (cell, seed) is a run
named ``<cell>__seed-<s>``. Runs, not prompts, are the unit of replication of every run-level
verdict (:mod:`pcpo_eval.stats.verdict`). Every run to be trained carries its *resolved*
:class:`~pcpo_eval.train.config.TrainConfig` (train config file + ``train.overrides`` + the cell's
level overrides + ``seed`` + ``paired_control``), built here once.
"""


from __future__ import annotations

import dataclasses
import itertools
import json
import math
import re
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any, NamedTuple

from pcpo_eval.errors import ProblemList, UserError
from pcpo_eval.io import read_yaml_mapping
from pcpo_eval.metrics.base import METRICS, PREFERENCE_METRICS, per_prompt_problem
from pcpo_eval.rewards import required_backends
from pcpo_eval.rundir import checkpoints_root, load_log, log_path, logged_images_per_epoch, twin_runs
from pcpo_eval.stats.comparability import (
    IMAGES_LOGGED,
    edited_settings,
    epoch_unit_problems,
    existing_run_problems,
    reward_problems,
    unchecked_settings,
    unchecked_text,
)
from pcpo_eval.stats.formula import parse_lmm_formula
from pcpo_eval.stats.select import MATCH_ON
from pcpo_eval.stats.speedup import SMOOTHING_WINDOW, unreachable_targets
from pcpo_eval.stats.verdict import quantity_name
from pcpo_eval.study.retention import epoch_maps, retention_problems
from pcpo_eval.study.sections import (
    GridSpec,
    PreferenceSpec,
    parse_epoch_map,
    parse_grids,
    parse_preferences,
    saved_epoch_problem,
)
from pcpo_eval.train.config import TrainConfig, config_from_dict, read_config_file
from pcpo_eval.train.inputs import file_settings, read_inputs
from pcpo_eval.train.preflight import backend_missing, model_missing, prompts_missing

STAGES = ("train", "select", "generate", "metrics", "stats", "report")


# ------------------------------------------------------------------------------------------------
# Spec dataclasses
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSpec:
    """Image sets for the quality metrics: the same prompts and seeds for every model.

    ``steps``/``cfg``/``eta`` default to the train config's sampling settings. Every set is sampled
    with one noise schedule (``sigma_schedule``) so models differ only in their weights: a choice of
    :data:`pcpo_eval.samplers.SCHEDULES` for the runs' sampler (``ddim``/``pcpo`` for eps-prediction
    models, ``ode``/``dance``/``flowgrpo`` for velocity models). Unset, :func:`load_spec` fills in
    that sampler's default (its first entry: ``ddim`` resp. ``ode``).
    """

    prompts: str = "toy"
    seeds: str = "8"
    max_prompts: int | None = None
    steps: int | None = None
    cfg: float | None = None
    eta: float | None = None
    sigma_schedule: str | None = None
    batch_size: int = 16
    device: str = "cpu"


@dataclass(frozen=True)
class LMMSpec:
    """One LMM per metric: ``value ~ fixed + (1|group)`` in lme4 syntax (groups parsed out).

    The data has one row per (run, prompt): columns ``value`` (the metric), every design factor
    (string levels; treatment coding takes the first level in sorted order as reference),
    ``prompt`` and ``prompt_id``.
    """

    formula: str = "value ~ algorithm * batch + (1|prompt)"
    coding: str = "treatment"
    alpha: float = 0.05
    adjust: str = "holm"  #: holm | bh: multiplicity across metrics, per fixed term


@dataclass(frozen=True)
class RunSpec:
    """One run: a design cell (its factor levels, config overrides) x one training seed.

    ``name`` is ``<cell>__seed-<seed>`` (the run directory under ``OUT/runs``); ``cell`` is the
    design cell's name ``factor-level__factor-level``.
    """

    name: str
    levels: dict[str, str]
    overrides: dict[str, Any]
    seed: int = 0
    cell: str = ""
    run_dir: str | None = None  #: existing run directory (not trained by the study)
    config: str | None = None  #: train config file (a level's ``config:`` key, else ``train.config``)
    train: TrainConfig | None = None  #: resolved train config of a run the study trains (None: run_dir)


@dataclass(frozen=True)
class StudySpec:
    """A validated study (see :func:`load_spec` and the module docstring)."""

    name: str
    description: str
    train_config: str | None
    train_overrides: dict[str, Any]
    factors: dict[str, tuple[str, ...]]
    runs: tuple[RunSpec, ...]
    base_model: str  #: model spec of the first run (the ``base`` image set)
    compare_factor: str
    baseline: str
    pcpo: str
    seeds: dict[str, tuple[int, ...]]  #: compared level -> training seeds (each cell trained once per seed)
    parallel: int  #: train up to this many runs at once (separate processes)
    paired_control: bool  #: trained runs log the untrained model's reward (``control_reward_mean``)
    targets: tuple[float, ...]
    select_target: float
    #: matched-epoch comparison: "final", an epoch, {arm: epoch} (explicit checkpoints), or None (off)
    select_epoch: int | str | dict[str, int] | None
    window: int
    eval: EvalSpec
    metrics: tuple[str, ...]
    overall_only: tuple[str, ...]  #: metrics computed on whole sets only (no per-prompt LMM)
    per_prompt_rank_deficient_ok: tuple[str, ...]  #: FD metrics fitted per prompt below d + 1 images (opt-in)
    metric_batch_size: int
    is_splits: int
    lmm: LMMSpec
    preference: PreferenceSpec | None
    grid: GridSpec
    source: str
    raw: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)
    #: what reward-matched checkpoints are matched on: ``train`` (smoothed training reward) or
    #: ``eval`` (smoothed held-out validation reward, runs trained with ``validation_every``)
    select_on: str = "train"
    #: gain levels (reward - paired control) for the learning speed-up rows ``speedup_gain:<g>``
    gain_targets: tuple[float, ...] = ()
    #: the primary endpoint(s) of the verdict (others are secondary; Holm within each family)
    primary: tuple[str, ...] = ()
    #: every preference prompt set (``preference`` is the first); see :mod:`.sections`
    preferences: tuple[PreferenceSpec, ...] = ()
    #: every image grid (``grid`` is the first)
    grids: tuple[GridSpec, ...] = ()
    #: the compared arms differ in what one epoch is (images sampled, optimizer steps), allowed by
    #: ``unequal_epochs_ok: true``: each difference in words, for the verdict's notes and headline
    #: (:func:`~pcpo_eval.stats.comparability.epoch_unit_problems`)
    epoch_caveats: tuple[str, ...] = ()
    #: runs whose settings could not be compared (they record too few: an imported run), in words
    unchecked_caveats: tuple[str, ...] = ()

    # derived -----------------------------------------------------------------------------
    @property
    def cell_factors(self) -> list[str]:
        """Factors that define a comparison cell (all but the compared one)."""
        return [f for f in self.factors if f != self.compare_factor]

    @property
    def per_prompt_metrics(self) -> tuple[str, ...]:
        """Metrics with per-prompt values in the LMMs (all but ``overall_only``)."""
        return tuple(m for m in self.metrics if m not in self.overall_only)

    def arm(self, run: RunSpec) -> str:
        """The run's level of the compared factor (its arm, e.g. ``PCPO``)."""
        return run.levels[self.compare_factor]

    def cell_key(self, run: RunSpec) -> str:
        """Label of the run's comparison cell, e.g. ``batch=16`` (``all`` without cell factors)."""
        parts = [f"{f}={run.levels[f]}" for f in self.cell_factors]
        return ", ".join(parts) if parts else "all"

    def cells(self) -> list[str]:
        """Comparison cells in design order."""
        return list(dict.fromkeys(self.cell_key(r) for r in self.runs))

    def role(self, run: RunSpec) -> str:
        """``baseline``, ``pcpo`` or ``other`` (a third level of the compared factor)."""
        lv = run.levels[self.compare_factor]
        return "baseline" if lv == self.baseline else "pcpo" if lv == self.pcpo else "other"

    def sampling(self) -> dict[str, Any]:
        """Eval sampler settings: the eval section, else the first run's train config, else SD defaults."""
        ev, cfg = self.eval, self.runs[0].train
        steps = ev.steps or (cfg.sample_steps if cfg else 50)
        return {"steps": int(steps), "cfg": float(ev.cfg if ev.cfg is not None else (cfg.cfg if cfg else 5.0)),
                "eta": float(ev.eta if ev.eta is not None else (cfg.sample_eta if cfg else 1.0)),
                "sigma_schedule": ev.sigma_schedule}

    def to_dict(self) -> dict[str, Any]:
        """Resolved spec (JSON-able), saved as ``OUT/spec.resolved.json``, with the eval sampler settings
        (:meth:`sampling`) for readers of a finished study (``pcpo-eval human design``)."""
        return dataclasses.asdict(self) | {"raw": None, "sampling": self.sampling()}


class _Compare(NamedTuple):
    factor: str
    baseline: str
    pcpo: str


class _Options(NamedTuple):
    parallel: int
    paired_control: bool
    select_epoch: int | str | None
    select_on: str


_TOP_KEYS = {
    "name", "description", "train", "design", "runs", "compare", "seeds", "parallel", "paired_control",
    "targets", "gain_targets", "primary", "select_target", "select_epoch", "select_on", "window", "eval", "metrics",
    "overall_only",
    "per_prompt_rank_deficient_ok", "unequal_epochs_ok", "metric_options", "lmm", "preference", "grid",
}  # fmt: skip
_TRAIN_KEYS = {"config", "overrides"}
_COMPARE_KEYS = {"factor", "baseline", "pcpo"}
_RUN_KEYS = {"levels", "run_dir", "seed"}
_METRIC_OPTION_KEYS = {"batch_size", "is_splits"}
_RESERVED_COLUMNS = ("value", "prompt", "prompt_id", "run", "seed")
#: train-config keys a study sets per run (``seeds:``, ``paired_control:``), not in overrides
_STUDY_KEYS = ("seed", "paired_control")

Factors = dict[str, dict[str, dict[str, Any]]]  #: factor -> level -> config overrides


# ------------------------------------------------------------------------------------------------
# Small helpers
# ------------------------------------------------------------------------------------------------


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "run"


def _section(name: str, d: Any, allowed: set[str], problems: list[str]) -> dict[str, Any]:
    """The known keys of mapping ``d`` ({} if absent); a non-mapping or unknown keys are problems."""
    if d is None:
        return {}
    if not isinstance(d, dict):
        problems.append(f"{name} must be a mapping")
        return {}
    bad = sorted(set(map(str, d)) - allowed)
    if bad:
        problems.append(f"unknown key(s) {', '.join(bad)} in {name} (valid: {', '.join(sorted(allowed))})")
    return {str(k): v for k, v in d.items() if str(k) in allowed}


def _resolve_path(base: Path, p: str | None) -> str | None:
    """Paths in a spec are relative to the spec file's folder, else to the working directory."""
    if p is None:
        return None
    q = Path(str(p)).expanduser()
    if q.is_absolute():
        return str(q)
    for root in (base, Path.cwd()):
        if (root / q).exists():
            return str((root / q).resolve())
    return str(q)


def _prompt_source(base: Path, prompts: str) -> str:
    """A prompt set name as is; a prompt file (has a suffix) resolved like every spec path."""
    return (_resolve_path(base, prompts) or prompts) if Path(prompts).suffix else prompts


# ------------------------------------------------------------------------------------------------
# Section parsers: each appends its problems and returns a usable value
# ------------------------------------------------------------------------------------------------


def _parse_train(section: Any, base: Path, problems: list[str]) -> tuple[str | None, dict[str, Any]]:
    """``train: {config, overrides}`` -> (resolved config file or None, overrides)."""
    train = _section("train", section, _TRAIN_KEYS, problems)
    config = _resolve_path(base, train.get("config"))
    overrides = train.get("overrides") or {}
    if not isinstance(overrides, dict):
        problems.append("train.overrides must be a mapping of config keys to values")
        overrides = {}
    if config is not None and not Path(config).is_file():
        problems.append(f"train.config {train.get('config')} not found (paths are relative to the spec or the working directory)")
    return config, dict(overrides)


def _parse_levels(fac: str, levels: dict[Any, Any], base: Path, problems: list[str],
                  level_configs: dict[tuple[str, str], str]) -> dict[str, dict[str, Any]]:
    """One factor's ``level -> overrides``; a level's ``config:`` key switches the train config file."""
    out: dict[str, dict[str, Any]] = {}
    for lv, ov in levels.items():
        if ov is None:
            ov = {}
        if not isinstance(ov, dict):
            problems.append(f"design.{fac}.{lv} must be a mapping of config overrides")
            ov = {}
        ov = dict(ov)
        if "config" in ov:  # e.g. paper setup 1 vs 2
            cpath = _resolve_path(base, str(ov.pop("config"))) or ""
            level_configs[(fac, str(lv))] = cpath
            if not Path(cpath).is_file():
                problems.append(f"design.{fac}.{lv}.config {cpath} not found")
        out[str(lv)] = ov
    return out


def _parse_design(section: Any, base: Path, problems: list[str]) -> tuple[Factors, dict[tuple[str, str], str]]:
    """``design: {factor: {level: overrides}}`` (or a list of levels) -> (factors, level config files)."""
    factors: Factors = {}
    level_configs: dict[tuple[str, str], str] = {}
    if not isinstance(section, dict) or not section:
        problems.append("design must map each factor to its levels, e.g. design: {algorithm: {DDPO: {objective: ppo_clip}, PCPO: {objective: pcpo}}}")
        return factors, level_configs
    for fac, levels in section.items():
        fac = str(fac)
        if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fac) or fac in _RESERVED_COLUMNS:
            problems.append(f"design factor {fac!r}: use an identifier other than value/prompt/prompt_id/run/seed "
                            "(training seeds go in seeds: [0, 1, 2])")
            continue
        if isinstance(levels, list):
            levels = {str(v): {} for v in levels}
        if not isinstance(levels, dict) or not levels:
            problems.append(f"design.{fac} must map each level to its config overrides (or list the levels)")
            continue
        factors[fac] = _parse_levels(fac, levels, base, problems, level_configs)
    return factors, level_configs


def _parse_compare(section: Any, factors: Factors, problems: list[str]) -> _Compare:
    """``compare: {factor, baseline, pcpo}``; the baseline must be the reference level."""
    cmp_ = _section("compare", section, _COMPARE_KEYS, problems)
    factor = str(cmp_.get("factor", "algorithm"))
    if factors and factor not in factors:
        problems.append(f"compare.factor {factor!r} is not a design factor ({', '.join(factors)})")
    levels = list(factors.get(factor, {}))
    baseline = str(cmp_.get("baseline", levels[0] if levels else ""))
    pcpo = str(cmp_.get("pcpo", levels[1] if len(levels) > 1 else ""))
    if levels:
        for role, lv in (("baseline", baseline), ("pcpo", pcpo)):
            if lv not in levels:
                problems.append(f"compare.{role} {lv!r} is not a level of {factor} ({', '.join(levels)})")
        if baseline in levels and sorted(levels)[0] != baseline:
            problems.append(f"compare.baseline {baseline!r} must sort first among {factor}'s levels "
                            f"(treatment coding's reference level); rename the levels")
    return _Compare(factor, baseline, pcpo)


def _run_seed(i: int, r: dict[str, Any], seeds: Sequence[int], problems: list[str]) -> int | None:
    """The ``seed:`` of ``runs[i]`` (default: the study's only seed); None after a problem."""
    if "seed" not in r:
        if len(seeds) == 1:
            return seeds[0]
        problems.append(f"runs[{i}] needs seed: (one of the study's seeds {', '.join(map(str, seeds))})")
        return None
    seed = r["seed"]
    if isinstance(seed, bool) or not isinstance(seed, int) or seed not in seeds:
        problems.append(f"runs[{i}].seed {seed!r} is not one of the study's seeds ({', '.join(map(str, seeds))}); "
                        "add it to seeds:")
        return None
    return int(seed)


def _parse_runs(section: Any, factors: Factors, compare: str, seeds: dict[str, tuple[int, ...]], base: Path,
                problems: list[str]) -> dict[tuple[tuple[str, ...], int], str]:
    """``runs: [{levels, seed, run_dir}]`` -> existing run directory per (design cell, seed)."""
    if section is not None and not isinstance(section, list):
        problems.append("runs must be a list of {levels: {...}, seed: S, run_dir: DIR}")
        return {}
    existing: dict[tuple[tuple[str, ...], int], str] = {}
    for i, r in enumerate(section or []):
        r = _section(f"runs[{i}]", r, _RUN_KEYS, problems)
        lv = {str(k): str(v) for k, v in (r.get("levels") or {}).items()}
        if factors and set(lv) != set(factors):
            problems.append(f"runs[{i}].levels must give a level for each factor ({', '.join(factors)})")
            continue
        bad = [f"{k}={v}" for k, v in lv.items() if k in factors and v not in factors[k]]
        if bad:
            problems.append(f"runs[{i}].levels {', '.join(bad)} not in the design")
            continue
        seed = _run_seed(i, r, seeds.get(lv.get(compare, ""), ()), problems)
        rd = _resolve_path(base, r.get("run_dir"))
        if rd is None:
            problems.append(f"runs[{i}] needs run_dir (an existing run directory)")
            continue
        if not log_path(rd).is_file() or not checkpoints_root(rd).is_dir():
            problems.append(f"runs[{i}].run_dir {r.get('run_dir')}: missing run (needs log.parquet and checkpoints/)")
            continue
        if seed is None:
            continue
        key = (tuple(lv[f] for f in factors), seed)
        if key in existing:
            problems.append(f"runs[{i}] repeats levels {lv} with seed {seed}; give each (cell, seed) once")
        existing[key] = rd
    return existing


def _read_train_file(path: str | None, problems: list[str]) -> dict[str, Any] | None:
    """A train config file's mapping ({} without a file); None if unusable (the problem is listed once)."""
    if path is None:
        return {}
    if not Path(path).is_file():
        return None  # reported by _parse_train / _parse_design
    try:
        return read_config_file(path)
    except UserError as exc:
        problems.append(str(exc))
        return None


def cell_name(levels: dict[str, str]) -> str:
    """A design cell's directory-safe name: ``factor-level__factor-level``."""
    return _safe_name("__".join(f"{f}-{lv}" for f, lv in levels.items()))


def run_name(cell: str, seed: int) -> str:
    """A run's name (and directory): ``<cell>__seed-<seed>``."""
    return f"{cell}__seed-{int(seed)}"


def _resolve_train(name: str, base_cfg: dict[str, Any] | None, overrides: dict[str, Any], seed: int,
                   paired_control: bool, problems: list[str]) -> TrainConfig | None:
    """One run's TrainConfig: the config file's mapping < ``overrides`` < the study's seed and control."""
    if base_cfg is None:
        return None
    try:
        return config_from_dict({**base_cfg, **overrides, "seed": seed, "paired_control": paired_control})
    except UserError as exc:
        problems.append(f"run {name}: {exc}")
        return None


def _expand_runs(factors: Factors, level_configs: dict[tuple[str, str], str], train_config: str | None,
                 train_overrides: dict[str, Any], compare: str, seeds: dict[str, tuple[int, ...]],
                 paired_control: bool, existing: dict[tuple[tuple[str, ...], int], str],
                 problems: list[str]) -> list[RunSpec]:
    """Every cell of the factorial design x every seed -> a RunSpec: an existing run dir, or a resolved
    TrainConfig (config file, then ``train.overrides``, then the cell's level overrides, then the
    seed and ``paired_control``; later wins)."""
    files: dict[str | None, dict[str, Any] | None] = {}
    runs: list[RunSpec] = []
    if not factors:  # reported by _parse_design
        return runs
    for combo in itertools.product(*[list(v) for v in factors.values()]):
        levels = dict(zip(factors, combo, strict=True))
        cell = cell_name(levels)
        overrides: dict[str, Any] = {}
        cfg_file = train_config
        for f, lv in levels.items():
            overrides.update(factors[f][lv])
            cfg_file = level_configs.get((f, lv), cfg_file)
        for seed in seeds.get(levels.get(compare, ""), ()):
            name = run_name(cell, seed)
            train = None
            if (combo, seed) not in existing:
                if cfg_file not in files:
                    files[cfg_file] = _read_train_file(cfg_file, problems)
                train = _resolve_train(name, files[cfg_file], {**train_overrides, **overrides}, seed,
                                       paired_control, problems)
            runs.append(RunSpec(name, levels, overrides, seed, cell, existing.get((combo, seed)), cfg_file, train))
    return runs


def _check_run_names(runs: Sequence[RunSpec], problems: list[str]) -> None:
    """Two design cells whose names sanitise to one run directory (e.g. ``PCPO v1`` and ``PCPO/v1``)."""
    seen: dict[str, dict[str, str]] = {}
    cells = {(r.cell, tuple(r.levels.items())): r for r in runs}.values()  # one per design cell
    for r in cells:
        other = seen.setdefault(r.cell.lower(), r.levels)
        if other != r.levels:
            a = ", ".join(f"{f}={v!r}" for f, v in other.items())
            b = ", ".join(f"{f}={v!r}" for f, v in r.levels.items())
            problems.append(f"design cells ({a}) and ({b}) share the run directory {r.cell} (names are sanitised "
                            "to [A-Za-z0-9._=-] and compared ignoring case); rename one of the levels")


#: settings that change a run's checkpoints but not its training curves: two runs equal in their curves and
#: differing in one of these are two runs (a study's arms with and without weight averaging)
CURVE_UNSEEN_KEYS = ("ema_decay", "ema_every", "ema_repeats")


def _differ_only_unseen(a: dict[str, Any], b: dict[str, Any]) -> bool:
    """Whether two runs' recorded settings differ, and only in :data:`CURVE_UNSEEN_KEYS`. A copy whose
    config.yaml was edited in a setting the curves would show (``objective: pcpo`` written into a copied DDPO
    run) is still one run (a review found the first version of this rule let it through)."""
    keys = a.keys() | b.keys()
    differ = {k for k in keys if a.get(k) != b.get(k)} - {"seed"}
    return bool(differ) and differ <= set(CURVE_UNSEEN_KEYS)


def _check_identical_runs(runs: Sequence[RunSpec], compare: str, problems: list[str]) -> None:
    """Two runs that would be the same run: one existing run directory listed twice (``runs:``) or copied
    (two directories whose logs hold the same rewards and controls on every shared epoch:
    :func:`pcpo_eval.rundir.same_curves`;
    before, only byte-identical logs were caught, and one run imported five times with one column differing in its
    last digit gave an A/A arm a "higher paired gain", p = 0.008), or
    two trained runs of different arms with the same resolved train config and seed (an A/A design
    with equal seeds and overrides); comparing them would compare a run with itself. Equal curves under
    recorded settings that differ are two runs (weight averaging, ``ema_decay``, changes the checkpoints,
    not the training curves: the same runs a study trained were refused when listed under ``runs:``)."""
    dirs: dict[str, RunSpec] = {}
    logs: list[tuple[RunSpec, Any]] = []  # (run, its log)
    for r in runs:
        if r.run_dir is None:
            continue
        key = str(Path(r.run_dir).resolve())
        other = dirs.setdefault(key, r)
        if other is not r:
            problems.append(f"runs {other.name} and {r.name} use the same run directory {r.run_dir}; list a "
                            "different run directory for each (cell, seed)")
            continue
        if not log_path(r.run_dir).is_file():
            continue  # reported by _parse_runs
        try:
            logs.append((r, load_log(r.run_dir)))
        except UserError:
            continue  # reported by the log checks
    for a, twin in twin_runs(logs):
        sa, st = _run_settings(a), _run_settings(twin)
        if sa is not None and st is not None and _differ_only_unseen(sa, st):
            continue  # two runs whose settings differ where the training curves cannot show it (ema_decay)
        problems.append(f"runs {a.name} ({a.run_dir}) and {twin.name} ({twin.run_dir}) have the same training "
                        "curves (every shared epoch's reward and control equal): one run copied or imported "
                        "twice; list each run's own directory")
    trained: dict[str, RunSpec] = {}
    same: list[tuple[RunSpec, RunSpec]] = []
    for r in runs:
        if r.train is None:
            continue
        key = json.dumps(r.train.to_dict(), sort_keys=True, default=str)
        other = trained.setdefault(key, r)
        if other is not r and other.levels.get(compare) != r.levels.get(compare):
            same.append((other, r))
    if same:
        a, b = same[0]
        more = f" (and {len(same) - 1} more pair(s))" if len(same) > 1 else ""
        problems.append(f"runs {a.name} and {b.name}{more} would be identical: the same train config and seed in "
                        f"both arms of {compare}; give the arms different seeds, e.g. seeds: "
                        f"{{{a.levels.get(compare)}: [0, 1, 2], {b.levels.get(compare)}: [3, 4, 5]}}, "
                        "or different overrides")


def _run_settings(run: RunSpec) -> dict[str, Any] | None:
    """A run's training settings: its resolved train config (its files as they are now, which the trainer
    will read), or an existing run's ``config.yaml`` with what its ``inputs.json`` records its files held
    (None when unreadable: :func:`_run_models` reports it); file-valued ones as
    :class:`~pcpo_eval.train.inputs.FileSetting`."""
    from pcpo_eval.train.checkpoints import load_run_config

    if run.train is not None:
        return file_settings(run.train.to_dict(), read_now=True)
    try:
        cfg = load_run_config(run.run_dir) if run.run_dir is not None else None
    except UserError:
        return None
    return file_settings(cfg, read_inputs(run.run_dir)) if cfg is not None else None


def _cell_of(run: RunSpec, compare: str) -> str:
    """The comparison cell of a run: its levels of the other factors (``all`` for a one-factor design)."""
    return ", ".join(f"{f}={v}" for f, v in run.levels.items() if f != compare) or "all"


def _check_existing_settings(runs: Sequence[RunSpec], factors: Factors, compare: str, problems: list[str]) -> None:
    """Existing run directories (``runs:``) must be trained as listed (seed, level overrides) and differ from
    the other runs of their cell only in what the compared factor's levels declare (:mod:`pcpo_eval.stats.comparability`)."""
    if not any(r.run_dir for r in runs):
        return
    declared = {k for ov in factors.get(compare, {}).values() for k in ov}
    problems += existing_run_problems(runs, compare, declared, lambda r: _cell_of(r, compare), _run_settings,
                                      lambda r: file_settings(r.overrides, read_now=True))


def _check_edited_configs(runs: Sequence[RunSpec], problems: list[str]) -> None:
    """An existing run's ``config.yaml`` must say what its checkpoints were trained with
    (:func:`pcpo_eval.stats.comparability.edited_settings`): every other check reads it."""
    from pcpo_eval.train.checkpoints import load_run_config, trained_config

    for r in runs:
        if r.run_dir is None:
            continue
        try:
            cfg = load_run_config(r.run_dir)
        except UserError:
            continue  # reported by _run_models
        problems += edited_settings(r.name, cfg, trained_config(r.run_dir))


def _check_one_reward(runs: Sequence[RunSpec], compare: str, problems: list[str]) -> None:
    """Every run of a comparison cell, trained or existing, on one reward (:func:`pcpo_eval.stats.comparability.reward_problems`)."""
    by_cell: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for r in runs:
        if (cfg := _run_settings(r)) is not None:
            by_cell.setdefault(_cell_of(r, compare), []).append((r.levels.get(compare, ""), r.name, cfg))
    for cell, members in by_cell.items():
        problems += reward_problems(cell, members, compare)


def recorded_input_problems(spec: StudySpec, run_dir_of: Callable[[RunSpec], Path]) -> list[str]:
    """Runs this study trained, or began, on files that held other contents than its other runs of one cell
    read (a prompt file edited between two ``study`` calls): each such run's ``inputs.json`` (what it read)
    against the others' records, or against the file as it is now for a run still to be trained.

    :func:`load_spec` compares what the spec names; only the runner knows the output folder, where the
    study's own runs record what they read. A cell none of whose runs has a record yet is not compared.
    """
    from pcpo_eval.rundir import inputs_path
    from pcpo_eval.stats.comparability import cell_problems

    factors, _ = _parse_design(spec.raw.get("design"), Path(spec.source).parent, [])
    compare = spec.compare_factor
    declared = {k for ov in factors.get(compare, {}).values() for k in ov}
    by_cell: dict[str, list[tuple[str, str, dict[str, Any], bool]]] = {}
    for r in spec.runs:
        recorded = r.train is not None and inputs_path(run_dir_of(r)).is_file()
        cfg = file_settings(r.train.to_dict(), read_inputs(run_dir_of(r))) if recorded else _run_settings(r)
        if cfg is not None:
            by_cell.setdefault(_cell_of(r, compare), []).append((r.levels.get(compare, ""), r.name, cfg, recorded))
    hint = ("; this study's runs record what they read in their inputs.json under the output folder's runs/: "
            "restore the file they read, or remove those runs to train them again")
    return [p + hint for cell, members in by_cell.items() for p in cell_problems(cell, members, declared, compare)]


def _check_epoch_units(runs: Sequence[RunSpec], compare: _Compare, top: dict[str, Any],
                       problems: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """Arms of a cell that differ in images sampled or optimizer steps per epoch (trained and existing runs,
    :func:`~pcpo_eval.stats.comparability.epoch_unit_problems`): spec problems, or with
    ``unequal_epochs_ok: true`` the caveats the verdict prints; and the caveat for runs whose settings could
    not be compared (:func:`~pcpo_eval.stats.comparability.unchecked_settings`)."""
    ok = top.get("unequal_epochs_ok", False)
    if not isinstance(ok, bool):
        problems.append(f"unequal_epochs_ok must be true or false, got {ok!r}")
        ok = False
    by_cell: dict[str, list[tuple[str, str, dict[str, Any]]]] = {}
    for r in runs:
        arm = r.levels.get(compare.factor, "")
        if arm in (compare.baseline, compare.pcpo) and (cfg := _run_settings(r)) is not None:
            if r.run_dir is not None and (logged := logged_images_per_epoch(r.run_dir)) is not None:
                cfg = {**cfg, IMAGES_LOGGED: logged}  # over all its processes (a study trains on one)
            cell = _cell_of(r, compare.factor)
            by_cell.setdefault(cell, []).append((arm, r.name, cfg))
    found = [t for cell, members in by_cell.items()
             for t in epoch_unit_problems(cell, members, compare.baseline, compare.pcpo, compare.factor)]
    unchecked = {name: miss for members in by_cell.values() for name, miss in unchecked_settings(members).items()}
    said = (unchecked_text(unchecked),) if unchecked else ()
    if not ok:
        problems += found
        return (), said
    return tuple(t.split("): ", 1)[0] + ")" for t in found), said


def _parse_targets(top: dict[str, Any], runs: Sequence[RunSpec], problems: list[str]) -> tuple[list[float], float, int]:
    """``targets``, ``select_target`` (default: the last target) and ``window``; existing runs must reach them."""
    window = top.get("window", SMOOTHING_WINDOW)
    if isinstance(window, bool) or not isinstance(window, int) or window < 1:  # YAML's `on` is True, not 1
        problems.append(f"window must be a positive integer (got {window!r})")
        window = SMOOTHING_WINDOW
    targets_raw = top.get("targets")
    if not isinstance(targets_raw, list) or not targets_raw:
        problems.append("targets must be a non-empty list of reward levels, e.g. targets: [6.6, 6.9]")
        targets_raw = []
    targets = _finite_list("target", targets_raw, problems)
    sel = top.get("select_target", targets[-1] if targets else None)
    select_target = (_finite_list("select_target", [sel], problems) or [float("nan")])[0] if sel is not None \
        else float("nan")
    if runs and all(r.run_dir for r in runs):
        problems += unreachable_targets([r.run_dir for r in runs], [*targets, select_target], window)
    return targets, select_target, int(window)


def _finite_list(key: str, values: Any, problems: list[str]) -> list[float]:
    """Finite numbers of a spec list (NaN / inf / non-numbers are problems, reported before any work)."""
    out = []
    for t in values if isinstance(values, list) else []:
        try:
            x = float(t)
        except (TypeError, ValueError):
            problems.append(f"{key} {t!r} is not a number")
            continue
        if isinstance(t, bool) or x != x or x in (float("inf"), float("-inf")):
            problems.append(f"{key} {t!r} is not a finite number")
            continue
        out.append(x)
    return out


#: what ``primary:`` may name (a quantity, or a speed-up kind / one speed-up row ``speedup_gain:<g>``)
PRIMARY_CHOICES = ("paired_gain", "final_reward", "auc", "speedup_gain", "speedup_reward")


def _parse_endpoints(top: dict[str, Any], paired_control: bool, targets: Sequence[float],
                     problems: list[str]) -> tuple[tuple[float, ...], tuple[str, ...]]:
    """``gain_targets`` (levels of reward - control, > 0) and ``primary`` (the verdict's primary endpoints).

    A primary that names one speed-up row (``speedup_gain:0.05``) must name a listed target: a level that
    is not in ``gain_targets`` / ``targets`` has no row, and the study would have no primary endpoint."""
    raw = top.get("gain_targets", [])
    if not isinstance(raw, list):
        problems.append(f"gain_targets must be a list of gain levels (reward - paired control), e.g. [0.03, 0.06]; got {raw!r}")
    gains = _finite_list("gain target", raw, problems)
    problems += [f"gain_targets: {g:g} must be > 0 (the untrained control has gain 0)" for g in gains if g <= 0]
    if gains and not paired_control:
        problems.append("gain_targets need the paired untrained control; remove paired_control: false")
    prim = top.get("primary", [])
    prim = [prim] if isinstance(prim, str) else prim
    if not isinstance(prim, list) or not all(isinstance(p, str) for p in prim):
        problems.append(f"primary must be a list of endpoint names ({', '.join(PRIMARY_CHOICES)}); got {prim!r}")
        prim = []
    names = []
    for q in prim:
        if q.split(":", 1)[0] not in PRIMARY_CHOICES:
            problems.append(f"primary: unknown endpoint {q!r}; choose from {', '.join(PRIMARY_CHOICES)} "
                            "(or one speed-up row, e.g. speedup_gain:0.05)")
        elif q.split(":", 1)[0] in ("paired_gain", "speedup_gain") and not paired_control:
            problems.append(f"primary: {q} needs the paired untrained control; remove paired_control: false")
        elif ":" in q:
            q = _primary_row_name(q, gains, targets, problems)
        names.append(q)
    return tuple(gains), tuple(names)


def _primary_row_name(q: str, gains: Sequence[float], targets: Sequence[float], problems: list[str]) -> str:
    """A ``speedup_<kind>:<level>`` primary as its row is named (``speedup_gain:0.060`` and ``6e-2`` name
    the row ``speedup_gain:0.06``); a level that is not a listed target is a problem (no row would have it)."""
    kind, level = q.split(":", 1)
    if kind not in ("speedup_gain", "speedup_reward"):
        return q
    listed, key = (gains, "gain_targets") if kind == "speedup_gain" else (targets, "targets")
    try:
        hit = [x for x in listed if math.isclose(float(level), float(x), rel_tol=1e-9, abs_tol=1e-12)]
    except ValueError:
        problems.append(f"primary: {q!r} names no number after ':'; e.g. {kind}:{listed[0] if listed else 0.05:g}")
        return q
    if hit:
        return quantity_name(kind.removeprefix("speedup_"), hit[0])
    choices = ", ".join(f"{kind}:{x:g}" for x in listed) or f"none: {key} is empty"
    problems.append(f"primary: {q} names no row: {level} is not in {key} ({choices}); add it to {key} or name a "
                    "listed one")
    return q


def _run_models(runs: Sequence[RunSpec], problems: list[str]) -> list[str | None]:
    """Each run's base model spec: its resolved train config's, or an existing run's saved config's."""
    from pcpo_eval.train.checkpoints import load_run_config

    models: list[str | None] = []
    for r in runs:
        model = r.train.model if r.train is not None else None
        if r.run_dir is not None:
            try:
                model = str(load_run_config(r.run_dir).get("model", "toy"))
            except UserError as exc:
                problems.append(f"runs: {exc}")
        models.append(model)
    return models


def _eval_sampler(models: Sequence[str | None], problems: list[str]) -> str | None:
    """THE sampler (:func:`pcpo_eval.samplers.resolve_sampler`) of the runs' models; None if unknown or mixed."""
    from pcpo_eval.models.registry import prediction_of
    from pcpo_eval.samplers import resolve_sampler

    samplers: dict[str, list[str]] = {}
    for m in dict.fromkeys(m for m in models if m is not None):
        try:
            samplers.setdefault(resolve_sampler("auto", prediction_of(m)), []).append(m)
        except UserError as exc:
            problems.append(f"model {m!r}: {exc}")
    if len(samplers) > 1:
        problems.append("the runs' models need different samplers ("
                        + "; ".join(f"{s}: {', '.join(ms)}" for s, ms in samplers.items())
                        + "); one eval schedule cannot serve them all, so study one model family per spec")
        return None
    return next(iter(samplers), None)


def _parse_eval(section: Any, base: Path, models: Sequence[str | None], problems: list[str]) -> EvalSpec:
    """``eval:`` -> EvalSpec; seeds parsed, the schedule checked against the runs' sampler
    (:data:`pcpo_eval.samplers.SCHEDULES`) and defaulted to that sampler's first schedule."""
    from pcpo_eval.generate.plan import check_sampling_options, parse_seeds
    from pcpo_eval.samplers import SCHEDULES

    ev = _section("eval", section, _fields(EvalSpec), problems)
    spec = EvalSpec()
    try:
        spec = EvalSpec(**{**ev, "seeds": str(ev.get("seeds", EvalSpec.seeds)),
                           "prompts": _prompt_source(base, str(ev.get("prompts", "toy")))})
        parse_seeds(spec.seeds)
        check_sampling_options(batch_size=spec.batch_size, steps=spec.steps, cfg=spec.cfg, eta=spec.eta,
                               max_prompts=spec.max_prompts, section="eval")
        if re.fullmatch(r"auto|cpu|cuda(:\d+)?", str(spec.device).strip().lower()) is None:
            problems.append(f"eval: device={spec.device!r} (choose auto, cpu, cuda or cuda:N)")
    except (TypeError, UserError) as exc:
        problems.append(f"eval: {exc}")
    sampler = _eval_sampler(models, problems)
    if sampler is None:
        return spec
    choices = SCHEDULES[sampler]
    schedule = choices[0] if spec.sigma_schedule is None else str(spec.sigma_schedule)
    if schedule not in choices:
        model = next(m for m in models if m is not None)
        problems.append(f"eval.sigma_schedule {schedule!r} does not fit the {sampler} sampler of model {model!r} "
                        f"(choose {', '.join(choices)}; unset = {choices[0]})")
    return dataclasses.replace(spec, sigma_schedule=schedule)


def _parse_metrics(names: Any, options: Any, problems: list[str]) -> tuple[tuple[str, ...], int, int]:
    """``metrics: [...]`` and ``metric_options: {batch_size, is_splits}``."""
    if names is not None and not isinstance(names, list):
        problems.append(f"metrics must be a list, e.g. [fid, fd_dinov2, is, lpips] (got {names!r})")
        names = []
    metrics = tuple(str(m) for m in (names or []))
    if not metrics:
        problems.append("metrics must list at least one metric, e.g. [fid, fd_dinov2, is, lpips]")
    for m in metrics:
        if m not in METRICS:
            problems.append(f"unknown metric {m!r} (choose from {', '.join(METRICS)})")
    mo = _section("metric_options", options, _METRIC_OPTION_KEYS, problems)
    sizes = {"batch_size": 32, "is_splits": 10}
    for key in sizes:
        v = mo.get(key, sizes[key])
        if isinstance(v, bool) or not isinstance(v, int) or v < 1:  # YAML's `yes` / `on` are True, not 1
            problems.append(f"metric_options.{key} must be a positive integer (got {v!r})")
        else:
            sizes[key] = v
    return metrics, sizes["batch_size"], sizes["is_splits"]


def _metric_list(key: str, value: Any, metrics: Sequence[str], problems: list[str]) -> tuple[str, ...]:
    """A list of metric names that must all be in ``metrics:``."""
    if value is None:
        return ()
    if not isinstance(value, list):
        problems.append(f"{key} must be a list of metric names, e.g. {key}: [{metrics[0] if metrics else 'fid'}]")
        return ()
    names = tuple(str(m) for m in value)
    for m in names:
        if m not in metrics:
            problems.append(f"{key} names {m!r}, which is not in metrics ({', '.join(metrics)})")
    return names


def _parse_metric_lists(top: dict[str, Any], metrics: Sequence[str],
                        problems: list[str]) -> tuple[tuple[str, ...], tuple[str, ...]]:
    """``overall_only`` (no per-prompt values, no LMM) and ``per_prompt_rank_deficient_ok`` (FD metrics only)."""
    overall = _metric_list("overall_only", top.get("overall_only"), metrics, problems)
    ok = _metric_list("per_prompt_rank_deficient_ok", top.get("per_prompt_rank_deficient_ok"), metrics, problems)
    for m in ok:
        if m in METRICS and not METRICS[m].needs_reference:
            problems.append(f"per_prompt_rank_deficient_ok names {m!r}: only Frechet distances (fid, fd_dinov2, "
                            "fd_toy) fit a covariance per prompt; remove it")
        if m in overall:
            problems.append(f"{m!r} is both overall_only and per_prompt_rank_deficient_ok; keep one")
    if metrics and not [m for m in metrics if m not in overall]:
        problems.append("every metric is overall_only; the LMM needs at least one per-prompt metric")
    return overall, ok


def _check_per_prompt(metrics: Sequence[str], overall: Sequence[str], ok: Sequence[str], eval_spec: EvalSpec,
                      is_splits: int, problems: list[str]) -> None:
    """Per-prompt metrics must be defined at the eval set's images per prompt (:func:`per_prompt_problem`)."""
    from pcpo_eval.generate.plan import parse_seeds
    from pcpo_eval.prompts import load_prompts

    try:
        n = len(parse_seeds(eval_spec.seeds))
    except UserError:
        return  # reported by _parse_eval
    try:
        total = n * len(load_prompts(eval_spec.prompts, limit=eval_spec.max_prompts))
    except (UserError, OSError):
        total = None  # an absent prompt file is reported by _check_weights
    for m in metrics:
        if total is not None and m in METRICS and METRICS[m].kind == "is" and total < is_splits:
            problems.append(f"{m} of a whole set with {is_splits} splits needs >= {is_splits} images, an eval set has "
                            f"{total} (prompts x seeds); raise eval.seeds / eval.max_prompts or lower "
                            "metric_options.is_splits")
    for m in metrics:
        if m in overall or m in ok or m not in METRICS:
            continue
        msg = per_prompt_problem(m, n, is_splits=is_splits)
        if msg is None:
            continue
        need = METRICS[m].min_images_per_prompt(is_splits=is_splits)
        opt_in = f", or per_prompt_rank_deficient_ok: [{m}] (the paper's per-prompt FID protocol)" \
            if METRICS[m].needs_reference else ""
        problems.append(f"{msg} (in the spec: eval.seeds: {need}, or overall_only: [{m}]{opt_in})")


def _seed_list(name: str, value: Any, problems: list[str]) -> tuple[int, ...] | None:
    """A non-empty list of distinct integers >= 0; None after a problem."""
    ok = isinstance(value, list) and value and all(isinstance(s, int) and not isinstance(s, bool) and s >= 0
                                                   for s in value)
    if not ok:
        problems.append(f"{name} must be a non-empty list of training seeds (integers >= 0), e.g. [0, 1, 2] "
                        f"(got {value!r})")
        return None
    if len(set(value)) != len(value):
        problems.append(f"{name} lists a seed twice ({value}); list each training seed once")
    return tuple(dict.fromkeys(int(s) for s in value))


def _parse_seeds(section: Any, levels: Sequence[str], train_config: str | None, train_overrides: dict[str, Any],
                 problems: list[str]) -> dict[str, tuple[int, ...]]:
    """Training seeds per level of the compared factor.

    ``seeds: [0, 1, 2]`` (every arm), or ``seeds: {A: [0, 1, 2], B: [3, 4, 5]}`` (per arm: an A/A
    study of one algorithm needs different seeds in its two arms, else the runs are identical).
    Default: the train config's one seed.
    """
    if section is None:
        cfg = _read_train_file(train_config, []) or {}  # an unreadable file is reported by _parse_train
        seed = train_overrides.get("seed", cfg.get("seed", TrainConfig.seed))
        one = (int(seed),) if isinstance(seed, int) and not isinstance(seed, bool) else (TrainConfig.seed,)
        return {lv: one for lv in levels}
    if not isinstance(section, dict):
        one = _seed_list("seeds", section, problems) or (TrainConfig.seed,)
        return {lv: one for lv in levels}
    keys = {str(k): v for k, v in section.items()}
    if levels and set(keys) != set(levels):
        problems.append(f"seeds per arm must give a list for each level of the compared factor ({', '.join(levels)}), "
                        f"got {', '.join(keys) or 'none'}")
    return {lv: _seed_list(f"seeds.{lv}", keys[lv], problems) or (TrainConfig.seed,) if lv in keys else
            (TrainConfig.seed,) for lv in levels}


def _check_study_keys(factors: Factors, train_overrides: dict[str, Any], seeds_given: bool,
                      problems: list[str]) -> None:
    """``seed`` / ``paired_control`` are set per run by the study (``seeds:``, ``paired_control:``)."""
    where = [("train.overrides", train_overrides)] + [(f"design.{f}.{lv}", ov) for f, lvs in factors.items()
                                                      for lv, ov in lvs.items()]
    for name, ov in where:
        if "paired_control" in ov:
            problems.append(f"{name} sets paired_control; set it once at the top of the spec (paired_control: false)")
        if "seed" in ov and (seeds_given or name != "train.overrides"):
            problems.append(f"{name} sets seed; list the training seeds at the top of the spec (seeds: [0, 1, 2])")


def _parse_options(top: dict[str, Any], problems: list[str]) -> _Options:
    """``parallel`` (runs trained at once), ``paired_control`` and ``select_epoch`` (final | EPOCH | null)."""
    parallel = top.get("parallel", 1)
    if isinstance(parallel, bool) or not isinstance(parallel, int) or parallel < 1:
        problems.append(f"parallel must be a positive integer (runs trained at once), got {parallel!r}")
        parallel = 1
    paired = top.get("paired_control", True)
    if not isinstance(paired, bool):
        problems.append(f"paired_control must be true or false, got {paired!r}")
        paired = True
    sel = top.get("select_epoch", "final")
    if not (sel is None or sel == "final" or isinstance(sel, dict)
            or (isinstance(sel, int) and not isinstance(sel, bool) and sel >= 1)):
        problems.append(f"select_epoch must be final, a positive epoch, a mapping of each arm to its epoch "
                        f"(explicit checkpoints) or null (no matched-epoch comparison), got {sel!r}")
        sel = "final"
    on = top.get("select_on", "train")
    if on not in MATCH_ON:
        problems.append(f"select_on must be train (training reward), eval (held-out validation reward) or gain "
                        f"(training reward minus the paired untrained control's), got {on!r}")
        on = "train"
    return _Options(int(parallel), paired, sel, on)


def _parse_lmm(section: Any, factors: Factors, problems: list[str]) -> LMMSpec:
    """``lmm: {formula, coding, alpha, adjust}``; the formula may name only per-prompt data columns."""
    spec = LMMSpec(**_section("lmm", section, _fields(LMMSpec), problems))
    fixed, groups, _ = parse_lmm_formula(spec.formula)
    if not groups:
        problems.append(f"lmm.formula {spec.formula!r} needs a random effect, e.g. + (1|prompt)")
    if not fixed.replace(" ", "").startswith("value~"):
        problems.append(f"lmm.formula {spec.formula!r} must model 'value' (the metric), e.g. value ~ algorithm * batch + (1|prompt)")
    columns = set(factors) | {"value", "prompt", "prompt_id", "run", "seed"}
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", spec.formula)) - {"C", "Sum", "Treatment", "I"}
    for n in sorted(names - columns):
        problems.append(f"lmm.formula names {n!r}, not a column of the per-prompt data ({', '.join(sorted(columns))})")
    if spec.coding not in ("treatment", "sum"):
        problems.append(f"lmm.coding {spec.coding!r} (choose treatment or sum)")
    if spec.adjust not in ("holm", "bh"):
        problems.append(f"lmm.adjust {spec.adjust!r} (choose holm or bh)")
    alpha = spec.alpha
    if isinstance(alpha, bool) or not isinstance(alpha, int | float) or not 0 < alpha < 1:
        problems.append(f"lmm.alpha {alpha!r} must be a number in (0, 1), e.g. 0.05")
    return spec


def _check_prompt_sources(cfgs: Sequence[TrainConfig], eval_prompts: str | None,
                          preferences: Sequence[PreferenceSpec], problems: list[str]) -> None:
    """Every prompt set the study reads: training, held-out validation, eval and preference prompts."""
    sources = [("training prompts", p) for p in sorted({c.prompts for c in cfgs})]
    sources += [("validation_prompts", p) for p in sorted({c.validation_prompts for c in cfgs if c.validation_prompts})]
    sources += [("eval.prompts", eval_prompts)] if eval_prompts else []
    sources += [(f"preference {p.name}".strip() + ".prompts", p.prompts) for p in preferences]
    for role, pset in dict.fromkeys(sources):
        if (msg := prompts_missing(role, pset)) is not None:
            problems.append(msg)


def _check_weights(runs: Sequence[RunSpec], metrics: Sequence[str], preferences: Sequence[PreferenceSpec],
                   problems: list[str], eval_prompts: str | None = None) -> None:
    """External assets: prompt sets (files or datasets), reward / metric backends, base models."""
    cfgs = [r.train for r in runs if r.train is not None]
    _check_prompt_sources(cfgs, eval_prompts, preferences, problems)
    from pcpo_eval.rewards import reward_parts

    # a weighted reward ({aesthetic: 0.7, hps: 0.3}) is a dict: compare rewards by their JSON text
    for rw, opts in sorted({(json.dumps(c.reward, sort_keys=True), json.dumps(c.reward_options, sort_keys=True))
                            for c in cfgs}):
        for name, _, options in reward_parts(json.loads(rw), json.loads(opts)):
            problems += [f"training reward {name}: {m}" for m in backend_missing(required_backends(name, options))]
    for m in sorted({c.model for c in cfgs}):
        if (msg := model_missing(m)) is not None:
            problems.append(msg)
    users: dict[str, list[str]] = {}  # one problem per absent backend, naming every metric that needs it
    for m in [*metrics, *(m for p in preferences for m in p.metrics)]:
        for b in (METRICS[m].backends if m in METRICS else ()):
            if m not in users.setdefault(b, []):
                users[b].append(m)
    for b, ms in users.items():
        problems += [f"metric(s) {', '.join(ms)}: {msg}" for msg in backend_missing([b])]


# ------------------------------------------------------------------------------------------------
# The spec
# ------------------------------------------------------------------------------------------------


def load_spec(path: str | Path, check_weights: bool = True) -> StudySpec:
    """Read and validate a study spec; raise ONE UserError listing every problem found.

    ``check_weights=False`` skips :func:`_check_weights` (weights, reward backends, external prompt files).
    """
    path = Path(path)
    data = read_yaml_mapping(path, "study spec", "see analysis/ for examples")
    base = path.parent.resolve()
    problems: list[str] = []
    top = _section("the spec", data, _TOP_KEYS, problems)
    train_config, train_overrides = _parse_train(top.get("train"), base, problems)
    factors, level_configs = _parse_design(top.get("design"), base, problems)
    compare = _parse_compare(top.get("compare"), factors, problems)
    seeds = _parse_seeds(top.get("seeds"), list(factors.get(compare.factor, {})), train_config, train_overrides,
                         problems)
    _check_study_keys(factors, train_overrides, "seeds" in top, problems)
    train_overrides = {k: v for k, v in train_overrides.items() if k not in _STUDY_KEYS}
    options = _parse_options(top, problems)
    existing = _parse_runs(top.get("runs"), factors, compare.factor, seeds, base, problems)
    runs = _expand_runs(factors, level_configs, train_config, train_overrides, compare.factor, seeds,
                        options.paired_control, existing, problems)
    _check_run_names(runs, problems)
    _check_identical_runs(runs, compare.factor, problems)
    _check_existing_settings(runs, factors, compare.factor, problems)
    _check_one_reward(runs, compare.factor, problems)
    _check_edited_configs(runs, problems)
    epoch_caveats, unchecked_caveats = _check_epoch_units(runs, compare, top, problems)
    targets, select_target, window = _parse_targets(top, runs, problems)
    gain_targets, primary = _parse_endpoints(top, options.paired_control, targets, problems)
    models = _run_models(runs, problems)
    eval_spec = _parse_eval(top.get("eval"), base, models, problems)
    metrics, metric_batch_size, is_splits = _parse_metrics(top.get("metrics"), top.get("metric_options"), problems)
    overall_only, rank_ok = _parse_metric_lists(top, metrics, problems)
    _check_per_prompt(metrics, overall_only, rank_ok, eval_spec, is_splits, problems)
    lmm = _parse_lmm(top.get("lmm"), factors, problems)
    levels = list(factors.get(compare.factor, {}))
    arm_of = lambda r: r.levels.get(compare.factor, "")  # noqa: E731
    if isinstance(options.select_epoch, dict):
        options = options._replace(select_epoch=parse_epoch_map("select_epoch", options.select_epoch, levels, runs,
                                                                arm_of, problems))
    elif isinstance(options.select_epoch, int):  # checked before any training (was: after it, by the select stage)
        problems += next(([f"select_epoch: {m}"] for r in runs if r.train is not None
                          and (m := saved_epoch_problem(r.name, r.train, options.select_epoch)) is not None), [])
    preferences = parse_preferences(top.get("preference"), lambda p: _prompt_source(base, p), levels, runs, arm_of,
                                    PREFERENCE_METRICS, problems)
    grids = parse_grids(top.get("grid"), levels, runs, arm_of, problems)
    problems += retention_problems(runs, arm_of, select_target, options.select_epoch, epoch_maps(preferences, grids))
    if options.select_on == "eval":
        no_val = [r.name for r in runs if r.train is not None and r.train.validation_every <= 0]
        if no_val:
            problems.append(f"select_on: eval needs the held-out validation reward, but {', '.join(no_val[:3])}"
                            f"{' ...' if len(no_val) > 3 else ''} train without it; set validation_every and "
                            "validation_prompts in train.overrides, or select_on: train")
    if options.select_on == "gain" and not options.paired_control:
        problems.append("select_on: gain matches on the gain over the paired untrained control, which the runs log "
                        "only with paired_control: true; set it, or select_on: train")
    n_spec_problems = len(problems)
    if check_weights:
        _check_weights(runs, metrics, preferences, problems, eval_spec.prompts)
    if len(problems) > n_spec_problems:  # missing weights / prompt sets: the CLI lists them one per line
        raise ProblemList(f"study spec {path} has {len(problems)} problem(s)", problems)
    if problems:
        raise UserError(f"study spec {path} has {len(problems)} problem(s): "
                        + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return StudySpec(
        name=str(top.get("name") or path.stem), description=str(top.get("description", "")),
        train_config=train_config, train_overrides=train_overrides,
        factors={f: tuple(v) for f, v in factors.items()}, runs=tuple(runs), base_model=str(models[0]),
        compare_factor=compare.factor, baseline=compare.baseline, pcpo=compare.pcpo, seeds=seeds,
        parallel=options.parallel, paired_control=options.paired_control, targets=tuple(targets),
        select_target=select_target, select_epoch=options.select_epoch, select_on=options.select_on,
        gain_targets=gain_targets, primary=primary,
        window=window, eval=eval_spec,
        metrics=metrics, overall_only=overall_only, per_prompt_rank_deficient_ok=rank_ok,
        metric_batch_size=metric_batch_size, is_splits=is_splits, lmm=lmm,
        preference=preferences[0] if preferences else None, grid=grids[0] if grids else GridSpec(),
        preferences=preferences, grids=grids, epoch_caveats=epoch_caveats, unchecked_caveats=unchecked_caveats,
        source=str(path.resolve()), raw=data,
    )
