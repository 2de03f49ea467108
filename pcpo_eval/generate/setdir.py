"""The set directory: settings (what determines pixels), per-image records, resume checks, manifest.
"""

import contextlib
import json
from collections.abc import Sequence
from dataclasses import asdict, dataclass, field
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.generate.plan import WorkItem
from pcpo_eval.generate.png import read_png_text
from pcpo_eval.imageset import MANIFEST_COLUMNS

#: Seed derivation recorded with every set (see :mod:`pcpo_eval.seeding`).
SEED_DERIVATION = "sha256('pcpo-eval/sample/v1/{prompt_id}/{seed}')[:8] little-endian & (2**63-1)"


# ---------------------------------------------------------------------------------------------
# Settings, records, summary
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
    seed_derivation: str = SEED_DERIVATION

    def compat_key(self) -> dict[str, Any]:
        d = asdict(self)
        d.pop("model")
        return d


@dataclass
class GenerateSummary:
    """What :func:`generate_set` did (returned on every rank; counts are for this rank's share)."""

    out_dir: Path
    n_images: int
    n_rendered: int
    n_skipped: int
    seconds: float
    rank: int
    world_size: int
    settings: GenerationSettings
    n_prompts: int
    n_seeds: int
    n_prompts_dropped: int = 0
    manifest_path: Path | None = None
    images_per_second: float = field(default=0.0)


def _record(item: WorkItem, image_sha: str, pix_sha: str, h: int, w: int) -> dict[str, Any]:
    return {
        "prompt_id": item.prompt_id, "prompt": item.prompt, "seed": item.seed, "path": item.rel_path,
        "image_sha256": image_sha, "pixel_sha256": pix_sha, "height": h, "width": w,
    }  # fmt: skip


def _png_text(item: WorkItem, settings: GenerationSettings) -> dict[str, str]:
    meta = {"prompt_id": item.prompt_id, "seed": item.seed, "prompt": item.prompt, **asdict(settings)}
    return {"prompt": item.prompt, "pcpo_eval": json.dumps(meta, sort_keys=True)}


# ---------------------------------------------------------------------------------------------
# Set directory state
# ---------------------------------------------------------------------------------------------


def _check_out_dir(out: Path, settings: GenerationSettings) -> None:
    """Refuse a directory that is not ours or holds images of other settings (nothing written)."""
    if not out.exists():
        return
    if not out.is_dir():
        raise UserError(f"--out {str(out)!r} is a file; choose a directory")
    set_json = out / "set.json"
    if not set_json.exists():
        if any(p for p in out.iterdir() if p.name not in (".progress", "images")) or any(
            (out / "images").glob("*/*.png")
        ):
            raise UserError(f"--out {str(out)!r} exists and is not an image set; choose a new or empty directory")
        return
    try:
        old = json.loads(set_json.read_text())["settings"]
    except (ValueError, KeyError) as exc:
        raise UserError(f"{set_json} is unreadable ({exc}); choose a new --out directory") from exc
    new = settings.compat_key()
    diff = [k for k in new if old.get(k) != new[k]]
    if diff:
        k = diff[0]
        raise UserError(
            f"{str(out)!r} holds images rendered with {k}={old.get(k)!r}, not {new[k]!r}; "
            "use a new --out directory (or the original settings to resume)"
        )


def _remove_stale_tmp(out: Path) -> int:
    """Delete temp files left by a killed atomic write (never counted as images)."""
    n = 0
    for p in list((out / "images").glob("*/.*.tmp")) + list(out.glob(".*.tmp")) + list(out.glob(".progress/.*.tmp")):
        with contextlib.suppress(FileNotFoundError):
            p.unlink()
            n += 1
    return n


def _load_records(out: Path) -> dict[tuple[int, int], dict[str, Any]]:
    """Known image records from a previous manifest and any per-process progress files."""
    import pandas as pd

    recs: dict[tuple[int, int], dict[str, Any]] = {}
    files = ([out / "manifest.parquet"] if (out / "manifest.parquet").exists() else []) + sorted(
        (out / ".progress").glob("*.parquet")
    )
    for f in files:
        try:
            df = pd.read_parquet(f)
        except Exception:  # noqa: BLE001 - a damaged progress file only costs re-hashing
            continue
        for r in df.to_dict("records"):
            recs[(int(r["prompt_id"]), int(r["seed"]))] = {k: r[k] for k in r if k in MANIFEST_COLUMNS}
    return recs


def _check_existing_prompts(
    out: Path, items: Sequence[WorkItem], records: dict[tuple[int, int], dict[str, Any]]
) -> None:
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
