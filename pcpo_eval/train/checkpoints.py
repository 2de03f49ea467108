"""Checkpoints: LoRA in diffusers' format, full weights as safetensors, resumable training state.

A checkpoint is a directory ``RUN/checkpoints/epoch_0005/`` holding

* ``pytorch_lora_weights.safetensors`` (LoRA; the file diffusers' ``load_lora_weights`` reads,
  keys ``unet.<module>.lora_A/B.weight``) or ``denoiser.safetensors`` (full fine-tune);
* ``checkpoint.json``: epoch, reward, model spec, objective, file hashes;
* ``training_state.pt``: optimizer state, the per-prompt stat tracker, peft state (resume only).
  Only the newest checkpoint of a run keeps it (:func:`apply_retention`): resume reads the newest,
  and the older ones stay loadable for generation and selection with weights + metadata alone.

Directories are written under a temporary name and renamed into place, so a crash never leaves
a half-written checkpoint that looks complete. ``keep_checkpoints: N`` (train config) deletes the
checkpoints older than the newest N after each save (:func:`apply_retention`).
"""

from __future__ import annotations

import contextlib
import io
import json
from collections.abc import Iterator
from pathlib import Path
from typing import IO, Any

import torch

from pcpo_eval.errors import UserError
from pcpo_eval.io import atomic_dir, lock_or_refuse, read_yaml_mapping, safetensors_bytes, sha256_file
from pcpo_eval.rundir import (
    META_FILE,
    RUN_LOCK,
    STATE_FILE,
    checkpoint_dir,  # noqa: F401 - re-exported: ck.checkpoint_dir(RUN, EPOCH)
    config_path,
    epoch_dirs,
    is_run_dir,
    run_dir_of,
)

LORA_FILE = "pytorch_lora_weights.safetensors"
FULL_FILE = "denoiser.safetensors"


def list_checkpoints(run_dir: str | Path) -> list[Path]:
    """Complete checkpoints of a run, by epoch (a directory counts once its checkpoint.json exists)."""
    return [p for _, p in epoch_dirs(run_dir, complete=True)]


def latest_checkpoint(run_dir: str | Path) -> Path | None:
    cks = list_checkpoints(run_dir)
    return cks[-1] if cks else None


def is_lora(denoiser: torch.nn.Module) -> bool:
    return bool(getattr(denoiser, "peft_config", None))


def lora_prefix(denoiser: torch.nn.Module) -> str:
    """diffusers' LoRA key prefix: ``unet`` for UNets, ``transformer`` for DiT/MMDiT models."""
    return "unet" if "UNet" in type(denoiser).__name__ else "transformer"


def _lora_metadata(denoiser: torch.nn.Module, prefix: str) -> dict[str, str]:
    """safetensors metadata diffusers' ``load_lora_weights`` reads for the LoRA config (keeps lora_alpha != r)."""
    from diffusers.loaders.lora_base import LORA_ADAPTER_METADATA_KEY

    cfg = denoiser.peft_config["default"].to_dict()
    cfg = {k: sorted(v) if isinstance(v, set) else v for k, v in cfg.items()}
    return {"format": "pt",
            LORA_ADAPTER_METADATA_KEY: json.dumps({f"{prefix}.{k}": v for k, v in cfg.items()}, default=str,
                                                  sort_keys=True)}


def save_checkpoint(
    ckpt: Path, denoiser: torch.nn.Module, meta: dict[str, Any], training_state: dict[str, Any] | None = None
) -> Path:
    """Write a checkpoint directory atomically (:func:`pcpo_eval.io.atomic_dir`); returns its path.

    The weights file is :func:`pcpo_eval.io.safetensors_bytes` (sorted header), so equal tensors give
    an equal ``weights_sha256`` in any process; the folder and its files honour the umask.
    """
    ckpt = Path(ckpt)
    with atomic_dir(ckpt) as tmp:
        if is_lora(denoiser):
            from peft.utils import get_peft_model_state_dict

            peft_sd = get_peft_model_state_dict(denoiser)
            prefix = lora_prefix(denoiser)
            # peft key names (lora_A/lora_B) behind the component prefix (``unet.``/``transformer.``), which
            # diffusers' load_lora_weights / load_lora_adapter read for UNets and transformers alike. The legacy
            # ``lora.down/up`` conversion of older SD-1.x scripts drops UNet mid-block attention LoRA on reload.
            tensors = {f"{prefix}.{k}": v.detach().cpu().contiguous() for k, v in peft_sd.items()}
            (tmp / LORA_FILE).write_bytes(safetensors_bytes(tensors, _lora_metadata(denoiser, prefix)))
            weights = LORA_FILE
            if training_state is not None:
                training_state = {**training_state, "peft_state": {k: v.detach().cpu() for k, v in peft_sd.items()}}
        else:
            sd = {k: v.detach().cpu().contiguous() for k, v in denoiser.state_dict().items()}
            (tmp / FULL_FILE).write_bytes(safetensors_bytes(sd))
            weights = FULL_FILE
        meta = {**meta, "weights_file": weights, "weights_sha256": sha256_file(tmp / weights)}
        if training_state is not None:  # serialised in memory first: torch.save reports a full disk as a
            buf = io.BytesIO()           # RuntimeError, which the CLI's disk-full handler does not match
            torch.save(training_state, buf)
            (tmp / STATE_FILE).write_bytes(buf.getbuffer())
        (tmp / META_FILE).write_text(json.dumps(meta, indent=2, default=str) + "\n")
    return ckpt


def read_meta(ckpt: str | Path) -> dict[str, Any]:
    p = Path(ckpt) / META_FILE
    try:
        return json.loads(p.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{p} is missing or unreadable ({exc.__class__.__name__}); not a pcpo-eval checkpoint") from None


def trained_config(run_dir: str | Path) -> dict[str, Any] | None:
    """The config the run's latest checkpoint was trained with (its ``checkpoint.json`` ``config``); None when
    it has no checkpoint or records none (an imported run) or the file is unreadable."""
    latest = latest_checkpoint(run_dir)
    if latest is None:
        return None
    try:
        cfg = read_meta(latest).get("config")
    except UserError:
        return None
    return cfg if isinstance(cfg, dict) else None


def check_weights_file(path: Path, fix: str = "copy it again or re-save the checkpoint with pcpo-eval train") -> None:
    """Raise a one-line UserError unless ``path`` is a complete safetensors file.

    ``safe_open`` parses the header and checks that the data section is as long as the header
    says, so a file cut short (a copy interrupted, a full disk) is caught before the model loads.
    """
    from safetensors import SafetensorError, safe_open

    try:
        with safe_open(str(path), framework="pt") as fh:
            fh.keys()
    except (SafetensorError, OSError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"weights file {path} is truncated or corrupt ({first[:160]}); {fix}") from None


@contextlib.contextmanager
def _quiet(logger_name: str) -> Iterator[None]:
    """Silence one library logger (below CRITICAL) for the duration of the block."""
    import logging

    log = logging.getLogger(logger_name)
    level = log.level
    log.setLevel(logging.CRITICAL)
    try:
        yield
    finally:
        log.setLevel(level)


def load_weights_into(adapter: Any, ckpt: str | Path) -> None:
    """Apply a checkpoint's LoRA or full weights to a freshly loaded base ``adapter``."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt)
    path = ckpt / meta.get("weights_file", "")
    if not path.is_file():
        raise UserError(f"checkpoint {ckpt} lacks its weights file {path.name}; re-save it with pcpo-eval train")
    check_weights_file(path)
    den = adapter.denoiser
    try:
        if path.name == LORA_FILE:
            with _quiet("diffusers.loaders.peft"):  # it logs the error we re-raise as one line below
                den.load_lora_adapter(str(ckpt), weight_name=LORA_FILE, prefix=lora_prefix(den), adapter_name="default")
            if not is_lora(den):
                raise ValueError("no LoRA layer matched the base model's modules")
        else:
            from safetensors.torch import load_file

            den.load_state_dict(load_file(str(path)), strict=True)
    except (RuntimeError, ValueError, KeyError) as exc:
        first = str(exc).strip().splitlines()[0] if str(exc).strip() else type(exc).__name__
        raise UserError(
            f"weights in {path} do not fit base model {meta.get('model')!r} ({first[:200]}); "
            "pass a checkpoint trained from this base model"
        ) from None


def retained(epochs: list[int], keep: int) -> list[int]:
    """The epochs of ``epochs`` (saved checkpoints, any order) that ``keep_checkpoints=keep`` keeps: the
    newest ``keep`` of them (0 = all)."""
    ordered = sorted(epochs)
    return ordered if keep <= 0 else ordered[-keep:]


def _remove_checkpoint(ckpt: Path) -> None:
    """Delete checkpoint directory ``ckpt``: its ``checkpoint.json`` first, so a crash part-way never leaves
    a directory that :func:`list_checkpoints` counts as complete."""
    import shutil

    with contextlib.suppress(FileNotFoundError):
        (ckpt / META_FILE).unlink()
    shutil.rmtree(ckpt, ignore_errors=True)


def apply_retention(run_dir: str | Path, keep: int) -> list[Path]:
    """After a save: drop ``training_state.pt`` from every checkpoint but the newest (resume reads only the
    newest; older ones keep weights + metadata, loadable for generation), and with ``keep > 0`` delete
    the checkpoints older than the newest ``keep``. Returns the deleted checkpoint directories.

    Called only once the newest checkpoint is complete (written atomically), so a run always holds
    one resumable checkpoint."""
    cks = list_checkpoints(run_dir)
    if not cks:
        return []
    for old in cks[:-1]:
        with contextlib.suppress(FileNotFoundError):
            (old / STATE_FILE).unlink()
    drop = cks[:-keep] if keep > 0 else []
    for old in drop:
        _remove_checkpoint(old)
    return drop


def damaged_fix(ckpt: str | Path) -> str:
    """What to do about a damaged newest checkpoint ``ckpt``: resume from the one before it only if that one kept
    its training state; :func:`apply_retention` keeps it in the newest checkpoint alone, so usually start a new
    run from the previous checkpoint's weights (``init_from``). Every message said "delete that checkpoint
    folder to resume from the one before it", which, followed, deleted checkpoint after checkpoint."""
    ckpt = Path(ckpt)
    before = [c for c in list_checkpoints(run_dir_of(ckpt)) if c.name < ckpt.name]
    if before and (before[-1] / STATE_FILE).is_file():
        return f"delete that checkpoint folder ({ckpt}) to resume from {before[-1].name}"
    if before:
        return (f"restore {ckpt} from a copy, or start a new run from {before[-1].name}'s weights with "
                f"init_from={before[-1]} (older checkpoints keep no optimizer state, so none of them resumes)")
    return f"restore {ckpt} from a copy, or start the run again"


def load_training_state(ckpt: str | Path) -> dict[str, Any]:
    """The resumable state (``training_state.pt``) of checkpoint ``ckpt``; a bad file is a UserError.

    A missing, truncated or foreign file raises one line naming the checkpoint and the fix (resume
    from an earlier checkpoint by deleting this one), instead of a pickle traceback.
    """
    import pickle
    import zipfile

    path = Path(ckpt) / STATE_FILE
    if not path.is_file():
        raise UserError(f"checkpoint {ckpt} has no {STATE_FILE}, so it cannot be resumed (only a run's newest "
                        f"checkpoint keeps its optimizer state); {damaged_fix(ckpt)}")
    try:
        state = torch.load(path, map_location="cpu", weights_only=False)
    except (RuntimeError, EOFError, pickle.UnpicklingError, zipfile.BadZipFile, OSError, ValueError, TypeError,
            AttributeError, KeyError, IndexError) as exc:  # what torch.load raises on garbage varies by content
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"{path} is truncated or corrupt ({first[:160]}); {damaged_fix(ckpt)}") from None
    if not isinstance(state, dict) or not {"optimizer", "tracker", "epoch"} <= set(state):
        raise UserError(f"{path} is not a pcpo-eval training state; {damaged_fix(ckpt)}")
    return state


def check_resumable_weights(ckpt: str | Path) -> None:
    """:func:`check_weights` for ``--resume`` (the fix: :func:`damaged_fix`): resuming past a truncated weights file
    would leave it in the run."""
    check_weights(ckpt, "--resume", damaged_fix(ckpt))


def check_weights(ckpt: str | Path, who: str, fix: str) -> None:
    """The weights file of checkpoint ``ckpt`` is present, a complete safetensors file and, when the
    checkpoint recorded one, matches its ``weights_sha256``; else one UserError starting with ``who`` (the
    command or flag) and ending with ``fix``. ``--resume``, ``init_from``, ``export`` and ``generate`` call it
    before they load anything (export recorded the old hash beside changed weights, and generate rendered
    them, both exit 0)."""
    ckpt = Path(ckpt)
    meta = read_meta(ckpt)
    path = ckpt / str(meta.get("weights_file") or LORA_FILE)
    if not path.is_file():
        raise UserError(f"{who}: checkpoint {ckpt} lacks its weights file {path.name}; {fix}")
    check_weights_file(path, fix)
    want = meta.get("weights_sha256")
    if want and sha256_file(path) != want:
        raise UserError(f"{who}: weights file {path} does not match the weights_sha256 its checkpoint.json "
                        f"recorded (changed or corrupt after saving); {fix}")


def load_run_config(run_dir: str | Path) -> dict[str, Any]:
    return read_yaml_mapping(config_path(run_dir), "run config",
                             f"{run_dir} is not a pcpo-eval run directory")


def resolve_checkpoint(spec: str | Path) -> Path | None:
    """A checkpoint directory for ``spec`` (a checkpoint dir, or a run dir = its latest), else None."""
    p = Path(spec)
    if (p / META_FILE).is_file():
        return p
    if is_run_dir(p):
        latest = latest_checkpoint(p)
        if latest is None:
            raise UserError(f"run {p} has no complete checkpoint yet")
        return latest
    return None


def _unknown_model(spec: str, kinds: list[str]) -> str:
    """The one line for a --model that names no model, with the fix for what the user likely meant."""
    specs = f"a spec of kind {', '.join(kinds)} (e.g. toy)"
    head, sep, tail = spec.rpartition("@")
    if sep and head and is_run_dir(head):  # export's RUN@EPOCH
        saved = [e for e, _ in epoch_dirs(head)]
        ckpt = checkpoint_dir(head, int(tail)) if tail.isdigit() and int(tail) in saved else None
        fix = f"use {ckpt}" if ckpt else f"use {head}/checkpoints/epoch_NNNN"
        return (f"unknown model {spec!r}: RUN@EPOCH is not a --model; {fix} (saved epochs: "
                f"{', '.join(map(str, saved)) or 'none'}), or {head} for its latest checkpoint")
    p = Path(spec)
    if p.is_dir():
        return (f"unknown model {spec!r}: a folder, but not a pcpo-eval run (config.yaml + checkpoints/) or checkpoint "
                f"(checkpoint.json); give a run or checkpoint folder (pcpo-eval train --out), or {specs}")
    if p.is_file():
        return (f"unknown model {spec!r}: a file; a model is a run or checkpoint folder (pcpo-eval train --out, or "
                f"its checkpoints/epoch_NNNN), or {specs}")
    if "/" in spec or p.suffix:
        return (f"unknown model {spec!r}: no such file or folder; give a run or checkpoint folder "
                f"(pcpo-eval train --out), or {specs}")
    return f"unknown model {spec!r}: not a checkpoint or run directory, nor {specs}"


def load_model_from_spec(spec: str, device: str | torch.device = "cpu", dtype: torch.dtype = torch.float32):
    """A ready ModelAdapter from a registry spec (``toy``, ``sd1:PATH``, ...), a checkpoint or a run dir.

    ``base`` names no model here (a study's base model is its setup's ``model:``): refused with the fix."""
    from pcpo_eval.models.registry import REGISTRY, load_model

    ckpt = resolve_checkpoint(spec)
    if ckpt is None:
        kind = str(spec).split(":", 1)[0]
        if spec == "base":
            raise UserError("--model base names no model outside a study: name the base model itself, e.g. toy (the "
                            "embedded toy model), sd1:CompVis/stable-diffusion-v1-4, sd3:..., flux:... (a setup's "
                            "`model:` key; a study's base model is in its spec.resolved.json, base_model)")
        if kind not in REGISTRY:
            raise UserError(_unknown_model(str(spec), sorted(REGISTRY)))
        adapter = load_model(str(spec), device=device, dtype=dtype)
        adapter.spec = str(spec)
        return adapter
    check_weights(ckpt, f"--model {spec}", f"restore {ckpt} from a copy, or use another checkpoint")
    meta = read_meta(ckpt)
    base = meta.get("model") or load_run_config(run_dir_of(ckpt)).get("model", "toy")
    adapter = load_model(str(base), device=device, dtype=dtype)
    load_weights_into(adapter, ckpt)
    adapter.denoiser.eval()
    adapter.spec = str(ckpt)
    return adapter


def model_hash(spec: str) -> str:
    """A short content hash identifying a model spec (checkpoint weights hash, else the spec)."""
    import hashlib

    with contextlib.suppress(UserError):
        ckpt = resolve_checkpoint(spec)
        if ckpt is not None:
            return read_meta(ckpt).get("weights_sha256", "")[:16]
    return hashlib.sha256(str(spec).encode()).hexdigest()[:16]


# ------------------------------------------------------------------------------------------------
# init_from: a fresh run started from a checkpoint's weights (docs/training.md#fresh-run-from-a-checkpoint)
# ------------------------------------------------------------------------------------------------
_COMPONENTS = ("unet.", "transformer.")


def lora_file_info(path: Path) -> tuple[int, float | None]:
    """(LoRA rank, lora_alpha) of a safetensors file: rank 0 = full weights (no ``lora_A`` tensor);
    alpha from diffusers' ``lora_adapter_metadata`` header when present, else None."""
    from safetensors import safe_open

    with safe_open(str(path), framework="pt") as fh:
        keys = [k for k in fh.keys() if ".lora_A." in k or k.endswith(".lora_A.weight")]
        rank = int(fh.get_slice(keys[0]).get_shape()[0]) if keys else 0
        header = fh.metadata() or {}
    alpha = None
    with contextlib.suppress(ValueError, TypeError, AttributeError):
        cfg = json.loads(header.get("lora_adapter_metadata", "{}"))
        found = [v for k, v in cfg.items() if k.split(".")[-1] == "lora_alpha"]
        alpha = float(found[0]) if found else None
    return rank, alpha


def init_source(spec: str) -> dict[str, Any]:
    """What ``init_from`` names: a checkpoint directory, a run directory (its latest checkpoint) or a
    ``.safetensors`` file (a diffusers LoRA in peft format, or a denoiser state dict).

    Returns ``source``, ``kind`` (checkpoint | file), ``checkpoint``, ``weights_file``, ``weights_sha256``
    (of the file as read now; a checkpoint whose file no longer matches its recorded hash is refused),
    ``model``, ``lora_rank``, ``lora_alpha``, ``epoch`` and ``objective`` (None where unknown).
    """
    p = Path(spec).expanduser()
    if p.is_file():
        if p.suffix != ".safetensors":
            raise UserError(f"init_from={spec}: a file must be .safetensors (diffusers / LoRA weights); "
                            "or pass a checkpoint or run directory")
        check_weights_file(p)
        rank, alpha = lora_file_info(p)
        return {"source": str(spec), "kind": "file", "checkpoint": None, "weights_file": str(p),
                "weights_sha256": sha256_file(p), "model": None, "lora_rank": rank, "lora_alpha": alpha,
                "epoch": None, "objective": None}
    ckpt = resolve_checkpoint(p) if p.is_dir() else None
    if ckpt is None:
        raise UserError(f"init_from={spec}: not a checkpoint directory, run directory or .safetensors file")
    meta = read_meta(ckpt)
    path = ckpt / str(meta.get("weights_file", ""))
    if not path.is_file():
        raise UserError(f"init_from={spec}: checkpoint {ckpt} lacks its weights file {path.name}")
    check_weights_file(path)
    sha = sha256_file(path)
    if meta.get("weights_sha256") and meta["weights_sha256"] != sha:
        raise UserError(f"init_from={spec}: {path} does not match the weights_sha256 in its checkpoint.json "
                        "(changed after it was written); use an intact checkpoint")
    run_cfg: dict[str, Any] = {}
    with contextlib.suppress(UserError):
        run_cfg = load_run_config(run_dir_of(ckpt))
    rank, alpha = lora_file_info(path)
    return {"source": str(spec), "kind": "checkpoint", "checkpoint": str(ckpt), "weights_file": str(path),
            "weights_sha256": sha, "model": meta.get("model") or run_cfg.get("model"), "lora_rank": rank,
            "lora_alpha": alpha if alpha is not None else run_cfg.get("lora_alpha") if rank else None,
            "epoch": meta.get("epoch"), "objective": meta.get("objective")}


def check_init_compatible(src: dict[str, Any], model: str, lora_rank: int, lora_alpha: float) -> None:
    """Refuse (one line) an ``init_from`` source whose model, LoRA rank or LoRA alpha differ from the config."""
    bad = []
    if src.get("model") is not None and str(src["model"]) != str(model):
        bad.append(f"model {src['model']!r} (config: {model!r})")
    if int(src["lora_rank"]) != int(lora_rank):
        what = "full weights (lora_rank 0)" if not src["lora_rank"] else f"lora_rank {src['lora_rank']}"
        bad.append(f"{what} (config: lora_rank {lora_rank})")
    elif lora_rank and src.get("lora_alpha") is not None and float(src["lora_alpha"]) != float(lora_alpha):
        bad.append(f"lora_alpha {src['lora_alpha']:g} (config: {lora_alpha:g})")
    if bad:
        raise UserError(f"init_from={src['source']} does not match this config: {'; '.join(bad)}; "
                        "start from a checkpoint of the same model and LoRA settings, or change the config")


def load_init_weights(denoiser: torch.nn.Module, src: dict[str, Any]) -> None:
    """Copy ``src``'s weights into ``denoiser`` in place: LoRA tensors into its (already attached) adapter
    (the component prefix ``unet.`` / ``transformer.`` stripped; the key sets must agree), or the full
    state dict (strict). A mismatch is a one-line UserError."""
    from safetensors.torch import load_file

    sd = load_file(src["weights_file"])
    try:
        if src["lora_rank"]:
            from peft.utils import get_peft_model_state_dict, set_peft_model_state_dict

            sd = {next((k[len(c):] for c in _COMPONENTS if k.startswith(c)), k): v for k, v in sd.items()}
            want = set(get_peft_model_state_dict(denoiser))
            if set(sd) != want:
                raise ValueError(f"{len(want - set(sd))} of the model's LoRA tensors missing, "
                                 f"{len(set(sd) - want)} unexpected")
            set_peft_model_state_dict(denoiser, sd)
        else:
            denoiser.load_state_dict(sd, strict=True)
    except (RuntimeError, ValueError, KeyError) as exc:
        first = (str(exc).strip().splitlines() or [type(exc).__name__])[0]
        raise UserError(f"init_from={src['source']}: weights do not fit this model ({first[:200]}); "
                        "start from a checkpoint of the same model and LoRA settings") from None


def lock_run(out: Path) -> IO[str] | None:
    """Create run folder ``out`` and hold its :data:`~pcpo_eval.rundir.RUN_LOCK` (:func:`pcpo_eval.io.lock_or_refuse`;
    closing the returned file releases it; None where flock does not exist): one process trains a run at a
    time. Before, two ``train`` runs into one ``--out`` both exited 0 with their checkpoints interleaved (seeds 0, 7, 0, 7, ... by epoch), and a ``--resume`` was
    accepted while another process trained the run."""
    out.mkdir(parents=True, exist_ok=True)
    return lock_or_refuse(out / RUN_LOCK, f"run folder {out} is being trained by another pcpo-eval process "
                          "(pid {pid}); wait for it to finish (or stop it), or choose another --out")
