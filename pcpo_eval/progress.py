"""Progress bars with ETA for the long commands (``train``, ``metrics``, ``study``, ``human design``).

One convention everywhere, the one ``pcpo-eval generate`` set (:func:`pcpo_eval.generate.runner._progress_bar`):
a tqdm bar on **stderr**, on rank 0 only, switched by ``--progress/--no-progress``. Left unset
(``None``), a bar is shown when stderr is a terminal, so logs, pipes and the tests that parse a
command's stdout / stderr see no bar characters. stdout is never written by a bar.
"""

from __future__ import annotations

import sys
from typing import Any

#: help text of the ``--progress/--no-progress`` flag of train, metrics, study and human design
PROGRESS_HELP = "progress bar with ETA on stderr (rank 0); default: on when stderr is a terminal"


def progress_enabled(flag: bool | None, rank: int = 0) -> bool:
    """Whether to draw a bar: ``flag`` when given, else whether stderr is a terminal; never off rank 0."""
    if rank != 0:
        return False
    if flag is not None:
        return bool(flag)
    isatty = getattr(sys.stderr, "isatty", None)
    try:
        return bool(isatty()) if isatty is not None else False
    except (ValueError, OSError):  # a closed or detached stream
        return False


def progress_bar(total: int | None, desc: str, enabled: bool | None, unit: str = "it", initial: int = 0,
                 leave: bool = True, position: int | None = None) -> Any:
    """A tqdm bar on stderr (``disable=True`` when not :func:`progress_enabled`); use as a context manager
    or call ``close()``. ``bar.write(line)`` prints ``line`` to stdout above a live bar."""
    from tqdm.auto import tqdm

    return tqdm(total=total, initial=initial, desc=desc, unit=unit, leave=leave, position=position,
                disable=not progress_enabled(enabled), dynamic_ncols=True, file=sys.stderr)


def echo(bar: Any, line: str) -> None:
    """Print ``line`` to stdout: above ``bar`` when it is drawn (so the bar is redrawn below it), else plainly."""
    if bar is not None and not getattr(bar, "disable", True):
        bar.write(line, file=sys.stdout)
        sys.stdout.flush()
    else:
        print(line, flush=True)
