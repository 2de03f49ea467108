"""ImageReward: batched scoring on a tiny BLIP-shaped stand-in vs a per-image reference loop.

The reference loop follows THUDM/ImageReward ``ImageReward.score`` step by step on one image and one
prompt at a time (PIL + torchvision ``_transform(224)``, ``max_length=35`` padding, [CLS] -> MLP ->
``(r - mean) / std``). The optional real package (``image-reward``, 'preference' extra) is exercised
only where it is installed.
"""

from __future__ import annotations

import copy
import importlib.util
import json
from types import SimpleNamespace

import pytest
import torch
from PIL import Image
from torch import nn

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.rewards import make_reward
from pcpo_eval.rewards.preference import (
    IMAGEREWARD_MEAN,
    IMAGEREWARD_STD,
    AestheticMLP,
    _blip_tokenizer_from,
    cast_imagereward_model,
)
from pcpo_eval.testing import isolate_weight_caches
from tests.support.preference import random_images

pytestmark = pytest.mark.usefixtures("one_thread")  # tests/conftest.py

WORDS = ["a", "red", "circle", "photo", "of", "cat", "blue", "square", "on", "grass", "x", "dog", "##s"]


class TinyVisual(nn.Module):
    def __init__(self, width: int = 64) -> None:
        super().__init__()
        self.patch = nn.Conv2d(3, width, kernel_size=32, stride=32)

    def forward(self, px: torch.Tensor) -> torch.Tensor:
        return self.patch(px).flatten(2).transpose(1, 2)  # (B, 49, width), like ViT tokens


class TinyTextEncoder(nn.Module):
    """Self-attention over text + cross-attention to image tokens; returns ``last_hidden_state``."""

    def __init__(self, vocab: int, hidden: int = 768, enc_width: int = 64) -> None:
        super().__init__()
        self.emb = nn.Embedding(vocab, hidden)
        self.self_attn = nn.MultiheadAttention(hidden, 4, batch_first=True)
        self.cross = nn.MultiheadAttention(hidden, 4, kdim=enc_width, vdim=enc_width, batch_first=True)
        self.ln = nn.LayerNorm(hidden)

    def forward(self, input_ids, attention_mask, encoder_hidden_states, encoder_attention_mask, return_dict=True):
        x = self.emb(input_ids)
        x = x + self.self_attn(x, x, x, key_padding_mask=attention_mask == 0)[0]
        enc = encoder_hidden_states
        x = x + self.cross(x, enc, enc, key_padding_mask=encoder_attention_mask == 0)[0]
        return SimpleNamespace(last_hidden_state=self.ln(x))


@pytest.fixture(scope="module")
def tokenizer_dir(tmp_path_factory):
    d = tmp_path_factory.mktemp("bert")
    (d / "vocab.txt").write_text("\n".join(["[PAD]", "[UNK]", "[CLS]", "[SEP]", "[MASK]", *WORDS]) + "\n")
    (d / "tokenizer_config.json").write_text(json.dumps({"do_lower_case": True, "model_max_length": 512}))
    return d


def _stand_in(tokenizer_dir) -> nn.Module:
    torch.manual_seed(0)  # nn init uses the global RNG; tests only
    tokenizer = _blip_tokenizer_from(tokenizer_dir)()
    blip = nn.Module()
    blip.tokenizer = tokenizer
    blip.visual_encoder = TinyVisual()
    blip.text_encoder = TinyTextEncoder(len(tokenizer))
    model = nn.Module()
    model.blip = blip
    model.mlp = AestheticMLP(768)  # ImageReward's MLP(768) has the same layer list
    return model.eval()


@pytest.fixture(scope="module")
def stand_in(tokenizer_dir):
    return _stand_in(tokenizer_dir)


def _reference_score(model, prompt: str, image: torch.Tensor) -> float:
    """ImageReward.score for one (prompt, image), on a PIL image as the package does."""
    from torchvision.transforms import CenterCrop, Compose, InterpolationMode, Normalize, Resize, ToTensor

    transform = Compose([
        Resize(224, interpolation=InterpolationMode.BICUBIC), CenterCrop(224), ToTensor(),
        Normalize((0.48145466, 0.4578275, 0.40821073), (0.26862954, 0.26130258, 0.27577711)),
    ])
    text = model.blip.tokenizer(prompt, padding="max_length", truncation=True, max_length=35, return_tensors="pt")
    px = transform(Image.fromarray(image.permute(1, 2, 0).numpy())).unsqueeze(0)
    with torch.no_grad():
        embeds = model.blip.visual_encoder(px)
        atts = torch.ones(embeds.size()[:-1], dtype=torch.long)
        out = model.blip.text_encoder(text.input_ids, attention_mask=text.attention_mask,
                                      encoder_hidden_states=embeds, encoder_attention_mask=atts, return_dict=True)
        reward = model.mlp(out.last_hidden_state[:, 0, :].float())
    return float((reward - IMAGEREWARD_MEAN) / IMAGEREWARD_STD)


PROMPTS = ["a red circle", "a photo of a cat", "a red circle", "blue squares on grass", " ".join(["x"] * 60)]


def test_blip_tokenizer_from_local_dir(stand_in):
    tok = stand_in.blip.tokenizer
    assert tok.bos_token == "[DEC]" and tok.convert_ids_to_tokens(tok.enc_token_id) == "[ENC]"
    ids = tok(PROMPTS[4], padding="max_length", truncation=True, max_length=35)["input_ids"]
    assert len(ids) == 35  # long prompts truncated to BLIP's 35 tokens


@pytest.mark.parametrize("size", [224, 512])
def test_imagereward_batched_equals_reference_loop(stand_in, size):
    fn = make_reward("imagereward", model=stand_in, batch_size=2)
    imgs = random_images(5, size, seed=size)
    got = fn(imgs, PROMPTS)
    ref = torch.tensor([_reference_score(stand_in, p, x) for p, x in zip(PROMPTS, imgs, strict=True)])
    assert got.dtype == torch.float32 and got.shape == (5,)
    if size == 224:  # no resize: same pixels, so the same numbers
        torch.testing.assert_close(got, ref, atol=1e-5, rtol=0)
    else:  # 512 -> 224: tensor vs PIL bicubic rounding moves scores by a small fraction of their spread
        assert (got - ref).abs().max() < 0.1 * ref.std()
    assert ref.std() > 1e-3  # scores differ across inputs, so the check discriminates


def test_imagereward_batch_size_invariant(stand_in):
    imgs = random_images(7, 160, seed=3)
    prompts = (PROMPTS * 2)[:7]
    outs = [make_reward("imagereward", model=stand_in, batch_size=bs)(imgs, prompts) for bs in (1, 3, 7)]
    for o in outs[1:]:
        torch.testing.assert_close(o, outs[0], atol=1e-5, rtol=0)


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_imagereward_reduced_precision_keeps_the_mlp_float32(tokenizer_dir, dtype):
    """``dtype=float16`` / ``bfloat16`` (the GPU setting) casts the BLIP towers only: the reference feeds the MLP
    float32 [CLS] states, which a cast MLP refused (``mat1 and mat2 must have the same dtype``)."""
    imgs, fp32 = random_images(4, 224, seed=1), make_reward("imagereward", model=_stand_in(tokenizer_dir))
    ref = fp32(imgs, PROMPTS[:4])
    model = cast_imagereward_model(_stand_in(tokenizer_dir), "cpu", dtype)  # as imagereward() casts its own
    got = make_reward("imagereward", model=model, batch_size=2, dtype=dtype)(imgs, PROMPTS[:4])
    assert model.mlp.layers[0].weight.dtype == torch.float32
    assert model.blip.visual_encoder.patch.weight.dtype == getattr(torch, dtype)
    assert got.dtype == torch.float32 and torch.isfinite(got).all()
    assert (got - ref).abs().max() < 0.1 * ref.std() + 0.05


def _state(model: nn.Module) -> dict[str, tuple[torch.dtype, torch.device, torch.Tensor]]:
    return {k: (v.dtype, v.device, v.clone()) for k, v in model.state_dict().items()}


def _assert_same_state(before, model: nn.Module) -> None:
    after = model.state_dict()
    assert before.keys() == after.keys()
    for k, (dtype, device, value) in before.items():
        assert (after[k].dtype, after[k].device) == (dtype, device), k
        assert torch.equal(after[k], value), k


@pytest.mark.parametrize("dtype", ["bfloat16", "float16"])
def test_imagereward_refuses_to_cast_a_callers_module(tokenizer_dir, dtype):
    """A module passed as ``model=`` at another dtype is refused, not cast in place under the caller."""
    model = _stand_in(tokenizer_dir)
    before = _state(model)
    with pytest.raises(UserError, match=rf"not ready for device='cpu', dtype='{dtype}'.*"
                                        rf"blip\.visual_encoder\.patch\.weight is float32.*cast_imagereward_model"):
        make_reward("imagereward", model=model, dtype=dtype)
    _assert_same_state(before, model)
    assert not model.training


def test_imagereward_refuses_a_callers_module_in_training_mode(tokenizer_dir):
    model = _stand_in(tokenizer_dir).train()
    with pytest.raises(UserError, match="training mode"):
        make_reward("imagereward", model=model)
    assert all(m.training for m in model.modules())  # not switched to eval behind the caller's back


def test_imagereward_refuses_a_callers_module_with_a_cast_mlp(tokenizer_dir):
    """Towers at bfloat16 but the MLP cast too (``model.to(bfloat16)``): named, and left as it was."""
    model = _stand_in(tokenizer_dir).to(torch.bfloat16)
    with pytest.raises(UserError, match=r"mlp\.layers\.0\.weight is bfloat16"):
        make_reward("imagereward", model=model, dtype="bfloat16")
    assert model.mlp.layers[0].weight.dtype == torch.bfloat16


def test_imagereward_uses_a_ready_module_as_given(tokenizer_dir):
    """A module already on the device at the dtype is used as is (no copy) and left unchanged by scoring;
    ``cast_imagereward_model`` on a copy leaves the original float32."""
    original = _stand_in(tokenizer_dir)
    model = cast_imagereward_model(copy.deepcopy(original), "cpu", "bfloat16")
    assert model is not original and original.blip.visual_encoder.patch.weight.dtype == torch.float32
    before = _state(model)
    fn = make_reward("imagereward", model=model, dtype="bfloat16")
    assert fn.module is model
    fn(random_images(2, 224, seed=4), PROMPTS[:2])
    _assert_same_state(before, model)


def test_imagereward_missing_files(tmp_path, monkeypatch):
    isolate_weight_caches(tmp_path, monkeypatch)
    with pytest.raises(MissingWeightsError, match="PCPO_IMAGEREWARD_WEIGHTS.*ImageReward.pt"):
        make_reward("imagereward")
    (tmp_path / "ImageReward.pt").write_bytes(b"x")
    monkeypatch.setenv("PCPO_IMAGEREWARD_WEIGHTS", str(tmp_path / "ImageReward.pt"))
    with pytest.raises(MissingWeightsError, match="PCPO_IMAGEREWARD_MED_CONFIG.*med_config.json"):
        make_reward("imagereward")
    (tmp_path / "med_config.json").write_text("{}")  # found next to ImageReward.pt
    with pytest.raises(MissingWeightsError, match="bert_base_uncased.*PCPO_BERT_TOKENIZER_PATH.*vocab.txt"):
        make_reward("imagereward")


@pytest.mark.skipif(importlib.util.find_spec("ImageReward") is not None, reason="image-reward is installed")
def test_imagereward_without_package_names_the_extra(tmp_path, tokenizer_dir):
    (tmp_path / "ImageReward.pt").write_bytes(b"x")
    (tmp_path / "med_config.json").write_text("{}")
    with pytest.raises(UserError, match="image-reward.*docs/preference.md"):
        make_reward("imagereward", weights=str(tmp_path), tokenizer_path=str(tokenizer_dir))


@pytest.mark.slow
@pytest.mark.skipif(importlib.util.find_spec("ImageReward") is None, reason="needs the 'preference' extra")
def test_real_imagereward_package_round_trip(tmp_path, tokenizer_dir):
    """Real ImageReward class (random weights, tiny med_config): our batched path == its score()."""
    from unittest import mock

    import ImageReward.models.BLIP.blip_pretrain as blip_pretrain
    from ImageReward.ImageReward import ImageReward as ImageRewardModel

    med = {"architectures": ["BertModel"], "attention_probs_dropout_prob": 0.1, "hidden_act": "gelu",
           "hidden_dropout_prob": 0.1, "hidden_size": 768, "initializer_range": 0.02, "intermediate_size": 64,
           "layer_norm_eps": 1e-12, "max_position_embeddings": 512, "model_type": "bert", "num_attention_heads": 4,
           "num_hidden_layers": 1, "pad_token_id": 0, "type_vocab_size": 2, "vocab_size": 30524,
           "encoder_width": 1024, "add_cross_attention": True}
    (tmp_path / "med_config.json").write_text(json.dumps(med))
    with mock.patch.object(blip_pretrain, "init_tokenizer", _blip_tokenizer_from(tokenizer_dir)):
        ref_model = ImageRewardModel(med_config=str(tmp_path / "med_config.json"), device="cpu").eval()
    torch.save(ref_model.state_dict(), tmp_path / "ImageReward.pt")
    fn = make_reward("imagereward", weights=str(tmp_path / "ImageReward.pt"), tokenizer_path=str(tokenizer_dir),
                     batch_size=2)
    imgs = random_images(3, 224, seed=9)
    paths = []
    for i, x in enumerate(imgs):
        paths.append(tmp_path / f"{i}.png")
        Image.fromarray(x.permute(1, 2, 0).numpy()).save(paths[-1])
    with torch.no_grad():
        ref = torch.tensor([ref_model.score(p, str(f)) for p, f in zip(PROMPTS[:3], paths, strict=True)])
    torch.testing.assert_close(fn(imgs, PROMPTS[:3]), ref, atol=1e-4, rtol=0)
