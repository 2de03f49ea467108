"""The serving bundle: what the rating app needs, and nothing that unblinds.

A design folder (``pcpo-eval human design``) holds the unblinding: ``pairs.parquet`` names each
side's checkpoint, ``design.json`` holds the blinding secret that regenerates every draw, and
``sets/`` is named after the checkpoints. The machine that serves raters needs none of it, and
whoever runs that machine (a colleague, a cloud host) should not hold it.
``pcpo-eval human bundle HUMAN --out SERVE`` writes the folder to deploy instead::

    SERVE/bundle.json     the public rng_seed, per_rater, comparison_seeds, counts, and the app's
                          key and order secrets (one-way HMACs of the blinding secret:
                          :mod:`pcpo_eval.human.settings`)
    SERVE/pairs.parquet   one row per pair, the served columns only (:data:`SERVED_COLUMNS`)
    SERVE/images/         the shown images: byte copies under the same opaque names and file time

The app serves a bundle exactly as it serves the design folder (the same image URLs, answer keys
and raters' blocks and orders); ``human raters`` and ``human export`` run on it; ``human analyze``
runs on the design folder with the bundle's export (``--responses``), whose pair ids it checks.

Steps of :func:`make_bundle`:

1. read and check the design and ``out`` (nothing written yet); a design whose raters' order is
   keyed by the blinding secret itself (made before bundles) is refused;
2. write the served columns, the shown images and ``bundle.json`` into a temporary folder next to ``out``;
3. rename it to ``out`` (a crash leaves no half-written bundle).
"""

from __future__ import annotations

import json
import shutil
import time
from collections.abc import Callable
from pathlib import Path
from typing import Any

import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.human import HumanLayout, design_comparison_seeds
from pcpo_eval.human.db import DB_PAIR_COLUMNS
from pcpo_eval.human.design import read_design
from pcpo_eval.human.settings import (
    ASSIGNMENT_KEYED,
    derive_key_secret,
    derive_order_secret,
    design_settings,
    parse_secret,
)
from pcpo_eval.io import atomic_dir, atomic_write_json, check_out_path

#: The pairs columns a bundle keeps: what the database holds (DB_PAIR_COLUMNS) and ``kind``, which
#: the app needs to stratify raters' blocks (kept in memory, never served).
SERVED_COLUMNS = (*DB_PAIR_COLUMNS, "kind")
#: bundle.json ``format`` (a later layout gets a new number).
FORMAT = 1


def bundle_record(design: dict[str, Any], pairs: pd.DataFrame, where: Path) -> dict[str, Any]:
    """The ``bundle.json`` mapping of a design: its public serving settings and the derived secrets.

    A design without a blinding secret, or whose raters' order is keyed by the secret itself
    (``assignment: stratified``: designs made before bundles), is a UserError: its app needs the
    secret, which regenerates every blinding draw."""
    secret = parse_secret(design.get("blinding_secret"), where, "blinding_secret", "rerun `pcpo-eval human design`")
    if secret is None or design.get("assignment") != ASSIGNMENT_KEYED:
        raise UserError(f"{where}: this design was made before serving bundles (its raters' order needs the blinding "
                        "secret itself); serve its folder as it is and keep it private, or make a new design "
                        "(`pcpo-eval human design`) to serve from a bundle")
    design_settings(design, where)  # every serving setting checked as the app checks it
    _refuse_repeated_images(pairs, where)
    return {"format": FORMAT, "rng_seed": design["rng_seed"], "per_rater": design.get("per_rater"),
            "comparison_seeds": design_comparison_seeds(design, where), "n_pairs": int(len(pairs)),
            "n_images": int(len(set(pairs["left_image"]) | set(pairs["right_image"]))),
            "key_secret": derive_key_secret(secret).hex(), "order_secret": derive_order_secret(secret).hex()}


def _refuse_repeated_images(pairs: pd.DataFrame, where: Path) -> None:
    """UserError when one image is shown in two main pairs (``comparison_seeds: shared``: a shared
    checkpoint's one image of a prompt and seed is in both of its comparisons).

    Blinding: the bundle's ``pairs.parquet`` names each pair's two images, so the side whose image
    name (or bytes) recurs in another main pair is the shared checkpoint's, in every such pair: whoever
    holds the bundle (the serving machine, its operator) would read the side of every main pair. With
    ``distinct`` seeds no image is in two main pairs; an attention check repeats one side of one main
    pair, chosen by a coin flip, so it names nothing."""
    main = pairs[pairs["kind"] == "main"]
    counts = pd.concat([main["left_image"], main["right_image"]]).value_counts()
    repeated = int((counts > 1).sum())
    if repeated:
        n_pairs = int((main["left_image"].isin(counts.index[counts > 1])
                       | main["right_image"].isin(counts.index[counts > 1])).sum())
        raise UserError(f"{where}: {repeated} images are each shown in two main pairs (comparison_seeds: shared), so a "
                        f"bundle would name the shared checkpoint's side of {n_pairs} of {len(main)} main pairs to "
                        "whoever holds it (the image that recurs); serve this design folder itself from a machine "
                        "only the organisers hold, or make a new design with comparison_seeds: distinct to serve "
                        "from a bundle")


def served_pairs(root: str | Path) -> pd.DataFrame:
    """The pairs of a design folder or a serving bundle (at least :data:`SERVED_COLUMNS`); a
    UserError when the folder is neither or its pairs are unreadable."""
    lay = HumanLayout(Path(root))
    if lay.design.is_file() or not lay.bundle.is_file():
        return read_design(root)[1]
    try:
        pairs = pd.read_parquet(lay.pairs)
    except (OSError, ValueError) as exc:
        raise UserError(f"{lay.pairs} is missing or unreadable ({type(exc).__name__}); rebuild the bundle with "
                        "`pcpo-eval human bundle HUMAN --out SERVE`") from None
    missing = [c for c in SERVED_COLUMNS if c not in pairs.columns]
    if missing or pairs.empty:
        raise UserError(f"{lay.pairs} lacks {missing or 'rows'}; rebuild the bundle with `pcpo-eval human bundle`")
    return pairs


def make_bundle(design_root: str | Path, out: str | Path, log: Callable[[str], None] = print) -> dict[str, Any]:
    """Write the serving bundle of the design folder ``design_root`` to ``out``; returns bundle.json's mapping.

    ``out`` must not exist or be empty; one that already holds this design's bundle is left as it is."""
    src, dst = HumanLayout(Path(design_root)), HumanLayout(check_out_path(out))
    design, pairs = read_design(src.root)
    record = bundle_record(design, pairs, src.design)
    if dst.bundle.is_file() and _same_bundle(dst, record):
        log(f"[human] {dst.root} already holds this design's bundle; nothing to do")
        return record
    if dst.root.exists() and any(dst.root.iterdir()):
        raise UserError(f"--out {dst.root} is not empty; choose a new folder for the bundle")
    tokens = sorted(set(pairs["left_image"]) | set(pairs["right_image"]))  # random hex: no order of checkpoints
    absent = [t for t in tokens if not src.image(t).is_file()]
    if absent:
        raise UserError(f"{src.images} lacks {len(absent)} shown image(s) (e.g. {absent[0]}.png); rerun "
                        "`pcpo-eval human design` on a new folder")
    t0 = time.perf_counter()
    with atomic_dir(dst.root, replace=False) as tmp:
        lay = HumanLayout(tmp)
        lay.images.mkdir()
        for token in tokens:
            shutil.copy2(src.image(token), lay.image(token))  # bytes and the design's one file time
        pairs[list(SERVED_COLUMNS)].sort_values(["position", "pair_id"]).reset_index(drop=True).to_parquet(
            lay.pairs, index=False)
        atomic_write_json(lay.bundle, {**record, "created": time.strftime("%Y-%m-%d %H:%M:%S")}, private=True)
    log(f"[human] bundle of {record['n_pairs']} pairs and {len(tokens)} images in {dst.root} "
        f"({time.perf_counter() - t0:.1f} s); serve it with `pcpo-eval human serve {dst.root}`")
    return record


def _same_bundle(dst: HumanLayout, record: dict[str, Any]) -> bool:
    try:
        old = json.loads(dst.bundle.read_text())
    except (OSError, ValueError):
        return False
    return isinstance(old, dict) and {k: old.get(k) for k in record} == record
