"""The plan of a set: which images, in which order, on which process.

Owns :func:`parse_seeds` (``--seeds`` -> seeds; :data:`MAX_SEED`), :class:`WorkItem` (one
(prompt_id, prompt, seed) and its path in the image-set contract), :func:`plan_items` (seed-major)
and :func:`shard_items` (``i % world == rank``). No torch here, so a study can validate seeds cheaply.
"""

import re
from collections.abc import Sequence
from dataclasses import dataclass

import numpy as np

from pcpo_eval.errors import UserError
from pcpo_eval.imageset import image_rel_path
from pcpo_eval.prompts import PromptSet

#: Largest seed / prompt id that fits the fixed-width file names.
MAX_SEED = 9_999_999


_SEED_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_seeds(spec: str | int | Sequence[int]) -> list[int]:
    """``"N"`` -> seeds 0..N-1; ``"A-B"`` -> A..B inclusive; a list of ints is taken as is.

    Raises :class:`UserError` for anything else (negative, empty, reversed, > 9,999,999, repeats).
    """
    if isinstance(spec, int | np.integer):
        spec = str(int(spec))
    if isinstance(spec, str):
        s = spec.strip()
        too_large = (f"--seeds {spec!r}: seed {{}} too large; seeds must be <= {MAX_SEED} (file names use 7 digits), "
                     f"e.g. --seeds 8 or --seeds 0-{MAX_SEED}")
        if s.isascii() and s.isdigit():
            n = int(s)
            if n < 1:
                raise UserError(f"--seeds {spec!r}: need at least one seed; use N >= 1 or A-B")
            if n - 1 > MAX_SEED:  # checked before the list is built (--seeds 99999999999 would exhaust memory)
                raise UserError(too_large.format(n - 1))
            seeds = list(range(n))
        elif (m := _SEED_RANGE.match(s)) and s.isascii():
            a, b = int(m.group(1)), int(m.group(2))
            if a > b:
                raise UserError(f"--seeds {spec!r}: range start exceeds its end; write A-B with A <= B")
            if b > MAX_SEED:
                raise UserError(too_large.format(b))
            seeds = list(range(a, b + 1))
        else:
            raise UserError(f"--seeds {spec!r} is malformed; use N (seeds 0..N-1) or A-B (inclusive)")
    else:
        seeds = [int(v) for v in spec]
        if not seeds:
            raise UserError("no seeds given; use N (seeds 0..N-1) or A-B (inclusive)")
        if min(seeds) < 0 or len(set(seeds)) != len(seeds):
            raise UserError("seeds must be distinct non-negative integers")
    if seeds[-1] > MAX_SEED or max(seeds) > MAX_SEED:
        raise UserError(f"seed {max(seeds)} too large; seeds must be <= {MAX_SEED} (file names use 7 digits)")
    return seeds


@dataclass(frozen=True)
class WorkItem:
    """One image to render: its prompt, prompt id and seed."""

    prompt_id: int
    prompt: str
    seed: int

    @property
    def rel_path(self) -> str:
        """Path relative to the set directory (the image-set contract)."""
        return image_rel_path(self.prompt_id, self.seed)


def plan_items(prompts: PromptSet, seeds: Sequence[int]) -> list[WorkItem]:
    """All items, seed-major: a partial set covers every prompt evenly."""
    return [WorkItem(pid, p, s) for s in seeds for pid, p in prompts]


def shard_items(items: Sequence[WorkItem], rank: int, world: int) -> list[WorkItem]:
    """The deterministic share of process ``rank``: items ``i`` with ``i % world == rank``."""
    return list(items[rank::world])
