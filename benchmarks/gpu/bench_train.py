"""GPU benchmark: seconds per training epoch of setup 2 (DDPO, SD-1.5 LoRA), setup 3 (the same with the
BERTScore reward) and setup 5 (DanceGRPO, SD-1.4 full).

The setup configs (``train/configs/setup{2,3,5}_*.yaml``) are trained as written except: the model
is a random-weight SD-1.x of the real size saved with ``save_pretrained`` and loaded through the
real ``sd1:DIR`` path, the reward is the weight-free ``jpeg_compressibility`` (setup 3: its own
``vlm_bertscore`` with random weights of the real sizes, ``models.random_vlm_bertscore``: Qwen2.5-VL-3B
captions of 64 tokens in bf16 and DeBERTa-xlarge's 40 layers, on the training GPU; its share is
``reward_s``, and setups 3 and 4 differ only in images per epoch), the prompts are
``simple_animals`` (setup 5's HPDv2 needs the dataset), an epoch holds ``--batches`` sampling
batches instead of the paper's 512 images (its time is scaled to 512 images: sampling and
training are both linear in images), and nothing is checkpointed or logged beyond log.parquet.
The median ``wall_time_s`` of epochs 2..``--epochs`` is reported (epoch 1 includes warm-up; one
epoch's time varied by ~10 % per phase between runs on an H200, so a PCPO/DDPO ratio wants several), for DDPO's ``ppo_clip`` and
for ``pcpo``, with peak GPU memory and the FLOP floor: images x steps x 2 CFG rows x UNet row x
(1 sampling + 2 LoRA / 3 full fine-tune for forward and backward) at 800 TFLOP/s.

``--tiny``: the tests' tiny SD-1.x on CPU (CI). Usage::

    python benchmarks/gpu/bench_train.py --setup 2 --batches 4 --json $OUT/train2.json
    python benchmarks/gpu/bench_train.py --setup 3 --batches 1 --runs ppo_clip --json $OUT/train3.json
    python benchmarks/gpu/bench_train.py --tiny
"""

from __future__ import annotations

import argparse
import json
import shutil
import sys
import time
from pathlib import Path

import pandas as pd
import torch

sys.path.insert(0, str(Path(__file__).resolve().parent))
from models import (  # noqa: E402
    ROOT,
    device_info,
    peak_gib,
    reset_peak,
    sd15_pipeline,
    sync,
    unet_flops_per_row,
    write_profile,
)

from pcpo_eval.io import scratch_dir  # noqa: E402
from pcpo_eval.train.config import load_config  # noqa: E402
from pcpo_eval.train.trainer import Trainer  # noqa: E402

SETUPS = {2: "setup2_ddpo_aes.yaml", 3: "setup3_ddpo_bert_half.yaml", 5: "setup5_dancegrpo_sd14.yaml"}


def reward_overrides(setup: int, tiny: bool) -> list[str]:
    """The benchmark's reward: weight-free JPEG compressibility, or for setup 3 its captioner + BERTScore
    with random weights of the real sizes (tiny configurations with ``tiny``), built on the training device."""
    if setup != 3:
        return ["reward=jpeg_compressibility"]
    return ["reward=models:random_vlm_bertscore",
            f"reward_options={{captioner: qwen25_vl, scorer: deberta, component: recall, tiny: {str(tiny).lower()}}}"]
PEAK_TFLOPS = 800.0  # H100/H200 dense bf16 measured on this workplace's machines (KINDS.md)


def save_model(tiny: bool, device: str) -> tuple[Path, float]:
    """A random-weight SD-1.x pipeline directory (fp16 files) and the UNet's FLOPs per row."""
    pipe = sd15_pipeline(tiny, device, torch.float16 if device == "cuda" else torch.float32)
    flops = unet_flops_per_row(pipe.unet, pipe.unet.config.cross_attention_dim)
    out = scratch_dir("bench_sd_") / "pipe"
    pipe.save_pretrained(str(out), safe_serialization=True)
    del pipe
    return out, flops


def run_setup(setup: int, model_dir: Path, objective: str, batches: int, device: str, tiny: bool,
              extra: tuple[str, ...] = (), profile: bool = False, epochs: int = 2) -> tuple[dict, dict | None]:
    """Train ``epochs`` epochs; the median seconds of epochs 2.. (sampling and update apart, each epoch's
    in ``epoch_s_each``), images, and peak memory; and the profiler's record (else None).

    ``extra``: more ``KEY=VALUE`` overrides (``deterministic=false``). ``profile``: one more epoch runs its
    update under ``torch.profiler`` (tables: :func:`models.write_profile`, which the caller runs after it has
    saved this row: building them from an SD-1.5 update's ~1 M events takes about a minute); epochs
    2..``epochs`` stay the timed ones.
    """
    timed, epochs = epochs, epochs + (1 if profile else 0)
    over = [f"model=sd1:{model_dir}", *reward_overrides(setup, tiny), "prompts=simple_animals", f"epochs={epochs}",
            f"sample_batches_per_epoch={batches}", "paper_total_batch=0", "checkpoint_every=1000",
            "log_to=none", "log_images_every=0", f"objective={objective}", f"device={device}", *extra]
    if tiny:
        over += ["sample_steps=4", "sample_batch_size=4", "train_batch_size=2"]
        if setup == 5:
            over += ["images_per_prompt=4"]
    cfg = load_config(ROOT / "train" / "configs" / SETUPS[setup], over)
    out = scratch_dir("bench_train_") / "run"
    reset_peak(device)
    trainer = Trainer(cfg, out, progress=False)
    trainer.save_checkpoint = lambda epoch, row: None  # untimed, but setup 5's last one is ~10 GB of disk writes
    prof = _profile_epoch(trainer, epochs) if profile else None
    log = trainer.run()
    peak = peak_gib(device)
    rows = log.iloc[1:timed]
    row = rows[["wall_time_s", "sample_time_s", "reward_time_s"]].median()
    if prof:
        prof["title"] = f"setup {setup} {objective} {' '.join(extra)}: update phase of epoch {prof['epoch']} (profiled)"
    images = cfg.sample_batch_size * cfg.sample_batches_per_epoch
    shutil.rmtree(out.parent, ignore_errors=True)
    print(f"setup {setup} {objective} {' '.join(extra)}: {images} images, epoch (median of "
          f"{len(rows)}) {row['wall_time_s']:.2f} s "
          f"(sampling {row['sample_time_s']:.2f} s, of which reward {row['reward_time_s']:.2f} s), peak {peak} GiB",
          flush=True)  # before the table, if cut short
    return {"objective": objective, "options": " ".join(extra), "images": images, "steps": cfg.sample_steps,
            "lora_rank": cfg.lora_rank, "mixed_precision": cfg.mixed_precision, "epoch_s": float(row["wall_time_s"]),
            "sample_s": float(row["sample_time_s"]), "reward_s": float(row["reward_time_s"]),  # part of sample_s
            "update_s": float(row["wall_time_s"] - row["sample_time_s"]),  # the medians' difference
            "epoch_s_each": [float(v) for v in rows["wall_time_s"]],
            "sample_s_each": [float(v) for v in rows["sample_time_s"]],
            "peak_gib": peak, "timestep_fraction": cfg.timestep_fraction, "train_last_step": cfg.train_last_step,
            "update_device_busy": None}, prof


def _profile_epoch(trainer: Trainer, epoch: int) -> dict:
    """Wrap ``trainer.train_epoch`` so that ``epoch``'s update runs under ``torch.profiler``; the returned
    dict receives the profiler and the update's wall time (tables are built later, outside any timing)."""
    from torch.profiler import ProfilerActivity, profile

    inner, found = trainer.train_epoch, {}

    def wrapped(e, samples):
        if e != epoch:
            return inner(e, samples)
        acts = [ProfilerActivity.CPU] + ([ProfilerActivity.CUDA] if torch.cuda.is_available() else [])
        sync(str(trainer.device))
        t0 = time.perf_counter()
        with profile(activities=acts) as prof:
            row = inner(e, samples)
            sync(str(trainer.device))
        found.update(prof=prof, wall_s=time.perf_counter() - t0, epoch=e)
        return row

    trainer.train_epoch = wrapped
    return found


def floor_s(r: dict, flops_row: float, images: int, phase: str = "epoch") -> float:
    """FLOP floor of ``phase`` (``sample``, ``update`` or the whole ``epoch``) for ``images`` at
    PEAK_TFLOPS (see module docstring)."""
    trained = r["steps"] * r["timestep_fraction"] - (0 if r["train_last_step"] else 1)
    passes = {"sample": r["steps"], "update": trained * (2 if r["lora_rank"] else 3)}
    passes["epoch"] = passes["sample"] + passes["update"]
    return images * 2 * flops_row * passes[phase] / (PEAK_TFLOPS * 1e12)


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true")
    ap.add_argument("--setup", type=int, action="append", choices=sorted(SETUPS), help="default: 2 and 5")
    ap.add_argument("--batches", type=int, default=2, help="sampling batches per epoch (paper: 512 images)")
    ap.add_argument("--runs", default="ppo_clip;pcpo",
                    help="';'-separated runs per setup, each OBJECTIVE[:KEY=VALUE,...] (e.g. ppo_clip:deterministic=false)")
    ap.add_argument("--epochs", type=int, default=2, help="train this many epochs; report the median of 2..")
    ap.add_argument("--profile", type=Path, default=None, help="torch.profiler tables of each setup's first run here")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    device = "cpu" if a.tiny or not torch.cuda.is_available() else "cuda"
    model_dir, flops_row = save_model(a.tiny, device)
    res: dict = {"device": device_info(), "unet_flops_per_row_G": flops_row / 1e9, "setups": {}}
    runs = [(r.split(":")[0], tuple(r.split(":")[1].split(",")) if ":" in r else ()) for r in a.runs.split(";") if r]
    for setup in a.setup or (2, 5):
        todo = runs[:1] if a.tiny and setup != 2 else runs  # CI time
        profile = a.profile if not (a.tiny and setup != 2) else None  # CI time: the profiler path runs once
        rows, errors = [], []
        for i, (o, extra) in enumerate(todo):
            try:  # a run that fails (out of GPU memory at a large forward) leaves the others' rows
                row, prof = run_setup(setup, model_dir, o, a.batches, device, a.tiny, extra,
                                      profile is not None and i == 0, a.epochs)
                rows.append(_with_floor(row, flops_row))
                if prof:  # the row is saved first: the tables take a minute at SD-1.5's size
                    _write(a.json, {**res, "setups": {**res["setups"], setup: rows}, "complete": False})
                    row["update_device_busy"] = write_profile(prof["prof"], prof["wall_s"], profile, prof["title"])
            except Exception as exc:  # noqa: BLE001 - reported, and the exit status says so
                print(f"setup {setup} {o} {' '.join(extra)}: error {type(exc).__name__}: {exc}"[:500], flush=True)
                errors.append({"objective": o, "options": " ".join(extra), "error": f"{type(exc).__name__}: {exc}"[:500]})
                torch.cuda.empty_cache() if torch.cuda.is_available() else None
            _write(a.json, {**res, "setups": {**res["setups"], setup: rows}, "complete": False})
        if errors:
            res.setdefault("errors", {})[setup] = errors
        by = {(r["objective"], r["options"]): r for r in rows}
        for opts in dict.fromkeys(r["options"] for r in rows):  # PCPO / DDPO epoch time at equal options
            if ("pcpo", opts) in by and ("ppo_clip", opts) in by:
                res.setdefault("pcpo_over_ddpo", {}).setdefault(setup, {})[opts or "default"] = (
                    by[("pcpo", opts)]["epoch_s"] / by[("ppo_clip", opts)]["epoch_s"])
        res["setups"][setup] = rows
        cols = ["objective", "options", "images", "epoch_s", "sample_s", "reward_s", "update_s", "peak_gib", "ratio_to_floor",
                "sample_floor_ratio", "update_floor_ratio"]
        if rows:
            print(pd.DataFrame(rows)[cols].to_string(index=False), flush=True)
    print(json.dumps({k: v for k, v in res.items() if k != "setups"}), flush=True)
    shutil.rmtree(model_dir.parent, ignore_errors=True)
    _write(a.json, {**res, "complete": True})
    if "errors" in res:
        raise SystemExit(1)


def _with_floor(r: dict, flops_row: float) -> dict:
    """``r`` with its epoch scaled to 512 images and its ratios to the FLOP floor (whole epoch, sampling, update)."""
    r["epoch_s_at_512"] = r["epoch_s"] * 512 / r["images"]
    r["floor_s_at_512"] = floor_s(r, flops_row, 512)
    r["ratio_to_floor"] = r["epoch_s_at_512"] / r["floor_s_at_512"]
    r["sample_floor_ratio"] = r["sample_s"] * 512 / r["images"] / floor_s(r, flops_row, 512, "sample")
    r["update_floor_ratio"] = r["update_s"] * 512 / r["images"] / floor_s(r, flops_row, 512, "update")
    return r


def _write(path: Path | None, res: dict) -> None:
    """The JSON so far (rewritten after every run, so a stage cut short by its time limit keeps its rows)."""
    if path is not None:
        path.parent.mkdir(parents=True, exist_ok=True)
        path.write_text(json.dumps(res, indent=1))


if __name__ == "__main__":
    main()
