"""The study's train stage: every run (design cell x seed) trained, resumed or skipped.

A run is *complete* when its log and its last checkpoint cover the config's ``epochs``; complete
runs are skipped, a run with a checkpoint is resumed (``train(..., resume=True)``), and a run that
crashed before its first checkpoint is started over. With ``parallel: N`` (N > 1) up to N runs
train at once, each in its own worker process (``multiprocessing`` *spawn*, so no state is shared
with the study process) with one torch / OpenMP / MKL thread: the toy tensors are tiny, and on a
shared 2-core machine several threads per process spin-wait rather than compute. A worker's
console output goes to ``OUT/logs/train/<run>.log``; a failed run is named with that log after the
other runs have finished, so a re-run resumes only what is missing.
"""

from __future__ import annotations

import contextlib
import multiprocessing
import os
import shutil
import traceback
from collections.abc import Callable, Iterator, Sequence
from concurrent.futures import Future, ProcessPoolExecutor, as_completed
from pathlib import Path

from pcpo_eval.errors import UserError
from pcpo_eval.study.layout import StudyLayout
from pcpo_eval.study.spec import RunSpec, StudySpec
from pcpo_eval.train.config import TrainConfig

#: environment of the worker processes: one thread for every BLAS / OpenMP pool
ONE_THREAD_ENV = {"OMP_NUM_THREADS": "1", "MKL_NUM_THREADS": "1", "OPENBLAS_NUM_THREADS": "1"}


def run_complete(run: RunSpec, layout: StudyLayout) -> bool:
    """An existing run directory, or a trained run whose log and last checkpoint cover ``epochs``."""
    from pcpo_eval.train.checkpoints import latest_checkpoint, read_meta

    if run.train is None:
        return True
    rd = layout.run_dir(run)
    latest = latest_checkpoint(rd)
    if latest is None or not (rd / "log.parquet").is_file():
        return False
    return int(read_meta(latest)["epoch"]) >= int(run.train.epochs)


def pending_runs(spec: StudySpec, layout: StudyLayout, log: Callable[[str], None]) -> list[tuple[RunSpec, bool]]:
    """(run, resume) for every run still to train; a run directory without a checkpoint is removed."""
    from pcpo_eval.train.checkpoints import latest_checkpoint

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
            shutil.rmtree(rd)
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


@contextlib.contextmanager
def _environment(values: dict[str, str]) -> Iterator[None]:
    """Set environment variables while worker processes are spawned (they inherit them); restore after."""
    old = {k: os.environ.get(k) for k in values}
    os.environ.update(values)
    try:
        yield
    finally:
        for k, v in old.items():
            if v is None:
                os.environ.pop(k, None)
            else:
                os.environ[k] = v


def _one_thread() -> None:
    """Worker initializer: one torch thread (the environment already limits OpenMP / MKL)."""
    import torch

    torch.set_num_threads(1)


def train_worker(config: TrainConfig, out_dir: str, resume: bool, log_file: str) -> str:
    """Train one run inside a worker process; console output and any traceback go to ``log_file``."""
    from pcpo_eval.train.trainer import train

    Path(log_file).parent.mkdir(parents=True, exist_ok=True)
    with open(log_file, "a", encoding="utf-8") as fh, contextlib.redirect_stdout(fh), contextlib.redirect_stderr(fh):
        try:
            train(config, out_dir, resume=resume)
        except BaseException:
            traceback.print_exc(file=fh)
            raise
    return out_dir


def _train_parallel(todo: Sequence[tuple[RunSpec, bool]], layout: StudyLayout, parallel: int,
                    log: Callable[[str], None]) -> None:
    """Up to ``parallel`` spawned workers; every run is attempted, failures are reported together."""
    failures: list[str] = []
    ctx = multiprocessing.get_context("spawn")
    with _environment(ONE_THREAD_ENV), ProcessPoolExecutor(min(parallel, len(todo)), mp_context=ctx,
                                                           initializer=_one_thread) as pool:
        futures: dict[Future[str], RunSpec] = {
            pool.submit(train_worker, run.train, str(layout.run_dir(run)), resume, str(layout.train_log(run))): run
            for run, resume in todo
        }
        for fut in as_completed(futures):
            run = futures[fut]
            exc = fut.exception()
            if exc is None:
                log(f"  {run.name}: done (console output in {layout.train_log(run)})")
                continue
            msg = str(exc).splitlines()[0] if str(exc).strip() else type(exc).__name__
            failures.append(f"run {run.name}: {type(exc).__name__}: {msg} (log: {layout.train_log(run)})")
    if failures:
        raise UserError(f"{len(failures)} of {len(todo)} run(s) failed: " + "; ".join(failures)
                        + "; the other runs are kept, re-run the same command to resume")
