"""The ModelAdapter contract, run on the toy model and on a tiny random SD-1.x pipeline."""

from __future__ import annotations

import pytest
import torch

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.models.base import ModelAdapter, PromptEmbeds
from pcpo_eval.testing import tiny_sd1_adapter, tiny_toy_adapter

PROMPTS = ["red circle", "blue square", ""]


@pytest.fixture(scope="module", params=["toy", "sd1"])
def adapter(request) -> ModelAdapter:
    return tiny_toy_adapter(0) if request.param == "toy" else tiny_sd1_adapter(0)


def test_attributes(adapter):
    assert adapter.prediction == "eps"
    assert isinstance(adapter.denoiser, torch.nn.Module)
    assert adapter.scheduler_config["prediction_type"] == "epsilon"
    from diffusers import DDIMScheduler

    DDIMScheduler.from_config(adapter.scheduler_config)  # a valid diffusers config
    assert len(adapter.latent_shape) == 3 and adapter.lora_target_modules


def test_encode_prompts(adapter):
    e = adapter.encode_prompts(PROMPTS)
    assert isinstance(e, PromptEmbeds) and len(e) == 3
    assert e.hidden.ndim == 3 and e.hidden.dtype == torch.float32
    again = adapter.encode_prompts(PROMPTS[:1])
    torch.testing.assert_close(again.hidden, e.hidden[:1])  # row-independent
    assert not torch.allclose(e.hidden[0], e.hidden[1])


def test_predict_cfg_matches_manual_combination(adapter):
    g = torch.Generator().manual_seed(0)
    x = torch.randn(2, *adapter.latent_shape, generator=g)
    t = torch.tensor([999, 500])
    cond = adapter.encode_prompts(PROMPTS[:2])
    uncond = adapter.encode_prompts(["", ""])
    with torch.no_grad():
        guided = adapter.predict(x, t, cond, uncond, 4.0)
        ec = adapter.denoise(x, t, cond)
        eu = adapter.denoise(x, t, uncond)
        plain = adapter.predict(x, t, cond)
    assert guided.shape == x.shape
    torch.testing.assert_close(guided, eu + 4.0 * (ec - eu), atol=1e-5, rtol=1e-4)
    torch.testing.assert_close(plain, ec)


def test_decode_uint8(adapter):
    lat = torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(1))
    img = adapter.decode(lat)
    assert img.dtype == torch.uint8 and img.ndim == 4 and img.shape[1] == 3
    torch.testing.assert_close(adapter.decode(lat[:1]), img[:1])


def test_sample_is_deterministic(adapter):
    from pcpo_eval.samplers.ddim import sample_ddim
    from pcpo_eval.seeding import sample_generators

    cond, uncond = adapter.encode_prompts(PROMPTS[:2]), adapter.encode_prompts(["", ""])

    def run(pairs):
        out = sample_ddim(adapter, cond, uncond, cfg=3.0, steps=2, eta=1.0, generators=sample_generators(pairs))
        return out.latents

    a, b = run([(0, 0), (0, 1)]), run([(0, 0), (0, 1)])
    torch.testing.assert_close(a, b, atol=0, rtol=0)  # same seeds -> identical
    assert not torch.equal(a[0], a[1])  # another seed -> another sample
    torch.testing.assert_close(adapter.decode(a), adapter.decode(b), atol=0, rtol=0)


def test_lora_trains_only_adapter_weights(adapter):
    import copy

    ad = copy.deepcopy(adapter)
    n_before = sum(p.numel() for p in ad.denoiser.parameters())
    ad.add_lora(rank=2, alpha=2.0)
    params = ad.trainable_parameters()
    assert params and all("lora" in n for n, p in ad.denoiser.named_parameters() if p.requires_grad)
    assert sum(p.numel() for p in params) < 0.5 * n_before
    x = torch.randn(1, *ad.latent_shape)
    out = ad.denoise(x, torch.tensor([10]), ad.encode_prompts(["red circle"]))
    out.square().mean().backward()
    assert all(p.grad is not None for p in params)


def test_registry_errors(tmp_path):
    from pcpo_eval.models.registry import load_model

    with pytest.raises(UserError, match="valid kinds: .*sd1.*toy"):
        load_model("nope:thing")
    with pytest.raises(MissingWeightsError, match="does not exist"):
        load_model(f"sd1:{tmp_path}/absent")
    with pytest.raises(MissingWeightsError, match="not in the HF cache, and sd1 weights not found: set PCPO_SD1_PATH"):
        load_model("sd1:nobody/not-a-cached-model")
    with pytest.raises(MissingWeightsError, match="pcpo-eval toy pretrain"):
        load_model(f"toy:{tmp_path}")


def test_sd1_load_from_directory(tmp_path):
    from pcpo_eval.models.registry import load_model
    from pcpo_eval.testing import save_tiny_sd1

    save_tiny_sd1(tmp_path / "sd", seed=0)
    loaded = load_model(f"sd1:{tmp_path / 'sd'}")
    ref = tiny_sd1_adapter(0)
    x = torch.randn(1, *ref.latent_shape, generator=torch.Generator().manual_seed(2))
    t = torch.tensor([300])
    with torch.no_grad():
        torch.testing.assert_close(loaded.denoise(x, t, loaded.encode_prompts(["a cat"])),
                                   ref.denoise(x, t, ref.encode_prompts(["a cat"])))
    assert loaded.scaling_factor == ref.scaling_factor


@pytest.mark.parametrize(("kind", "env_var"), [("sd3", "PCPO_SD35_PATH"), ("flux", "PCPO_FLUX_PATH"),
                                                ("sd1:stable-diffusion-v1-5/stable-diffusion-v1-5", "PCPO_SD15_PATH")])
def test_pipelines_load_from_their_weights_variable(tmp_path, monkeypatch, kind, env_var):
    """``sd3`` / ``flux`` / an SD-1.5 hub id not in the HF cache load from the folder their variable names."""
    from pcpo_eval.models.flux import tiny_flux_pipeline
    from pcpo_eval.models.registry import load_model, pipeline_location
    from pcpo_eval.models.sd3 import tiny_sd3_pipeline
    from pcpo_eval.testing import isolate_weight_caches, save_tiny_sd1

    isolate_weight_caches(tmp_path, monkeypatch)
    (tmp_path / "sys_tmp").mkdir()  # the isolated cache's temp dir (tiny tokenizers are written there)
    folder = tmp_path / "pipe"
    with pytest.raises(MissingWeightsError, match=env_var):
        load_model(kind)
    if kind == "sd3":
        tiny_sd3_pipeline(seed=0).save_pretrained(folder)
    elif kind == "flux":
        tiny_flux_pipeline(seed=0).save_pretrained(folder)
    else:
        save_tiny_sd1(folder, seed=0)
    monkeypatch.setenv(env_var, str(folder))
    name = kind.partition(":")[0]
    assert pipeline_location(name, kind.partition(":")[2] or "some/hub-id") == str(folder)
    adapter = load_model(kind)
    assert adapter.prediction in ("eps", "velocity") and adapter.encode_prompts(["a cat"]) is not None
