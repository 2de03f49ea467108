"""``pcpo-eval export RUN[@EPOCH] --out DIR``: a trained run as a folder the field shares.

The folder is ready for ``hf upload USER/NAME DIR`` (we only write it; nothing is uploaded):

* LoRA runs: ``pytorch_lora_weights.safetensors``, the checkpoint's file as is (peft key names behind
  the ``unet.`` / ``transformer.`` prefix with diffusers' ``lora_adapter_metadata``), which
  ``DiffusionPipeline.load_lora_weights(DIR)`` reads;
* full fine-tunes: the denoiser in diffusers' layout, ``unet/`` or ``transformer/`` (``config.json`` +
  ``diffusion_pytorch_model.safetensors``, ``save_pretrained``), read by
  ``UNet2DConditionModel.from_pretrained(DIR, subfolder="unet")``; the base model is loaded to build it;
* the embedded toy model (``toy``, ``toyflow``): always ``unet/`` with the trained weights (LoRA merged),
  plus ``scheduler/scheduler_config.json``, so the toy export loads with diffusers alone;
* ``README.md``: a model card (Hugging Face front matter; base model, reward, algorithm, the
  conventions the run trained with, seeds, sampling settings, the checkpoint's reward) and, when a
  study's ``results.json`` is found next to the run (``STUDY/runs/RUN``), the study's headline,
  verdict rows and the arm's metric values;
* ``pcpo_eval_export.json``: provenance (source checkpoint, weights sha256, the run's config).

Refusals are one :class:`~pcpo_eval.errors.UserError` line: an unknown run or epoch (the saved
epochs are listed), and an existing non-empty ``--out`` (never overwritten).
"""

from __future__ import annotations

import json
import re
import shutil
from pathlib import Path
from typing import Any

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_dir, atomic_write_text, check_out_path, sha256_file
from pcpo_eval.rundir import checkpoint_dir, config_path, run_dir_of
from pcpo_eval.studydir import results_path
from pcpo_eval.train.checkpoints import (
    FULL_FILE,
    LORA_FILE,
    check_weights,
    list_checkpoints,
    load_run_config,
    read_meta,
    resolve_checkpoint,
)

#: Base models whose export always carries the full denoiser (tiny, no external base to download).
TOY_MODELS = ("toy", "toyflow")
CARD = "README.md"
PROVENANCE = "pcpo_eval_export.json"


def parse_run_ref(ref: str) -> tuple[Path, int | None]:
    """``RUN`` or ``RUN@EPOCH`` -> (path, epoch or None = the latest checkpoint)."""
    head, sep, tail = str(ref).rpartition("@")
    if sep and re.fullmatch(r"\d+", tail):
        return Path(head), int(tail)
    if sep and head:
        raise UserError(f"{ref!r}: the epoch after @ must be a whole number, e.g. {head}@12")
    return Path(ref), None


def find_checkpoint(ref: str) -> Path:
    """The checkpoint folder ``RUN[@EPOCH]`` names (a run folder or a checkpoint folder)."""
    path, epoch = parse_run_ref(ref)
    if not path.exists():
        raise UserError(f"run {path} not found; give a run folder (pcpo-eval train --out) or one of its checkpoints")
    if epoch is None:
        ckpt = resolve_checkpoint(path)
        if ckpt is None:
            raise UserError(f"{path} is not a pcpo-eval run or checkpoint folder (no config.yaml + checkpoints/, "
                            "no checkpoint.json)")
        return ckpt
    if not config_path(path).is_file():
        raise UserError(f"{path} is not a pcpo-eval run folder (no config.yaml); RUN@EPOCH needs the run folder")
    ckpt = checkpoint_dir(path, epoch)
    if ckpt not in list_checkpoints(path):
        saved = [int(p.name.split("_")[1]) for p in list_checkpoints(path)]
        raise UserError(f"run {path} has no checkpoint at epoch {epoch}; saved epochs: "
                        f"{', '.join(map(str, saved)) or 'none'}")
    return ckpt


def _run_config(ckpt: Path) -> dict[str, Any]:
    run = run_dir_of(ckpt)
    return load_run_config(run) if config_path(run).is_file() else {}


def find_study(run_dir: Path) -> tuple[Path, dict[str, Any]] | None:
    """A study's ``results.json`` near the run (the run's folder, or up to two folders above: a
    study keeps runs in ``STUDY/runs/RUN``), parsed; None when absent or unreadable."""
    for folder in (run_dir, *list(run_dir.resolve().parents)[:2]):
        res = results_path(folder)
        if res.is_file():
            try:
                data = json.loads(res.read_text())
            except (OSError, UnicodeDecodeError, json.JSONDecodeError):
                return None
            return (res, data) if isinstance(data, dict) and isinstance(data.get("study"), dict) else None
    return None


def _write_weights(tmp: Path, ckpt: Path, meta: dict[str, Any], model: str) -> list[str]:
    """Copy / build the weights into ``tmp``; returns the files written (relative names)."""
    weights = str(meta.get("weights_file") or "")
    src = ckpt / weights
    if weights not in (LORA_FILE, FULL_FILE) or not src.is_file():
        raise UserError(f"checkpoint {ckpt} lacks its weights file {weights or LORA_FILE}; export another epoch")
    files = []
    if weights == LORA_FILE:
        shutil.copyfile(src, tmp / LORA_FILE)
        files.append(LORA_FILE)
    if weights == FULL_FILE or model.split(":", 1)[0] in TOY_MODELS:
        files += _write_denoiser(tmp, ckpt)
    return files


def _write_denoiser(tmp: Path, ckpt: Path) -> list[str]:
    """The trained denoiser (LoRA merged) in diffusers' ``save_pretrained`` layout, plus the scheduler."""
    import torch

    from pcpo_eval.train.checkpoints import is_lora, load_model_from_spec, lora_prefix

    with torch.no_grad():
        adapter = load_model_from_spec(str(ckpt), device="cpu")
        den = adapter.denoiser
        sub = lora_prefix(den)
        if is_lora(den):
            den.fuse_lora()
            den.unload_lora()
        den.save_pretrained(tmp / sub, safe_serialization=True)
    sched = getattr(adapter, "raw_scheduler_config", None) or getattr(adapter, "scheduler_config", None)
    files = [f"{sub}/{p.name}" for p in sorted((tmp / sub).iterdir())]
    if sched:
        (tmp / "scheduler").mkdir()
        (tmp / "scheduler" / "scheduler_config.json").write_text(json.dumps(dict(sched), indent=2, default=str) + "\n")
        files.append("scheduler/scheduler_config.json")
    return files


def export_run(ref: str, out: str | Path) -> Path:
    """Write the export folder of ``RUN[@EPOCH]`` to ``out`` (see the module doc); returns ``out``."""
    out = check_out_path(out, "--out")
    if out.exists() and any(out.iterdir()):
        raise UserError(f"--out {out} exists and is not empty; nothing was written (choose a new folder)")
    ckpt = find_checkpoint(ref)
    check_weights(ckpt, "export", f"restore {ckpt} from a copy, or export another epoch")  # provenance = these bytes
    meta, cfg = read_meta(ckpt), _run_config(ckpt)
    model = str(meta.get("model") or cfg.get("model") or "toy")
    study = find_study(run_dir_of(ckpt))
    with atomic_dir(out, replace=False) as tmp:
        files = _write_weights(tmp, ckpt, meta, model)
        provenance = {
            "source_checkpoint": str(ckpt.resolve()), "epoch": meta.get("epoch"), "base_model": model,
            "weights_file": meta.get("weights_file"), "weights_sha256": meta.get("weights_sha256"),
            "files": {f: sha256_file(tmp / f) for f in files}, "config": cfg,
            "study_results": str(study[0].resolve()) if study else None,
        }
        (tmp / PROVENANCE).write_text(json.dumps(provenance, indent=2, default=str) + "\n")
        from pcpo_eval.train.model_card import model_card

        atomic_write_text(tmp / CARD, model_card(ckpt, meta, cfg, files, study[1] if study else None))
    return out
