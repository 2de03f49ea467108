"""File I/O: atomic output, the one YAML-mapping reader, the one JSON cleaner.

Every writer in the package goes through :func:`atomic_write` (write to a temporary file in the
same directory, fsync, then ``os.replace``), so a crash or SIGKILL leaves either the old file or
the complete new one. Config and spec files are read by :func:`read_yaml_mapping`; result objects
become strict JSON through :func:`to_jsonable`.
"""

from __future__ import annotations

import contextlib
import hashlib
import json
import math
import os
import tempfile
from collections.abc import Iterator
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError


def _current_umask() -> int:
    mask = os.umask(0)
    os.umask(mask)
    return mask


_UMASK = _current_umask()


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb") -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success rename it over ``path``."""
    path = Path(path)
    path.parent.mkdir(parents=True, exist_ok=True)
    fd, tmp = tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    os.chmod(tmp, 0o666 & ~_UMASK)  # mkstemp creates 0600; give the file the usual permissions
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        os.replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def atomic_write_bytes(path: str | os.PathLike, data: bytes) -> None:
    """Write ``data`` to ``path`` atomically."""
    with atomic_write(path, "wb") as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically."""
    atomic_write_bytes(path, text.encode("utf-8"))


def atomic_write_json(path: str | os.PathLike, obj: Any) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically."""
    atomic_write_text(path, json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n")


def atomic_write_parquet(path: str | os.PathLike, df: Any) -> None:
    """Write a pandas DataFrame to Parquet atomically."""
    with atomic_write(path, "wb") as fh:
        df.to_parquet(fh, index=False)


def atomic_save_figure(path: str | os.PathLike, fig: Any, **kwargs: Any) -> None:
    """Save a matplotlib figure atomically (format from the suffix)."""
    path = Path(path)
    with atomic_write(path, "wb") as fh:
        fig.savefig(fh, format=path.suffix.lstrip(".") or "png", **kwargs)


def sha256_file(path: str | os.PathLike, chunk: int = 1 << 20) -> str:
    """Hex SHA-256 of a file's bytes."""
    h = hashlib.sha256()
    with open(path, "rb") as fh:
        while block := fh.read(chunk):
            h.update(block)
    return h.hexdigest()


def read_yaml_mapping(path: str | os.PathLike, what: str, hint: str) -> dict[str, Any]:
    """The mapping in YAML file ``path`` (an empty file is ``{}``).

    A missing file, invalid YAML or a non-mapping raise a one-line UserError naming ``what``
    (e.g. ``study spec``); ``hint`` is the fix appended to the not-found message.
    """
    import yaml

    p = Path(path)
    if not p.is_file():
        raise UserError(f"{what} {p} not found; {hint}")
    try:
        data = yaml.safe_load(p.read_text()) or {}
    except yaml.YAMLError as exc:
        raise UserError(f"{what} {p} is not valid YAML: {str(exc).splitlines()[0]}") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {p} must be a mapping of keys to values")
    return data


def to_jsonable(x: Any) -> Any:
    """Strict-JSON copy, recursively: numpy scalars and arrays -> Python, NaN/inf -> None."""
    if isinstance(x, dict):
        return {str(k): to_jsonable(v) for k, v in x.items()}
    if isinstance(x, list | tuple):
        return [to_jsonable(v) for v in x]
    import numpy as np

    if isinstance(x, np.generic | np.ndarray):  # -> Python scalar / nested lists
        return to_jsonable(x.tolist())
    if isinstance(x, float) and not math.isfinite(x):
        return None
    return x


def _json_default(obj: Any) -> Any:
    import numpy as np

    if isinstance(obj, np.generic):
        return obj.item()
    if isinstance(obj, np.ndarray):
        return obj.tolist()
    if isinstance(obj, Path):
        return str(obj)
    raise TypeError(f"not JSON serializable: {type(obj).__name__}")
