"""Pair design of a human preference study over a finished study (paper App. "Human Preference Study").

The paper compares PCPO at its reward-matched checkpoint (epoch 120) with the two baseline
checkpoints that bracket its reward (epochs 180 and 240), on 45 prompts x 10 seeds. Here:

1. **checkpoints** (:func:`choose_checkpoints`): ``bracket`` (default) takes the PCPO run of one
   training seed and cell, its reward-matched checkpoint from the study's ``selection.json`` (reward
   r*), and the baseline run of the same seed and cell: its saved checkpoints just below and just
   above r* (:func:`pcpo_eval.stats.select.bracket`, same smoothing window and reward source as the
   study). Or ``pairs``: any list of ``RUN@EPOCH`` (or ``base``) pairs named in the design file.
2. **images**: every checkpoint renders the prompts x seeds of its comparisons with the study's eval
   sampler (:func:`pcpo_eval.generate.generate_set`: seed-controlled, so the two images of a pair
   share their initial noise; resumable). ``comparison_seeds: distinct`` (the default) gives
   comparison k the seeds ``k*S .. k*S+S-1`` (:func:`comparison_seeds`), so a checkpoint in two
   comparisons (a bracket's PCPO) renders both ranges and no image is shown in two comparisons;
   ``shared`` (designs made before the setting) shows its one image of a prompt and seed in both.
   Shown images are re-encoded without PNG metadata and stored under random names: nothing a rater
   can fetch names a method, run or epoch. The two images of a pair must share width, height, file
   format and colour depth (re-encoding cannot equalise those): else the design is refused.
3. **pairs** (:func:`build_pairs`): one per comparison x prompt x seed; attention checks are
   added: ``identical`` (one image on both sides, under two names: the answer expected is a tie) and
   ``degraded`` (an image against a blurred, noisy copy of itself: expected is the intact side).
   **Blinding**: the left/right side of each pair, which images the checks use, the order of the
   main pairs and every token (pair ids, image names) are drawn from a fresh 128-bit secret
   (``secrets.token_bytes``), recorded only in the organiser-private ``design.json``
   (``blinding_secret``), never from the public ``rng_seed`` (which now seeds only the analysis'
   bootstrap): nothing in a design file or on the rating pages lets a rater rebuild the pairs.
   ``position`` lays the main pairs out so that the comparisons of one prompt and seed are
   ``prompts x seeds`` apart (:func:`main_layout`), then the checks: the app cuts each rater's block
   from it (:func:`pcpo_eval.human.db.assignment`), so no rater meets both comparisons of one prompt
   and seed (with ``shared`` seeds: a shared checkpoint's image twice; :func:`check_per_rater`).
4. **files**: ``images/``, ``pairs.parquet`` and, last, ``design.json`` (every setting), so a folder
   with a ``design.json`` is complete; re-running with the same settings does nothing, different
   settings on a folder that holds a design are refused.
"""

from __future__ import annotations

import dataclasses
import hashlib
import hmac
import json
import os
import re
import secrets
import time
from collections.abc import Callable, Sequence
from dataclasses import dataclass
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import (
    COMPARISON_SEEDS,
    LEGACY_COMPARISON_SEEDS,
    PAIR_COLUMNS,
    HumanLayout,
    design_comparison_seeds,
    shown_png,
)
from pcpo_eval.human.settings import ASSIGNMENT_KEYED, parse_secret
from pcpo_eval.human.tables import validate_pairs
from pcpo_eval.io import (
    atomic_dir,
    atomic_write_json,
    atomic_write_parquet,
    atomic_write_text,
    check_finite,
    check_out_path,
    check_own_folder,
    ensure_dir,
)
from pcpo_eval.rundir import checkpoint_dir
from pcpo_eval.studydir import StudyLayout, StudyView

_CKPT_RE = re.compile(r"^(?P<run>.+)@(?P<epoch>\d+)$")
#: How the app cuts raters' blocks from a design written now (design.json ``assignment``): stratified
#: by kind, main pairs laid out by :func:`main_layout` (:func:`pcpo_eval.human.db.assignment`), each
#: rater's order keyed by a secret derived from the blinding secret (:mod:`pcpo_eval.human.settings`).
ASSIGNMENT = ASSIGNMENT_KEYED
#: How :func:`build_pairs` draws sides and lays main pairs out (design.json ``layout``): ``cyclic`` (designs
#: that record none: sides by independent coin flips, comparison ``(i + j) mod C`` per slot) or
#: ``offset-balanced`` (every design made now: :func:`balanced_sides`, secret offsets in :func:`main_layout`).
#: The secret regenerates a design's table only under its own layout.
LAYOUTS = ("cyclic", "offset-balanced")
LAYOUT = "offset-balanced"
#: Where the degraded checks' noise comes from (design.json ``check_noise``): ``pairs`` (designs that record
#: none: the generator that draws the sides, whose draws a rater sees pixel by pixel) or ``own-stream`` (every
#: design made now: :meth:`Blinding.stream` 2). The secret regenerates a design's table only under its own.
CHECK_NOISES = ("pairs", "own-stream")
CHECK_NOISE = "own-stream"
#: How a design made now draws its seeds (design.json ``seed_draw``): from its blinding secret
#: (:func:`comparison_seeds` with a key); designs that record none used the public ``k*S ..`` layout.
SEED_DRAW = "secret"


@dataclass(frozen=True)
class HumanDesignSpec:
    """Settings of a pair design (a YAML file such as ``analysis/human/toy_human.yaml``; all optional).

    Attributes:
        checkpoints: ``bracket`` or ``pairs``.
        pairs: with ``checkpoints: pairs``, a list of ``[A, B]`` where each is ``RUN@EPOCH`` (a run
            of the study and one of its saved epochs) or ``base`` (the untrained model).
        seed: training seed of the runs a bracket uses (default: the smallest PCPO seed).
        cell: the comparison cell of a bracket, e.g. ``batch=16`` (default: the first cell).
        prompts: prompt set or file (default: the study's eval prompts); ``max_prompts``, ``seeds``:
            how many prompts (in set order) and seeds per prompt (paper: 45 x 10).
        comparison_seeds: ``distinct`` (default): comparison k renders seeds ``k*seeds ..
            k*seeds + seeds - 1`` for both its checkpoints, so no image is shown in two comparisons (a
            bracket's shared checkpoint renders both ranges); ``shared``: every comparison on seeds
            ``0 .. seeds - 1``, so a shared checkpoint's image is shown in both of its comparisons
            (designs written before this setting existed are ``shared``).
        identical, degraded: number of attention checks of each kind.
        per_rater: pairs shown to one rater (``null``: every pair; with ``shared`` seeds and a
            shared checkpoint, refused).
        rng_seed: seeds the analysis' bootstrap only. It is public (it sits in the design file) and
            does **not** seed the blinding: sides, order, checks and tokens come from a secret.
        batch_size: images per model call when rendering; device: set by ``--device``.
    """

    checkpoints: str = "bracket"
    pairs: tuple[tuple[str, str], ...] = ()
    seed: int | None = None
    cell: str | None = None
    prompts: str | None = None
    max_prompts: int | None = 45
    seeds: int = 10
    comparison_seeds: str = "distinct"
    identical: int = 10
    degraded: int = 10
    per_rater: int | None = 40
    rng_seed: int = 0
    batch_size: int = 16
    device: str = "cpu"

    def to_dict(self) -> dict[str, Any]:
        return dataclasses.asdict(self) | {"pairs": [list(p) for p in self.pairs]}


def _is_int(x: Any, least: int) -> bool:
    return isinstance(x, int) and not isinstance(x, bool) and x >= least


def _spec_problems(d: dict[str, Any]) -> list[str]:
    """Every problem of a design mapping (names the key and the fix)."""
    fields = {f.name for f in dataclasses.fields(HumanDesignSpec)} - {"device"}  # device: the --device flag
    problems = [f"unknown key {k!r} (keys: {', '.join(sorted(fields))})" for k in d if k not in fields]
    if d.get("comparison_seeds", "distinct") not in COMPARISON_SEEDS:
        problems.append(f"comparison_seeds {d['comparison_seeds']!r}: use distinct (each comparison on its own seeds) "
                        "or shared (every comparison on seeds 0 .. seeds-1)")
    if d.get("checkpoints", "bracket") not in ("bracket", "pairs"):
        problems.append(f"checkpoints {d['checkpoints']!r}: use bracket or pairs")
    if d.get("checkpoints") == "pairs":
        pairs = d.get("pairs")
        if not isinstance(pairs, list) or not pairs or not all(
                isinstance(p, list | tuple) and len(p) == 2 and all(isinstance(x, str) for x in p) for p in pairs):
            problems.append("pairs: give a non-empty list of [RUN@EPOCH, RUN@EPOCH] (or base)")
        elif any(a == b for a, b in pairs):
            problems.append("pairs: a checkpoint is compared with itself; name two different checkpoints")
    for key, least in (("seeds", 1), ("identical", 0), ("degraded", 0), ("batch_size", 1), ("rng_seed", 0)):
        if key in d and not _is_int(d[key], least):
            problems.append(f"{key} {d[key]!r}: use a whole number >= {least}")
    for key in ("max_prompts", "per_rater", "seed"):
        if d.get(key) is not None and not _is_int(d[key], 0 if key == "seed" else 1):
            problems.append(f"{key} {d[key]!r}: use a whole number >= {0 if key == 'seed' else 1} or null")
    for key in ("prompts", "cell", "device"):
        if d.get(key) is not None and not isinstance(d[key], str):
            problems.append(f"{key} {d[key]!r}: use a string")
    return problems


def parse_design_spec(d: dict[str, Any], where: str = "human design") -> HumanDesignSpec:
    """Validate a design mapping (every problem at once, one line) and build the spec."""
    check_finite(d, where)
    problems = _spec_problems(d)
    if problems:
        raise UserError(f"{where}: {'; '.join(problems)}")
    d = dict(d)
    d["pairs"] = tuple(tuple(p) for p in d.get("pairs") or ())
    return HumanDesignSpec(**d)


def load_design_spec(path: str | Path | None) -> HumanDesignSpec:
    """The design file at ``path`` (``None``: every default)."""
    from pcpo_eval.io import read_yaml_mapping

    if path is None:
        return HumanDesignSpec()
    d = read_yaml_mapping(path, "human design file", "give a YAML file such as analysis/human/toy_human.yaml")
    return parse_design_spec(d, f"human design file {path}")


# ---- the study --------------------------------------------------------------------------------


@dataclass(frozen=True)
class Checkpoint:
    """One compared model: label shown in the analysis (never to raters), its model spec, reward."""

    label: str
    model: str
    run: str | None = None
    epoch: int | None = None
    reward: float | None = None


def _bracket_rows(view: StudyView, ds: HumanDesignSpec) -> tuple[dict[str, Any], dict[str, Any]]:
    """The PCPO selection row of the bracket and the baseline run's row (same seed and cell)."""
    rows = view.selection["runs"]
    pcpo = [r for r in rows if r["role"] == "pcpo"]
    seeds = sorted({r["seed"] for r in pcpo})
    cells = list(dict.fromkeys(r["cell"] for r in pcpo))
    seed = seeds[0] if ds.seed is None else ds.seed
    cell = cells[0] if ds.cell is None else ds.cell
    if seed not in seeds or cell not in cells:
        raise UserError(f"bracket seed {seed} / cell {cell!r} has no PCPO run; seeds: {seeds}, cells: {cells}")
    ref = next(r for r in pcpo if r["seed"] == seed and r["cell"] == cell)
    if not ref["reached"]:
        raise UserError(f"the PCPO run {ref['name']} has no reward-matched checkpoint ({ref['status']}); choose "
                        "another seed, lower the study's select_target, or name the checkpoints (checkpoints: pairs)")
    base = [r for r in rows if r["role"] == "baseline" and r["seed"] == seed and r["cell"] == cell]
    if not base:
        raise UserError(f"no baseline run with seed {seed} in cell {cell!r}; name the checkpoints (checkpoints: pairs)")
    return ref, base[0]


def choose_checkpoints(view: StudyView, ds: HumanDesignSpec) -> tuple[list[tuple[Checkpoint, Checkpoint]], dict]:
    """The compared checkpoint pairs and a JSON note of how they were chosen (see the module docstring)."""
    from pcpo_eval.stats.select import bracket, run_checkpoints

    if ds.checkpoints == "pairs":
        pairs = [(_named(view, a), _named(view, b)) for a, b in ds.pairs]
        return pairs, {"rule": "pairs named in the design file"}
    ref, base = _bracket_rows(view, ds)
    window, on = int(view.spec["window"]), view.spec.get("select_on", "train")
    cks, source = run_checkpoints(view.run_dir(base["name"]), window, on)
    b = bracket(cks, float(ref["reward"]))
    p = Checkpoint(f"{ref['arm']}@{ref['epoch']}", ref["path"], ref["name"], int(ref["epoch"]), float(ref["reward"]))
    sides = [c for c in (b.below, b.above) if c is not None]
    pairs = [(p, Checkpoint(f"{base['arm']}@{c.epoch}", c.path, base["name"], c.epoch, c.reward)) for c in sides]
    note = {"rule": "bracket", "reference": dataclasses.asdict(p), "reward_source": source, "window": window,
            "below": dataclasses.asdict(b.below) if b.below else None,
            "above": dataclasses.asdict(b.above) if b.above else None}
    return pairs, note


def _named(view: StudyView, name: str) -> Checkpoint:
    """``base`` or ``RUN@EPOCH`` of the study -> a checkpoint (its saved folder must exist)."""
    if name == "base":
        return Checkpoint("base", view.spec["base_model"])
    m = _CKPT_RE.match(name)
    if not m:
        raise UserError(f"checkpoint {name!r}: write RUN@EPOCH (a run of the study and a saved epoch) or base")
    run, epoch = m["run"], int(m["epoch"])
    path = checkpoint_dir(view.run_dir(run), epoch)
    if not path.is_dir():
        raise UserError(f"checkpoint {name!r}: {path} does not exist; name a saved epoch of {run}")
    return Checkpoint(f"{view.arm(run)}@{epoch}" if run else name, str(path), run, epoch)


def _unique_labels(pairs: list[tuple[Checkpoint, Checkpoint]]) -> list[tuple[Checkpoint, Checkpoint]]:
    """Checkpoint labels are ``ARM@EPOCH``; two runs of one arm at one epoch get ``RUN@EPOCH`` instead."""
    by_label: dict[str, set[str]] = {}
    for c in (c for p in pairs for c in p):
        by_label.setdefault(c.label, set()).add(c.model)
    fix = {lab for lab, models in by_label.items() if len(models) > 1}
    return [tuple(dataclasses.replace(c, label=f"{c.run}@{c.epoch}") if c.label in fix else c for c in p)
            for p in pairs]  # type: ignore[misc]


# ---- seeds ------------------------------------------------------------------------------------


#: The smallest seed a design draws from its secret (:func:`comparison_seeds`): far above the seeds a
#: study's eval sets, grids and figures use (0 .. N-1), so no shown image is also in the study's folder.
SECRET_SEED_FLOOR = 1_000_000


def comparison_seeds(n_comparisons: int, seeds: int, mode: str, key: bytes | None = None) -> list[list[int]]:
    """The seeds of each comparison. Within a comparison both checkpoints render the same seeds, so the
    two images of a pair share their initial noise. ``distinct``: no seed in two comparisons; ``shared``:
    every comparison on the same seeds.

    With ``key`` (the design's blinding secret; every design made now) the seeds are drawn from it,
    without repeats, in ``SECRET_SEED_FLOOR .. MAX_SEED`` (9 million values), sorted per comparison.
    Blinding: an image's noise is a public function of (prompt id, seed) (:mod:`pcpo_eval.seeding`), so
    with public seeds anyone could re-render the public base model at them and match a shown image
    pixel for pixel (every ``base`` side named, 32 of 32 pairs), find each pair's comparison, or find the
    shown images, with their method, in the study's own eval sets and report grid (same sampler, prompts
    and seeds 0 ..). Without ``key`` (designs made before): ``distinct``: comparison k on ``k*seeds ..
    k*seeds + seeds - 1``; ``shared``: ``0 .. seeds - 1``."""
    if mode not in COMPARISON_SEEDS:
        raise UserError(f"comparison_seeds {mode!r}: use distinct or shared")
    groups = n_comparisons if mode == "distinct" else 1
    if key is None:
        drawn = list(range(groups * seeds))
    else:
        from pcpo_eval.generate.plan import MAX_SEED

        digest = hmac.new(key, b"pcpo-eval/human/seeds", hashlib.sha256).digest()
        rng = np.random.default_rng(int.from_bytes(digest, "little"))
        drawn = (SECRET_SEED_FLOOR + rng.choice(MAX_SEED - SECRET_SEED_FLOOR + 1, groups * seeds, replace=False)).tolist()
    per = [sorted(drawn[g * seeds:(g + 1) * seeds]) for g in range(groups)]
    return per if mode == "distinct" else per * n_comparisons


def checkpoint_seeds(pairs: Sequence[tuple[Checkpoint, Checkpoint]], seeds: int, mode: str,
                     key: bytes | None = None) -> dict[str, list[int]]:
    """label -> the sorted seeds its image set must hold: the union over the comparisons it is in
    (with ``distinct`` seeds a bracket's shared checkpoint renders two groups, one per comparison);
    ``key``: :func:`comparison_seeds`'."""
    out: dict[str, set[int]] = {}
    for pair, ss in zip(pairs, comparison_seeds(len(pairs), seeds, mode, key), strict=True):
        for c in pair:
            out.setdefault(c.label, set()).update(ss)
    return {label: sorted(v) for label, v in out.items()}


def seed_text(seeds: Sequence[int]) -> str:
    """``0-9``, ``0-9, 20-29``: a sorted seed list as inclusive ranges."""
    runs: list[list[int]] = []
    for s in sorted(seeds):
        if runs and s == runs[-1][1] + 1:
            runs[-1][1] = s
        else:
            runs.append([s, s])
    return ", ".join(f"{a}-{b}" if a != b else f"{a}" for a, b in runs)


# ---- rendering --------------------------------------------------------------------------------


def _safe(label: str) -> str:
    return re.sub(r"[^A-Za-z0-9._-]+", "_", label)


def _n_keys(view: StudyView, ds: HumanDesignSpec) -> int | None:
    """Prompts x seeds each checkpoint renders (None when the prompt set cannot be read here: the render
    says why, and the design's own check runs once the sets exist)."""
    from pcpo_eval.prompts import load_prompts

    try:
        return len(load_prompts(ds.prompts or view.spec["eval"]["prompts"], limit=ds.max_prompts)) * ds.seeds
    except (UserError, OSError, KeyError):
        return None


def render_sets(view: StudyView, ds: HumanDesignSpec, checkpoints: Sequence[Checkpoint], sets_root: Path,
                log: Callable[[str], None] = print, progress: bool = False,
                seeds: dict[str, list[int]] | None = None) -> dict[str, Path]:
    """Render every checkpoint's prompts x seeds with the study's eval sampler; label -> set folder.

    ``seeds``: label -> the seeds its set holds (:func:`checkpoint_seeds`; default: ``0 .. ds.seeds - 1``
    for every checkpoint). Logs one line per checkpoint (k of m, how many images) and its time;
    ``progress``: generate's per-batch bar too."""
    from pcpo_eval.generate.plan import seed_arg
    from pcpo_eval.generate.runner import generate_set

    ev = view.spec["eval"]
    sampling = _sampling(view)
    out: dict[str, Path] = {}
    for i, c in enumerate(checkpoints, 1):
        folder = sets_root / _safe(c.label)
        mine = list(range(ds.seeds)) if seeds is None else seeds[c.label]
        n = f"{ds.max_prompts} prompts" if ds.max_prompts else "every prompt"
        shown = "secret" if seeds is not None and min(mine) >= SECRET_SEED_FLOOR else seed_text(mine)  # off the logs
        log(f"[human] rendering checkpoint {i} of {len(checkpoints)}: {c.label} ({n} x {len(mine)} seeds "
            f"[{shown}], {sampling['steps']} steps) -> {folder}")
        t0 = time.perf_counter()
        generate_set(c.model, ds.prompts or ev["prompts"], seed_arg(mine), folder, batch_size=ds.batch_size,
                     steps=sampling["steps"], cfg=sampling["cfg"], eta=sampling["eta"],
                     schedule=sampling["sigma_schedule"], device=ds.device, max_prompts=ds.max_prompts,
                     progress=progress)
        log(f"[human] {c.label} rendered in {time.perf_counter() - t0:.0f} s")
        out[c.label] = folder
    return out


def _sampling(view: StudyView) -> dict[str, Any]:
    """The study's eval sampler settings (:meth:`pcpo_eval.study.spec.StudySpec.sampling`, recorded in
    ``spec.resolved.json``)."""
    if "sampling" not in view.spec:
        raise UserError(f"{StudyLayout(view.root).spec_file} predates recorded sampler settings; re-run "
                        f"`pcpo-eval study SPEC --out {view.root} --stages select` to rewrite it")
    return view.spec["sampling"]


# ---- pairs ------------------------------------------------------------------------------------


#: Bytes of the secret that draws the blinding (128 bits).
SECRET_BYTES = 16


def new_secret() -> bytes:
    """A fresh blinding secret (:data:`SECRET_BYTES` bytes from the OS's CSPRNG)."""
    return secrets.token_bytes(SECRET_BYTES)


@dataclass
class Blinding:
    """Every random draw that blinds a design, all from one secret (never from ``rng_seed``).

    ``rng`` (sides, order, which images the checks use) is a numpy generator seeded by the 128-bit
    secret through a SeedSequence (:meth:`stream` 0; the file write order and the degraded checks' noise
    have streams of their own); ``token()`` (pair ids, image names) is HMAC-SHA256(secret, counter), 64 bits, so a token says nothing about the
    generator's state. The same secret gives the same design (tests); a new one, a new design.
    """

    secret: bytes
    rng: np.random.Generator = dataclasses.field(init=False)
    _count: int = dataclasses.field(default=0, init=False)

    def __post_init__(self) -> None:
        if not isinstance(self.secret, bytes) or len(self.secret) < SECRET_BYTES:
            raise ValueError(f"a blinding secret has at least {SECRET_BYTES} bytes")
        self.rng = self.stream(0)

    def stream(self, k: int) -> np.random.Generator:
        """An independent generator ``k`` of this secret (0: the pairs; 1: the file write order; 2: the
        degraded checks' noise, which a rater sees pixel by pixel and so must not come from the pairs')."""
        return np.random.default_rng(np.random.SeedSequence([int.from_bytes(self.secret, "big"), k]))

    def token(self) -> str:
        """The next 16-hex token."""
        self._count += 1
        return hmac.new(self.secret, f"token:{self._count}".encode(), hashlib.sha256).hexdigest()[:16]


def degrade(pixels: np.ndarray, rng: np.random.Generator) -> np.ndarray:
    """A clearly degraded copy of an (H, W, 3) uint8 image: box blur over a quarter of its width plus
    Gaussian noise (SD 40 grey levels)."""
    from PIL import Image, ImageFilter

    h, w = pixels.shape[:2]
    img = Image.fromarray(pixels).filter(ImageFilter.BoxBlur(max(1, w // 8)))
    noisy = np.asarray(img, dtype=np.float64) + rng.normal(0.0, 40.0, size=(h, w, 3))
    return np.clip(np.rint(noisy), 0, 255).astype(np.uint8)


@dataclass(frozen=True)
class _Manifest:
    """A set's manifest by (prompt id, seed): ``keys`` in the manifest's sorted order, ``rows`` each key's
    (image path, prompt). Dict lookups: a pandas MultiIndex ``.loc`` per pair took about 1 ms, 15 s of a
    10,000-pair design."""

    keys: list[tuple[int, int]]
    rows: dict[tuple[int, int], tuple[str, str]]


def _manifest(folder: Path) -> _Manifest:
    from pcpo_eval.imageset import MANIFEST_FILE

    m = pd.read_parquet(folder / MANIFEST_FILE, columns=["prompt_id", "prompt", "seed", "path"])
    m = m.set_index(["prompt_id", "seed"]).sort_index()
    keys = list(m.index)
    return _Manifest(keys, dict(zip(keys, zip(m["path"].tolist(), m["prompt"].tolist(), strict=True), strict=True)))


@dataclass
class _Images:
    """Shown images: token -> pixels source (a PNG path, or pixels of a degraded copy)."""

    files: dict[str, Path | np.ndarray] = dataclasses.field(default_factory=dict)
    by_key: dict[tuple[str, int, int], str] = dataclasses.field(default_factory=dict)

    def token(self, blind: Blinding, label: str, pid: int, seed: int, path: Path) -> str:
        key = (label, pid, seed)
        if key not in self.by_key:
            self.by_key[key] = tok = blind.token()
            self.files[tok] = path
        return self.by_key[key]

    def extra(self, blind: Blinding, source: Path | np.ndarray) -> str:
        tok = blind.token()
        self.files[tok] = source
        return tok


def shared_checkpoints(pairs: Sequence[tuple[Checkpoint, Checkpoint]]) -> list[str]:
    """Labels of the checkpoints that take part in more than one comparison (a bracket's PCPO)."""
    labels = [c.label for p in pairs for c in p]
    return sorted({lab for lab in labels if labels.count(lab) > 1})


def check_per_rater(pairs: Sequence[tuple[Checkpoint, Checkpoint]], per_rater: int | None,
                    n_keys: int | None = None, n_checks: tuple[int, int] = (0, 0),
                    seeds_mode: str = "shared") -> None:
    """Refuse a ``per_rater`` that would show one rater a shared checkpoint's image twice, or a block
    with no main pair (UserError).

    With ``shared`` seeds (``seeds_mode``, the design's ``comparison_seeds``) a checkpoint in two
    comparisons has one image per prompt and seed, shown in both: a rater who meets both pairs sees
    identical bytes on one side of each and so knows which side it is. ``per_rater: null`` (every
    rater sees every pair) always does; with ``n_keys`` (prompts x seeds) known, so does a block of
    more than ``n_keys`` main pairs. With ``distinct`` seeds each comparison shows its own images of
    the shared checkpoint (no image is in two comparisons), so neither is refused. A block so small
    that the attention checks fill it would collect answers that compare nothing (either mode).
    """
    if n_keys is not None and per_rater is not None:
        _check_block_holds_a_main_pair(n_keys * len(pairs), n_checks, per_rater)
    shared = shared_checkpoints(pairs)
    if seeds_mode == "distinct" or not shared or len(pairs) < 2:
        return
    fix = ("set comparison_seeds: distinct (each comparison on its own seeds) if every rater must see "
           "every pair")
    what = (f"checkpoint {', '.join(shared)} is in {len(pairs)} comparisons with one image per prompt and seed, "
            "so a rater who meets both pairs of a prompt and seed sees that image twice and can tell its side")
    if per_rater is None:
        most = (max_safe_per_rater(n_keys * len(pairs), n_checks, n_keys) if n_keys
                else "about the number of prompts x seeds")
        raise UserError(f"per_rater: null shows every rater every pair, but {what}; set per_rater to at most "
                        f"{most} (pairs per rater), or {fix}")
    if n_keys is None:
        return
    from pcpo_eval.human.db import block_counts

    n_main = n_keys * len(pairs)
    limit = max_safe_per_rater(n_main, n_checks, n_keys)
    if per_rater > limit:
        raise UserError(f"per_rater {per_rater} gives a rater {block_counts(n_main, *n_checks, per_rater)[0]} main "
                        f"pairs out of {n_keys} prompts x seeds, but {what}; set per_rater to at most {limit}, "
                        f"or {fix}")


def _check_block_holds_a_main_pair(n_main: int, n_checks: tuple[int, int], per_rater: int) -> None:
    """UserError when a block of ``per_rater`` pairs holds only attention checks."""
    from pcpo_eval.human.db import block_counts

    if n_main == 0 or block_counts(n_main, *n_checks, per_rater)[0] > 0:
        return
    least = next(p for p in range(per_rater + 1, n_main + sum(n_checks) + 1) if block_counts(n_main, *n_checks, p)[0])
    raise UserError(f"per_rater {per_rater} leaves no main pair after the attention checks (every rater gets at least "
                    f"one of each kind the design has: {n_checks[0]} identical, {n_checks[1]} degraded); set per_rater "
                    f"to at least {least}")


def max_safe_per_rater(n_main: int, n_checks: tuple[int, int], n_keys: int) -> int:
    """The largest ``per_rater`` whose blocks hold at most ``n_keys`` main pairs (and are not the whole design)."""
    from pcpo_eval.human.db import block_counts

    n = n_main + sum(n_checks)
    ok = [p for p in range(1, n) if block_counts(n_main, *n_checks, p)[0] <= n_keys]
    return max(ok, default=0)


def main_layout(n_keys: int, n_comparisons: int, rng: np.random.Generator,
                layout: str = LAYOUT) -> list[tuple[int, int]]:
    """(key index, comparison index) of every main pair in ``position`` order.

    Keys (prompt x seed) come in a random order ``k_0 .. k_{G-1}``; slot ``j*G + i`` holds key
    ``k_i`` in comparison ``(j + o_i) mod C``, where the secret offsets ``o_i`` of each aligned run of C
    keys are a random permutation of ``0 .. C-1``. So each stretch of slots mixes the comparisons, and
    the C pairs of one key lie exactly G apart (cyclically too): any run of at most G consecutive
    slots, which is what :func:`pcpo_eval.human.db.assignment` gives one rater, holds each key at most once.

    Blinding: ``position`` is in the serving bundle and the app's database, where ``(i + j) mod C``
    (the layout before the offsets) told every pair's comparison from its position alone (96 of 96 in a
    toy bundle); with secret offsets a slot's comparison is uniform over the C given its position.
    ``layout="cyclic"`` (designs made before, :data:`LAYOUTS`): ``o_i = i``.
    """
    order = rng.permutation(n_keys)
    if layout == "cyclic":
        return [(int(order[i]), (i + j) % n_comparisons) for j in range(n_comparisons) for i in range(n_keys)]
    offsets = np.concatenate([rng.permutation(n_comparisons) for _ in range(-(-n_keys // n_comparisons))])
    return [(int(order[i]), int((j + offsets[i]) % n_comparisons)) for j in range(n_comparisons)
            for i in range(n_keys)]


def balanced_sides(n: int, rng: np.random.Generator) -> np.ndarray:
    """Whether the first checkpoint of each of a comparison's ``n`` main pairs is shown on the left: half of
    them (a coin flip decides an odd one out), in a random order.

    Independent coin flips left one comparison of a toy design 18 / 30 and one rater 3 / 15 on the left;
    a fixed margin balances a comparison's position bias against its methods exactly, while any two pairs'
    sides stay almost independent (correlation ``-1/(n-1)``), so one recognised image tells a rater next
    to nothing of another pair's side."""
    left = np.arange(n) < n // 2
    if n % 2:
        left[-1] = bool(rng.integers(2))
    return rng.permutation(left)


def build_pairs(pairs: Sequence[tuple[Checkpoint, Checkpoint]], sets: dict[str, Path], ds: HumanDesignSpec,
                secret: bytes | None = None, layout: str = LAYOUT,
                seeds: Sequence[Sequence[int]] | None = None,
                check_noise: str = CHECK_NOISE) -> tuple[pd.DataFrame, _Images]:
    """The pairs table (PAIR_COLUMNS) and the images it shows.

    Every blinding draw comes from ``secret`` (default: a fresh one, :func:`new_secret`), never from
    ``ds.rng_seed``: the same secret gives the same table, settings alone do not. Refuses (UserError)
    a ``per_rater`` that would show a rater a shared checkpoint's image twice (:func:`check_per_rater`),
    sets that lack an image the design shows (the message names the seeds and the command that
    renders them), and pairs whose two images differ in size, file format or colour depth
    (:func:`_check_pair_grids`).

    ``seeds``: each comparison's seeds (:func:`comparison_seeds`; :func:`make_design` passes the ones drawn
    from the secret; default: the public ones of designs made before, ``k*S .. k*S+S-1``).
    ``ds.comparison_seeds``: ``distinct``: comparison k shows its own seeds of every prompt
    (S = ``ds.seeds``), so no image is in two comparisons, and the attention checks reuse the image of
    one side (at random) of one main pair (at random), so a check repeats the bytes of exactly one
    comparison's pair and, pooled with it, tells its side with probability 1/2; ``shared``: every
    comparison shows every key of the sets (as designs did before the setting), the checks draw a
    checkpoint, then a key. ``layout`` and ``check_noise``: a design's recorded ones (:data:`LAYOUTS`,
    :data:`CHECK_NOISES`; designs made before each setting used the first).
    """
    blind = Blinding(new_secret() if secret is None else secret)
    images = _Images()
    manifests = {lab: _manifest(folder) for lab, folder in sets.items()}
    first = next(iter(manifests.values()))
    if ds.comparison_seeds == "shared":
        comp_keys = [list(first.keys)] * len(pairs)
    else:
        pids = sorted({int(p) for p, _ in first.keys})
        comp_keys = [[(pid, s) for pid in pids for s in ss]
                     for ss in seeds or comparison_seeds(len(pairs), ds.seeds, ds.comparison_seeds)]
    _check_sets_cover(pairs, comp_keys, manifests, sets, ds)
    _check_pair_grids(pairs, comp_keys, manifests, sets)
    n_keys = len(comp_keys[0])
    check_per_rater(pairs, ds.per_rater, n_keys, (ds.identical, ds.degraded), ds.comparison_seeds)
    slots = main_layout(n_keys, len(pairs), blind.rng, layout)
    if layout == "cyclic":  # a coin flip per pair, drawn after its image tokens
        rows = [_main_row(pairs[c], comp_keys[c][k], manifests, sets, images, blind, None) for k, c in slots]
    else:
        comps = np.array([c for _, c in slots])
        left_first = np.zeros(len(slots), dtype=bool)
        for c in range(len(pairs)):
            left_first[comps == c] = balanced_sides(int((comps == c).sum()), blind.rng)
        rows = [_main_row(pairs[c], comp_keys[c][k], manifests, sets, images, blind, bool(left_a))
                for (k, c), left_a in zip(slots, left_first, strict=True)]
    noise = blind.stream(2) if check_noise == "own-stream" else blind.rng
    checks = _attention_rows(blind, noise, images, manifests, sets, ds,
                             _check_images(ds, list(manifests), list(first.keys), list(rows)))
    rows += [checks[i] for i in blind.rng.permutation(len(checks))]
    for r in rows:
        r["pair_id"] = blind.token()
    table = pd.DataFrame(rows)
    table["position"] = np.arange(len(table))
    return table[list(PAIR_COLUMNS)], images


def _check_images(ds: HumanDesignSpec, labels: list[str], keys: list[tuple[int, int]],
                  main: list[dict[str, Any]]) -> Callable[[np.random.Generator], tuple[str, int, int]]:
    """How an attention check draws its image: (checkpoint, prompt id, seed) from the generator.

    ``distinct`` seeds: one side (1/2 each) of one main pair (uniform), so a check repeats the bytes of
    one pair of one comparison only, and which side of it is a coin flip. ``shared`` (as before the
    setting): a checkpoint (uniform over ``labels``), then a key (uniform over ``keys``)."""
    if ds.comparison_seeds == "shared":
        def pick(rng: np.random.Generator) -> tuple[str, int, int]:
            label = labels[int(rng.integers(len(labels)))]
            pid, seed = keys[int(rng.integers(len(keys)))]
            return label, pid, seed
    else:
        def pick(rng: np.random.Generator) -> tuple[str, int, int]:
            r = main[int(rng.integers(len(main)))]
            return r[f"{('left', 'right')[int(rng.integers(2))]}_method"], r["prompt_id"], r["seed"]
    return pick


def _check_sets_cover(pairs: Sequence[tuple[Checkpoint, Checkpoint]], comp_keys: Sequence[Sequence[tuple[int, int]]],
                      manifests: dict[str, _Manifest], sets: dict[str, Path], ds: HumanDesignSpec) -> None:
    """UserError naming, per checkpoint, the seeds its image set lacks and the ``generate`` command that
    renders them (into the same folder: it resumes)."""
    need: dict[str, set[tuple[int, int]]] = {}
    model = {}
    for pair, keys in zip(pairs, comp_keys, strict=True):
        for c in pair:
            need.setdefault(c.label, set()).update(keys)
            model[c.label] = c.model
    problems = []
    for label, keys in need.items():
        have = set(manifests[label].rows) if label in manifests else set()
        missing = keys - have
        if missing:
            seeds = sorted({s for _, s in keys})
            problems.append(f"{label}'s image set {sets.get(label, '(none)')} lacks {len(missing)} image(s) this design "
                            f"shows (seeds {seed_text({s for _, s in missing})}); render them: "
                            f"`{generate_command(sets.get(label), model[label], seeds, ds)}`")
    if problems:
        mode = ("each comparison renders its own seeds (comparison_seeds: distinct), so a checkpoint in several "
                "comparisons needs every one of their seed ranges" if ds.comparison_seeds == "distinct" else
                "every comparison renders the same seeds (comparison_seeds: shared)")
        raise UserError(f"{'; '.join(problems)} ({mode})")


#: Colour modes that hold full 8-bit RGB (alpha or padding aside): re-encoded to RGB, they keep every pixel.
_FULL_COLOUR = frozenset({"RGB", "RGBA", "RGBX"})


def _grid(path: Path) -> tuple[str, int, int, str]:
    """(file format, width, height, colour depth) of an image file (its header only); the depth is
    ``RGB`` for full 8-bit colour, else the mode (``P``: a palette, ``L``: grey)."""
    from PIL import Image

    with Image.open(path) as im:
        return str(im.format), int(im.width), int(im.height), "RGB" if im.mode in _FULL_COLOUR else str(im.mode)


def _grid_text(grid: tuple[str, int, int, str]) -> str:
    return f"{grid[1]}x{grid[2]} {grid[0]} ({grid[3]})"


def _check_pair_grids(pairs: Sequence[tuple[Checkpoint, Checkpoint]], comp_keys: Sequence[Sequence[tuple[int, int]]],
                      manifests: dict[str, _Manifest], sets: dict[str, Path]) -> None:
    """UserError when the two images of a main pair differ in width, height, file format or colour depth.

    Blinding: re-encoding (:func:`_write_images`) equalises how a set was written, not its pixels:
    a checkpoint rendered at another resolution would be the side of that size in every pair, one
    stored lossily (JPEG) the side with the block artefacts (and so the larger PNG), one stored as a
    palette or grey the side with few colours (the smaller PNG). Names each comparison, both
    checkpoints' grids and a prompt and seed where they differ."""
    problems = []
    grids: dict[Path, tuple[str, int, int, str]] = {}  # an image in several comparisons: its header read once
    for (a, b), keys in zip(pairs, comp_keys, strict=True):
        for pid, seed in keys:
            paths = (sets[c.label] / manifests[c.label].rows[(pid, seed)][0] for c in (a, b))
            ga, gb = (grids[q] if q in grids else grids.setdefault(q, _grid(q)) for q in paths)
            if ga != gb:
                problems.append(f"{a.label} vs {b.label}: {a.label}'s images are {_grid_text(ga)}, {b.label}'s "
                                f"{_grid_text(gb)} (e.g. prompt {pid} seed {seed})")
                break
    if problems:
        raise UserError(f"{'; '.join(problems)}: the two images of a pair must have one size, file format and "
                        "colour depth, or the side with the other one names its checkpoint to every rater; render both "
                        "checkpoints with the same sampler settings (`pcpo-eval generate` writes PNG at the "
                        "model's resolution)")


def generate_command(folder: Path | None, model: str, seeds: Sequence[int], ds: HumanDesignSpec) -> str:
    """The ``pcpo-eval generate`` command that renders ``seeds`` (all the set needs: a set's manifest lists
    the seeds of its last run) into the set ``folder`` with the settings its
    ``set.json`` records (else the checkpoint's model and the design's prompts)."""
    import shlex

    from pcpo_eval.generate.plan import seed_arg
    from pcpo_eval.imageset import SET_FILE

    info: dict[str, Any] = {}
    if folder is not None and (Path(folder) / SET_FILE).is_file():
        try:
            info = json.loads((Path(folder) / SET_FILE).read_text())
        except (OSError, ValueError):
            info = {}
    st, run = info.get("settings") or {}, info.get("run") or {}
    parts = ["pcpo-eval generate", "--model", shlex.quote(str(st.get("model", model))),
             "--prompts", shlex.quote(str(run.get("prompts") or ds.prompts or "PROMPTS")),
             "--seeds", seed_arg(seeds), "--out", shlex.quote(str(folder or "SET"))]
    for key, flag in (("sampler", "--sampler"), ("steps", "--steps"), ("cfg", "--cfg"), ("eta", "--eta"),
                      ("schedule", "--schedule"), ("precision", "--precision"), ("attention", "--attention")):
        if key in st:
            parts += [flag, shlex.quote(str(st[key]))]
    if st.get("device"):
        parts += ["--device", "cuda" if st["device"] == "cuda" else shlex.quote(str(st["device"]))]
    if (st.get("batch_invariance") == "bitwise" and st.get("micro_batch")) or st.get("batch_invariance") == "none":
        parts += ["--micro-batch", str(st.get("micro_batch") or 0)]
    limit = run.get("n_prompts") if run.get("n_prompts_beyond_limit") else ds.max_prompts
    if limit:
        parts += ["--max-prompts", str(limit)]
    if run.get("max_prompt_tokens") is not None:
        parts += ["--max-prompt-tokens", str(run["max_prompt_tokens"])]
    return " ".join(parts)


def _main_row(pair: tuple[Checkpoint, Checkpoint], key: tuple[int, int], manifests: dict[str, _Manifest],
              sets: dict[str, Path], images: _Images, blind: Blinding, left_a: bool | None) -> dict[str, Any]:
    """One main pair: the two checkpoints' images of one prompt and seed; ``left_a``: the first on the left
    (:func:`balanced_sides`; None: a coin flip, the ``cyclic`` layout)."""
    a, b = pair
    pid, seed = key
    (path_a, prompt), (path_b, _) = manifests[a.label].rows[(pid, seed)], manifests[b.label].rows[(pid, seed)]
    ta = images.token(blind, a.label, pid, seed, sets[a.label] / path_a)
    tb = images.token(blind, b.label, pid, seed, sets[b.label] / path_b)
    if left_a is None:
        left_a = bool(blind.rng.integers(2))
    left, right = ((a.label, ta), (b.label, tb)) if left_a else ((b.label, tb), (a.label, ta))
    return _row(f"{a.label} vs {b.label}", "main", pid, prompt, seed, left, right, "")


def _row(comparison: str, kind: str, pid: int, prompt: str, seed: int, left: tuple[str, str],
         right: tuple[str, str], expected: str) -> dict[str, Any]:
    return {"comparison": comparison, "kind": kind, "prompt_id": int(pid), "prompt": str(prompt), "seed": int(seed),
            "left_method": left[0], "right_method": right[0], "left_image": left[1], "right_image": right[1],
            "expected": expected}


def _attention_rows(blind: Blinding, noise: np.random.Generator, images: _Images, manifests: dict[str, _Manifest],
                    sets: dict[str, Path], ds: HumanDesignSpec,
                    pick: Callable[[np.random.Generator], tuple[str, int, int]]) -> list[dict[str, Any]]:
    """``identical`` and ``degraded`` checks on shown images; ``pick(rng)``: the (checkpoint, prompt id,
    seed) of each check's image (:func:`build_pairs`); ``noise``: the degraded copies' noise."""
    from PIL import Image

    rng = blind.rng
    rows = []
    for kind, n in (("identical", ds.identical), ("degraded", ds.degraded)):
        for _ in range(n):
            label, pid, seed = pick(rng)
            rel, prompt = manifests[label].rows[(pid, seed)]
            path = sets[label] / rel
            tok = images.token(blind, label, pid, seed, path)
            if kind == "identical":
                other, expected = images.extra(blind, path), "tie"
            else:
                with Image.open(path) as im:
                    other = images.extra(blind, degrade(np.asarray(im.convert("RGB")), noise))
                expected = ""
            intact_left = bool(rng.integers(2))
            left, right = ((label, tok), (label, other)) if intact_left else ((label, other), (label, tok))
            rows.append(_row(f"check: {kind}", kind, pid, prompt, seed, left, right,
                             expected or ("left" if intact_left else "right")))
    return rows


#: Modification time of every shown image file (2000-01-01 UTC): file times must not tell the order
#: in which the checkpoints' images were written.
FILE_TIME = 946_684_800


def _write_images(images: _Images, folder: Path, secret: bytes, log: Callable[[str], None] = print) -> None:
    """Every shown image as :func:`pcpo_eval.human.shown_png` (uncompressed, no metadata) under its token.

    Blinding: every file of one grid has one length (compressed, PCPO's were the smaller file of 123 of
    143 toy pairs, a length any PNG viewer shows); written in a random order (drawn from the design's secret, apart from the pairs' draws) and all
    stamped with :data:`FILE_TIME`, so neither file order nor file times follow the checkpoints
    (before, every PCPO image was older than its baseline partner). Logs progress every ~10%.
    """
    from PIL import Image

    tokens = list(images.files)
    order = Blinding(secret).stream(1).permutation(len(tokens))
    step = max(1, len(tokens) // 10)
    t0 = time.perf_counter()
    for i, j in enumerate(order, 1):
        tok = tokens[j]
        src = images.files[tok]
        if isinstance(src, Path):
            with Image.open(src) as im:
                pixels = np.asarray(im.convert("RGB"))
        else:
            pixels = src
        path = folder / f"{tok}.png"
        path.write_bytes(shown_png(pixels))  # nothing but pixels, and a length set by the grid alone
        os.utime(path, (FILE_TIME, FILE_TIME))
        if i % step == 0 or i == len(tokens):
            log(f"[human] images: {i} of {len(tokens)} written ({time.perf_counter() - t0:.0f} s)")


def _relative(path: str | None, root: Path) -> str | None:
    """``path`` (absolute, or relative to the working directory) relative to the design folder
    ``root`` when it names an existing file or folder; else unchanged (e.g. a model name)."""
    if not path or not Path(path).exists():
        return path
    return os.path.relpath(Path(path).resolve(), root.resolve())


def study_path(design: dict[str, Any], root: str | Path) -> Path | None:
    """The design's study folder: ``design["study"]`` (relative to the design folder; older designs
    recorded it absolute)."""
    study = design.get("study")
    if not study:
        return None
    p = Path(study)
    return p if p.is_absolute() else (Path(root) / p).resolve()


def _relative_paths(design: dict[str, Any], root: Path) -> dict[str, Any]:
    """``design.json`` with every filesystem path relative to the design folder (moves with it)."""
    d = dict(design)
    d["study"] = _relative(d["study"], root)
    d["checkpoints"] = [{**c, "model": _relative(c["model"], root)} for c in d["checkpoints"]]
    sel = dict(d["selection"])
    for key in ("reference", "below", "above"):
        if isinstance(sel.get(key), dict):
            sel[key] = {k: _relative(v, root) if k in ("model", "path") and isinstance(v, str) else v
                        for k, v in sel[key].items()}
    d["selection"] = sel
    d["paths"] = "relative to this file's folder"
    return d


# ---- the whole design -------------------------------------------------------------------------


def _settings_hash(d: dict[str, Any]) -> str:
    """Hash of the settings that define the pairs (the rendering device does not). ``comparison_seeds:
    shared`` is left out, so a design written before that setting existed (it was shared) hashes as
    the same settings with ``comparison_seeds: shared``."""
    keep = {k: v for k, v in d.items()
            if k != "device" and not (k == "comparison_seeds" and v == LEGACY_COMPARISON_SEEDS)}
    return hashlib.sha256(json.dumps(keep, sort_keys=True, default=str).encode()).hexdigest()[:16]


def make_design(study: str | Path, out: str | Path, ds: HumanDesignSpec,
                log: Callable[[str], None] = print, progress: bool = False) -> dict[str, Any]:
    """Design a human study of the finished ``study`` into folder ``out``; returns ``design.json``.

    1. read and check the study, the design and ``out`` (nothing written yet);
    2. render the compared checkpoints' image sets (``out/sets``, resumable);
    3. build the pairs and write ``images/``, ``pairs.parquet`` and, last, ``design.json``.
    """
    lay = HumanLayout(check_out_path(out))
    view = StudyView.load(study)
    settings = {"study": str(Path(study).resolve()), **ds.to_dict()}
    if lay.design.is_file():
        old = json.loads(lay.design.read_text())
        if old.get("settings_hash") == _settings_hash(settings):
            log(f"[human] {lay.design} already holds this design; nothing to do")
            return old
        legacy = {**settings, "comparison_seeds": LEGACY_COMPARISON_SEEDS}
        if "comparison_seeds" not in old and old.get("settings_hash") == _settings_hash(legacy):
            raise UserError(f"{lay.root} holds a design made before comparison_seeds existed, i.e. with shared "
                            f"seeds ({lay.design}); add `comparison_seeds: shared` to the design file to use it "
                            "as it is, or choose a new --out for a design on distinct seeds")
        raise UserError(f"{lay.root} already holds another human design ({lay.design}); choose a new --out "
                        "(its database may hold answers to that design)")
    sampling = _sampling(view)
    pairs, note = choose_checkpoints(view, ds)
    pairs = _unique_labels(pairs)
    check_per_rater(pairs, ds.per_rater, _n_keys(view, ds), (ds.identical, ds.degraded),
                    ds.comparison_seeds)  # before rendering
    checkpoints = list({c.label: c for p in pairs for c in p}.values())
    _check_seed_room(len(pairs), ds)
    _check_design_folder(lay)  # first: a study or image set given as --out is neither written into nor made private
    ensure_dir(lay.root, "--out")
    try:
        os.chmod(lay.root, 0o700)  # its sets/ are named after the checkpoints: the organisers' only
    except OSError as exc:  # a folder of another owner
        log(f"warning: cannot make {lay.root} private ({exc.strerror}); other users may read its sets/, which "
            "name the checkpoints")
    secret = _design_secret(lay)
    by_comparison = comparison_seeds(len(pairs), ds.seeds, ds.comparison_seeds, secret)
    seeds = checkpoint_seeds(pairs, ds.seeds, ds.comparison_seeds, secret)
    t0 = time.perf_counter()
    n_img = sum(map(len, seeds.values())) * (ds.max_prompts or 0)
    log(f"[human] {len(pairs)} comparison(s) of {len(checkpoints)} checkpoints, {ds.comparison_seeds} secret seeds"
        + (f", {n_img} images to render (resumable)" if n_img else ""))
    sets = render_sets(view, ds, checkpoints, lay.root / "sets", log, progress, seeds)
    table, images = build_pairs(pairs, sets, ds, secret, seeds=by_comparison)
    with atomic_dir(lay.images) as tmp:
        _write_images(images, tmp, secret, log)
    atomic_write_parquet(lay.pairs, table, private=True)
    design = {**settings, "settings_hash": _settings_hash(settings), "created": time.strftime("%Y-%m-%d %H:%M:%S"),
              "selection": note, "checkpoints": [dataclasses.asdict(c) for c in checkpoints],
              "comparisons": [f"{a.label} vs {b.label}" for a, b in pairs],
              "comparison_seed_ranges": {f"{a.label} vs {b.label}": seed_text(ss) for (a, b), ss in
                                         zip(pairs, by_comparison, strict=True)},
              "seed_draw": SEED_DRAW,
              "checkpoint_seed_ranges": {label: seed_text(ss) for label, ss in seeds.items()}, "sampling": sampling,
              "n_pairs": int(len(table)), "n_main": int((table["kind"] == "main").sum()),
              "n_prompts": int(table["prompt_id"].nunique()), "n_images": len(images.files),
              "render_seconds": round(time.perf_counter() - t0, 1),
              "blinding_secret": secret.hex(), "assignment": ASSIGNMENT, "layout": LAYOUT,
              "check_noise": CHECK_NOISE}
    design = _relative_paths(design, lay.root)
    atomic_write_json(lay.design, design, private=True)
    lay.pending_secret.unlink(missing_ok=True)  # design.json holds it now
    return design


def _check_design_folder(lay: HumanLayout) -> None:
    """UserError when ``--out`` holds anything but a design folder's own files (:meth:`HumanLayout.data_paths`,
    the pending secret, rehearsals, SQLite's files), or is a serving bundle (``bundle.json``) or holds a
    database without a design: a design written there put the unblinding (``design.json``, the pairs with
    their methods, the image sets) into the folder meant for the serving machine and replaced the pairs its
    raters' answers refer to."""
    if lay.bundle.is_file() or (lay.database.is_file() and not lay.design.is_file()):
        what = "is a serving bundle" if lay.bundle.is_file() else "holds a rating database but no design"
        raise UserError(f"--out {lay.root} {what}; a design there would put the unblinding beside the raters' "
                        "answers: choose a new folder")
    own = [p.name for p in (*lay.data_paths(), lay.pending_secret, lay.rehearsal)]
    check_own_folder(lay.root, own, "a human design's")


def _check_seed_room(n_comparisons: int, ds: HumanDesignSpec) -> None:
    """UserError when the secret seeds cannot be drawn: ``seeds`` per comparison (distinct) or in all (shared),
    without repeats, from the 9 million values of :func:`comparison_seeds`."""
    from pcpo_eval.generate.plan import MAX_SEED

    need = ds.seeds * (n_comparisons if ds.comparison_seeds == "distinct" else 1)
    room = MAX_SEED - SECRET_SEED_FLOOR + 1
    if need > room:
        raise UserError(f"seeds: {ds.seeds} per comparison x {n_comparisons} comparisons needs {need:,} distinct secret "
                        f"seeds, more than the {room:,} there are; lower seeds")


def _design_secret(lay: HumanLayout) -> bytes:
    """The blinding secret of the design being made in ``lay``: the one an interrupted run left in
    :attr:`HumanLayout.pending_secret` (its sets hold images of that secret's seeds), else a fresh one,
    written there (mode 0600) before anything renders. Sets without that file were rendered on public
    seeds by an earlier version: refused, since the new seeds would not match them."""
    if lay.pending_secret.is_file():
        return parse_secret(lay.pending_secret.read_text().strip(), lay.pending_secret, "the pending secret",
                            f"remove {lay.pending_secret} and {lay.root / 'sets'} to start the design again")
    sets = lay.root / "sets"
    if sets.is_dir() and any(sets.iterdir()):
        raise UserError(f"{sets} holds image sets of an interrupted design without its secret ({lay.pending_secret}), "
                        f"rendered on public seeds; remove {sets} (or choose a new --out) to render the design again")
    secret = new_secret()
    atomic_write_text(lay.pending_secret, secret.hex(), private=True)
    return secret


def read_design(root: str | Path) -> tuple[dict[str, Any], pd.DataFrame]:
    """``design.json`` and ``pairs.parquet`` of a finished design folder (a UserError if incomplete)."""
    lay = HumanLayout(Path(root))
    if lay.bundle.is_file() and not lay.design.is_file():
        raise UserError(f"{lay.root} is a serving bundle ({lay.bundle}): it names no checkpoint; run this on the design "
                        "folder it was made from (analyse a bundle's answers with `pcpo-eval human export BUNDLE` "
                        "and `pcpo-eval human analyze HUMAN --responses FILE`)")
    if not lay.design.is_file() or not lay.pairs.is_file():
        raise UserError(f"{lay.root} holds no finished human design (design.json / pairs.parquet missing); "
                        f"run `pcpo-eval human design STUDY --out {lay.root}` first")
    try:
        design = json.loads(lay.design.read_text())
        pairs = pd.read_parquet(lay.pairs)
    except (OSError, ValueError) as exc:  # pyarrow's ArrowInvalid is a ValueError
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0][:160]
        raise UserError(f"cannot read the design in {lay.root} ({type(exc).__name__}: {first}); restore design.json "
                        "and pairs.parquet from a copy, or re-run `pcpo-eval human design`") from None
    design_comparison_seeds(design, lay.design)
    if pairs.empty:
        raise UserError(f"{lay.pairs} holds no pairs; re-run `pcpo-eval human design`")
    return design, validate_pairs(pairs)
