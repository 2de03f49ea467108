"""CLIP-family preference rewards (HPSv2.1, PickScore, CLIPScore, LAION aesthetic) on tiny stand-ins.

References are computed independently with the libraries' own pipelines: open_clip's validation
transform on PIL images + ``model(image, text)`` for HPS; transformers' ``CLIPImageProcessor``,
tokenizer and ``get_image_features`` / ``get_text_features`` for PickScore / CLIPScore / aesthetic;
the aesthetic head is rebuilt from its published layer list.
"""

from __future__ import annotations

import pytest
import torch
from PIL import Image

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.rewards import make_reward
from pcpo_eval.rewards.preference import (
    AestheticMLP,
    ImageCfg,
    PreferenceReward,
    center_crop_offsets,
    cosine_scores,
    image_cfg_from_hf,
    preprocess_images,
    shortest_edge_size,
)
from pcpo_eval.testing import isolate_weight_caches
from tests.support.preference import (
    TINY_OPEN_CLIP,
    random_images,
    register_tiny_open_clip,
    tiny_aesthetic_state_dict,
    tiny_hf_clip_dir,
    tiny_open_clip_checkpoint,
)

PROMPTS = ["a red circle", "a photo of a cat", "a red circle", "blue square on grass", "x " * 100]

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py


@pytest.fixture(scope="module")
def files(tmp_path_factory):
    tmp = tmp_path_factory.mktemp("pref")
    out = {
        "hps": tiny_open_clip_checkpoint(tmp, seed=0),
        "hps_module": tiny_open_clip_checkpoint(tmp, seed=0, module_prefix=True),
        "clip_dir": tiny_hf_clip_dir(tmp / "clip", seed=1),
        "aes": tmp / "sac+logos+ava1-l14-linearMSE.pth",
    }
    torch.save(tiny_aesthetic_state_dict(seed=2), out["aes"])
    return out


@pytest.fixture
def no_weights(tmp_path, monkeypatch):
    """No env vars, empty caches, hub offline: every real backend is missing and nothing downloads."""
    isolate_weight_caches(tmp_path, monkeypatch)


def _pil(images: torch.Tensor) -> list[Image.Image]:
    return [Image.fromarray(x.permute(1, 2, 0).numpy()) for x in images]


def _tv_processor(clip_dir):
    """transformers' torchvision-backend CLIP image processor (5.x: the default; 4.x: the Fast one)."""
    import transformers

    major = int(transformers.__version__.split(".")[0])
    cls = transformers.CLIPImageProcessor if major >= 5 else transformers.CLIPImageProcessorFast
    return cls.from_pretrained(clip_dir)


def _pooled(out) -> torch.Tensor:  # transformers 4.x returns a tensor, 5.x an output object
    return out if isinstance(out, torch.Tensor) else out.pooler_output


# ----------------------------------------------------------------------------- preprocessing


def test_resize_and_crop_geometry():
    assert shortest_edge_size(512, 512, 224) == (224, 224)
    assert shortest_edge_size(200, 300, 224) == (224, 336)
    assert shortest_edge_size(301, 200, 224) == (337, 224)
    assert center_crop_offsets(225, 224, 224, 224, "torchvision") == (0, 0)  # round(0.5) = 0 (banker's)
    assert center_crop_offsets(227, 224, 224, 224, "torchvision") == (2, 0)  # round(1.5) = 2
    assert center_crop_offsets(227, 224, 224, 224, "hf") == (1, 0)


def test_image_cfg_from_hf_config():
    cfg = image_cfg_from_hf({"size": {"shortest_edge": 224}, "crop_size": {"height": 224, "width": 224},
                             "resample": 3, "image_mean": [0.5, 0.5, 0.5], "image_std": [0.5, 0.5, 0.5]})
    assert cfg.resize == ("shortest", 224) and cfg.crop == (224, 224) and cfg.interpolation == "bicubic"
    assert cfg.mean == (0.5, 0.5, 0.5) and cfg.crop_rounding == "hf"
    legacy = image_cfg_from_hf({"size": 224, "crop_size": 224})
    assert legacy.resize == ("shortest", 224) and legacy.crop == (224, 224)
    with pytest.raises(UserError, match="resample"):
        image_cfg_from_hf({"resample": 5})


@pytest.mark.parametrize("size", [224, 512, 64, (200, 300)])
def test_preprocess_matches_transformers_clip_processor(files, size):
    proc = _tv_processor(files["clip_dir"])
    imgs = random_images(3, size, seed=3)
    ref = proc(images=list(imgs), return_tensors="pt")["pixel_values"]
    ours = preprocess_images(imgs, image_cfg_from_hf(proc.to_dict()))
    assert ours.shape == ref.shape == (3, 3, 224, 224)
    torch.testing.assert_close(ours, ref, atol=1e-5, rtol=0)


@pytest.mark.parametrize("size", [224, 512, 64])
def test_preprocess_vs_open_clip_pil_transform(size):
    from open_clip.transform import image_transform

    tf = image_transform(224, is_train=False)
    imgs = random_images(3, size, seed=4)
    ref = torch.stack([tf(p) for p in _pil(imgs)])
    ours = preprocess_images(imgs, ImageCfg())
    if size == 224:  # no resize: identical
        torch.testing.assert_close(ours, ref, atol=1e-6, rtol=0)
    else:  # PIL rounds inside its bicubic filter: at most a few uint8 levels apart
        assert (ours - ref).abs().max() <= 3 / 255 / min(ImageCfg().std)
        assert (ours - ref).abs().mean() <= 0.5 / 255 / min(ImageCfg().std)


@pytest.mark.parametrize("size", [512, 300])
def test_hps_preprocessing_is_hpsv2s_preprocess_val(files, size):
    """HPSv2's validation transform (hpsv2/src/open_clip/transform.py: ToTensor, Resize(224, BICUBIC),
    CenterCrop(224), normalize) resizes the float image: no rounding to uint8 and bicubic overshoot kept.
    Ours matched mainline open_clip's PIL transform instead (a review measured 0.27 grey levels on average,
    up to 41 on a checkerboard)."""
    import dataclasses

    import torchvision.transforms as T

    fn = make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP, batch_size=2)
    cfg = fn.module.image_cfg
    assert cfg.float_resize and fn.settings["preprocess"]["float_resize"]
    imgs = random_images(3, size, seed=9)
    board = (torch.arange(size).view(1, -1) + torch.arange(size).view(-1, 1)) % 2 * 255  # 1-pixel checkerboard
    imgs = torch.cat([imgs, board.to(torch.uint8).expand(1, 3, size, size)])
    ref_tf = T.Compose([T.ToTensor(), T.Resize(224, interpolation=T.InterpolationMode.BICUBIC), T.CenterCrop(224),
                        T.Normalize(cfg.mean, cfg.std)])
    ref = torch.stack([ref_tf(p) for p in _pil(imgs)])
    torch.testing.assert_close(preprocess_images(imgs, cfg), ref, atol=1e-5, rtol=0)
    uint8_path = preprocess_images(imgs, dataclasses.replace(cfg, float_resize=False))
    assert (uint8_path - ref).abs().max() > 1e-3  # the uint8 order: 1-3 grey levels off, outside the tolerance


def test_cosine_scores_closed_form():
    a = torch.tensor([[3.0, 4.0], [1.0, 0.0]])
    b = torch.tensor([[6.0, 8.0], [0.0, 2.0]])
    torch.testing.assert_close(cosine_scores(a, b), torch.tensor([1.0, 0.0]))


# ----------------------------------------------------------------------------- HPSv2.1


def _open_clip_reference(ckpt, images, prompts):
    import open_clip

    model, _, preprocess_val = open_clip.create_model_and_transforms(TINY_OPEN_CLIP, pretrained=str(ckpt), output_dict=True)
    model.eval()
    tokenizer = open_clip.get_tokenizer(TINY_OPEN_CLIP)
    px = torch.stack([preprocess_val(p) for p in _pil(images)])
    with torch.no_grad():
        out = model(px, tokenizer(prompts))
    return torch.diagonal(out["image_features"] @ out["text_features"].T)  # HPSv2 img_score.py


def test_hps_matches_open_clip_reference(files):
    fn = make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP, batch_size=2)
    assert isinstance(fn, PreferenceReward)
    imgs = random_images(5, 224, seed=5)
    got = fn(imgs, PROMPTS)
    assert got.dtype == torch.float32 and got.shape == (5,)
    torch.testing.assert_close(got, _open_clip_reference(files["hps"], imgs, PROMPTS), atol=1e-5, rtol=0)
    assert got.std() > 1e-3  # the stand-in discriminates, so the comparison above is meaningful


def test_hps_resized_images_close_to_pil_reference(files):
    fn = make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP)
    imgs = random_images(4, 512, seed=6)
    ref = _open_clip_reference(files["hps"], imgs, PROMPTS[:4])
    assert (fn(imgs, PROMPTS[:4]) - ref).abs().max() < 2e-3


def test_hps_module_prefixed_checkpoint_loads_identically(files):
    a = make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP)
    b = make_reward("hps", weights=str(files["hps_module"]), model_name=TINY_OPEN_CLIP)
    imgs = random_images(3, 96, seed=7)
    torch.testing.assert_close(a(imgs, PROMPTS[:3]), b(imgs, PROMPTS[:3]), atol=0, rtol=0)


def test_hps_batch_size_invariant(files):
    imgs = random_images(7, 128, seed=8)
    prompts = (PROMPTS * 2)[:7]
    outs = [make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP, batch_size=bs)(imgs, prompts)
            for bs in (1, 3, 16)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-6, rtol=0)


def test_hps_env_var_and_version(files, no_weights, monkeypatch):
    with pytest.raises(MissingWeightsError, match="PCPO_HPS_WEIGHTS"):
        make_reward("hps", model_name=TINY_OPEN_CLIP)
    with pytest.raises(MissingWeightsError, match="PCPO_HPS_V20_WEIGHTS.*HPS_v2_compressed.pt"):
        make_reward("hps", version="v2.0", model_name=TINY_OPEN_CLIP)
    monkeypatch.setenv("PCPO_HPS_V20_WEIGHTS", str(files["hps"]))
    fn = make_reward("hps", version="v2.0", model_name=TINY_OPEN_CLIP)
    assert fn.settings["model"] == "HPSv2.0" and fn.settings["weights"] == str(files["hps"])
    with pytest.raises(UserError, match="v2.1, v2.0"):
        make_reward("hps", version="v3", weights=str(files["hps"]))


def test_hps_wrong_checkpoint_is_user_error(files, tmp_path):
    register_tiny_open_clip(tmp_path)
    with pytest.raises(UserError, match="does not match open_clip"):
        make_reward("hps", weights=str(files["aes"]), model_name=TINY_OPEN_CLIP)


# ----------------------------------------------------------------------------- PickScore / CLIPScore


def _hf_reference(clip_dir, images, prompts):
    from transformers import AutoTokenizer, CLIPModel

    model = CLIPModel.from_pretrained(clip_dir).eval()
    proc = _tv_processor(clip_dir)
    tok = AutoTokenizer.from_pretrained(clip_dir)
    with torch.no_grad():
        px = proc(images=list(images), return_tensors="pt")["pixel_values"]
        ie = _pooled(model.get_image_features(pixel_values=px))
        te = _pooled(model.get_text_features(**tok(prompts, padding=True, truncation=True, max_length=77, return_tensors="pt")))
        ie = ie / ie.norm(dim=-1, keepdim=True)
        te = te / te.norm(dim=-1, keepdim=True)
        return model.logit_scale.exp() * (ie * te).sum(-1), (ie * te).sum(-1), ie


@pytest.mark.parametrize("size", [224, 512])
def test_pickscore_matches_transformers_reference(files, size):
    fn = make_reward("pickscore", model_path=str(files["clip_dir"]), processor_path=str(files["clip_dir"]), batch_size=2)
    imgs = random_images(5, size, seed=9)
    ref, _, _ = _hf_reference(files["clip_dir"], imgs, PROMPTS)
    got = fn(imgs, PROMPTS)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    assert fn.settings["score"] == "logit_scale.exp() * cosine"


def test_pickscore_batch_size_invariant_with_padding(files):
    imgs = random_images(6, 256, seed=10)
    prompts = ["a", "a much longer prompt with many many words in it", "a", "b c", "a", "d"]
    outs = [make_reward("pickscore", model_path=str(files["clip_dir"]), processor_path=str(files["clip_dir"]),
                        batch_size=bs)(imgs, prompts) for bs in (1, 4, 6)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=1e-5)


def test_pickscore_missing_files(files, no_weights, tmp_path):
    with pytest.raises(MissingWeightsError, match="PCPO_PICKSCORE_PATH"):
        make_reward("pickscore")
    with pytest.raises(MissingWeightsError, match="PCPO_PICKSCORE_PROCESSOR_PATH"):
        make_reward("pickscore", model_path=str(files["clip_dir"]))
    no_tok = tiny_hf_clip_dir(tmp_path / "notok", with_tokenizer=False)
    with pytest.raises(MissingWeightsError, match="tokenizer"):
        make_reward("pickscore", model_path=str(no_tok), processor_path=str(no_tok))


def test_clipscore_hf_is_raw_cosine(files):
    fn = make_reward("clipscore", path=str(files["clip_dir"]), batch_size=3)
    imgs = random_images(5, 300, seed=11)
    _, cos, _ = _hf_reference(files["clip_dir"], imgs, PROMPTS)
    torch.testing.assert_close(fn(imgs, PROMPTS), cos, atol=1e-6, rtol=1e-5)


def test_clipscore_open_clip_backbone(files):
    fn = make_reward("clipscore", model_name=TINY_OPEN_CLIP, pretrained=str(files["hps"]))
    imgs = random_images(5, 224, seed=12)
    torch.testing.assert_close(fn(imgs, PROMPTS), _open_clip_reference(files["hps"], imgs, PROMPTS), atol=1e-5, rtol=0)
    with pytest.raises(MissingWeightsError, match="pretrained"):
        make_reward("clipscore", model_name=TINY_OPEN_CLIP)


def test_clipscore_env_var(files, no_weights, monkeypatch):
    with pytest.raises(MissingWeightsError, match="PCPO_CLIPSCORE_PATH"):
        make_reward("clipscore")
    monkeypatch.setenv("PCPO_CLIPSCORE_PATH", str(files["clip_dir"]))
    assert make_reward("clipscore").settings["weights"] == str(files["clip_dir"])


# ----------------------------------------------------------------------------- LAION aesthetic


def test_aesthetic_matches_reference_pipeline(files):
    fn = make_reward("aesthetic", weights=str(files["aes"]), clip_path=str(files["clip_dir"]), batch_size=2)
    imgs = random_images(5, 512, seed=13)
    _, _, emb = _hf_reference(files["clip_dir"], imgs, PROMPTS)
    head = torch.nn.Sequential(  # published layer list of the improved aesthetic predictor
        torch.nn.Linear(768, 1024), torch.nn.Dropout(0.2), torch.nn.Linear(1024, 128), torch.nn.Dropout(0.2),
        torch.nn.Linear(128, 64), torch.nn.Dropout(0.1), torch.nn.Linear(64, 16), torch.nn.Linear(16, 1),
    )
    head.load_state_dict({k.removeprefix("layers."): v for k, v in torch.load(files["aes"]).items()})
    with torch.no_grad():
        ref = head.eval()(emb).squeeze(1)
    got = fn(imgs, PROMPTS)
    torch.testing.assert_close(got, ref, atol=1e-5, rtol=1e-5)
    # the prompt is ignored
    torch.testing.assert_close(fn(imgs, ["other"] * 5), got, atol=0, rtol=0)


def test_aesthetic_mlp_keys_are_the_published_ones():
    assert set(AestheticMLP().state_dict()) == set(tiny_aesthetic_state_dict())


def test_aesthetic_bad_or_missing_files(files, no_weights, tmp_path):
    with pytest.raises(MissingWeightsError, match="PCPO_AESTHETIC_WEIGHTS.*sac\\+logos\\+ava1-l14-linearMSE.pth"):
        make_reward("aesthetic", clip_path=str(files["clip_dir"]))
    with pytest.raises(MissingWeightsError, match="PCPO_CLIP_L14_PATH"):
        make_reward("aesthetic", weights=str(files["aes"]))
    bad = tmp_path / "bad.pth"
    torch.save({"fc.weight": torch.zeros(1, 768)}, bad)
    with pytest.raises(UserError, match="not an aesthetic MLP"):
        make_reward("aesthetic", weights=str(bad), clip_path=str(files["clip_dir"]))
    junk = tmp_path / "junk.pth"
    junk.write_bytes(b"not a torch file")
    with pytest.raises(MissingWeightsError, match="cannot read"):
        make_reward("aesthetic", weights=str(junk), clip_path=str(files["clip_dir"]))


# ----------------------------------------------------------------------------- contract


def test_reward_contract_validation(files):
    fn = make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP)
    imgs = random_images(2, 64)
    with pytest.raises(UserError, match="uint8"):
        fn(imgs.float(), ["a", "b"])
    with pytest.raises(UserError, match="2 images but 1 prompts"):
        fn(imgs, ["a"])
    with pytest.raises(UserError, match="RGB"):
        fn(imgs[:, :1], ["a", "b"])
    empty = fn(imgs[:0], [])
    assert empty.shape == (0,) and empty.dtype == torch.float32
    with pytest.raises(UserError, match="batch_size"):
        make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP, batch_size=0)
    with pytest.raises(UserError, match="dtype"):
        make_reward("hps", weights=str(files["hps"]), model_name=TINY_OPEN_CLIP, dtype="float8")
