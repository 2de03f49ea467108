"""Where the real models' weights live: one locator for every backend, and ``pcpo-eval weights``.

Nothing in pcpo-eval downloads weights. Every real model (feature nets for FID / FD-DINOv2 / LPIPS,
the preference models, the Stable Diffusion base pipelines) is resolved here from local files, in
this order (:func:`locate`):

1. an explicit path passed by the caller (a CLI flag or a factory option);
2. the backend's environment variable (e.g. ``PCPO_HPS_WEIGHTS``); if it is set, it must be valid:
   a wrong variable is an error, never silently skipped;
3. cache candidates, in the order listed: ``$PCPO_WEIGHTS_DIR`` (default
   ``~/.cache/pcpo_eval/weights``) holding the canonical file / folder name, the Hugging Face hub
   cache (``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``~/.cache/huggingface/hub``; the snapshot
   ``refs/main`` points to), the torch hub cache (``TORCH_HOME/hub/checkpoints``) and the places
   the reference packages themselves cache to (clean-fid's ``/tmp``, ImageReward's
   ``~/.cache/ImageReward``, hpsv2's ``~/.cache/hpsv2``).

A backend absent everywhere raises :class:`pcpo_eval.errors.MissingWeightsError` with one line
naming the file and the variable to set. Paths are re-read from the environment on every call,
so tests (and users) can change ``HF_HOME`` / ``TORCH_HOME`` at run time.
"""


from __future__ import annotations

import os
import tempfile
from dataclasses import dataclass
from pathlib import Path

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.weights.backends import BACKENDS, Backend

# --------------------------------------------------------------------------------------------------
# Cache roots (read from the environment on every call)
# --------------------------------------------------------------------------------------------------


def hf_hub_cache() -> Path:
    """Hugging Face hub cache: ``HF_HUB_CACHE``, else ``HF_HOME/hub``, else ``XDG_CACHE_HOME``/default."""
    if os.environ.get("HF_HUB_CACHE"):
        return Path(os.environ["HF_HUB_CACHE"]).expanduser()
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "huggingface" / "hub"


def torch_hub_dir() -> Path:
    """torch hub directory, as ``torch.hub.get_dir()`` computes it (``TORCH_HOME/hub``)."""
    if os.environ.get("TORCH_HOME"):
        return Path(os.environ["TORCH_HOME"]).expanduser() / "hub"
    xdg = os.environ.get("XDG_CACHE_HOME") or "~/.cache"
    return Path(xdg).expanduser() / "torch" / "hub"


def weights_dir() -> Path:
    """pcpo-eval's own weights folder: ``PCPO_WEIGHTS_DIR`` or ``~/.cache/pcpo_eval/weights``."""
    return Path(os.environ.get("PCPO_WEIGHTS_DIR") or "~/.cache/pcpo_eval/weights").expanduser()


def hf_snapshot_file(repo_id: str, filename: str, cache_dir: Path | None = None) -> Path | None:
    """Path of ``filename`` in the cached snapshot of ``repo_id`` (the one ``refs/main`` names), or None.

    Follows the hub cache layout ``models--ORG--NAME/{refs/main, snapshots/REV/FILE}``; if ``refs/main``
    is absent (a snapshot copied by hand) the most recently modified snapshot holding the file is used.
    No network access.
    """
    root = (cache_dir or hf_hub_cache()) / ("models--" + repo_id.replace("/", "--"))
    snapshots = root / "snapshots"
    ref = root / "refs" / "main"
    if ref.is_file():
        candidate = snapshots / ref.read_text().strip() / filename
        if candidate.exists():
            return candidate
    if not snapshots.is_dir():
        return None
    found = [s / filename for s in snapshots.iterdir() if (s / filename).exists()]
    return max(found, key=lambda p: p.stat().st_mtime) if found else None


# --------------------------------------------------------------------------------------------------
# Lookup
# --------------------------------------------------------------------------------------------------


def get_backend(name: str) -> Backend:
    """The :class:`Backend` called ``name``; an unknown name lists the valid ones."""
    if name not in BACKENDS:
        raise UserError(f"unknown weights backend {name!r}; choose one of: {', '.join(BACKENDS)}")
    return BACKENDS[name]


def _as_target(backend: Backend, path: Path) -> Path | None:
    """``path`` if it is a valid location for ``backend`` (a file, or a folder with the marker)."""
    path = path.expanduser()
    if backend.kind == "file":
        if path.is_file():
            return path
        if path.is_dir() and (path / backend.filename).is_file():  # a folder holding the file is fine
            return path / backend.filename
        return None
    return path if (path / backend.filename).is_file() else None


def candidates(backend: Backend) -> list[tuple[str, Path]]:
    """Cache candidates (after the explicit path and the env var), as (label, path), in search order.

    For ``dir`` backends the HF entries are the snapshot folder if found, else the repo's cache folder.
    """
    out: list[tuple[str, Path]] = []
    own = weights_dir() / (backend.cache_name or (backend.filename if backend.kind == "file" else backend.name))
    out.append(("PCPO_WEIGHTS_DIR", own))
    hub = hf_hub_cache()
    for repo in backend.hf_repos:
        hit = hf_snapshot_file(repo, backend.filename, hub)
        if hit is not None:
            out.append((f"HF cache {repo}", hit if backend.kind == "file" else hit.parent))
        else:
            out.append((f"HF cache {repo}", hub / ("models--" + repo.replace("/", "--"))))
    for rel in backend.torch_hub:
        out.append(("TORCH_HOME", torch_hub_dir() / rel))
    for raw in backend.extra:
        out.append(("package cache", Path(raw.replace("{tmp}", tempfile.gettempdir())).expanduser()))
    return out


def _what(backend: Backend) -> str:
    return backend.filename if backend.kind == "file" else f"a folder with {backend.filename}"


def _is_not(backend: Backend, path: str | os.PathLike) -> str:
    """``is not <what>``, or, for an existing folder lacking the marker file, ``lacks <file>``."""
    if backend.kind == "dir" and Path(path).expanduser().is_dir():
        return f"is a folder without {backend.filename} (missing {backend.filename})"
    return f"is not {_what(backend)}"


def locate(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """Path of backend ``name``'s weights: explicit path > env var > cache candidates.

    Returns the weights file (``kind == "file"``) or the model folder (``kind == "dir"``). Raises
    :class:`MissingWeightsError` (one line naming the file and the variable to set) when absent, or
    when the explicit path / env var given is not a valid location (it is never silently skipped).
    """
    backend = get_backend(name)
    if explicit is not None and str(explicit) != "":
        hit = _as_target(backend, Path(explicit))
        if hit is None:
            raise MissingWeightsError(
                f"{name} weights: {explicit} {_is_not(backend, explicit)}; pass the path of {_what(backend)}"
            )
        return hit
    env = os.environ.get(backend.env_var)
    if env:
        hit = _as_target(backend, Path(env))
        if hit is None:
            raise MissingWeightsError(
                f"{name} weights: {backend.env_var}={env} {_is_not(backend, env)}; fix or unset {backend.env_var}"
            )
        return hit
    for _label, path in candidates(backend):
        hit = _as_target(backend, path)
        if hit is not None:
            return hit
    where = f" ({backend.hf_repos[0]})" if backend.kind == "dir" and backend.hf_repos else ""
    raise MissingWeightsError(
        f"{name} weights not found: set {backend.env_var} to the path of {_what(backend)}{where} "
        f"or put it in {weights_dir()}; see `pcpo-eval weights`"
    )


@dataclass(frozen=True)
class BackendStatus:
    """Result of a lookup for the ``weights`` command: found or not, where, and where it looked."""

    name: str
    found: bool
    path: str | None
    error: str | None
    env_var: str
    env_value: str | None
    searched: list[str]
    description: str
    used_by: str
    obtain: str

    def to_dict(self) -> dict:
        return dict(self.__dict__)


def status(name: str) -> BackendStatus:
    """Look up backend ``name`` without raising; record every place searched."""
    backend = get_backend(name)
    searched = [f"${backend.env_var}"] + [f"{label}: {path}" for label, path in candidates(backend)]
    try:
        path, error = str(locate(name)), None
    except MissingWeightsError as exc:
        path, error = None, str(exc)
    return BackendStatus(
        name=name,
        found=path is not None,
        path=path,
        error=error,
        env_var=backend.env_var,
        env_value=os.environ.get(backend.env_var),
        searched=searched,
        description=backend.description,
        used_by=backend.used_by,
        obtain=backend.obtain,
    )


def format_table(rows: list[BackendStatus]) -> str:
    """Plain-text report: one block per backend (found path, or where it looked and how to get it)."""
    lines = [
        f"weights search order: explicit path > env var > {weights_dir()} > HF cache {hf_hub_cache()} "
        f"> torch hub {torch_hub_dir()} > package caches",
        "",
    ]
    for r in rows:
        mark = "found  " if r.found else "MISSING"
        lines.append(f"[{mark}] {r.name:<22} {r.description}")
        lines.append(f"          env {r.env_var}" + (f"={r.env_value}" if r.env_value else " (unset)"))
        if r.found:
            lines.append(f"          path {r.path}")
        else:
            if r.error and r.env_value:
                lines.append(f"          error: {r.error}")
            for s in r.searched[1:]:
                lines.append(f"          looked in {s}")
            lines.append(f"          obtain: {r.obtain}")
        lines.append(f"          used by {r.used_by}")
    return "\n".join(lines)
