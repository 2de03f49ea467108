"""The plan of a set: which images, in which order, on which process.

Owns :func:`parse_seeds` (``--seeds`` -> seeds; :data:`MAX_SEED`), :class:`WorkItem` (one
(prompt_id, prompt, seed) and its path in the image-set contract), :func:`plan_items` (seed-major)
and :func:`shard_items` (``i % world == rank``). No torch here, so a study can validate seeds cheaply.
"""

import math
import re
from collections.abc import Sequence
from dataclasses import dataclass
from numbers import Integral, Real
from typing import Any

import numpy as np

from pcpo_eval.credit.flow import MAX_ETA
from pcpo_eval.errors import UserError
from pcpo_eval.imageset import image_rel_path
from pcpo_eval.prompts import PromptSet

#: Largest seed / prompt id that fits the fixed-width file names.
MAX_SEED = 9_999_999
#: Largest |guidance weight| taken: far beyond any use (3.5-7.5 in the paper), below where the images overflow
#: (``--cfg -1e308`` rendered black images, exit 0); the noise scale's bound is the flow SDE's (credit.flow.MAX_ETA)
MAX_CFG = 1000.0


_SEED_RANGE = re.compile(r"^\s*(\d+)\s*-\s*(\d+)\s*$")


def parse_seeds(spec: str | int | Sequence[int]) -> list[int]:
    """``"N"`` -> seeds 0..N-1; ``"A-B"`` -> A..B inclusive; ``"A,B-C,..."`` (a comma between parts) -> those
    seeds and ranges literally (``"7,9"`` is seeds 7 and 9, ``"7"`` alone is a count); a list of ints as is.

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
        elif "," in s:
            seeds = _seed_list(spec, s)
        else:
            raise UserError(f"--seeds {spec!r} is malformed; use N (seeds 0..N-1), A-B (inclusive) or a list "
                            "A,B-C (those seeds)")
    else:
        seeds = [int(v) for v in spec]
        if not seeds:
            raise UserError("no seeds given; use N (seeds 0..N-1) or A-B (inclusive)")
        if min(seeds) < 0 or len(set(seeds)) != len(seeds):
            raise UserError("seeds must be distinct non-negative integers")
    if seeds[-1] > MAX_SEED or max(seeds) > MAX_SEED:
        raise UserError(f"seed {max(seeds)} too large; seeds must be <= {MAX_SEED} (file names use 7 digits)")
    return seeds



def _seed_list(spec: str, s: str) -> list[int]:
    """The seeds of a comma list ``"A,B-C"`` (each part a seed or an inclusive range), in the order given."""
    out: list[int] = []
    for part in s.split(","):
        part = part.strip()
        if part.isascii() and part.isdigit():
            lo = hi = int(part)
        elif (m := _SEED_RANGE.match(part)) and part.isascii():
            lo, hi = int(m.group(1)), int(m.group(2))
        else:
            raise UserError(f"--seeds {spec!r}: part {part!r} is not a seed or a range A-B; write e.g. 7,9,20-29")
        if lo > hi:
            raise UserError(f"--seeds {spec!r}: range {part!r} starts after its end; write A-B with A <= B")
        if hi > MAX_SEED:
            raise UserError(f"--seeds {spec!r}: seed {hi} too large; seeds must be <= {MAX_SEED} (file names use 7 digits)")
        out.extend(range(lo, hi + 1))
    if len(set(out)) != len(out):
        raise UserError(f"--seeds {spec!r} names a seed twice; list each seed once")
    return out


def seed_arg(seeds: Sequence[int]) -> str:
    """``seeds`` as one ``--seeds`` value that :func:`parse_seeds` reads back as exactly these seeds: the sorted
    seeds as a comma list of runs (``"0-9"``, ``"7,20-29"``; a lone seed ``k`` is ``"k-k"``, since a bare
    number alone is a count)."""
    s = sorted(int(x) for x in seeds)
    runs: list[list[int]] = []
    for x in s:
        if runs and x == runs[-1][1] + 1:
            runs[-1][1] = x
        else:
            runs.append([x, x])
    parts = [f"{a}-{b}" if a != b or len(runs) == 1 else f"{a}" for a, b in runs]
    return ",".join(parts)


def is_count(value: Any, least: int) -> bool:
    """``value`` is an integer (a float such as 2.5 or NaN is not, nor a boolean) and >= ``least``."""
    return isinstance(value, Integral) and not isinstance(value, bool) and value >= least


def is_finite(value: Any) -> bool:
    """``value`` is a real number, not NaN or +-inf (a NaN guidance weight renders all-black images)."""
    return isinstance(value, Real) and not isinstance(value, bool) and math.isfinite(value)


def check_sampling_options(*, batch_size: Any = None, steps: Any = None, cfg: Any = None, eta: Any = None,
                           micro_batch: Any = None, max_prompts: Any = None, max_prompt_tokens: Any = None,
                           section: str | None = None) -> None:
    """The one check of an image set's sampling options (``None`` = not given): a UserError naming the
    first bad one as the ``generate`` flag (``--steps``) or, with ``section``, as the spec key
    (``eval.steps``; ``section=""``: a top-level key, ``steps``), so a study spec or IRG sweep file is
    refused on load, not at its generate stage hours later."""
    def name(key: str) -> str:
        if section is None:
            return "--" + key.replace("_", "-")
        return f"{section}.{key}" if section else key

    if batch_size is not None and not is_count(batch_size, 1):
        raise UserError(f"{name('batch_size')} {batch_size}; use a whole number >= 1")
    if steps is not None and not is_count(steps, 1):
        raise UserError(f"{name('steps')} {steps}; use a whole number of sampler steps >= 1")
    if cfg is not None and (not is_finite(cfg) or abs(cfg) > MAX_CFG):
        raise UserError(f"{name('cfg')} {cfg}; use a finite guidance weight within +-{MAX_CFG:g} (1 = no guidance; "
                        "the paper's setups use 3.5-7.5)")
    if eta is not None and (not is_finite(eta) or not 0 <= eta <= MAX_ETA):
        raise UserError(f"{name('eta')} {eta}; use a finite eta from 0 (deterministic) to {MAX_ETA:g} (DDIM: at most 1; "
                        "flow SDEs: 0.3-0.7 in the paper)")
    if micro_batch is not None and not is_count(micro_batch, 0):
        raise UserError(f"{name('micro_batch')} {micro_batch}; use a whole number of rows >= 0 (0 = off)")
    if max_prompts is not None and not is_count(max_prompts, 1):
        raise UserError(f"{name('max_prompts')} {max_prompts}; use a whole number of prompts >= 1 (or leave it out "
                        "for all)")
    if max_prompt_tokens is not None and not is_count(max_prompt_tokens, 3):
        raise UserError(f"{name('max_prompt_tokens')} {max_prompt_tokens}; use a whole number of CLIP tokens >= 3 "
                        "(start, text, end; the paper's filter: 77)")

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


#: the most images one set may plan: 200x the 50,000 of a paper's evaluation set (a 512-px PNG set of this size
#: is terabytes); ``--seeds 10000000`` on the toy's 45 prompts planned 450 M items and exhausted 24 GB of memory
MAX_SET_IMAGES = 10_000_000


def check_set_size(n_prompts: int, n_seeds: int) -> None:
    """Refuse a set of more than :data:`MAX_SET_IMAGES` images before any item is built."""
    if n_prompts * n_seeds > MAX_SET_IMAGES:
        raise UserError(f"{n_prompts:,} prompts x {n_seeds:,} seeds = {n_prompts * n_seeds:,} images in one set, more "
                        f"than {MAX_SET_IMAGES:,}; render fewer seeds (a paper's evaluation set is 50,000 images), or "
                        "split the work into several sets with --seeds ranges")


def plan_items(prompts: PromptSet, seeds: Sequence[int]) -> list[WorkItem]:
    """All items, seed-major: a partial set covers every prompt evenly."""
    check_set_size(len(prompts), len(seeds))
    return [WorkItem(pid, p, s) for s in seeds for pid, p in prompts]


def shard_items(items: Sequence[WorkItem], rank: int, world: int) -> list[WorkItem]:
    """The deterministic share of process ``rank``: items ``i`` with ``i % world == rank``."""
    return list(items[rank::world])
