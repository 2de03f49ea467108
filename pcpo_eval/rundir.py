"""The run-directory contract: one home for the files a training run leaves (paths, and the log reader).

::

    RUN/config.yaml                       the resolved training config (written first)
    RUN/inputs.json                       what each file-valued setting named when the run started:
                                          its absolute path and content sha256 (prompts, model, ...)
    RUN/init_from.json                    runs started from ``init_from``: the source and its weights hash
    RUN/log.parquet                       one row per epoch (reward, PPO health, timings, ...)
    RUN/checkpoints/epoch_NNNN/           one saved checkpoint (weights, then checkpoint.json last)
    RUN/checkpoints/epoch_NNNN/checkpoint.json   epoch, reward, model spec, objective, file hashes
    RUN/checkpoints/epoch_NNNN/training_state.pt optimizer / tracker state (resume only)

Written by :mod:`pcpo_eval.train` (trainer, checkpoints, importers); read by ``generate``
(``--model RUN/checkpoints/epoch_NNNN``), ``stats`` (selection, speed-up), ``study`` and ``human``.
No stage spells these names itself: it asks this module (``tests/repo/test_file_names.py``).
:func:`load_log` reads and validates ``RUN/log.parquet`` (pandas is imported on first use, so the
paths stay import-light).
"""

from __future__ import annotations

import math
import re
from collections.abc import Sequence
from pathlib import Path
from typing import TYPE_CHECKING, TypeVar

from pcpo_eval.errors import UserError

if TYPE_CHECKING:
    import pandas as pd

#: the run's resolved training config
CONFIG_FILE = "config.yaml"
#: the files the run's settings named, as read when it started (:mod:`pcpo_eval.train.inputs`)
INPUTS_FILE = "inputs.json"
#: a run started from ``init_from``: its source, resolved checkpoint and weights hash
INIT_FILE = "init_from.json"
#: one row per epoch
LOG_FILE = "log.parquet"
#: the folder of saved checkpoints
CHECKPOINTS_DIR = "checkpoints"
#: a checkpoint's metadata; a checkpoint folder counts as complete once it exists
META_FILE = "checkpoint.json"
#: a checkpoint's resumable training state
STATE_FILE = "training_state.pt"
#: held (``flock``) by the process training the run (:func:`pcpo_eval.train.checkpoints.lock_run`)
RUN_LOCK = ".lock"
#: What a run folder holds at its top level (the trackers' folders aside: train.tracking.TRACKER_DIRS).
RUN_ENTRIES = (CONFIG_FILE, INPUTS_FILE, INIT_FILE, LOG_FILE, CHECKPOINTS_DIR, RUN_LOCK)
#: a checkpoint folder's name, ``epoch_NNNN``
EPOCH_RE = re.compile(r"^epoch_(\d+)$")
#: the columns every training log needs (``log.parquet``; more are kept)
LOG_COLUMNS = ("epoch", "reward_mean")
#: the log column of the images sampled in an epoch over all processes (with ``processes``), which
#: ``config.yaml`` cannot tell: its batch sizes are per process
LOGGED_IMAGES = "images"
#: the log column of the paired untrained control's reward each epoch (``paired_control: true``: the base
#: model sampled on the epoch's prompts and noises), against which a run's learning is measured
CONTROL_COLUMN = "control_reward_mean"


def epoch_name(epoch: int) -> str:
    """``epoch_NNNN``: a checkpoint folder's name (and a study's set label suffix)."""
    return f"epoch_{int(epoch):04d}"


def config_path(run_dir: str | Path) -> Path:
    return Path(run_dir) / CONFIG_FILE


def inputs_path(run_dir: str | Path) -> Path:
    """``RUN/inputs.json``."""
    return Path(run_dir) / INPUTS_FILE


def init_path(run_dir: str | Path) -> Path:
    """``RUN/init_from.json``."""
    return Path(run_dir) / INIT_FILE


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


def validate_log(df: pd.DataFrame, name: str = "log") -> pd.DataFrame:
    """Check the training-log columns and return it sorted by epoch."""
    import numpy as np
    import pandas as pd

    missing = [c for c in LOG_COLUMNS if c not in df.columns]
    if missing:
        raise UserError(
            f"{name} lacks column {missing[0]!r} (needs {', '.join(LOG_COLUMNS)}; has {', '.join(map(str, df.columns))})"
        )
    if len(df) == 0:
        raise UserError(f"{name} has no rows")
    for c in LOG_COLUMNS:
        if not pd.api.types.is_numeric_dtype(df[c]):
            raise UserError(f"{name} column {c!r} is not numeric (dtype {df[c].dtype})")
        n_bad = int(df[c].isna().sum())
        if n_bad:
            where = ""
            if c != "epoch" and not df["epoch"].isna().any():
                bad = df.loc[df[c].isna(), "epoch"].astype(int).tolist()
                where = f" (epoch {', '.join(map(str, bad[:6]))}{', ...' if len(bad) > 6 else ''})"
            raise UserError(f"{name} column {c!r} has {n_bad} missing/NaN values{where}; a diverged or crashed epoch? "
                            "drop those rows (no smoothing window spans a missing epoch) or leave the run out")
    epochs = df["epoch"].to_numpy(dtype=float)
    if not (epochs == np.round(epochs)).all():
        bad = epochs[epochs != np.round(epochs)][0]
        raise UserError(f"{name} column 'epoch' holds {bad:g}, not a whole epoch; one row per epoch, numbered 1, 2, ... "
                        "(a log per step or per update needs averaging into epochs first)")
    if epochs.min() < 1:
        raise UserError(f"{name} starts at epoch {epochs.min():g}; epochs are numbered from 1 (epoch E's reward is "
                        "sampled by the policy after E - 1 rounds of updates), so a log numbered from 0 would reach "
                        "every target one epoch early: add 1 to its epochs")
    if df["epoch"].duplicated().any():
        dup = int(df.loc[df["epoch"].duplicated(), "epoch"].iloc[0])
        raise UserError(f"{name} has epoch {dup} more than once (one row per epoch expected)")
    return df.sort_values("epoch").reset_index(drop=True)


def logged_images_per_epoch(run_dir: str | Path, log: pd.DataFrame | None = None) -> int | None:
    """Images a run sampled per epoch over all its processes, from its log's :data:`LOGGED_IMAGES` column
    (None: a log from before that column, an unreadable log, or a count that changed between epochs).
    ``log``: the run's log already read (else only that column is read from ``run_dir``)."""
    import pandas as pd

    if log is None:
        try:
            log = pd.read_parquet(log_path(run_dir), columns=[LOGGED_IMAGES])
        except (OSError, ValueError, KeyError, ImportError):
            return None
    col = log[LOGGED_IMAGES].dropna().unique() if LOGGED_IMAGES in log.columns else []
    return int(col[0]) if len(col) == 1 else None


K = TypeVar("K")

#: the columns that make a run's learning curves: two runs equal in all of them are one run twice
CURVE_COLUMNS = ("epoch", "reward_mean", CONTROL_COLUMN)


#: how close two logs' curves must be, relative, to be one run: a re-export, a CSV round trip or a last-digit
#: edit stays within it; two seeds' batch means differ by far more
SAME_CURVE_RTOL = 1e-5


def same_curves(a: pd.DataFrame, b: pd.DataFrame) -> bool:
    """Whether two logs are one run's: on every epoch they share (all of the shorter log's, at least 2) their
    :data:`CURVE_COLUMNS` agree within :data:`SAME_CURVE_RTOL` (the control where both have it). So a copy,
    a copy with one value moved in its last digit, and a copy that ends earlier (an export taken sooner)
    are one run; before, only bit-equal curves were, and five such copies of one run passed as five seeds."""
    import numpy as np

    ea, eb = a["epoch"].to_numpy(np.int64), b["epoch"].to_numpy(np.int64)
    shared = np.intersect1d(ea, eb)
    if shared.size < 2 or shared.size < min(np.unique(ea).size, np.unique(eb).size):
        return False
    cols = [c for c in CURVE_COLUMNS[1:] if c in a.columns and c in b.columns]
    ia, ib = a.set_index("epoch"), b.set_index("epoch")
    for c in cols:
        x, y = ia.loc[shared, c].to_numpy(np.float64), ib.loc[shared, c].to_numpy(np.float64)
        if not np.allclose(x, y, rtol=SAME_CURVE_RTOL, atol=1e-12, equal_nan=True):
            return False
    return bool(cols)


_Point = tuple[int, int, float, dict[int, float]] | None


def _first_point(log: pd.DataFrame) -> _Point:
    """(epochs, first epoch, its reward, epoch -> reward) of a log: what :func:`twin_runs` screens pairs on
    (None: a log without both columns, never screened out)."""
    import numpy as np

    if "epoch" not in log.columns or "reward_mean" not in log.columns or len(log) == 0:
        return None
    e, r = log["epoch"].to_numpy(np.int64), log["reward_mean"].to_numpy(np.float64)
    i = int(np.argmin(e))
    return int(np.unique(e).size), int(e[i]), float(r[i]), dict(zip(e.tolist(), r.tolist(), strict=True))


def _may_be_twins(a: _Point, b: _Point) -> bool:
    """A necessary condition of :func:`same_curves`, in constant time: the shorter log's first epoch is in the
    other with the same reward (within :data:`SAME_CURVE_RTOL`, taken on the larger of the two)."""
    if a is None or b is None:
        return True
    short, other = (a, b) if a[0] <= b[0] else (b, a)
    if short[0] < 2 or short[1] not in other[3]:
        return False
    x, y = short[2], other[3][short[1]]
    return x == y or (math.isnan(x) and math.isnan(y)) or abs(x - y) <= 1e-12 + SAME_CURVE_RTOL * max(abs(x), abs(y))


def twin_runs(logs: Sequence[tuple[K, pd.DataFrame]]) -> list[tuple[K, K]]:
    """Each ``(key, log)`` with the first later one that is the same run (:func:`same_curves`), in order.
    Pairs are screened on one value first (:func:`_may_be_twins`): comparing every pair's whole curves took
    about 2 ms a pair, 26 s for 160 runs."""
    points = [_first_point(log) for _, log in logs]
    out = []
    for i, (ka, la) in enumerate(logs):
        twin = next((kb for j, (kb, lb) in enumerate(logs[i + 1:], start=i + 1)
                     if _may_be_twins(points[i], points[j]) and same_curves(la, lb)), None)
        if twin is not None:
            out.append((ka, twin))
    return out


def load_log(path: str | Path) -> pd.DataFrame:
    """Read a training log: a .parquet/.csv file or a RUN directory (``RUN/log.parquet``)."""
    import pandas as pd

    p = Path(path)
    if p.is_dir():
        cand = [log_path(p), p / "log.csv"]
        found = [c for c in cand if c.is_file()]
        if not found:
            raise UserError(f"run directory {p} has no log.parquet")
        p = found[0]
    if not p.is_file():
        raise UserError(f"log {p} does not exist; give a run folder or its log.parquet / .csv")
    try:
        if p.suffix.lower() == ".csv":
            df = pd.read_csv(p)
        elif p.suffix.lower() in (".parquet", ".pq"):
            df = pd.read_parquet(p)
        else:
            raise UserError(f"log {p} must be .parquet or .csv (or a run directory)")
    except UserError:
        raise
    except Exception as exc:
        detail = str(exc).splitlines()[0] if str(exc) else "no detail"
        raise UserError(f"cannot read log {p} ({type(exc).__name__}: {detail}); restore it from a copy, or re-import "
                        "or re-train the run that wrote it") from None
    return validate_log(df, f"log {p}")

