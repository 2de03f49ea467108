"""The set directory on disk: settings, per-image records, resume checks, set.json and the manifest.

Owns everything :func:`~pcpo_eval.generate.runner.generate_set` reads or writes in ``SET/`` besides
the PNG bytes themselves (:mod:`.png`): :class:`GenerationSettings` (what determines pixels),
:func:`image_record` / :func:`png_text` (one image's manifest row and PNG metadata), the checks run
before anything is written (:func:`check_out_dir`, :func:`check_existing_prompts`), resume state
(:func:`load_records`, :func:`is_done`, :func:`remove_stale_tmp`, :func:`flush_records`), and the
two set.json writes (:func:`begin_set` while rendering, :func:`write_manifest` at the end). The
layout is the image-set contract of :mod:`pcpo_eval.imageset` (``MANIFEST_COLUMNS``).
"""

import contextlib
import json
import os
import sys
from collections.abc import Sequence
from dataclasses import asdict, dataclass
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.generate.plan import WorkItem
from pcpo_eval.generate.png import pixel_sha256, png_is_readable, read_png_pixels, read_png_text
from pcpo_eval.imageset import (
    IMAGE_GLOB,
    IMAGES_DIR,
    LOCK_FILE,
    MANIFEST_COLUMNS,
    MANIFEST_FILE,
    PROGRESS_DIR,
    SET_FILE,
)
from pcpo_eval.io import atomic_write_json, atomic_write_parquet, sha256_file

#: Seed derivation recorded with every set (see :mod:`pcpo_eval.seeding`).
SEED_DERIVATION = "sha256('pcpo-eval/sample/v1/{prompt_id}/{seed}')[:8] little-endian & (2**63-1)"

#: Settings absent from set.json files written before they existed (those sets were fp32, fixed shape).
LEGACY_SETTINGS = {"precision": "fp32", "batch_invariance": "bitwise", "attention": "auto"}

#: Known image records by ``(prompt_id, seed)``: manifest rows (``MANIFEST_COLUMNS`` subset).
Records = dict[tuple[int, int], dict[str, Any]]


# ---------------------------------------------------------------------------------------------
# Settings and per-image metadata
# ---------------------------------------------------------------------------------------------


@dataclass(frozen=True)
class GenerationSettings:
    """Everything that determines an image's pixels besides (prompt, prompt_id, seed).

    A set directory holds images of exactly one settings value; resuming with different settings
    is refused. ``model`` is the spec as given (informational); compatibility uses the rest.
    """

    model: str
    model_hash: str
    model_name: str
    prediction: str
    sampler: str
    steps: int
    cfg: float
    eta: float
    schedule: str
    micro_batch: int
    device: str
    precision: str = "fp32"
    batch_invariance: str = "bitwise"
    attention: str = "auto"  #: the SDPA backend (pcpo_eval.precision.ATTENTION_BACKENDS)
    seed_derivation: str = SEED_DERIVATION
    #: what an image decodes: ``sample`` (the last sampled latent) or ``x0_prediction`` (DanceGRPO's flow SDE:
    #: the last step's prediction of x_0, :data:`pcpo_eval.samplers.flow.FINAL_LATENT`); sets written before the
    #: setting decoded the sample, so a DanceGRPO-SDE set of theirs is not resumed with the other convention
    final_latent: str = "sample"
    #: intra-op threads per process of a CPU render (:data:`pcpo_eval.precision.CPU_RENDER_THREADS`; None on a
    #: GPU): the CPU kernels' sums depend on it, so a set rendered at another count is not resumed
    cpu_threads: int | None = None

    def compat_key(self) -> dict[str, Any]:
        """The settings a resumed set must share: all but ``model`` (and ``micro_batch`` under ``tolerance``).

        ``batch_invariance`` is ``bitwise`` when every model call runs on exactly ``micro_batch`` rows
        (images identical for any batch size or process count on the same device type and software),
        ``tolerance`` when ``micro_batch`` was chosen from free GPU memory: images then agree across
        micro-batches within the tolerance measured in docs/gpu.md, so it is not part of the identity, or
        ``none`` (``micro_batch`` 0, off): each image's last bits depend on the batch it was rendered in.
        """
        d = asdict(self)
        d.pop("model")
        if self.batch_invariance == "tolerance":
            d.pop("micro_batch")
        return d


def image_record(item: WorkItem, image_sha: str, pix_sha: str, h: int, w: int) -> dict[str, Any]:
    """One image's record: the per-image manifest columns (the settings columns come at the end)."""
    return {
        "prompt_id": item.prompt_id, "prompt": item.prompt, "seed": item.seed, "path": item.rel_path,
        "image_sha256": image_sha, "pixel_sha256": pix_sha, "height": h, "width": w,
    }  # fmt: skip


def png_text(item: WorkItem, settings: GenerationSettings) -> dict[str, str]:
    """The PNG text chunks: ``prompt``, and ``pcpo_eval`` = JSON of the item and every setting."""
    meta = {"prompt_id": item.prompt_id, "seed": item.seed, "prompt": item.prompt, **asdict(settings)}
    return {"prompt": item.prompt, "pcpo_eval": json.dumps(meta, sort_keys=True)}


# ---------------------------------------------------------------------------------------------
# Checks before anything is written
# ---------------------------------------------------------------------------------------------


def check_out_dir(out: Path, settings: GenerationSettings) -> None:
    """Refuse a directory that is not ours or holds images of other settings (nothing written)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; choose a directory")
    set_json = out / SET_FILE
    if not set_json.exists():
        if any(p for p in out.iterdir() if p.name not in (PROGRESS_DIR, IMAGES_DIR, LOCK_FILE)) or any(
            (out / IMAGES_DIR).glob(IMAGE_GLOB)
        ):
            raise UserError(f"--out {str(out)!r} exists and is not an image set; choose a new or empty directory")
        return
    try:
        old = json.loads(set_json.read_text())["settings"]
        if not isinstance(old, dict):  # valid JSON of another shape (a list, a number): not a set record
            raise TypeError(f"its settings are a {type(old).__name__}, not a mapping")
    except (ValueError, KeyError, TypeError) as exc:
        raise UserError(f"{set_json} is unreadable ({exc}), so nothing records the settings of the images there; "
                        "choose a new --out directory, or delete this folder to re-render it in place") from exc
    if holds_no_image(out):  # an interrupted first run left set.json alone: no image to mix with
        return
    old = {**LEGACY_SETTINGS, **old}
    new = settings.compat_key()
    diff = [k for k in new if old.get(k) != new[k]]
    diff.sort(key=lambda k: k != "precision")  # another precision also changes model_hash: name the cause
    if diff:
        k = diff[0]
        raise UserError(
            f"{str(out)!r} holds images rendered with {k}={old.get(k)!r}, not {new[k]!r}; "
            "use a new --out directory (or the original settings to resume)"
        )


def check_existing_prompts(out: Path, items: Sequence[WorkItem], records: Records) -> None:
    """An existing image must have been rendered for the same prompt text as requested now."""
    for it in items:
        rec = records.get((it.prompt_id, it.seed))
        path = out / it.rel_path
        if rec is not None:
            old = rec["prompt"]
        elif path.exists():
            try:
                old = read_png_text(path).get("prompt")
            except (OSError, SyntaxError, ValueError):
                continue  # unreadable: its owner re-renders it
        else:
            continue
        if old is not None and old != it.prompt:
            raise UserError(
                f"{it.rel_path} in {str(out)!r} was rendered for prompt {old!r}, but prompt_id {it.prompt_id} is "
                f"now {it.prompt!r}; use a new --out directory"
            )


# ---------------------------------------------------------------------------------------------
# Resume state
# ---------------------------------------------------------------------------------------------


def load_records(out: Path) -> Records:
    """Known image records from a previous manifest and any per-process progress files."""
    import pandas as pd

    recs: Records = {}
    files = ([out / MANIFEST_FILE] if (out / MANIFEST_FILE).exists() else []) + sorted(
        (out / PROGRESS_DIR).glob("*.parquet")
    )
    for f in files:
        try:
            df = pd.read_parquet(f)
        except Exception:  # noqa: BLE001 - a damaged progress file only costs re-hashing
            continue
        for r in df.to_dict("records"):
            recs[(int(r["prompt_id"]), int(r["seed"]))] = {k: r[k] for k in r if k in MANIFEST_COLUMNS}
    return recs


def remove_stale_tmp(out: Path) -> int:
    """Delete temp files left by a killed write (never counted as images; not ones a live process holds)."""
    from pcpo_eval.io import remove_stale_temps

    return len(remove_stale_temps(out))


def is_done(out: Path, item: WorkItem, records: Records) -> bool:
    """An image counts as done if it exists and matches its record's sha256, or has no record and decodes.

    A file whose bytes differ from its recorded ``image_sha256`` (modified or corrupted after it was
    written), or that does not decode (only possible after a power loss, since files are renamed
    into place complete), is removed so it is rendered again.
    """
    path = out / item.rel_path
    if not path.exists():
        return False
    rec = records.get((item.prompt_id, item.seed))
    if rec is not None and rec.get("path") == item.rel_path:
        if sha256_file(path) == rec.get("image_sha256"):
            return True
        print(f"warning: {item.rel_path} does not match its recorded image_sha256; rendering it again",
              file=sys.stderr)
        with contextlib.suppress(FileNotFoundError):
            path.unlink()
        return False
    if png_is_readable(path):
        return True
    with contextlib.suppress(FileNotFoundError):
        path.unlink()
    return False


def flush_records(path: Path, records: list[dict[str, Any]]) -> None:
    """Make the images written so far durable (``os.sync``), then atomically rewrite their records."""
    if not records:
        return
    import pandas as pd

    os.sync()
    atomic_write_parquet(path, pd.DataFrame(records))


# ---------------------------------------------------------------------------------------------
# set.json and the manifest (rank 0)
# ---------------------------------------------------------------------------------------------


def lock_set(out: Path) -> Any:
    """Rank 0, after the checks: create ``out`` and hold its :data:`~pcpo_eval.imageset.LOCK_FILE` for the render
    (the open file; closing it releases). A second render of the same folder is one UserError line naming the
    first one's pid: before, a run with other settings, started before the first PNG existed, rewrote set.json
    and both finished "complete" (set.json said steps 10; its 40 PNGs were rendered at steps 60)."""
    from pcpo_eval.io import lock_or_refuse

    out.mkdir(parents=True, exist_ok=True)
    return lock_or_refuse(out / LOCK_FILE, f"image set {out} is being rendered by another pcpo-eval generate "
                          "(pid {pid}); wait for it to finish (or stop it), or choose another --out")


def begin_set(out: Path, settings: GenerationSettings, run_info: dict[str, Any]) -> None:
    """Rank 0, before rendering: create ``out``, drop stale temp files, write a ``rendering`` set.json.

    An existing set.json (a resumed set; :func:`check_out_dir` made sure its settings match) keeps its
    settings and run record but is marked ``rendering`` too: until :func:`write_manifest` marks it
    ``complete`` again, its manifest is the previous run's, not this request's, and ``metrics`` refuses it
    (:func:`pcpo_eval.imageset.check_finished`) instead of measuring the old images as if they were the set.
    """
    out.mkdir(parents=True, exist_ok=True)
    remove_stale_tmp(out)
    path = out / SET_FILE
    if not path.exists() or holds_no_image(out):  # new, or a first run stopped before its first image
        for f in (out / PROGRESS_DIR).glob("*.parquet"):
            f.unlink()
        atomic_write_json(path, {"status": "rendering", "settings": asdict(settings), "run": run_info})
        return
    record = json.loads(path.read_text())  # check_out_dir read it: a mapping with settings
    if record.get("status") != "rendering":
        atomic_write_json(path, {**record, "status": "rendering"})


def holds_no_image(out: Path) -> bool:
    """Whether set folder ``out`` has neither a manifest nor a PNG: a ``set.json`` there ties it to no image.
    A multi-process first run stopped before its first image leaves one (only a one-process run removes it,
    :func:`discard_empty_set`: another rank may still be writing); its settings bound the folder, and a re-run
    with others was refused as "holds images rendered with steps=50" with no image in it."""
    images = out / IMAGES_DIR
    return not (out / MANIFEST_FILE).exists() and not (images.is_dir() and any(images.glob(IMAGE_GLOB)))


def discard_empty_set(out: Path, remove_dir: bool) -> bool:
    """After a failed first run: if no image was written, remove what :func:`begin_set` created.

    Leaves no ``set.json`` that describes a set without images (it would tie the folder to these
    settings); a partly rendered set keeps its ``rendering`` set.json, which is what a re-run resumes.
    ``remove_dir``: the run created ``out`` (removed too when empty). Returns whether it discarded.
    """
    images = out / IMAGES_DIR
    if not holds_no_image(out):
        return False
    for f in [out / SET_FILE, out / LOCK_FILE, *(out / PROGRESS_DIR).glob("*.parquet")]:
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    for d in [*(images.glob("*") if images.is_dir() else []), images, out / PROGRESS_DIR, *([out] if remove_dir else [])]:
        with contextlib.suppress(OSError):
            d.rmdir()  # only empty folders
    return True


def write_manifest(out: Path, items: Sequence[WorkItem], settings: GenerationSettings, run_info: dict) -> None:
    """Rank 0, after all shares are rendered: manifest.parquet and set.json, atomically."""
    import pandas as pd

    records = load_records(out)
    rows = []
    for it in sorted(items, key=lambda i: (i.prompt_id, i.seed)):
        path = out / it.rel_path
        rec = records.get((it.prompt_id, it.seed))
        if rec is None or rec.get("path") != it.rel_path:
            if not path.exists():
                raise RuntimeError(f"{path} missing after rendering (a worker failed?); re-run to complete the set")
            pix = read_png_pixels(path)
            rec = image_record(it, sha256_file(path), pixel_sha256(pix), pix.shape[1], pix.shape[2])
        elif not path.exists():
            raise RuntimeError(f"{path} missing after rendering (a worker failed?); re-run to complete the set")
        rows.append(rec)
    df = pd.DataFrame(rows)
    s = asdict(settings)
    for col in ("model", "model_hash", "sampler", "steps", "cfg", "eta", "schedule", "micro_batch"):
        df[col] = s[col]
    df = df[MANIFEST_COLUMNS].astype({"prompt_id": "int64", "seed": "int64", "height": "int64", "width": "int64"})
    atomic_write_parquet(out / MANIFEST_FILE, df)
    atomic_write_json(
        out / SET_FILE,
        {"status": "complete", "settings": s, "run": run_info, "manifest": MANIFEST_FILE},
    )
    for f in (out / PROGRESS_DIR).glob("*.parquet"):
        with contextlib.suppress(FileNotFoundError):
            f.unlink()
    with contextlib.suppress(OSError):
        (out / PROGRESS_DIR).rmdir()
