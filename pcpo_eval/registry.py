"""Name -> factory registries and optional third-party modules, in one place.

A :class:`LazyRegistry` maps a user-facing name (``"inception"``, ``"hps"``, ``"toy"``) to
``"module:factory"``; the module is imported only when the name is used, so ``--help`` and spec
validation stay fast and an optional dependency is needed only by the entries that use it.
Unknown names get one error listing the valid ones (diffusers' and ddpo-pytorch's registries).

:func:`optional_module` is the one way to import an optional package: ``None`` only when the
package itself is absent; an installed package that fails to import raises its real error
(a bare ``except ImportError`` would hide it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from collections.abc import Callable, Iterator, Mapping
from types import ModuleType
from typing import Any

from pcpo_eval.errors import UserError


def optional_module(name: str) -> ModuleType | None:
    """Import ``name`` if it is installed; ``None`` if it (or its parent package) is absent."""
    if name in sys.modules:  # already imported (or blocked with None, as tests do)
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # parent package absent
        return None
    return None if spec is None else importlib.import_module(name)


class LazyRegistry(Mapping[str, Callable[..., Any]]):
    """``{name: "package.module:factory"}`` resolved on first use.

    ``what`` names the kind of entry in error messages (``"feature extractor"``, ``"reward"``).
    """

    def __init__(self, what: str, entries: Mapping[str, str]) -> None:
        self.what = what
        self._entries = dict(entries)

    def __getitem__(self, name: str) -> Callable[..., Any]:
        if name not in self._entries:
            raise UserError(f"unknown {self.what} {name!r}; choose one of: {', '.join(sorted(self._entries))}")
        module, _, attr = self._entries[name].partition(":")
        return getattr(importlib.import_module(module), attr)

    def __iter__(self) -> Iterator[str]:
        return iter(self._entries)

    def __len__(self) -> int:
        return len(self._entries)

    def __contains__(self, name: object) -> bool:
        return name in self._entries
