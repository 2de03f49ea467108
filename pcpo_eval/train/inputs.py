"""The files a run's settings name, and what they held when the run read them (``RUN/inputs.json``).

A config value such as ``prompts: train/prompts/x.txt`` names a file by a path string: relative to
the working directory the trainer ran in, and naming whatever the file held at the time.
``config.yaml`` keeps the string as given; the trainer also writes ``RUN/inputs.json``
(:data:`pcpo_eval.rundir.INPUTS_FILE`), one entry per file-valued setting (:data:`FILE_KEYS`) that
named a local file or folder::

    {"prompts": {"value": "train/prompts/x.txt", "resolved": "/home/me/proj/train/prompts/x.txt",
                 "sha256": "9f86d0..."},
     "model": {"value": "sd1:./models/sd15", "resolved": "sd1:/home/me/proj/models/sd15"}}

``value`` is the config's text, ``resolved`` the value with its file part made absolute (what the
trainer opened), ``sha256`` the content digest: of a prompt file, and for ``init_from`` of the
weights it loaded. A model folder (gigabytes of pipeline weights) has no digest: it is identified
by its resolved path. Names (a built-in prompt set, a dataset, a Hugging Face id, ``toy``) have no
entry: the name is their identity.

A study compares runs' file-valued settings through :func:`file_settings`, which turns each into a
:class:`FileSetting`: two runs used the same input when their digests agree (both recorded), else
when their resolved paths agree, else when their texts agree (``pcpo_eval.stats.comparability``).
A run from before ``inputs.json`` has only its text, resolved against the working directory when
that finds the file (its content then is unknown); its ``init_from.json`` still gives the digest
of the weights it started from.
"""

from __future__ import annotations

import functools
import json
from collections.abc import Mapping
from dataclasses import dataclass
from pathlib import Path
from typing import Any

from pcpo_eval.io import atomic_write_json, sha256_file
from pcpo_eval.rundir import init_path, inputs_path

#: TrainConfig keys whose value may name a local file or folder
FILE_KEYS = ("model", "prompts", "validation_prompts", "init_from")
#: the file-valued keys the trainer reads again on ``--resume`` (``init_from`` is loaded at epoch 1 only)
REREAD_ON_RESUME = ("model", "prompts", "validation_prompts")


@dataclass(frozen=True)
class FileSetting:
    """A file-valued setting as a run used it: the config's ``text``, the path it ``resolved`` to (None:
    not found) and the content digest ``sha256`` (None: unknown)."""

    text: str
    resolved: str | None = None
    sha256: str | None = None

    def same_input(self, other: FileSetting) -> bool:
        """The same input: by digest when both have one, else by resolved path when both have one, else by text."""
        if self.sha256 and other.sha256:
            return self.sha256 == other.sha256
        if self.resolved and other.resolved:
            return self.resolved == other.resolved
        return self.text == other.text

    def __str__(self) -> str:
        """The text, with the digest (or the resolved path when it differs from the text) in brackets."""
        if self.sha256:
            return f"{self.text!r} (sha256 {self.sha256[:12]})"
        if self.resolved and self.resolved != self.text:
            return f"{self.text!r} (= {self.resolved})"
        return repr(self.text)


def local_path(key: str, value: Any) -> Path | None:
    """The local file or folder a file-valued setting names (as given, made absolute), or None: a name,
    an empty value, a path that does not exist here, or a key outside :data:`FILE_KEYS`."""
    if key not in FILE_KEYS or not isinstance(value, str) or not value.strip():
        return None
    if key == "model":
        from pcpo_eval.models.registry import parse_spec

        arg = parse_spec(value)[1]
        p = Path(arg).expanduser() if arg else None
    elif key == "init_from":
        p = Path(value).expanduser()
    else:
        from pcpo_eval.prompts import prompt_file

        p = prompt_file(value)
        p = p.expanduser() if p is not None else None
    return p.resolve() if p is not None and p.exists() else None


def resolved_value(key: str, value: str) -> str | None:
    """``value`` with its file part absolute (``sd1:/abs/models/sd15``, ``/abs/x.txt``); None as
    :func:`local_path`."""
    p = local_path(key, value)
    if p is None:
        return None
    if key == "model":
        from pcpo_eval.models.registry import parse_spec

        return f"{parse_spec(value)[0]}:{p}"
    return str(p)


@functools.lru_cache(maxsize=256)
def _file_digest(path: str, mtime_ns: int, size: int) -> str:
    """sha256 of a file, once per (path, modification time, size) in a process (a study asks per run)."""
    return sha256_file(path)


def _digest(path: Path) -> str:
    st = path.stat()
    return _file_digest(str(path), st.st_mtime_ns, st.st_size)


def content_sha256(key: str, value: str) -> str | None:
    """The content digest of what a file-valued setting names now: a prompt file's sha256; for ``init_from``
    the weights' sha256 (a ``.safetensors`` file, or the ``weights_sha256`` of the checkpoint a checkpoint /
    run folder resolves to); None for a model folder (identified by its path) or nothing local."""
    p = local_path(key, value)
    if p is None or key == "model":
        return None
    if key != "init_from":
        return _digest(p) if p.is_file() else None
    if p.is_file():
        return _digest(p)
    from pcpo_eval.errors import UserError
    from pcpo_eval.train.checkpoints import read_meta, resolve_checkpoint

    try:
        ckpt = resolve_checkpoint(p)
        sha = read_meta(ckpt).get("weights_sha256") if ckpt is not None else None
    except UserError:  # a run without a complete checkpoint: reported where it is loaded
        return None
    return str(sha) if sha else None


def input_record(cfg: Mapping[str, Any], digests: Mapping[str, str] | None = None) -> dict[str, dict[str, str]]:
    """The ``inputs.json`` entries of a config as its files are now; ``digests``: a key's digest already
    computed by whoever read the file (the trainer's ``init_from`` weights hash), instead of reading it again."""
    out: dict[str, dict[str, str]] = {}
    for key in FILE_KEYS:
        value = cfg.get(key)
        resolved = resolved_value(key, value) if isinstance(value, str) else None
        if resolved is None:
            continue
        entry = {"value": value, "resolved": resolved}
        sha = (digests or {}).get(key) or content_sha256(key, value)
        if sha:
            entry["sha256"] = sha
        out[key] = entry
    return out


def write_inputs(run_dir: str | Path, record: Mapping[str, Any]) -> None:
    """Write ``RUN/inputs.json`` (atomically)."""
    atomic_write_json(inputs_path(run_dir), dict(record))


def read_inputs(run_dir: str | Path) -> dict[str, dict[str, Any]]:
    """A run's recorded inputs: ``inputs.json`` ({} without one or when unreadable), plus for a run from
    before it that started from ``init_from`` the weights digest its ``init_from.json`` records."""
    out: dict[str, dict[str, Any]] = {}
    for path in (inputs_path(run_dir), init_path(run_dir)):
        try:
            data = json.loads(path.read_text()) if path.is_file() else {}
        except (OSError, ValueError):
            data = {}
        if not isinstance(data, dict):
            continue
        if path == init_path(run_dir):
            if "init_from" not in out and data.get("source") and data.get("weights_sha256"):
                out["init_from"] = {"value": str(data["source"]), "sha256": str(data["weights_sha256"])}
            continue
        out.update({k: v for k, v in data.items() if k in FILE_KEYS and isinstance(v, dict)})
    return out


def file_settings(cfg: Mapping[str, Any], record: Mapping[str, Mapping[str, Any]] | None = None,
                  read_now: bool = False) -> dict[str, Any]:
    """``cfg`` with each file-valued setting that names a file as a :class:`FileSetting`.

    ``record``: the run's :func:`read_inputs` (an entry counts when its ``value`` is the config's text).
    Without one, the text is resolved against the working directory; ``read_now``: also digest the file
    as it is now (a run about to be trained reads it now; an existing run's content then is unknown).
    """
    out = dict(cfg)
    for key in FILE_KEYS:
        value = cfg.get(key)
        if not isinstance(value, str) or not value.strip():
            continue
        entry = (record or {}).get(key)
        if entry is not None and str(entry.get("value")) == value:
            out[key] = FileSetting(value, entry.get("resolved") or resolved_value(key, value), entry.get("sha256"))
            continue
        resolved = resolved_value(key, value)
        if resolved is not None:
            out[key] = FileSetting(value, resolved, content_sha256(key, value) if read_now else None)
    return out


def changed_inputs(record: Mapping[str, Mapping[str, Any]], cfg: Mapping[str, Any]) -> list[str]:
    """The re-read inputs (:data:`REREAD_ON_RESUME`) whose file now differs from ``record`` (content, or the
    path the text resolves to): ``"prompts train/prompts/x.txt (sha256 9f86d0081884 when the run started,
    now 2c26b46b68ff)"``."""
    out = []
    now = input_record({k: cfg.get(k) for k in REREAD_ON_RESUME})
    for key in REREAD_ON_RESUME:
        was, cur = record.get(key), now.get(key, {})
        if was is None or str(was.get("value")) != str(cfg.get(key)):
            continue
        for field in ("sha256", "resolved"):
            if was.get(field) and was.get(field) != cur.get(field):
                then, then_now = str(was[field]), str(cur.get(field) or "missing")
                if field == "sha256":
                    then, then_now = then[:12], then_now[:12]
                out.append(f"{key} {cfg.get(key)} ({field} {then} when the run started, now {then_now})")
                break
    return out
