"""Prompt sets: the DDPO built-ins, the toy world's prompts and user files, each with stable ids.

A prompt set is a table of ``(prompt_id, prompt)`` rows. ``prompt_id`` is the key the generator
derives every image's noise from (:func:`pcpo_eval.seeding.sample_generator`) and names image
folders with (``images/p{prompt_id:05d}/``), so ids must be unique, non-negative and stable.

Built-in sets (:data:`REGISTRY`):

- ``simple_animals``: the 45 animal nouns of kvablack/ddpo-pytorch's ``assets/simple_animals.txt``
  (ids 0..44 in file order), DDPO's aesthetic / compressibility prompt set.
- ``nouns_activities``: ddpo-pytorch's ``nouns_activities`` prompt function enumerated
  exhaustively: ``"{a|an} {animal} {activity}"`` for the 45 animals and the activities
  "washing the dishes", "riding a bike", "playing chess" (135 prompts). Order is animal-major:
  ``prompt_id = 3 * animal_index + activity_index``. The article follows ``inflect.engine().a``,
  which for these 45 nouns is "an" exactly for "ant".
- ``toy``: the toy world's 45 prompts (:data:`pcpo_eval.toy.data.TOY_PROMPTS`, ids 0..44).

User files (``.txt``, ``.csv``, ``.parquet``): a ``.txt`` file holds one prompt per line (blank
lines skipped, ids 0..N-1 over the kept lines); CSV / Parquet need a ``prompt`` column and may
have an integer ``prompt_id`` column (otherwise ids are the row numbers).

Long prompts: the paper drops MJHQ-30K prompts that do not fit the CLIP tokenizer (> 77 tokens,
App. "Alignment & Generalization Metrics") and keeps the first 5K of the rest.
:func:`load_prompts` does the same with ``max_tokens=77`` and ``limit=5000``. Token counts
include CLIP's start and end tokens (a prompt fits iff ``2 + len(bpe(prompt)) <= 77``, as with
``CLIPTokenizer(..., truncation=True, max_length=77)``). The BPE is OpenAI CLIP's, read from the
vocabulary file that ships inside the ``open_clip_torch`` wheel (no download). If that package is
missing, a documented lower bound is used instead (see :func:`approx_clip_token_count`).
"""

from __future__ import annotations

import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pcpo_eval.errors import UserError
from pcpo_eval.registry import optional_module

#: CLIP text encoders' context length (start + 75 BPE tokens + end).
CLIP_MAX_TOKENS = 77

#: kvablack/ddpo-pytorch ``ddpo_pytorch/assets/simple_animals.txt`` (45 lines, file order).
SIMPLE_ANIMALS: tuple[str, ...] = (
    "cat", "dog", "horse", "monkey", "rabbit", "zebra", "spider", "bird", "sheep",
    "deer", "cow", "goat", "lion", "tiger", "bear", "raccoon", "fox", "wolf",
    "lizard", "beetle", "ant", "butterfly", "fish", "shark", "whale", "dolphin", "squirrel",
    "mouse", "rat", "snake", "turtle", "frog", "chicken", "duck", "goose", "bee",
    "pig", "turkey", "fly", "llama", "camel", "bat", "gorilla", "hedgehog", "kangaroo",
)  # fmt: skip

#: The activities of ddpo-pytorch's ``nouns_activities`` prompt function (file order).
ACTIVITIES: tuple[str, ...] = ("washing the dishes", "riding a bike", "playing chess")


@dataclass(frozen=True)
class PromptSet:
    """An ordered table of prompts with unique integer ids.

    Attributes:
        name: the built-in name or the file path it was read from.
        prompt_ids: unique non-negative ids, one per prompt.
        prompts: the prompt strings.
        n_dropped: prompts removed by the CLIP-length filter.
        token_counter: how tokens were counted for the filter (``"open_clip-bpe"``,
            ``"approx-lower-bound"``, a custom name, or ``None`` when no filter ran).
    """

    name: str
    prompt_ids: tuple[int, ...]
    prompts: tuple[str, ...]
    n_dropped: int = 0
    token_counter: str | None = None
    n_limited: int = field(default=0)

    def __post_init__(self) -> None:
        assert len(self.prompt_ids) == len(self.prompts)

    def __len__(self) -> int:
        return len(self.prompts)

    def __iter__(self) -> Iterator[tuple[int, str]]:
        return iter(zip(self.prompt_ids, self.prompts, strict=True))

    def as_dict(self) -> dict[int, str]:
        """``{prompt_id: prompt}``."""
        return dict(zip(self.prompt_ids, self.prompts, strict=True))


# ---------------------------------------------------------------------------------------------
# Built-in sets
# ---------------------------------------------------------------------------------------------


def indefinite_article(noun: str) -> str:
    """"a" or "an" by the leading vowel letter (agrees with ``inflect`` on DDPO's 45 animals)."""
    return "an" if noun[:1].lower() in "aeiou" else "a"


def simple_animals() -> PromptSet:
    """DDPO's ``simple_animals`` (45 prompts, ids 0..44)."""
    return PromptSet("simple_animals", tuple(range(len(SIMPLE_ANIMALS))), SIMPLE_ANIMALS)


def nouns_activities() -> PromptSet:
    """DDPO's ``nouns_activities`` enumerated: 45 animals x 3 activities = 135 prompts."""
    prompts = tuple(f"{indefinite_article(a)} {a} {act}" for a in SIMPLE_ANIMALS for act in ACTIVITIES)
    return PromptSet("nouns_activities", tuple(range(len(prompts))), prompts)


def toy_prompts() -> PromptSet:
    """The toy world's 45 ``"<color> <shape>"`` prompts in ``TOY_PROMPTS`` order."""
    from pcpo_eval.toy.data import TOY_PROMPTS

    return PromptSet("toy", tuple(range(len(TOY_PROMPTS))), tuple(TOY_PROMPTS))


#: Built-in prompt sets: name -> factory.
REGISTRY: dict[str, Callable[[], PromptSet]] = {
    "simple_animals": simple_animals,
    "nouns_activities": nouns_activities,
    "toy": toy_prompts,
}

_FILE_SUFFIXES = (".txt", ".csv", ".parquet")


# ---------------------------------------------------------------------------------------------
# User files
# ---------------------------------------------------------------------------------------------


def read_prompt_file(path: str | Path) -> PromptSet:
    """Read a ``.txt`` / ``.csv`` / ``.parquet`` prompt file (see the module docstring)."""
    path = Path(path)
    if not path.is_file():
        raise UserError(
            f"prompt file {str(path)!r} not found; pass a file or one of: {', '.join(sorted(REGISTRY))}"
        )
    suffix = path.suffix.lower()
    if suffix == ".txt":
        lines = [ln.strip() for ln in path.read_text(encoding="utf-8").splitlines()]
        prompts = [ln for ln in lines if ln]
        ids: list[int] = list(range(len(prompts)))
    elif suffix in (".csv", ".parquet"):
        import pandas as pd

        try:
            df = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
        except pd.errors.EmptyDataError:
            df = pd.DataFrame({"prompt": []})
        except Exception as exc:  # noqa: BLE001 - any parse failure is the user's file
            raise UserError(f"cannot read prompt file {str(path)!r}: {type(exc).__name__}: {exc}") from exc
        if "prompt" not in df.columns:
            raise UserError(
                f"prompt file {str(path)!r} has no 'prompt' column (columns: {', '.join(map(str, df.columns))})"
            )
        if len(df) == 0:
            raise UserError(f"prompt file {str(path)!r} contains no prompts; add at least one")
        if df["prompt"].isna().any():
            row = int(df.index[df["prompt"].isna()][0])
            raise UserError(f"prompt file {str(path)!r}: row {row} has an empty prompt; fill or remove it")
        prompts = [str(p) for p in df["prompt"]]
        ids = _read_ids(df, path) if "prompt_id" in df.columns else list(range(len(df)))
    else:
        raise UserError(f"prompt file {str(path)!r}: unsupported type; use one of {', '.join(_FILE_SUFFIXES)}")
    if not prompts:
        raise UserError(f"prompt file {str(path)!r} contains no prompts; add at least one")
    check_ids(ids, str(path))
    return PromptSet(str(path), tuple(ids), tuple(prompts))


def _read_ids(df, path: Path) -> list[int]:
    """Integer ``prompt_id`` column or a one-line error."""
    import pandas as pd

    col = df["prompt_id"]
    if col.isna().any() or not (
        pd.api.types.is_integer_dtype(col) or (pd.api.types.is_float_dtype(col) and (col % 1 == 0).all())
    ):
        raise UserError(f"prompt file {str(path)!r}: 'prompt_id' must be whole numbers in every row")
    return [int(v) for v in col]


def check_ids(ids: Sequence[int], source: str) -> None:
    """Ids must be unique and in [0, 99999] (they name ``images/p{id:05d}`` folders)."""
    seen: set[int] = set()
    for i in ids:
        if i in seen:
            raise UserError(f"{source}: duplicate prompt_id {i}; every prompt needs its own id")
        if not 0 <= i <= 99_999:
            raise UserError(f"{source}: prompt_id {i} out of range; use ids in 0..99999")
        seen.add(i)


# ---------------------------------------------------------------------------------------------
# CLIP token counting
# ---------------------------------------------------------------------------------------------

#: CLIP's pre-tokenizer pattern (OpenAI ``simple_tokenizer.py``), letters/digits/other runs.
_CLIP_PRETOKEN = re.compile(
    # \p{L}+ -> [^\W\d_]+ (letters), \p{N} -> \d, [^\s\p{L}\p{N}]+ -> (?:[^\s\w]|_)+
    r"<\|startoftext\|>|<\|endoftext\|>|'s|'t|'re|'ve|'m|'ll|'d|[^\W\d_]+|\d|(?:[^\s\w]|_)+",
    re.IGNORECASE,
)


def approx_clip_token_count(prompt: str) -> int:
    """Lower bound on CLIP's token count: 2 + the number of pre-tokenizer pieces.

    CLIP splits text into pieces with a regex, then BPE-encodes each piece into >= 1 token, so
    the piece count never exceeds the real count. The fallback filter therefore drops only
    prompts that certainly overflow (it may keep a few that overflow after BPE).
    """
    return 2 + len(_CLIP_PRETOKEN.findall(" ".join(prompt.split()).lower()))


def clip_token_counter() -> tuple[Callable[[str], int], str]:
    """``(count, name)``: exact CLIP BPE counts via open_clip's bundled vocabulary, else the bound."""
    if optional_module("open_clip") is None:
        return approx_clip_token_count, "approx-lower-bound"
    from open_clip.tokenizer import SimpleTokenizer

    tok = SimpleTokenizer()
    return (lambda p: 2 + len(tok.encode(p))), "open_clip-bpe"


def filter_long_prompts(
    prompt_set: PromptSet,
    max_tokens: int = CLIP_MAX_TOKENS,
    counter: Callable[[str], int] | None = None,
    counter_name: str = "custom",
) -> PromptSet:
    """Drop prompts whose CLIP token count (with start/end tokens) exceeds ``max_tokens``."""
    if counter is None:
        counter, counter_name = clip_token_counter()
    keep = [counter(p) <= max_tokens for p in prompt_set.prompts]
    return PromptSet(
        prompt_set.name,
        tuple(i for i, k in zip(prompt_set.prompt_ids, keep, strict=True) if k),
        tuple(p for p, k in zip(prompt_set.prompts, keep, strict=True) if k),
        n_dropped=prompt_set.n_dropped + keep.count(False),
        token_counter=counter_name,
        n_limited=prompt_set.n_limited,
    )


def load_prompts(
    spec: str | Path | PromptSet,
    *,
    max_tokens: int | None = None,
    limit: int | None = None,
    counter: Callable[[str], int] | None = None,
) -> PromptSet:
    """Resolve a built-in name or a prompt file, then optionally filter and truncate.

    Args:
        spec: a :data:`REGISTRY` name, a ``.txt``/``.csv``/``.parquet`` path, or a PromptSet.
        max_tokens: drop prompts longer than this many CLIP tokens (77 = CLIP's context);
            ``None`` keeps everything. The number dropped is in ``PromptSet.n_dropped``.
        limit: keep only the first ``limit`` prompts after filtering (paper: first 5K of MJHQ).
        counter: custom token counter (tests); default :func:`clip_token_counter`.
    """
    if isinstance(spec, PromptSet):
        ps = spec
    elif str(spec) in REGISTRY:
        ps = REGISTRY[str(spec)]()
    elif Path(spec).suffix.lower() in _FILE_SUFFIXES or Path(spec).exists():
        ps = read_prompt_file(spec)
    else:
        raise UserError(
            f"unknown prompt set {str(spec)!r}; use one of {', '.join(sorted(REGISTRY))} "
            f"or a {'/'.join(_FILE_SUFFIXES)} file"
        )
    if max_tokens is not None:
        if max_tokens < 3:
            raise UserError(f"max_tokens={max_tokens} is too small; CLIP needs >= 3 (start, text, end)")
        ps = filter_long_prompts(ps, max_tokens, counter)
        if not ps.prompts:
            raise UserError(f"all {ps.n_dropped} prompts exceed {max_tokens} CLIP tokens; nothing to render")
    if limit is not None:
        if limit < 1:
            raise UserError(f"limit={limit}; use a positive number of prompts")
        ps = PromptSet(
            ps.name, ps.prompt_ids[:limit], ps.prompts[:limit], ps.n_dropped, ps.token_counter,
            n_limited=max(0, len(ps) - limit),
        )
    return ps
