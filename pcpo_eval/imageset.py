"""Reading image sets in the generator's contract layout, with the bad-input checks of issue 6.

``SET/manifest.parquet`` (``prompt_id``, ``prompt``, ``seed``, ``path`` relative to SET,
``image_sha256``, ...) and PNGs under ``SET/images/``. Handling of bad input (documented in
docs/metrics.md):

- missing/unreadable/truncated image, or bytes whose sha256 differs from the manifest: UserError
  naming the file. :meth:`ImageSet.verify` hashes every file once per process before a cache keyed
  by those hashes is trusted, so a changed or corrupt PNG is found even when every feature, score and
  LPIPS value of the set is already cached (nothing would decode it);
- grayscale / palette / RGBA / other modes: converted with PIL ``convert("RGB")`` (alpha dropped),
  exactly what clean-fid and dgm-eval do; the count is reported in the settings;
- images of a size different from the set's first image: UserError (a set has one resolution;
  LPIPS pairs need equal sizes). Set and reference may differ in size (extractors resize);
- manifest without the required columns, duplicated (prompt_id, seed), or one prompt_id with two
  prompt texts: UserError.
"""

from __future__ import annotations

import hashlib
import io
import json
import os
import threading
from collections.abc import Sequence
from dataclasses import dataclass, field
from functools import cached_property
from pathlib import Path

import numpy as np
import pandas as pd
import torch
from PIL import Image, UnidentifiedImageError

from pcpo_eval.errors import UserError
from pcpo_eval.io import parallel_map, sha256_file

#: one row per image (the image-set contract)
MANIFEST_FILE = "manifest.parquet"
#: every generation setting + run information; ``status`` ``rendering`` or ``complete``
SET_FILE = "set.json"
#: the folder of a set's images, one subfolder per prompt (:func:`image_rel_path`), and their glob
IMAGES_DIR = "images"
IMAGE_GLOB = "*/*.png"
#: the per-process progress files of a render in flight (``generate/runner.py``; merged into the manifest)
PROGRESS_DIR = ".progress"
#: held (``flock``, :func:`pcpo_eval.io.lock_or_refuse`) by the render writing the set: a second ``generate`` into
#: the same folder is refused (two renders with other settings both finished "complete", the second one's
#: set.json over the first one's images)
LOCK_FILE = ".lock"

def enclosing_set(path: str | Path) -> Path | None:
    """The image set (a folder holding :data:`SET_FILE`) that ``path`` is, or lies inside; None: none. An output
    written there would sit among a set's images and records (``report --figures-dir SET`` wrote 33 figures
    into one)."""
    p = Path(path).resolve()
    return next((d for d in (p, *p.parents) if (d / SET_FILE).is_file()), None)


#: files verified in this process: (device, inode, size, mtime_ns, expected sha256), the file's identity
#: whatever path or link reaches it (a stat, where a real-path lookup costs several); a file changed since
#: (size or mtime) is hashed again
_VERIFIED: set[tuple[int, int, int, int, str]] = set()
_STATS_LOCK = threading.Lock()

REQUIRED_COLUMNS = ("prompt_id", "prompt", "seed", "path", "image_sha256")

#: The repair a missing, modified or undecodable image of a set names: ``generate`` re-renders any image whose
#: file is missing or does not hash to its record; a study's generate stage re-renders missing files only (it
#: does not hash a complete set), so there the damaged file is deleted first
REPAIR = ("re-run the `pcpo-eval generate` command that made the set to re-render it (a study's set: delete the "
          "file and run the study again)")


def _identity(st: os.stat_result, want: str) -> tuple[int, int, int, int, str]:
    """The ``_VERIFIED`` key of a file's stat and its expected sha256."""
    return (st.st_dev, st.st_ino, st.st_size, st.st_mtime_ns, want)


@dataclass
class ReadStats:
    """What the reader had to do to images (reported with the metrics)."""

    converted_to_rgb: dict[str, int] = field(default_factory=dict)

    def as_dict(self) -> dict[str, int]:
        return dict(self.converted_to_rgb)


@dataclass
class ImageSet:
    """An image set: its root and manifest (rows in manifest order)."""

    root: Path
    manifest: pd.DataFrame
    size: tuple[int, int] = (0, 0)  # (width, height) of the first image
    read_stats: ReadStats = field(default_factory=ReadStats)

    @classmethod
    def load(cls, root: str | Path) -> ImageSet:
        """Open ``root/manifest.parquet`` and validate it (no image is decoded except the first).

        A set whose ``set.json`` says ``rendering`` is refused (:func:`check_finished`): a ``generate``
        run is working on it or was interrupted, so its manifest is not the set that run asked for.
        """
        root = Path(root)
        check_finished(root)
        path = root / MANIFEST_FILE
        if not path.is_file():
            raise UserError(
                f"{root} is not an image set: {path} not found (create it with `pcpo-eval generate`)"
            )
        try:
            df = pd.read_parquet(path)
        except Exception as exc:  # pyarrow raises several types for corrupt files
            raise UserError(f"cannot read {path}: {type(exc).__name__}: {exc}".splitlines()[0][:300]
                            + "; re-run `pcpo-eval generate` with the set's settings to rewrite it") from exc
        missing = [c for c in REQUIRED_COLUMNS if c not in df.columns]
        if missing:
            raise UserError(
                f"{path} lacks columns {missing}; an image set manifest needs {list(REQUIRED_COLUMNS)}"
            )
        if len(df) == 0:
            raise UserError(f"{path} lists no images")
        df = df.reset_index(drop=True)
        df["prompt_id"] = df["prompt_id"].astype(np.int64)
        dup = df.duplicated(["prompt_id", "seed"])
        if dup.any():
            row = df[dup].iloc[0]
            raise UserError(
                f"{path}: prompt_id {row.prompt_id} seed {row.seed} appears twice; regenerate the manifest"
            )
        texts = df.groupby("prompt_id")["prompt"].nunique()
        if (texts > 1).any():
            pid = int(texts[texts > 1].index[0])
            raise UserError(
                f"{path}: prompt_id {pid} has several prompt texts; one id must map to one prompt"
            )
        first = root / str(df["path"].iloc[0])
        try:
            with Image.open(first) as im:
                size = im.size
        except (OSError, UnidentifiedImageError) as exc:
            raise UserError(f"unreadable image {first}: {str(exc).splitlines()[0]}; {REPAIR}") from exc
        return cls(root=root, manifest=df, size=size)

    def __len__(self) -> int:
        return len(self.manifest)

    @cached_property
    def shas(self) -> list[str]:
        """``image_sha256`` of each row (manifest order)."""
        return self.manifest["image_sha256"].astype(str).tolist()

    @cached_property
    def paths(self) -> list[str]:
        """``path`` of each row, relative to ``root`` (read per image without pandas' per-row cost)."""
        return self.manifest["path"].astype(str).tolist()

    def verify(self, rows: Sequence[int] | None = None) -> None:
        """Check each listed file (or those of ``rows``) against its ``image_sha256`` (once per process per
        unchanged file; files read and hashed on the thread pool, :func:`parallel_map`).

        The feature, reward and LPIPS caches are keyed by these hashes, so a warm cache never decodes
        the images; this check is what ties the cached values to the bytes on disk. A pass that decodes
        rows anyway verifies only the others (:meth:`read_image` checks what it reads). UserError naming
        the first missing or modified file (in manifest order), with the repair (``generate`` re-renders
        a file whose hash does not match its record).
        """
        paths, shas = self.paths, self.shas
        todo = range(len(paths)) if rows is None else sorted(set(int(r) for r in rows))
        root = str(self.root)
        problems = [p for p in parallel_map(lambda r: self._check_file(os.path.join(root, paths[r]), shas[r]), list(todo))
                    if p]
        if problems:
            raise UserError(problems[0])

    @staticmethod
    def _check_file(full: str, want: str) -> str | None:
        """None if ``full`` hashes to ``want`` (remembered in ``_VERIFIED``), else the error line."""
        try:
            st = os.stat(full)
        except OSError as exc:
            return f"cannot read image {full}: {exc.strerror or exc}; the set is incomplete, {REPAIR}"
        key = _identity(st, want)
        if key in _VERIFIED:
            return None
        try:
            got = sha256_file(full)
        except OSError as exc:
            return f"cannot read image {full}: {exc.strerror or exc}"
        if got != want:
            return f"{full} does not match its image_sha256 in the manifest (the file was modified or is corrupt); {REPAIR}"
        _VERIFIED.add(key)
        return None

    def prompts(self) -> dict[int, str]:
        """prompt_id -> prompt text."""
        first = self.manifest.drop_duplicates("prompt_id")
        return dict(zip(first["prompt_id"].astype(int), first["prompt"].astype(str), strict=True))

    def rows_by_prompt(self) -> dict[int, np.ndarray]:
        """prompt_id -> row indices (manifest order), prompts sorted by id."""
        groups = self.manifest.groupby("prompt_id", sort=True).indices
        return {int(k): np.asarray(v) for k, v in groups.items()}

    def read_image(self, row: int) -> np.ndarray:
        """Decode one image as (H, W, 3) uint8 after the checks in the module docstring."""
        path, want = self.root / self.paths[row], self.shas[row]
        try:
            data = path.read_bytes()
            st = path.stat()
        except OSError as exc:
            raise UserError(f"cannot read image {path}: {exc.strerror or exc}; {REPAIR}") from exc
        key = _identity(st, want)
        if key not in _VERIFIED:
            if hashlib.sha256(data).hexdigest() != want:
                raise UserError(f"{path} does not match its image_sha256 in the manifest; {REPAIR}")
            _VERIFIED.add(key)
        arr = self._decode(data, path)
        if (arr.shape[1], arr.shape[0]) != self.size:
            raise UserError(
                f"{path} is {arr.shape[1]}x{arr.shape[0]} but the set's images are {self.size[0]}x{self.size[1]}; "
                "an image set must have one resolution"
            )
        return arr

    def _decode(self, data: bytes, path: Path) -> np.ndarray:
        """Any image PIL reads, as (H, W, 3) uint8: other modes through ``convert("RGB")`` (counted)."""
        try:
            with Image.open(io.BytesIO(data)) as im:
                im.load()
                if im.mode != "RGB":
                    with _STATS_LOCK:  # read_batch decodes on several threads
                        self.read_stats.converted_to_rgb[im.mode] = (
                            self.read_stats.converted_to_rgb.get(im.mode, 0) + 1
                        )
                    im = im.convert("RGB")
                return np.asarray(im, dtype=np.uint8)
        except (OSError, UnidentifiedImageError, SyntaxError) as exc:
            raise UserError(f"unreadable or truncated image {path}: {str(exc).splitlines()[0]}; {REPAIR}") from exc

    def read_batch(self, rows: np.ndarray | list[int]) -> torch.Tensor:
        """Decode rows as a uint8 (B, 3, H, W) tensor: each image decoded and written channels-first into its
        slot of the batch on the thread pool (:func:`parallel_map`). No thread then stacks and re-lays out
        the whole batch (a serial pass over every byte, which bounds a many-core read pool by Amdahl's law)."""
        rows = [int(r) for r in rows]
        out = np.empty((len(rows), 3, self.size[1], self.size[0]), dtype=np.uint8)

        def fill(i: int) -> None:
            out[i] = self.read_image(rows[i]).transpose(2, 0, 1)

        parallel_map(fill, list(range(len(rows))))
        return torch.from_numpy(out)


def set_status(root: Path) -> str | None:
    """``status`` of ``root/set.json`` (``rendering`` or ``complete``); None when there is no readable
    generate record (a hand-made set: its manifest is its only description)."""
    try:
        status = json.loads((root / SET_FILE).read_text()).get("status")
    except (OSError, ValueError, AttributeError):
        return None
    return status if isinstance(status, str) else None


def check_finished(root: Path) -> None:
    """UserError if ``root/set.json`` records ``status: rendering`` (:func:`set_status`).

    ``generate`` writes ``rendering`` before it touches the folder and ``complete`` with the manifest it
    leaves; in between (running, or killed) the images on disk and the manifest disagree: a resumed set's
    old manifest lists fewer (or other) images than the run was asked for, and metrics on it would be
    numbers of a set nobody asked for.
    """
    f = root / SET_FILE
    if f.is_file() and set_status(root) is None:
        try:
            ok = isinstance(json.loads(f.read_text()), dict)
        except (OSError, ValueError):
            ok = False
        if not ok:  # written atomically by generate: damaged since, so nothing says whether the set is finished
            raise UserError(f"{f} is not readable JSON, so nothing records how {root} was made or whether it is "
                            "finished; re-render it with its `pcpo-eval generate` command into a new --out (or delete "
                            "the folder first), or remove the file if the set was assembled by hand (its manifest "
                            "suffices)")
    if set_status(root) == "rendering":
        raise UserError(
            f"{root} is an unfinished image set ({root / SET_FILE} says status 'rendering': a `pcpo-eval generate` "
            "run is still working on it or was interrupted); wait for it, or re-run that generate command to finish it"
        )


def check_same_prompts(a: ImageSet, b: ImageSet, what: str = "reference") -> None:
    """UserError unless both sets have the same prompt_id -> prompt mapping."""
    pa, pb = a.prompts(), b.prompts()
    if pa == pb:
        return
    only_a = sorted(set(pa) - set(pb))
    only_b = sorted(set(pb) - set(pa))
    if only_a or only_b:
        raise UserError(
            f"prompts differ from the {what}: prompt_ids {only_a[:5]} only in {a.root}, {only_b[:5]} only in {b.root}; "
            "per-prompt FD needs the same prompts in both sets"
        )
    pid = next(k for k in pa if pa[k] != pb[k])
    raise UserError(
        f"prompt_id {pid} is {pa[pid]!r} in {a.root} but {pb[pid]!r} in the {what}; use a matching {what}"
    )


def check_min_images(s: ImageSet, minimum: int, metric: str) -> None:
    """UserError if some prompt has fewer than ``minimum`` images."""
    for pid, rows in s.rows_by_prompt().items():
        if len(rows) < minimum:
            raise UserError(
                f"prompt_id {pid} has {len(rows)} image(s) in {s.root}; {metric} needs at least {minimum} per prompt"
            )


#: Columns of ``SET/manifest.parquet`` (the image-set contract plus the sampler settings).
MANIFEST_COLUMNS = [
    "prompt_id", "prompt", "seed", "path", "image_sha256", "pixel_sha256", "height", "width",
    "model", "model_hash", "sampler", "steps", "cfg", "eta", "schedule", "micro_batch",
]  # fmt: skip


def image_rel_path(prompt_id: int, seed: int) -> str:
    """``images/p{prompt_id:05d}/s{seed:07d}.png``."""
    return f"{IMAGES_DIR}/p{prompt_id:05d}/s{seed:07d}.png"
