"""The study's train stage: every run (design cell x seed) trained, resumed or skipped.

A run is *complete* when its log and its last checkpoint cover the config's ``epochs``; complete
runs are skipped, a run with a checkpoint is resumed (``train(..., resume=True)``), and a run that
crashed before its first checkpoint is started over.

``parallel: N`` (N > 1): up to N runs train at once, each worker a separate Python process
(``python -m pcpo_eval.study.training``) with ``OMP_NUM_THREADS=1`` and one torch thread: the toy
tensors are tiny, and on a shared 2-core machine several threads per process spin-wait rather
than compute. A worker imports torch once and then trains the runs it is handed, one at a time,
over a line protocol on its stdin / a private copy of its stdout (one JSON object per line); the
next pending run goes to whichever worker finishes first. Plain subprocesses, not
``multiprocessing``: nothing is pickled and the caller's ``__main__`` is never re-imported, so a
study can be started from any script. Each run's console output goes to
``OUT/logs/train/<run>.log``; a failed run is named with that log after the other runs have
finished, so a re-run resumes only what is missing. Workers die with the study process, even when
it is killed with SIGKILL (:func:`die_with_parent`): no orphan keeps training into the folder.
"""

from __future__ import annotations

import contextlib
import json
import os
import selectors
import shutil
import subprocess
import sys
import traceback
from collections.abc import Callable, Sequence
from pathlib import Path
from typing import IO, Any

from pcpo_eval.errors import UserError
from pcpo_eval.rundir import config_path, log_path
from pcpo_eval.study.spec import RunSpec, StudySpec
from pcpo_eval.studydir import StudyLayout

#: environment of the worker processes: one thread for every BLAS / OpenMP pool
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def run_complete(run: RunSpec, layout: StudyLayout) -> bool:
    """An existing run directory, or a trained run whose log and last checkpoint cover ``epochs``."""
    from pcpo_eval.train.checkpoints import latest_checkpoint, read_meta

    if run.train is None:
        return True
    rd = layout.run_dir(run)
    latest = latest_checkpoint(rd)
    if latest is None or not log_path(rd).is_file():
        return False
    return int(read_meta(latest)["epoch"]) >= int(run.train.epochs)


def changed_settings(run: RunSpec, layout: StudyLayout) -> list[str]:
    """Config keys (but ``epochs`` / ``device`` / ``keep_checkpoints``) whose value in the run directory's ``config.yaml``
    differs from the spec's resolved config: the run was trained for another spec."""
    from pcpo_eval.train.checkpoints import load_run_config

    rd = layout.run_dir(run)
    if run.train is None or not config_path(rd).is_file():
        return []
    saved = load_run_config(rd)
    defaults = type(run.train)().to_dict()  # a key an older run's config.yaml lacks had its default
    return [k for k, v in run.train.to_dict().items()
            if k not in ("epochs", "device", "keep_checkpoints") and saved.get(k, defaults.get(k)) != v]


def logged_epochs(run: RunSpec, layout: StudyLayout) -> int | None:
    """The last epoch a trained run's ``log.parquet`` holds (None without a readable log)."""
    import pandas as pd

    path = log_path(layout.run_dir(run))
    if not path.is_file():
        return None
    try:
        epochs = pd.read_parquet(path, columns=["epoch"])["epoch"]
    except Exception:  # noqa: BLE001 - an unreadable log is the trainer's / the log reader's to report
        return None
    return int(epochs.max()) if len(epochs) else None


def pending_runs(spec: StudySpec, layout: StudyLayout, log: Callable[[str], None]) -> list[tuple[RunSpec, bool]]:
    """(run, resume) for every run still to train; a run directory without a checkpoint is removed.

    A run directory trained with other settings than the spec now gives (e.g. ``paired_control``
    switched on, a changed learning rate), or for more epochs than the spec's ``epochs``, is never
    reused or resumed: a UserError names it (fewer epochs are resumed).
    """
    from pcpo_eval.train.checkpoints import latest_checkpoint

    stale = {r.name: keys for r in spec.runs if (keys := changed_settings(r, layout))}
    if stale:
        raise UserError("run(s) trained with other settings than the spec gives: "
                        + "; ".join(f"{n} ({', '.join(k)})" for n, k in stale.items())
                        + f"; delete them under {layout.out / 'runs'} to retrain, or restore the spec")
    longer = {r.name: (e, r.train.epochs) for r in spec.runs if r.train is not None
              and (e := logged_epochs(r, layout)) is not None and e > r.train.epochs}
    if longer:
        raise UserError("run(s) trained for more epochs than the spec gives: "
                        + "; ".join(f"{n} ({e} > epochs {want})" for n, (e, want) in longer.items())
                        + "; the study would select, compare and time them over all their epochs, not the spec's. "
                        f"Restore epochs in the spec, or delete them under {layout.out / 'runs'} to retrain")
    out = []
    for run in spec.runs:
        rd = layout.run_dir(run)
        if run.train is None:
            log(f"  {run.name}: existing run {rd}")
            continue
        if run_complete(run, layout):
            log(f"  {run.name}: complete, skipped")
            continue
        resume = latest_checkpoint(rd) is not None
        if not resume and rd.exists():  # crashed before its first checkpoint: start over
            from pcpo_eval.train.checkpoints import lock_run

            held = lock_run(rd)  # not a run another process is training now (one error line)
            try:
                shutil.rmtree(rd)
            finally:
                if held is not None:
                    held.close()
        log(f"  {run.name}: {'resuming' if resume else 'training'} ({run.train.objective}, seed {run.seed}, "
            f"{run.train.epochs} epochs)")
        out.append((run, resume))
    return out


def train_runs(spec: StudySpec, layout: StudyLayout, log: Callable[[str], None]) -> None:
    """Train the pending runs, in this process (``parallel: 1``) or in up to ``parallel`` workers."""
    from pcpo_eval.train import trainer

    todo = pending_runs(spec, layout, log)
    if spec.parallel > 1 and len(todo) > 1:
        _train_parallel(todo, layout, spec.parallel, log)
        return
    for run, resume in todo:
        assert run.train is not None  # pending_runs skips existing run directories
        trainer.train(run.train, layout.run_dir(run), resume=resume)


def _task(run: RunSpec, resume: bool, layout: StudyLayout) -> dict[str, Any]:
    """One line of the worker protocol: the resolved config, the run directory, resume, the log file."""
    assert run.train is not None
    return {"run": run.name, "config": run.train.to_dict(), "out": str(layout.run_dir(run)), "resume": resume,
            "log": str(layout.train_log(run))}


def _train_parallel(todo: Sequence[tuple[RunSpec, bool]], layout: StudyLayout, parallel: int,
                    log: Callable[[str], None]) -> None:
    """Up to ``parallel`` worker processes; every run is attempted, failures are reported together."""
    queue = [_task(run, resume, layout) for run, resume in todo]
    errors_dir = layout.out / "logs" / "train"
    errors_dir.mkdir(parents=True, exist_ok=True)
    root = str(Path(__file__).resolve().parents[2])  # the checkout holding pcpo_eval, importable from any cwd
    env = {**os.environ, **ONE_THREAD_ENV, PARENT_ENV: str(os.getpid()),
           "PYTHONPATH": os.pathsep.join(p for p in (root, os.environ.get("PYTHONPATH")) if p)}
    workers = []
    for i in range(min(parallel, len(queue))):
        err = open(errors_dir / f"worker-{i}.log", "a", encoding="utf-8")  # noqa: SIM115 (closed below)
        proc = subprocess.Popen([sys.executable, "-m", "pcpo_eval.study.training"], stdin=subprocess.PIPE,
                                stdout=subprocess.PIPE, stderr=err, text=True, env=env)
        workers.append((proc, err))
    failures: list[str] = []
    user_failures: list[str] = []  #: runs that failed on a UserError (their input is at fault)
    busy: dict[subprocess.Popen[str], dict[str, Any]] = {}

    def hand_out(proc: subprocess.Popen[str]) -> None:
        assert proc.stdin is not None
        if queue:
            busy[proc] = queue.pop(0)
            proc.stdin.write(json.dumps(busy[proc]) + "\n")
            proc.stdin.flush()
        else:
            proc.stdin.close()

    with selectors.DefaultSelector() as sel:
        for proc, _ in workers:
            sel.register(proc.stdout, selectors.EVENT_READ, proc)  # type: ignore[arg-type]
            hand_out(proc)
        while busy:
            for key, _ in sel.select():
                proc = key.data
                line = proc.stdout.readline()
                if not line:  # end of the worker's replies: it exited (idle) or died (mid-run)
                    sel.unregister(proc.stdout)
                    if (task := busy.pop(proc, None)) is not None:
                        failures.append(f"run {task['run']}: its worker process died (log: {task['log']})")
                    continue
                task = busy.pop(proc)
                res = json.loads(line)
                if res["ok"]:
                    log(f"  {task['run']}: done (console output in {task['log']})")
                else:
                    failures.append(f"run {task['run']}: {res['error']} (log: {task['log']})")
                    if res.get("user_error"):
                        user_failures.append(task["run"])
                hand_out(proc)
    failures += [f"run {t['run']}: not started (every worker process died)" for t in queue]
    for proc, err in workers:
        if proc.stdin is not None and not proc.stdin.closed:
            proc.stdin.close()
        proc.wait()
        err.close()
    if failures:
        err = UserError(f"{len(failures)} of {len(todo)} run(s) failed: " + "; ".join(failures)
                        + "; the other runs are kept, re-run the same command to resume")
        err.exit_code = 2 if len(failures) == len(user_failures) else 1  # a crash (a bug) is not the input's fault
        raise err


# ------------------------------------------------------------------------------------------------
# the worker process: python -m pcpo_eval.study.training
# ------------------------------------------------------------------------------------------------


def _redirect(fd: int) -> None:
    """Point this process's stdout and stderr (file descriptors 1 and 2, so C-level output too) at ``fd``."""
    sys.stdout.flush()
    sys.stderr.flush()
    os.dup2(fd, 1)
    os.dup2(fd, 2)


def run_task(task: dict[str, Any]) -> dict[str, Any]:
    """Train one run in this worker, its console output appended to ``task["log"]``; never raises."""
    from pcpo_eval.train import trainer
    from pcpo_eval.train.config import config_from_dict

    Path(task["log"]).parent.mkdir(parents=True, exist_ok=True)
    saved = os.dup(1), os.dup(2)
    with open(task["log"], "a", encoding="utf-8") as fh:
        _redirect(fh.fileno())
        try:
            trainer.train(config_from_dict(task["config"]), task["out"], resume=bool(task["resume"]))
            result = {"ok": True, "error": None}
        except Exception as exc:  # reported to the study with the log path, never lost
            traceback.print_exc()
            msg = str(exc).splitlines()[0] if str(exc).strip() else ""
            result = {"ok": False, "error": f"{type(exc).__name__}: {msg}", "user_error": isinstance(exc, UserError)}
        finally:
            sys.stdout.flush()
            sys.stderr.flush()
            os.dup2(saved[0], 1)
            os.dup2(saved[1], 2)
            os.close(saved[0])
            os.close(saved[1])
    return result


def worker_loop(tasks: IO[str], replies: IO[str]) -> None:
    """Read one task per line, train it, reply one JSON line; until ``tasks`` is closed."""
    import torch

    torch.set_num_threads(1)
    for line in tasks:
        if line.strip():
            replies.write(json.dumps(run_task(json.loads(line))) + "\n")
            replies.flush()


#: environment variable naming the study process a worker belongs to (it dies with that process)
PARENT_ENV = "PCPO_STUDY_PARENT_PID"


def die_with_parent(parent: int | None = None, poll_s: float = 1.0) -> None:
    """Make this worker exit when the study process that started it dies, even by SIGKILL.

    Linux: ``prctl(PR_SET_PDEATHSIG, SIGKILL)``, then a check that the parent did not die before the
    call. Elsewhere: a daemon thread polls the parent pid. (Closing stdin is not enough: a worker in
    the middle of a run reads its next task only after the run.)
    """
    import signal
    import threading
    import time

    parent = int(os.environ.get(PARENT_ENV, "0") or 0) if parent is None else parent
    if not parent:
        return
    if sys.platform.startswith("linux"):
        import ctypes

        try:
            libc = ctypes.CDLL(None, use_errno=True)
            if libc.prctl(1, int(signal.SIGKILL), 0, 0, 0) == 0:  # 1 = PR_SET_PDEATHSIG
                if os.getppid() != parent:  # the parent died before prctl
                    os._exit(1)
                return
        except (OSError, AttributeError):
            pass

    def watch() -> None:
        while True:
            if os.getppid() != parent:
                os._exit(1)
            time.sleep(poll_s)

    threading.Thread(target=watch, name="die-with-parent", daemon=True).start()


def main() -> None:
    """Worker entry point: replies go to a private copy of stdout; stray writes to fd 1 go to stderr."""
    die_with_parent()
    replies = os.fdopen(os.dup(1), "w", encoding="utf-8")
    os.dup2(2, 1)
    with contextlib.closing(replies):
        worker_loop(sys.stdin, replies)


if __name__ == "__main__":
    main()
