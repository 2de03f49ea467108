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

Public datasets (:data:`DATASETS`): HPDv2 (DanceGRPO's training prompts; the test split),
Pick-a-Pic (Flow-GRPO's train / test lists; the SFW subset), Flow-GRPO's OCR set, MJHQ-30K,
MSCOCO-2017 val captions and DrawBench, each with the split and count the paper used (citing
pcpo-paper.tex lines). Nothing is downloaded: :func:`locate_dataset` looks at an explicit path,
then ``PCPO_PROMPTS_<NAME>``, then ``$PCPO_PROMPTS_DIR/<name>/`` (default
``~/.cache/pcpo_eval/prompts``), then the Hugging Face hub cache (``HF_HUB_CACHE`` >
``HF_HOME/hub``, dataset snapshots as ``hf download --repo-type dataset`` leaves them)
and the ``datasets`` Arrow cache (``HF_DATASETS_CACHE`` > ``HF_HOME/datasets``). ``pcpo-eval
prompts`` lists every set, where it looked and the exact command that fetches the rest.

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

import io
import json
import os
import re
from collections.abc import Callable, Iterator, Sequence
from dataclasses import dataclass, field
from pathlib import Path

from pcpo_eval.errors import UserError
from pcpo_eval.registry import optional_module
from pcpo_eval.weights.locate import hf_hub_cache  # the one reading of HF_HUB_CACHE / HF_HOME

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


_BOMS = ((b"\xef\xbb\xbf", "utf-8-sig"), (b"\xff\xfe\x00\x00", "utf-32"), (b"\x00\x00\xfe\xff", "utf-32"),
         (b"\xff\xfe", "utf-16"), (b"\xfe\xff", "utf-16"))


def read_prompt_text(path: str | Path, what: str = "prompt file") -> str:
    """The text of a prompt file: UTF-8, or UTF-8 / UTF-16 / UTF-32 with a byte-order mark (the BOM is
    dropped, never part of the first prompt); anything else is a one-line UserError naming the encoding."""
    path = Path(path)
    try:
        data = path.read_bytes()
    except PermissionError:
        raise UserError(f"{what} {str(path)!r} is not readable (permission denied); fix its permissions") from None
    encoding = next((enc for bom, enc in _BOMS if data.startswith(bom)), "utf-8")
    try:
        text = data.decode(encoding)
    except UnicodeDecodeError as exc:
        raise UserError(f"{what} {str(path)!r} is not valid {encoding.replace('-sig', '')} text (byte {exc.start}); "
                        "save it as UTF-8 (or UTF-16 with a byte-order mark)") from None
    if "\x00" in text:
        raise UserError(f"{what} {str(path)!r} holds NUL characters (UTF-16 without a byte-order mark?); "
                        "save it as UTF-8 (or UTF-16 with a byte-order mark)")
    return text


def read_prompt_file(path: str | Path) -> PromptSet:
    """Read a ``.txt`` / ``.csv`` / ``.parquet`` prompt file (see the module docstring)."""
    path = Path(path)
    if path.is_dir():
        raise UserError(f"prompt file {str(path)!r} is a folder; pass a .txt, .csv or .parquet file inside it "
                        f"or one of: {', '.join(sorted(REGISTRY))}")
    if not path.is_file():
        raise UserError(
            f"prompt file {str(path)!r} not found; pass a file or one of: {', '.join(sorted(REGISTRY))}"
        )
    suffix = path.suffix.lower()
    if suffix == ".txt":
        lines = [ln.strip() for ln in read_prompt_text(path).splitlines()]
        prompts = [ln for ln in lines if ln]
        ids: list[int] = list(range(len(prompts)))
    elif suffix in (".csv", ".parquet"):
        import pandas as pd

        try:
            df = pd.read_csv(io.StringIO(read_prompt_text(path))) if suffix == ".csv" else pd.read_parquet(path)
        except UserError:
            raise
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
        empty = df["prompt"].isna() | (df["prompt"].astype(str).str.strip() == "")
        if empty.any():
            row = int(empty.to_numpy().argmax()) + 1  # 1-based, as a reader counts the file's data rows
            raise UserError(f"prompt file {str(path)!r}: data row {row} has an empty prompt; fill or remove it")
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
    if pd.api.types.is_integer_dtype(col) and not col.isna().any():
        return [int(v) for v in col]
    number = pd.to_numeric(col, errors="coerce")
    bad = number.isna() | (number % 1 != 0)
    if bad.any():
        row = int(bad.to_numpy().argmax())  # 1-based below, as the empty-prompt error counts data rows
        value = col.iloc[row]
        what = "no prompt_id" if pd.isna(value) else f"prompt_id {str(value)!r}"
        raise UserError(f"prompt file {str(path)!r}: data row {row + 1} has {what}; 'prompt_id' must be a whole "
                        "number in every row")
    return [int(v) for v in number]


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
        spec: a :data:`REGISTRY` name, a :data:`DATASETS` name (found locally by
            :func:`locate_dataset`), a ``.txt``/``.csv``/``.parquet`` path, or a PromptSet.
        max_tokens: drop prompts longer than this many CLIP tokens (77 = CLIP's context);
            ``None`` keeps everything, except for a dataset, which then gets the paper's selection
            (``PromptDataset.max_tokens``; MJHQ-30K: 77). The number dropped is in ``n_dropped``.
        limit: keep only the first ``limit`` prompts after filtering (``None`` for a dataset: the
            paper's ``PromptDataset.limit``; MJHQ-30K: the first 5K).
        counter: custom token counter (tests); default :func:`clip_token_counter`.
    """
    ps, dataset = _resolve(spec)
    if dataset is not None:  # a public dataset: the paper's selection unless overridden
        max_tokens = dataset.max_tokens if max_tokens is None else max_tokens
        limit = dataset.limit if limit is None else limit
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


# ---------------------------------------------------------------------------------------------
# Public prompt datasets (local files or the Hugging Face caches; never downloaded)
# ---------------------------------------------------------------------------------------------

#: Reader kinds: ``lines`` (one prompt per line), ``json_records`` (a JSON list of objects with a
#: ``prompt`` key, duplicates dropped in first-seen order), ``mjhq_meta`` (MJHQ-30K's
#: ``meta_data.json``: ``{image_id: {"category", "prompt"}}`` in file order), ``coco_captions``
#: (COCO ``captions_*.json``: the first caption of each image, images in file order), ``table``
#: (CSV / Parquet / Arrow with one of ``columns``), ``pickapic_captions`` (a table's ``caption`` column,
#: unique in file order, captions with >= 5 spaces: Flow-GRPO's dataset/pickscore/prpocess.py).
ReaderKind = str


@dataclass(frozen=True)
class PromptDataset:
    """A public prompt set the paper (or its baselines) used, and where to find it locally.

    Attributes:
        name: the name accepted by :func:`load_prompts` and ``pcpo-eval prompts``.
        description: what the set is.
        paper: where the paper uses it, citing lines of ``pcpo-paper.tex``.
        split: the split / file of the source dataset.
        paper_count: number of prompts the paper states it used (``None``: the paper gives none).
        reader: a :data:`ReaderKind`.
        files: candidate file names inside a dataset folder or HF snapshot, in search order.
        obtain: the exact command or URL that fetches the files (run it yourself; pcpo-eval never downloads).
        hf_repo: the Hugging Face *dataset* repository holding ``files`` (``None``: not on the hub).
        arrow_split: split name of the ``datasets`` library's Arrow cache (``None``: not searched).
        columns: prompt column candidates for ``table`` readers.
        max_tokens / limit: the paper's selection, applied by :func:`load_prompts` unless overridden.
    """

    name: str
    description: str
    paper: str
    split: str
    paper_count: int | None
    reader: ReaderKind
    files: tuple[str, ...]
    obtain: str
    hf_repo: str | None = None
    arrow_split: str | None = None
    columns: tuple[str, ...] = ("prompt",)
    max_tokens: int | None = None
    limit: int | None = None

    @property
    def env_var(self) -> str:
        """``PCPO_PROMPTS_<NAME>``: a file or folder that overrides every cache."""
        return "PCPO_PROMPTS_" + self.name.upper()


_FLOWGRPO_RAW = "https://raw.githubusercontent.com/yifan123/flow_grpo/main/dataset"


def _fetch(url: str, name: str, filename: str) -> str:
    return f"curl -L --create-dirs -o \"${{PCPO_PROMPTS_DIR:-$HOME/.cache/pcpo_eval/prompts}}/{name}/{filename}\" {url}"


def _hf_fetch(repo: str, files: str) -> str:
    return f"hf download {repo} {files} --repo-type dataset"


#: Every public prompt set pcpo-eval knows, by name (paper line numbers refer to pcpo-paper.tex).
DATASETS: dict[str, PromptDataset] = {
    d.name: d
    for d in [
        PromptDataset(
            name="hpdv2",
            description="HPDv2 training prompts as shipped by DanceGRPO (prompts.txt at its repository root)",
            paper="setups 5, 6, 10 training prompts 'HPD' (l.1094, l.1135-1136: 'the HPDv2 dataset used in DanceGRPO')",
            split="train (DanceGRPO's selection)",
            paper_count=None,
            reader="lines",
            files=("prompts.txt", "hpdv2_train_prompts.txt"),
            obtain=_fetch("https://raw.githubusercontent.com/XueZeyue/DanceGRPO/main/assets/prompts.txt", "hpdv2",
                          "prompts.txt"),  # moved from the repo root to assets/ in DanceGRPO 6907708 (2025-08-22)
        ),
        PromptDataset(
            name="hpdv2_test",
            description="HPDv2 test split prompts (ymhao/HPDv2 test.json, one row per prompt after de-duplication)",
            paper="not used by the paper (no HPDv2 test split or count is stated; training prompts are 'hpdv2')",
            split="test",
            paper_count=None,
            reader="json_records",
            files=("test.json",),
            hf_repo="ymhao/HPDv2",
            obtain=_hf_fetch("ymhao/HPDv2", "test.json"),
        ),
        PromptDataset(
            name="pickapic_train",
            description="Pick-a-Pic training prompts from the Flow-GRPO codebase (dataset/pickscore/train.txt)",
            paper="setup 7 training prompts 'Pick' (l.1094, l.1136, l.1400)",
            split="train",
            paper_count=None,
            reader="lines",
            files=("train.txt",),
            obtain=_fetch(f"{_FLOWGRPO_RAW}/pickscore/train.txt", "pickapic_train", "train.txt"),
        ),
        PromptDataset(
            name="pickapic_test",
            description="Pick-a-Pic evaluation prompts from the Flow-GRPO codebase (dataset/pickscore/test.txt)",
            paper="Table dpo-comparison evaluation: 'the 2048 prompts from the Pick-a-Pic evaluation set provided by the Flow-GRPO codebase' (l.1277)",
            split="test",
            paper_count=2048,
            reader="lines",
            files=("test.txt",),
            obtain=_fetch(f"{_FLOWGRPO_RAW}/pickscore/test.txt", "pickapic_test", "test.txt"),
        ),
        PromptDataset(
            name="pickapic_sfw",
            description="Pick-a-Pic v1 safe-for-work captions (CarperAI/pickapic_v1_no_images_training_sfw), "
            "made into prompts with Flow-GRPO's recipe (dataset/pickscore/prpocess.py: unique captions with >= 5 "
            "spaces, file order; its unseeded shuffle is not reproducible and not applied). The Flow-GRPO tree "
            "(yifan123/flow_grpo ac4c86e) ships no SFW file itself; a .txt you point at is taken line by line",
            paper="setup 9 training prompts 'Pick-SFW' (l.1094, l.1136-1137, l.1225-1226)",
            split="train (SFW subset)",
            paper_count=None,
            reader="pickapic_captions",
            files=("pickapic_training_sfw.parquet", "train.txt", "pickapic_sfw_train_prompts.txt"),
            hf_repo="CarperAI/pickapic_v1_no_images_training_sfw",
            columns=("caption",),
            obtain=_hf_fetch("CarperAI/pickapic_v1_no_images_training_sfw", "pickapic_training_sfw.parquet"),
        ),
        PromptDataset(
            name="ocr_train",
            description="Flow-GRPO OCR training prompts (dataset/ocr/train.txt; the text to render is in quotes)",
            paper="setup 8 training prompts 'OCR' (l.1094, l.1138)",
            split="train",
            paper_count=None,
            reader="lines",
            files=("train.txt",),
            obtain=_fetch(f"{_FLOWGRPO_RAW}/ocr/train.txt", "ocr_train", "train.txt"),
        ),
        PromptDataset(
            name="ocr_test",
            description="Flow-GRPO OCR evaluation prompts (dataset/ocr/test.txt: 1018 prompts, which the paper calls "
            "1024)",
            paper="Fig. sd3_flowgrpo_results (a): validation reward 'on a fixed set of 1024 prompts that are not in the "
            "training pool' (l.1301-1302; the paper does not name the file)",
            split="test",
            paper_count=1024,
            reader="lines",
            files=("test.txt",),
            obtain=_fetch(f"{_FLOWGRPO_RAW}/ocr/test.txt", "ocr_test", "test.txt"),
        ),
        PromptDataset(
            name="mjhq30k",
            description="MJHQ-30K prompts (meta_data.json, file order), prompts > 77 CLIP tokens dropped, first 5K kept",
            paper="Table preference-metrics-combined (b): 'filtered these out and used the first 5K prompts' (l.1274-1275)",
            split="all 30K (no split), then the paper's filter",
            paper_count=5000,
            reader="mjhq_meta",
            files=("meta_data.json",),
            hf_repo="playgroundai/MJHQ-30K",
            obtain=_hf_fetch("playgroundai/MJHQ-30K", "meta_data.json"),
            max_tokens=CLIP_MAX_TOKENS,
            limit=5000,
        ),
        PromptDataset(
            name="coco2017_val",
            description="MSCOCO-2017 val captions: the first caption of each of the 5000 images, images in file order",
            paper="Table preference-metrics-combined (a): 'MSCOCO-2017 validation (5K)' (l.420, l.670)",
            split="val2017",
            paper_count=5000,
            reader="coco_captions",
            files=("captions_val2017.json", "annotations/captions_val2017.json"),
            obtain="curl -LO http://images.cocodataset.org/annotations/annotations_trainval2017.zip && unzip "
            "annotations_trainval2017.zip annotations/captions_val2017.json -d "
            "\"${PCPO_PROMPTS_DIR:-$HOME/.cache/pcpo_eval/prompts}/coco2017_val\"",
        ),
        PromptDataset(
            name="drawbench",
            description="DrawBench (Imagen's prompt benchmark), CSV / Parquet with a 'Prompts' column",
            paper="not used by the paper (no occurrence in pcpo-paper.tex)",
            split="all",
            paper_count=None,
            reader="table",
            files=("data/train-00000-of-00001.parquet", "drawbench.csv", "DrawBench Prompts - Sheet1.csv"),
            hf_repo="sayakpaul/drawbench",
            arrow_split="train",
            columns=("Prompts", "prompt", "Prompt", "text"),
            obtain=_hf_fetch("sayakpaul/drawbench", "--include '*.parquet' '*.csv'"),
        ),
    ]
}


def prompts_dir() -> Path:
    """pcpo-eval's own prompt folder: ``PCPO_PROMPTS_DIR`` or ``~/.cache/pcpo_eval/prompts``."""
    return Path(os.environ.get("PCPO_PROMPTS_DIR") or "~/.cache/pcpo_eval/prompts").expanduser()


def _hf_home() -> Path:
    if os.environ.get("HF_HOME"):
        return Path(os.environ["HF_HOME"]).expanduser()
    return Path(os.environ.get("XDG_CACHE_HOME") or "~/.cache").expanduser() / "huggingface"


def hf_datasets_cache() -> Path:
    """``datasets`` Arrow cache (``HF_DATASETS_CACHE`` > ``HF_HOME/datasets``), as the datasets library."""
    if os.environ.get("HF_DATASETS_CACHE"):
        return Path(os.environ["HF_DATASETS_CACHE"]).expanduser()
    return _hf_home() / "datasets"


def _hub_snapshot(repo: str) -> Path:
    """The snapshot folder of dataset ``repo`` (``refs/main``, else the newest), or the repo folder."""
    root = hf_hub_cache() / ("datasets--" + repo.replace("/", "--"))
    ref = root / "refs" / "main"
    if ref.is_file() and (root / "snapshots" / ref.read_text().strip()).is_dir():
        return root / "snapshots" / ref.read_text().strip()
    snaps = sorted((root / "snapshots").glob("*"), key=lambda p: p.stat().st_mtime) if (root / "snapshots").is_dir() else []
    return snaps[-1] if snaps else root


def _arrow_dir(repo: str) -> Path:
    """The datasets-library cache folder of ``repo`` (``org___name``, case and punctuation folded)."""
    root = hf_datasets_cache()
    key = re.sub(r"[^a-z0-9]", "", repo.lower())
    if root.is_dir():
        for d in sorted(root.iterdir()):
            if d.is_dir() and "___" in d.name and re.sub(r"[^a-z0-9]", "", d.name.lower()) == key:
                return d
    return root / repo.replace("/", "___")


def dataset_candidates(ds: PromptDataset) -> list[tuple[str, Path]]:
    """Folders searched after the explicit path and the env var, as (label, folder), in order."""
    out = [("PCPO_PROMPTS_DIR", prompts_dir() / ds.name)]
    if ds.hf_repo:
        out.append((f"HF hub cache {ds.hf_repo}", _hub_snapshot(ds.hf_repo)))
        if ds.arrow_split:
            out.append((f"HF datasets cache {ds.hf_repo}", _arrow_dir(ds.hf_repo)))
    return out


def _find_in(ds: PromptDataset, folder: Path) -> Path | None:
    """The first of ``ds.files`` inside ``folder`` (or an Arrow file of ``ds.arrow_split``)."""
    for rel in ds.files:
        if (folder / rel).is_file():
            return folder / rel
    if ds.arrow_split and folder.is_dir():
        arrows = sorted(folder.rglob(f"*-{ds.arrow_split}*.arrow"))
        if arrows:
            return arrows[0]
    return None


def locate_dataset(name: str, explicit: str | os.PathLike | None = None) -> Path:
    """File holding dataset ``name``: explicit path > ``PCPO_PROMPTS_<NAME>`` > caches (see :func:`dataset_candidates`).

    A given path or variable must be valid (never silently skipped); absence everywhere is one
    line naming the variable and the command that fetches the file.
    """
    ds = DATASETS[name]
    given = [("path", Path(explicit))] if explicit not in (None, "") else []
    if not given and os.environ.get(ds.env_var):
        given = [(ds.env_var, Path(os.environ[ds.env_var]))]
    for label, path in given:
        path = path.expanduser()
        hit = path if path.is_file() else _find_in(ds, path)
        if hit is None:
            raise UserError(f"prompt set {name}: {label} {path} is not a file and holds none of {', '.join(ds.files)}; fix it")
        return hit
    for _label, folder in dataset_candidates(ds):
        hit = _find_in(ds, folder)
        if hit is not None:
            return hit
    raise UserError(
        f"prompt set {name} not found: set {ds.env_var} to its file ({ds.files[0]}) or fetch it with: {ds.obtain}"
    )


def _read_table_column(path: Path, columns: Sequence[str]) -> list[str]:
    """Prompts from the first of ``columns`` in a CSV / Parquet / Arrow (datasets cache) file."""
    import pandas as pd

    suffix = path.suffix.lower()
    if suffix == ".arrow":
        import pyarrow as pa

        with pa.memory_map(str(path)) as src:
            try:
                table = pa.ipc.open_stream(src).read_all()  # the datasets library writes IPC streams
            except pa.ArrowInvalid:
                table = pa.ipc.open_file(src).read_all()
        df = table.to_pandas()
    else:
        df = pd.read_csv(path) if suffix == ".csv" else pd.read_parquet(path)
    col = next((c for c in columns if c in df.columns), None)
    if col is None:
        raise UserError(f"{path}: none of the columns {', '.join(columns)} (has {', '.join(map(str, df.columns))})")
    return [str(p) for p in df[col].dropna()]


def _read_json(path: Path):
    try:
        return json.loads(path.read_text(encoding="utf-8"))
    except json.JSONDecodeError as exc:
        raise UserError(f"{path}: not valid JSON ({exc.msg} at line {exc.lineno}); re-fetch the file") from exc


def read_dataset_file(ds: PromptDataset, path: Path) -> list[str]:
    """All prompts of ``path`` in file order, read as ``ds.reader`` says (see :data:`ReaderKind`)."""
    if ds.reader == "lines" or (ds.reader != "table" and path.suffix.lower() == ".txt"):
        prompts = [ln.strip() for ln in read_prompt_text(path, f"prompt set {ds.name}: file").splitlines()]
    elif ds.reader == "pickapic_captions":  # Flow-GRPO dataset/pickscore/prpocess.py: unique, >= 5 spaces
        caps = dict.fromkeys(_read_table_column(path, ds.columns))
        prompts = [c for c in caps if c.count(" ") >= 5]
    elif ds.reader == "table" or path.suffix.lower() in (".csv", ".parquet", ".arrow"):
        prompts = _read_table_column(path, ds.columns)
    elif ds.reader == "json_records":
        rows = _read_json(path)
        prompts = list(dict.fromkeys(str(r["prompt"]) for r in rows if isinstance(r, dict) and "prompt" in r))
    elif ds.reader == "mjhq_meta":
        meta = _read_json(path)
        prompts = [str(v["prompt"]) for v in meta.values() if isinstance(v, dict) and "prompt" in v]
    elif ds.reader == "coco_captions":
        doc = _read_json(path)
        first: dict[int, str] = {}
        for ann in doc.get("annotations", []):
            first.setdefault(int(ann["image_id"]), str(ann["caption"]))
        prompts = [first[img["id"]] for img in doc.get("images", []) if img["id"] in first]
    else:  # pragma: no cover - DATASETS only uses the kinds above
        raise AssertionError(ds.reader)
    prompts = [" ".join(p.split()) for p in prompts]
    prompts = [p for p in prompts if p]
    if not prompts:
        raise UserError(f"prompt set {ds.name}: {path} holds no prompts; re-fetch it with: {ds.obtain}")
    return prompts


def load_dataset_prompts(name: str, path: str | os.PathLike | None = None) -> PromptSet:
    """Dataset ``name`` (all prompts, ids 0..N-1 in file order); the paper's filter is :func:`load_prompts`'s job."""
    ds = DATASETS[name]
    found = locate_dataset(name, path)
    prompts = read_dataset_file(ds, found)
    return PromptSet(name, tuple(range(len(prompts))), tuple(prompts))


def prompt_file(spec: str | Path) -> Path | None:
    """The file a prompt set spec names (as given, not resolved), or None for a built-in or dataset name.

    A spec names a file when it is no :data:`REGISTRY` / :data:`DATASETS` name and has a prompt-file
    suffix or exists; what :func:`load_prompts` then reads with :func:`read_prompt_file`.
    """
    if str(spec) in REGISTRY or str(spec) in DATASETS or not str(spec):
        return None
    return Path(spec) if Path(spec).suffix.lower() in _FILE_SUFFIXES or Path(spec).exists() else None


def _resolve(spec: str | Path | PromptSet) -> tuple[PromptSet, PromptDataset | None]:
    if isinstance(spec, PromptSet):
        return spec, None
    if str(spec) in REGISTRY:
        return REGISTRY[str(spec)](), None
    if str(spec) in DATASETS:
        return load_dataset_prompts(str(spec)), DATASETS[str(spec)]
    if prompt_file(spec) is not None:
        return read_prompt_file(spec), None
    raise UserError(
        f"unknown prompt set {str(spec)!r}; use one of {', '.join(sorted(REGISTRY) + sorted(DATASETS))} "
        f"or a {'/'.join(_FILE_SUFFIXES)} file (`pcpo-eval prompts` lists them)"
    )


# ---------------------------------------------------------------------------------------------
# Inventory (``pcpo-eval prompts``)
# ---------------------------------------------------------------------------------------------


def prompt_set_status(name: str, count: bool = True) -> dict:
    """One row of ``pcpo-eval prompts``: found or not, where it looked, how to get it, counts.

    ``n_prompts`` is the count after the paper's selection (what :func:`load_prompts` returns),
    ``n_raw`` before it; both ``None`` when absent or ``count`` is false.
    """
    if name in REGISTRY:
        n = len(REGISTRY[name]()) if count else None
        return {"name": name, "kind": "built-in", "found": True, "path": None, "n_raw": n, "n_prompts": n,
                "paper_count": n, "searched": [], "obtain": None, "error": None, "env_var": None,
                "description": "built-in (ddpo-pytorch / toy world)", "paper": "", "split": ""}
    ds = DATASETS[name]
    row = {"name": name, "kind": "dataset", "found": False, "path": None, "n_raw": None, "n_prompts": None,
           "paper_count": ds.paper_count, "env_var": ds.env_var, "description": ds.description,
           "paper": ds.paper, "split": ds.split, "obtain": ds.obtain, "error": None,
           "searched": [f"${ds.env_var}"] + [f"{label}: {path}" for label, path in dataset_candidates(ds)]}
    try:
        row["path"] = str(locate_dataset(name))
        row["found"] = True
        if count:
            row["n_raw"] = len(load_dataset_prompts(name))
            row["n_prompts"] = len(load_prompts(name))
    except UserError as exc:
        row["error"] = str(exc)
    return row


def format_prompt_sets(rows: list[dict]) -> str:
    """Plain-text inventory: one block per prompt set."""
    lines = [f"prompt sets: built-ins, then datasets (explicit path > $PCPO_PROMPTS_<NAME> > {prompts_dir()}/<name> "
             f"> HF hub cache {hf_hub_cache()} > HF datasets cache {hf_datasets_cache()}); nothing is downloaded", ""]
    for r in rows:
        mark = "found  " if r["found"] else "MISSING"
        counts = [] if r["n_prompts"] is None else [f"{r['n_prompts']} prompts"]
        if r["n_raw"] is not None and r["n_raw"] != r["n_prompts"]:
            counts[0] += f" (the paper's selection from {r['n_raw']})"
        if r["paper_count"] is not None:
            counts.append(f"paper used {r['paper_count']}")
        lines.append(f"[{mark}] {r['name']:<16} {'; '.join(counts)}".rstrip())
        if r["kind"] == "built-in":
            continue
        lines.append(f"          {r['description']}; split {r['split']}")
        lines.append(f"          paper: {r['paper']}")
        if r["found"]:
            lines.append(f"          path {r['path']}")
        if r["error"] and r["found"] is False and os.environ.get(r["env_var"] or ""):
            lines.append(f"          error: {r['error']}")
        if not r["found"]:
            lines.extend(f"          looked in {s}" for s in r["searched"])
            lines.append(f"          obtain: {r['obtain']}")
    return "\n".join(lines)
