"""Flow-GRPO's OCR reward: text-side math, recogniser registry, TrOCR loading, PaddleOCR wiring."""

from __future__ import annotations

import itertools
import json
import sys
import types
from collections import deque
from pathlib import Path

import numpy as np
import pytest
import torch

from pcpo_eval.errors import MissingWeightsError, UserError
from pcpo_eval.rewards import REGISTRY, make_reward
from pcpo_eval.rewards import ocr as O

REPO = Path(__file__).resolve().parents[2]


@pytest.fixture(autouse=True)
def isolated_caches(tmp_path, monkeypatch):
    """Empty cache roots and no backend env vars, so nothing real is ever found (or downloaded)."""
    from pcpo_eval.testing import isolate_weight_caches

    isolate_weight_caches(tmp_path, monkeypatch)
    return tmp_path


# ------------------------------------------------------------------------------------------ text side


def test_extract_target_follows_split_on_double_quotes():
    assert O.extract_target('A sign that says "Hello World"') == "Hello World"
    assert O.extract_target('"first" and "second"') == "first"
    assert O.extract_target('a lone "quote here') == "quote here"  # split('"')[1]
    assert O.extract_target("no quotes at all") is None
    assert O.extract_target("curly \u201cquotes\u201d") is None  # not quotes for Flow-GRPO either
    assert O.extract_target('empty ""') == ""


def test_normalize_text_drops_only_ascii_spaces_and_lowercases():
    assert O.normalize_text(" Hello  World ") == "helloworld"
    assert O.normalize_text("A\tB-C!") == "a\tb-c!"


def test_flow_grpo_formula_exact_values():
    # T = "helloworld" (10 chars), R = "hellowor1d": one substitution -> 1 - 1/10
    assert O.ocr_reward_value("hello wor1d", "Hello World") == pytest.approx(0.9, abs=1e-12)
    assert O.ocr_reward_value("HELLO", "Hello World") == pytest.approx(0.5)  # 5 deletions
    assert O.ocr_reward_value("xx Hello World yy", "Hello World") == 1.0  # substring -> distance 0
    assert O.ocr_reward_value("zzzzzzzzzzzzzzzzzzzz", "abc") == 0.0  # 20 edits capped at len(T) = 3
    assert O.ocr_reward_value("", "abcd") == 0.0
    assert O.ocr_reward_value(None, "abcd") == 0.0  # OCR failure branch
    assert O.ocr_reward_value("abdc", "abcd") == pytest.approx(0.5)  # transposition = 2 edits
    assert O.ocr_distance("kitten", "sitting") == 3
    with pytest.raises(UserError, match="empty after removing spaces"):
        O.ocr_reward_value("x", "   ")


def test_join_detections_keeps_positive_confidence_in_order():
    assert O.join_detections([("Hello", 0.9), ("junk", 0.0), ("World", 0.4)]) == "HelloWorld"
    assert O.join_detections(None) == "" and O.join_detections([]) == ""


def _bfs_distances(source: str, states: set[str], alphabet: str) -> dict[str, int]:
    """Independent reference: shortest path over single-character edits (insert/delete/substitute)."""
    dist = {source: 0}
    queue = deque([source])
    while queue:
        s = queue.popleft()
        nxt = {s[:i] + s[i + 1 :] for i in range(len(s))}
        nxt |= {s[:i] + c + s[i:] for i in range(len(s) + 1) for c in alphabet}
        nxt |= {s[:i] + c + s[i + 1 :] for i in range(len(s)) for c in alphabet}
        for t in nxt:
            if t in states and t not in dist:
                dist[t] = dist[s] + 1
                queue.append(t)
    return dist


def test_levenshtein_matches_brute_force_shortest_edit_path():
    alphabet = "abc"
    # all strings of length <= 4: an optimal edit path never needs a longer intermediate string
    states = {"".join(p) for n in range(5) for p in itertools.product(alphabet, repeat=n)}
    for a in sorted(states):
        ref = _bfs_distances(a, states, alphabet)
        for b in states:
            assert O._levenshtein_dp(a, b) == ref[b], (a, b)
    assert O.levenshtein("hellowor1d", "helloworld") == 1


def test_levenshtein_dp_agrees_with_the_levenshtein_package():
    lev = pytest.importorskip("Levenshtein", reason="optional 'levenshtein' package (extra 'ocr') not installed")
    rng = np.random.default_rng(0)
    for _ in range(300):
        a = "".join(rng.choice(list("abcde "), size=rng.integers(0, 25)))
        b = "".join(rng.choice(list("abcde "), size=rng.integers(0, 25)))
        assert O._levenshtein_dp(a, b) == lev.distance(a, b)


def test_no_target_policies():
    assert O.resolve_target('say "Hi"') == "Hi"
    with pytest.raises(UserError, match="no text in double quotes.*no_target"):
        O.resolve_target("a cat")
    with pytest.raises(UserError, match="no text in double quotes"):
        O.resolve_target('an empty sign ""')
    assert O.resolve_target("a cat", "prompt") == "a cat"
    assert O.resolve_target("a cat", "zero") is None
    with pytest.raises(UserError, match="unknown no_target 'skip'.*error, prompt, zero"):
        O.resolve_target("a cat", "skip")


# ------------------------------------------------------------------------------- batching / pairing


def _indexed_images(n: int, size: int = 8) -> torch.Tensor:
    """Image i has red = i, green = 100, blue = 200 everywhere (checks RGB HWC order downstream)."""
    img = torch.zeros(n, 3, size, size, dtype=torch.uint8)
    img[:, 0] = torch.arange(n, dtype=torch.uint8).view(n, 1, 1)
    img[:, 1], img[:, 2] = 100, 200
    return img


class FakeRecogniser:
    """Reads the image index from the red channel; 'reads' word{i} for even i, nothing for odd i."""

    def __init__(self) -> None:
        self.batches: list[int] = []

    def __call__(self, images: list[np.ndarray]) -> list[str | None]:
        self.batches.append(len(images))
        out: list[str | None] = []
        for im in images:
            assert im.dtype == np.uint8 and im.shape == (8, 8, 3)
            assert (im[..., 1] == 100).all() and (im[..., 2] == 200).all()
            i = int(im[0, 0, 0])
            out.append(f"WORD {i}" if i % 2 == 0 else ("" if i % 3 else None))
        return out


def test_fake_recogniser_batching_and_prompt_pairing():
    fake = FakeRecogniser()
    reward = make_reward("ocr", recogniser=fake, batch_size=3)
    prompts = [f'a sign that says "word{i}"' for i in range(7)]
    r = reward(_indexed_images(7), prompts)
    assert r.dtype == torch.float32 and r.shape == (7,)
    assert fake.batches == [3, 3, 1]
    assert r.tolist() == [1.0, 0.0, 1.0, 0.0, 1.0, 0.0, 1.0]
    # pairing: image i scored against prompt i, so reversing the prompts changes every even reward
    r2 = reward(_indexed_images(7), prompts[::-1])
    # image 0 reads "word0" vs target "word6": one substitution out of 5 characters
    assert r2[0].item() == pytest.approx(0.8)
    assert r2[3].item() == 0.0
    details = reward.details(_indexed_images(2), prompts[:2])
    assert details[0].target == "word0" and details[0].recognized == "WORD 0" and details[0].distance == 0
    assert reward.settings["recogniser"] == "FakeRecogniser" and reward.settings["reward"] == "ocr"


def test_missing_target_fails_before_any_ocr_and_zero_policy():
    fake = FakeRecogniser()
    reward = O.ocr(recogniser=fake)
    with pytest.raises(UserError, match="'a cat' has no text in double quotes"):
        reward(_indexed_images(2), ['say "word0"', "a cat"])
    assert fake.batches == []
    r = O.ocr(recogniser=fake, no_target="zero")(_indexed_images(2), ['say "word0"', "a cat"])
    assert r.tolist() == [1.0, 0.0]


def test_contract_errors():
    reward = O.ocr(recogniser=FakeRecogniser())
    with pytest.raises(UserError, match="one prompt per image"):
        reward(_indexed_images(2), ['"a"'])
    with pytest.raises(UserError, match="uint8"):
        reward(_indexed_images(2).float(), ['"a"', '"b"'])
    bad = O.ocr(recogniser=lambda ims: ["x"])
    with pytest.raises(RuntimeError, match="returned 1 texts for 2 images"):
        bad(_indexed_images(2), ['"a"', '"b"'])
    with pytest.raises(UserError, match="unknown OCR recogniser 'tesseract'; choose one of: paddleocr, trocr"):
        make_reward("ocr", recogniser="tesseract")
    with pytest.raises(UserError, match="batch_size must be >= 1"):
        make_reward("ocr", recogniser=FakeRecogniser(), batch_size=0)
    with pytest.raises(UserError, match=r"unknown reward 'nope'.*\bocr\b"):
        make_reward("nope")


# ------------------------------------------------------------------------------------------- TrOCR


def _bytes_to_unicode() -> dict[int, str]:
    """GPT-2 / RoBERTa byte -> printable character table (byte-level BPE alphabet)."""
    bs = list(range(ord("!"), ord("~") + 1)) + list(range(ord("\xa1"), ord("\xac") + 1))
    bs += list(range(ord("\xae"), ord("\xff") + 1))
    cs, n = bs[:], 0
    for b in range(256):
        if b not in bs:
            bs.append(b)
            cs.append(256 + n)
            n += 1
    return dict(zip(bs, map(chr, cs), strict=True))


def _save_tiny_trocr(folder: Path, constant_token: str | None = None) -> None:
    """A randomly initialised TrOCR-architecture model (ViT encoder + TrOCR decoder) and processor.

    With ``constant_token`` the decoder always emits that character: the last layer's final
    LayerNorm outputs its bias (weight 0, bias 1) and only that token's output row is non-zero.
    """
    from transformers import (
        RobertaTokenizer,
        TrOCRConfig,
        TrOCRProcessor,
        VisionEncoderDecoderConfig,
        VisionEncoderDecoderModel,
        ViTConfig,
        ViTImageProcessor,
    )

    folder.mkdir(parents=True)
    vocab = {"<s>": 0, "<pad>": 1, "</s>": 2, "<unk>": 3}
    for ch in _bytes_to_unicode().values():
        vocab.setdefault(ch, len(vocab))
    (folder / "vocab.json").write_text(json.dumps(vocab))
    (folder / "merges.txt").write_text("#version: 0.2\n")
    tokenizer = RobertaTokenizer(str(folder / "vocab.json"), str(folder / "merges.txt"))
    image_processor = ViTImageProcessor(size={"height": 32, "width": 32}, resample=2,
                                        image_mean=[0.5] * 3, image_std=[0.5] * 3)
    enc = ViTConfig(image_size=32, patch_size=8, hidden_size=32, num_hidden_layers=1, num_attention_heads=2,
                    intermediate_size=64)
    dec = TrOCRConfig(vocab_size=len(vocab), d_model=32, decoder_layers=1, decoder_attention_heads=2,
                      decoder_ffn_dim=64, max_position_embeddings=64, pad_token_id=1, bos_token_id=0,
                      eos_token_id=2, decoder_start_token_id=2)
    cfg = VisionEncoderDecoderConfig.from_encoder_decoder_configs(enc, dec)
    cfg.decoder_start_token_id, cfg.pad_token_id, cfg.eos_token_id = 2, 1, 2
    with torch.random.fork_rng(devices=[]):  # transformers' init draws from the global RNG: fork it
        torch.manual_seed(0)
        model = VisionEncoderDecoderModel(cfg).eval()
    if constant_token is not None:
        with torch.no_grad():
            ln = model.decoder.model.decoder.layers[-1].final_layer_norm
            ln.weight.zero_()
            ln.bias.fill_(1.0)
            proj = model.decoder.output_projection.weight
            proj.zero_()
            proj[vocab[constant_token]] = 1.0
    model.save_pretrained(str(folder))
    TrOCRProcessor(image_processor=image_processor, tokenizer=tokenizer).save_pretrained(str(folder))


@pytest.fixture(scope="module")
def trocr_dirs(tmp_path_factory):
    root = tmp_path_factory.mktemp("trocr")
    _save_tiny_trocr(root / "random")
    _save_tiny_trocr(root / "const_a", constant_token="A")
    return root


def test_trocr_random_tiny_model_runs_the_real_loading_and_reward_path(trocr_dirs, one_thread):
    reward = make_reward("ocr", recogniser="trocr", path=str(trocr_dirs / "random"), max_new_tokens=6, batch_size=2)
    images = torch.randint(0, 256, (3, 3, 40, 48), dtype=torch.uint8, generator=torch.Generator().manual_seed(1))
    r = reward(images, ['"Hello World"', 'a sign "OCR"', 'text "abc"'])
    assert r.dtype == torch.float32 and r.shape == (3,)
    assert ((r >= 0) & (r <= 1)).all()
    assert reward.settings["recogniser"] == "trocr" and reward.settings["path"] == str(trocr_dirs / "random")


def test_trocr_constant_decoder_gives_exact_flow_grpo_values(trocr_dirs, monkeypatch):
    # found through PCPO_TROCR_PATH; the decoder reads "AAAAAAAA" (8 greedy tokens) from any image
    monkeypatch.setenv("PCPO_TROCR_PATH", str(trocr_dirs / "const_a"))
    reward = make_reward("ocr", recogniser="trocr", max_new_tokens=8)
    images = torch.zeros(3, 3, 16, 16, dtype=torch.uint8)
    details = reward.details(images, ['"aaaa"', 'sign "ab"', 'long "aaaaaaaaaaaa"'])
    assert details[0].recognized == "AAAAAAAA"
    # substring -> 1; "ab": distance 7 capped at 2 -> 0; 12 a's vs 8: 4 insertions -> 1 - 4/12
    assert [d.reward for d in details] == pytest.approx([1.0, 0.0, 2 / 3])


def test_trocr_missing_weights_name_the_path_and_the_fix(tmp_path):
    with pytest.raises(MissingWeightsError, match="trocr weights not found: set PCPO_TROCR_PATH"):
        make_reward("ocr", recogniser="trocr")
    with pytest.raises(MissingWeightsError, match=f"{tmp_path / 'nowhere'} is not a folder with config.json"):
        make_reward("ocr", recogniser="trocr", path=str(tmp_path / "nowhere"))
    partial = tmp_path / "partial"
    partial.mkdir()
    (partial / "config.json").write_text("{}")
    with pytest.raises(MissingWeightsError, match=f"trocr: {partial} is not a complete TrOCR folder \\(missing weights"):
        make_reward("ocr", recogniser="trocr", path=str(partial))


# --------------------------------------------------------------------------------------- PaddleOCR


def _paddle_dirs(root: Path, names=("det", "rec", "cls")) -> dict[str, str]:
    out = {}
    for name in names:
        d = root / f"paddle_{name}"
        d.mkdir(parents=True, exist_ok=True)
        (d / "inference.pdiparams").write_bytes(b"x")
        out[f"{name}_model_dir"] = str(d)
    return out


def _fake_paddleocr(version: str, calls: list, results: dict[int, object]) -> types.ModuleType:
    """A stand-in ``paddleocr`` module recording constructor kwargs and answering per red value."""
    mod = types.ModuleType("paddleocr")
    mod.__version__ = version

    class PaddleOCR:
        def __init__(self, **kwargs):
            calls.append(kwargs)

        def _answer(self, img):
            value = results[int(img[0, 0, 0])]
            if isinstance(value, Exception):
                raise value
            return value

        def ocr(self, img, cls=True):
            assert cls is False
            return self._answer(img)

        def predict(self, img):
            return self._answer(img)

    mod.PaddleOCR = PaddleOCR
    return mod


def test_paddleocr_missing_dirs_and_missing_package(tmp_path, monkeypatch):
    with pytest.raises(MissingWeightsError, match="paddleocr_det weights not found: set PCPO_PADDLEOCR_DET_DIR"):
        make_reward("ocr")  # the default recogniser is Flow-GRPO's paddleocr
    dirs = _paddle_dirs(tmp_path)
    with pytest.raises(MissingWeightsError, match=f"{tmp_path / 'x'} is not a folder with inference.pdiparams"):
        make_reward("ocr", det_model_dir=str(tmp_path / "x"), rec_model_dir=dirs["rec_model_dir"])
    monkeypatch.setitem(sys.modules, "paddleocr", None)  # import paddleocr -> ImportError
    with pytest.raises(MissingWeightsError, match=r"needs the paddleocr and paddlepaddle packages.*'trocr'"):
        make_reward("ocr", **dirs)


def test_paddleocr_2x_is_called_as_flow_grpo_with_local_dirs_only(tmp_path, monkeypatch):
    calls: list = []
    results = {
        0: [[[None, ("Hello", 0.9)], [None, ("junk", 0.0)], [None, ("Wor1d", 0.8)]]],
        1: [None],  # nothing detected
        2: RuntimeError("boom"),
    }
    monkeypatch.setitem(sys.modules, "paddleocr", _fake_paddleocr("2.9.1", calls, results))
    dirs = _paddle_dirs(tmp_path)
    reward = make_reward("ocr", **dirs)
    assert calls == [dict(use_angle_cls=False, lang="en", use_gpu=False, show_log=False, **dirs)]
    with pytest.warns(UserWarning, match="PaddleOCR failed on an image.*boom"):
        r = reward(_indexed_images(3), ['A sign that says "Hello World"'] * 3)
    assert r.tolist() == pytest.approx([0.9, 0.0, 0.0])
    raising = make_reward("ocr", on_error="raise", **dirs)
    with pytest.raises(RuntimeError, match="boom"):
        raising(_indexed_images(3), ['"x"'] * 3)
    # without a cls folder paddleocr 2.x would fetch one: refused
    no_cls = {k: v for k, v in dirs.items() if k != "cls_model_dir"}
    with pytest.raises(MissingWeightsError, match="PCPO_PADDLEOCR_CLS_DIR"):
        make_reward("ocr", **no_cls)


def test_paddleocr_3x_predict_results(tmp_path, monkeypatch):
    calls: list = []
    results = {0: [{"rec_texts": ["HELLO", "world", "?"], "rec_scores": [0.99, 0.7, 0.0]}], 1: []}
    monkeypatch.setitem(sys.modules, "paddleocr", _fake_paddleocr("3.3.2", calls, results))
    dirs = _paddle_dirs(tmp_path, names=("det", "rec"))
    monkeypatch.setenv("PCPO_PADDLEOCR_DET_DIR", dirs["det_model_dir"])
    monkeypatch.setenv("PCPO_PADDLEOCR_REC_DIR", dirs["rec_model_dir"])
    reward = make_reward("ocr", rec_model_name="en_PP-OCRv4_mobile_rec")
    assert calls == [dict(text_detection_model_dir=dirs["det_model_dir"], text_recognition_model_dir=dirs["rec_model_dir"],
                          use_doc_orientation_classify=False, use_doc_unwarping=False, use_textline_orientation=False,
                          device="cpu", text_recognition_model_name="en_PP-OCRv4_mobile_rec")]
    assert reward(_indexed_images(2), ['"Hello World"'] * 2).tolist() == [1.0, 0.0]
    assert reward.settings["paddleocr_version"] == "3.3.2"


# --------------------------------------------------------------------------- setup 8 and the listings


def test_setup8_config_names_a_registered_reward_that_needs_local_weights():
    from pcpo_eval.train.config import load_config

    cfg = load_config(REPO / "train" / "configs" / "setup8_flowgrpo_sd35_ocr.yaml")
    assert cfg.reward == "ocr" and "ocr" in REGISTRY
    with pytest.raises(MissingWeightsError, match="PCPO_PADDLEOCR_DET_DIR"):
        make_reward(cfg.reward, **cfg.reward_options)
    header = (REPO / "train" / "configs" / "setup8_flowgrpo_sd35_ocr.yaml").read_text()
    assert "not in pcpo_eval.rewards yet" not in header


def test_weights_command_lists_the_ocr_backends(cli):
    r = cli("weights", "trocr", "paddleocr_det", "paddleocr_rec", "paddleocr_cls")
    assert r.returncode == 0, r.stderr
    for var in ("PCPO_TROCR_PATH", "PCPO_PADDLEOCR_DET_DIR", "PCPO_PADDLEOCR_REC_DIR", "PCPO_PADDLEOCR_CLS_DIR"):
        assert var in r.stdout
    assert "MISSING" in r.stdout and "reward 'ocr'" in r.stdout
