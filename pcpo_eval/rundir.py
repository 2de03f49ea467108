"""The run-directory contract (paths only): one home for the files a training run leaves.

::

    RUN/config.yaml                       the resolved training config (written first)
    RUN/log.parquet                       one row per epoch (reward, PPO health, timings, ...)
    RUN/checkpoints/epoch_NNNN/           one saved checkpoint (weights, then checkpoint.json last)
    RUN/checkpoints/epoch_NNNN/checkpoint.json   epoch, reward, model spec, objective, file hashes
    RUN/checkpoints/epoch_NNNN/training_state.pt optimizer / tracker state (resume only)

Written by :mod:`pcpo_eval.train` (trainer, checkpoints, importers); read by ``generate``
(``--model RUN/checkpoints/epoch_NNNN``), ``stats`` (selection, speed-up), ``study`` and ``human``.
No stage spells these names itself: it asks this module (``tests/repo/test_file_names.py``).
"""

from __future__ import annotations

import re
from pathlib import Path

#: the run's resolved training config
CONFIG_FILE = "config.yaml"
#: one row per epoch
LOG_FILE = "log.parquet"
#: the folder of saved checkpoints
CHECKPOINTS_DIR = "checkpoints"
#: a checkpoint's metadata; a checkpoint folder counts as complete once it exists
META_FILE = "checkpoint.json"
#: a checkpoint's resumable training state
STATE_FILE = "training_state.pt"
#: a checkpoint folder's name, ``epoch_NNNN``
EPOCH_RE = re.compile(r"^epoch_(\d+)$")


def epoch_name(epoch: int) -> str:
    """``epoch_NNNN``: a checkpoint folder's name (and a study's set label suffix)."""
    return f"epoch_{int(epoch):04d}"


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONFIG_FILE


def log_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / LOG_FILE


def checkpoints_root(run_dir: str | Path) -> Path:
    return Path(run_dir) / CHECKPOINTS_DIR


def checkpoint_dir(run_dir: str | Path, epoch: int) -> Path:
    """``RUN/checkpoints/epoch_NNNN``."""
    return checkpoints_root(run_dir) / epoch_name(epoch)


def meta_path(ckpt: str | Path) -> Path:
    """``CKPT/checkpoint.json``."""
    return Path(ckpt) / META_FILE


def run_dir_of(ckpt: str | Path) -> Path:
    """The run folder of a checkpoint folder."""
    return Path(ckpt).parent.parent


def is_run_dir(path: str | Path) -> bool:
    """A pcpo-eval run folder: ``config.yaml`` and ``checkpoints/``."""
    return config_path(path).is_file() and checkpoints_root(path).is_dir()


def is_checkpoint(path: str | Path) -> bool:
    """A complete checkpoint folder (its ``checkpoint.json`` exists)."""
    return meta_path(path).is_file()


def epoch_dirs(run_dir: str | Path, complete: bool = True) -> list[tuple[int, Path]]:
    """``(epoch, folder)`` of a run's checkpoint folders, in epoch order; ``complete``: only those
    whose ``checkpoint.json`` exists. [] when the run has no ``checkpoints/``."""
    root = checkpoints_root(run_dir)
    if not root.is_dir():
        return []
    found = [(int(m.group(1)), p) for p in root.iterdir()
             if (m := EPOCH_RE.match(p.name)) and (not complete or is_checkpoint(p))]
    return sorted(found)
