"""CUDA scenarios for tests/gpu/test_cuda.py: ``python tests/support/cuda_checks.py NAME OUT_DIR`` (exit 0 = passed).

Each scenario asserts on the GPU and prints one JSON line of what it measured (the test shows it).
They run in subprocesses because the test session itself hides the GPUs (tests/conftest.py).
"""

from __future__ import annotations

import json
import sys
from pathlib import Path

import numpy as np
import torch

ROOT = Path(__file__).resolve().parents[2]
sys.path.insert(0, str(ROOT))

from pcpo_eval.generate.png import read_png_pixels  # noqa: E402
from pcpo_eval.generate.runner import generate_set  # noqa: E402


def _pixels(out: Path) -> np.ndarray:
    return np.stack([read_png_pixels(f) for f in sorted(out.glob("images/*/*.png"))]).astype(np.int16)


def _set_json(out: Path) -> dict:
    return json.loads((out / "set.json").read_text())


def generate_precisions(tmp: Path) -> dict:
    """The toy model at each precision: recorded in set.json; fixed shapes repeat bitwise; bf16 near fp32."""
    got = {}
    for p in ("fp32", "tf32", "bf16", "fp16"):
        a, b = tmp / f"{p}_a", tmp / f"{p}_b"
        for out, bs in ((a, 4), (b, 16)):
            generate_set("toy", "toy", 8, out, batch_size=bs, steps=10, max_prompts=8, device=DEVICE, precision=p, micro_batch=16,
                         progress=False)
        s = _set_json(a)["settings"]
        assert s["precision"] == p and s["batch_invariance"] == "bitwise" and s["device"] == DEVICE, s
        assert np.array_equal(_pixels(a), _pixels(b)), f"{p}: batch sizes 4 and 16 differ at micro-batch 16"
        got[p] = _pixels(a)
    diff = {p: float(np.abs(got[p] - got["fp32"]).mean()) for p in ("tf32", "bf16", "fp16")}
    assert all(d < 8.0 for d in diff.values()), diff  # uint8 units; the toy images' pixel std is ~60
    return {"mean_abs_pixel_diff_vs_fp32": diff}


def generate_memory_micro_batch(tmp: Path) -> dict:
    """Default micro-batch and decode batch on CUDA come from free memory: identity 'tolerance'."""
    out = tmp / "auto"
    summary = generate_set("toy", "toy", 4, out, batch_size=8, steps=6, device=DEVICE, progress=False)
    s = _set_json(out)["settings"]
    assert s["batch_invariance"] == "tolerance" and s["precision"] == "bf16", s
    assert summary.settings.micro_batch >= 2
    decode_batch = _set_json(out)["run"]["decode_batch"]  # memory_decode_batch: at most one batch's images
    assert 1 <= decode_batch <= 8, decode_batch
    return {"micro_batch": summary.settings.micro_batch, "decode_batch": decode_batch}


def generate_sd1_tiny(tmp: Path) -> dict:
    """A real SD-1.x architecture (tiny random config) renders in bf16 with --channels-last, and with each
    attention backend."""
    from pcpo_eval.testing import tiny_sd1_adapter

    ad = tiny_sd1_adapter()
    for m in (ad.denoiser, ad.vae, ad.text_encoder):
        m.to(DEVICE, torch.bfloat16)
    out = tmp / "sd1"
    generate_set(ad, "toy", 2, out, batch_size=4, steps=5, max_prompts=4, device=DEVICE, channels_last=True, progress=False)
    assert _set_json(out)["settings"]["precision"] == "bf16"
    ad.denoiser.to(memory_format=torch.contiguous_format)
    # each forced attention backend (--attention) renders the same images within a few grey levels
    backends = ("math", "flash", "efficient", "cudnn") if DEVICE.startswith("cuda") else ("math", "flash")
    px, unsupported = {}, {}
    for b in backends:
        try:
            generate_set(ad, "toy", 2, tmp / b, batch_size=4, steps=5, max_prompts=4, device=DEVICE, attention=b,
                         micro_batch=8, progress=False)
        except RuntimeError as exc:  # a backend without a kernel for these shapes / dtype: reported, not failed
            if b == "math" or "kernel" not in str(exc).lower():
                raise
            unsupported[b] = str(exc).splitlines()[0][:200]
            continue
        assert _set_json(tmp / b)["settings"]["attention"] == b
        px[b] = _pixels(tmp / b)
    diff = {b: int(np.abs(v - px["math"]).max()) for b, v in px.items()}
    assert max(diff.values()) <= 8, diff
    return {"images": int(len(list(out.glob("images/*/*.png")))), "max_pixel_diff_vs_math": diff,
            "unsupported": unsupported}


def train_resume(tmp: Path) -> dict:
    """Two toy epochs on CUDA equal one epoch plus a resumed one (the CPU suite's resume check, on the GPU),
    with ``deterministic=true`` (the default fast kernels drift by ~1e-4 in reward, docs/gpu.md)."""
    import pandas as pd

    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    over = ["epochs=2", "lora_rank=2", "lora_alpha=2", f"device={DEVICE}", "log_to=none", "log_images_every=0",
            "deterministic=true"]
    cfg = load_config(ROOT / "train" / "configs" / "toy_pcpo.yaml", over)
    full = train(cfg, tmp / "full")
    train(load_config(ROOT / "train" / "configs" / "toy_pcpo.yaml", [*over[1:], "epochs=1"]), tmp / "part")
    resumed = train(cfg, tmp / "part", resume=True)
    a, b = full["reward_mean"].to_numpy(), resumed["reward_mean"].to_numpy()
    assert np.allclose(a, b, rtol=0, atol=1e-5), (a, b)
    log = pd.read_parquet(tmp / "part" / "log.parquet")
    assert list(log["epoch"]) == [1, 2]
    return {"bitwise": bool(np.array_equal(a, b)), "max_abs_reward_diff": float(np.abs(a - b).max())}


def train_mixed_precision(tmp: Path) -> dict:
    """fp16 autocast with GradScaler (loss_scale logged) and bf16 autocast train finite epochs on CUDA."""
    from pcpo_eval.testing import save_tiny_sd1
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    model = save_tiny_sd1(tmp / "sd1")
    got = {}
    for mp in ("fp16", "bf16"):
        cfg = load_config(ROOT / "train" / "configs" / "setup2_ddpo_aes.yaml", [
            f"model=sd1:{model}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=2",
            "sample_steps=4", "sample_batch_size=4", "sample_batches_per_epoch=1", "train_batch_size=2",
            "paper_total_batch=0", "log_to=none", "log_images_every=0", f"mixed_precision={mp}", f"device={DEVICE}",
        ])
        log = train(cfg, tmp / mp)
        assert np.isfinite(log["reward_mean"]).all() and np.isfinite(log["loss"]).all(), log
        if mp == "fp16":
            assert "loss_scale" in log and (log["loss_scale"] > 0).all()
        got[mp] = float(log["loss"].iloc[-1])
    return {"last_loss": got}


def train_tf32(tmp: Path) -> dict:
    """The trainer's epochs run under ``allow_tf32`` on CUDA (TF32 on for matmuls and cuDNN, or off for
    both), and the process's settings are restored after."""
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import Trainer, train

    seen: dict[str, list] = {}
    real = Trainer._run_epoch

    def spy(self, epoch, bar):
        seen.setdefault(str(self.cfg.allow_tf32), []).append(
            (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32))
        return real(self, epoch, bar)

    Trainer._run_epoch = spy
    before = (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32)
    for allow in (True, False):
        cfg = load_config(None, ["model=toy", "prompts=toy", "reward=jpeg_compressibility", "epochs=1",
                                 "sample_steps=4", "sample_batch_size=4", "train_batch_size=2", "lora_rank=2",
                                 "log_to=none", f"allow_tf32={allow}", f"device={DEVICE}"])
        train(cfg, tmp / f"tf32_{allow}")
    Trainer._run_epoch = real
    assert seen == {"True": [("high", True)], "False": [("highest", False)]}, seen
    assert (torch.get_float32_matmul_precision(), torch.backends.cudnn.allow_tf32) == before
    return {"epoch_settings": seen}


def train_reward_on_device(tmp: Path) -> dict:
    """A reward that runs a network (the toy classifier of ``toy_alignment``) is built on the trainer's
    device and scores there (rewards.options_on_device); the epoch's rewards are finite. With
    ``reward_overlap`` it scores in the ``reward`` thread, whose current GPU is the trainer's, and the
    rewards agree with scoring the epoch at once (per-image scores; other batch shapes: float rounding)."""
    import threading

    import pcpo_eval.toy.classifier as classifier
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    real, devices, calls = classifier.load_classifier, [], []

    def spy(weights_dir=None, device="cpu"):
        devices.append(str(device))
        model = real(weights_dir, device)
        forward = model.forward

        def recorded(*args, **kwargs):
            gpu = torch.cuda.current_device() if torch.cuda.is_available() else None
            calls.append((threading.current_thread().name, gpu))
            return forward(*args, **kwargs)

        model.forward = recorded
        return model

    classifier.load_classifier = spy
    logs = {}
    try:
        for overlap in (False, True):
            cfg = load_config(None, ["model=toy", "prompts=toy", "reward=toy_alignment", "epochs=1", "sample_steps=4",
                                     "sample_batch_size=4", "sample_batches_per_epoch=2", "train_batch_size=2",
                                     "gradient_updates=2", "lora_rank=2", "log_to=none", f"device={DEVICE}",
                                     f"reward_overlap={str(overlap).lower()}"])
            calls.clear()
            logs[overlap] = train(cfg, tmp / f"run_{overlap}")
            threads = {name.split("_")[0] for name, _ in calls}
            assert threads == ({"reward"} if overlap else {"MainThread"}), calls
    finally:
        classifier.load_classifier = real
    assert devices and all(torch.device(d).type == torch.device(DEVICE).type for d in devices), devices
    want = torch.device(DEVICE).index or 0 if torch.device(DEVICE).type == "cuda" else None
    assert all(gpu == want for _, gpu in calls), calls
    serial, overlapped = (float(logs[k]["reward_mean"].iloc[0]) for k in (False, True))
    assert np.isfinite(serial) and abs(serial - overlapped) < 1e-5, (serial, overlapped)
    return {"reward_built_on": devices, "reward_mean": serial, "reward_mean_overlap": overlapped,
            "overlap_thread_gpu": sorted({gpu for _, gpu in calls}, key=str)}


def step_syncs(tmp: Path) -> dict:
    """Host-device synchronisations of an epoch do not grow with its steps, so the host queues each network
    call while the GPU runs the last one: sampling (the per-step noise and schedule scalars,
    ``dist.to_device_async`` and ``samplers.ddim._bcast``) and the update (indices and schedule values of each
    micro-step). Counted with CUDA's sync debug mode over ``sample_epoch`` and ``train_epoch`` of the tiny
    SD-1.x (fp16 autocast + GradScaler) at 2 and at 6 steps, for DDPO (``ppo_clip``) and PCPO (its
    decomposition weights and credit scales are host-side per micro-step); what may synchronise is per batch
    or per optimizer step (prompt tokens, images to the reward, gradient norm, the scaler's inf check, the
    epoch's one transfer of statistics). Measured on an H200 (2026-11-27, ``ppo_clip`` only): sampling 4
    syncs at 2 steps and 3 at 6, update 12 at both: a count that falls is not growth, so the check is
    ``<=``."""
    import warnings

    from pcpo_eval.testing import save_tiny_sd1
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import Trainer

    model = save_tiny_sd1(tmp / "sd1")
    cuda = DEVICE.startswith("cuda")  # the cpu dry run counts nothing

    def syncs(fn):
        if cuda:
            torch.cuda.synchronize()
        with warnings.catch_warnings(record=True) as caught:
            warnings.simplefilter("always")
            if cuda:
                torch.cuda.set_sync_debug_mode("warn")
            try:
                value = fn()
            finally:
                if cuda:
                    torch.cuda.set_sync_debug_mode("default")
        return value, sum("synchroniz" in str(w.message) for w in caught)

    counts: dict[str, dict[str, dict[int, int]]] = {}
    for objective in ("ppo_clip", "pcpo"):
        c = counts[objective] = {"sample": {}, "update": {}}
        for steps in (2, 6):  # every sampled step is trained: micro-steps per micro-batch
            cfg = load_config(ROOT / "train" / "configs" / "setup2_ddpo_aes.yaml", [
                f"model=sd1:{model}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=1",
                f"objective={objective}", f"sample_steps={steps}", "sample_batch_size=4",
                "sample_batches_per_epoch=1", "train_batch_size=2", "paper_total_batch=0", "log_to=none",
                "log_images_every=0", "mixed_precision=fp16", f"device={DEVICE}",
            ])
            trainer = Trainer(cfg, tmp / f"{objective}{steps}", progress=False)
            samples = trainer.sample_epoch(1)
            trainer.train_epoch(1, samples)  # warm-up: lazy initialisations (the scaler's scale, AdamW state)
            samples, c["sample"][steps] = syncs(lambda: trainer.sample_epoch(2))  # noqa: B023
            _, c["update"][steps] = syncs(lambda: trainer.train_epoch(2, samples))  # noqa: B023
    for objective, by_phase in counts.items():
        for phase, c in by_phase.items():
            assert c[6] <= c[2], f"{objective} {phase}: synchronisations grow with the steps: {counts}"
    return {"syncs_per_epoch_by_steps": counts}


def dist_group(tmp: Path) -> dict:
    """The process group ``dist.init`` starts on CUDA (``dist.group_backend``: NCCL + gloo, bound to the
    rank's GPU) reduces host and device tensors and gathers objects: a one-process group here (two ranks
    on one GPU are refused by NCCL); the torchrun tests run the same calls with gloo on CPU."""
    import os

    import torch.distributed as tdist

    from pcpo_eval import dist

    os.environ.update(MASTER_ADDR="127.0.0.1", MASTER_PORT="29517", LOCAL_RANK="0")
    backend, dev = dist.group_backend(DEVICE)
    if dev is None:  # the cpu dry run
        tdist.init_process_group(backend, rank=0, world_size=1)
    else:
        torch.cuda.set_device(dev)
        tdist.init_process_group(backend, rank=0, world_size=1, device_id=dev)
    try:
        host = torch.arange(4, dtype=torch.float64)
        tdist.all_reduce(host)  # the metrics' FD sums
        device = torch.ones(3, device=dev or "cpu")
        tdist.all_reduce(device)  # the trainer's gradients
        out: list = [None]
        tdist.all_gather_object(out, {"rank": 0})  # rollout and metric gathers
        assert host.tolist() == [0.0, 1.0, 2.0, 3.0] and device.tolist() == [1.0] * 3 and out == [{"rank": 0}]
    finally:
        tdist.destroy_process_group()
    return {"backend": backend, "device": str(dev)}


def flow_models_bf16(tmp: Path) -> dict:
    """Real SD3 and FLUX architectures (tiny random configs) and an IRG model render in bf16 at the CUDA
    default: micro-batch and decode batch from free memory (velocity models and IRG in the probes)."""
    from pcpo_eval.generate.irg import IRGAdapter
    from pcpo_eval.models.flux import tiny_flux_adapter
    from pcpo_eval.models.sd3 import tiny_sd3_adapter
    from pcpo_eval.testing import tiny_sd1_adapter

    def on_device(ad):
        ad.pipe.to(DEVICE, torch.bfloat16)
        return ad

    models = {"sd3": on_device(tiny_sd3_adapter()), "flux": on_device(tiny_flux_adapter()),
              "irg": IRGAdapter(on_device(tiny_sd1_adapter()), [(on_device(tiny_sd1_adapter(seed=1)), 0.5)])}
    got = {}
    for name, ad in models.items():
        out = tmp / name
        generate_set(ad, "toy", 2, out, batch_size=4, steps=4, max_prompts=2, device=DEVICE, progress=False,
                     model_name=name)
        info = _set_json(out)
        px = _pixels(out)
        assert info["settings"]["precision"] == "bf16" and px.shape[0] == 4, info
        assert px.std() > 0, f"{name}: constant images"
        got[name] = {"micro_batch": info["settings"]["micro_batch"], "decode_batch": info["run"]["decode_batch"]}
    return got


def flow_train_bf16(tmp: Path) -> dict:
    """The toy flow model trains on CUDA under bf16 autocast with Flow-GRPO's SDE, a KL term and the paired
    control, with LoRA and as a full fine-tune (a frozen reference copy): finite losses, rewards and KLs."""
    from pcpo_eval.train.config import load_config
    from pcpo_eval.train.trainer import train

    got = {}
    for name, extra in (("lora", ["lora_rank=2", "lora_alpha=2"]), ("full", ["lora_rank=0", "learning_rate=1e-5"])):
        cfg = load_config(ROOT / "train" / "configs" / "toy_flow_pcpo.yaml", [
            "epochs=2", "sde=flowgrpo", "sample_eta=0.7", "beta_kl=0.04", "paired_control=true",
            "sample_batches_per_epoch=1", "mixed_precision=bf16", f"device={DEVICE}", "log_to=none",
            "log_images_every=0", *extra])
        log = train(cfg, tmp / name)
        for col in ("reward_mean", "control_reward_mean", "loss", "kl_ref"):
            assert np.isfinite(log[col]).all(), (name, col, log[col])
        got[name] = {"kl_ref": [float(v) for v in log["kl_ref"]], "reward": [float(v) for v in log["reward_mean"]]}
    return got


def metrics_on_cuda(tmp: Path) -> dict:
    """Toy metrics on CUDA equal the CPU values (rel 1e-3); the clean-fid resize on the GPU (`--fid-resize
    torch`) is within its documented tolerance of PIL's on 512-px images."""
    from pcpo_eval.features.base import TORCH_RESIZE_TOLERANCE, clean_resize, torch_clean_resize
    from pcpo_eval.metrics.extract import MetricsOptions
    from pcpo_eval.metrics.workers import compute_metrics

    for name, seeds in (("set", list(range(6))), ("ref", list(range(100, 106)))):
        generate_set("toy", "toy", seeds, tmp / name, batch_size=8, steps=4, max_prompts=4, device="cpu",
                     progress=False, micro_batch=16)
    values = {}
    for dev in ("cpu", DEVICE):
        opts = MetricsOptions(device=dev, batch_size=8, cache_dir=tmp / f"cache_{dev}")
        values[dev] = compute_metrics(tmp / "set", "fd_toy,is_toy,lpips_toy", tmp / "ref", opts).metrics
    for k, v in values["cpu"].items():
        assert abs(values[DEVICE][k] - v) <= 1e-3 * max(abs(v), 1e-6), (k, values)
    imgs = torch.from_numpy(np.random.default_rng(0).integers(0, 256, (4, 3, 512, 512), dtype=np.uint8))
    diff = float((torch_clean_resize(imgs, 299, DEVICE).cpu() - clean_resize(imgs, 299)).abs().max())
    assert diff <= TORCH_RESIZE_TOLERANCE, diff
    return {"metrics": values, "resize_max_abs_diff": diff}


def feature_numerics(tmp: Path) -> dict:
    """The real Inception architecture (random weights, BN stats set) on 512-px noise through PIL's resize:
    CUDA features at ``--precision fp32`` (TF32 off) within float32 rounding of the CPU's, and ``tf32``
    measured against them; each numerics keys its own feature cache directory."""
    from pcpo_eval.features import make_extractor
    from pcpo_eval.features.inception import TFInceptionTrunk
    from pcpo_eval.imageset import ImageSet
    from pcpo_eval.metrics.extract import MetricsOptions, extract_set
    from pcpo_eval.precision import matmul_precision

    torch.manual_seed(0)
    trunk = TFInceptionTrunk()
    with torch.no_grad():
        for name, buf in trunk.named_buffers():
            if name.endswith("running_var"):
                buf.copy_(torch.rand(buf.shape) + 0.5)
    weights = tmp / "pt_inception-2015-12-05-6726825d.pth"
    torch.save(trunk.state_dict(), weights)
    generate_set("toy", "toy", list(range(4)), tmp / "set", batch_size=8, steps=4, max_prompts=4, device="cpu",
                 progress=False, micro_batch=16)
    feats, dirs = {}, set()
    for dev, prec in (("cpu", "fp32"), (DEVICE, "fp32"), (DEVICE, "tf32")):
        opts = MetricsOptions(device=dev, batch_size=8, cache_dir=tmp / "cache", precision=prec)
        ext = make_extractor("inception", device=dev, weights_path=weights, resize="pil")
        with matmul_precision(prec):
            feats[f"{dev}-{prec}"] = extract_set(ImageSet.load(tmp / "set"), ext, opts)["features"]
        dirs |= {p.name for p in (tmp / "cache" / "features").iterdir()}
    ref = feats["cpu-fp32"]
    scale = float(np.abs(ref).max())
    rel = {k: float(np.abs(v - ref).max()) / scale for k, v in feats.items() if k != "cpu-fp32"}
    assert len(dirs) == 3, dirs  # cpu-fp32, cuda-fp32, cuda-tf32: three caches
    assert rel[f"{DEVICE}-fp32"] <= 1e-4, rel
    return {"max_abs_diff_over_max_abs_feature_vs_cpu": rel, "n_images": int(len(ref))}


#: ``cuda``; a third argument ``cpu`` dry-runs the scenarios' code paths (assertions on GPU facts may fail there).
DEVICE = sys.argv[3] if len(sys.argv) > 3 else "cuda"

SCENARIOS = {f.__name__: f for f in (generate_precisions, generate_memory_micro_batch, generate_sd1_tiny,
                                     train_resume, train_mixed_precision, step_syncs, dist_group,
                                     flow_models_bf16, flow_train_bf16, metrics_on_cuda,
                                     feature_numerics, train_tf32, train_reward_on_device)}

if __name__ == "__main__":
    name, tmp = sys.argv[1], Path(sys.argv[2])
    tmp.mkdir(parents=True, exist_ok=True)
    print(json.dumps({name: SCENARIOS[name](tmp)}), flush=True)
