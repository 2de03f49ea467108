"""Feature cache per (image set, extractor), keyed by image sha256, written in atomic chunks.

Layout: ``CACHE/<extractor>-<settings digest>/``, with ``settings.json`` (everything that
determines the features: extractor name, weights sha256, resize, ...) and one
``chunk-<digest of its keys>.npz`` per computed batch holding ``keys`` (image sha256 or another
row key) and one array per output (``features``, ``logits``, ``score``). Every chunk is written
with :func:`pcpo_eval.io.atomic_write`, so a SIGKILL leaves only complete chunks and a re-run
computes just the keys not found in any chunk. Different weights or settings give a different
digest, hence a different directory: features never mix.
"""

from __future__ import annotations

import hashlib
import json
import sys
import zipfile
from pathlib import Path
from typing import Any

import numpy as np

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_write, atomic_write_json


def settings_digest(settings: dict[str, Any]) -> str:
    """Stable sha256 of a JSON-serializable settings dict."""
    return hashlib.sha256(json.dumps(settings, sort_keys=True, default=str).encode()).hexdigest()


class FeatureCache:
    """Hash-keyed store of per-image arrays for one extractor configuration."""

    def __init__(self, root: str | Path, name: str, settings: dict[str, Any]) -> None:
        self.settings = settings
        self.dir = Path(root) / f"{name}-{settings_digest(settings)[:16]}"
        try:
            self.dir.mkdir(parents=True, exist_ok=True)
            if not (self.dir / "settings.json").exists():
                atomic_write_json(self.dir / "settings.json", settings)
        except OSError as exc:
            raise UserError(
                f"cannot write the feature cache at {self.dir} ({exc.strerror}); pass --cache-dir"
            ) from exc
        self._index: dict[str, tuple[Path, int]] = {}
        self.refresh()

    def refresh(self) -> None:
        """Re-scan the chunk files (other ranks may have written some)."""
        self._index.clear()
        for path in sorted(self.dir.glob("chunk-*.npz")):
            try:
                with np.load(path) as z:
                    keys = z["keys"]
            except (
                OSError,
                ValueError,
                KeyError,
                zipfile.BadZipFile,
            ) as exc:  # cannot happen with atomic writes
                print(f"warning: ignoring unreadable cache chunk {path}: {exc}", file=sys.stderr)
                continue
            for i, k in enumerate(keys.tolist()):
                self._index.setdefault(str(k), (path, i))

    def __contains__(self, key: str) -> bool:
        return key in self._index

    def __len__(self) -> int:
        return len(self._index)

    def missing(self, keys: list[str]) -> list[str]:
        """Keys not yet cached (first occurrence order, duplicates removed)."""
        return [k for k in dict.fromkeys(keys) if k not in self._index]

    def write_chunk(self, keys: list[str], arrays: dict[str, np.ndarray]) -> Path:
        """Atomically store one computed batch."""
        for name, arr in arrays.items():
            if len(arr) != len(keys):
                raise ValueError(f"array {name!r} has {len(arr)} rows for {len(keys)} keys")
        digest = hashlib.sha256("\n".join(keys).encode()).hexdigest()[:20]
        path = self.dir / f"chunk-{digest}.npz"
        with atomic_write(path, "wb") as fh:
            np.savez(fh, keys=np.asarray(keys, dtype=str), **{k: np.asarray(v) for k, v in arrays.items()})
        for i, k in enumerate(keys):
            self._index.setdefault(k, (path, i))
        return path

    def gather(self, keys: list[str], names: list[str]) -> dict[str, np.ndarray]:
        """Arrays for ``keys`` in the given order (every key must be cached)."""
        absent = [k for k in keys if k not in self._index]
        if absent:
            raise KeyError(f"{len(absent)} keys not in cache {self.dir}, e.g. {absent[0]}")
        by_chunk: dict[Path, list[tuple[int, int]]] = {}
        for pos, k in enumerate(keys):
            path, i = self._index[k]
            by_chunk.setdefault(path, []).append((pos, i))
        out: dict[str, np.ndarray] = {}
        for path, pairs in by_chunk.items():
            pos = np.fromiter((p for p, _ in pairs), dtype=np.int64)
            src = np.fromiter((i for _, i in pairs), dtype=np.int64)
            for name, arr in self._read_chunk(path, names).items():
                if name not in out:
                    out[name] = np.empty((len(keys), *arr.shape[1:]), dtype=arr.dtype)
                out[name][pos] = arr[src]
        return out

    def _read_chunk(self, path: Path, names: list[str]) -> dict[str, np.ndarray]:
        """The arrays ``names`` of one chunk. A chunk whose keys read but whose arrays do not (bytes
        damaged on disk after the atomic write: a bad CRC) is one UserError naming it, with the repair."""
        try:
            with np.load(path) as z:
                return {name: z[name] for name in names}
        except (OSError, ValueError, KeyError, zipfile.BadZipFile) as exc:
            raise UserError(
                f"feature cache chunk {path} is damaged ({type(exc).__name__}: {exc}); delete it and re-run "
                "to compute its images again"
            ) from exc
