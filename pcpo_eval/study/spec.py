"""The study spec: dataclasses, validation (:func:`load_spec`) that lists every problem at once.
"""


from __future__ import annotations

import dataclasses
import itertools
import re
from collections.abc import Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.metrics.base import METRIC_BACKENDS, PREFERENCE_METRICS
from pcpo_eval.stats.formula import parse_lmm_formula
from pcpo_eval.stats.speedup import unreachable_targets

STAGES = ("train", "select", "generate", "metrics", "stats", "report")
STATE_FILE = "study_state.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"


# ------------------------------------------------------------------------------------------------
# Spec dataclasses
# ------------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class EvalSpec:
    """Image sets for the quality metrics: the same prompts and seeds for every model.

    ``steps``/``cfg``/``eta`` default to the train config's sampling settings. Every set is sampled
    with DDIM's sigma schedule (``sigma_schedule``) so models differ only in their weights.
    """

    prompts: str = "toy"
    seeds: str = "8"
    max_prompts: int | None = None
    steps: int | None = None
    cfg: float | None = None
    eta: float | None = None
    sigma_schedule: str = "ddim"
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
class PreferenceSpec:
    """Preference scores of base and selected checkpoints on (unseen) prompts (paper Table 6)."""

    prompts: str
    seeds: str = "1"
    metrics: tuple[str, ...] = ("hps",)
    max_prompts: int | None = None
    max_prompt_tokens: int | None = None


@dataclass(frozen=True)
class GridSpec:
    """Image grids: the first ``prompts`` prompts x first ``seeds`` seeds of the eval set."""

    prompts: int = 4
    seeds: int = 4


@dataclass(frozen=True)
class RunSpec:
    """One cell of the design: its factor levels, config overrides, or an existing run dir."""

    name: str
    levels: dict[str, str]
    overrides: dict[str, Any]
    run_dir: str | None = None  #: existing run directory (not trained by the study)
    config: str | None = None  #: train config file (a level's ``config:`` key, else ``train.config``)


@dataclass(frozen=True)
class StudySpec:
    """A validated study (see :func:`load_spec` and the module docstring)."""

    name: str
    description: str
    train_config: str | None
    train_overrides: dict[str, Any]
    factors: dict[str, tuple[str, ...]]
    runs: tuple[RunSpec, ...]
    compare_factor: str
    baseline: str
    pcpo: str
    replicate: str | None
    targets: tuple[float, ...]
    select_target: float
    window: int
    eval: EvalSpec
    metrics: tuple[str, ...]
    metric_batch_size: int
    is_splits: int
    lmm: LMMSpec
    preference: PreferenceSpec | None
    grid: GridSpec
    source: str
    raw: dict[str, Any] = field(compare=False, repr=False, default_factory=dict)

    # derived -----------------------------------------------------------------------------
    @property
    def cell_factors(self) -> list[str]:
        """Factors that define a comparison cell (all but the compared one and the replicate)."""
        return [f for f in self.factors if f not in (self.compare_factor, self.replicate)]

    def cell_key(self, run: RunSpec) -> str:
        """Label of the run's comparison cell, e.g. ``batch=16`` (``all`` without cell factors)."""
        parts = [f"{f}={run.levels[f]}" for f in self.cell_factors]
        return ", ".join(parts) if parts else "all"

    def role(self, run: RunSpec) -> str:
        """``baseline``, ``pcpo`` or ``other`` (a third level of the compared factor)."""
        lv = run.levels[self.compare_factor]
        return "baseline" if lv == self.baseline else "pcpo" if lv == self.pcpo else "other"

    def to_dict(self) -> dict[str, Any]:
        """Resolved spec (JSON-able), saved as ``OUT/spec.resolved.json``."""
        return dataclasses.asdict(self) | {"raw": None}


_TOP_KEYS = {
    "name", "description", "train", "design", "runs", "compare", "replicate", "targets",
    "select_target", "window", "eval", "metrics", "metric_options", "lmm", "preference", "grid",
}  # fmt: skip
_TRAIN_KEYS = {"config", "overrides"}
_COMPARE_KEYS = {"factor", "baseline", "pcpo"}
_RUN_KEYS = {"levels", "run_dir", "overrides"}
_METRIC_OPTION_KEYS = {"batch_size", "is_splits"}


def _fields(cls: type) -> set[str]:
    return {f.name for f in dataclasses.fields(cls)}


def _safe_name(text: str) -> str:
    return re.sub(r"[^A-Za-z0-9._=-]+", "_", text).strip("_") or "run"


def _backend_missing(backends: Sequence[str]) -> list[str]:
    """Names of weights backends that cannot be located (with the locator's one-line hint)."""
    from pcpo_eval.weights.locate import status

    out = []
    for b in backends:
        st = status(b)
        if not st.found:
            out.append(st.error or f"{b} weights not found")
    return out


def _model_missing(model: str) -> str | None:
    """A problem string if a real base model's weights are absent (toy specs need nothing)."""
    kind, _, arg = str(model).partition(":")
    if kind != "sd1" or not arg:
        return None
    from pcpo_eval.weights.locate import hf_snapshot_file, locate

    if Path(arg).expanduser().is_dir() or hf_snapshot_file(arg, "model_index.json") is not None:
        return None
    try:
        locate("sd1")
        return None
    except UserError:
        return (f"base model {model!r}: no local diffusers folder or HF-cache snapshot of {arg} "
                "(set PCPO_SD1_PATH or see `pcpo-eval weights`)")


def _yaml_or_empty(path: str | None) -> dict[str, Any]:
    """A train config file's mapping ({} if unset, missing or malformed: reported elsewhere)."""
    if path is None or not Path(path).is_file():
        return {}
    try:
        data = yaml.safe_load(Path(path).read_text()) or {}
    except yaml.YAMLError:
        return {"__invalid_yaml__": path}
    return data if isinstance(data, dict) else {"__invalid_yaml__": path}


def _read_yaml(path: Path) -> dict[str, Any]:
    if not path.is_file():
        raise UserError(f"study spec {path} not found; see analysis/ for examples")
    try:
        data = yaml.safe_load(path.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"study spec {path} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"study spec {path} must be a mapping of keys to values")
    return data


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


def load_spec(path: str | Path, check_weights: bool = True) -> StudySpec:
    """Read and validate a study spec; raise ONE UserError listing every problem found."""
    path = Path(path)
    data = _read_yaml(path)
    problems: list[str] = []
    base = path.parent.resolve()

    def unknown(section: str, d: Any, allowed: set[str]) -> dict[str, Any]:
        if d is None:
            return {}
        if not isinstance(d, dict):
            problems.append(f"{section} must be a mapping")
            return {}
        bad = sorted(set(map(str, d)) - allowed)
        if bad:
            problems.append(f"unknown key(s) {', '.join(bad)} in {section} (valid: {', '.join(sorted(allowed))})")
        return {str(k): v for k, v in d.items() if str(k) in allowed}

    top = unknown("the spec", data, _TOP_KEYS)
    name = str(top.get("name") or path.stem)

    # -- training ------------------------------------------------------------------------------
    train = unknown("train", top.get("train"), _TRAIN_KEYS)
    train_config = _resolve_path(base, train.get("config"))
    train_overrides = train.get("overrides") or {}
    if not isinstance(train_overrides, dict):
        problems.append("train.overrides must be a mapping of config keys to values")
        train_overrides = {}
    if train_config is not None and not Path(train_config).is_file():
        problems.append(f"train.config {train.get('config')} not found (paths are relative to the spec or the working directory)")

    # -- design --------------------------------------------------------------------------------
    design = top.get("design")
    factors: dict[str, dict[str, dict[str, Any]]] = {}
    level_configs: dict[tuple[str, str], str] = {}
    if not isinstance(design, dict) or not design:
        problems.append("design must map each factor to its levels, e.g. design: {algorithm: {DDPO: {objective: ppo_clip}, PCPO: {objective: pcpo}}}")
    else:
        for fac, levels in design.items():
            fac = str(fac)
            if not re.fullmatch(r"[A-Za-z_][A-Za-z0-9_]*", fac) or fac in ("value", "prompt", "prompt_id", "run"):
                problems.append(f"design factor {fac!r}: use an identifier other than value/prompt/prompt_id/run")
                continue
            if isinstance(levels, list):
                levels = {str(v): {} for v in levels}
            if not isinstance(levels, dict) or not levels:
                problems.append(f"design.{fac} must map each level to its config overrides (or list the levels)")
                continue
            factors[fac] = {}
            for lv, ov in levels.items():
                if ov is None:
                    ov = {}
                if not isinstance(ov, dict):
                    problems.append(f"design.{fac}.{lv} must be a mapping of config overrides")
                    ov = {}
                ov = dict(ov)
                if "config" in ov:  # a level may switch the train config file (e.g. paper setup 1 vs 2)
                    cpath = _resolve_path(base, str(ov.pop("config")))
                    level_configs[(fac, str(lv))] = cpath
                    if not Path(cpath).is_file():
                        problems.append(f"design.{fac}.{lv}.config {cpath} not found")
                factors[fac][str(lv)] = ov

    # -- comparison ----------------------------------------------------------------------------
    cmp_ = unknown("compare", top.get("compare"), _COMPARE_KEYS)
    compare_factor = str(cmp_.get("factor", "algorithm"))
    if factors and compare_factor not in factors:
        problems.append(f"compare.factor {compare_factor!r} is not a design factor ({', '.join(factors)})")
    levels_c = list(factors.get(compare_factor, {}))
    baseline = str(cmp_.get("baseline", levels_c[0] if levels_c else ""))
    pcpo = str(cmp_.get("pcpo", levels_c[1] if len(levels_c) > 1 else ""))
    if levels_c:
        for role, lv in (("baseline", baseline), ("pcpo", pcpo)):
            if lv not in levels_c:
                problems.append(f"compare.{role} {lv!r} is not a level of {compare_factor} ({', '.join(levels_c)})")
        if baseline in levels_c and sorted(levels_c)[0] != baseline:
            problems.append(f"compare.baseline {baseline!r} must sort first among {compare_factor}'s levels "
                            f"(treatment coding's reference level); rename the levels")
    replicate = top.get("replicate")
    if replicate is not None:
        replicate = str(replicate)
        if factors and replicate not in factors:
            problems.append(f"replicate {replicate!r} is not a design factor ({', '.join(factors)})")
        if replicate == compare_factor:
            problems.append("replicate must differ from compare.factor")

    # -- runs ----------------------------------------------------------------------------------
    existing: dict[tuple[str, ...], str] = {}
    for i, r in enumerate(top.get("runs") or []):
        r = unknown(f"runs[{i}]", r, _RUN_KEYS)
        lv = {str(k): str(v) for k, v in (r.get("levels") or {}).items()}
        if factors and set(lv) != set(factors):
            problems.append(f"runs[{i}].levels must give a level for each factor ({', '.join(factors)})")
            continue
        bad = [f"{k}={v}" for k, v in lv.items() if k in factors and v not in factors[k]]
        if bad:
            problems.append(f"runs[{i}].levels {', '.join(bad)} not in the design")
            continue
        rd = _resolve_path(base, r.get("run_dir"))
        if rd is None:
            problems.append(f"runs[{i}] needs run_dir (an existing run directory)")
            continue
        rdp = Path(rd)
        if not (rdp / "log.parquet").is_file() or not (rdp / "checkpoints").is_dir():
            problems.append(f"runs[{i}].run_dir {r.get('run_dir')}: missing run (needs log.parquet and checkpoints/)")
            continue
        existing[tuple(lv[f] for f in factors)] = rd

    runs: list[RunSpec] = []
    if factors:
        for combo in itertools.product(*[list(v) for v in factors.values()]):
            levels = dict(zip(factors, combo, strict=True))
            rname = _safe_name("__".join(f"{f}-{lv}" for f, lv in levels.items()))
            overrides: dict[str, Any] = {}
            cfg_file = train_config
            for f, lv in levels.items():
                overrides.update(factors[f][lv])
                cfg_file = level_configs.get((f, lv), cfg_file)
            runs.append(RunSpec(rname, levels, overrides, existing.get(combo), cfg_file))
        to_train = [r for r in runs if r.run_dir is None]
        run_cfgs = {r.name: {**_yaml_or_empty(r.config), **train_overrides, **r.overrides} for r in runs}
        for r in to_train:
            cfg = run_cfgs[r.name]
            try:
                from pcpo_eval.train.config import config_from_dict

                config_from_dict(cfg)
            except UserError as exc:
                problems.append(f"run {r.name}: {exc}")
        if check_weights:
            rewards = {str(run_cfgs[r.name].get("reward", "jpeg_compressibility")) for r in to_train}
            for pset in sorted({str(run_cfgs[r.name].get("prompts", "toy")) for r in to_train}):
                if Path(pset).suffix and not Path(pset).is_file():
                    problems.append(f"training prompt file {pset} not found")
            for rw in sorted(rewards):
                problems += [f"training reward {rw}: {m}" for m in _backend_missing(METRIC_BACKENDS.get(rw, ()))]
            models = {str(run_cfgs[r.name].get("model", "toy")) for r in to_train}
            for m in sorted(models):
                if (msg := _model_missing(m)) is not None:
                    problems.append(msg)

    # -- targets -------------------------------------------------------------------------------
    window = top.get("window", 5)
    if not isinstance(window, int) or window < 1:
        problems.append(f"window must be a positive integer (got {window!r})")
        window = 5
    targets_raw = top.get("targets")
    if not isinstance(targets_raw, list) or not targets_raw:
        problems.append("targets must be a non-empty list of reward levels, e.g. targets: [6.6, 6.9]")
        targets_raw = []
    targets: list[float] = []
    for t in targets_raw:
        try:
            targets.append(float(t))
        except (TypeError, ValueError):
            problems.append(f"target {t!r} is not a number")
    sel = top.get("select_target", targets[-1] if targets else None)
    try:
        select_target = float(sel) if sel is not None else float("nan")
    except (TypeError, ValueError):
        problems.append(f"select_target {sel!r} is not a number")
        select_target = float("nan")
    if runs and all(r.run_dir for r in runs):
        problems += unreachable_targets([r.run_dir for r in runs], [*targets, select_target], window)

    # -- evaluation ----------------------------------------------------------------------------
    ev = unknown("eval", top.get("eval"), _fields(EvalSpec))
    eval_spec = EvalSpec()
    try:
        eval_spec = EvalSpec(**{**ev, "seeds": str(ev.get("seeds", EvalSpec.seeds)),
                                "prompts": _resolve_path(base, str(ev.get("prompts", "toy"))) if
                                Path(str(ev.get("prompts", "toy"))).suffix else str(ev.get("prompts", "toy"))})
        from pcpo_eval.generate.plan import parse_seeds

        parse_seeds(eval_spec.seeds)
    except (TypeError, UserError) as exc:
        problems.append(f"eval: {exc}")
    if eval_spec.sigma_schedule not in ("ddim", "pcpo"):
        problems.append(f"eval.sigma_schedule {eval_spec.sigma_schedule!r} (choose ddim or pcpo)")
    metrics = [str(m) for m in (top.get("metrics") or [])]
    if not metrics:
        problems.append("metrics must list at least one metric, e.g. [fid, fd_dinov2, is, lpips]")
    for m in metrics:
        if m not in METRIC_BACKENDS:
            problems.append(f"unknown metric {m!r} (choose from {', '.join(METRIC_BACKENDS)})")
    pref_metrics = [str(m) for m in ((top.get("preference") or {}).get("metrics") or [])] if isinstance(
        top.get("preference"), dict) else []
    if check_weights:  # one problem per absent backend, naming every metric that needs it
        users: dict[str, list[str]] = {}
        for m in [*metrics, *pref_metrics]:
            for b in METRIC_BACKENDS.get(m, ()):
                if m not in users.setdefault(b, []):
                    users[b].append(m)
        for b, ms in users.items():
            problems += [f"metric(s) {', '.join(ms)}: {msg}" for msg in _backend_missing([b])]
    mo = unknown("metric_options", top.get("metric_options"), _METRIC_OPTION_KEYS)

    # -- statistics ----------------------------------------------------------------------------
    lm = unknown("lmm", top.get("lmm"), _fields(LMMSpec))
    lmm_spec = LMMSpec(**lm)
    fixed, groups, _ = parse_lmm_formula(lmm_spec.formula)
    if not groups:
        problems.append(f"lmm.formula {lmm_spec.formula!r} needs a random effect, e.g. + (1|prompt)")
    if not fixed.replace(" ", "").startswith("value~"):
        problems.append(f"lmm.formula {lmm_spec.formula!r} must model 'value' (the metric), e.g. value ~ algorithm * batch + (1|prompt)")
    columns = set(factors) | {"value", "prompt", "prompt_id"}
    names = set(re.findall(r"[A-Za-z_][A-Za-z0-9_]*", lmm_spec.formula)) - {"C", "Sum", "Treatment", "I"}
    for n in sorted(names - columns):
        problems.append(f"lmm.formula names {n!r}, not a column of the per-prompt data ({', '.join(sorted(columns))})")
    if lmm_spec.coding not in ("treatment", "sum"):
        problems.append(f"lmm.coding {lmm_spec.coding!r} (choose treatment or sum)")
    if lmm_spec.adjust not in ("holm", "bh"):
        problems.append(f"lmm.adjust {lmm_spec.adjust!r} (choose holm or bh)")

    pref_spec = None
    if top.get("preference") is not None:
        pr = unknown("preference", top.get("preference"), _fields(PreferenceSpec))
        pm = tuple(str(m) for m in (pr.get("metrics") or ()))
        for m in pm:
            if m not in PREFERENCE_METRICS:
                problems.append(f"preference metric {m!r} (choose from {', '.join(PREFERENCE_METRICS)})")
        if "prompts" not in pr:
            problems.append("preference.prompts is required (a prompt set name or file)")
        else:
            p = str(pr["prompts"])
            if Path(p).suffix and not Path(_resolve_path(base, p) or p).is_file():
                problems.append(f"preference.prompts file {p} not found")
            pref_spec = PreferenceSpec(**{**pr, "metrics": pm or ("hps",), "seeds": str(pr.get("seeds", "1")),
                                          "prompts": _resolve_path(base, p) if Path(p).suffix else p})
    gr = unknown("grid", top.get("grid"), _fields(GridSpec))

    if problems:
        raise UserError(f"study spec {path} has {len(problems)} problem(s): "
                        + "; ".join(f"({i}) {p}" for i, p in enumerate(problems, 1)))
    return StudySpec(
        name=name,
        description=str(top.get("description", "")),
        train_config=train_config,
        train_overrides=dict(train_overrides),
        factors={f: tuple(v) for f, v in factors.items()},
        runs=tuple(runs),
        compare_factor=compare_factor,
        baseline=baseline,
        pcpo=pcpo,
        replicate=replicate,
        targets=tuple(targets),
        select_target=select_target,
        window=int(window),
        eval=eval_spec,
        metrics=tuple(metrics),
        metric_batch_size=int(mo.get("batch_size", 32)),
        is_splits=int(mo.get("is_splits", 10)),
        lmm=lmm_spec,
        preference=pref_spec,
        grid=GridSpec(**gr),
        source=str(path.resolve()),
        raw=data,
    )
