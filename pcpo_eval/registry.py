"""Optional third-party modules, in one place.

:func:`optional_module` is the one way to import an optional package: ``None`` only when the
package itself is absent; an installed package that fails to import raises its real error
(a bare ``except ImportError`` would hide it).
"""

from __future__ import annotations

import importlib
import importlib.util
import sys
from types import ModuleType


def optional_module(name: str) -> ModuleType | None:
    """Import ``name`` if it is installed; ``None`` if it (or its parent package) is absent."""
    if name in sys.modules:  # already imported (or blocked with None, as tests do)
        return sys.modules[name]
    try:
        spec = importlib.util.find_spec(name)
    except ModuleNotFoundError:  # parent package absent
        return None
    return None if spec is None else importlib.import_module(name)
