"""User-facing errors.

Every problem caused by user input (a bad flag, a missing weight file, a malformed table) is raised
as :class:`UserError`. The CLI turns it into a single line on stderr and exit code 2, with no
traceback; library users get an ordinary exception whose message names the problem and the fix.
"""

from __future__ import annotations


class UserError(ValueError):
    """Bad input from the user; the message is one line naming the problem and the fix."""

    exit_code = 2


class MissingWeightsError(UserError, FileNotFoundError):
    """Weights of a real model (or the toy world) are absent or unreadable."""


class ProblemList(UserError):
    """Several problems found at once (e.g. every missing weight of a study or a training run).

    ``str()`` is one line (``head: (1) ...; (2) ...``), which the CLI prints after ``error:`` like any
    other error (it printed one item per line before, against the one-line contract).
    """

    def __init__(self, head: str, items: list[str]) -> None:
        self.head, self.items = head, list(items)
        super().__init__(f"{head}: " + "; ".join(f"({i}) {p}" for i, p in enumerate(self.items, 1)))


def require(condition: bool, message: str) -> None:
    """Raise :class:`UserError` with ``message`` unless ``condition`` holds."""
    if not condition:
        raise UserError(message)
