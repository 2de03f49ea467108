"""SD3 / FLUX adapters on tiny random pipelines: encode, guided predict, ODE vs the diffusers
pipeline loop, decode, LoRA (attach, train, save in diffusers format, reload with load_lora_weights)."""

from __future__ import annotations

import numpy as np
import pytest
import torch

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.samplers.flow import sample_flow

PROMPTS = ["a red circle", "a blue square"]


@pytest.fixture(scope="module", params=["sd3", "flux"])
def adapter(request):
    if request.param == "sd3":
        from pcpo_eval.models.sd3 import tiny_sd3_adapter

        return tiny_sd3_adapter()
    from pcpo_eval.models.flux import tiny_flux_adapter

    return tiny_flux_adapter()


def _gens(n, base=0):
    return [torch.Generator().manual_seed(base + i) for i in range(n)]


def test_encode_and_guided_predict(adapter):
    c = adapter.encode_prompts(PROMPTS)
    u = adapter.encode_prompts(["", ""])
    assert len(c) == 2 and c.pooled is not None and c.hidden.ndim == 3
    assert not torch.allclose(c.hidden[0], c.hidden[1])
    x = torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(3))
    t = torch.tensor([0.7, 0.3])
    with torch.no_grad():
        guided = adapter.predict(x, t, c, u, 4.5)
        uc, uu = adapter.denoise(x, t, c), adapter.denoise(x, t, u)
    assert guided.shape == x.shape
    torch.testing.assert_close(guided, uu + 4.5 * (uc - uu), atol=1e-5, rtol=1e-5)
    with torch.no_grad():
        assert not torch.allclose(adapter.denoise(x, torch.tensor([0.9, 0.9]), c), uc)


def test_sd3_transformer_gets_float32_timesteps_in_bf16():
    """The SD3 pipeline's convention: 1000 t in float32 whatever the weights' dtype (t = 0.9615 is 961.5, which
    bf16 would round to 960)."""
    from pcpo_eval.models.sd3 import SD3Adapter, tiny_sd3_pipeline

    ad = SD3Adapter(tiny_sd3_pipeline(0).to(dtype=torch.bfloat16), resolution=16, max_sequence_length=16)
    seen = []
    hook = ad.denoiser.register_forward_pre_hook(lambda m, a, kw: seen.append(kw["timestep"]), with_kwargs=True)
    try:
        c = ad.encode_prompts(PROMPTS)
        with torch.no_grad():
            ad.denoise(torch.zeros(2, *ad.latent_shape, dtype=torch.bfloat16), torch.tensor([0.9615, 0.3]), c)
    finally:
        hook.remove()
    assert seen[0].dtype == torch.float32
    torch.testing.assert_close(seen[0], torch.tensor([961.5, 300.0]))


def test_ode_sampler_matches_the_diffusers_pipeline_loop(adapter):
    """Our ODE on the scheduler grid reproduces the pipeline's own denoising loop (same x_1)."""
    x_T = torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(5))
    c, u = adapter.encode_prompts(PROMPTS), adapter.encode_prompts(["", ""])
    res = 16
    if adapter.name == "sd3":
        ours = sample_flow(adapter, c, u, cfg=4.5, steps=3, eta=0.0, generators=_gens(2), x_T=x_T).latents
        ref = adapter.pipe(PROMPTS, height=res, width=res, num_inference_steps=3, guidance_scale=4.5, latents=x_T,
                           output_type="latent", max_sequence_length=16).images
    else:
        from diffusers import FluxPipeline

        ours = sample_flow(adapter, c, None, cfg=1.0, steps=3, eta=0.0, generators=_gens(2), x_T=x_T).latents
        packed = FluxPipeline._pack_latents(x_T, 2, *adapter.latent_shape)
        out = adapter.pipe(PROMPTS, height=res, width=res, num_inference_steps=3, guidance_scale=adapter.guidance,
                           latents=packed, output_type="latent", max_sequence_length=16).images
        ref = FluxPipeline._unpack_latents(out, res, res, adapter.vae_scale_factor)
    torch.testing.assert_close(ours, ref, atol=1e-4, rtol=1e-4)


def test_decode_matches_pipeline_postprocess(adapter):
    z = torch.randn(2, *adapter.latent_shape, generator=torch.Generator().manual_seed(2))
    img = adapter.decode(z)
    assert img.dtype == torch.uint8 and img.shape == (2, 3, 16, 16)
    vae = adapter.pipe.vae
    with torch.no_grad():
        ref = vae.decode(z / vae.config.scaling_factor + vae.config.shift_factor).sample
    ref = adapter.pipe.image_processor.postprocess(ref, output_type="np")
    np.testing.assert_allclose(img.permute(0, 2, 3, 1).numpy() / 255.0, ref, atol=1 / 255 + 1e-6)


def test_lora_attach_train_save_and_reload_with_diffusers(tmp_path):
    from pcpo_eval.models.sd3 import tiny_sd3_adapter, tiny_sd3_pipeline
    from pcpo_eval.train import checkpoints as ck

    ad = tiny_sd3_adapter()
    n_before = sum(p.numel() for p in ad.denoiser.parameters())
    ad.add_lora(4, 8.0)
    params = ad.trainable_parameters()
    assert params and all("lora" in n for n, p in ad.denoiser.named_parameters() if p.requires_grad)
    assert sum(p.numel() for p in params) < 0.5 * n_before
    x = torch.randn(1, *ad.latent_shape, generator=torch.Generator().manual_seed(0))
    c = ad.encode_prompts(PROMPTS[:1])
    t = torch.tensor([0.5])
    with torch.no_grad():
        base = ad.denoise(x, t, c)
    # a gradient step on the LoRA weights changes the velocity
    opt = torch.optim.SGD(params, lr=1.0)
    ad.denoise(x, t, c).square().mean().backward()
    opt.step()
    with torch.no_grad():
        tuned = ad.denoise(x, t, c)
    assert not torch.allclose(base, tuned)
    ckpt = ck.save_checkpoint(tmp_path / "epoch_0001", ad.denoiser, {"epoch": 1, "reward_mean": 0.0})
    assert (ckpt / ck.LORA_FILE).is_file()
    fresh = tiny_sd3_pipeline()
    fresh.load_lora_weights(str(ckpt), weight_name=ck.LORA_FILE)
    with torch.no_grad():
        reloaded = fresh.transformer(hidden_states=x, encoder_hidden_states=c.hidden, pooled_projections=c.pooled,
                                     timestep=t * 1000, return_dict=False)[0]
    torch.testing.assert_close(reloaded, tuned, atol=1e-5, rtol=1e-5)


def test_missing_weights_is_a_one_line_user_error(tmp_path):
    from pcpo_eval.models.flux import FluxAdapter
    from pcpo_eval.models.sd3 import SD3Adapter

    for cls in (SD3Adapter, FluxAdapter):
        with pytest.raises(MissingWeightsError, match="not found locally") as exc:
            cls.from_pretrained(str(tmp_path / "nope"))
        assert "\n" not in str(exc.value)


def test_flux_lora_is_dancegrpos():
    """DanceGRPO's FLUX LoRA (``train_grpo_flux_lora.py``): targets to_k / to_q / to_v / to_out.0 and peft's default
    start (Kaiming-uniform A, zero B). The list held Flow-GRPO's SD3 targets too (add_*_proj, to_add_out: 11 LoRA
    modules instead of 7 here) and started Gaussian; SD3 keeps Flow-GRPO's list and start."""
    import math

    from pcpo_eval.models.flux import tiny_flux_adapter
    from pcpo_eval.models.sd3 import tiny_sd3_adapter

    ad = tiny_flux_adapter()
    ad.add_lora(4, 8.0)
    adapted = {n.rsplit(".lora_A", 1)[0] for n, _ in ad.denoiser.named_parameters() if ".lora_A" in n}
    assert adapted and all(n.endswith(("attn.to_k", "attn.to_q", "attn.to_v", "attn.to_out.0")) for n in adapted)
    assert not any("add_" in n or "to_add_out" in n for n in adapted)
    for n, p in ad.denoiser.named_parameters():
        if ".lora_B" in n:
            assert not p.any()
        elif ".lora_A" in n:  # kaiming_uniform_(a=sqrt(5)): |A| <= 1/sqrt(fan_in)
            assert p.abs().max() <= 1 / math.sqrt(p.shape[1]) + 1e-6 and p.std() > 0
    sd3 = tiny_sd3_adapter()
    sd3.add_lora(4, 8.0)
    assert sd3.lora_init == "gaussian" and any("add_k_proj" in n for n, _ in sd3.denoiser.named_parameters())


def test_sd3_prompts_use_flowgrpos_token_length():
    """Flow-GRPO samples, trains and evaluates SD3 with max_sequence_length=128 (train_sd3.py); the adapter used
    diffusers' 256, so every prompt of setups 8-9 was 77 + 256 tokens."""
    import inspect

    from pcpo_eval.models.sd3 import SD3_MAX_SEQUENCE_LENGTH, SD3Adapter, tiny_sd3_pipeline

    assert SD3_MAX_SEQUENCE_LENGTH == 128
    assert inspect.signature(SD3Adapter).parameters["max_sequence_length"].default == SD3_MAX_SEQUENCE_LENGTH
    ad = SD3Adapter(tiny_sd3_pipeline(0), resolution=16)
    assert ad.encode_prompts(["a red cube"]).hidden.shape[1] == 77 + SD3_MAX_SEQUENCE_LENGTH
