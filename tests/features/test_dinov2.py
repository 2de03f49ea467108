"""DINOv2 extractor vs a hand-written dgm-eval path on a tiny random Dinov2 saved to a local dir."""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from pcpo_eval.errors import MissingWeightsError
from pcpo_eval.features import make_extractor


@pytest.fixture(scope="module")
def tiny_dinov2_dir(tmp_path_factory):
    from transformers import Dinov2Config, Dinov2Model

    torch.manual_seed(0)
    cfg = Dinov2Config(
        hidden_size=32,
        num_hidden_layers=2,
        num_attention_heads=2,
        intermediate_size=64,
        patch_size=14,
        image_size=56,
    )
    model = Dinov2Model(cfg).eval()
    path = tmp_path_factory.mktemp("dinov2")
    model.save_pretrained(path)
    return path


def _hub_interpolate_pos_encoding(model):
    """dinov2's hub ``interpolate_pos_encoding`` (vision_transformer.py; hub defaults interpolate_offset=0.1,
    interpolate_antialias=False), written in its own variables, patched onto a transformers model."""
    import math

    emb = model.embeddings

    def interpolate(x, w, h):  # the hub's (x, w, h): w is the second-to-last image axis
        previous_dtype = x.dtype
        pos_embed = emb.position_embeddings.float()
        N = pos_embed.shape[1] - 1
        class_pos_embed, patch_pos_embed = pos_embed[:, 0], pos_embed[:, 1:]
        dim = x.shape[-1]
        w0, h0 = w // 14, h // 14
        M = int(math.sqrt(N))
        sx, sy = float(w0 + 0.1) / M, float(h0 + 0.1) / M
        patch_pos_embed = torch.nn.functional.interpolate(
            patch_pos_embed.reshape(1, M, M, dim).permute(0, 3, 1, 2), mode="bicubic", antialias=False,
            scale_factor=(sx, sy))
        patch_pos_embed = patch_pos_embed.permute(0, 2, 3, 1).view(1, -1, dim)
        return torch.cat((class_pos_embed.unsqueeze(0), patch_pos_embed), dim=1).to(previous_dtype)

    emb.interpolate_pos_encoding = interpolate
    return model


def _dgm_eval_reference(model, images: torch.Tensor) -> torch.Tensor:
    """dgm-eval DINOv2Encoder.transform (clean_resize=False) + hub-style CLS-after-norm, by hand."""
    import torchvision.transforms as TF

    tf = TF.Compose([TF.Resize((224, 224), TF.InterpolationMode.BICUBIC), TF.ToTensor()])
    norm = TF.Normalize([0.485, 0.456, 0.406], [0.229, 0.224, 0.225])
    x = torch.stack([norm(tf(Image.fromarray(im.permute(1, 2, 0).numpy(), "RGB"))) for im in images])
    with torch.no_grad():
        hidden = model(pixel_values=x).last_hidden_state  # already after the final LayerNorm
    return hidden[:, 0]


def test_matches_dgm_eval_path(tiny_dinov2_dir) -> None:
    from transformers import Dinov2Model

    ext = make_extractor("dinov2", weights_path=tiny_dinov2_dir)
    imgs = torch.randint(
        0, 256, (3, 3, 100, 80), dtype=torch.uint8, generator=torch.Generator().manual_seed(0)
    )
    ours = ext(imgs)
    ref = _dgm_eval_reference(_hub_interpolate_pos_encoding(Dinov2Model.from_pretrained(tiny_dinov2_dir).eval()), imgs)
    assert ours.shape == (3, 32) and ext.dim == 32
    torch.testing.assert_close(ours, ref, rtol=1e-4, atol=1e-5)
    # transformers' own interpolation (size=(16, 16)) is another grid, outside the tolerance above: the hub's
    # is what dgm-eval runs (a 4x4 grid here: 2e-4 apart; the real 37x37 one, 0.44% on a tiny stand-in)
    plain = _dgm_eval_reference(Dinov2Model.from_pretrained(tiny_dinov2_dir).eval(), imgs)
    assert not torch.allclose(plain, ref, rtol=1e-4, atol=1e-5)
    assert ext.settings()["weights_sha256"] and "BICUBIC" in ext.settings()["resize"]


def test_env_var_and_absent_weights(tiny_dinov2_dir, tmp_path, monkeypatch) -> None:
    monkeypatch.setenv("PCPO_DINOV2_PATH", str(tiny_dinov2_dir))
    assert make_extractor("dinov2").dim == 32
    monkeypatch.setenv("PCPO_DINOV2_PATH", str(tmp_path / "absent"))
    with pytest.raises(MissingWeightsError, match="PCPO_DINOV2_PATH"):
        make_extractor("dinov2")
    monkeypatch.delenv("PCPO_DINOV2_PATH")
    monkeypatch.setenv("HF_HUB_CACHE", str(tmp_path))
    monkeypatch.setenv("PCPO_WEIGHTS_DIR", str(tmp_path))
    with pytest.raises(MissingWeightsError, match="PCPO_DINOV2_PATH"):
        make_extractor("dinov2")
    broken = tmp_path / "broken"
    broken.mkdir()
    (broken / "config.json").write_text("{}")  # a folder that looks right but holds no model
    with pytest.raises(MissingWeightsError, match="DINOv2 weights: .*broken is incomplete: missing weights"):
        make_extractor("dinov2", weights_path=broken)


def test_prepare_on_the_prefetch_thread_gives_the_same_features(tiny_dinov2_dir, tmp_path) -> None:
    """extract_sets runs the PIL resize (``prepare``) on the decode thread: the same features as ``extract``
    on the decoded images, bit for bit, in manifest order."""
    from pcpo_eval.imageset import ImageSet
    from pcpo_eval.metrics.extract import MetricsOptions, extract_sets
    from tests.support.metrics import TOY_PROMPTS, make_image_set

    ext = make_extractor("dinov2", weights_path=tiny_dinov2_dir)
    imgs = torch.randint(0, 256, (4, 3, 60, 50), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    assert torch.equal(ext.extract_prepared(ext.prepare(imgs))["features"], ext.extract(imgs)["features"])
    s = ImageSet.load(make_image_set(tmp_path / "a", TOY_PROMPTS, [0, 1, 2], size=48))
    calls = []
    real = ext.extract_prepared
    ext.extract_prepared = lambda x: calls.append(x.shape[0]) or real(x)
    got = extract_sets(s, {"dinov2": ext}, MetricsOptions(batch_size=4, cache_dir=tmp_path / "c"))["dinov2"]["features"]
    assert sum(calls) == len(s)  # every batch went through the prepared path
    whole = s.read_batch(list(range(len(s))))
    ref = torch.cat([ext.extract(whole[i : i + 4])["features"] for i in range(0, len(s), 4)]).numpy()
    assert (got == ref).all()
