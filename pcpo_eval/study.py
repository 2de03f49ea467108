"""One command from an experiment spec to a report: ``pcpo-eval study STUDY.yaml [--out DIR]``.

A study is the paper's evaluation protocol (Sec. 4, App. "Evaluation Details") as data:

1. **train**     every cell of a factorial design (e.g. algorithm x batch size x seed) is a run:
                 the study's train config plus the cell's overrides, trained with
                 :func:`pcpo_eval.trainer.train` into ``OUT/runs/<run>``, or an existing run
                 directory. Finished runs are skipped, interrupted ones resumed (``--resume``).
                 Afterwards every reward target must be reached by at least one run.
2. **select**    reward-matched checkpoint per run at ``select_target``
                 (:func:`pcpo_eval.stats.select_checkpoints`, smoothed reward, window 5).
3. **generate**  seed-controlled image sets (:func:`pcpo_eval.generate.generate_set`) of the base
                 model and of each selected checkpoint, same prompts and seeds
                 (``OUT/sets/base``, ``OUT/sets/<run>/epoch_NNNN``); optional preference sets on
                 unseen prompts. The generator itself skips finished images.
4. **metrics**   per-prompt and overall metrics of every set against the base set
                 (:func:`pcpo_eval.metrics.workers.run_metrics`) into ``OUT/metrics/...``.
5. **stats**     speed-up tables (paper Table 1/5), raw scores per condition (Table 2) with
                 simple-effect significance, one LMM per metric (Tables 3-4; e.g.
                 ``value ~ algorithm * batch + (1|prompt)``) with Holm/BH across metrics, training
                 traces, the credit figure: ``OUT/results.json`` + ``OUT/figures/``.
6. **report**    ``OUT/report.html`` (:mod:`pcpo_eval.report.html`), formatting ``results.json``.

Every stage skips finished work (``OUT/study_state.json`` holds a fingerprint of each stage's inputs),
so re-running the same command after a crash continues where it stopped. A failing stage is
named in the error and everything written before it is kept.

Spec validation (:func:`load_spec`) collects *every* problem (unknown keys, missing run
directories, bad levels, unknown metrics, absent weights of metrics / rewards / models, targets no
existing run reaches) into one :class:`~pcpo_eval.errors.UserError` before any work starts;
targets of runs still to be trained are checked right after the train stage.
"""

from __future__ import annotations

import dataclasses
import hashlib
import itertools
import json
import re
import shutil
import time
import traceback
from collections.abc import Callable, Sequence
from dataclasses import dataclass, field
from pathlib import Path
from typing import Any

import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write_json, atomic_write_text, sha256_file

STAGES = ("train", "select", "generate", "metrics", "stats", "report")
STATE_FILE = "study_state.json"
RESULTS_FILE = "results.json"
REPORT_FILE = "report.html"

#: metric name -> weights backends (pcpo_eval.weights) it needs; toy metrics ship their weights.
METRIC_BACKENDS: dict[str, tuple[str, ...]] = {
    "fid": ("inception",),
    "is": ("inception",),
    "fd_dinov2": ("dinov2",),
    "lpips": ("lpips_alex",),
    "fd_toy": (),
    "is_toy": (),
    "lpips_toy": (),
    "hps": ("hps",),
    "pickscore": ("pickscore", "pickscore_processor"),
    "imagereward": ("imagereward", "imagereward_med_config", "bert_base_uncased"),
    "clipscore": ("clipscore",),
    "aesthetic": ("aesthetic", "clip_vit_l14"),
}
#: preference metrics (scores of the images alone; no reference set needed)
PREFERENCE_METRICS = ("hps", "pickscore", "imagereward", "clipscore", "aesthetic")
#: display names in the report's tables (paper style)
METRIC_LABELS = {
    "fid": "FID", "fd_dinov2": "FD-DINOv2", "is": "IS*", "lpips": "LPIPS", "fd_toy": "FD (toy)",
    "is_toy": "IS* (toy)", "lpips_toy": "LPIPS (toy)", "hps": "HPSv2.1", "pickscore": "PickScore",
    "imagereward": "ImgRwd", "clipscore": "CLIPScore", "aesthetic": "Aesthetic",
}  # fmt: skip


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


def parse_lmm_formula(formula: str) -> tuple[str, list[str], str | None]:
    """Split lme4 syntax into (fixed formula, grouping columns, random-slopes formula).

    ``value ~ a * b + (1|prompt)`` -> (``value ~ a * b``, [``prompt``], None);
    ``(1|prompt) + (1|seed)`` -> crossed intercepts; ``(x|g)`` -> random slopes ``~x`` on ``g``.
    """
    random = re.findall(r"\(\s*([^()|]+?)\s*\|\s*([A-Za-z_][A-Za-z0-9_]*)\s*\)", formula)
    fixed = re.sub(r"\+?\s*\(\s*[^()|]+?\s*\|\s*[A-Za-z_][A-Za-z0-9_]*\s*\)", "", formula).strip()
    fixed = re.sub(r"\s*\+\s*$", "", fixed)
    groups = [g for _, g in random]
    slopes = [s.strip() for s, _ in random if s.strip() not in ("1",)]
    re_formula = f"~{slopes[0]}" if slopes else None
    return fixed, groups, re_formula


def _backend_missing(backends: Sequence[str]) -> list[str]:
    """Names of weights backends that cannot be located (with the locator's one-line hint)."""
    from pcpo_eval.weights import status

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
    from pcpo_eval.weights import hf_snapshot_file, locate

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
                from pcpo_eval.train_config import config_from_dict

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
        from pcpo_eval.generate import parse_seeds

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


def unreachable_targets(run_dirs: Sequence[str | Path], targets: Sequence[float], window: int) -> list[str]:
    """Problems for targets that no run's smoothed reward reaches (paper: first epoch reaching it)."""
    from pcpo_eval.stats import load_log, moving_average

    best = float("-inf")
    for rd in run_dirs:
        try:
            log = load_log(Path(rd) / "log.parquet")
        except UserError:
            continue
        best = max(best, float(moving_average(log["reward_mean"].to_numpy(), window).max()))
    out = []
    for t in dict.fromkeys(targets):
        if t == t and not best >= t:  # NaN-safe
            out.append(f"target {t:g} is reached by no run (best smoothed reward {best:.4g}, window {window}); "
                       "lower it or train longer")
    return out


# ------------------------------------------------------------------------------------------------
# Stage runner
# ------------------------------------------------------------------------------------------------


class StageError(UserError):
    """A study stage failed; earlier outputs are kept and a re-run continues."""

    exit_code = 1


def _fingerprint(parts: Sequence[Any]) -> str:
    h = hashlib.sha256()
    for p in parts:
        if isinstance(p, Path):
            h.update(sha256_file(p).encode() if p.is_file() else b"<missing>")
        else:
            h.update(json.dumps(p, sort_keys=True, default=str).encode())
        h.update(b"\0")
    return h.hexdigest()


class Study:
    """Runs the stages of a :class:`StudySpec` into ``out`` (see the module docstring)."""

    def __init__(self, spec: StudySpec, out: str | Path, log: Callable[[str], None] = print) -> None:
        self.spec = spec
        self.out = Path(out)
        self.log = log
        self.state: dict[str, Any] = {}
        self.timings: dict[str, float] = {}  #: wall seconds of each stage in this invocation
        if (self.out / STATE_FILE).is_file():
            self.state = json.loads((self.out / STATE_FILE).read_text())

    # -- paths ---------------------------------------------------------------------------------
    def run_dir(self, run: RunSpec) -> Path:
        return Path(run.run_dir) if run.run_dir else self.out / "runs" / run.name

    def set_dir(self, label: str, pref: bool = False) -> Path:
        return self.out / ("pref_sets" if pref else "sets") / label

    def metrics_dir(self, label: str, pref: bool = False) -> Path:
        return self.out / ("pref_metrics" if pref else "metrics") / label

    def train_config(self, run: RunSpec):
        from pcpo_eval.train_config import config_from_dict

        return config_from_dict({**_yaml_or_empty(run.config), **self.spec.train_overrides, **run.overrides})

    # -- bookkeeping ---------------------------------------------------------------------------
    def _save_state(self) -> None:
        atomic_write_json(self.out / STATE_FILE, self.state)

    def _done(self, stage: str, fp: str) -> bool:
        return self.state.get(stage, {}).get("fingerprint") == fp

    def _mark(self, stage: str, fp: str, seconds: float, **info: Any) -> None:
        self.state[stage] = {"fingerprint": fp, "seconds": round(seconds, 2), "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **info}
        self._save_state()

    def run(self, stages: Sequence[str] = STAGES) -> Path:
        """Run ``stages`` in order; returns the report path (or the study dir)."""
        self.out.mkdir(parents=True, exist_ok=True)
        atomic_write_text(self.out / "study.yaml", yaml.safe_dump(self.spec.raw, sort_keys=False))
        atomic_write_json(self.out / "spec.resolved.json", self.spec.to_dict())
        for stage in stages:
            t0 = time.perf_counter()
            self.log(f"[study] stage {stage} ...")
            try:
                getattr(self, f"stage_{stage}")()
            except Exception as exc:
                tb = self.out / "logs" / f"{stage}.error.txt"
                atomic_write_text(tb, traceback.format_exc())
                msg = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
                if not isinstance(exc, UserError):
                    msg = f"{type(exc).__name__}: {msg} (traceback in {tb})"
                raise StageError(f"study stage '{stage}' failed: {msg}; outputs of earlier stages are kept in "
                                 f"{self.out}, re-run the same command to continue") from exc
            dt = time.perf_counter() - t0
            self.timings[stage] = round(dt, 2)
            atomic_write_json(self.out / "timings.json", self.timings)
            self.log(f"[study] stage {stage} done in {dt:.1f}s")
        return self.out / REPORT_FILE if "report" in stages else self.out

    # -- 1. train ------------------------------------------------------------------------------
    def run_complete(self, run: RunSpec) -> bool:
        """A trained run is complete when its log and last checkpoint cover ``epochs``."""
        from pcpo_eval.checkpoints import latest_checkpoint, read_meta

        rd = self.run_dir(run)
        if run.run_dir:
            return True
        latest = latest_checkpoint(rd)
        if latest is None or not (rd / "log.parquet").is_file():
            return False
        return int(read_meta(latest)["epoch"]) >= int(self.train_config(run).epochs)

    def stage_train(self) -> None:
        from pcpo_eval.checkpoints import latest_checkpoint
        from pcpo_eval.trainer import train

        for run in self.spec.runs:
            rd = self.run_dir(run)
            if run.run_dir:
                self.log(f"  {run.name}: existing run {rd}")
                continue
            if self.run_complete(run):
                self.log(f"  {run.name}: complete, skipped")
                continue
            cfg = self.train_config(run)
            resume = latest_checkpoint(rd) is not None
            if not resume and rd.exists():  # crashed before its first checkpoint: start over
                shutil.rmtree(rd)
            self.log(f"  {run.name}: {'resuming' if resume else 'training'} ({cfg.objective}, {cfg.epochs} epochs)")
            train(cfg, rd, resume=resume)
        problems = unreachable_targets([self.run_dir(r) for r in self.spec.runs],
                                       [*self.spec.targets, self.spec.select_target], self.spec.window)
        if problems:
            raise UserError("; ".join(problems))

    # -- 2. select -----------------------------------------------------------------------------
    def stage_select(self) -> None:
        from pcpo_eval.stats import select_checkpoints

        sp = self.spec
        logs = [self.run_dir(r) / "log.parquet" for r in sp.runs]
        fp = _fingerprint([sp.select_target, sp.window, *logs])
        if self._done("select", fp) and (self.out / "selection.json").is_file():
            self.log("  selection unchanged, skipped")
            return
        rows = []
        for cell in self.cells():
            runs = [r for r in sp.runs if sp.cell_key(r) == cell]
            pc = [r for r in runs if sp.role(r) == "pcpo"]
            selection = select_checkpoints([self.run_dir(r) for r in runs], sp.select_target, sp.window,
                                           reference=self.run_dir(pc[0]) if pc else None)
            d = selection.to_dict()
            for r, c in zip(runs, d["runs"], strict=True):
                c["name"] = r.name
                c["levels"] = r.levels
                c["role"] = sp.role(r)
                c["cell"] = cell
                rows.append(c)
            for b in d["brackets"]:
                b["cell"] = cell
        atomic_write_json(self.out / "selection.json", {"target": sp.select_target, "window": sp.window, "runs": rows})
        self._mark("select", fp, 0.0)
        for c in rows:
            self.log(f"  {c['name']}: epoch {c['epoch']} (reward {c['reward']:.4g}, gap {c['gap']:+.3g})")

    def cells(self) -> list[str]:
        return list(dict.fromkeys(self.spec.cell_key(r) for r in self.spec.runs))

    def selection(self) -> list[dict[str, Any]]:
        p = self.out / "selection.json"
        if not p.is_file():
            raise UserError(f"{p} missing; run the select stage first")
        return json.loads(p.read_text())["runs"]

    def eval_sets(self) -> list[tuple[str, str, dict[str, Any] | None]]:
        """(label, model spec, selection row) for the base model and each selected checkpoint."""
        first = self.spec.runs[0]
        model = self.train_config(first).model if not first.run_dir else _run_model(first.run_dir)
        out: list[tuple[str, str, dict[str, Any] | None]] = [("base", model, None)]
        for c in self.selection():
            out.append((f"{c['name']}/epoch_{int(c['epoch']):04d}", c["path"], c))
        return out

    # -- 3. generate ---------------------------------------------------------------------------
    def sampling(self) -> dict[str, Any]:
        ev = self.spec.eval
        first = self.spec.runs[0]
        cfg = self.train_config(first) if not first.run_dir else None
        steps = ev.steps or (cfg.sample_steps if cfg else 50)
        return {"steps": int(steps), "cfg": float(ev.cfg if ev.cfg is not None else (cfg.cfg if cfg else 5.0)),
                "eta": float(ev.eta if ev.eta is not None else (cfg.sample_eta if cfg else 1.0)),
                "sigma_schedule": ev.sigma_schedule}

    def stage_generate(self) -> None:
        from pcpo_eval.generate import generate_set, parse_seeds
        from pcpo_eval.prompts import load_prompts

        ev, sp = self.spec.eval, self.spec
        s = self.sampling()
        n_expected = len(load_prompts(ev.prompts, limit=ev.max_prompts)) * len(parse_seeds(ev.seeds))
        jobs = [(label, model, False, ev.prompts, ev.seeds, ev.max_prompts, None) for label, model, _ in self.eval_sets()]
        if sp.preference is not None:
            pr = sp.preference
            jobs += [(label, model, True, pr.prompts, pr.seeds, pr.max_prompts, pr.max_prompt_tokens)
                     for label, model, _ in self.eval_sets()]
        for label, model, pref, prompts, seeds, maxp, maxtok in jobs:
            out = self.set_dir(label, pref)
            n = n_expected if not pref else None
            if _set_complete(out, n):
                self.log(f"  set {out.relative_to(self.out)}: complete, skipped")
                continue
            self.log(f"  set {out.relative_to(self.out)} <- {model}")
            generate_set(model, prompts, seeds, out, batch_size=ev.batch_size, steps=s["steps"], cfg=s["cfg"],
                         eta=s["eta"], schedule=s["sigma_schedule"], device=ev.device, max_prompts=maxp,
                         max_prompt_tokens=maxtok, progress=False)

    # -- 4. metrics ----------------------------------------------------------------------------
    def stage_metrics(self) -> None:
        from pcpo_eval.metrics.workers import METRICS, MetricsOptions, run_metrics

        sp = self.spec
        opts = MetricsOptions(batch_size=sp.metric_batch_size, device=sp.eval.device, is_splits=sp.is_splits)
        base = self.set_dir("base")
        jobs = [(label, False, list(sp.metrics)) for label, _, _ in self.eval_sets()]
        if sp.preference is not None:
            jobs += [(label, True, list(sp.preference.metrics)) for label, _, _ in self.eval_sets()]
        for label, pref, names in jobs:
            out = self.metrics_dir(label, pref)
            sdir = self.set_dir(label, pref)
            fp = _fingerprint([names, sdir / "manifest.parquet", None if pref else base / "manifest.parquet"])
            done = out / "metrics.json"
            if done.is_file() and json.loads(done.read_text()).get("study_fingerprint") == fp:
                self.log(f"  metrics {out.relative_to(self.out)}: done, skipped")
                continue
            self.log(f"  metrics {out.relative_to(self.out)} ({', '.join(names)})")
            needs_ref = any(METRICS[m].kind == "fd" for m in names)
            result = run_metrics(sdir, names, out, base if needs_ref else None, opts)
            atomic_write_json(done, {**result, "study_fingerprint": fp})

    # -- 5. stats ------------------------------------------------------------------------------
    def stage_stats(self) -> None:
        from pcpo_eval.study_stats import build_results

        sp = self.spec
        inputs = [self.out / "selection.json", *(self.run_dir(r) / "log.parquet" for r in sp.runs)]
        for label, _, _ in self.eval_sets():
            inputs.append(self.metrics_dir(label) / "metrics.json")
            if sp.preference is not None:
                inputs.append(self.metrics_dir(label, True) / "metrics.json")
        fp = _fingerprint([sp.to_dict(), *inputs])
        if self._done("stats", fp) and (self.out / RESULTS_FILE).is_file():
            self.log("  statistics unchanged, skipped")
            return
        t0 = time.perf_counter()
        results = build_results(self)
        atomic_write_json(self.out / RESULTS_FILE, results)
        self._mark("stats", fp, time.perf_counter() - t0)

    # -- 6. report -----------------------------------------------------------------------------
    def stage_report(self) -> None:
        from pcpo_eval.report.html import write_report

        fp = _fingerprint([self.out / RESULTS_FILE])
        if self._done("report", fp) and (self.out / REPORT_FILE).is_file():
            self.log("  report unchanged, skipped")
            return
        write_report(self.out, self.out / REPORT_FILE)
        self._mark("report", fp, 0.0)


def _run_model(run_dir: str | Path) -> str:
    from pcpo_eval.checkpoints import load_run_config

    return str(load_run_config(run_dir).get("model", "toy"))


def _set_complete(out: Path, n_expected: int | None) -> bool:
    """A set is complete when its manifest lists the expected number of images."""
    man = out / "manifest.parquet"
    if not man.is_file() or not (out / "set.json").is_file():
        return False
    if n_expected is None:
        return True
    import pandas as pd

    return len(pd.read_parquet(man, columns=["prompt_id"])) == n_expected


def run_study(spec_path: str | Path, out: str | Path | None = None, stages: Sequence[str] = STAGES,
              log: Callable[[str], None] = print) -> Path:
    """Validate ``spec_path`` (every problem at once), then run ``stages`` into ``out``.

    ``out`` defaults to ``studies/<name>``. Returns the report path.
    """
    spec = load_spec(spec_path)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise UserError(f"unknown stage(s) {', '.join(bad)}; stages: {', '.join(STAGES)}")
    out_dir = Path(out) if out is not None else Path("studies") / _safe_name(spec.name)
    return Study(spec, out_dir, log).run(stages)
