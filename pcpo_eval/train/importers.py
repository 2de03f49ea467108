"""Import DanceGRPO and Flow-GRPO runs as pcpo-eval run directories (``pcpo-eval import``).

A run trained with a reference codebase becomes ``RUN/{config.yaml, inputs.json, log.parquet,
checkpoints/epoch_XXXX/}`` (``inputs.json``: the base model's resolved folder when ``--model`` names a
local one, :mod:`pcpo_eval.train.inputs`), the layout of :mod:`pcpo_eval.train.checkpoints`, so ``generate
--model RUN/checkpoints/epoch_0060``, ``select`` and a study's ``runs:`` list use it like a run
trained here. Epochs are numbered as here: epoch E is the E-th sampling-and-update round, and a
checkpoint at epoch E holds the policy after that round's updates.

Formats read (learned from the references' train scripts, not their code):

* **Flow-GRPO** (yifan123/flow_grpo ``scripts/train_sd3.py``): LoRA saved by peft's
  ``save_pretrained`` at ``SAVE_DIR/checkpoints/checkpoint-{global_step}/lora/``
  (``adapter_model.safetensors`` + ``adapter_config.json``), written at the start of its epoch k
  (0-based) before sampling, i.e. the policy after k rounds = our epoch k. Scalars go to W&B with
  ``step=global_step``: per epoch ``epoch`` and ``reward_{key}`` (``reward_avg`` the combined
  reward), per update ``approx_kl``, ``clipfrac``, ``kl``, ``policy_loss``, and every
  ``eval_freq`` epochs ``eval_reward_{key}`` on held-out prompts, logged at the start of epoch k
  (= the policy of our epoch k). The history is read from a W&B export (CSV, JSON lines,
  Parquet: ``pandas.DataFrame(run.scan_history())``, every row) or the offline transaction log
  ``run-*.wandb``. A history without the reward of some epoch is refused: ``run.history()`` returns a
  sample of 500 rows, and a log with epochs missing would be smoothed across them.
* **DanceGRPO** (XueZeyue/DanceGRPO ``fastvideo/train_grpo_sd.py`` / ``train_grpo_flux.py``):
  full weights ``diffusion_pytorch_model.safetensors`` (+ ``config.json``) with diffusers' key
  names, in ``checkpoint_epoch_{E}/`` (SD: saved after its epoch E's updates = our epoch E + 1)
  or ``checkpoint-{step}-{epoch}/`` (FLUX: saved before step ``step``'s update = our epoch
  step - 1); ``reward.txt`` has one mean reward per line, line i = our epoch i + 1. Both scripts open
  ``./reward.txt`` in append mode and write nothing but ``f"{mean}\\n"`` (no epoch, no header), so a
  restarted run, or a second run in the same working directory, leaves its lines after the first
  run's; the SD script also restarts its epoch count (and so its checkpoint names) at 0 on resume.
  The file itself marks no run boundary. The importer refuses what betrays one
  (:func:`dancegrpo_reward_lines`: a text or blank line between rewards; :func:`dancegrpo_append_problem`:
  more lines past the last checkpoint than one run writes before its next save).
"""

from __future__ import annotations

import json
import re
import shutil
import struct
from collections.abc import Iterator
from pathlib import Path
from typing import Any

import numpy as np
import pandas as pd

from pcpo_eval.errors import UserError
from pcpo_eval.io import (
    atomic_dir,
    atomic_write_parquet,
    atomic_write_text,
    check_own_folder,
    remove_stale_temps,
    sha256_file,
)
from pcpo_eval.registry import optional_module
from pcpo_eval.rewards import check_reward_names, parse_reward
from pcpo_eval.rundir import META_FILE, RUN_ENTRIES, checkpoint_dir, config_path, log_path
from pcpo_eval.train.checkpoints import FULL_FILE, LORA_FILE, check_weights_file
from pcpo_eval.train.inputs import input_record, write_inputs

#: the import's summary in the run folder (settings, source, checkpoints)
IMPORT_FILE = "import.json"
KINDS = ("dancegrpo", "flowgrpo")
#: run kind -> the --model kinds it can have fine-tuned (Flow-GRPO: SD3.5 / FLUX LoRA, SD-1 UNet LoRA;
#: DanceGRPO: the SD-1 UNet or the FLUX transformer)
MODEL_KINDS = {"flowgrpo": ("sd3", "flux", "sd1"), "dancegrpo": ("sd1", "flux")}
#: the denoiser folder of a diffusers pipeline, by model kind
DENOISER_FOLDER = {"sd1": "unet", "sd3": "transformer", "flux": "transformer"}
FIX_SOURCE = "copy the reference run's checkpoint again (or leave that checkpoint out of the source folder)"
#: W&B per-update keys averaged into our per-epoch PPO-health columns
UPDATE_KEYS = {"approx_kl": "approx_kl", "clipfrac": "clipfrac", "kl": "kl_mean", "policy_loss": "loss"}


# ------------------------------------------------------------------------------------------------
# logs
# ------------------------------------------------------------------------------------------------


def wandb_records(path: Path) -> list[dict[str, Any]]:
    """History rows of a W&B offline transaction log (``run-*.wandb``): leveldb-log framing (32 KiB
    blocks, 7-byte chunk headers: crc32c, length, type FULL/FIRST/MIDDLE/LAST) around protobuf
    ``Record`` messages; the ``history`` records are the logged rows."""
    pb = optional_module("wandb.proto.wandb_internal_pb2")
    if pb is None:
        raise UserError(f"reading {path} needs the wandb package (pip install 'pcpo-eval[tracking]'), "
                        "or export every row of the history to CSV with wandb's API (run.scan_history()))")
    data = path.read_bytes()
    if data[:4] != b":W&B":
        raise UserError(f"{path} is not a W&B transaction log (no ':W&B' header)")
    try:
        return _wandb_rows(pb, data)
    except Exception as exc:  # noqa: BLE001 - protobuf / struct / JSON errors of a damaged log
        raise UserError(f"{path} is a corrupt or truncated W&B transaction log ({type(exc).__name__}: "
                        f"{str(exc).splitlines()[0][:100] if str(exc).strip() else 'unreadable record'}); "
                        "export every row of the run's history with wandb's API (run.scan_history()) to CSV and pass that as --log") from None


def wandb_log_records(pb: Any, data: bytes) -> Iterator[Any]:
    """The protobuf ``Record`` messages of a W&B transaction log's bytes, in order: leveldb-log framing
    (32 KiB blocks, 7-byte chunk headers crc32c / length / type FULL=1, FIRST=2, MIDDLE=3, LAST=4;
    a block's tail shorter than a header is padding). ``pb`` is ``wandb.proto.wandb_internal_pb2``.
    Raises (ValueError, protobuf errors) on a damaged or truncated log."""
    pos, block, buf = 7, 32768, b""
    while pos + 7 <= len(data):
        left = block - pos % block
        if left < 7:
            pos += left
            continue
        _crc, length, kind = struct.unpack("<IHB", data[pos : pos + 7])
        if pos + 7 + length > len(data) or kind > 4:
            raise ValueError(f"record at byte {pos} runs past the end of the file or has an unknown type")
        chunk, pos = data[pos + 7 : pos + 7 + length], pos + 7 + length
        if kind in (2, 3):
            buf += chunk
            continue
        if kind not in (1, 4):
            continue
        rec = pb.Record()
        rec.ParseFromString(buf + chunk)
        buf = b""
        yield rec


def _wandb_rows(pb: Any, data: bytes) -> list[dict[str, Any]]:
    """The history rows of a transaction log's bytes (:func:`wandb_records`); raises on damage."""
    return [{i.key or "/".join(i.nested_key): json.loads(i.value_json) for i in rec.history.item}
            for rec in wandb_log_records(pb, data) if rec.WhichOneof("record_type") == "history"]


def read_history(path: str | Path) -> pd.DataFrame:
    """A W&B run history: ``.csv``, ``.jsonl``/``.json`` (one row per line), ``.parquet`` or ``.wandb``."""
    p = Path(path)
    if not p.is_file():
        raise UserError(f"log {p} does not exist; pass the run's W&B history export or its run-*.wandb file")
    suffix = p.suffix.lower()
    try:
        if suffix == ".wandb":
            df = pd.DataFrame(wandb_records(p))
        elif suffix == ".csv":
            df = pd.read_csv(p)
        elif suffix in (".jsonl", ".json"):
            df = pd.read_json(p, lines=True)
        elif suffix == ".parquet":
            df = pd.read_parquet(p)
        else:
            raise UserError(f"log {p}: unknown format {suffix!r}; use .csv, .jsonl, .parquet or .wandb")
    except UserError:
        raise
    except (ValueError, OSError) as exc:
        raise UserError(f"log {p} is not readable as {suffix} ({str(exc).splitlines()[0][:120]})") from None
    if "_step" not in df.columns:
        raise UserError(f"log {p} has no _step column; export the W&B history with its _step (run.scan_history())")
    return df


def flowgrpo_epochs(hist: pd.DataFrame, reward_key: str = "avg") -> pd.DataFrame:
    """Per our epoch: reward_mean (``reward_{key}`` of Flow-GRPO epoch E - 1), PPO health averaged
    over that epoch's updates, and val_reward_mean (``eval_reward_{key}`` logged at the start of its
    epoch E = the policy after our epoch E)."""
    col = f"reward_{reward_key}"
    if col not in hist.columns or "epoch" not in hist.columns:
        keys = sorted(c for c in hist.columns if c.startswith("reward_"))
        raise UserError(f"log has no {col} / epoch columns (reward columns: {', '.join(keys) or 'none'}); "
                        "pass --reward-key with one of them, without the reward_ prefix")
    for c in [col, "epoch", *(f"eval_{col}",) * (f"eval_{col}" in hist.columns)]:
        values = pd.to_numeric(hist[c], errors="coerce").to_numpy(dtype=float, na_value=np.nan)
        bad = hist[c].notna() & ~np.isfinite(values)  # text coerces to NaN: counted with inf
        if bad.any():
            i = int(np.flatnonzero(bad.to_numpy())[0])
            raise UserError(f"log column {c!r} holds {int(bad.sum())} non-finite or non-numeric value(s) "
                            f"(first at _step {hist['_step'].iloc[i]}: {hist[c].iloc[i]!r}); an imported reward must "
                            "be a finite number: fix or drop those rows of the log")
    rows = hist[hist[col].notna() & hist["epoch"].notna()]
    out = pd.DataFrame({"epoch": rows["epoch"].astype(float).astype(int).to_numpy() + 1,
                        "reward_mean": rows[col].astype(float)})
    out = out.drop_duplicates("epoch", keep="last").set_index("epoch")
    missing = sorted(set(range(1, int(out.index.max()) + 1)) - set(out.index))
    if missing:
        shown = ", ".join(str(e - 1) for e in missing[:5]) + (", ..." if len(missing) > 5 else "")
        raise UserError(f"log has no {col} for {len(missing)} Flow-GRPO epoch(s) ({shown}) of 0..{int(out.index.max()) - 1}: "
                        "a run.history() export samples its rows (500 by default); export every row with "
                        "run.scan_history(), or pass the run's run-*.wandb file")
    upd = hist[hist["epoch"].notna()]
    for src, dst in UPDATE_KEYS.items():
        if src in upd.columns:
            out[dst] = upd.groupby(upd["epoch"].astype(int) + 1)[src].mean()
    ev = f"eval_{col}"
    if ev in hist.columns:
        step_epoch = _step_to_epoch(hist)
        val = hist[hist[ev].notna()]
        epochs = [step_epoch.get(int(s)) for s in val["_step"]]
        out["val_reward_mean"] = pd.Series({e: float(v) for e, v in zip(epochs, val[ev], strict=True)
                                            if e is not None and e >= 1})
    return out.reset_index().sort_values("epoch").reset_index(drop=True)


def _step_to_epoch(hist: pd.DataFrame) -> dict[int, int]:
    """global_step -> our epoch whose policy a log/checkpoint at that step holds: the Flow-GRPO epoch
    that starts at that step (its eval and save happen before sampling)."""
    rows = hist[hist["epoch"].notna()].sort_values("_step")
    return {int(s): int(e) for s, e in rows.groupby("_step")["epoch"].min().items()}


APPENDED = ("DanceGRPO opens reward.txt in append mode and writes one number per line, so restarts and "
            "runs in one working directory leave their lines one after the other")


def dancegrpo_reward_lines(path: str | Path, last_run: bool = False) -> tuple[pd.DataFrame, tuple[int, int]]:
    """``reward.txt``: line i (one float) = mean reward of our epoch i + 1; returns the table and the
    first and last line number (1-based) it was read from.

    DanceGRPO writes nothing but numbers, so a text line (a header or marker) or a blank line between
    two blocks of rewards is a boundary between appended runs (or damage): refused, unless
    ``last_run``, which reads the block after the last such line (epochs counted from that block's
    first line). ``last_run`` without such a line is refused too: the runs of a file DanceGRPO alone
    appended to cannot be told apart. Leading / trailing blank lines are ignored.
    """
    p = Path(path)
    if not p.is_file():
        raise UserError(f"{p} does not exist; DanceGRPO writes reward.txt in its working directory (pass --log)")
    rows: list[tuple[int, float | None, str]] = []  # (line, value or None, text)
    for i, line in enumerate(p.read_text().splitlines(), 1):
        try:
            rows.append((i, float(line) if line.strip() else None, line.strip()))
        except ValueError:
            rows.append((i, None, line.strip()))
    numbers = [k for k, (_, v, _) in enumerate(rows) if v is not None]
    outside = rows[: numbers[0]] + rows[numbers[-1] + 1 :] if numbers else rows
    for i, _, text in outside:  # text before the first or after the last reward
        if text:
            raise UserError(f"{p} line {i}: {text[:40]!r} is not a number")
    blocks: list[list[tuple[int, float]]] = [[]]
    separators: list[tuple[int, str]] = []  # the first line of each gap between blocks (a text line if any)
    for k in range(numbers[0], numbers[-1] + 1) if numbers else ():
        i, v, text = rows[k]
        if v is not None:
            blocks[-1].append((i, v))
            continue
        if blocks[-1]:
            separators.append((i, "blank"))
            blocks.append([])
        if text and separators[-1][1] == "blank":
            separators[-1] = (i, repr(text[:40]))
    if len(blocks) > 1 and not last_run:
        line, what = separators[-1]
        sizes = ", ".join(str(len(b)) for b in blocks)
        raise UserError(f"{p} line {line} is {'blank' if what == 'blank' else f'not a number ({what})'} and splits the "
                        f"file into {len(blocks)} blocks of rewards ({sizes} lines): {APPENDED}, and a line like this "
                        f"marks where another run began; pass --log with this run's lines only, or --last-run to "
                        f"import the {len(blocks[-1])} rewards after line {line} (or delete the line if it is not a boundary)")
    if last_run and len(blocks) < 2:
        raise UserError(f"--last-run: {p} has no text or blank line between its rewards, so where its last run "
                        f"begins cannot be told ({APPENDED}, without marking where); pass --log with this run's lines only")
    picked = blocks[-1]
    vals = [v for _, v in picked]
    if not vals or not np.all(np.isfinite(vals)):
        raise UserError(f"{p} holds no rewards or non-finite ones; check the file")
    table = pd.DataFrame({"epoch": np.arange(1, len(vals) + 1), "reward_mean": vals})
    return table, (picked[0][0], picked[-1][0])


def dancegrpo_append_problem(n_rewards: int, cks: dict[int, Path]) -> str | None:
    """Why ``n_rewards`` logged epochs cannot be one run with checkpoints ``cks`` (None when they can).

    One run writes one line per round and saves every ``f`` rounds (SD: after rounds f, 2f, ...; FLUX:
    before steps f, 2f, ...), so it ends at most ``f`` lines after its last checkpoint, however it
    ended (finished, or killed before the next save). ``f`` is taken as the greatest common divisor
    of the checkpoints' own numbers (their epoch / step): the save interval when every checkpoint is
    there, a multiple of it otherwise (a looser bound). More lines than that means the file holds
    lines another run appended, or this run's later checkpoints were left out of the source folder.
    """
    native = {}
    for epoch, folder in cks.items():
        if m := re.fullmatch(r"checkpoint_epoch_(\d+)", folder.name):
            native[epoch] = int(m.group(1))
        elif m := re.fullmatch(r"checkpoint-(\d+)-(\d+)", folder.name):
            native[epoch] = int(m.group(1))
    if not native or min(native.values()) < 1:
        return None
    every = int(np.gcd.reduce(list(native.values())))
    last = max(cks)
    if n_rewards - last <= every:
        return None
    return (f"it has {n_rewards} rewards, {n_rewards - last} past the last checkpoint ({cks[last].name}, our epoch "
            f"{last}), but with checkpoints every {every} {'epochs' if 'epoch' in cks[last].name else 'steps'} one "
            f"run writes at most {every} past its last")


# ------------------------------------------------------------------------------------------------
# checkpoints
# ------------------------------------------------------------------------------------------------


def flowgrpo_checkpoints(src: Path, hist: pd.DataFrame) -> dict[int, Path]:
    """Our epoch -> the peft LoRA folder of ``checkpoints/checkpoint-{step}/lora``."""
    step_epoch = _step_to_epoch(hist)
    out = {}
    for d in sorted(src.glob("**/checkpoint-*/lora")):
        m = re.fullmatch(r"checkpoint-(\d+)", d.parent.name)
        if m and (d / "adapter_model.safetensors").is_file():
            step = int(m.group(1))
            if step not in step_epoch:
                raise UserError(f"{d}: step {step} is not in the log; pass the log of this run")
            out[step_epoch[step]] = d
    return out


def dancegrpo_checkpoints(src: Path) -> dict[int, Path]:
    """Our epoch -> folder with ``diffusion_pytorch_model.safetensors`` (SD and FLUX naming)."""
    out = {}
    for f in sorted(src.glob("**/diffusion_pytorch_model.safetensors")):
        name = f.parent.name
        if m := re.fullmatch(r"checkpoint_epoch_(\d+)", name):
            out[int(m.group(1)) + 1] = f.parent
        elif m := re.fullmatch(r"checkpoint-(\d+)-(\d+)", name):
            out[int(m.group(1)) - 1] = f.parent
    return out


def peft_lora_to_diffusers(folder: Path, prefix: str = "transformer") -> tuple[dict[str, Any], dict[str, str]]:
    """A peft ``save_pretrained`` LoRA as the tensors + metadata of our ``pytorch_lora_weights.safetensors``
    (keys ``{prefix}.<module>.lora_A/B.weight``; the LoRA config in diffusers' metadata key)."""
    from diffusers.loaders.lora_base import LORA_ADAPTER_METADATA_KEY
    from safetensors.torch import load_file

    cfg_path = folder / "adapter_config.json"
    try:
        cfg = json.loads(cfg_path.read_text())
    except (OSError, json.JSONDecodeError) as exc:
        raise UserError(f"{cfg_path} is missing or not JSON ({type(exc).__name__}); not a peft LoRA folder") from None
    tensors = {}
    check_weights_file(folder / "adapter_model.safetensors", FIX_SOURCE)
    for k, v in load_file(str(folder / "adapter_model.safetensors")).items():
        k = k.removeprefix("base_model.model.")
        if ".lora_A." not in k and ".lora_B." not in k:
            continue
        tensors[f"{prefix}.{k.replace('.lora_A.default.', '.lora_A.').replace('.lora_B.default.', '.lora_B.')}"] = v
    if not tensors:
        raise UserError(f"{folder}/adapter_model.safetensors holds no lora_A/lora_B tensors")
    keep = {k: cfg[k] for k in ("r", "lora_alpha", "target_modules", "lora_dropout", "bias", "init_lora_weights",
                                "use_rslora", "use_dora") if k in cfg}
    meta = {"format": "pt", LORA_ADAPTER_METADATA_KEY: json.dumps({f"{prefix}.{k}": v for k, v in keep.items()},
                                                                  sort_keys=True)}
    return tensors, meta


def _denoiser_shapes(kind: str, arg: str) -> dict[str, tuple[int, ...]] | None:
    """Tensor name -> shape of the base pipeline's denoiser (read from safetensors headers, nothing
    loaded); None when its weights are not single or sharded ``*.safetensors`` files."""
    from safetensors import SafetensorError, safe_open

    from pcpo_eval.models.registry import pipeline_location
    from pcpo_eval.weights.locate import hf_snapshot_file

    where = pipeline_location(kind, arg)  # MissingWeightsError (one line) when absent
    root = Path(where)
    if not root.is_dir():
        index = hf_snapshot_file(where, "model_index.json")
        root = Path(index).parent if index is not None else root
    files = sorted((root / DENOISER_FOLDER[kind]).glob("*.safetensors"))
    plain = [f for f in files if ".fp16." not in f.name] or files
    if not plain:
        return None
    shapes: dict[str, tuple[int, ...]] = {}
    for f in plain:
        try:
            with safe_open(str(f), framework="pt") as fh:
                for k in fh.keys():  # noqa: SIM118 - safe_open is not a mapping
                    shapes[k] = tuple(fh.get_slice(k).get_shape())
        except (SafetensorError, OSError) as exc:
            raise UserError(f"--model {kind}:{arg}: {f} is truncated or corrupt ({str(exc).splitlines()[0][:100]}); "
                            "download the base model again") from None
    return shapes


def check_model(kind: str, model: str, cks: dict[int, Path]) -> None:
    """``--model`` names a base model kind this run kind trains, whose weights are here and fit the
    checkpoints (tensor names and shapes from safetensors headers): UserError otherwise."""
    from safetensors import safe_open

    from pcpo_eval.models.registry import REGISTRY, parse_spec

    mkind, arg = parse_spec(model)
    if mkind not in REGISTRY:
        raise UserError(f"unknown --model {model!r}; valid kinds: {', '.join(sorted(REGISTRY))} "
                        f"(a {kind} run fine-tunes {' or '.join(MODEL_KINDS[kind])}, e.g. --model sd3:PATH_OR_HF_ID)")
    if mkind not in MODEL_KINDS[kind]:
        raise UserError(f"--model {model!r}: a {kind} run fine-tunes {' or '.join(MODEL_KINDS[kind])}, not {mkind}; "
                        "pass the base model the run was trained from")
    if not arg and mkind == "sd1":
        raise UserError("--model sd1 needs a location: sd1:PATH_OR_HF_ID (the base model the run was trained from)")
    from pcpo_eval.models.flux import DEFAULT_FLUX
    from pcpo_eval.models.sd3 import DEFAULT_SD3

    default = DEFAULT_SD3 if mkind == "sd3" else DEFAULT_FLUX
    base = _denoiser_shapes(mkind, arg or default)
    if base is None:
        return
    epoch, folder = min(cks.items())
    name = "adapter_model.safetensors" if kind == "flowgrpo" else "diffusion_pytorch_model.safetensors"
    with safe_open(str(folder / name), framework="pt") as fh:
        ck = {k: tuple(fh.get_slice(k).get_shape()) for k in fh.keys()}  # noqa: SIM118
    problems = []
    if kind == "dancegrpo":
        missing = sorted(set(base) - set(ck))
        extra = sorted(set(ck) - set(base))
        wrong = sorted(k for k in set(ck) & set(base) if ck[k] != base[k])
        if wrong:
            problems.append(f"{wrong[0]} is {list(ck[wrong[0]])} in the checkpoint but {list(base[wrong[0]])} in the model")
        if missing or extra:
            problems.append(f"{len(missing)} tensor(s) of the model are absent and {len(extra)} unknown "
                            f"(e.g. {(missing or extra)[0]})")
    else:
        for k, shape in ck.items():
            if ".lora_A." not in k and ".lora_B." not in k:
                continue
            module = k.removeprefix("base_model.model.").split(".lora_")[0]
            target = base.get(f"{module}.weight")
            if target is None:
                problems.append(f"its LoRA targets {module}, which the model does not have")
                break
            if (".lora_A." in k and shape[-1] != target[1]) or (".lora_B." in k and shape[0] != target[0]):
                problems.append(f"its LoRA on {module} has shape {list(shape)}, the module {list(target)}")
                break
    if problems:
        raise UserError(f"checkpoint {folder / name} (epoch {epoch}) does not fit --model {model!r}: {problems[0]}; "
                        "pass the base model the run was trained from")


def _write_checkpoint(out: Path, epoch: int, src: Path, kind: str, model: str, reward: float | None) -> None:
    from pcpo_eval.io import safetensors_bytes

    with atomic_dir(checkpoint_dir(out, epoch)) as tmp:
        if kind == "flowgrpo":
            prefix = "unet" if model.startswith("sd1") else "transformer"
            tensors, meta = peft_lora_to_diffusers(src, prefix)
            (tmp / LORA_FILE).write_bytes(safetensors_bytes(tensors, meta))
            weights = LORA_FILE
        else:
            shutil.copyfile(src / "diffusion_pytorch_model.safetensors", tmp / FULL_FILE)
            weights = FULL_FILE
        info = {"epoch": epoch, "model": model, "reward_mean": reward, "weights_file": weights,
                "weights_sha256": sha256_file(tmp / weights), "imported_from": {"kind": kind, "path": str(src)}}
        (tmp / META_FILE).write_text(json.dumps(info, indent=2) + "\n")


def import_run(kind: str, src: str | Path, out: str | Path, model: str, log: str | Path | None = None,
               reward_key: str = "avg", objective: str = "ppo_clip", reward: Any = None,
               last_run: bool = False, single_run: bool = False) -> dict[str, Any]:
    """Convert a DanceGRPO / Flow-GRPO run (``src``) into the run directory ``out``; returns the summary.

    ``model``: the base model spec the run fine-tuned (e.g. ``sd3:stabilityai/stable-diffusion-3.5-medium``);
    ``log``: the history file (Flow-GRPO: W&B export or ``run-*.wandb``; DanceGRPO: ``reward.txt``,
    default ``src/reward.txt``); ``objective``: how the run was trained (``pcpo`` for a PCPO port);
    ``reward``: the reward it was trained on, as a train config names it (``hps``, ``ocr``, or a weighted
    mapping; :func:`pcpo_eval.rewards.parse_reward`), recorded in ``config.yaml`` so a study compares it
    with the other runs' (a log holds reward values, not what they measured); None: not recorded.
    DanceGRPO only: ``last_run`` reads the rewards after the last text / blank line of ``reward.txt``
    (:func:`dancegrpo_reward_lines`); ``single_run`` accepts more lines past the last checkpoint than
    one run writes (:func:`dancegrpo_append_problem`), for a run whose later checkpoints were left out."""
    if reward is not None:
        reward = parse_reward(reward)
        check_reward_names(reward)  # recorded for a study to compare: a typo would compare nothing
    if kind not in KINDS:
        raise UserError(f"unknown run kind {kind!r}; choose one of: {', '.join(KINDS)}")
    if kind != "dancegrpo" and (last_run or single_run):
        raise UserError(f"--{'last-run' if last_run else 'single-run'} is for DanceGRPO's reward.txt; "
                        "a Flow-GRPO W&B log holds one run")
    src, out = Path(src), Path(out)
    if not src.is_dir():
        raise UserError(f"{src} is not a directory; pass the reference run's output folder")
    if log_path(out).exists():
        raise UserError(f"{out} already holds a run; choose another --out")
    check_own_folder(out, (*RUN_ENTRIES, IMPORT_FILE), "an imported run's")  # not the source's or a user's folder
    remove_stale_temps(out)  # temp files of a killed import (not ones a live process holds)
    if kind == "flowgrpo":
        if log is None:
            found = sorted(src.glob("**/run-*.wandb"))
            if not found:
                raise UserError(f"no W&B log under {src}; pass --log with its history export or run-*.wandb file")
            log = found[-1]
        hist = read_history(log)
        table, cks = flowgrpo_epochs(hist, reward_key), flowgrpo_checkpoints(src, hist)
        lines = None
    else:
        log = log or src / "reward.txt"
        (table, lines), cks = dancegrpo_reward_lines(log, last_run), dancegrpo_checkpoints(src)
    if not cks:
        raise UserError(f"no {kind} checkpoints under {src} (expected "
                        + ("checkpoints/checkpoint-STEP/lora/" if kind == "flowgrpo" else
                           "checkpoint_epoch_E/ or checkpoint-STEP-EPOCH/ with diffusion_pytorch_model.safetensors") + ")")
    beyond = sorted(e for e in cks if e not in set(table["epoch"]))
    if beyond:
        raise UserError(f"checkpoints at epochs {beyond[:5]} have no logged reward (log covers epochs "
                        f"{int(table['epoch'].min())}..{int(table['epoch'].max())}); pass the full log")
    if kind == "dancegrpo" and not single_run and (problem := dancegrpo_append_problem(len(table), cks)):
        raise UserError(f"{log}: {problem}; {APPENDED}, so it likely holds more than one run (and a rerun in the same "
                        "folder overwrites checkpoint folders of the same name); pass --log with this run's lines only, "
                        "or --single-run if it is one run whose later checkpoints were left out of the source folder")
    for folder in cks.values():
        check_weights_file(folder / ("adapter_model.safetensors" if kind == "flowgrpo" else
                                     "diffusion_pytorch_model.safetensors"), FIX_SOURCE)
    check_model(kind, model, cks)
    out.mkdir(parents=True, exist_ok=True)
    rewards = dict(zip(table["epoch"].astype(int), table["reward_mean"].astype(float), strict=True))
    for epoch, folder in sorted(cks.items()):
        _write_checkpoint(out, epoch, folder, kind, model, rewards.get(epoch))
    summary = {"kind": kind, "source": str(src), "log": str(log), "model": model, "objective": objective,
               "epochs": int(table["epoch"].max()), "checkpoints": sorted(cks), "reward_key": reward_key,
               "reward": reward, **({"log_lines": list(lines), "last_run": last_run, "single_run": single_run}
                                    if lines is not None else {})}
    config = {"model": model, "objective": objective, **({"reward": reward} if reward is not None else {}),
              "imported_from": kind, "source": str(src)}
    atomic_write_text(config_path(out), json.dumps(config, indent=2) + "\n")
    atomic_write_text(out / IMPORT_FILE, json.dumps(summary, indent=2) + "\n")
    write_inputs(out, input_record({"model": model}))  # the one file-valued setting an import knows
    atomic_write_parquet(log_path(out), table)  # last: its presence marks a complete import
    return summary
