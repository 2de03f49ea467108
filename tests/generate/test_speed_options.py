"""`generate --compile` / `--channels-last` on a real SD-1.x UNet (tiny random config) on CPU.

The compiled path runs through dynamo with the ``aot_eager`` backend (the graph capture, the
``_orig_mod`` wrapper, the model hash and the set's identity are ours to test; inductor's code
generation would add a minute of C++ compilation per test and is timed on a GPU instead,
``benchmarks/gpu/bench_generate.py --variants compile``).
"""

from __future__ import annotations

import json

import numpy as np
import torch

from pcpo_eval.generate.png import read_png_pixels
from pcpo_eval.generate.runner import generate_set
from pcpo_eval.testing import tiny_sd1_adapter


def _pixels(out):
    return np.stack([read_png_pixels(f) for f in sorted(out.glob("images/*/*.png"))]).astype(int)


def test_compile_and_channels_last_render_the_same_set_within_tolerance(tmp_path, aot_eager):
    ad = tiny_sd1_adapter()
    common = dict(batch_size=2, steps=3, max_prompts=2, progress=False)
    generate_set(ad, "toy", 2, tmp_path / "eager", **common)
    eager = json.loads((tmp_path / "eager" / "set.json").read_text())["settings"]
    assert eager["batch_invariance"] == "bitwise"
    for name, kw in (("channels_last", {"channels_last": True}), ("compile", {"compile": True})):
        out = tmp_path / name
        generate_set(ad, "toy", 2, out, **common, **kw)
        settings = json.loads((out / "set.json").read_text())["settings"]
        # other kernels: the images agree within tolerance, not bitwise; the weights (model hash) are the same
        assert settings["batch_invariance"] == "tolerance" and settings["model_hash"] == eager["model_hash"]
        assert np.abs(_pixels(out) - _pixels(tmp_path / "eager")).max() <= 1, name
        ad.denoiser.to(memory_format=torch.contiguous_format)  # each option on its own
    compiled = ad.denoiser
    assert hasattr(compiled, "_orig_mod")
    generate_set(ad, "toy", 2, tmp_path / "again", compile=True, **common)
    assert ad.denoiser is compiled  # a reused adapter is not wrapped twice


def test_compile_reaches_every_denoiser_of_an_irg_model(tmp_path, aot_eager):
    """An IRG model runs its reference's and its components' denoisers (its own ``denoiser`` is a ModuleList
    of theirs that nothing calls): ``--compile`` compiles those, and the images stay within tolerance."""
    from pcpo_eval.generate.irg import IRGAdapter

    ref, comp = tiny_sd1_adapter(), tiny_sd1_adapter(seed=1)
    common = dict(batch_size=2, steps=3, max_prompts=2, progress=False, model_name="irg")
    generate_set(IRGAdapter(ref, [(comp, 0.5)]), "toy", 2, tmp_path / "eager", **common)
    generate_set(IRGAdapter(ref, [(comp, 0.5)]), "toy", 2, tmp_path / "compiled", compile=True, **common)
    assert hasattr(ref.denoiser, "_orig_mod") and hasattr(comp.denoiser, "_orig_mod")
    assert np.abs(_pixels(tmp_path / "compiled") - _pixels(tmp_path / "eager")).max() <= 1
