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


# ---- --attention forces the denoiser's backend only; a backend without a kernel for it is refused up front ----

_SDPA_FLAGS = ("flash", "efficient", "math", "cudnn")


def _enabled_sdpa():
    import torch

    cuda = torch.backends.cuda
    return frozenset(n for n, on in zip(_SDPA_FLAGS, (cuda.flash_sdp_enabled(), cuda.mem_efficient_sdp_enabled(),
                                                       cuda.math_sdp_enabled(), cuda.cudnn_sdp_enabled()),
                                        strict=True) if on)


def _emulate_flash_head_dim_limit(monkeypatch, limit: int) -> list:
    """Make ``scaled_dot_product_attention`` behave on this CPU as CUDA's dispatcher does for a call flash attention
    cannot take when only flash is enabled (``sdpa_kernel([FLASH_ATTENTION])``): PyTorch's warnings in its order
    (sdp_utils.cpp ``select_sdp_backend``), then ``No available kernel``, for head dims above ``limit`` (256 on
    CUDA). Returns the list that records (component, head dim, enabled backends) of every call."""
    import warnings

    import torch

    real = torch.nn.functional.scaled_dot_product_attention
    calls: list = []

    def sdpa(query, key, value, *args, **kwargs):
        on, head_dim = _enabled_sdpa(), int(query.shape[-1])
        calls.append((_PHASE[-1] if _PHASE else "other", head_dim, on))
        if on == {"flash"} and head_dim > limit:
            for header, why in (("Memory efficient kernel not used because:", "Memory Efficient attention has been "
                                 "runtime disabled."),
                                ("Flash attention kernel not used because:", "Flash attention requires q,k,v to have "
                                 f"the same last dimension and to be less than or equal to {limit}. Got Query.size(-1):"
                                 f" {head_dim}, Key.size(-1): {head_dim}, Value.size(-1): {head_dim} instead."),
                                ("cuDNN attention kernel not used because:", "cuDNN attention has been runtime "
                                 "disabled.")):
                warnings.warn(header, UserWarning, stacklevel=2)
                warnings.warn(why, UserWarning, stacklevel=2)
            raise RuntimeError("No available kernel. Aborting execution.")
        return real(query, key, value, *args, **kwargs)

    monkeypatch.setattr(torch.nn.functional, "scaled_dot_product_attention", sdpa)
    return calls


_PHASE: list[str] = []


def _label_components(monkeypatch, ad) -> None:
    """Name the component running while each attention call happens (denoiser, text encoder, VAE decode)."""
    for name, module, method in (("denoiser", ad.denoiser, "forward"), ("text_encoder", ad.text_encoder, "forward"),
                                 ("vae_decode", ad.vae, "decode")):
        inner = getattr(module, method)

        def labelled(*args, _inner=inner, _name=name, **kwargs):
            _PHASE.append(_name)
            try:
                return _inner(*args, **kwargs)
            finally:
                _PHASE.pop()

        monkeypatch.setattr(module, method, labelled)


def _wide_head_vae():
    """A tiny SD-1.x VAE whose mid-block attention is one head of 288 channels: wider than flash and cuDNN's 256,
    like SD-1.x/SD3/FLUX's VAE (one head of 512)."""
    import torch
    from diffusers import AutoencoderKL

    torch.manual_seed(1)
    return AutoencoderKL(block_out_channels=[32, 288], in_channels=3, out_channels=3, latent_channels=4, sample_size=16,
                         down_block_types=["DownEncoderBlock2D", "DownEncoderBlock2D"],
                         up_block_types=["UpDecoderBlock2D", "UpDecoderBlock2D"], norm_num_groups=32).eval()


def test_forced_attention_runs_the_denoiser_only_and_spares_a_wide_vae(tmp_path, monkeypatch):
    """``--attention flash`` forces flash on the denoiser's calls (its memory probe's and the sampler's) and on
    nothing else: the text encoder and the VAE decode run with PyTorch's choice, so a VAE head of 288 channels,
    which flash cannot take on CUDA (emulated here), decodes; the set records ``flash``."""
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.testing import tiny_sd1_adapter

    ad = tiny_sd1_adapter()
    ad.vae = _wide_head_vae()
    calls = _emulate_flash_head_dim_limit(monkeypatch, limit=256)
    _label_components(monkeypatch, ad)
    default = _enabled_sdpa()
    out = tmp_path / "set"
    generate_set(ad, "toy", 2, out, batch_size=2, steps=2, max_prompts=2, attention="flash", progress=False)
    assert json.loads((out / "set.json").read_text())["settings"]["attention"] == "flash"
    assert len(list(out.glob("images/*/*.png"))) == 4
    seen = {(phase, head_dim, on) for phase, head_dim, on in calls}
    assert {p for p, _, _ in seen} == {"denoiser", "text_encoder", "vae_decode"}, seen
    assert all(on == {"flash"} for p, _, on in seen if p == "denoiser")
    assert all(on == default for p, _, on in seen if p != "denoiser")
    assert ("vae_decode", 288, default) in seen
    assert _enabled_sdpa() == default  # restored after the set


def test_forced_attention_without_a_kernel_for_the_denoiser_is_one_error_line_before_work(cli, tmp_path, monkeypatch):
    """A backend that cannot take the denoiser's own heads (emulated: flash refusing the tiny UNet's head dim 8)
    fails before anything is written with one ``error:`` line that gives PyTorch's reason for that backend, not
    the other backends' ("runtime disabled"), and exit code 2."""
    import pytest

    from pcpo_eval.errors import UserError
    from pcpo_eval.generate.runner import generate_set
    from pcpo_eval.precision import AttentionBackendError
    from pcpo_eval.testing import save_tiny_sd1, tiny_sd1_adapter

    _emulate_flash_head_dim_limit(monkeypatch, limit=4)
    out = tmp_path / "set"
    with pytest.raises(AttentionBackendError) as info:
        generate_set(tiny_sd1_adapter(), "toy", 2, out, batch_size=2, steps=2, max_prompts=2, attention="flash",
                     progress=False)
    assert isinstance(info.value, UserError) and isinstance(info.value, RuntimeError)
    assert not out.exists()
    model = save_tiny_sd1(tmp_path / "tiny")
    r = cli("generate", "--model", f"sd1:{model}", "--prompts", "toy", "--seeds", "1", "--max-prompts", "2",
            "--steps", "2", "--out", str(out), "--device", "cpu", "--attention", "flash", "--no-progress")
    assert r.returncode == 2, r.stderr
    last = r.stderr.strip().splitlines()[-1]
    assert last == ("error: --attention flash: PyTorch has no flash kernel for this model's denoiser attention on this "
                    "device (Flash attention requires q,k,v to have the same last dimension and to be less than or "
                    "equal to 4. Got Query.size(-1): 8, Key.size(-1): 8, Value.size(-1): 8 instead.); use --attention "
                    "auto (PyTorch's choice per call) or math (takes any shape)"), last
    assert not out.exists()
    # math takes any shape: not probed, and the set renders
    generate_set(tiny_sd1_adapter(), "toy", 2, out, batch_size=2, steps=2, max_prompts=2, attention="math",
                 progress=False)
    assert json.loads((out / "set.json").read_text())["settings"]["attention"] == "math"


def test_check_attention_backend_passes_other_errors_and_warnings_through():
    """Only PyTorch's ``No available kernel`` becomes the one-line error; any other error propagates as it was,
    and a backend that works shows the probe's warnings as usual."""
    import warnings

    import pytest

    from pcpo_eval.precision import check_attention_backend

    def boom():
        raise RuntimeError("CUDA out of memory")

    with pytest.raises(RuntimeError, match="^CUDA out of memory$"):
        check_attention_backend("flash", boom)
    with pytest.warns(UserWarning, match="a diffusers deprecation"):
        check_attention_backend("flash", lambda: warnings.warn("a diffusers deprecation", UserWarning, stacklevel=1))
    ran = []
    check_attention_backend("math", lambda: ran.append(1))
    check_attention_backend("auto", lambda: ran.append(1))
    assert ran == []  # neither is probed
