"""Experiment tracking for training runs: TensorBoard, Weights & Biases and trackio behind one interface.

``log_to`` (a train config key; ``pcpo-eval train --log-to``) names the backends, comma-separated.
Every backend receives, from process 0 only:

1. the full resolved config, once (TensorBoard: a ``config`` text; W&B / trackio: the run config);
2. per epoch, every finite scalar of the epoch's ``log.parquet`` row (reward, control reward, PPO
   health, loss, KL, learning rate, wall clock, validation reward, diagnostics), at step = epoch;
3. a histogram of the epoch's rewards (all processes' samples);
4. every ``log_images_every`` epochs, a grid of the epoch's first sampled images, captioned with
   their prompts.

Nothing leaves the machine unless asked: W&B runs in offline mode unless ``wandb_mode: online``
(``wandb sync`` uploads later), and trackio writes its SQLite database under the run directory
(``RUN/trackio``; ``trackio show`` reads it). TensorBoard event files go to ``RUN/tb`` as before.
The W&B and trackio packages are optional (``pip install 'pcpo-eval[tracking]'``).
"""

from __future__ import annotations

import os
from pathlib import Path
from typing import Any, Protocol

import numpy as np

from pcpo_eval.errors import UserError
from pcpo_eval.registry import optional_module

#: backend names accepted by ``log_to``
TRACKERS = ("tensorboard", "wandb", "trackio")
#: ``wandb_mode`` values (``disabled`` logs nothing; ``online`` uploads as the run goes)
WANDB_MODES = ("offline", "online", "disabled")
#: images in a sample grid
GRID_IMAGES = 16

#: The folders the trackers write inside a run (TensorBoard, trackio, W&B), which a run folder may hold.
TRACKER_DIRS = ("tb", "trackio", "wandb")


def parse_log_to(value: str) -> tuple[str, ...]:
    """``"tensorboard,wandb"`` -> ("tensorboard", "wandb"); ``""`` or ``"none"`` -> (); unknown names
    raise a UserError listing the valid ones."""
    names = tuple(dict.fromkeys(n.strip() for n in str(value).split(",") if n.strip() and n.strip() != "none"))
    bad = [n for n in names if n not in TRACKERS]
    if bad:
        raise UserError(f"log_to: unknown tracker(s) {', '.join(bad)}; choose from {', '.join(TRACKERS)} "
                        "(comma-separated), or none")
    return names


def image_grid(images: np.ndarray, ncol: int = 4) -> np.ndarray:
    """(N, 3, H, W) uint8 -> one (rows*H, ncol*W, 3) uint8 grid, row-major, black where no image."""
    n, c, h, w = images.shape
    ncol = max(1, min(ncol, n))
    rows = -(-n // ncol)
    grid = np.zeros((rows * h, ncol * w, c), dtype=np.uint8)
    for i in range(n):
        r, k = divmod(i, ncol)
        grid[r * h : (r + 1) * h, k * w : (k + 1) * w] = images[i].transpose(1, 2, 0)
    return grid


def epoch_scalars(row: dict[str, Any]) -> dict[str, float]:
    """The finite numeric entries of an epoch row (booleans and the epoch itself excluded)."""
    out = {}
    for k, v in row.items():
        if k == "epoch" or isinstance(v, bool) or not isinstance(v, int | float | np.floating | np.integer):
            continue
        if np.isfinite(v):
            out[k] = float(v)
    return out


def _require(name: str) -> Any:
    """The tracker package ``name``, or a UserError with the install command."""
    mod = optional_module(name)
    if mod is None:
        raise UserError(f"log_to={name} needs the {name} package; pip install 'pcpo-eval[tracking]' "
                        f"(or pip install {name}), or drop {name} from log_to")
    return mod


def wandb_api_key_present() -> bool:
    """A W&B API key is configured: ``WANDB_API_KEY``, or a netrc entry (what ``wandb login`` writes) for
    the host of ``WANDB_BASE_URL`` (default api.wandb.ai) in ``$NETRC`` or ``~/.netrc``."""
    import netrc
    import os
    from urllib.parse import urlparse

    if os.environ.get("WANDB_API_KEY", "").strip():
        return True
    host = urlparse(os.environ.get("WANDB_BASE_URL", "https://api.wandb.ai")).hostname or "api.wandb.ai"
    path = os.environ.get("NETRC") or os.path.join(os.path.expanduser("~"), ".netrc")
    try:
        auth = netrc.netrc(path).authenticators(host)
    except (OSError, netrc.NetrcParseError):
        return False
    return bool(auth and auth[2])


def check_trackers(log_to: str, wandb_mode: str) -> None:
    """Before any work: the trackers' packages are installed, and W&B online has an API key (else
    ``wandb.init`` fails, or waits for a login prompt, after the run folder is written)."""
    names = parse_log_to(log_to)
    for name in names:
        _require(name)
    if "wandb" in names and wandb_mode == "online" and not wandb_api_key_present():
        raise UserError("log_to includes wandb with wandb_mode=online, but no W&B API key is configured "
                        "(WANDB_API_KEY unset, no api.wandb.ai entry in ~/.netrc); run `wandb login` or set "
                        "WANDB_API_KEY, or use wandb_mode=offline and upload later with `wandb sync`")


class Tracker(Protocol):
    """One backend: scalars, a histogram and an image grid per step (epoch)."""

    def log_epoch(self, step: int, scalars: dict[str, float], rewards: np.ndarray,
                  grid: np.ndarray | None, caption: str) -> None: ...

    def close(self) -> None: ...


class TensorBoardTracker:
    """``RUN/tb`` event files (torch's SummaryWriter)."""

    def __init__(self, out: Path, config: dict[str, Any]) -> None:
        import yaml
        from torch.utils.tensorboard import SummaryWriter

        self.writer = SummaryWriter(str(out / TRACKER_DIRS[0]))
        self.writer.add_text("config", "```yaml\n" + yaml.safe_dump(config, sort_keys=False) + "```", 0)

    def log_epoch(self, step, scalars, rewards, grid, caption) -> None:
        for k, v in scalars.items():
            self.writer.add_scalar(k, v, step)
        if len(rewards):
            self.writer.add_histogram("reward", np.asarray(rewards, dtype=np.float64), step)
        if grid is not None:
            self.writer.add_image("samples", grid, step, dataformats="HWC")
            self.writer.add_text("samples/prompts", caption, step)
        self.writer.flush()

    def close(self) -> None:
        self.writer.close()


class WandbTracker:
    """A W&B run under ``RUN/wandb`` (offline unless ``mode='online'``)."""

    def __init__(self, out: Path, config: dict[str, Any], project: str, name: str, mode: str) -> None:
        self.wandb = _require("wandb")
        self.run = self.wandb.init(project=project, name=name, dir=str(out), mode=mode, config=config,
                                   settings=self.wandb.Settings(silent=True))

    def log_epoch(self, step, scalars, rewards, grid, caption) -> None:
        data: dict[str, Any] = dict(scalars)
        if len(rewards):
            data["reward_hist"] = self.wandb.Histogram(np.asarray(rewards, dtype=np.float64))
        if grid is not None:
            data["samples"] = self.wandb.Image(grid, caption=caption)
        self.run.log(data, step=step)

    def close(self) -> None:
        self.run.finish()


class TrackioTracker:
    """A trackio run whose SQLite database lives in ``RUN/trackio`` (no dashboard is started)."""

    def __init__(self, out: Path, config: dict[str, Any], project: str, name: str, resume: bool) -> None:
        os.environ["TRACKIO_DIR"] = str(out / TRACKER_DIRS[1])  # read when trackio is first imported
        self.trackio = _require("trackio")
        self._point_storage_at(out / TRACKER_DIRS[1])
        self.trackio.init(project=project, name=name, config=config, resume="allow" if resume else "never",
                          embed=False, auto_log_gpu=False, auto_log_cpu=False)

    def _point_storage_at(self, directory: Path) -> None:
        """trackio binds TRACKIO_DIR / MEDIA_DIR at import (``from trackio.utils import ...`` in several
        modules): point every loaded trackio module at this run's directory, so a second run in the
        same process (a sequential study) does not write into the first run's database."""
        import sys

        directory.mkdir(parents=True, exist_ok=True)
        for name, mod in list(sys.modules.items()):
            if mod is None or not (name == "trackio" or name.startswith("trackio.")):
                continue
            if isinstance(getattr(mod, "TRACKIO_DIR", None), Path):
                mod.TRACKIO_DIR = directory
            if isinstance(getattr(mod, "MEDIA_DIR", None), Path):
                mod.MEDIA_DIR = directory / "media"

    def log_epoch(self, step, scalars, rewards, grid, caption) -> None:
        data: dict[str, Any] = dict(scalars)
        if len(rewards):
            data["reward_hist"] = self.trackio.Histogram(np.asarray(rewards, dtype=np.float64))
        if grid is not None:
            data["samples"] = self.trackio.Image(grid, caption=caption)
        self.trackio.log(data, step=step)

    def close(self) -> None:
        self.trackio.finish()


class RunTracking:
    """Fan-out over the configured backends; a no-op on processes other than 0 or with ``log_to`` empty."""

    def __init__(self, trackers: list[Tracker], log_images_every: int) -> None:
        self.trackers = trackers
        self.log_images_every = log_images_every

    def log_epoch(self, row: dict[str, Any], rewards: np.ndarray, images: np.ndarray | None,
                  prompts: list[str]) -> None:
        """One epoch: ``row`` (the log.parquet row), all rewards, this process's images (N, 3, H, W) uint8."""
        if not self.trackers:
            return
        step = int(row["epoch"])
        grid, caption = None, ""
        if images is not None and len(images) and self.log_images_every > 0 and step % self.log_images_every == 0:
            k = min(GRID_IMAGES, len(images))
            grid = image_grid(np.asarray(images[:k]))
            caption = " | ".join(f"{i}: {p}" for i, p in enumerate(prompts[:k]))
        scalars = epoch_scalars(row)
        for t in self.trackers:
            t.log_epoch(step, scalars, np.asarray(rewards), grid, caption)

    def close(self) -> None:
        for t in self.trackers:
            t.close()


def open_tracking(out: str | Path, config: dict[str, Any], log_to: str, project: str, wandb_mode: str,
                  log_images_every: int, is_main: bool, resume: bool = False) -> RunTracking:
    """The run's trackers (process 0 only); ``config`` is the full resolved train config."""
    names = parse_log_to(log_to) if is_main else ()
    out = Path(out)
    trackers: list[Tracker] = []
    for name in names:
        if name == "tensorboard":
            trackers.append(TensorBoardTracker(out, config))
        elif name == "wandb":
            trackers.append(WandbTracker(out, config, project, out.name, wandb_mode))
        else:
            trackers.append(TrackioTracker(out, config, project, out.name, resume))
    return RunTracking(trackers, log_images_every)
