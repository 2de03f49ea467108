"""`compile: true`: the denoiser compiled in place trains the same run as eager, within tolerance.

Dynamo runs with the ``aot_eager`` backend on CPU (graph capture, the in-place ``nn.Module.compile``,
LoRA switches for the paired control, checkpoints and resume are ours to test; inductor's code
generation is timed on a GPU, ``benchmarks/gpu/bench_train.py --runs "ppo_clip;ppo_clip:compile=true"``).
"""

from __future__ import annotations

import numpy as np
import torch
from safetensors.torch import load_file

from pcpo_eval.testing import save_tiny_sd1
from pcpo_eval.train import checkpoints as ck
from pcpo_eval.train.config import load_config
from pcpo_eval.train.trainer import Trainer, train


def test_compiled_denoiser_trains_like_eager_and_checkpoints_the_same_keys(tmp_path, aot_eager):
    model = save_tiny_sd1(tmp_path / "sd1")
    over = [f"model=sd1:{model}", "reward=jpeg_compressibility", "prompts=simple_animals", "epochs=2",
            "sample_steps=3", "sample_batch_size=2", "sample_batches_per_epoch=1", "train_batch_size=1",
            "paper_total_batch=0", "log_to=none", "log_images_every=0", "mixed_precision=no", "device=cpu",
            "paired_control=true", "learning_rate=0.01"]
    setup = "train/configs/setup2_ddpo_aes.yaml"
    eager = train(load_config(setup, over), tmp_path / "eager")
    from torch._dynamo.utils import counters

    counters.clear()
    compiled = train(load_config(setup, [*over, "compile=true"]), tmp_path / "compiled")
    # static shapes, one graph per (shape, grad mode, LoRA trainable): well under dynamo's recompile limit,
    # past which the denoiser would silently run eager
    assert 2 <= counters["stats"]["unique_graphs"] < torch._dynamo.config.recompile_limit
    for col in ("reward_mean", "control_reward_mean", "loss", "grad_norm"):
        assert np.allclose(eager[col], compiled[col], rtol=1e-4, atol=1e-6), col
    assert eager["reward_mean"].iloc[-1] != eager["control_reward_mean"].iloc[-1]  # the LoRA switch took effect
    a, b = (load_file(str(ck.list_checkpoints(tmp_path / run)[-1] / ck.LORA_FILE)) for run in ("eager", "compiled"))
    assert a.keys() == b.keys() and all(torch.allclose(a[k], b[k], atol=1e-5) for k in a)
    trainer = Trainer(load_config(setup, [*over, "compile=true", "epochs=3"]), tmp_path / "compiled", resume=True)
    assert trainer.start_epoch == 3 and trainer.adapter.denoiser._compiled_call_impl is not None
