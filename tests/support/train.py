"""Training helpers shared by tests/train/ and tests/e2e/."""

from __future__ import annotations

import torch

#: A two-epoch toy training small enough for a unit test (LoRA rank 2, 4 sampler steps, 4 images).
TINY = dict(
    model="toy", prompts="toy", reward="jpeg_compressibility", epochs=2, sample_steps=4, cfg=3.0,
    sample_batch_size=4, sample_batches_per_epoch=1, train_batch_size=2, gradient_updates=1,
    learning_rate=3e-4, clip_range=1e-2, lora_rank=2, lora_alpha=2.0, checkpoint_every=1,
)


def tiny_lora_module() -> torch.nn.Module:
    """Two linear layers with a peft LoRA adapter injected, non-zero LoRA weights, seeded: the same
    tensors in every process (tests/repo/test_file_modes.py saves it from two interpreters)."""
    from peft import LoraConfig, inject_adapter_in_model

    torch.manual_seed(0)
    net = torch.nn.Sequential(torch.nn.Linear(4, 4), torch.nn.Linear(4, 2))
    cfg = LoraConfig(r=2, lora_alpha=4, target_modules=["0", "1"], init_lora_weights=False)
    return inject_adapter_in_model(cfg, net)
