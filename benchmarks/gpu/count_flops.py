"""FLOP counts behind docs/gpu.md's reading of the setup-2 gap (CPU; no timing, no GPU needed).

1. One SD-1.5 UNet row (512 px, random weights of the real architecture, ``models.SD15_UNET``) by
   op, with ``torch.utils.flop_counter.FlopCounterMode``: how much of it is convolution (what cuDNN's
   autotuner, ``bench_generate.py --variants cudnn_benchmark``, could speed up). On a CPU the
   attention kernel is not counted (its CPU op has no FLOP formula), so the total here is below the
   803 GFLOP counted on a GPU.
2. One setup-2 epoch of the tiny SD-1.x (``bench_train.py``'s tiny overrides: 8 images, 4 steps) for
   ``ppo_clip`` and ``pcpo``: the FLOPs of sampling and of the update against ``bench_train.floor_s``'s
   formula, so a gap in seconds on the GPU is kernel efficiency, not extra work.
3. ``--ops``: host-side work of setup 2 with the real SD-1.5 architecture (LoRA r4; 64 px so a CPU runs
   it: the op sequence does not depend on the resolution) under bf16 autocast on the CPU: top-level aten
   ops (each one dispatch from Python, on a GPU about one kernel launch) per sampling step, per update
   forward (``train_batch_size`` samples x ``train_steps_per_forward`` steps, forward + backward) and per
   trained (sample, step), with ``torch.profiler``; and the update's unprofiled CPU time per trained
   (sample, step), where the 64-px network leaves the host's share large, as a GPU does. At a few
   microseconds of host time per op, this says how much of an update micro-step the host alone needs,
   whatever the GPU. CPU autocast casts the same op classes as CUDA's (linear, conv, matmul), so the
   count is close to, not equal to, the CUDA one.

4. The weights setups 3-4's reward adds to the training GPU: parameters of the published Qwen2.5-VL-3B-Instruct
   and DeBERTa-xlarge-MNLI configurations (``models.py``), built on PyTorch's meta device (no memory, no
   time), and their bytes in the dtypes the reward holds them in (captioner bf16 on CUDA, scorer float32
   with bert-score's 40 of 48 layers).

Usage::

    python benchmarks/gpu/count_flops.py [--tiny] [--ops] [--json OUT.json]

``--tiny``: the tiny UNet for parts 1 and 3 (CI).
"""

from __future__ import annotations

import argparse
import json
import sys
import time
from pathlib import Path

import torch
from torch.utils.flop_counter import FlopCounterMode

sys.path.insert(0, str(Path(__file__).resolve().parent))
import bench_train  # noqa: E402
from models import ROOT, SD15_UNET  # noqa: E402

from pcpo_eval.io import scratch_dir  # noqa: E402
from pcpo_eval.train.config import load_config  # noqa: E402
from pcpo_eval.train.trainer import Trainer  # noqa: E402


def unet_flops_by_op(tiny: bool) -> dict[str, float]:
    """GFLOP of one UNet row (one latent, one 77-token condition) per aten op, and the total."""
    from diffusers import UNet2DConditionModel

    from pcpo_eval.testing import tiny_sd1_components

    torch.manual_seed(0)
    unet = tiny_sd1_components(0)["unet"] if tiny else UNet2DConditionModel(**SD15_UNET)
    c, s = unet.config.in_channels, unet.config.sample_size
    x, h = torch.zeros(1, c, s, s), torch.zeros(1, 77, unet.config.cross_attention_dim)
    with torch.inference_mode(), FlopCounterMode(display=False) as counter:
        unet.eval()(x, torch.tensor([500]), encoder_hidden_states=h)
    ops = {str(op): f / 1e9 for op, f in counter.get_flop_counts()["Global"].items()}
    return {**dict(sorted(ops.items(), key=lambda kv: -kv[1])), "total": counter.get_total_flops() / 1e9}


def epoch_flops(objective: str, model_dir: Path, flops_row: float) -> dict[str, float]:
    """GFLOP of one tiny setup-2 epoch's sampling and update, and the floor formula's for each."""
    over = [f"model=sd1:{model_dir}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=1",
            "sample_batches_per_epoch=2", "paper_total_batch=0", "checkpoint_every=1000", "log_to=none",
            "log_images_every=0", f"objective={objective}", "device=cpu", "sample_steps=4", "sample_batch_size=4",
            "train_batch_size=2"]
    cfg = load_config(ROOT / "train" / "configs" / bench_train.SETUPS[2], over)
    trainer = Trainer(cfg, scratch_dir("count_flops_") / "run", progress=False)
    counted: dict[str, float] = {}
    for phase, name in (("sample", "sample_epoch"), ("update", "train_epoch")):
        inner = getattr(trainer, name)

        def counting(*a, _inner=inner, _phase=phase, **k):
            with FlopCounterMode(display=False) as counter:
                out = _inner(*a, **k)
            counted[_phase] = counter.get_total_flops() / 1e9
            return out

        setattr(trainer, name, counting)
    trainer.run()
    r = {"steps": cfg.sample_steps, "timestep_fraction": cfg.timestep_fraction,
         "train_last_step": cfg.train_last_step, "lora_rank": cfg.lora_rank}
    images = cfg.sample_batch_size * cfg.sample_batches_per_epoch
    floor = {p: bench_train.floor_s(r, flops_row, images, p) * bench_train.PEAK_TFLOPS * 1e3 for p in counted}
    return {**{f"{p}_G": v for p, v in counted.items()}, **{f"{p}_floor_G": v for p, v in floor.items()}}


def host_ops(objective: str, model_dir: Path, *extra: str) -> dict[str, float]:
    """Top-level aten ops per sampling step and per update micro-step of setup 2 (module docstring, part 3);
    the epoch is sampled and trained once unprofiled first (lazy initialisations)."""
    from torch.profiler import ProfilerActivity, profile

    over = [f"model=sd1:{model_dir}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=1",
            "sample_batches_per_epoch=1", "paper_total_batch=0", "checkpoint_every=1000", "log_to=none",
            "log_images_every=0", f"objective={objective}", "device=cpu", "sample_steps=4", "mixed_precision=bf16",
            *extra]
    cfg = load_config(ROOT / "train" / "configs" / bench_train.SETUPS[2], over)
    trainer = Trainer(cfg, scratch_dir("count_ops_") / "run", progress=False)
    samples = trainer.sample_epoch(1)
    trainer.train_epoch(1, samples)

    def counts(fn) -> tuple[int, int]:
        """Top-level aten ops, and dtype copies (``aten::_to_copy``: autocast's weight casts among them)."""
        with profile(activities=[ProfilerActivity.CPU]) as prof:
            fn()
        events = [e for e in prof.events() if e.name.startswith("aten::")]
        top = sum(1 for e in events if e.cpu_parent is None or not e.cpu_parent.name.startswith("aten::"))
        return top, sum(1 for e in events if e.name == "aten::_to_copy")

    per_forward = cfg.train_steps_per_forward
    micro = cfg.sample_batch_size // cfg.train_batch_size * -(-cfg.sample_steps // per_forward)  # forward calls
    trained = cfg.sample_batch_size * cfg.sample_steps  # (sample, step) pairs the update trains
    (sample, sample_copies), (update, update_copies) = (counts(lambda: trainer.sample_epoch(2)),
                                                        counts(lambda: trainer.train_epoch(2, samples)))
    t0 = time.perf_counter()
    trainer.train_epoch(3, samples)  # unprofiled: the update's CPU seconds
    update_s = time.perf_counter() - t0
    return {"sample_ops_per_step": sample / cfg.sample_steps, "sample_copies_per_step": sample_copies / cfg.sample_steps,
            "update_ops_per_micro_step": update / micro, "update_copies_per_micro_step": update_copies / micro,
            "update_ops_per_trained_step": update / trained, "update_cpu_s_per_trained_step": update_s / trained,
            "train_batch_size": cfg.train_batch_size, "steps_per_forward": per_forward, "micro_steps": micro}


def reward_weights() -> dict[str, float]:
    """Part 4: parameters (billions) and GiB of ``vlm_bertscore``'s captioner and scorer at the real sizes."""
    from models import DEBERTA_XLARGE_MNLI, QWEN25_VL_3B_TEXT, QWEN25_VL_3B_VISION, QWEN25_VL_PIXELS
    from transformers import DebertaConfig, DebertaModel

    from pcpo_eval.rewards.bertscore import SCORERS
    from pcpo_eval.testing import qwen25_vl

    cap, _ = qwen25_vl(QWEN25_VL_3B_TEXT, QWEN25_VL_3B_VISION, QWEN25_VL_PIXELS, device="meta", dtype=torch.bfloat16)
    with torch.device("meta"):
        scorer = DebertaModel(DebertaConfig(**DEBERTA_XLARGE_MNLI))
    scorer.encoder.layer = scorer.encoder.layer[:SCORERS["deberta"][1]]
    n_cap, n_score = (sum(p.numel() for p in m.parameters()) for m in (cap, scorer))
    return {"captioner_params_B": n_cap / 1e9, "captioner_bf16_gib": 2 * n_cap / 2**30,
            "scorer_params_B": n_score / 1e9, "scorer_fp32_gib": 4 * n_score / 2**30}


def main() -> None:
    ap = argparse.ArgumentParser(description=__doc__.split("\n")[0])
    ap.add_argument("--tiny", action="store_true", help="the tiny UNet for the op split (CI)")
    ap.add_argument("--ops", action="store_true", help="also part 3: host ops per sampling step / update micro-step")
    ap.add_argument("--json", type=Path, default=None)
    a = ap.parse_args()
    ops = unet_flops_by_op(a.tiny)
    conv = ops.get("aten.convolution", 0.0)
    print(f"UNet row ({'tiny' if a.tiny else 'SD-1.5, 512 px'}): {ops['total']:.1f} GFLOP counted on CPU, "
          f"convolutions {conv:.1f} ({100 * conv / ops['total']:.0f}%)", flush=True)
    model_dir, flops_row = bench_train.save_model(True, "cpu")
    epochs = {obj: epoch_flops(obj, model_dir, flops_row) for obj in ("ppo_clip", "pcpo")}
    for obj, e in epochs.items():
        print(f"tiny setup-2 epoch, {obj}: sampling {e['sample_G']:.2f} GFLOP (floor {e['sample_floor_G']:.2f}), "
              f"update {e['update_G']:.2f} (floor {e['update_floor_G']:.2f})", flush=True)
    res = {"unet_row_by_op_G": ops, "tiny_setup2_epoch": epochs, "setup3_reward_weights": reward_weights()}
    w = res["setup3_reward_weights"]
    print(f"setup 3-4 reward weights: captioner {w['captioner_params_B']:.3f} B parameters ({w['captioner_bf16_gib']:.2f} "
          f"GiB bf16), scorer {w['scorer_params_B']:.3f} B ({w['scorer_fp32_gib']:.2f} GiB float32)", flush=True)
    if a.ops:
        ops_dir = model_dir if a.tiny else _sd15_small(scratch_dir("count_ops_sd15_"))
        runs = {"ppo_clip": ("ppo_clip",), "pcpo": ("pcpo",),
                "ppo_clip frozen_weights=autocast": ("ppo_clip", "frozen_weights=autocast"),
                "ppo_clip train_steps_per_forward=4": ("ppo_clip", "train_steps_per_forward=4"),
                "pcpo train_steps_per_forward=4": ("pcpo", "train_steps_per_forward=4")}
        res["setup2_host_ops"] = {name: host_ops(obj, ops_dir, *extra) for name, (obj, *extra) in runs.items()}
        for obj, h in res["setup2_host_ops"].items():
            print(f"setup-2 host ops ({'tiny' if a.tiny else 'SD-1.5 architecture'}), {obj}: "
                  f"{h['sample_ops_per_step']:.0f} per sampling step ({h['sample_copies_per_step']:.0f} dtype copies), "
                  f"{h['update_ops_per_micro_step']:.0f} per update forward of {h['train_batch_size']} samples x "
                  f"{h['steps_per_forward']} steps ({h['update_copies_per_micro_step']:.0f} dtype copies), "
                  f"{h['update_ops_per_trained_step']:.0f} per trained sample-step, update "
                  f"{1e3 * h['update_cpu_s_per_trained_step']:.1f} ms per trained sample-step here", flush=True)
    if a.json:
        a.json.write_text(json.dumps(res, indent=1))


def _sd15_small(out: Path) -> Path:
    """The real SD-1.5 pipeline architecture (random weights) at 64 px, saved for ``sd1:DIR``."""
    from models import sd15_pipeline

    pipe = sd15_pipeline(False, "cpu", torch.float32)
    pipe.unet.register_to_config(sample_size=8)
    pipe.save_pretrained(str(out), safe_serialization=True)
    return out


if __name__ == "__main__":
    main()
