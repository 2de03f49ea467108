"""What a model folder lacks: the sub-folders and files a diffusers pipeline or a transformers model needs.

The loaders (diffusers ``from_pretrained``, transformers ``from_pretrained``) fail on an incomplete
folder with a long message, or none (a pipeline missing ``tokenizer/`` may even load with the part
set to ``None``). These checks run first and name every missing piece in one line:
``sd1 weights: /models/sd15 is incomplete: missing unet/ (UNet2DConditionModel), vae/config.json``.
"""

from __future__ import annotations

import json
from pathlib import Path

from pcpo_eval.errors import MissingWeightsError

#: Weight-file suffixes a model sub-folder may hold (single file, shards, or a shard index).
WEIGHT_SUFFIXES = (".safetensors", ".bin", ".ckpt", ".pth", ".pt", ".msgpack", ".h5")


def _has_weights(folder: Path) -> bool:
    return any(p.is_file() and (p.suffix in WEIGHT_SUFFIXES or p.name.endswith(".index.json"))
               for p in folder.iterdir())


def _component_missing(folder: Path, name: str, cls: str) -> list[str]:
    """What sub-folder ``name`` (a ``cls`` component of a pipeline) lacks, as relative paths."""
    sub = folder / name
    if not sub.is_dir():
        return [f"{name}/ ({cls})"]
    if "Tokenizer" in cls:
        return [] if any(p.is_file() for p in sub.iterdir()) else [f"{name}/ tokenizer files ({cls})"]
    if "Scheduler" in cls:
        return [] if (sub / "scheduler_config.json").is_file() else [f"{name}/scheduler_config.json"]
    if "Processor" in cls or "FeatureExtractor" in cls:
        return [] if (sub / "preprocessor_config.json").is_file() else [f"{name}/preprocessor_config.json"]
    return transformers_missing(sub, prefix=f"{name}/")


def transformers_missing(folder: str | Path, prefix: str = "") -> list[str]:
    """Missing pieces of a single-model folder: ``config.json`` and a weights file (``prefix`` + name)."""
    folder = Path(folder).expanduser()
    if not folder.is_dir():
        return [f"{prefix or str(folder) + '/'}"]
    out = [] if (folder / "config.json").is_file() else [f"{prefix}config.json"]
    if not _has_weights(folder):
        out.append(f"{prefix}weights (model.safetensors, pytorch_model.bin or diffusion_pytorch_model.safetensors)")
    return out


def pipeline_missing(folder: str | Path) -> list[str]:
    """Missing pieces of a diffusers pipeline folder, from its ``model_index.json`` (empty: complete).

    Every component the index names with a class (``"unet": ["diffusers", "UNet2DConditionModel"]``)
    must be a sub-folder holding its config (and weights, for models); ``[null, null]`` entries
    (e.g. a removed safety checker) are skipped.
    """
    folder = Path(folder).expanduser()
    index = folder / "model_index.json"
    if not index.is_file():
        return ["model_index.json"]
    try:
        entries = json.loads(index.read_text())
    except (OSError, ValueError):
        return ["a readable model_index.json"]
    out: list[str] = []
    for name, value in sorted(entries.items()):
        if name.startswith("_") or not isinstance(value, list) or len(value) != 2 or not all(value):
            continue
        out += _component_missing(folder, name, str(value[1]))
    return out


def describe(what: str, folder: str | Path, missing: list[str]) -> str:
    """One line: ``{what}: {folder} is incomplete: missing a, b; copy ...``."""
    return (f"{what}: {folder} is incomplete: missing {', '.join(missing)}; copy the whole model folder "
            "(every sub-folder of the Hugging Face snapshot) there")


def check_pipeline_folder(what: str, folder: str | Path) -> None:
    """Raise :class:`MissingWeightsError` naming each missing sub-folder/file of a pipeline folder."""
    missing = pipeline_missing(folder)
    if missing:
        raise MissingWeightsError(describe(what, folder, missing))


def check_model_folder(what: str, folder: str | Path) -> None:
    """Raise :class:`MissingWeightsError` naming ``config.json`` / the weights file if a model folder lacks them."""
    missing = transformers_missing(folder)
    if missing:
        raise MissingWeightsError(describe(what, folder, missing))


def resolve_pipeline_dir(spec: str) -> Path | None:
    """The local folder of pipeline ``spec`` (a directory, or a cached HF repo id's snapshot), else None."""
    from pcpo_eval.weights.locate import hf_snapshot_file

    path = Path(spec).expanduser()
    if path.is_dir():
        return path
    hit = hf_snapshot_file(spec, "model_index.json") if "/" in spec and not spec.startswith(("/", ".", "~")) else None
    return hit.parent if hit is not None else None
