"""The study's stages (train -> select -> generate -> metrics -> stats -> report), resumable.

Each stage lives in its own module where it has logic of its own: training (with ``parallel: N``
worker processes) in :mod:`.training`, checkpoint selection in :mod:`.selection`, statistics in
:mod:`.results` / :mod:`.verdicts`; this module sequences them and skips finished work.
"""


from __future__ import annotations

import hashlib
import json
import time
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import Any

import yaml

from pcpo_eval.errors import UserError
from pcpo_eval.imageset import MANIFEST_FILE, SET_FILE, set_status
from pcpo_eval.io import (
    atomic_write_json,
    atomic_write_text,
    check_out_path,
    foreign_entries,
    json_text,
    lock_or_refuse,
    remove_stale_temps,
    sha256_file,
)
from pcpo_eval.metricsdir import metrics_path
from pcpo_eval.progress import echo, progress_bar
from pcpo_eval.rundir import META_FILE, log_path
from pcpo_eval.stats.comparability import same_value
from pcpo_eval.stats.speedup import unreachable_targets
from pcpo_eval.study.spec import STAGES, StudySpec, _safe_name, load_spec
from pcpo_eval.studydir import RUNS_DIR, SPEC_COPY_FILE, STATE_FILE, StudyLayout, write_results

# ------------------------------------------------------------------------------------------------
# Stage runner
# ------------------------------------------------------------------------------------------------


class StageError(UserError):
    """A study stage failed; earlier outputs are kept and a re-run continues.

    Exit code 2 when the cause is a problem of the input (a :class:`UserError`: the one line says what
    to fix), 1 when it is a crash (its traceback is saved under ``logs/``).
    """

    exit_code = 1

    def __init__(self, message: str, exit_code: int = 1) -> None:
        super().__init__(message)
        self.exit_code = exit_code


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

    def __init__(self, spec: StudySpec, out: str | Path, log: Callable[[str], None] = print,
                 progress: bool | None = None) -> None:
        self.spec = spec
        self.progress = progress  #: stage bar on stderr (pcpo_eval.progress; None: when stderr is a TTY)
        self.layout = StudyLayout(Path(out))
        self.out = self.layout.out
        self.log = log
        self.timings: dict[str, float] = {}  #: wall seconds of each stage in this invocation
        self.state: dict[str, Any] = self._load_state()
        self._lock_fh: Any = None

    def _load_state(self) -> dict[str, Any]:
        """``study_state.json`` (finished stages and their fingerprints); a corrupt file is one UserError."""
        path = self.layout.state_file
        if not path.is_file():
            return {}
        fix = (f"delete {path} to re-check every stage (trained runs, image sets and metrics already on disk "
               "are reused), then re-run the same command")
        try:
            state = json.loads(path.read_text(encoding="utf-8"))
        except (UnicodeDecodeError, json.JSONDecodeError) as exc:
            why = exc.msg if isinstance(exc, json.JSONDecodeError) else "not UTF-8"
            raise UserError(f"study state {path} is corrupt ({why}); {fix}") from None
        if not isinstance(state, dict) or not all(isinstance(v, dict) for v in state.values()):
            raise UserError(f"study state {path} is not a study state (a mapping of stage -> record); {fix}")
        return state

    def _lock(self) -> None:
        """Hold ``OUT/.lock`` (``flock``) while this process runs the study: a second study process on the
        same folder is refused with one line instead of both writing the same runs and files."""
        self._lock_fh = lock_or_refuse(self.out / ".lock", f"study folder {self.out} is in use by another pcpo-eval "
                                       "study process (pid {pid}); wait for it to finish (or stop it), or choose "
                                       "another --out")

    def _unlock(self) -> None:
        if self._lock_fh is not None:
            self._lock_fh.close()  # closing the file releases the flock
            self._lock_fh = None

    # -- bookkeeping ---------------------------------------------------------------------------
    def _save_state(self) -> None:
        atomic_write_json(self.layout.state_file, self.state)

    def _done(self, stage: str, fp: str) -> bool:
        return self.state.get(stage, {}).get("fingerprint") == fp

    def _mark(self, stage: str, fp: str, seconds: float, **info: Any) -> None:
        self.state[stage] = {"fingerprint": fp, "seconds": round(seconds, 2), "finished": time.strftime("%Y-%m-%d %H:%M:%S"), **info}
        self._save_state()

    def _check_out_folder(self) -> None:
        """Refuse, before anything is written, an ``out`` that holds ANOTHER study (its
        ``spec.resolved.json`` names another study: it was overwritten, then the stages failed on the
        other study's files) or, without that file, entries that are not a study's (a folder of the
        user's: ``.lock``, ``logs/`` and the spec copy were added to it). The study's own runs folder
        may exist before its first stage (runs trained elsewhere, copied in)."""
        if not self.out.is_dir():
            return
        spec_file = self.layout.spec_file
        if spec_file.is_file():
            try:
                other = json.loads(spec_file.read_text(encoding="utf-8")).get("name")
            except (ValueError, UnicodeDecodeError, AttributeError):
                other = None  # unreadable: our own derived file, rewritten below
            if isinstance(other, str) and other != self.spec.name:
                raise UserError(f"--out {self.out} holds the study {other!r} ({spec_file.name}), not {self.spec.name!r}; "
                                "choose another --out (one folder per study)")
            return
        own = {".lock", "logs", SPEC_COPY_FILE, STATE_FILE, RUNS_DIR}
        strangers = foreign_entries(self.out, own)
        if strangers:
            raise UserError(f"--out {self.out} exists and is not a study folder (it holds {strangers[0]!r}"
                            f"{f' and {len(strangers) - 1} more' if len(strangers) > 1 else ''}); choose a new or "
                            "empty folder")

    def _check_earlier_stages(self, stages: Sequence[str]) -> None:
        """Refuse, before anything is written, ``--stages`` whose first stage needs a file an earlier,
        unchosen stage writes and that is not there yet (e.g. ``--stages report`` on a new folder)."""
        chosen = [s for s in STAGES if s in stages]
        if not chosen or chosen[0] in ("train", "select"):
            return
        first = chosen[0]
        need, by = ((self.layout.results_file, "stats") if first == "report"
                    else (self.layout.selection_file, "select"))
        if not need.is_file():
            raise UserError(f"--stages {','.join(chosen)}: {need} not found (the {by} stage writes it); run the "
                            f"earlier stages first: pcpo-eval study SPEC --out {self.out} (finished stages are skipped)")

    def run(self, stages: Sequence[str] = STAGES) -> Path:
        """Run ``stages`` in order; returns the report path (or the study dir)."""
        self._check_out_folder()
        self._check_earlier_stages(stages)
        self.out.mkdir(parents=True, exist_ok=True)
        self._lock()
        try:
            remove_stale_temps(self.out)  # temp files of a killed study (under the lock: no other study writes)
            self.state = self._load_state()  # re-read under the lock
            return self._run(stages)
        finally:
            self._unlock()

    def _record_spec(self) -> None:
        """Write the spec as given (``study.yaml``) and resolved (``spec.resolved.json``)."""
        atomic_write_text(self.layout.spec_copy_file, yaml.safe_dump(self.spec.raw, sort_keys=False))
        atomic_write_json(self.layout.spec_file, self.spec.to_dict())

    def _spec_changed(self) -> bool:
        """Whether the folder records another spec than this one (a re-run with changed settings)."""
        try:
            return json.loads(self.layout.spec_file.read_text(encoding="utf-8")) != json.loads(
                json_text(self.spec.to_dict()))
        except (OSError, ValueError):
            return False

    def _run(self, stages: Sequence[str]) -> Path:
        # A changed spec is recorded once a stage has run on it: a re-run that a stage refuses (changed training
        # settings beside trained runs) keeps the record of the spec behind the folder's results (it was
        # replaced before the refusal).
        deferred = self._spec_changed()
        if not deferred:
            self._record_spec()
        bar = progress_bar(len(stages), f"study {self.spec.name}", self.progress, unit="stage")
        log = self.log
        if not bar.disable:  # log lines above the live bar
            self.log = lambda line: echo(bar, line)
        try:
            for stage in stages:
                bar.set_postfix_str(stage)
                self._run_stage(stage)
                if deferred:
                    self._record_spec()
                    deferred = False
                bar.update(1)
        finally:
            self.log = log
            bar.close()
        return self.layout.report_file if "report" in stages else self.out

    def _run_stage(self, stage: str) -> None:
        """One stage: run it, time it; a failure becomes a StageError naming the stage (tracebacks in logs/)."""
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
            # a refusal (UserError) names its own fix; re-running unchanged continues only after other failures
            after = "" if isinstance(exc, UserError) else ", re-run the same command to continue"
            raise StageError(f"study stage '{stage}' failed: {msg}; outputs of earlier stages are kept in "
                             f"{self.out}{after}",
                             exc.exit_code if isinstance(exc, UserError) else 1) from exc
        dt = time.perf_counter() - t0
        self.timings[stage] = round(dt, 2)
        atomic_write_json(self.out / "timings.json", self.timings)
        self.log(f"[study] stage {stage} done in {dt:.1f}s")

    # -- 1. train ------------------------------------------------------------------------------
    def stage_train(self) -> None:
        from pcpo_eval.study.spec import recorded_input_problems
        from pcpo_eval.study.training import train_runs

        if problems := recorded_input_problems(self.spec, self.layout.run_dir):  # before training any more
            raise UserError("; ".join(problems))
        train_runs(self.spec, self.layout, self.log)
        problems = unreachable_targets([self.layout.run_dir(r) for r in self.spec.runs],
                                       [*self.spec.targets, self.spec.select_target], self.spec.window)
        if problems:
            raise UserError("; ".join(problems))

    # -- 2. select -----------------------------------------------------------------------------
    def stage_select(self) -> None:
        from pcpo_eval.study.selection import select

        sp, lay = self.spec, self.layout
        logs = [log_path(lay.run_dir(r)) for r in sp.runs]
        # select_on too: a resume with another select_on kept the selection made under the old one (a review)
        fp = _fingerprint([sp.select_target, sp.select_epoch, sp.window, sp.select_on, [r.name for r in sp.runs], *logs])
        if self._done("select", fp) and lay.selection_file.is_file():
            self.log("  selection unchanged, skipped")
            return
        selection = select(sp, lay)
        lay.write_selection(selection)
        self._mark("select", fp, 0.0)
        for c in selection["runs"]:
            where = f"epoch {c['epoch']}" if c["reached"] else "NOT REACHED, no reward-matched checkpoint"
            self.log(f"  {c['name']}: {where} (smoothed reward {c['reward']:.4g}, target {c['target']:g})")
        for key in ("control_reaches_note", "averaged_weights_note"):
            if selection.get(key):
                self.log(f"  warning: {selection[key]}")
        if selection["target_uninformative"]:
            self.log(f"  warning: every run's first checkpoint already reaches select_target {sp.select_target:g}; "
                     "the reward-matched checkpoints are the first ones (raise select_target)")
        if selection["epoch"] is not None:
            self.log(f"  explicit epochs: {selection['epoch']}" if selection.get("epochs")
                     else f"  matched epoch: {selection['epoch']} (every run)")

    def _eval_device(self) -> str:
        """``eval.device`` as ``--device`` reads it (:func:`pcpo_eval.dist.resolve_device`: ``auto`` -> this
        process's GPU or cpu; CUDA asked for where there is none is one UserError line). Passed on as
        written, ``auto`` stopped the sets stage, after training, with torch's device-string error."""
        from pcpo_eval.dist import resolve_device

        return resolve_device(self.spec.eval.device)

    # -- 3. generate ---------------------------------------------------------------------------
    def stage_generate(self) -> None:
        from pcpo_eval.generate.plan import parse_seeds
        from pcpo_eval.generate.runner import generate_set
        from pcpo_eval.prompts import load_prompts
        from pcpo_eval.study.results import preference_sets

        ev, sp = self.spec.eval, self.spec
        s = sp.sampling()
        sets = self.layout.eval_sets(sp.base_model)
        n_expected = len(load_prompts(ev.prompts, limit=ev.max_prompts)) * len(parse_seeds(ev.seeds))
        jobs = [(self.layout.set_dir(label), model, ev.prompts, ev.seeds, ev.max_prompts, None, n_expected)
                for label, model, _ in sets]
        for pr in sp.preferences:
            jobs += [(self.layout.set_dir(label, True, pr.name), model, pr.prompts, pr.seeds, pr.max_prompts,
                      pr.max_prompt_tokens, None) for label, model, _ in preference_sets(sp, self.layout, pr)]
        jobs += self._grid_jobs()
        made = self.state.setdefault(SETS_KEY, {})  #: set folder -> fingerprint of what it was rendered from
        idents = {str(out.relative_to(self.out)): _set_identity(model, prompts, seeds, maxp, maxtok, s)
                  for out, model, prompts, seeds, maxp, maxtok, _ in jobs}
        stale = [f"{rel} ({why})" for (out, *_, n), (rel, ident) in zip(jobs, idents.items(), strict=True)
                 if _set_complete(out, n) and (why := stale_set_reason(out, s, made.get(rel), ident))]
        if stale:
            raise UserError(f"{len(stale)} image set(s) of this study were rendered from other inputs than the spec now "
                            f"gives: {'; '.join(stale[:3])}{' ...' if len(stale) > 3 else ''}; delete them (their metrics "
                            "are re-measured) to re-render, or restore the spec")
        for (out, model, prompts, seeds, maxp, maxtok, n), (rel, ident) in zip(jobs, idents.items(), strict=True):
            if _set_complete(out, n):
                self.log(f"  set {rel}: complete, skipped")
            else:
                self.log(f"  set {rel} <- {model}")
                generate_set(model, prompts, seeds, out, batch_size=ev.batch_size, steps=s["steps"], cfg=s["cfg"],
                             eta=s["eta"], schedule=s["sigma_schedule"], device=self._eval_device(), max_prompts=maxp,
                             max_prompt_tokens=maxtok, progress=False)
            if made.get(rel) != ident:
                made[rel] = ident
                self._save_state()

    def _grid_jobs(self) -> list[tuple[Path, str, Any, list[int], None, None, int]]:
        """Sets of the grids with named prompts, seed lists or stated epochs (:mod:`.grids`)."""
        from pcpo_eval.study.grids import grid_models, grid_prompt_set, grid_seeds
        from pcpo_eval.study.sections import grid_dir_name

        jobs = []
        for i, g in enumerate(self.spec.grids):
            if not g.own_sets:
                continue
            ps, seeds = grid_prompt_set(self.spec, g), grid_seeds(self.spec, g)
            for label, model, _ in grid_models(self.spec, self.layout, g):
                jobs.append((self.layout.grid_set_dir(grid_dir_name(g, i), label), model, ps, seeds, None, None,
                             len(ps) * len(seeds)))
        return jobs

    # -- 4. metrics ----------------------------------------------------------------------------
    def stage_metrics(self) -> None:
        from pcpo_eval.metrics.base import METRICS
        from pcpo_eval.metrics.workers import MetricsOptions, outputs_current, run_metrics
        from pcpo_eval.study.results import preference_sets

        sp, lay = self.spec, self.layout
        opts = MetricsOptions(batch_size=sp.metric_batch_size, device=self._eval_device(), is_splits=sp.is_splits)
        base = lay.set_dir("base")
        sets = lay.eval_sets(sp.base_model)
        jobs = [(label, False, "", list(sp.metrics)) for label, _, _ in sets]
        for pr in sp.preferences:
            jobs += [(label, True, pr.name, list(pr.metrics)) for label, _, _ in preference_sets(sp, lay, pr)]
        for label, pref, pname, names in jobs:
            out = lay.metrics_dir(label, pref, pname)
            sdir = lay.set_dir(label, pref, pname)
            ref = base if any(METRICS[m].needs_reference for m in names) else None
            if outputs_current(out, sdir, names, ref, opts):  # same metrics, manifests and IS splits
                self.log(f"  metrics {out.relative_to(self.out)}: done, skipped")
                continue
            self.log(f"  metrics {out.relative_to(self.out)} ({', '.join(names)})")
            run_metrics(sdir, names, out, ref, opts)

    # -- 5. stats ------------------------------------------------------------------------------
    def stage_stats(self) -> None:
        from pcpo_eval.study.history import record
        from pcpo_eval.study.results import build_results, preference_sets

        sp, lay = self.spec, self.layout
        inputs = [lay.selection_file, *(log_path(lay.run_dir(r)) for r in sp.runs)]
        for label, _, _ in lay.eval_sets(sp.base_model):
            inputs.append(metrics_path(lay.metrics_dir(label)))
        for pr in sp.preferences:
            inputs += [metrics_path(lay.metrics_dir(label, True, pr.name)) for label, _, _ in preference_sets(sp, lay, pr)]
        fp = _fingerprint([sp.to_dict(), *inputs])
        if self._done("stats", fp) and lay.results_file.is_file():
            self.log("  statistics unchanged, skipped")
            return
        t0 = time.perf_counter()
        results = build_results(sp, lay)
        # logged before results.json is replaced: a log that cannot be written leaves the old results and
        # no unlogged verdict (before, a read-only analyses.jsonl left the new results in place, unlogged,
        # and the next run of the other spec said "statistics unchanged" over them)
        record(sp, lay, results)  # analyses.jsonl: the next analysis of these runs is compared with this one
        write_results(lay.out, results)
        self._mark("stats", fp, time.perf_counter() - t0)

    # -- 6. report -----------------------------------------------------------------------------
    def stage_report(self) -> None:
        from pcpo_eval.report.html import write_report

        fp = _fingerprint([self.layout.results_file])
        if self._done("report", fp) and self.layout.report_file.is_file():
            self.log("  report unchanged, skipped")
            return
        write_report(self.out, self.layout.report_file)
        self._mark("report", fp, 0.0)


#: ``study_state.json`` key of the image sets' fingerprints (:func:`_set_identity`)
SETS_KEY = "sets"
#: spec.sampling() key -> set.json ``settings`` key of the eval sampler settings
_SAMPLING_KEYS = {"steps": "steps", "cfg": "cfg", "eta": "eta", "sigma_schedule": "schedule"}


def _set_identity(model: str, prompts: Any, seeds: Any, max_prompts: int | None, max_tokens: int | None,
                  sampling: dict[str, Any]) -> str:
    """Fingerprint of what a set's images are rendered from, free of paths (a moved study folder keeps its
    sets): the model (a checkpoint by its weights' sha256 from ``checkpoint.json``, so a retrained run's
    checkpoint differs), the prompts (a file by its bytes), the seeds and the sampler settings."""
    return _fingerprint([_model_identity(str(model)), _prompts_identity(prompts), seeds, max_prompts, max_tokens,
                         sampling])


def _model_identity(model: str) -> Any:
    """A checkpoint's weights hash (its ``checkpoint.json``), else the model spec itself (``toy``, ``sd1:DIR``)."""
    meta = Path(model) / META_FILE
    if not meta.is_file():
        return model
    try:
        info = json.loads(meta.read_text(encoding="utf-8"))
    except (OSError, ValueError):
        return sha256_file(meta)
    return info.get("weights_sha256") if isinstance(info, dict) and info.get("weights_sha256") else sha256_file(meta)


def _prompts_identity(prompts: Any) -> Any:
    """A prompt file by its bytes, a prompt table (a grid's ``PromptSet``) by its ids and texts, a name as given."""
    if isinstance(prompts, str | Path) and Path(str(prompts)).is_file():
        return sha256_file(Path(str(prompts)))
    if hasattr(prompts, "prompt_ids") and hasattr(prompts, "prompts"):
        return [list(map(int, prompts.prompt_ids)), list(prompts.prompts)]
    return str(prompts)


def stale_set_reason(out: Path, sampling: dict[str, Any], recorded: str | None, identity: str) -> str:
    """Why a complete set is not the set the spec asks for ('' when it is): its ``set.json`` records other
    sampler settings than the spec's, or the study rendered it from another checkpoint, prompts or seeds."""
    try:
        old = json.loads((out / SET_FILE).read_text(encoding="utf-8")).get("settings") or {}
    except (OSError, ValueError, AttributeError):
        old = {}
    for key, sk in _SAMPLING_KEYS.items():
        new = sampling.get(key)
        if sk in old and new is not None and not same_value(old[sk], new):
            return f"rendered with {sk}={old[sk]}, the spec gives {new}"
    if recorded is not None and recorded != identity:
        return "rendered from another checkpoint (a retrained run?), prompt set, seeds or sampler settings"
    return ""


def _set_complete(out: Path, n_expected: int | None) -> bool:
    """A set is complete when generate finished it (set.json not ``rendering``: a resumed run that was
    interrupted leaves the previous manifest), its manifest lists the expected number of images and every
    one of them is on disk (a damaged image the user deleted, as the metrics error says, is rendered again;
    before, the set was skipped and its metrics failed on every re-run)."""
    man = out / MANIFEST_FILE
    if not man.is_file() or not (out / SET_FILE).is_file() or set_status(out) == "rendering":
        return False
    import pandas as pd

    paths = pd.read_parquet(man, columns=["path"])["path"]
    if n_expected is not None and len(paths) != n_expected:
        return False
    return all((out / p).is_file() for p in paths)


def run_study(spec_path: str | Path, out: str | Path | None = None, stages: Sequence[str] = STAGES,
              log: Callable[[str], None] = print, progress: bool | None = None) -> Path:
    """Validate ``spec_path`` (every problem at once), then run ``stages`` into ``out``.

    ``out`` defaults to ``studies/<name>``. Returns the report path.
    """
    spec = load_spec(spec_path)
    bad = [s for s in stages if s not in STAGES]
    if bad:
        raise UserError(f"unknown stage(s) {', '.join(bad)}; stages: {', '.join(STAGES)}")
    out_dir = check_out_path(Path(out) if out is not None else Path("studies") / _safe_name(spec.name), "--out")
    return Study(spec, out_dir, log, progress).run(stages)
