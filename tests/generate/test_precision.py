"""`generate --precision`: an unknown name is one error line before any model loads; the set records it."""

from __future__ import annotations

import json

import pytest


def test_unknown_precision_is_refused_before_work(cli, tmp_path):
    out = tmp_path / "set"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", str(out), "--precision", "fp64")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == "error: unknown --precision 'fp64'; choose auto, fp32, tf32, bf16, fp16"
    assert not out.exists()


def test_precision_recorded_in_set_json(cli, tmp_path):
    out = tmp_path / "set"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2", "--steps", "2",
            "--out", str(out), "--precision", "bf16", "--device", "cpu", "--no-progress")
    assert r.returncode == 0, r.stderr
    settings = json.loads((out / "set.json").read_text())["settings"]
    assert settings["precision"] == "bf16" and settings["batch_invariance"] == "bitwise"
    r = cli("generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2", "--steps", "2",
            "--out", str(out), "--precision", "fp32", "--device", "cpu", "--no-progress")
    assert r.returncode == 2 and "precision='bf16'" in r.stderr  # another precision is another set


def test_unknown_or_unavailable_attention_is_refused_before_work(cli, tmp_path):
    out = tmp_path / "set"
    base = ["generate", "--model", "toy", "--prompts", "toy", "--seeds", "1", "--out", str(out), "--device", "cpu"]
    r = cli(*base, "--attention", "fastest")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: unknown --attention 'fastest'; choose auto, math, flash, "
                                                 "efficient, cudnn")
    r = cli(*base, "--attention", "efficient")
    assert r.returncode == 2
    assert r.stderr.strip().splitlines()[-1] == ("error: --attention efficient runs on CUDA only; on cpu choose "
                                                 "auto, math, flash")
    assert not out.exists()


def test_attention_backend_forces_one_sdpa_kernel_and_restores():
    import torch

    from pcpo_eval.precision import attention_backend

    before = (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled())
    with attention_backend("math"):
        assert torch.backends.cuda.math_sdp_enabled() and not torch.backends.cuda.flash_sdp_enabled()
    with attention_backend("flash"):
        assert torch.backends.cuda.flash_sdp_enabled() and not torch.backends.cuda.math_sdp_enabled()
    with attention_backend("auto"):
        assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before
    assert (torch.backends.cuda.flash_sdp_enabled(), torch.backends.cuda.math_sdp_enabled()) == before


def test_attention_recorded_in_identity_and_images_agree(tmp_path):
    """A real SD-1.x UNet (tiny, SDPA attention) rendered with math and with flash attention: each set records
    its backend, resuming with another is refused, the images agree to within a grey level, and a set.json
    written before the setting existed resumes as ``auto``."""
    import numpy as np
    import pytest

    from pcpo_eval.errors import UserError
    from pcpo_eval.generate.png import read_png_pixels
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.testing import tiny_sd1_adapter

    ad = tiny_sd1_adapter()
    pixels = {}
    for backend in ("math", "flash", "auto"):
        out = tmp_path / backend
        generate_set(ad, "toy", 2, out, batch_size=2, steps=3, max_prompts=2, attention=backend, progress=False)
        assert json.loads((out / "set.json").read_text())["settings"]["attention"] == backend
        pixels[backend] = np.stack([read_png_pixels(f) for f in sorted(out.glob("images/*/*.png"))]).astype(int)
    assert np.abs(pixels["math"] - pixels["flash"]).max() <= 1
    with pytest.raises(UserError, match="attention='math'"):
        generate_set(ad, "toy", 2, tmp_path / "math", batch_size=2, steps=3, max_prompts=2, attention="flash",
                     progress=False)
    legacy = tmp_path / "auto" / "set.json"
    meta = json.loads(legacy.read_text())
    del meta["settings"]["attention"]
    legacy.write_text(json.dumps(meta))
    generate_set(ad, "toy", [2, 3], tmp_path / "auto", batch_size=2, steps=3, max_prompts=2, progress=False)


_TF32_PROBE = """
import sys, torch
from pcpo_eval.precision import matmul_precision
{setup}
def read():
    return (torch.get_float32_matmul_precision(), torch.backends.cuda.matmul.allow_tf32, torch.backends.cudnn.allow_tf32)
for name, want in (("fp32", ("highest", False, False)), ("tf32", ("high", True, True)), ("bf16", ("highest", False, False))):
    with matmul_precision(name):
        assert read() == want, (name, read())
print(read())
"""


@pytest.mark.parametrize("setup", [
    "", "torch.set_float32_matmul_precision('high')", "torch.backends.cuda.matmul.allow_tf32 = True",
    "torch.backends.cuda.matmul.fp32_precision = 'tf32'",  # PyTorch's newer API: a state its own reader refuses
], ids=["pristine", "user-set-high", "user-legacy-flag", "user-new-api"])
def test_matmul_precision_leaves_readable_tf32_settings(setup):
    """Inside ``matmul_precision`` PyTorch can read its TF32 settings back whatever the caller set before
    (inductor reads ``get_float32_matmul_precision``; setting the legacy flag after a user's
    ``set_float32_matmul_precision`` made that read raise); the settings are what the precision says."""
    import subprocess
    import sys

    run = subprocess.run([sys.executable, "-c", _TF32_PROBE.format(setup=setup)], capture_output=True, text=True,
                         timeout=120)
    assert run.returncode == 0, run.stderr[-2000:]
