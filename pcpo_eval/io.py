"""File I/O: atomic output with the usual permissions, the one YAML-mapping reader, the one JSON cleaner.

Every writer in the package goes through :func:`atomic_write` (write to a temporary file in the
same directory, fsync, then ``os.replace``) or :func:`atomic_dir` (a whole folder), so a crash or
SIGKILL leaves either the old file or the complete new one. Files end with mode ``0666 & ~umask``
and folders ``0777 & ~umask`` -- what ``open``/``mkdir`` give -- although ``mkstemp``/``mkdtemp``
create them private. A path that cannot be written (a parent that is a plain file, a folder
without write permission) is a one-line :class:`~pcpo_eval.errors.UserError` before anything is
written. Config and spec files are read by :func:`read_yaml_mapping`; :func:`check_finite` rejects
NaN/inf in them; result objects become strict JSON through :func:`to_jsonable`; weights become
byte-reproducible safetensors through :func:`safetensors_bytes`. Temporary files and folders
left by a killed writer (``.{name}.XXXXXXXX.tmp``) are removed by :func:`remove_stale_temps` when
the same command runs again in the same folder, unless a live process still holds them open.
"""

from __future__ import annotations

import atexit
import contextlib
import hashlib
import json
import math
import numbers
import os
import re
import shutil
import tempfile
import time
from collections.abc import Callable, Iterable, Iterator, Mapping, Sequence
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError


def current_umask() -> int:
    """This process's umask, read without changing it (``/proc/self/status``; else set and restore)."""
    status = Path("/proc/self/status")
    if status.is_file():
        for line in status.read_text().splitlines():
            if line.startswith("Umask:"):
                return int(line.split()[1], 8)
    mask = os.umask(0o022)
    os.umask(mask)
    return mask


def file_mode() -> int:
    """Mode of a new file: ``0666 & ~umask``, what ``open(path, "w")`` gives."""
    return 0o666 & ~current_umask()


def dir_mode() -> int:
    """Mode of a new folder: ``0777 & ~umask``, what ``mkdir`` gives."""
    return 0o777 & ~current_umask()


def ensure_dir(path: str | os.PathLike, what: str = "output folder") -> Path:
    """Create folder ``path`` and its parents (mode ``0777 & ~umask``); a bad path is a UserError.

    A parent that is a plain file, or a parent the user may not write, is reported in one line
    naming ``what`` (e.g. ``--out``), before anything is written.
    """
    p = Path(path)
    try:
        p.mkdir(parents=True, exist_ok=True)
    except (FileExistsError, NotADirectoryError):
        blocker = next((q for q in (p, *p.parents) if q.exists() and not q.is_dir()), p)
        raise UserError(f"cannot create {what} {p}: {blocker} is a file, not a folder; "
                        "choose a path under a folder") from None
    except PermissionError:
        raise UserError(f"cannot create {what} {p}: permission denied; "
                        "choose a folder you can write") from None
    return p


#: bytes a written file's name needs beyond its own: the temporary ``.{name}.XXXXXXXX.tmp`` of atomic writes
TEMP_NAME_EXTRA = 14


def check_name_lengths(p: Path, what: str, folder: bool = True) -> None:
    """Every name in ``p`` fits the file system's limit (NAME_MAX bytes, usually 255; an output file's
    own name 14 bytes fewer, for its temporary name) and the whole path fits PATH_MAX: one UserError."""
    anc = Path(p.absolute().anchor or "/")
    for q in reversed(p.absolute().parents):  # the deepest existing folder, found from the root down
        try:
            if not q.is_dir():
                break
        except OSError:  # e.g. a name too long to look up
            break
        anc = q
    try:
        name_max = os.pathconf(anc, "PC_NAME_MAX")
        path_max = os.pathconf(anc, "PC_PATH_MAX")
    except (OSError, ValueError, AttributeError):  # not POSIX: the usual limits
        name_max, path_max = 255, 4096
    parts = p.parts
    for i, part in enumerate(parts):
        limit = name_max - (TEMP_NAME_EXTRA if i == len(parts) - 1 and not folder else 0)
        n = len(os.fsencode(part))
        if n > limit:
            short = part if len(part) <= 40 else part[:20] + "..." + part[-12:]
            raise UserError(f"{what} {short!r}: a name of {n} bytes is too long (at most {limit} bytes here); "
                            "choose a shorter name")
    if len(os.fsencode(str(p.absolute()))) >= path_max:
        raise UserError(f"{what}: the path is {len(os.fsencode(str(p.absolute())))} bytes long (at most "
                        f"{path_max - 1} here); choose a shorter path")


def check_out_path(path: str | os.PathLike, what: str = "--out", folder: bool = True,
                   inputs: Iterable[str | os.PathLike] = ()) -> Path:
    """Check, without writing anything, that output ``path`` (a folder, or a file) can be written.

    Raises a one-line UserError when a folder is expected and ``path`` is a file (or the other
    way round), when a parent is a plain file, when the nearest existing folder is not writable, or when
    the output would overwrite one of the command's ``inputs`` (:func:`check_not_an_input`) -- so a
    command fails before it computes or writes anything. Returns ``Path(path)``.
    """
    p = Path(path)
    check_not_an_input(p, what, inputs)
    check_name_lengths(p, what, folder)
    if p.exists() and folder and not p.is_dir():
        raise UserError(f"{what} {p} is a file, not a folder; choose a folder path")
    if p.exists() and not folder and p.is_dir():
        raise UserError(f"{what} {p} is a folder; give a file name inside it")
    start = p if folder else p.parent
    anc = next((q for q in (start, *start.parents) if q.exists()), Path("."))
    if not anc.is_dir():
        raise UserError(f"{what} {p}: {anc} is a file, not a folder; choose a path under a folder")
    if not os.access(anc, os.W_OK | os.X_OK):
        raise UserError(f"{what} {p}: permission denied in {anc}; choose a folder you can write")
    return p


def check_not_an_input(out: Path, what: str, inputs: Iterable[str | os.PathLike]) -> None:
    """UserError when output ``out`` is one of ``inputs`` (a file or a folder), lies inside an input folder
    where something already exists (it would replace that file, or write into that folder: a run's
    ``log.parquet``, a study's ``results.json``, an image set's ``images/``). Before, ``speedup --output RUN/log.parquet`` replaced a
    training log with JSON and ``human simulate --output HUMAN/pairs.parquet`` a design's pairs, exit 0."""
    o = out.resolve()
    for i in inputs:
        src = Path(i).resolve()
        if o == src or (src.is_dir() and o.is_relative_to(src) and o.exists()):
            raise UserError(f"{what} {out} would overwrite {i}, an input of this command; choose an output "
                            "path outside the inputs")


#: Mode of a file that holds a secret (a blinding secret, raters' credentials, the unblinding table): the
#: owner's only, whatever the umask
PRIVATE_MODE = 0o600


def temp_beside(path: Path, folder: bool = False) -> tuple[int, str]:
    """A new temporary file (``(fd, name)``) or folder (``(-1, name)``) next to ``path``, named
    :data:`TEMP_NAME`; a folder that takes no new entries is a UserError naming ``path``, not the
    temporary name (``--plot /proc/x.png`` named ``/proc/.x.png.h2lnmrw6.tmp``)."""
    try:
        if folder:
            return -1, tempfile.mkdtemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
        return tempfile.mkstemp(prefix=f".{path.name}.", suffix=".tmp", dir=path.parent)
    except PermissionError:
        raise UserError(f"cannot write {path}: permission denied in {path.parent}; "
                        "choose a folder you can write") from None
    except OSError as exc:
        why = (exc.strerror or type(exc).__name__).lower()
        raise UserError(f"cannot write {path}: {path.parent} takes no new files ({why}); "
                        "choose a folder on a disk you can write") from None


@contextlib.contextmanager
def atomic_write(path: str | os.PathLike, mode: str = "wb", private: bool = False) -> Iterator[Any]:
    """Open a temporary file next to ``path``; on success rename it over ``path``.

    The file ends with mode ``0666 & ~umask`` (``mkstemp`` creates ``0600``), or :data:`PRIVATE_MODE`
    when ``private``. A folder the user may not write is a UserError raised before anything is written.
    """
    path = Path(path)
    ensure_dir(path.parent, "folder")
    fd, tmp = temp_beside(path)
    os.chmod(tmp, PRIVATE_MODE if private else file_mode())
    try:
        with os.fdopen(fd, mode) as fh:
            yield fh
            fh.flush()
            os.fsync(fh.fileno())
        _replace(tmp, path)
    except BaseException:
        with contextlib.suppress(FileNotFoundError):
            os.unlink(tmp)
        raise


def _replace(tmp: str | os.PathLike, path: Path) -> None:
    """``os.replace`` of a finished temporary file; a folder in the way is an error naming ``path`` (it named
    the temporary file: "is a directory: .../.analysis.json.jgboa5r_.tmp")."""
    try:
        os.replace(tmp, path)
    except IsADirectoryError:
        raise UserError(f"{path} is a folder where a file is written; move it away and re-run") from None


def atomic_write_files(files: Sequence[tuple[str | os.PathLike, Callable[[Any], None]]],
                       before_commit: Callable[[], None] | None = None) -> None:
    """Write a group of files that must change together: each ``(path, write)`` is written (``write(fh)``)
    to its temporary name first; only when all are written does ``before_commit`` run (e.g. removing a
    completion marker) and every temporary file get renamed over its path, in order (renames need no
    space). A failure while writing (a full disk, an interrupt) leaves every old file as it was. Before, a
    full disk in ``metrics`` removed the old ``metrics.json``, replaced one table and kept the other."""
    staged: list[tuple[str, Path]] = []
    try:
        for path, write in files:
            path = Path(path)
            ensure_dir(path.parent, "folder")
            fd, tmp = temp_beside(path)
            staged.append((tmp, path))
            os.chmod(tmp, file_mode())
            with os.fdopen(fd, "wb") as fh:
                write(fh)
                fh.flush()
                os.fsync(fh.fileno())
    except BaseException:
        for tmp, _ in staged:
            with contextlib.suppress(FileNotFoundError):
                os.unlink(tmp)
        raise
    if before_commit is not None:
        before_commit()
    for tmp, path in staged:
        _replace(tmp, path)


def lock_or_refuse(path: str | os.PathLike, busy: str) -> Any:
    """Take an exclusive ``flock`` on ``path`` (created if absent; this process's pid written in it) without
    waiting, and return the open file: closing it releases the lock (so does the process's end, a crash
    included). Held by another process: one :class:`UserError`, ``busy`` with ``{pid}`` replaced by its pid. None where
    ``flock`` does not exist (no lock). For folders one run at a time may write (a study, an image set)."""
    if os.name != "posix":
        return None
    import fcntl

    fh = open(path, "a+", encoding="utf-8")  # noqa: SIM115 (held until the caller closes it)
    try:
        fcntl.flock(fh, fcntl.LOCK_EX | fcntl.LOCK_NB)
    except OSError:
        fh.seek(0)
        pid = fh.read().strip() or "?"
        fh.close()
        raise UserError(busy.replace("{pid}", pid)) from None
    fh.seek(0)
    fh.truncate()
    fh.write(f"{os.getpid()}\n")
    fh.flush()
    return fh


@contextlib.contextmanager
def exclusive(path: str | os.PathLike) -> Iterator[None]:
    """Hold an exclusive ``flock`` on ``path`` (created if absent) for the block, waiting for any other
    holder: writers of a group of files that must stay one write's (a metrics folder's tables and
    ``metrics.json``) take turns instead of interleaving. No-op where ``flock`` does not exist."""
    if os.name != "posix":
        yield
        return
    import fcntl

    path = Path(path)
    ensure_dir(path.parent, "folder")
    with open(path, "a+b") as fh:
        fcntl.flock(fh, fcntl.LOCK_EX)  # released when the file is closed
        yield


def recover_replaced(parent: str | os.PathLike) -> list[Path]:
    """Put back every folder of ``parent`` that :func:`atomic_dir` had moved aside (``.NAME.old``) when a kill
    came between its two renames, leaving no ``NAME``: the old folder is the last whole one (a checkpoint that
    vanished, so ``--resume`` fell back to an older one without training state). Returns the folders restored."""
    parent = Path(parent)
    restored = []
    for old in parent.glob(".*.old") if parent.is_dir() else ():
        path = parent / old.name[1:-len(".old")]
        if old.is_dir() and not path.exists():
            os.replace(old, path)
            restored.append(path)
    return restored


@contextlib.contextmanager
def atomic_dir(path: str | os.PathLike, replace: bool = True) -> Iterator[Path]:
    """Yield an empty temporary folder next to ``path``; on success it replaces ``path`` whole.

    The folder ends with mode ``0777 & ~umask`` (``mkdtemp`` creates ``0700``); a crash leaves
    either the old folder or the complete new one, never a half-written one under ``path`` (a kill between
    the two renames leaves the old one as ``.NAME.old``, which the next write of ``path`` puts back first).
    ``replace=False`` (an output that must be new or empty, e.g. ``export --out``): the folder takes
    ``path``'s place only if ``path`` is absent or an empty folder at the end; one UserError otherwise,
    and whatever arrived there meanwhile is kept (it was moved aside and deleted: a second export into
    the same folder, or a user's file written there during the export, was lost).
    """
    path = Path(path)
    ensure_dir(path.parent, "folder")
    old = path.with_name(f".{path.name}.old")
    recover_replaced(path.parent)
    tmp = Path(temp_beside(path, folder=True)[1])
    os.chmod(tmp, dir_mode())
    # held open while the folder is written: remove_stale_temps sees a live writer in /proc/PID/fd
    held = os.open(tmp, os.O_RDONLY)
    try:
        yield tmp
        if not replace:
            try:
                os.rename(tmp, path)  # onto an empty folder or nothing; a non-empty folder or a file: refused
            except OSError:
                raise UserError(f"{path} was filled while it was being written (another process?); nothing there "
                                "was changed and this output was not written: choose another path") from None
        elif path.exists():
            shutil.rmtree(old, ignore_errors=True)
            os.replace(path, old)
            os.replace(tmp, path)
            shutil.rmtree(old, ignore_errors=True)
        else:
            os.replace(tmp, path)
    except BaseException:
        shutil.rmtree(tmp, ignore_errors=True)
        raise
    finally:
        os.close(held)


#: the name of a temporary file or folder of :func:`atomic_write` / :func:`atomic_dir` /
#: ``write_image_file``: ``.{name}.`` + mkstemp's 8 random characters + ``.tmp``
TEMP_NAME = re.compile(r"^\..+\.[A-Za-z0-9_]{8}\.tmp$")
def foreign_entries(folder: Path, own: Iterable[str]) -> list[str]:
    """Sorted names in ``folder`` that are neither in ``own`` nor a temporary file of an atomic write
    (:data:`TEMP_NAME`); ``[]`` when the folder does not exist."""
    if not folder.is_dir():
        return []
    keep = set(own)
    return sorted(p.name for p in folder.iterdir() if p.name not in keep and not TEMP_NAME.match(p.name))


def check_own_folder(folder: Path, own: Iterable[str], what: str) -> None:
    """One UserError line when ``--out`` ``folder`` holds entries that are not ``what``'s own (``own``), before
    anything is written into it: a run, a design or a sweep written among a user's, a set's or a study's files."""
    if foreign := foreign_entries(folder, own):
        raise UserError(f"--out {folder} holds files that are not {what} (e.g. {foreign[0]}); choose a new or empty "
                        "folder")


#: without /proc (not Linux) a temporary entry counts as stale only after this many seconds untouched
STALE_TEMP_AGE_S = 3600.0


def _held_paths() -> set[str] | None:
    """Paths open by live processes (their fds and working folders), from /proc; None without /proc."""
    if not os.path.isdir("/proc/self/fd"):
        return None
    held: set[str] = set()
    for pid in os.listdir("/proc"):
        if not pid.isdigit():
            continue
        with contextlib.suppress(OSError):
            held.add(os.readlink(f"/proc/{pid}/cwd"))
        try:
            fds = os.listdir(f"/proc/{pid}/fd")
        except OSError:  # gone, or another user's process
            continue
        for fd in fds:
            with contextlib.suppress(OSError):
                held.add(os.readlink(f"/proc/{pid}/fd/{fd}"))
    return held


def _is_held(path: Path, held: set[str] | None) -> bool:
    if held is None:
        try:
            return time.time() - path.lstat().st_mtime < STALE_TEMP_AGE_S
        except OSError:
            return True
    p = os.path.realpath(path)
    return p in held or any(h.startswith(p + os.sep) for h in held)


def remove_stale_temps(root: str | os.PathLike, recursive: bool = True) -> list[Path]:
    """Delete the temporary files/folders of our atomic writers that a killed run left under ``root``.

    Only names of our own pattern (:data:`TEMP_NAME`), and only ones no live process holds open
    (checked in ``/proc``: a writer keeps its temporary file, or folder, open until it renames it;
    without ``/proc``, ones untouched for :data:`STALE_TEMP_AGE_S`). Returns what was removed.
    """
    root = Path(root)
    if not root.is_dir():
        return []
    found: list[Path] = []
    if recursive:
        for dirpath, dirnames, filenames in os.walk(root):
            for name in filenames + dirnames:
                if TEMP_NAME.match(name):
                    found.append(Path(dirpath) / name)
            dirnames[:] = [d for d in dirnames if not TEMP_NAME.match(d)]
    else:
        found = [p for p in root.iterdir() if TEMP_NAME.match(p.name)]
    if not found:
        return []
    held = _held_paths()
    removed = []
    for p in found:
        if _is_held(p, held):
            continue
        with contextlib.suppress(FileNotFoundError):
            if p.is_dir() and not p.is_symlink():
                shutil.rmtree(p)
            else:
                p.unlink()
            removed.append(p)
    return removed


def scratch_dir(prefix: str) -> Path:
    """A new private temporary folder (``mkdtemp`` under ``$TMPDIR``) removed, with what it holds, when
    this process exits normally: for benchmark data and throw-away models, which ``mkdtemp`` alone leaves
    behind on every run."""
    folder = Path(tempfile.mkdtemp(prefix=prefix))
    atexit.register(shutil.rmtree, folder, ignore_errors=True)
    return folder


def atomic_write_bytes(path: str | os.PathLike, data: bytes, private: bool = False) -> None:
    """Write ``data`` to ``path`` atomically (``private``: mode 0600, :func:`atomic_write`)."""
    with atomic_write(path, "wb", private) as fh:
        fh.write(data)


def atomic_write_text(path: str | os.PathLike, text: str, private: bool = False) -> None:
    """Write ``text`` (UTF-8) to ``path`` atomically (``private``: mode 0600)."""
    atomic_write_bytes(path, text.encode("utf-8"), private)


def json_text(obj: Any) -> str:
    """``obj`` as the indented JSON every file of ours holds (numpy scalars and paths converted)."""
    return json.dumps(obj, indent=2, sort_keys=False, default=_json_default) + "\n"


def read_jsonl(path: str | Path, what: str = "log") -> list[dict[str, Any]]:
    """The JSON objects of an append-only log, one per line (absent file: none). A last line cut short by a
    crash (no newline after it, not JSON) loses only itself; any other line that is not a JSON object (bytes
    that are not UTF-8, text that is not JSON, JSON that is not an object) is damage, not a crash: one
    :class:`~pcpo_eval.errors.UserError` naming the file and line, since these logs decide what a verdict
    must disclose (a skipped line could drop an earlier look). ``what``: the log's name in that message."""
    path = Path(path)
    if not path.is_file():
        return []
    try:
        data = path.read_bytes()
    except OSError as exc:
        raise UserError(f"cannot read the {what} {path}: {exc.strerror or exc}; check its permissions") from None
    lines = data.split(b"\n")
    cut = lines.pop() if lines else b""  # after the last newline: b"" unless a crash cut the last line
    items = [(i, raw, False) for i, raw in enumerate(lines, start=1)]
    items += [(len(lines) + 1, cut, True)] if cut.strip() else []
    out = []
    for i, raw, unterminated in items:
        if not raw.strip():
            continue
        try:
            entry = json.loads(raw.decode("utf-8"))
        except (UnicodeDecodeError, ValueError):
            entry = None
        if isinstance(entry, dict):
            out.append(entry)
        elif not unterminated:  # only an unterminated last line may be a crash's
            raise UserError(f"the {what} {path} is damaged at line {i} (not a JSON object); restore the file from a "
                            "copy, or remove that line if you know what it held")
    return out


def append_jsonl(path: str | Path, entry: dict[str, Any]) -> None:
    """Append one JSON object as a line to an append-only log (:func:`read_jsonl`). A last line a crash cut
    short (no newline, not a JSON object) is dropped first, atomically, so the new line is not glued onto it
    (before, the new entry was lost with it); a complete last record without its newline is kept."""
    path = Path(path)
    line = (json.dumps(entry, default=str) + "\n").encode("utf-8")
    try:
        data = path.read_bytes() if path.is_file() else b""
        if data and not data.endswith(b"\n"):
            tail = data[data.rfind(b"\n") + 1:]
            try:  # a complete record missing only its newline (read_jsonl keeps it): keep it
                whole = isinstance(json.loads(tail.decode("utf-8")), dict)
            except (UnicodeDecodeError, ValueError):
                whole = False
            atomic_write_bytes(path, (data + b"\n" if whole else data[: len(data) - len(tail)]) + line)
            return
        with open(path, "ab") as fh:
            fh.write(line)
    except OSError as exc:
        raise UserError(f"cannot write {path}: {exc.strerror or exc}; check that it is a file you may write") from None


def atomic_write_json(path: str | os.PathLike, obj: Any, private: bool = False) -> None:
    """Write ``obj`` as indented JSON to ``path`` atomically (``private``: mode 0600)."""
    atomic_write_text(path, json_text(obj), private)


def atomic_write_parquet(path: str | os.PathLike, df: Any, private: bool = False) -> None:
    """Write a pandas DataFrame to Parquet atomically (``private``: mode 0600)."""
    with atomic_write(path, "wb", private) as fh:
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


def read_text_file(path: str | os.PathLike, what: str, hint: str) -> str:
    """The UTF-8 text of ``path``; missing, unreadable or non-UTF-8 files are a one-line UserError.

    ``what`` names the file (e.g. ``config file``); ``hint`` is the fix appended when it is missing.
    """
    p = Path(path)
    if not p.exists():
        raise UserError(f"{what} {p} not found; {hint}")
    if p.is_dir():
        raise UserError(f"{what} {p} is a folder; pass the file itself")
    try:
        return p.read_text(encoding="utf-8")
    except PermissionError:
        raise UserError(f"{what} {p} is not readable (permission denied); fix its permissions") from None
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {p} is not UTF-8 text (byte {exc.start}); save it as UTF-8") from None


def parse_overrides(items: list[str], what: str = "override", example: str = "epochs=2") -> dict[str, Any]:
    """``["epochs=2", "objective=pcpo"]`` -> dict (values parsed as YAML scalars; text that is not YAML,
    ``model=@x``, stays text); an item without ``=`` is one error line naming ``what`` it is."""
    import yaml

    out: dict[str, Any] = {}
    for item in items:
        k, sep, v = item.partition("=")
        if not sep or not k.strip():
            raise UserError(f"{what} {item!r} is not KEY=VALUE (e.g. {example})")
        try:
            out[k.strip()] = yaml_safe_load(v) if v.strip() else ""
        except yaml.YAMLError:  # not a YAML scalar (model=@x, prompts=%p): the text itself
            out[k.strip()] = v.strip()
    return out


def check_keys_once(items: list[str], what: str = "override") -> None:
    """UserError when a command line's KEY=VALUE items name a key twice (``epochs=2 epochs=3`` trained 3
    epochs without a word, as a YAML file naming a key twice did: :func:`yaml_safe_load`). For what a user
    typed; code composing overrides may append to a base list, where the later item wins
    (:func:`parse_overrides`)."""
    seen: dict[str, str] = {}
    for item in items:
        k = item.partition("=")[0].strip()
        if k in seen:
            raise UserError(f"{what} {k} is given twice ({seen[k]!r} and {item!r}); give each key once")
        seen[k] = item


_UNIQUE_KEY_LOADER: Any = None


def yaml_safe_load(text: str) -> Any:
    """``yaml.safe_load(text)``, except that a mapping naming a key twice is a ``yaml.YAMLError``.

    PyYAML keeps the last of two equal keys without a word, so ``epochs: 2`` followed further down by
    ``epochs: 30`` trained 30 epochs while the file seemed to say 2. Keys merged in with ``<<:`` may
    still be overridden (that is what a merge is for).
    """
    global _UNIQUE_KEY_LOADER
    import yaml

    if _UNIQUE_KEY_LOADER is None:
        class UniqueKeyLoader(yaml.SafeLoader):
            def construct_mapping(self, node: Any, deep: bool = False) -> Any:
                if isinstance(node, yaml.MappingNode):
                    seen: dict[Any, Any] = {}
                    for key_node, _ in node.value:
                        if key_node.tag == "tag:yaml.org,2002:merge":
                            continue
                        key = self.construct_object(key_node, deep=True)
                        try:
                            first = seen.setdefault(key, key_node.start_mark)
                        except TypeError:  # an unhashable key: SafeLoader reports it
                            continue
                        if first is not key_node.start_mark:
                            raise yaml.constructor.ConstructorError(
                                None, None, f"key {key!r} appears twice, first at line {first.line + 1}; keep one",
                                key_node.start_mark)
                return super().construct_mapping(node, deep)

        _UNIQUE_KEY_LOADER = UniqueKeyLoader
    return yaml.load(text, Loader=_UNIQUE_KEY_LOADER)  # noqa: S506 - a SafeLoader subclass


def read_yaml_mapping(path: str | os.PathLike, what: str, hint: str) -> dict[str, Any]:
    """The mapping in YAML file ``path`` (an empty file is ``{}``).

    A missing or unreadable file, invalid YAML (a key given twice included, :func:`yaml_safe_load`)
    or a non-mapping raise a one-line UserError naming ``what`` (e.g. ``study spec``) and the fix;
    ``hint`` is the fix appended to the not-found message.
    """
    import yaml

    p = Path(path)
    text = read_text_file(p, what, hint)
    try:
        data = yaml_safe_load(text) or {}
    except yaml.YAMLError as exc:
        mark = getattr(exc, "problem_mark", None)
        where = f" at line {mark.line + 1}, column {mark.column + 1}" if mark is not None else ""
        problem = getattr(exc, "problem", None) or str(exc).splitlines()[0]
        raise UserError(f"{what} {p} is not valid YAML{where} ({problem}); fix the file's syntax") from None
    if not isinstance(data, dict):
        raise UserError(f"{what} {p} must be a mapping of keys to values (got {type(data).__name__}); "
                        "write one `key: value` per line")
    return data


def check_finite(mapping: Mapping[str, Any], where: str) -> None:
    """Raise a one-line UserError naming every non-finite number (NaN, +-inf) in ``mapping``.

    Nested mappings and lists are searched; keys are reported as dotted paths (``a.b[2]``). ``where``
    names the source (e.g. ``train config runs/x/config.yaml``). Booleans and strings are not numbers.
    """
    bad = [f"{key}={value}" for key, value in _numbers(mapping, "") if not math.isfinite(value)]
    if bad:
        raise UserError(f"{where}: non-finite {', '.join(bad)}; every number must be finite")


def _numbers(x: Any, key: str) -> Iterator[tuple[str, float]]:
    if isinstance(x, Mapping):
        for k, v in x.items():
            yield from _numbers(v, f"{key}.{k}" if key else str(k))
    elif isinstance(x, list | tuple):
        for i, v in enumerate(x):
            yield from _numbers(v, f"{key}[{i}]")
    elif isinstance(x, numbers.Real) and not isinstance(x, bool):
        yield key, float(x)


def safetensors_bytes(tensors: Mapping[str, Any], metadata: Mapping[str, str] | None = None) -> bytes:
    """A safetensors file whose bytes depend only on the tensors and metadata.

    ``safetensors.torch.save`` orders the header's ``__metadata__`` by a Rust ``HashMap``, so two
    processes saving equal tensors wrote different bytes (and different ``weights_sha256``). Here the
    header JSON is rewritten with sorted keys (metadata and tensor names) and no blanks, padded with
    spaces to a multiple of 8 as the format requires; the data section, which safetensors lays out
    in a fixed order (by dtype alignment, then name), is kept, so offsets stay valid.
    """
    from safetensors.torch import save

    raw = save({k: tensors[k] for k in sorted(tensors)}, metadata=dict(metadata) if metadata else None)
    n = int.from_bytes(raw[:8], "little")
    header = json.dumps(json.loads(raw[8 : 8 + n]), sort_keys=True, separators=(",", ":")).encode()
    header += b" " * (-len(header) % 8)
    return len(header).to_bytes(8, "little") + header + raw[8 + n :]


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


_POOL: Any = None
_POOL_SIZE = min(16, os.cpu_count() or 1)


def parallel_map(fn: Any, items: list[Any]) -> list[Any]:
    """``[fn(x) for x in items]`` on a shared thread pool (order kept; the first exception re-raised).

    For work that releases the GIL: PNG decoding (zlib), SHA-256 and PIL resampling, which the metric
    stages do per image. Threads, not processes: the images stay in this process's memory, nothing is
    pickled. Pool size ``min(16, os.cpu_count())``; a single item runs inline. The items go to the pool
    in at most 4 contiguous chunks per thread, not one task each: a pool task costs ~45 us of
    GIL-held bookkeeping, as much as the whole check of a cached file (a 100,000-image hash check
    spent more time queueing tasks than checking files).
    """
    global _POOL
    if len(items) <= 1:
        return [fn(x) for x in items]
    if _POOL is None:
        from concurrent.futures import ThreadPoolExecutor

        _POOL = ThreadPoolExecutor(max_workers=_POOL_SIZE, thread_name_prefix="pcpo-decode")
    size = -(-len(items) // (4 * _POOL_SIZE))
    chunks = [items[i:i + size] for i in range(0, len(items), size)]
    return [y for part in _POOL.map(lambda chunk: [fn(x) for x in chunk], chunks) for y in part]
