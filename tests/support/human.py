"""Synthetic human-study folders for the rating app tests (a helper module, not a test module).

:func:`make_human_dir` writes what ``pcpo-eval human design`` writes: ``pairs.parquet`` (PAIR_COLUMNS;
main pairs of comparisons such as ``"pcpo@120 vs ddpo@180"`` plus ``identical`` / ``degraded``
attention checks), tiny 16x16 PNGs under opaque hex names, and ``design.json`` (``rng_seed``,
``per_rater``, ``blinding_secret`` unless ``legacy``). :func:`secret_strings` lists what a rater must
never see; :func:`shown_pair` is the design pair id behind a rater's current page (server side).
:func:`write_image_sets` writes the checkpoints' image sets a design is built from.
"""

from __future__ import annotations

import json
import os
import re
import socket
import subprocess
import sys
import time
from collections.abc import Iterable, Mapping, Sequence
from pathlib import Path
from typing import Any

import httpx
import numpy as np
import pandas as pd
from PIL import Image

from pcpo_eval.human import KINDS, PAIR_COLUMNS, HumanLayout, shown_png

COMPARISONS = ("pcpo@120 vs ddpo@180", "pcpo@120 vs ddpo@240")
#: The answer key of a served page (no design pair id is served: ``pcpo_eval.human.app``).
KEY_RE = re.compile(r'name="key" value="([0-9]+\.[0-9a-f]{32})"')
UNDO_RE = re.compile(r'name="undo_key" value="([0-9a-f]{32})"')
PROGRESS_RE = re.compile(r"Pair (\d+) of (\d+)")
REPO = Path(__file__).resolve().parents[2]


def write_image_sets(root: Path, seeds: Mapping[str, Iterable[int]], n_prompts: int, *, rng_seed: int,
                     noise: bool = True, name: str = "p{p}_s{s}.png", prompt: str = "thing {p}",
                     mtime_from: int | None = None) -> dict[str, Path]:
    """One 8x8 PNG set per checkpoint label (folder ``label`` with ``@`` -> ``_``) holding
    ``seeds[label]`` for prompts ``0..n_prompts-1``, with ``generate``'s ``manifest.parquet``; pixels
    random from one generator (``rng_seed``) drawn in label, prompt, seed order, or all black
    (``noise=False``: a rater's dummy). ``mtime_from``: files get rising modification times from it,
    written checkpoint after checkpoint."""
    rng = np.random.default_rng(rng_seed)
    sets, t = {}, mtime_from
    for label, ss in seeds.items():
        folder = root / label.replace("@", "_")
        folder.mkdir(parents=True)
        rows = []
        for p in range(n_prompts):
            for s in ss:
                file = name.format(p=p, s=s)
                pixels = rng.integers(0, 256, (8, 8, 3), dtype=np.uint8) if noise else np.zeros((8, 8, 3), np.uint8)
                Image.fromarray(pixels).save(folder / file)
                if t is not None:
                    t += 1
                    os.utime(folder / file, (t, t))
                rows.append({"prompt_id": p, "prompt": prompt.format(p=p), "seed": s, "path": file})
        pd.DataFrame(rows).to_parquet(folder / "manifest.parquet")
        sets[label] = folder
    return sets


def _png(rng: np.random.Generator) -> bytes:
    """A shown image as a design writes it (:func:`pcpo_eval.human.shown_png`)."""
    return shown_png(rng.integers(0, 256, (16, 16, 3), dtype=np.uint8))


def _hex(rng: np.random.Generator, used: set[str]) -> str:
    while True:
        token = bytes(rng.integers(0, 256, 8, dtype=np.uint8)).hex()
        if token not in used:
            used.add(token)
            return token


def _pair_rows(n_prompts: int, n_seeds: int, n_checks: int, comparisons: Sequence[str],
               prompts: Sequence[str]) -> list[dict]:
    rows = []
    for p in range(n_prompts):
        for s in range(n_seeds):
            comp = comparisons[(p * n_seeds + s) % len(comparisons)]
            a, b = comp.split(" vs ")
            flip = (p + s) % 2 == 1
            rows.append({"comparison": comp, "kind": "main", "prompt_id": p, "prompt": prompts[p], "seed": s,
                         "left_method": b if flip else a, "right_method": a if flip else b, "expected": ""})
    for c in range(n_checks):
        kind = ("identical", "degraded")[c % 2]
        method = comparisons[0].split(" vs ")[0]
        expected = "tie" if kind == "identical" else ("left", "right")[c % 4 // 2]
        rows.append({"comparison": f"{method} vs {method}", "kind": kind, "prompt_id": c % n_prompts,
                     "prompt": prompts[c % n_prompts], "seed": c, "left_method": method, "right_method": method,
                     "expected": expected})
    return rows


def make_human_dir(root: Path, n_prompts: int = 45, n_seeds: int = 10, n_checks: int = 6,
                   per_rater: int | None = None, rng_seed: int = 7, comparisons: Sequence[str] = COMPARISONS,
                   prompts: Sequence[str] | None = None, legacy: bool = False,
                   assignment: str | None = None) -> HumanLayout:
    """Write a synthetic HUMAN folder under ``root``; returns its layout (``legacy``: a design.json
    without ``blinding_secret``, as written before it existed; ``assignment``: design.json's, e.g.
    ``stratified-keyed`` as ``human design`` writes now; None: absent, read as ``stratified``)."""
    layout = HumanLayout(Path(root))
    layout.images.mkdir(parents=True, exist_ok=True)
    prompts = list(prompts or []) + [f"a photo of object number {i} on a table" for i in range(n_prompts)]
    rows = _pair_rows(n_prompts, n_seeds, n_checks, comparisons, prompts)
    rng, used = np.random.default_rng(rng_seed), set()
    for pos, row in zip(rng.permutation(len(rows)), rows, strict=True):
        row.update(pair_id=_hex(rng, used), position=int(pos), left_image=_hex(rng, used),
                   right_image=_hex(rng, used))
        for side in ("left_image", "right_image"):
            layout.image(row[side]).write_bytes(_png(rng))
    df = pd.DataFrame(rows)[list(PAIR_COLUMNS)].sort_values("position").reset_index(drop=True)
    df.to_parquet(layout.pairs, index=False)
    design = {"rng_seed": rng_seed, "per_rater": per_rater, "study": "synthetic", "comparisons": list(comparisons),
              "n_prompts": n_prompts, "n_seeds": n_seeds}
    if not legacy:
        design["blinding_secret"] = bytes(rng.integers(0, 256, 16, dtype=np.uint8)).hex()
    if assignment is not None:
        design["assignment"] = assignment
    layout.design.write_text(json.dumps(design))
    return layout


def shown_pair(client: Any, token: str) -> str | None:
    """The design pair id of the page rater ``token`` is shown now (read server side, from the
    app of a ``TestClient``; no page carries it)."""
    from pcpo_eval.human import db
    from pcpo_eval.human.app import _current

    state = client.app.state.human
    rater = db.rater_by_token(state.url, token)
    return _current(state, rater.id)[0]


def organiser_order(layout: HumanLayout, rater_id: int) -> list[str]:
    """The design pair ids of rater ``rater_id`` in the order the app shows them (organiser side:
    the design's order secret and kinds, as :func:`pcpo_eval.human.db.assignment` uses them)."""
    from pcpo_eval.human import db
    from pcpo_eval.human.settings import read_settings

    settings = read_settings(layout)
    pairs = pd.read_parquet(layout.pairs).sort_values(["position", "pair_id"])
    kinds = dict(zip(pairs["pair_id"], pairs["kind"], strict=True))
    return db.assignment(list(pairs["pair_id"]), settings.order_seed, rater_id, settings.per_rater, kinds)


def secret_strings(layout: HumanLayout) -> list[str]:
    """Everything a rater must never see: method labels and names, comparisons, kinds."""
    df = pd.read_parquet(layout.pairs)
    labels = set(df["left_method"]) | set(df["right_method"])
    names = {label.split("@")[0] for label in labels}
    return sorted(labels | names | set(df["comparison"]) | set(KINDS) | {"@120", "@180", "@240"})


def leaks(text: str, secrets_: Sequence[str]) -> list[str]:
    """The secret strings found in ``text`` (case-insensitive; kinds as whole words)."""
    low = text.lower()
    found = []
    for s in secrets_:
        pattern = rf"\b{re.escape(s.lower())}\b" if s in KINDS else re.escape(s.lower())
        if re.search(pattern, low):
            found.append(s)
    return found


# ---- the real server in a subprocess ------------------------------------------------------------


def free_port() -> int:
    with socket.socket() as s:
        s.bind(("127.0.0.1", 0))
        return int(s.getsockname()[1])


def start_server(root: Path, port: int, log: Path, timeout: float = 30.0) -> subprocess.Popen:
    """``serve(root, port=port)`` in a new process; returns once ``GET /`` answers 200."""
    code = f"from pcpo_eval.human.app import serve; serve({str(root)!r}, port={port})"
    with open(log, "ab") as fh:
        proc = subprocess.Popen([sys.executable, "-c", code], stdout=fh, stderr=subprocess.STDOUT, cwd=REPO,
                                start_new_session=True)
    deadline = time.monotonic() + timeout
    while time.monotonic() < deadline:
        if proc.poll() is not None:
            raise RuntimeError(f"server exited with {proc.returncode}: {log.read_text()[-2000:]}")
        try:
            if httpx.get(f"http://127.0.0.1:{port}/", timeout=1.0).status_code == 200:
                return proc
        except httpx.TransportError:
            time.sleep(0.05)
    proc.kill()
    raise RuntimeError(f"server did not start in {timeout} s: {log.read_text()[-2000:]}")


def stop_server(proc: subprocess.Popen) -> None:
    """Terminate the server process started by :func:`start_server` (kill after 5 s)."""
    if proc.poll() is None:
        proc.terminate()
        try:
            proc.wait(5)
        except subprocess.TimeoutExpired:
            proc.kill()
            proc.wait(5)
